"""The runner's own records are bounded like the engine's (issue 41, item 10).

The engine caps what job lines can make it hold; the runner kept every progress line
for the costs and the picture (149 MiB per million lines) and every event row but
progress for ``events.jsonl``. We test these aspects on its record of events:

- a million progress lines leave at most the last 32,768 and 32,768 before them (every
  Nth, N doubling), the first and the last kept, in order; the step time measured from
  them is the job's;
- checkpoint rows beyond 200,000 (and progress rows beyond 100,000) are counted, not
  kept (the report's notes say how many).
"""

from __future__ import annotations

from pathlib import Path

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.costs import measure
from pytest_recoverygate.engine.model import TrainingEvent, TrainingEventKind
from pytest_recoverygate.orchestrators import build_orchestrator
from pytest_recoverygate.registry.seams import SimulatedClock
from pytest_recoverygate.runner import RunOptions, _Drill

CONFIG = """\
workload:
  orchestrator: fake
injectFailure:
  type: KillWorker
  afterCheckpoint: step-20
expectations:
  maxRecoveryTime: 2m
safety:
  requireConfirm: false
"""
STEP = 0.01  # seconds per step of the job


def drill() -> _Drill:
    config = parse_config(CONFIG, Path("drill.yaml"))
    clock = SimulatedClock()
    return _Drill(config, RunOptions(confirmed=True), clock, build_orchestrator(config, clock))


def test_a_million_progress_lines_keep_a_bounded_record_with_the_true_step_time() -> None:
    runner = drill()
    progress = TrainingEventKind.PROGRESS
    for step in range(1, 1_000_001):
        runner.log.add(TrainingEvent(progress, step * STEP, "inc", step=step, rank=0))

    kept = list(runner.log.progress.points())
    assert len(runner.log.progress) <= 65_536, len(runner.log.progress)
    assert kept[0] == (STEP, "inc", 1) and kept[-1] == (1_000_000 * STEP, "inc", 1_000_000)
    assert [p[2] for p in kept] == sorted(p[2] for p in kept)
    costs = measure(kept, [], [], [])
    assert costs.step_time_median is not None
    assert abs(costs.step_time_median - STEP) < 1e-9
    assert len(runner.log.rows) <= 100_000


def test_checkpoint_rows_past_the_bound_are_counted_not_kept() -> None:
    runner = drill()
    completed = TrainingEventKind.CHECKPOINT_COMPLETED
    for step in range(1, 300_001):
        runner.log.add(TrainingEvent(completed, step * STEP, f"inc{step % 7}", step=step, rank=0))

    assert len(runner.log.rows) <= 200_000, len(runner.log.rows)
    assert runner.log.dropped == 100_000
