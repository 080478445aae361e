"""Adversarial attempts on the verdict, by a reviewer who did not write it: each asserts
what the simulated job truly did (a counter reset after the resume, a timer repeating the
count between slow steps, evaluation pauses, Lightning's launcher starting ranks from rank
0, a rank whose newest process loaded nothing, two processes taking turns, a job that
breaks the contract). The attempts that found no defect stay as guards.
"""

from __future__ import annotations

from typing import Any

from pytest_recoverygate.engine.machine import DrillEngine, DrillResult, Finish, Verdict
from pytest_recoverygate.engine.spec import Sustain
from tests.engine_events import T0, C, L, P, S, ev
from tests.test_engine_patterns import R, drive, engine_for, result_of, steps_run


def run_ticking(engine: DrillEngine, events, end: float | None = None):
    """Like the runner: tick at the engine's deadline whenever it comes before the next line."""
    from pytest_recoverygate.engine.machine import KillTarget
    from pytest_recoverygate.engine.model import KillOutcome, KillResult

    for event in events:
        while engine.deadline is not None and engine.deadline < event.timestamp:
            for a in engine.tick(engine.deadline):
                if isinstance(a, Finish):
                    return a.result
                if isinstance(a, KillTarget):
                    engine.on_kill_result(KillResult(KillOutcome.KILLED, engine.deadline))
        for a in engine.on_training_event(event):
            if isinstance(a, Finish):
                return a.result
            if isinstance(a, KillTarget):
                engine.on_kill_result(KillResult(KillOutcome.KILLED, event.timestamp))
    while engine.deadline is not None and (end is None or engine.deadline <= end):
        for a in engine.tick(engine.deadline):
            if isinstance(a, Finish):
                return a.result
    return None


def old_run(engine: DrillEngine, kill_at: float = 2.55, n: int = 25, **kw: Any) -> None:
    drive(engine, steps_run("old", 0.0, list(range(1, n + 1)), **kw), kill_at=kill_at)


# 1. a line below the loaded step after a held line
def test_lines_below_the_loaded_step_after_a_held_line_are_a_replay() -> None:
    engine = engine_for()
    drive(engine, steps_run("old", 0.0, [3, 8, 12, 17, 21, 26]), kill_at=0.7)
    # loaded 20, ticks 20 (held), then its counter restarted: 4, 9, 13, 18, then past 20
    new = steps_run("new", 1.0, [20, 4, 9, 13, 18, 22, 27, 31, 36], loaded=20, ckpt_every=None)
    result = result_of(engine, new)
    assert result.verdict is Verdict.FAIL, result.summary


# 2. a counter reset after the first step past the load (an in-process restart from scratch)
def test_a_counter_reset_after_the_first_step_is_no_pass() -> None:
    engine = engine_for(sustain=Sustain())
    old_run(engine)
    steps = [21, 22, *list(range(1, 150))]
    new = steps_run("new", 3.0, steps, loaded=20, ckpt_every=None)
    result = result_of(engine, new)
    assert result.verdict is not Verdict.PASS, result.summary


# 3. slow steps (20 s) with a timer printing the same count every second
def timer_run(
    inc: str,
    t0: float,
    first: int,
    last: int,
    *,
    step_time: float = 20.0,
    tick: float = 1.0,
    loaded: int | None = None,
    ckpt_every: int | None = 2,
    start: bool = True,
):
    events = [ev(S, t0, inc)] if start else []
    t = t0 + 0.05
    if loaded is not None:
        events.append(ev(L, t, inc, loaded))
    count = first - 1
    next_step = t + step_time
    now = t
    while count < last:
        now += tick
        while now >= next_step and count < last:
            count += 1
            if ckpt_every and count % ckpt_every == 0:
                events.append(ev(C, next_step + 0.001, inc, count))
            next_step += step_time
        events.append(ev(P, now, inc, count))
    return sorted(events, key=lambda e: e.timestamp)


def test_a_timer_repeating_the_count_between_20s_steps_is_no_stall() -> None:
    engine = engine_for(sustain=Sustain(), max_recovery_time=60.0, after_checkpoint=4)
    old = [e for e in timer_run("old", 0.0, 1, 6) if not (e.kind is P and e.step == 0)]
    drive(engine, old, kill_at=81.0)  # checkpoint 4 at ~80 s
    assert engine.kill_time is not None
    new = [
        e
        for e in timer_run("new", 90.0, 5, 12, loaded=4, ckpt_every=None)
        if not (e.kind is P and e.step == 4)
    ]
    result = run_ticking(engine, new)
    assert result is not None
    assert result.verdict is Verdict.PASS, result.summary


# 4. Lightning's default DDP launcher: ranks 1..N-1 are subprocesses of rank 0
def lightning(load1: int, **kw: Any):
    engine = engine_for(ranks=(0, 1), max_recovery_time=20.0, **kw)
    old = steps_run("old0", 0.0, list(range(1, 26)), pid=100, host="h")
    old.append(ev(S, 0.0, "old1", rank=1, pid=101, host="h", ppid=100, parent="old0"))
    for step in (10, 20):
        old.append(ev(C, step / 10 + 0.06, "old1", step, rank=1))
    old.sort(key=lambda e: e.timestamp)
    drive(engine, old, kill_at=2.58)
    new = steps_run(
        "new0", 3.0, [21, 22, 23, 24, 25], loaded=20, ckpt_every=None, pid=200, host="h"
    )
    new += [
        ev(S, 3.02, "new1", rank=1, pid=201, host="h", ppid=200, parent="new0"),
        ev(L, 3.06, "new1", load1, rank=1),
    ]
    new.sort(key=lambda e: e.timestamp)
    return result_of(engine, new)


def test_a_lightning_rank_that_loaded_an_older_shard_fails() -> None:
    result = lightning(10)
    assert result.verdict is Verdict.FAIL, result.summary


def test_a_lightning_rank_that_loaded_the_right_shard_passes_with_all_ranks() -> None:
    result = lightning(20, all_ranks=True)
    assert result.verdict is Verdict.PASS, result.summary


# 9. a standby worker (started before the kill, waiting at rendezvous) loads an older checkpoint
def test_a_standby_replacement_that_loaded_an_older_checkpoint_fails() -> None:
    engine = engine_for(max_recovery_time=20.0)
    events = steps_run("old", 0.0, list(range(1, 26)))
    events.append(ev(S, 1.5, "spare"))  # a spare process, started between checkpoints 10 and 20
    drive(engine, sorted(events, key=lambda e: e.timestamp), kill_at=2.55)
    # it joins after the kill and loads checkpoint 10, though 20 was durable before the kill
    new = [ev(L, 3.0, "spare", 10)] + [ev(P, 3.0 + i / 10, "spare", 10 + i) for i in range(1, 6)]
    result = result_of(engine, new)
    assert result.verdict is Verdict.FAIL, result.summary


# 10. a rank whose first replacement loaded the right shard and died; its second re-initialised
def test_a_ranks_newest_process_that_loaded_nothing_is_not_covered_by_an_older_one() -> None:
    engine = engine_for(ranks=(0, 1, 2), max_recovery_time=20.0)
    old = steps_run("old", 0.0, list(range(1, 26)))
    for rank in (1, 2):
        old.append(ev(S, 0.0, f"old{rank}", rank=rank))
        for step in (10, 20):
            old.append(ev(C, step / 10 + 0.06, f"old{rank}", step, rank=rank))
    drive(engine, sorted(old, key=lambda e: e.timestamp), kill_at=2.58)
    new = [ev(S, 3.0, "a2", rank=2), ev(L, 3.02, "a2", 20, rank=2)]  # loads 20, then OOMs
    new += [ev(S, 3.0, "new1", rank=1), ev(L, 3.02, "new1", 20, rank=1)]
    new += [ev(S, 4.0, "b2", rank=2)]  # the group restarted again: this one never loads
    new += [ev(S, 4.0, "new"), ev(L, 4.02, "new", 20)]
    new += [ev(P, 4.05 + i / 10, "new", 20 + i) for i in range(1, 12)]
    new += [ev(C, 5.06, "b2", 30, rank=2)]  # ...and saves its re-initialised shard
    result = result_of(engine, sorted(new, key=lambda e: e.timestamp))
    # Judged before b2's save arrives: its newest process has said nothing, so rank 2 is
    # unchecked (an older process's load does not cover it), never "ok".
    ranks = {r["rank"]: r["status"] for r in result.recoveries[-1].fault_details["ranks"]}
    assert ranks == {1: "ok", 2: "unchecked"}, ranks


def standby(load: int, *, start_line_late: bool):
    engine = engine_for(max_recovery_time=20.0)
    events = steps_run("old", 0.0, list(range(1, 26)))
    start = ev(S, 1.5, "spare")  # a spare process started between checkpoints 10 and 20
    if not start_line_late:
        events.append(start)
    drive(engine, sorted(events, key=lambda e: e.timestamp), kill_at=2.55)
    new = ([start] if start_line_late else []) + [ev(L, 3.0, "spare", load)]
    new += [ev(P, 3.0 + i / 10, "spare", load + i) for i in range(1, 6)]
    return result_of(engine, new)


# 12. count: 2 -- the second recovery shows the held-line-then-below pattern of attempt 1
def test_count_two_a_second_recovery_that_replays_after_a_held_line_fails() -> None:
    engine = engine_for(count=2)
    drive(engine, steps_run("old", 0.0, [3, 8, 12, 17, 21, 26]), kill_at=0.7)
    # kill 1: a correct resume from 20; it trains on, checkpoint 30 triggers kill 2
    first = steps_run("r1", 1.0, [24, 29, 33, 38, 42, 47], loaded=20, ckpt_every=10)
    out = drive(engine, first, kill_at=1.56)  # checkpoint 40 at 1.551 triggers kill 2
    assert not out and engine.kill_time is not None and abs(engine.kill_time - T0 - 1.56) < 1e-6
    second = steps_run(
        "r2",
        2.0,
        [40, 4, 9, 13, 18, 22, 27, 34, 38, 43, 47, 52, 56, 61],
        loaded=40,
        ckpt_every=None,
    )
    result = result_of(engine, second)
    assert result.verdict is Verdict.FAIL, result.summary


# 13. lines of an earlier run straddling not_before: an old process still writing to the log
def test_an_old_runs_process_whose_first_line_is_stamped_after_not_before_moves_nothing() -> None:
    # an earlier run's log restored with its clock 1 s ahead: its last lines land after
    # not_before; its start line (stamped 10 minutes ago) is ignored, so the rest is too?
    engine = engine_for(not_before=T0 - 0.25)
    replay = steps_run("past", -600.0, list(range(1, 95)), every=0.5)
    replay = [e for e in replay if e.kind is not S] + [ev(S, -600.0, "past")]
    drive(engine, sorted(replay, key=lambda e: e.timestamp))
    assert engine.kill_time is None


# 15. two new processes for the reporting rank report alternately (a worker, and a
#     subprocess of it that names no parent, both training): the drill must still decide
def test_two_alternating_new_reporters_do_not_keep_the_drill_open_forever() -> None:
    engine = engine_for(sustain=Sustain(), max_recovery_time=20.0)
    old_run(engine)
    new = [ev(S, 3.0, "a"), ev(L, 3.01, "a", 20), ev(S, 3.0, "b"), ev(L, 3.01, "b", 20)]
    for i in range(1, 3000):  # 300 s of training, each printing every 0.1 s
        new.append(ev(P, 3.0 + i / 10, "a", 20 + i))
        new.append(ev(P, 3.0 + i / 10 + 0.05, "b", 20 + i))
    result = run_ticking(engine, new)
    assert result is not None, "no verdict after 300 s: the drill waits as long as the job trains"
    # decided by the recovery deadline plus one sustain window and stall limit (2.55 + 50 + 15)
    assert result.finished_at is not None and result.finished_at - T0 <= 2.55 + 50.0 + 15.0 + 1e-6


# 16. a progress(epoch) job (breaks the contract: 0 first) that resumed correctly
def test_a_progress_epoch_job_that_resumed_correctly_is_inconclusive_not_failed() -> None:
    engine = engine_for(max_recovery_time=20.0)
    # progress(epoch) after each epoch (0, 1, 2, ...); checkpoint_completed(epoch + 1)
    old = [ev(S, 0.0, "old")]
    for epoch in range(0, 25):
        t = 0.1 * (epoch + 1)
        old.append(ev(P, t, "old", epoch))
        if (epoch + 1) % 10 == 0:
            old.append(ev(C, t + 0.001, "old", epoch + 1))
    drive(engine, old, kill_at=2.55)
    assert engine.kill_time is not None
    # resumed from epochs_done = 20: checkpoint_loaded(20), then epoch index 20: progress(20)
    new = [ev(S, 3.0, "new"), ev(L, 3.05, "new", 20)]
    new += [ev(P, 3.05 + 0.1 * (i + 1), "new", 20 + i) for i in range(6)]
    result = result_of(engine, new)
    assert result.verdict is Verdict.ERROR and result.inconclusive, result.summary


def test_a_counter_reset_after_the_first_steps_without_checkpoint_loaded_is_no_pass() -> None:
    engine = engine_for(sustain=Sustain())
    old_run(engine)
    new = steps_run("new", 3.0, [21, 22, *list(range(1, 150))], ckpt_every=None)
    result = result_of(engine, new)
    assert result.verdict is not Verdict.PASS, result.summary


# 17. periodic evaluation pauses (30 s every 30 steps) older than the last 16 pre-kill lines
def eval_run(
    inc: str, t0: float, first: int, last: int, *, loaded: int | None = None, ckpt: bool = True
):
    events = [ev(S, t0, inc)]
    t = t0 + 0.05
    if loaded is not None:
        events.append(ev(L, t, inc, loaded))
    for step in range(first, last + 1):
        t += 0.1
        events.append(ev(P, t, inc, step))
        if ckpt and step % 10 == 0:
            events.append(ev(C, t + 0.001, inc, step))
        if step % 30 == 0:
            t += 30.0  # evaluation
    return events


def test_a_periodic_evaluation_pause_after_the_resume_is_no_stall() -> None:
    engine = engine_for(sustain=Sustain(), max_recovery_time=60.0, after_checkpoint=50)
    old = eval_run("old", 0.0, 1, 55)
    drive(engine, old, kill_at=35.06)  # right after checkpoint 50 (35.051 s)
    assert engine.kill_time is not None
    new = eval_run("new", 40.0, 51, 120, loaded=50, ckpt=False)
    result = run_ticking(engine, new)
    assert result is not None and result.verdict is Verdict.PASS, result and result.summary


def evaluating_after_the_resume(max_stall: float | None = None) -> DrillResult:
    """Kill after checkpoint 20 of a job that never evaluated before it; after a correct
    resume from 20 it trains 21-25, evaluates for 8 s, then trains on (26-60)."""
    engine = engine_for(sustain=Sustain(), max_stall=max_stall)  # the default: 3 lines, 10 s
    drive(engine, steps_run("old", 0.0, list(range(1, 26))), kill_at=2.55)
    new = steps_run("new", 3.0, list(range(21, 26)), loaded=20, ckpt_every=None)
    new += steps_run("new", 11.6, list(range(26, 61)), start=False, ckpt_every=None)
    result: DrillResult | None = run_ticking(engine, new)
    assert result is not None
    return result


def test_a_pause_longer_than_the_stall_limit_fails_naming_the_key_that_allows_it() -> None:
    result = evaluating_after_the_resume()  # the stall limit: 5 s (gaps of 0.1 s before)
    assert result.verdict is Verdict.FAIL, result.summary
    assert R.STOPPED_PROGRESSING in result.reasons
    assert "stall limit 5.00s" in result.summary
    assert "expectations.maxStall" in result.summary


def test_max_stall_lets_a_job_pause_on_purpose_after_the_resume() -> None:
    result = evaluating_after_the_resume(max_stall=20.0)
    assert result.verdict is Verdict.PASS, result.summary


def test_max_stall_still_fails_a_job_that_stops_for_good() -> None:
    engine = engine_for(sustain=Sustain(), max_stall=20.0)
    drive(engine, steps_run("old", 0.0, list(range(1, 26))), kill_at=2.55)
    drive(engine, steps_run("new", 3.0, [21], loaded=20, ckpt_every=None))
    deadline = engine.deadline
    assert deadline is not None and deadline - (T0 + 3.15) == 20.0  # maxStall, not 5 s
    [finish] = [a for a in engine.tick(deadline) if isinstance(a, Finish)]
    assert finish.result.verdict is Verdict.FAIL, finish.result.summary
    assert R.STOPPED_PROGRESSING in finish.result.reasons


# 18. deadlocked after 3 steps while a timer keeps printing the same count
def test_a_deadlock_with_a_timer_repeating_the_count_fails() -> None:
    engine = engine_for(sustain=Sustain())
    old_run(engine)
    new = steps_run("new", 3.0, [21, 22, 23, 24] + [24] * 300, loaded=20, ckpt_every=None)
    result = run_ticking(engine, new)
    assert result is not None and result.verdict is Verdict.FAIL, result and result.summary
    assert R.STOPPED_PROGRESSING in result.reasons
