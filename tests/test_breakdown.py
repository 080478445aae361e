"""The recovery breakdown means the same on every backend, in the order things happen.

We test these aspects:

- a backend that only sees a restart by scanning for the new process (local: torchrun's
  next generation) saw it late: the restart is listed no later than the process start;
- likewise a failure seen after its restart was scheduled;
- the phases between the points, by name, the start-up one (start line -> first report:
  imports, rendezvous, init) named as such, in report.json, summary.md and on a terminal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_recoverygate.cli import main
from pytest_recoverygate.engine.model import GroupEvent, GroupEventKind
from pytest_recoverygate.engine.verdict import BREAKDOWN_PHASES
from pytest_recoverygate.report.files import RECOVERY_PHASES, recovery_phases
from tests.engine_events import T0
from tests.test_engine import drive, engine_for, new_run, old_run, verdict_of

#: The order things happen in: a point listed before another never happened after it.
CAUSAL = ("failureDetected", "replacementScheduled", "processStarted", "firstReport")


def test_a_restart_seen_only_after_its_process_started_is_listed_before_it() -> None:
    # local: the watcher sees the new generation when its process exists (here 0.4 s
    # after the process wrote its start line, and even after its first report)
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    engine.on_group_event(GroupEvent(GroupEventKind.WORKER_GONE, T0 + 5.6))
    engine.on_group_event(GroupEvent(GroupEventKind.RESTARTING, T0 + 5.6, restart_count=1))
    engine.on_group_event(GroupEvent(GroupEventKind.REPLACEMENT_RUNNING, T0 + 5.6))
    result = verdict_of(engine, new_run(5.0, resume=20))
    b = result.breakdown
    assert b["processStarted"] == pytest.approx(2.5)
    assert b["replacementScheduled"] == pytest.approx(2.5)
    assert b["failureDetected"] == pytest.approx(2.5)
    assert b["replacementRunning"] == pytest.approx(3.1)  # seen late: that is when it ran
    listed = [k for k in b if k in CAUSAL]
    assert listed == list(CAUSAL), "listed in the order they happen"
    points = [b[k] for k in CAUSAL]
    assert points == sorted(points)  # type: ignore[type-var]


def test_a_restart_seen_before_the_process_started_keeps_its_own_time() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    engine.on_group_event(GroupEvent(GroupEventKind.WORKER_GONE, T0 + 2.6))
    engine.on_group_event(GroupEvent(GroupEventKind.RESTARTING, T0 + 2.8, restart_count=1))
    result = verdict_of(engine, new_run(5.0, resume=20))
    assert result.breakdown["failureDetected"] == pytest.approx(0.1)
    assert result.breakdown["replacementScheduled"] == pytest.approx(0.3)


def test_the_phases_are_the_spans_between_the_points_in_the_order_they_happen() -> None:
    points = dict.fromkeys(BREAKDOWN_PHASES, None) | {
        "failureDetected": 0.1,
        "replacementScheduled": 0.25,
        "processStarted": 0.5,
        "firstReport": 2.0,
        "checkpointLoaded": 2.25,
        "firstStepAfterResume": 2.5,
    }
    assert recovery_phases(points) == {
        "detection": 0.1,
        "scheduling": 0.15,
        "launch": 0.25,
        "startup": 1.5,
        "checkpointLoad": 0.25,
        "firstStep": 0.25,
    }
    # a point the backend could not see: its phase is unknown, the next counts from before
    unseen = recovery_phases({**points, "checkpointLoaded": None})
    assert unseen["checkpointLoad"] is None
    assert unseen["firstStep"] == 0.5
    labels = [label for _, label, _ in RECOVERY_PHASES]
    assert "start-up (imports, rendezvous, init)" in labels


def test_a_drill_reports_its_phases_with_the_start_up_named(
    write_drill, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "drill"
    assert main(["run", "-f", str(write_drill()), "--report-dir", str(out)]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert list(doc["recoveryPhases"]) == [name for name, _, _ in RECOVERY_PHASES]
    took = [v for v in doc["recoveryPhases"].values() if v is not None]
    assert sum(took) == pytest.approx(doc["recoveryTimeSeconds"], abs=0.01)
    assert doc["recoveryPhases"]["startup"] is not None
    points = [doc["breakdown"][k] for k in CAUSAL if doc["breakdown"][k] is not None]
    assert points == sorted(points)
    assert "| start-up (imports, rendezvous, init) |" in (out / "summary.md").read_text()
    terminal = capsys.readouterr().out
    assert "recovery phases (s): detection " in terminal
    assert "start-up (imports, rendezvous, init) " in terminal
