"""The shipped fake-backend examples reach the verdicts their comments promise.

Each runs on a simulated clock (the fake backend works on any clock), so drills over
simulated minutes take milliseconds; one runs through the CLI on the real clock.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_recoverygate.cli import main
from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.orchestrators import build_orchestrator
from pytest_recoverygate.registry.seams import SimulatedClock
from pytest_recoverygate.runner import RunOptions, run_drill

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "fake"


def run_example(name: str, report: Path) -> int:
    """The example's drill on a simulated clock; its exit code (the report is written)."""
    config = load_config(EXAMPLES / name)
    clock = SimulatedClock()
    result = run_drill(
        config,
        RunOptions(report_path=report, handle_signals=False),
        clock=clock,
        orchestrator=build_orchestrator(config, clock),
    )
    return result.exit_code


@pytest.mark.slow  # the example as shipped holds the default 10 s sustain window
def test_an_example_runs_through_the_cli_on_the_real_clock(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    assert (
        main(["run", "-f", str(EXAMPLES / "recovery-test.yaml"), "-q", "--report", str(report)])
        == 0
    )
    assert json.loads(report.read_text())["verdict"] == "PASS"


@pytest.mark.parametrize(
    ("name", "code", "reason"),
    [
        ("recovery-test.yaml", 0, None),
        ("resume-zero.yaml", 1, "RESTARTED_FROM_SCRATCH"),
        ("resume-older.yaml", 1, "RESUMED_FROM_OLDER_CHECKPOINT"),
        ("never.yaml", 1, "NEVER_CAME_BACK"),
        ("too-slow.yaml", 1, "TOO_SLOW"),
        ("torn-checkpoint.yaml", 0, None),
        ("torn-checkpoint-not-atomic.yaml", 1, "NEVER_CAME_BACK"),
        ("preempt.yaml", 0, None),
        ("preempt-no-save.yaml", 1, "NOT_SAVED_ON_PREEMPT"),
        ("hang.yaml", 0, None),
        ("hang-default-timeout.yaml", 1, "HANG_NOT_DETECTED"),
        ("repeated.yaml", 0, None),
        ("restart-budget.yaml", 0, None),
        ("spread.yaml", 0, None),
        ("state-digest-fresh-optimizer.yaml", 1, "STATE_DIFFERS"),
    ],
)
def test_each_fake_example_reaches_its_verdict(
    name: str,
    code: int,
    reason: str | None,
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.json"
    assert run_example(name, report) == code
    checks = json.loads(report.read_text())["checks"]
    failed = [c["reason"] for c in checks if c["passed"] is False]
    assert [c["message"] for c in checks if c["passed"] is None] == [], "every check decided"
    if reason is None:
        assert failed == []
    else:
        assert failed[0] == reason


def test_the_spread_example_kills_across_the_interval_and_projects_to_scale(
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.json"
    assert run_example("spread.yaml", report) == 0
    doc = json.loads(report.read_text())
    positions = [k["position"] for k in doc["costs"]["perKill"]]
    # a kill lands when the drill reads its trigger: within one 50 ms poll of the simulated
    # clock, of an interval of 0.45 s
    assert positions == pytest.approx([0.0, 0.25, 0.5, 0.75], abs=0.12)
    assert positions == sorted(positions)
    assert doc["costs"]["lostSteps"]["max"] > doc["costs"]["lostSteps"]["min"]
    projection = doc["projection"]
    assert projection["gpus"] == 16384 and "Llama 3" in projection["failureRateSource"]
    assert 0 < projection["currentGoodput"] <= projection["optimalGoodput"] <= 1
