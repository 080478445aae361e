"""Everyday job patterns the verdict must get right, driven through the engine directly.

We test these aspects (the verdict's second pass, one block per rule):
1. the reporting grid is learned from every line: "log the first step, then every 10th"
   keeps a grid, a metrics thread's counts keep none (irregular, said in stepContract);
   a FAIL then rests only on what holds whatever the grid (first line below the expected
   step), and an inferred step is never printed as a proven one (resumeStepBasis);
2. a line at the loaded step before any step of the process is no replay; a line below
   it, or the loaded step as the first step of a job whose lines come after steps, is;
3. a child of a worker (a warm-up or evaluation subprocess, a process a survivor starts
   after the kill) is never the replacement, told by its start line's ``parent`` or its
   parent pid; its checkpoints count as its worker's;
4. lines stamped before the job started (an earlier run's log printed at start-up) are no
   evidence: no trigger, no checkpoint, no last step, and the report counts them;
5. every rank's own checkpoint_loaded is held to the expected step (and its digest to the
   shard it saved); a rank that says nothing is unchecked, and FAILs with allRanks;
6. a recovery is held for the sustain window: a stall inside it FAILs "stopped
   progressing after resume" as soon as it is proven;
7. checkpoints written by forked writer processes still measure the checkpoint interval
   (the lineage of the reporting rank), so delay "50%" fires.
"""

from __future__ import annotations

from typing import Any

from pytest_recoverygate.engine.machine import (
    DrillEngine,
    DrillResult,
    FailureReason,
    Finish,
    KillTarget,
    Verdict,
)
from pytest_recoverygate.engine.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEvent,
)
from pytest_recoverygate.engine.spec import Delay, DrillSpec, Sustain
from tests.engine_events import T0, C, L, P, S, ev

R = FailureReason


def engine_for(
    *, ranks: tuple[int, ...] = (0, 1), not_before: float | None = None, **kw: object
) -> DrillEngine:
    base: dict[str, object] = {
        "max_recovery_time": 10.0,
        "after_checkpoint": 20,
        "sustain": Sustain(lines=3, seconds=0.0),
    }
    base.update(kw)
    engine = DrillEngine(DrillSpec(**base), T0)  # type: ignore[arg-type]
    engine.discovered(T0, "test", ranks=ranks, not_before=not_before)
    return engine


def drive(
    engine: DrillEngine, events: list[TrainingEvent], kill_at: float | None = None
) -> list[Finish]:
    out: list[Finish] = []
    for event in events:
        for action in engine.on_training_event(event):
            if isinstance(action, KillTarget):
                at = T0 + kill_at if kill_at is not None else event.timestamp
                out += [
                    a
                    for a in engine.on_kill_result(KillResult(KillOutcome.KILLED, at))
                    if isinstance(a, Finish)
                ]
            elif isinstance(action, Finish):
                out.append(action)
    return out


def result_of(
    engine: DrillEngine, events: list[TrainingEvent], tick: float = 10_000.0
) -> DrillResult:
    finishes = drive(engine, events)
    if not finishes:
        finishes = [a for a in engine.tick(T0 + tick) if isinstance(a, Finish)]
    assert len(finishes) == 1, finishes
    return finishes[0].result


def steps_run(
    inc: str,
    t0: float,
    steps: list[int],
    *,
    every: float = 0.1,
    ckpt_every: int | None = 10,
    start: bool = True,
    loaded: int | None = None,
    **start_fields: Any,
) -> list[TrainingEvent]:
    """One process: a start line, an optional load, then progress lines at the given steps,
    checkpoints at multiples of ``ckpt_every`` among the steps it passes."""
    events = [ev(S, t0, inc, **start_fields)] if start else []
    t = t0 + 0.05
    if loaded is not None:
        events.append(ev(L, t, inc, loaded))
    prev: int = loaded or 0
    for step in steps:
        t += every
        events.append(ev(P, t, inc, step))
        if ckpt_every:
            for done in range(prev + 1, step + 1):
                if done % ckpt_every == 0:
                    events.append(ev(C, t + 0.001, inc, done))
        prev = step
    return events


# ---------------------------------------------------------------------------- 1. the grid


def test_the_first_step_then_every_tenth_keeps_a_grid_and_a_correct_resume_passes() -> None:
    engine = engine_for()
    old = steps_run("old", 0.0, [1, 10, 20], every=0.5)
    drive(engine, old, kill_at=1.6)  # the trigger: checkpoint 20 at 1.55 s
    new = steps_run("new", 3.0, [21, 30, 40, 50, 60], ckpt_every=None)  # logs 21, then 10s
    result = result_of(engine, new)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 20
    assert result.step_contract is not None and result.step_contract.first_special
    assert "the first step, then every 10 steps" in result.step_contract.describe()


def test_a_metrics_thread_with_a_correct_resume_and_no_load_line_is_inconclusive_not_failed() -> (
    None
):
    # A timer reports the completed count every 0.1 s: 3, 8, 12, 17, 21, 26 ... no grid.
    engine = engine_for()
    old = steps_run("old", 0.0, [3, 8, 12, 17, 21, 26])
    drive(engine, old, kill_at=0.7)
    new = steps_run("new", 1.0, [24, 29, 33, 38, 42], ckpt_every=None)  # resumed from 20
    result = result_of(engine, new)
    assert result.verdict is Verdict.ERROR and result.inconclusive, result.summary
    assert "keep no reporting grid" in result.summary
    assert "checkpoint_loaded" in result.summary
    assert result.step_contract is not None and result.step_contract.regular is False
    assert result.headline is not None and result.headline.resume_basis == "unknown"


def test_a_metrics_thread_that_restarted_from_scratch_fails_whatever_the_grid() -> None:
    engine = engine_for()
    drive(engine, steps_run("old", 0.0, [3, 8, 12, 17, 21, 26]), kill_at=0.7)
    result = result_of(engine, steps_run("new", 1.0, [4, 9, 13, 18, 22], ckpt_every=None))
    assert result.verdict is Verdict.FAIL, result.summary
    assert R.RESTARTED_FROM_SCRATCH in result.reasons


def test_a_metrics_thread_that_resumed_from_an_older_checkpoint_fails_with_a_bound() -> None:
    engine = engine_for(after_checkpoint=40, max_recovery_time=30.0)
    drive(engine, steps_run("old", 0.0, [4, 9, 15, 22, 28, 33, 38, 41, 47]), kill_at=1.0)
    # Checkpoint 40 was the latest; its first line (27) says it resumed from 27 at most.
    result = result_of(engine, steps_run("new", 2.0, [27, 31, 36, 44, 48], ckpt_every=None))
    assert result.verdict is Verdict.FAIL, result.summary
    assert R.RESUMED_FROM_OLDER_CHECKPOINT in result.reasons
    assert "step 27 or earlier, expected step 40" in result.summary
    assert result.resume_step is None  # no inferred figure printed as a proven one


def test_a_resume_inferred_from_the_grid_that_disagrees_is_no_proven_failure() -> None:
    # Every 10th step, checkpoints every 10: a first line of 50 by the grid means a resume
    # from 40 when 20 was the latest — only an inference, so no FAIL.
    engine = engine_for()
    drive(engine, steps_run("old", 0.0, [10, 20, 30], every=0.5), kill_at=1.6)
    result = result_of(engine, steps_run("new", 3.0, [50, 60, 70, 80], ckpt_every=None))
    assert result.verdict is not Verdict.FAIL, result.summary


# ---------------------------------------------------------------------------- 2. held lines


def test_a_timer_line_at_the_loaded_step_before_any_step_is_no_replay() -> None:
    engine = engine_for()
    drive(engine, steps_run("old", 0.0, [3, 8, 12, 17, 21, 26]), kill_at=0.7)
    # loaded 20, and its timer ticks at once: 20 (the state it holds), then 24, 29, ...
    new = steps_run("new", 1.0, [20, 24, 29, 33, 38], loaded=20, ckpt_every=None)
    result = result_of(engine, new)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 20
    assert result.headline is not None and result.headline.resume_basis == "checkpoint_loaded"
    assert result.recovery_time_seconds is not None
    assert abs(result.recovery_time_seconds - (1.25 - 0.7)) < 1e-6  # its first step, 24


def test_the_loaded_step_as_the_first_step_of_a_job_whose_lines_follow_steps_is_a_replay() -> None:
    engine = engine_for()
    drive(engine, steps_run("old", 0.0, list(range(1, 26))), kill_at=2.55)
    new = steps_run("new", 3.0, [20, 21, 22, 23, 24], loaded=20, ckpt_every=None)
    result = result_of(engine, new)
    assert result.verdict is Verdict.FAIL, result.summary
    assert R.STEPS_REPLAYED in result.reasons


def test_a_line_below_the_loaded_step_is_a_replay_whatever_the_grid() -> None:
    engine = engine_for()
    drive(engine, steps_run("old", 0.0, [3, 8, 12, 17, 21, 26]), kill_at=0.7)
    result = result_of(engine, steps_run("new", 1.0, [4, 9, 13, 18], loaded=20, ckpt_every=None))
    assert result.verdict is Verdict.FAIL, result.summary
    assert R.STEPS_REPLAYED in result.reasons


# ---------------------------------------------------------------------------- 3. children


def old_worker(kill_at: float = 2.55) -> tuple[DrillEngine, list[TrainingEvent]]:
    engine = engine_for(max_recovery_time=20.0)
    events = steps_run("old", 0.0, list(range(1, 26)), pid=100, host="h")
    drive(engine, events, kill_at=kill_at)
    return engine, events


def test_a_subprocess_a_survivor_starts_after_the_kill_is_never_the_replacement() -> None:
    engine, _ = old_worker()
    # The survivor (rank 0, pid 100) starts an evaluation that inherits RANK=0, loads the
    # latest checkpoint and reports it; then the real replacement restarts from scratch.
    child = [
        ev(S, 2.7, "eval", pid=300, host="h", ppid=100, parent="old"),
        ev(L, 2.8, "eval", 20),
        *[ev(P, 2.9 + i / 10, "eval", 21 + i) for i in range(5)],
    ]
    new = steps_run("new", 4.0, [1, 2, 3, 4, 5], ckpt_every=None, pid=400, host="h", ppid=50)
    result = result_of(engine, child + new)
    assert result.verdict is Verdict.FAIL, result.summary
    assert R.RESTARTED_FROM_SCRATCH in result.reasons
    assert result.judged_incarnation == "new"
    assert any(i.child and i.inc == "eval" for i in result.incarnations)


def test_a_warm_up_subprocess_of_the_replacement_is_told_by_its_parent_pid() -> None:
    engine, _ = old_worker()
    # The replacement (pid 400) runs a warm-up child before its own first line: the child
    # names its parent's incarnation (inherited from the environment), which the drill has
    # not heard from yet, so its lines decide nothing until the parent reports.
    warm = [ev(S, 3.0, "warm", pid=401, host="h", ppid=400, parent="new")]
    warm.append(ev(P, 3.1, "warm", 1))
    warm += [ev(P, 3.2, "warm", 2), ev(P, 3.3, "warm", 3)]
    new = steps_run(
        "new", 3.5, [21, 22, 23, 24, 25], loaded=20, ckpt_every=None, pid=400, host="h", ppid=50
    )
    result = result_of(engine, warm + new)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.judged_incarnation == "new"


def test_two_workers_that_both_train_are_decided_by_the_one_that_trains_last() -> None:
    engine, _ = old_worker()
    first = steps_run("r1", 3.0, [21, 22], loaded=20, ckpt_every=None, pid=400, host="h", ppid=50)
    second = steps_run(
        "r2", 5.0, [21, 22, 23, 24, 25], loaded=20, ckpt_every=None, pid=500, host="h", ppid=50
    )
    result = result_of(engine, first + second)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.judged_incarnation == "r2"


# ---------------------------------------------------------------------------- 4. foreign lines


def test_an_earlier_runs_log_printed_at_start_up_does_not_move_the_verdict() -> None:
    # The job cats its old log first: lines of an earlier run, stamped an hour ago, up to
    # checkpoint 90. The drill waits for step-20 of *this* run and resumes from 20.
    engine = engine_for(not_before=T0 - 0.25)
    replay = steps_run("past", -3600.0, list(range(1, 95)), every=0.5)
    drive(engine, replay)
    assert engine.kill_time is None  # checkpoint 90 of the old log triggered nothing
    drive(engine, steps_run("old", 0.0, list(range(1, 26))), kill_at=2.55)
    result = result_of(
        engine, steps_run("new", 3.0, [21, 22, 23, 24, 25], loaded=20, ckpt_every=None)
    )
    assert result.verdict is Verdict.PASS, result.summary
    assert result.ignored_lines == len(replay)
    assert result.last_step_before_kill == 25
    assert any("were ignored" in note for note in result.notes)


# ---------------------------------------------------------------------------- 5. every rank


def sharded(
    loads: dict[int, int | None], *, digests: dict[int, str] | None = None, **kw: Any
) -> DrillResult:
    """Three ranks, each saving its own shard; ``loads``: what ranks 1 and 2 load after the
    kill; ``digests``: the digest each rank reports on that load (saved: ``<rank><step>``)."""
    engine = engine_for(ranks=(0, 1, 2), **kw)
    old = [
        e if e.kind is not C else ev(C, e.timestamp - T0, "old", e.step, digest=f"0{e.step:02d}")
        for e in steps_run("old", 0.0, list(range(1, 26)))
    ]
    for rank in (1, 2):
        old.append(ev(S, 0.0, f"old{rank}", rank=rank))
        for step in (10, 20):
            old.append(
                ev(C, step / 10 + 0.06, f"old{rank}", step, rank=rank, digest=f"{rank}{step:02d}")
            )
    old.sort(key=lambda e: e.timestamp)
    drive(engine, old, kill_at=2.58)
    new = [ev(S, 3.0, "new"), ev(L, 3.05, "new", 20, digest="020")]
    new += [ev(P, 3.05 + i / 10, "new", 20 + i) for i in range(1, 6)]
    for rank, load in loads.items():
        new.append(ev(S, 3.0, f"new{rank}", rank=rank))
        if load is not None:
            digest = (digests or {}).get(rank, f"{rank}{load:02d}")
            new.append(ev(L, 3.06, f"new{rank}", load, rank=rank, digest=digest))
    new.sort(key=lambda e: e.timestamp)
    return result_of(engine, new)


def test_every_rank_that_loaded_the_expected_step_passes() -> None:
    result = sharded({1: 20, 2: 20})
    assert result.verdict is Verdict.PASS, result.summary
    assert any(c.name == "all_ranks_resumed" and c.passed for c in result.checks)


def test_a_rank_whose_shard_came_from_another_step_fails_with_the_rank_named() -> None:
    result = sharded({1: 20, 2: 10})
    assert result.verdict is Verdict.FAIL, result.summary
    assert "rank 2 loaded step 10, expected step 20" in result.summary
    assert R.RESUMED_FROM_OLDER_CHECKPOINT in result.reasons


def test_a_silent_rank_is_unchecked_and_fails_only_with_all_ranks() -> None:
    lenient = sharded({1: 20, 2: None})
    assert lenient.verdict is Verdict.PASS, lenient.summary
    check = next(c for c in lenient.checks if c.name == "all_ranks_resumed")
    assert "rank(s) 2 reported no checkpoint_loaded" in check.message
    strict = sharded({1: 20, 2: None}, all_ranks=True)
    assert strict.verdict is Verdict.FAIL, strict.summary
    assert "allRanks" in strict.summary


def test_a_rank_whose_shard_differs_from_the_one_it_saved_fails_with_state_digest_matches() -> None:
    same = sharded({1: 20, 2: 20}, state_digest_matches=True)
    assert same.verdict is Verdict.PASS, same.summary
    lost = sharded({1: 20, 2: 20}, digests={2: "ffff"}, state_digest_matches=True)
    assert lost.verdict is Verdict.FAIL, lost.summary
    assert "rank 2 loaded checkpoint 20 but its state differs" in lost.summary
    assert R.STATE_DIFFERS in lost.reasons


# ---------------------------------------------------------------------------- 6. sustain


def test_a_job_that_stalls_after_one_step_fails_as_soon_as_the_stall_is_proven() -> None:
    engine = engine_for(sustain=Sustain())  # the default: 3 lines and 10 s
    drive(engine, steps_run("old", 0.0, list(range(1, 26))), kill_at=2.55)
    drive(engine, steps_run("new", 3.0, [21], loaded=20, ckpt_every=None))
    deadline = engine.deadline
    assert deadline is not None and deadline - (T0 + 3.15) == 5.0  # the stall limit, not 40 s
    [finish] = [a for a in engine.tick(deadline) if isinstance(a, Finish)]
    result = finish.result
    assert result.verdict is Verdict.FAIL, result.summary
    assert R.STOPPED_PROGRESSING in result.reasons
    assert "its last step was 21" in result.summary


def test_a_job_that_keeps_training_is_held_for_the_whole_window() -> None:
    engine = engine_for(sustain=Sustain())
    drive(engine, steps_run("old", 0.0, list(range(1, 26))), kill_at=2.55)
    new = steps_run("new", 3.0, list(range(21, 141)), loaded=20, ckpt_every=None)  # 12 s
    finishes = drive(engine, new)
    assert len(finishes) == 1
    result = finishes[0].result
    assert result.verdict is Verdict.PASS, result.summary
    assert result.finished_at is not None and result.finished_at - (T0 + 3.15) >= 10.0
    assert result.headline is not None and result.headline.sustained is not None
    assert result.headline.sustained["steps"] >= 100


def test_a_count_of_steps_sustains_by_steps() -> None:
    engine = engine_for(sustain=Sustain(lines=1, seconds=0.0, steps=5))
    drive(engine, steps_run("old", 0.0, list(range(1, 26))), kill_at=2.55)
    finishes = drive(engine, steps_run("new", 3.0, list(range(21, 31)), loaded=20, ckpt_every=None))
    assert len(finishes) == 1 and finishes[0].result.verdict is Verdict.PASS
    assert finishes[0].result.headline is not None
    assert finishes[0].result.headline.sustained is not None
    assert finishes[0].result.headline.sustained["lastStep"] == 25


def test_a_job_that_finishes_inside_the_window_after_two_lines_is_inconclusive() -> None:
    # Three lines past the resume and a successful end would sustain it (see
    # tests/test_engine_third_pass.py); two do not.
    engine = engine_for(sustain=Sustain())
    drive(engine, steps_run("old", 0.0, list(range(1, 26))), kill_at=2.55)
    drive(engine, steps_run("new", 3.0, [21, 22], loaded=20, ckpt_every=None))
    [finish] = engine.on_group_event(GroupEvent(GroupEventKind.JOB_SUCCEEDED, T0 + 4.0, "exit 0"))
    assert isinstance(finish, Finish)
    assert finish.result.inconclusive, finish.result.summary
    assert "sustain window" in finish.result.summary


# ---------------------------------------------------------------------------- 7. lineage


def test_checkpoints_of_forked_writers_measure_the_interval_and_a_delayed_kill_fires() -> None:
    engine = engine_for(delay=Delay("fraction", 0.5, explicit=True), after_checkpoint=20)
    events = steps_run("old", 0.0, list(range(1, 46)), ckpt_every=None, pid=100, host="h")
    # Each checkpoint is written and reported by a child forked for it.
    for n, step in enumerate((10, 20, 30, 40)):
        at = step / 10 + 0.05
        events.append(ev(S, at - 0.01, f"w{n}", pid=200 + n, host="h", ppid=100, parent="old"))
        events.append(ev(C, at, f"w{n}", step))
    events.sort(key=lambda e: e.timestamp)
    fired: list[float] = []
    for event in events:
        for action in engine.on_training_event(event):
            if isinstance(action, KillTarget):
                fired.append(event.timestamp)
        for action in engine.tick(event.timestamp):
            if isinstance(action, KillTarget):
                fired.append(event.timestamp)
    assert fired, engine.status(T0 + 5)
    # 50 % of the 1 s interval after checkpoint 20 (2.05 s): at 2.55 s
    assert abs(fired[0] - (T0 + 2.55)) < 0.11
