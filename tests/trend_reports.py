"""Real drill reports for the compare, history and HTML tests: fake-backend drills run
through the CLI into report folders (a second or two each), once per test module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pytest_recoverygate.cli import main
from tests.conftest import FAKE_DRILL, merge

__all__ = ["run_fake_drill"]


def run_fake_drill(
    folder: Path, changes: dict[str, Any] | None = None, *, name: str = "nightly"
) -> tuple[int, Path]:
    """Run the fake drill (``FAKE_DRILL`` with ``changes``, named ``name``) with its report
    folder ``folder/<name>``; return the exit code and that folder."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(merge({**FAKE_DRILL, "name": name}, changes or {}), sort_keys=False)
    )
    report = folder / name
    code = main(["run", "-f", str(config), "-q", "--report-dir", str(report)])
    return code, report
