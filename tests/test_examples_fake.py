"""The shipped fake-backend examples reach the verdicts their comments promise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_recoverygate.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "fake"


@pytest.mark.parametrize(
    ("name", "code", "reason"),
    [
        ("recovery-test.yaml", 0, None),
        ("resume-zero.yaml", 1, "RESTARTED_FROM_SCRATCH"),
        ("resume-older.yaml", 1, "RESUMED_FROM_OLDER_CHECKPOINT"),
        ("never.yaml", 1, "NEVER_CAME_BACK"),
        ("too-slow.yaml", 1, "TOO_SLOW"),
    ],
)
def test_each_fake_example_reaches_its_verdict(
    name: str,
    code: int,
    reason: str | None,
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.json"
    assert main(["run", "-f", str(EXAMPLES / name), "-q", "--report", str(report)]) == code
    failed = [c["reason"] for c in json.loads(report.read_text())["checks"] if not c["passed"]]
    if reason is None:
        assert failed == []
    else:
        assert failed[0] == reason
