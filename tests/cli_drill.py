"""One drill run as a user runs it: the config written to a file, ``recoverygate run`` in a
subprocess, the report read back. Shared by the real-process drills (the truth corpus,
the fault catalogue, the framework integrations)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["DRILL_SUSTAIN", "CliRun", "run_cli_drill", "with_drill_sustain"]

#: The sustain window of the test drills, unless a config sets its own: the drills are
#: about recovery, not about how long a job trains on, and the default (the larger of 3
#: progress lines and 10 s, what users get) would hold each PASS 9 s longer, every kill of
#: it again. One second of training (tens of steps of the test jobs) shows the replacement
#: trains on. The default itself is tested in tests/test_config.py and the engine tests.
DRILL_SUSTAIN = "1s"


def with_drill_sustain(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with ``expectations.sustain`` set to :data:`DRILL_SUSTAIN` where it sets
    none (live-mode drills are judged without a sustain window and keep theirs)."""
    expect = dict(config.get("expectations") or {})
    if expect.get("recovery") != "live":
        expect.setdefault("sustain", DRILL_SUSTAIN)
    return {**config, "expectations": expect}


@dataclass(frozen=True)
class CliRun:
    """The report, the exit code, everything the CLI printed, and the wall time."""

    report: dict[str, Any]
    code: int
    output: str
    wall: float


def run_cli_drill(
    config: Mapping[str, Any],
    path: Path,
    *,
    report_dir: Path | None = None,
    timeout: float,
    env: Mapping[str, str] | None = None,
    drill_sustain: bool = True,
) -> CliRun:
    """Write ``config`` (with :func:`with_drill_sustain`) to ``path`` and run it (``--yes
    -q``). The report goes next to the config (``report.json``), or with ``report_dir``
    into that folder (``--report-dir``). ``drill_sustain=False`` runs ``config`` as it is."""
    text = with_drill_sustain(config) if drill_sustain else dict(config)
    path.write_text(yaml.safe_dump(text, sort_keys=False))
    if report_dir is None:
        report_path = path.parent / "report.json"
        where = ["--report", str(report_path)]
    else:
        report_path = report_dir / "report.json"
        where = ["--report-dir", str(report_dir)]
    command = [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(path)]
    started = time.monotonic()
    proc = subprocess.run(
        [*command, *where, "--yes", "-q"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
        env=None if env is None else dict(env),
    )
    wall = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert report_path.exists(), f"no report (exit {proc.returncode}):\n{output}"
    return CliRun(json.loads(report_path.read_text()), proc.returncode, output, wall)
