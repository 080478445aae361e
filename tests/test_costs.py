"""The cost components measured from a drill's record.

We test these aspects:
- step time median and p95 from progress lines, leaving out pairs that span a save or a kill;
- the save time from checkpoint_started to checkpoint_completed, and the stall a save causes
  (a synchronous save stalls its save time, an asynchronous one about nothing);
- the checkpoint interval in steps and seconds, per process, never across a kill;
- lost work per kill (redone steps × step time) and its spread over kills;
- every figure that cannot be measured says why.
"""

from __future__ import annotations

import pytest

from pytest_recoverygate.engine.costs import measure, percentile
from pytest_recoverygate.engine.verdict import Recovery, Verdict


def job(
    *,
    saves_block: bool,
    save: float = 0.5,
    steps: int = 60,
    every: int = 10,
    step: float = 0.1,
    inc: str = "a",
    start: float = 0.0,
) -> tuple[list[tuple[float, str, int]], list[tuple[int, float]], list[tuple[int, float, float]]]:
    """Progress every step; a save every ``every`` steps that blocks training or not."""
    progress, checkpoints, saves = [], [], []
    t = start
    for n in range(1, steps + 1):
        t += step
        progress.append((t, inc, n))
        if n % every == 0:
            saves.append((n, t + 0.001, t + 0.001 + save))
            checkpoints.append((n, t + 0.001 + save))
            if saves_block:
                t += save
    return progress, checkpoints, saves


def test_a_synchronous_save_stalls_training_for_its_save_time() -> None:
    progress, checkpoints, saves = job(saves_block=True)
    costs = measure(progress, checkpoints, saves, [], ["a"] * len(checkpoints))
    assert costs.step_time_median == pytest.approx(0.1)
    assert costs.step_time_p95 == pytest.approx(0.1)
    assert costs.save_time_median == pytest.approx(0.5)
    assert costs.save_stall_median == pytest.approx(0.5, abs=1e-6)
    assert costs.checkpoint_interval_steps == 10
    assert costs.checkpoint_interval_seconds == pytest.approx(1.5)
    assert costs.missing == {}


def test_an_asynchronous_save_stalls_about_nothing() -> None:
    progress, checkpoints, saves = job(saves_block=False)
    costs = measure(progress, checkpoints, saves, [], ["a"] * len(checkpoints))
    assert costs.save_time_median == pytest.approx(0.5)
    assert costs.save_stall_median == pytest.approx(0.0, abs=1e-6)
    assert costs.checkpoint_interval_seconds == pytest.approx(1.0)


def test_without_checkpoint_started_the_stall_is_read_around_the_completion() -> None:
    progress, checkpoints, _ = job(saves_block=True)
    costs = measure(progress, checkpoints, [], [], ["a"] * len(checkpoints))
    assert costs.save_time_median is None
    assert "checkpoint_started" in costs.missing["saveTime"]
    assert costs.save_stall_median == pytest.approx(0.5, abs=1e-6)


def test_lost_work_is_the_redone_steps_times_the_step_time_with_its_spread() -> None:
    progress, checkpoints, saves = job(saves_block=False)
    kills = [
        Recovery(
            i,
            "KillWorker",
            Verdict.PASS,
            "",
            lost_steps=lost,
            lost_steps_upper_bound=lost + 1,
            recovery_time_seconds=rt,
            kill_time=100.0 + i,
            position=pos,
        )
        for i, (lost, rt, pos) in enumerate([(0, 2.0, 0.0), (5, 3.0, 0.5), (9, 2.5, 0.9)], start=1)
    ]
    costs = measure(progress, checkpoints, saves, kills, ["a"] * len(checkpoints))
    assert costs.lost_work_seconds is not None
    assert costs.lost_work_seconds.as_dict() == {
        "count": 3,
        "min": 0.0,
        "median": 0.5,
        "p95": pytest.approx(0.86),
        "max": 0.9,
    }
    assert costs.recovery_time is not None
    assert costs.recovery_time.as_dict() == {
        "count": 3,
        "min": 2.0,
        "median": 2.5,
        "p95": pytest.approx(2.95),
        "max": 3.0,
    }
    assert [k["lostWorkSeconds"] for k in costs.per_kill] == [0.0, 0.5, 0.9]
    assert [k["position"] for k in costs.per_kill] == [0.0, 0.5, 0.9]


def test_pairs_across_a_kill_and_checkpoints_of_two_processes_are_not_mixed() -> None:
    first = job(saves_block=False, steps=25, inc="a")
    second = job(saves_block=False, steps=30, inc="b", start=10.0)
    kill = Recovery(1, "KillWorker", Verdict.PASS, "", kill_time=2.55, lost_steps=5)
    progress = first[0] + [(t, "b", s + 20) for t, _, s in second[0]]
    checkpoints = first[1] + [(s + 20, t) for s, t in second[1]]
    owners = ["a"] * len(first[1]) + ["b"] * len(second[1])
    costs = measure(progress, checkpoints, first[2], [kill], owners)
    assert costs.checkpoint_interval_seconds == pytest.approx(1.0)  # never 10 s across the gap
    assert costs.step_time_median == pytest.approx(0.1)


def test_a_record_too_short_to_measure_says_why() -> None:
    costs = measure([(1.0, "a", 1)], [], [], [])
    assert costs.step_time_median is None
    assert set(costs.missing) >= {"stepTime", "saveTime", "checkpointInterval", "saveStall"}


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 95) == 5.0
    assert percentile(list(map(float, range(101))), 95) == 95.0
