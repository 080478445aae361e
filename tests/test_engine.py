"""The drill engine, driven directly: no backend, no clock, no I/O.

We test these aspects:
- the phase table: the engine moves only along :data:`TRANSITIONS`, an illegal move raises;
- the trigger: ``step-N`` waits for a checkpoint >= N, ``next`` for one after the start, and
  a checkpoint a resume from which could not be told from a fresh start is never a trigger;
- the step contract, learned from the first incarnation (first step, stride) and held:
  a job that breaks it is never PASSed, with the precise message;
- the resume step: from ``checkpoint_loaded`` when present (and checked against the first
  step after it), else ``first step - stride``; undecided where that is not sound;
- the resume is judged on the replacement that trains (a replacement that loads and dies
  is not the verdict), and progress at or below the loaded step is steps replayed;
- "latest" is the newest checkpoint durable before the replacement loaded, including one
  a survivor completed after the kill, and one the drill never saw (when plausible);
- lost steps: lines stamped after the kill are not "before the kill"; the limit is checked
  against both bounds (PASS on the upper, FAIL on the lower, undecided between);
- each named failure reason, with expected and observed values in its message;
- deadlines and endings: "never came back" at maxRecoveryTime + grace, a job that finishes
  right after resuming is inconclusive;
- bookkeeping: restarts without start lines, the recovery phases sorted by time;
- and, with hypothesis, that over random jobs (dying replacements, counter resets, strides,
  rate-limited and post-kill lines, 0-based counting, asynchronous checkpoints) the verdict
  never contradicts the truth of what the simulated job did, written here independently.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pytest_recoverygate.engine.machine import (
    TRANSITIONS,
    DrillEngine,
    DrillResult,
    FailureReason,
    Finish,
    IllegalTransition,
    KillTarget,
    Phase,
    Verdict,
)
from pytest_recoverygate.engine.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEvent,
)
from pytest_recoverygate.engine.spec import DrillSpec, Sustain
from tests.engine_events import T0, C, L, P, S, ev

R = FailureReason


def spec(**kw: object) -> DrillSpec:
    # A short sustain window (3 advancing lines, no minimum duration): these tests are about
    # other rules; the sustain window's own tests set theirs.
    base: dict[str, object] = {
        "max_recovery_time": 10.0,
        "after_checkpoint": 20,
        "sustain": Sustain(lines=3, seconds=0.0),
    }
    base.update(kw)
    return DrillSpec(**base)  # type: ignore[arg-type]


def engine_for(**kw: object) -> DrillEngine:
    engine = DrillEngine(spec(**kw), T0)
    engine.discovered(T0, "test workload")
    return engine


def old_run(
    until_step: int,
    every: int = 10,
    rate: float = 10.0,
    *,
    start: bool = True,
    zero_based: bool = False,
    inc: str = "old",
) -> list[TrainingEvent]:
    """The first incarnation: steps 1..until_step at ``rate``/s, checkpoints every ``every``."""
    events = [ev(S, 0.0, inc)] if start else []
    shift = 1 if zero_based else 0
    for step in range(1, until_step + 1):
        events.append(ev(P, step / rate, inc, step - shift))
        if step % every == 0:
            events.append(ev(C, step / rate + 0.001, inc, step - shift))
    return events


def drive(
    engine: DrillEngine,
    events: list[TrainingEvent],
    kill_at: float | None = None,
) -> list[Finish]:
    """Feed events; when the engine asks for the kill, kill at ``kill_at`` (or the event time)."""
    finished: list[Finish] = []
    for event in events:
        for action in engine.on_training_event(event):
            if isinstance(action, KillTarget):
                at = T0 + kill_at if kill_at is not None else event.timestamp
                finished += [
                    a
                    for a in engine.on_kill_result(KillResult(KillOutcome.KILLED, at))
                    if isinstance(a, Finish)
                ]
            elif isinstance(action, Finish):
                finished.append(action)
    return finished


def new_run(
    start: float,
    resume: int,
    steps: int = 5,
    rate: float = 10.0,
    *,
    loaded: bool = True,
    inc: str = "new",
    first: int | None = None,
    stride: int = 1,
) -> list[TrainingEvent]:
    """A replacement: start line, checkpoint_loaded(resume), progress from ``first``."""
    events = [ev(S, start, inc)]
    if loaded and resume:
        events.append(ev(L, start + 0.5, inc, resume))
    step = resume + stride if first is None else first
    for i in range(steps):
        events.append(ev(P, start + 1 + i / rate, inc, step + i * stride))
    return events


def verdict_of(
    engine: DrillEngine,
    events: list[TrainingEvent],
    *,
    tick: float = 10_000.0,
) -> DrillResult:
    finishes = drive(engine, events)
    if not finishes:
        finishes = [a for a in engine.tick(T0 + tick) if isinstance(a, Finish)]
    assert len(finishes) == 1
    return finishes[0].result


# ------------------------------------------------------------------ phases


def test_the_engine_starts_discovering_and_moves_only_along_the_table() -> None:
    engine = DrillEngine(spec(), T0)
    assert engine.phase is Phase.DISCOVERING
    engine.discovered(T0, "found")
    assert engine.phase is Phase.WAITING_FOR_CHECKPOINT
    with pytest.raises(IllegalTransition, match="WAITING_FOR_CHECKPOINT -> VERIFYING"):
        engine._move(Phase.VERIFYING)
    assert all(Phase.DONE in targets for p, targets in TRANSITIONS.items() if p is not Phase.DONE)
    assert TRANSITIONS[Phase.DONE] == frozenset()


def test_every_drill_ends_in_done_with_one_timeline() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    result = verdict_of(engine, new_run(5.0, resume=20))
    assert engine.phase is Phase.DONE
    kinds = [e.kind for e in result.timeline]
    assert kinds[0] == "discovered" and "kill" in kinds and kinds[-1] == "verdict"


# ------------------------------------------------------------------ the basics


def test_it_passes_when_the_job_resumes_from_the_latest_checkpoint() -> None:
    engine = engine_for(max_lost_steps=10)
    assert drive(engine, old_run(25), kill_at=2.5) == []
    assert engine.phase is Phase.RECOVERING
    result = verdict_of(engine, new_run(5.0, resume=20))
    assert result.verdict is Verdict.PASS, result.summary
    assert (result.resume_step, result.expected_resume_step, result.loaded_step) == (20, 20, 20)
    assert result.lost_steps == 5
    assert result.lost_steps_upper_bound is not None and result.lost_steps_upper_bound >= 5
    assert result.recovery_time_seconds == pytest.approx(3.5)
    assert result.trigger_checkpoint == 20
    assert result.judged_incarnation == "new"
    assert result.step_contract is not None
    assert (result.step_contract.first_step, result.step_contract.stride) == (1, 1)
    assert result.exit_code == 0


def test_it_infers_the_resume_step_as_the_first_step_minus_the_stride() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    result = verdict_of(engine, new_run(5.0, resume=20, loaded=False))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 20
    assert result.loaded_step is None


def test_it_fails_a_restart_from_scratch_with_the_reason_and_both_steps() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    result = verdict_of(engine, new_run(5.0, resume=0, loaded=False))
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (R.RESTARTED_FROM_SCRATCH,)
    assert (
        "resumed from step 0, expected step 20 — the job restarted from scratch" in result.summary
    )
    assert result.exit_code == 1


def test_it_fails_a_resume_from_an_older_checkpoint() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    result = verdict_of(engine, new_run(5.0, resume=10))
    assert result.reasons == (R.RESUMED_FROM_OLDER_CHECKPOINT,)
    assert "expected step 20" in result.summary


def test_it_fails_a_recovery_slower_than_the_slo() -> None:
    engine = engine_for(max_recovery_time=2.0)
    drive(engine, old_run(25), kill_at=2.5)
    result = verdict_of(engine, new_run(5.0, resume=20))
    assert result.reasons == (R.TOO_SLOW,)
    assert "came back too slowly: 3.50s > 2.00s" in result.summary


def test_it_fails_when_too_many_steps_were_lost() -> None:
    engine = engine_for(max_lost_steps=3)
    drive(engine, old_run(27), kill_at=2.71)
    result = verdict_of(engine, new_run(5.0, resume=20))
    assert result.reasons == (R.LOST_TOO_MANY_STEPS,)
    assert result.lost_steps == 7


def test_it_ignores_lines_from_ranks_other_than_the_reporting_rank() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    forged = [ev(S, 3.0, "forged", rank=1), ev(P, 3.1, "forged", 1, rank=1)]
    assert drive(engine, forged) == []
    assert engine.phase is Phase.RECOVERING


@pytest.mark.parametrize(
    ("outcome", "verdict"),
    [
        (KillOutcome.DRY_RUN, Verdict.DRY_RUN),
        (KillOutcome.ALREADY_GONE, Verdict.ERROR),
        (KillOutcome.UNCONFIRMED, Verdict.ERROR),
    ],
)
def test_a_kill_that_did_not_happen_ends_the_drill(outcome: KillOutcome, verdict: Verdict) -> None:
    engine = engine_for()
    actions = []
    for event in old_run(25):
        actions += engine.on_training_event(event)
    assert [type(a) for a in actions] == [KillTarget]
    [finish] = engine.on_kill_result(KillResult(outcome, T0 + 2.5))
    assert isinstance(finish, Finish)
    assert finish.result.verdict is verdict


# ------------------------------------------------------------------ the trigger


def test_next_waits_for_a_checkpoint_completed_after_the_start() -> None:
    engine = DrillEngine(spec(after_checkpoint=None), T0 + 1.5)
    engine.discovered(T0 + 1.5, "found")
    kills = []
    for event in old_run(25):
        kills += [a for a in engine.on_training_event(event) if isinstance(a, KillTarget)]
    assert [k.checkpoint_step for k in kills] == [20]


def test_a_missing_trigger_checkpoint_is_an_error_at_the_deadline() -> None:
    engine = engine_for(after_checkpoint=1000, checkpoint_timeout=60.0)
    drive(engine, old_run(25))
    [finish] = engine.tick(T0 + 61)
    assert isinstance(finish, Finish)
    assert finish.result.verdict is Verdict.ERROR
    assert "the last checkpoint seen was step 20" in finish.result.summary


def test_checkpoint_zero_is_never_a_trigger_because_it_is_a_fresh_start() -> None:
    engine = engine_for(after_checkpoint=0)
    events = [ev(S, 0.0, "old"), ev(C, 0.01, "old", 0), *old_run(25)[1:]]
    kills = [a for e in events for a in engine.on_training_event(e) if isinstance(a, KillTarget)]
    assert [k.checkpoint_step for k in kills] == [10]
    assert any(
        "checkpoint 0 holds the state of a fresh start" in e.detail
        for e in engine.timeline_entries()
    )


def test_with_sparse_progress_a_checkpoint_below_the_stride_is_not_a_trigger() -> None:
    # Progress every 10 steps: a resume from checkpoint 5 would report 10 first, exactly
    # what a fresh start reports. The drill waits for checkpoint 10 instead.
    engine = engine_for(after_checkpoint=1)
    events = [ev(S, 0.0, "old")]
    for step in range(1, 31):
        if step % 10 == 0:
            events.append(ev(P, step / 10, "old", step))
        if step % 5 == 0:
            events.append(ev(C, step / 10 + 0.001, "old", step))
    kills = [a for e in events for a in engine.on_training_event(e) if isinstance(a, KillTarget)]
    assert kills[0].checkpoint_step == 10


# ------------------------------------------------------------------ 1. the step contract


def test_a_zero_based_job_is_never_passed_and_is_told_the_fix() -> None:
    engine = engine_for(after_checkpoint=19)
    drive(engine, old_run(25, zero_based=True), kill_at=2.5)
    # A resume that looks right by the job's own count: checkpoint 19 (0-based), then 20.
    result = verdict_of(engine, new_run(5.0, resume=19, loaded=False))
    assert result.verdict is Verdict.ERROR
    assert result.inconclusive
    assert (
        "the first step after a fresh start was reported as 0: report progress(epoch + 1), "
        "not progress(epoch)" in result.summary
    )
    assert result.step_contract is not None and result.step_contract.problem


def test_a_zero_based_job_that_restarts_from_scratch_still_fails() -> None:
    engine = engine_for(after_checkpoint=19)
    drive(engine, old_run(25, zero_based=True), kill_at=2.5)
    # Its first step after the restart is the fresh start's own first step: proven scratch.
    result = verdict_of(engine, new_run(5.0, resume=0, loaded=False, first=0))
    assert result.verdict is Verdict.FAIL
    assert R.RESTARTED_FROM_SCRATCH in result.reasons


def test_a_count_reported_twice_is_no_contract_break_the_grid_comes_from_distinct_steps() -> None:
    # A metrics thread between two slow steps reports the same count again: that is the
    # number of steps completed, as the contract asks. The grid is learned from the
    # distinct counts (1, 2, 3, ...), so a correct resume passes.
    engine = engine_for()
    events = [
        ev(S, 0.0, "old"),
        ev(P, 0.1, "old", 1),
        ev(P, 0.15, "old", 1),
        *[e for e in old_run(25)[1:] if e.step and e.step > 1],
    ]
    drive(engine, events, kill_at=2.5)
    result = verdict_of(engine, new_run(5.0, resume=20))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.step_contract is not None and result.step_contract.stride == 1


def test_a_first_incarnation_that_loaded_a_checkpoint_is_reported_as_such() -> None:
    engine = engine_for(after_checkpoint=90)
    events = [ev(S, 0.0, "old"), ev(L, 0.05, "old", 80)]
    events += [e for e in old_run(95)[1:] if e.step and e.step > 80]
    drive(engine, events, kill_at=9.55)
    result = verdict_of(engine, new_run(10.0, resume=90))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.step_contract is not None and result.step_contract.resumed_from == 80
    assert "the job resumed from step 80 when the drill started" in " ".join(result.notes)


# ------------------------------------------------------------------ 2. the trained process


def test_a_replacement_that_loads_and_dies_is_not_the_verdict() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    # A loads checkpoint 20 and dies; B finds nothing and starts over at step 1.
    events = [ev(S, 3.0, "A"), ev(L, 3.5, "A", 20), *new_run(5.0, resume=0, inc="B")]
    result = verdict_of(engine, events)
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (R.RESTARTED_FROM_SCRATCH,)
    assert result.judged_incarnation == "B"
    assert result.restarts == 2
    assert any(e.kind == "checkpoint_loaded" for e in result.timeline)  # A's life is kept


def test_progress_below_the_loaded_step_is_steps_replayed() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    # Loads checkpoint 20, says so, then counts from 1 again (counter reset / data replay).
    result = verdict_of(engine, new_run(5.0, resume=20, first=1))
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (R.STEPS_REPLAYED,)
    assert "loaded checkpoint 20, but the first step reported after it was 1" in result.summary
    assert result.loaded_step == 20
    assert result.lost_steps == 25  # steps 1..25 were done before the kill and again after


def test_a_first_step_equal_to_the_loaded_step_is_one_step_replayed() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    result = verdict_of(engine, new_run(5.0, resume=20, first=20))
    assert result.reasons == (R.STEPS_REPLAYED,)


# ------------------------------------------------------------------ 3. sound inference


def test_a_checkpoint_at_step_one_does_not_hide_a_restart_from_scratch() -> None:
    engine = DrillEngine(spec(after_checkpoint=None), T0)
    engine.discovered(T0, "found")
    drive(engine, old_run(5, every=1), kill_at=0.15)
    result = verdict_of(engine, new_run(1.0, resume=0, loaded=False))
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (R.RESTARTED_FROM_SCRATCH,)


def test_a_checkpoint_at_step_one_is_a_valid_resume_point() -> None:
    engine = DrillEngine(spec(after_checkpoint=None), T0)
    engine.discovered(T0, "found")
    drive(engine, old_run(1, every=1), kill_at=0.15)
    result = verdict_of(engine, new_run(1.0, resume=1, loaded=False))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 1


def test_an_off_by_one_resume_between_checkpoints_is_steps_replayed() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    # Stores the epoch index (19) and resumes with range(19, …): reports 20 first.
    result = verdict_of(engine, new_run(5.0, resume=19, loaded=False))
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (R.STEPS_REPLAYED,)
    assert result.resume_step == 19
    assert result.lost_steps == 6


def test_sparse_progress_infers_the_resume_step_from_the_stride() -> None:
    engine = engine_for(after_checkpoint=200)
    events = [ev(S, 0.0, "old")]
    for step in range(1, 251):
        if step % 100 == 0:
            events.append(ev(P, step / 100, "old", step))
        if step % 100 == 0:
            events.append(ev(C, step / 100 + 0.001, "old", step))
    drive(engine, events[:5], kill_at=2.01)  # kill right after checkpoint 200
    result = verdict_of(engine, new_run(5.0, resume=200, loaded=False, stride=100))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 200


def test_sparse_progress_off_the_checkpoint_grid_is_inconclusive_with_the_fix() -> None:
    engine = engine_for(after_checkpoint=150)
    events = [ev(S, 0.0, "old")]
    for step in range(1, 161):
        if step % 100 == 0:
            events.append(ev(P, step / 100, "old", step))
        if step % 50 == 0:
            events.append(ev(C, step / 100 + 0.001, "old", step))
    drive(engine, events, kill_at=1.505)
    result = verdict_of(engine, new_run(5.0, resume=150, loaded=False, first=200, stride=100))
    assert result.verdict is Verdict.ERROR and result.inconclusive
    assert "between 100 and 199" in result.summary
    assert "checkpoint_loaded" in result.summary


def test_an_unknown_stride_waits_for_the_replacements_second_line() -> None:
    # The drill attached mid-run (no start line): the first lines seen are rate-limited.
    engine = engine_for()
    events = [e for e in old_run(25, start=False) if e.kind is C or (e.step or 0) % 5 == 0]
    drive(engine, events, kill_at=2.5)
    new = new_run(5.0, resume=20, loaded=False)
    assert drive(engine, new[:2]) == []  # one progress line: 21
    assert engine.phase is Phase.VERIFYING
    [finish] = drive(engine, new[2:])  # the second line decides the step; three hold it
    assert finish.result.verdict is Verdict.PASS, finish.result.summary
    assert finish.result.resume_step == 20
    assert finish.result.recovery_time_seconds == pytest.approx(3.5)


def test_a_replacement_with_one_line_and_no_stride_is_inconclusive() -> None:
    engine = engine_for()
    drive(engine, [e for e in old_run(25, start=False) if (e.step or 0) % 5 == 0], kill_at=2.5)
    drive(engine, new_run(5.0, resume=20, loaded=False, steps=1))
    [finish] = engine.on_group_event(GroupEvent(GroupEventKind.JOB_SUCCEEDED, T0 + 7, "exit 0"))
    assert isinstance(finish, Finish)
    assert finish.result.inconclusive
    assert "stride is unknown" in finish.result.summary


# ------------------------------------------------------------------ 4. lost steps, latest


def test_a_survivors_lines_after_the_kill_are_not_lost_steps() -> None:
    engine = engine_for(max_lost_steps=3)
    drive(engine, old_run(20), kill_at=2.002)
    # The surviving rank 0 runs on for 6 steps, stamped after the kill.
    survivor = [ev(P, 2.002 + 0.018 + 0.01 * i, "old", 21 + i) for i in range(6)]
    drive(engine, survivor)
    result = verdict_of(engine, new_run(5.0, resume=20))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.last_step_before_kill == 20
    assert result.lost_steps == 0


def test_lost_steps_pass_only_when_the_upper_bound_is_within_the_limit() -> None:
    # Rate-limited progress at 100 steps/s, one line every 10 steps; the kill lands 0.08 s
    # after the last line: between 0 and 8 more steps may have completed.
    engine = engine_for(max_lost_steps=5, after_checkpoint=100)
    events = [ev(S, 0.0, "old"), ev(P, 0.01, "old", 1), ev(P, 0.02, "old", 2)]
    events += [ev(P, s / 100, "old", s) for s in range(10, 101, 10)]
    events.append(ev(C, 1.0001, "old", 100))
    drive(engine, events, kill_at=1.08)
    result = verdict_of(engine, new_run(5.0, resume=100))
    assert result.lost_steps == 0
    assert result.lost_steps_upper_bound == 8
    assert result.verdict is Verdict.ERROR and result.inconclusive
    assert "between 0 and 8" in result.summary
    assert "RECOVERYGATE_PROGRESS_INTERVAL=0" in result.summary


def test_lost_steps_fail_when_the_lower_bound_exceeds_the_limit() -> None:
    # An asynchronous save: checkpoint 100 becomes durable when training is at step 160.
    engine = engine_for(max_lost_steps=50, after_checkpoint=100)
    events = [ev(S, 0.0, "old"), *[ev(P, s / 100, "old", s) for s in range(1, 161)]]
    events.append(ev(C, 1.6001, "old", 100))
    drive(engine, events, kill_at=1.601)
    result = verdict_of(engine, new_run(5.0, resume=100))
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (R.LOST_TOO_MANY_STEPS,)
    assert result.lost_steps == 60


def test_a_survivors_checkpoint_after_the_kill_is_the_latest() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    drive(engine, [ev(P, 2.55, "old", 26), ev(C, 2.6, "old", 26)])
    result = verdict_of(engine, new_run(5.0, resume=26))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.expected_resume_step == 26


def test_an_unseen_newer_checkpoint_is_inconclusive_even_when_the_job_reached_it() -> None:
    # A survivor's silent save, or a torn file the job wrote straight to its final path
    # (an adversarial review's false PASS): no checkpoint_completed, no evidence.
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    drive(engine, [ev(P, 2.55, "old", 26), ev(P, 2.65, "old", 27)])  # its save line was lost
    result = verdict_of(engine, new_run(5.0, resume=26))
    assert result.verdict is Verdict.ERROR and result.inconclusive, result.summary
    assert "never saw completed" in result.checks[2].message
    assert "checkpoint_completed(step) for every checkpoint" in result.checks[2].message


def test_a_resume_beyond_any_step_reached_fails() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    result = verdict_of(engine, new_run(5.0, resume=300))
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,)
    assert "beyond any step the job can have reached" in result.summary


def test_an_expected_checkpoint_that_never_completed_is_named() -> None:
    engine = engine_for(after_checkpoint=20, expected_resume_step=15)
    drive(engine, old_run(25), kill_at=2.5)
    result = verdict_of(engine, new_run(5.0, resume=20))
    assert result.reasons == (R.CHECKPOINT_NEVER_COMPLETED,)
    assert "checkpoint 15 was never completed; completed: 10, 20" in result.summary


def test_a_job_that_loaded_nothing_restarted_from_scratch_not_an_older_checkpoint() -> None:
    engine = engine_for()
    events = [ev(S, 0.0, "old"), ev(C, 0.01, "old", 0), *old_run(25)[1:]]
    drive(engine, events, kill_at=2.5)
    result = verdict_of(engine, new_run(5.0, resume=0, loaded=False))
    assert result.reasons == (R.RESTARTED_FROM_SCRATCH,)


# ------------------------------------------------------------------ 5. timing, endings


def test_never_came_back_is_decided_at_the_slo_plus_the_grace() -> None:
    engine = engine_for(max_recovery_time=90.0, recovery_grace=30.0)
    drive(engine, old_run(25), kill_at=2.5)
    assert engine.deadline == pytest.approx(T0 + 2.5 + 120.0)
    assert engine.tick(T0 + 2.5 + 119.0) == []
    [finish] = engine.tick(T0 + 2.5 + 120.0)
    assert isinstance(finish, Finish)
    assert finish.result.reasons == (R.NEVER_CAME_BACK,)
    assert (
        "never came back: no new incarnation reported — within 2m00s of the kill"
        in finish.result.summary
    )


def test_timeouts_recovery_still_overrides_the_grace() -> None:
    engine = engine_for(max_recovery_time=10.0, recovery_timeout=300.0)
    drive(engine, old_run(25), kill_at=2.5)
    assert engine.deadline == pytest.approx(T0 + 302.5)


def test_it_fails_promptly_when_the_orchestrator_reports_the_job_failed() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    [finish] = engine.on_group_event(
        GroupEvent(GroupEventKind.JOB_FAILED, T0 + 3.0, "agent exited with code 1")
    )
    assert isinstance(finish, Finish)
    assert finish.result.reasons == (R.NEVER_CAME_BACK,)
    assert (
        "no new incarnation reported — the job failed (agent exited with code 1)"
        in finish.result.summary
    )


def test_it_fails_when_training_stops_after_the_resume() -> None:
    engine = engine_for(recovery_timeout=30.0)
    drive(engine, old_run(25), kill_at=2.5)
    drive(engine, [ev(S, 5.0, "new"), ev(L, 5.5, "new", 20)])
    [finish] = engine.tick(T0 + 40)
    assert isinstance(finish, Finish)
    assert finish.result.reasons == (R.STOPPED_PROGRESSING,)


@pytest.mark.parametrize(
    ("lines", "reasons", "rules", "said"),
    [
        (
            [ev(S, 5.0, "new")],
            (R.NEVER_CAME_BACK,),
            ["never_trained_resume"],
            "a new incarnation started but reported no training step",
        ),
        (
            [ev(S, 5.0, "new"), ev(L, 5.5, "new", 10)],
            (R.RESUMED_FROM_OLDER_CHECKPOINT, R.STOPPED_PROGRESSING),
            ["never_trained_resume", "never_trained_progress"],
            "loaded checkpoint 10, expected step 20",
        ),
    ],
    ids=["started-no-step", "loaded-older-no-step"],
)
def test_a_replacement_that_never_trains_fails_by_what_it_loaded(
    lines: list[TrainingEvent], reasons: tuple[R, ...], rules: list[str], said: str
) -> None:
    engine = engine_for(recovery_timeout=30.0)
    drive(engine, [*old_run(25)], kill_at=2.5)
    drive(engine, lines)
    result = engine.tick(T0 + 40)[0].result
    assert (result.reasons, [c.rule for c in result.failed_checks]) == (reasons, rules)
    assert said in result.summary


def test_a_job_that_finishes_right_after_resuming_is_inconclusive() -> None:
    engine = engine_for()
    drive(engine, old_run(20), kill_at=2.002)
    drive(engine, [ev(S, 3.0, "new"), ev(L, 3.5, "new", 20)])
    [finish] = engine.on_group_event(
        GroupEvent(GroupEventKind.JOB_SUCCEEDED, T0 + 3.6, "the torchrun agent exited with code 0")
    )
    assert isinstance(finish, Finish)
    result = finish.result
    assert result.verdict is Verdict.ERROR and result.inconclusive
    assert "the job finished right after resuming" in result.summary
    assert "lengthen the run" in result.summary


def test_a_job_that_ends_before_the_kill_is_an_error_saying_so() -> None:
    engine = engine_for(after_checkpoint=1000)
    drive(engine, old_run(25))
    [finish] = engine.on_group_event(GroupEvent(GroupEventKind.JOB_SUCCEEDED, T0 + 3, "exit 0"))
    assert isinstance(finish, Finish)
    assert (
        "the job finished at step 25 before the drill could kill anything" in finish.result.summary
    )


def test_restarts_are_counted_for_jobs_without_start_lines() -> None:
    engine = engine_for()
    drive(engine, [e for e in old_run(25) if e.kind is not S], kill_at=2.5)
    result = verdict_of(engine, [e for e in new_run(5.0, resume=20) if e.kind is not S])
    assert result.verdict is Verdict.PASS, result.summary
    assert result.restarts == 1


def test_it_counts_restarts_and_sorts_the_recovery_phases_by_time() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    engine.on_group_event(GroupEvent(GroupEventKind.WORKER_GONE, T0 + 2.7))
    engine.on_group_event(GroupEvent(GroupEventKind.RESTARTING, T0 + 5.2, restart_count=1))
    engine.on_group_event(GroupEvent(GroupEventKind.RESTARTING, T0 + 5.3, restart_count=2))
    engine.on_group_event(GroupEvent(GroupEventKind.REPLACEMENT_RUNNING, T0 + 5.4))
    result = verdict_of(engine, new_run(5.0, resume=20))
    assert result.restarts == 2
    b = result.breakdown
    assert b["failureDetected"] == pytest.approx(0.2)
    assert b["processStarted"] == pytest.approx(2.5)  # before the backend's scan saw it
    assert b["replacementScheduled"] == pytest.approx(2.5)  # so no later than the start
    assert b["replacementRunning"] == pytest.approx(2.9)
    assert b["firstReport"] == pytest.approx(3.0)
    assert b["checkpointLoaded"] == pytest.approx(3.0)
    assert b["firstStepAfterResume"] == pytest.approx(3.5)
    times = [v for v in b.values() if v is not None]
    assert times == sorted(times)


def test_the_live_status_says_what_the_replacement_is_doing() -> None:
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    assert "waiting for a replacement" in engine.status(T0 + 3)
    drive(engine, [ev(S, 3.0, "new")])
    assert engine.status(T0 + 3.4) == "replacement process started 0.4s ago; no training step yet"
    drive(engine, [ev(L, 3.5, "new", 20)])
    assert "replacement loaded checkpoint 20" in engine.status(T0 + 4.0)
    drive(engine, [ev(P, 4.0, "new", 21)])
    drive(engine, [ev(P, 4.5, "new", 22), ev(P, 5.0, "new", 23)])
    # In the sustain window it says how far the hold has come, not that it is still learning.
    status = engine.status(T0 + 5.1)
    assert status.startswith("the replacement trains: 2 step(s) over 1.0s since its step 21;")
    assert "holding the recovery for" in status


def test_a_replacement_whose_start_line_predates_the_kill_by_a_tick_is_still_new() -> None:
    # Process start times are read at a 10 ms tick: a replacement started right after the
    # kill can carry a start time a few ms before it. Its later lines decide.
    engine = engine_for()
    drive(engine, old_run(25), kill_at=2.5)
    events = [ev(S, 2.497, "new"), ev(L, 2.6, "new", 20)]
    events += [ev(P, 2.6 + s / 10, "new", 20 + s) for s in range(1, 5)]
    result = verdict_of(engine, events)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.breakdown["processStarted"] == pytest.approx(-0.003)


def test_a_late_start_line_of_an_old_process_stays_old() -> None:
    engine = engine_for(recovery_timeout=30.0)
    drive(engine, old_run(25), kill_at=2.5)
    assert drive(engine, [ev(S, 1.0, "other"), ev(P, 2.4, "other", 24)]) == []
    assert engine.phase is Phase.RECOVERING


def test_a_checkpoint_counts_as_a_completed_step_when_progress_lines_were_skipped() -> None:
    engine = engine_for(max_lost_steps=100)
    events = [ev(S, 0.0, "old"), ev(P, 0.1, "old", 1), ev(P, 0.2, "old", 2)]
    events += [ev(P, s / 10, "old", s) for s in range(3, 20) if s % 7 == 0]
    events.append(ev(C, 2.0, "old", 20))
    drive(engine, events, kill_at=2.05)
    result = verdict_of(engine, new_run(5.0, resume=20))
    assert result.last_step_before_kill == 20
    assert result.lost_steps == 0
    assert result.lost_steps_upper_bound is not None


# ---------------------------------------------------------------- the truth oracle


@dataclass
class Job:
    """A simulated job and what it truly does (the ground truth the verdict must respect)."""

    rate: float  # steps per second
    every: int  # checkpoint interval
    stride: int  # progress called every `stride` steps
    interval: float  # the reporter's rate limit (seconds between lines after the first two)
    lag: int  # an asynchronous save becomes durable this many steps later
    zero_based: bool
    trigger: int
    kill_delay: float
    survivor: float  # the old rank 0 trains on this long after the kill
    dying: int  # replacements that die before training (some after loading)
    mode: str  # latest | zero | older | reset | off_by_one | beyond
    loaded: bool  # the final replacement reports checkpoint_loaded
    new_steps: int
    restart_delay: float
    max_recovery: float
    max_lost: int | None
    expect_step: bool
    forged: int
    stalls: bool = False  # the replacement stops after its new_steps lines (rule: sustain)


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    every = draw(st.integers(1, 12))
    stride = draw(st.sampled_from([1, 1, 1, 2, 5]))
    if stride > 1:
        every = stride * draw(st.integers(1, 3))
    return Job(
        rate=draw(st.sampled_from([10.0, 50.0, 200.0])),
        every=every,
        stride=stride,
        interval=draw(st.sampled_from([0.0, 0.1])),
        lag=draw(st.sampled_from([0, 0, 0, 3])),
        zero_based=draw(st.booleans()) and draw(st.booleans()),
        trigger=draw(st.integers(1, 40)),
        kill_delay=draw(st.floats(0.0, 0.3)),
        survivor=draw(st.sampled_from([0.0, 0.0, 0.05, 0.3])),
        dying=draw(st.integers(0, 2)),
        mode=draw(
            st.sampled_from(["latest", "latest", "zero", "older", "reset", "off_by_one", "beyond"])
        ),
        loaded=draw(st.booleans()),
        new_steps=draw(st.integers(0, 4)),
        restart_delay=draw(st.floats(0.5, 20.0)),
        max_recovery=draw(st.floats(1.0, 25.0)),
        max_lost=draw(st.one_of(st.none(), st.integers(0, 60))),
        expect_step=draw(st.booleans()) and draw(st.booleans()),
        forged=draw(st.integers(0, 2)),
        stalls=draw(st.booleans()),
    )


class Reporter:
    """The reporter's printing rule: the first two progress calls, then one per interval."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.calls = 0
        self.last = -math.inf

    def prints(self, t: float) -> bool:
        self.calls += 1
        if self.calls <= 2 or t - self.last >= self.interval:
            self.last = t
            return True
        return False


def simulate(job: Job, rnd: random.Random) -> tuple[DrillResult, dict[str, object]]:
    """Run the job against the engine; return the result and the truth."""
    shift = 1 if job.zero_based else 0
    expected_step = None
    engine = DrillEngine(
        DrillSpec(
            sustain=Sustain(lines=3, seconds=0.0),
            max_recovery_time=job.max_recovery,
            after_checkpoint=job.trigger,
            max_lost_steps=job.max_lost,
            recovery_timeout=100.0,
        ),
        T0,
    )
    engine.discovered(T0, "sim")
    # The old run: steps at a constant rate, durable saves every `every` steps (+ lag).
    old: list[TrainingEvent] = [ev(S, 0.0, "old")]
    saves: list[tuple[float, int]] = []  # (durable at, step)
    rep = Reporter(job.interval)
    horizon = 400
    for step in range(1, horizon + 1):
        t = step / job.rate
        if step % job.stride == 0 and rep.prints(t):
            old.append(ev(P, t, "old", step - shift))
        if step % job.every == 0:
            saves.append(((step + job.lag) / job.rate + 1e-4, step))
    old += [ev(C, at, "old", step - shift) for at, step in saves]
    old.sort(key=lambda e: e.timestamp)
    kill: float | None = None
    finishes: list[Finish] = []
    fed = 0
    for event in old:
        if kill is not None and event.timestamp > kill + job.survivor:
            break  # the old processes are gone
        fed += 1
        for action in engine.on_training_event(event):
            if isinstance(action, KillTarget):
                kill = event.timestamp + job.kill_delay
                finishes += [
                    a
                    for a in engine.on_kill_result(KillResult(KillOutcome.KILLED, kill))
                    if isinstance(a, Finish)
                ]
    assert kill is not None, "the trigger is always reached within the horizon"
    kill_rel = kill - T0
    last_before = math.floor(kill_rel * job.rate + 1e-9)  # steps completed by the kill
    # Durable before the replacement loads: every save completed while the old run lived.
    durable = [e.step + shift for e in old[:fed] if e.kind is C and e.step is not None]
    latest = max(durable)
    if job.expect_step and not job.zero_based:
        expected_step = rnd.choice(durable)
        engine.spec = replace(engine.spec, expected_resume_step=expected_step)
    # The replacements.
    post: list[TrainingEvent] = []
    t = kill_rel + job.survivor + 0.2
    for i in range(job.dying):
        post.append(ev(S, t, f"dying{i}"))
        if i % 2 == 0:
            post.append(ev(L, t + 0.1, f"dying{i}", latest - shift))
        t += 0.3
    start = max(t, kill_rel + job.survivor + job.restart_delay - 1.0)
    older = max([0, *[s for s in durable if s < latest]])
    holds = {
        "latest": latest,
        "zero": 0,
        "older": older,
        "reset": latest,
        "off_by_one": latest,
        "beyond": latest,
    }[job.mode]  # the state it trains on
    counts_from = {
        "latest": latest,
        "zero": 0,
        "older": older,
        "reset": 0,
        "off_by_one": max(latest - 1, 0),
        "beyond": latest + 500,
    }[job.mode]
    if job.mode == "reset" and not job.loaded:
        holds = 0  # without checkpoint_loaded a reset is a restart from scratch by every count
    post.append(ev(S, start, "final"))
    # What it says it loaded: the truth, except "beyond", whose claim is its own count. (A
    # job that names a wrong checkpoint it did not load is caught only by state digests.)
    claimed: int | None = None
    if job.loaded and holds > 0:
        claimed = counts_from if job.mode == "beyond" else holds
        post.append(ev(L, start + 0.5, "final", claimed - shift))
    new_rep = Reporter(job.interval)
    first_line: float | None = None
    step, tt, made = counts_from, start + 1.0, 0
    while made < job.new_steps:
        step += 1
        tt += 1 / job.rate
        if step % job.stride == 0 and new_rep.prints(tt):
            post.append(ev(P, tt, "final", step - shift))
            made += 1
            first_line = tt if first_line is None else first_line
    if first_line is not None and not job.stalls:
        # It keeps training: enough advancing lines to hold the sustain window (3 lines).
        kept = 0
        while kept < 4:
            step += 1
            tt += 1 / job.rate
            if step % job.stride == 0 and new_rep.prints(tt):
                post.append(ev(P, tt, "final", step - shift))
                kept += 1
    for i in range(job.forged):
        post.insert(rnd.randrange(len(post) + 1), ev(P, kill_rel + 0.01 * i, f"f{i}", 9999, rank=3))
    finishes += drive(engine, post)
    if not finishes:
        finishes = [a for a in engine.tick(T0 + 10_000) if isinstance(a, Finish)]
    assert len(finishes) == 1
    want = expected_step if expected_step is not None else latest
    truth: dict[str, object] = {
        # the step it counts from once it trains; before that, the state it loaded
        "counts_from": counts_from if first_line is not None else claimed,
        "lost": max(last_before - counts_from, 0),
        "recovery": None if first_line is None else first_line - kill_rel,
        "recovered": (
            first_line is not None
            # a stall before the sustain window (its first step and 3 more) was held
            and not (job.stalls and made < 4)
            and holds == want
            and counts_from == holds
            and first_line - kill_rel <= job.max_recovery
            and (job.max_lost is None or max(last_before - counts_from, 0) <= job.max_lost)
        ),
        "decisive": (
            not job.zero_based
            and job.stride == 1
            and job.max_lost is None
            and job.new_steps >= 2
            and job.mode != "beyond"
            # an explicit older step with a newer checkpoint right after it: "resumed from
            # it" and "loaded the newer one and redid a step" look alike without
            # checkpoint_loaded, and the drill rightly says so
            and (job.loaded or not job.expect_step)
        ),
    }
    return finishes[0].result, truth


@settings(max_examples=int(os.environ.get("RECOVERYGATE_ORACLE_EXAMPLES", "500")), deadline=None)
@given(jobs(), st.randoms(use_true_random=False))
def test_the_verdict_never_contradicts_what_the_job_truly_did(job: Job, rnd: object) -> None:
    assert isinstance(rnd, random.Random)
    result, truth = simulate(job, rnd)
    why = (result.summary, job, truth)
    recovery = truth["recovery"]
    assume(recovery is None or abs(recovery - job.max_recovery) > 1e-6)  # type: ignore[operator]
    if truth["recovered"]:
        assert result.verdict in (Verdict.PASS, Verdict.ERROR), why
    else:
        assert result.verdict in (Verdict.FAIL, Verdict.ERROR), why
    if result.verdict is Verdict.ERROR:
        assert result.inconclusive, why  # never an ERROR for a drill that ran
    if job.zero_based and job.stride == 1:
        # (with progress every k > 1 steps, 0-based counting looks like a cadence that
        # starts at step 1: both are internally consistent, and the resume is judged so)
        assert result.verdict is not Verdict.PASS, why
    if truth["decisive"]:
        assert result.verdict is not Verdict.ERROR, why
    resume_check = next((c for c in result.checks if c.name == "resume_step"), None)
    decided = resume_check is not None and resume_check.passed is not None
    if (
        decided
        and not job.zero_based
        and truth["counts_from"] is not None
        and (resume_check.observed is not None)
    ):
        # With progress every k steps the first line after the resume pins the resume step
        # to a window of k steps; the figure is its start (exact for a resume on the grid).
        assert result.resume_step is not None, why
        assert result.resume_step <= truth["counts_from"] < result.resume_step + job.stride, why  # type: ignore[operator]
    on_grid = job.stride == 1 or (resume_check is not None and resume_check.passed)
    if result.lost_steps is not None and not job.zero_based and on_grid:
        assert result.lost_steps <= truth["lost"], why  # type: ignore[operator]
        if result.lost_steps_upper_bound is not None:
            assert truth["lost"] <= result.lost_steps_upper_bound, why  # type: ignore[operator]
    held = result.headline is not None and result.headline.resume_basis == "checkpoint_loaded"
    held = held and any(
        i.loaded_step is not None and i.first_step == i.loaded_step and i.new
        for i in result.incarnations
    )
    if result.recovery_time_seconds is not None and truth["recovery"] is not None:
        # A first line at the loaded step may be a line of the state held (no step) when
        # the job's lines do not show that they come after steps: the figure is then its
        # first step past the loaded one, and the truth's first step lies before it.
        if held:
            assert result.recovery_time_seconds >= truth["recovery"] - 1e-5, why  # type: ignore[operator]
        else:
            assert result.recovery_time_seconds == pytest.approx(truth["recovery"], abs=1e-5), why
