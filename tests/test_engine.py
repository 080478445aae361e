"""The drill engine, driven directly: no backend, no clock, no I/O.

We test these aspects:
- the trigger: ``step-N`` waits for a checkpoint >= N, ``next`` for one after the start;
- the resume step: from ``checkpoint_loaded`` when present, else inferred from the first
  progress of a new incarnation, under both step conventions;
- each named failure reason, with expected and observed values in its message;
- late lines of the old incarnation never count as recovery;
- deadlines: no trigger checkpoint is an ERROR, no recovery is a FAIL;
- and, with hypothesis, that for random scenarios the verdict agrees with an oracle
  written here independently of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pytest_recoverygate.engine import (
    DrillEngine,
    DrillSpec,
    FailureReason,
    Finish,
    KillTarget,
    Phase,
    Verdict,
)
from pytest_recoverygate.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEvent,
    TrainingEventKind,
)

T0 = 1_800_000_000.0
P = TrainingEventKind.PROGRESS
C = TrainingEventKind.CHECKPOINT_COMPLETED
L = TrainingEventKind.CHECKPOINT_LOADED
S = TrainingEventKind.START


def ev(kind: TrainingEventKind, t: float, inc: str, step: int | None = None,
       rank: int | None = 0) -> TrainingEvent:
    return TrainingEvent(kind, T0 + t, inc, step=step, rank=rank)


def spec(**kw: object) -> DrillSpec:
    base: dict[str, object] = {"max_recovery_time": 10.0, "after_checkpoint": 20}
    base.update(kw)
    return DrillSpec(**base)  # type: ignore[arg-type]


def old_run(until_step: int, every: int = 10, rate: float = 10.0) -> list[TrainingEvent]:
    """The first incarnation: steps 1..until_step at ``rate``/s, checkpoints every ``every``."""
    events = [ev(S, 0.0, "old")]
    for step in range(1, until_step + 1):
        events.append(ev(P, step / rate, "old", step))
        if step % every == 0:
            events.append(ev(C, step / rate + 0.001, "old", step))
    return events


def drive(engine: DrillEngine, events: list[TrainingEvent], kill_at: float | None = None,
          ) -> list[Finish]:
    """Feed events; when the engine asks for the kill, kill at ``kill_at`` (or the event time)."""
    finished: list[Finish] = []
    for event in events:
        for action in engine.on_training_event(event):
            if isinstance(action, KillTarget):
                at = T0 + kill_at if kill_at is not None else event.timestamp
                finished += [a for a in engine.on_kill_result(
                    KillResult(KillOutcome.KILLED, at)) if isinstance(a, Finish)]
            elif isinstance(action, Finish):
                finished.append(action)
    return finished


def new_run(start: float, resume: int, steps: int = 5, rate: float = 10.0, *,
            loaded: bool = True, inc: str = "new", before_convention: bool = False,
            ) -> list[TrainingEvent]:
    events = [ev(S, start, inc)]
    if loaded and resume:
        events.append(ev(L, start + 0.5, inc, resume))
    first = resume if before_convention else resume + 1
    for i in range(steps):
        events.append(ev(P, start + 1 + i / rate, inc, first + i))
    return events


def test_it_passes_when_the_job_resumes_from_the_latest_checkpoint() -> None:
    engine = DrillEngine(spec(max_lost_steps=10), T0)
    assert drive(engine, old_run(25), kill_at=2.5) == []
    assert engine.phase is Phase.RECOVERING
    [finish] = drive(engine, new_run(5.0, resume=20))
    result = finish.result
    assert result.verdict is Verdict.PASS, result.summary
    assert (result.resume_step, result.expected_resume_step) == (20, 20)
    assert result.lost_steps == 5
    assert result.recovery_time_seconds == pytest.approx(3.5)
    assert result.trigger_checkpoint == 20
    assert result.exit_code == 0


@pytest.mark.parametrize("before", [False, True], ids=["progress-after-step", "progress-before-step"])
def test_it_infers_the_resume_step_without_checkpoint_loaded(before: bool) -> None:
    engine = DrillEngine(spec(), T0)
    drive(engine, old_run(25), kill_at=2.5)
    [finish] = drive(engine, new_run(5.0, resume=20, loaded=False, before_convention=before))
    assert finish.result.verdict is Verdict.PASS
    assert finish.result.resume_step == 20


def test_it_fails_a_restart_from_scratch_with_the_reason_and_both_steps() -> None:
    engine = DrillEngine(spec(), T0)
    drive(engine, old_run(25), kill_at=2.5)
    [finish] = drive(engine, new_run(5.0, resume=0, loaded=False))
    result = finish.result
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (FailureReason.RESTARTED_FROM_SCRATCH,)
    assert "resumed from step 0, expected step 20 — the job restarted from scratch" in result.summary
    assert result.exit_code == 1


def test_it_fails_a_resume_from_an_older_checkpoint() -> None:
    engine = DrillEngine(spec(), T0)
    drive(engine, old_run(25), kill_at=2.5)
    [finish] = drive(engine, new_run(5.0, resume=10))
    assert finish.result.reasons == (FailureReason.RESUMED_FROM_OLDER_CHECKPOINT,)
    assert "expected step 20" in finish.result.summary


def test_it_fails_a_recovery_slower_than_the_slo() -> None:
    engine = DrillEngine(spec(max_recovery_time=2.0), T0)
    drive(engine, old_run(25), kill_at=2.5)
    [finish] = drive(engine, new_run(5.0, resume=20))
    assert finish.result.reasons == (FailureReason.TOO_SLOW,)
    assert "came back too slowly: 3.50s > 2.00s" in finish.result.summary


def test_it_fails_when_too_many_steps_were_lost() -> None:
    engine = DrillEngine(spec(max_lost_steps=3), T0)
    drive(engine, old_run(27), kill_at=2.8)
    [finish] = drive(engine, new_run(5.0, resume=20))
    assert finish.result.reasons == (FailureReason.LOST_TOO_MANY_STEPS,)
    assert finish.result.lost_steps == 7


def test_it_fails_when_the_job_never_comes_back() -> None:
    engine = DrillEngine(spec(recovery_timeout=30.0), T0)
    drive(engine, old_run(25), kill_at=2.5)
    assert engine.tick(T0 + 20) == []
    [finish] = engine.tick(T0 + 32.5)
    assert isinstance(finish, Finish)
    assert finish.result.reasons == (FailureReason.NEVER_CAME_BACK,)


def test_it_fails_promptly_when_the_orchestrator_reports_the_job_failed() -> None:
    engine = DrillEngine(spec(), T0)
    drive(engine, old_run(25), kill_at=2.5)
    [finish] = engine.on_group_event(
        GroupEvent(GroupEventKind.JOB_FAILED, T0 + 3.0, "agent exited with code 1"))
    assert isinstance(finish, Finish)
    assert finish.result.reasons == (FailureReason.NEVER_CAME_BACK,)
    assert "agent exited with code 1" in finish.result.summary


def test_it_fails_when_training_stops_after_the_resume() -> None:
    engine = DrillEngine(spec(recovery_timeout=30.0), T0)
    drive(engine, old_run(25), kill_at=2.5)
    drive(engine, [ev(S, 5.0, "new"), ev(L, 5.5, "new", 20), ev(P, 6.0, "new", 20)])
    assert engine.phase is Phase.VERIFYING
    [finish] = engine.tick(T0 + 40)
    assert isinstance(finish, Finish)
    assert FailureReason.STOPPED_PROGRESSING in finish.result.reasons


def test_late_lines_of_the_old_incarnation_are_not_a_recovery() -> None:
    engine = DrillEngine(spec(), T0)
    drive(engine, old_run(25), kill_at=2.5)
    # The old rank 0 reports two more steps after the kill (it has not noticed yet).
    assert drive(engine, [ev(P, 2.6, "old", 26), ev(P, 2.7, "old", 27)]) == []
    assert engine.phase is Phase.RECOVERING
    [finish] = drive(engine, new_run(5.0, resume=20))
    assert finish.result.verdict is Verdict.PASS
    assert finish.result.last_step_before_kill == 27


def test_it_ignores_lines_from_ranks_other_than_the_reporting_rank() -> None:
    engine = DrillEngine(spec(), T0)
    drive(engine, old_run(25), kill_at=2.5)
    forged = [ev(S, 3.0, "forged", rank=1), ev(P, 3.1, "forged", 1, rank=1)]
    assert drive(engine, forged) == []
    assert engine.phase is Phase.RECOVERING


def test_next_waits_for_a_checkpoint_completed_after_the_start() -> None:
    engine = DrillEngine(spec(after_checkpoint=None), T0 + 1.5)
    events = old_run(25)
    kills = []
    for event in events:
        kills += [a for a in engine.on_training_event(event) if isinstance(a, KillTarget)]
    assert [k.checkpoint_step for k in kills] == [20]


def test_a_missing_trigger_checkpoint_is_an_error_at_the_deadline() -> None:
    engine = DrillEngine(spec(after_checkpoint=1000, checkpoint_timeout=60.0), T0)
    drive(engine, old_run(25))
    [finish] = engine.tick(T0 + 61)
    assert isinstance(finish, Finish)
    assert finish.result.verdict is Verdict.ERROR
    assert "the last checkpoint seen was step 20" in finish.result.summary


@pytest.mark.parametrize(
    ("outcome", "verdict"),
    [(KillOutcome.DRY_RUN, Verdict.DRY_RUN), (KillOutcome.ALREADY_GONE, Verdict.ERROR),
     (KillOutcome.UNCONFIRMED, Verdict.ERROR)],
)
def test_a_kill_that_did_not_happen_ends_the_drill(outcome: KillOutcome, verdict: Verdict) -> None:
    engine = DrillEngine(spec(), T0)
    actions = []
    for event in old_run(25):
        actions += engine.on_training_event(event)
    assert [type(a) for a in actions] == [KillTarget]
    [finish] = engine.on_kill_result(KillResult(outcome, T0 + 2.5))
    assert isinstance(finish, Finish)
    assert finish.result.verdict is verdict


def test_it_counts_restarts_and_times_each_recovery_phase() -> None:
    engine = DrillEngine(spec(), T0)
    drive(engine, old_run(25), kill_at=2.5)
    engine.on_group_event(GroupEvent(GroupEventKind.WORKER_GONE, T0 + 2.7))
    engine.on_group_event(GroupEvent(GroupEventKind.RESTARTING, T0 + 2.8, restart_count=1))
    engine.on_group_event(GroupEvent(GroupEventKind.RESTARTING, T0 + 3.8, restart_count=2))
    engine.on_group_event(GroupEvent(GroupEventKind.REPLACEMENT_RUNNING, T0 + 4.0))
    [finish] = drive(engine, new_run(5.0, resume=20))
    result = finish.result
    assert result.restarts == 2
    assert result.breakdown["failureDetected"] == pytest.approx(0.2)
    assert result.breakdown["replacementScheduled"] == pytest.approx(0.3)
    assert result.breakdown["replacementRunning"] == pytest.approx(1.5)
    assert result.breakdown["processStarted"] == pytest.approx(2.5)
    assert result.breakdown["checkpointLoaded"] == pytest.approx(3.0)
    assert result.breakdown["firstStepAfterResume"] == pytest.approx(3.5)


# ---------------------------------------------------------------- property test


@dataclass
class Scenario:
    every: int
    trigger: int
    kill_delay_steps: int
    resume_mode: str  # latest | zero | older | arbitrary
    arbitrary_step: int
    loaded: bool
    before_convention: bool
    recovery_delay: float
    max_recovery: float
    max_lost: int | None
    failed_attempts: int
    forged: int
    new_steps: int
    expect: str  # latest | step


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    every = draw(st.integers(1, 15))
    trigger = draw(st.integers(1, 60))
    return Scenario(
        every=every,
        trigger=trigger,
        kill_delay_steps=draw(st.integers(0, 2 * every)),
        resume_mode=draw(st.sampled_from(["latest", "zero", "older", "arbitrary"])),
        arbitrary_step=draw(st.integers(0, 120)),
        loaded=draw(st.booleans()),
        before_convention=draw(st.booleans()),
        recovery_delay=draw(st.floats(0.1, 30.0)),
        max_recovery=draw(st.floats(0.5, 30.0)),
        max_lost=draw(st.one_of(st.none(), st.integers(0, 40))),
        failed_attempts=draw(st.integers(0, 2)),
        forged=draw(st.integers(0, 3)),
        new_steps=draw(st.integers(0, 4)),
        expect=draw(st.sampled_from(["latest", "step"])),
    )


def oracle(s: Scenario, old_steps: int, resume: int, first_new_step: int,
           first_new_time: float | None, kill_time: float, expected: int) -> Verdict:
    """An independent statement of DESIGN.md's PASS rule for one scenario."""
    if first_new_time is None:
        return Verdict.FAIL
    lost = max(0, old_steps - resume)
    ok = (
        resume == expected
        and first_new_time - kill_time <= s.max_recovery
        and (s.max_lost is None or lost <= s.max_lost)
    )
    return Verdict.PASS if ok else Verdict.FAIL


@settings(max_examples=400, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_the_verdict_agrees_with_an_independent_oracle(s: Scenario, rnd: object) -> None:
    import random as _random

    assert isinstance(rnd, _random.Random)
    rate = 10.0
    first_ckpt = ((s.trigger + s.every - 1) // s.every) * s.every
    old_steps = first_ckpt + s.kill_delay_steps
    checkpoints = [c for c in range(s.every, old_steps + 1, s.every)]
    kill_time = old_steps / rate + 0.05
    expected = (
        checkpoints[-1] if s.expect == "latest" else rnd.choice([0, *checkpoints])
    )
    engine = DrillEngine(
        DrillSpec(
            max_recovery_time=s.max_recovery,
            after_checkpoint=s.trigger,
            expected_resume_step=None if s.expect == "latest" else expected,
            max_lost_steps=s.max_lost,
            recovery_timeout=100.0,
        ),
        T0,
    )
    pre = [e for e in old_run(old_steps, s.every, rate) if e.timestamp - T0 < first_ckpt / rate + 1]
    post_old = [e for e in old_run(old_steps, s.every, rate) if e not in pre]
    assert drive(engine, pre, kill_at=kill_time) == []
    assert engine.phase is Phase.RECOVERING

    if s.resume_mode == "latest":
        resume = checkpoints[-1]
    elif s.resume_mode == "zero":
        resume = 0
    elif s.resume_mode == "older":
        resume = checkpoints[-2] if len(checkpoints) >= 2 else 0
    else:
        resume = s.arbitrary_step
    # Without checkpoint_loaded the engine can only infer saved steps, and only when a
    # step right after a checkpoint is not itself a checkpoint (interval >= 2; README).
    assume((s.loaded and resume > 0) or s.every >= 2)
    if not s.loaded and resume not in [0, *checkpoints]:
        resume = max([0, *[c for c in checkpoints if c <= resume]])

    post: list[TrainingEvent] = []
    t = kill_time + s.recovery_delay
    for attempt in range(s.failed_attempts):  # incarnations that die before training
        post.append(ev(S, t, f"dead{attempt}"))
        t += 0.5
    post += new_run(t, resume, steps=s.new_steps, rate=rate, loaded=s.loaded,
                    before_convention=s.before_convention)
    forged = [ev(P, kill_time + 0.01 * i, f"forged{i}", 10_000, rank=3)
              for i in range(s.forged)]
    # Old lines arrive first (they were written first, and pipes keep order), forged
    # lines of other ranks anywhere.
    stream = post_old + post
    for line in forged:
        stream.insert(rnd.randrange(len(stream) + 1), line)
    finishes = drive(engine, stream)
    progressed = [e for e in post if e.kind is P and e.step is not None and e.step > resume]
    first_time = progressed[0].timestamp if progressed else None
    if not finishes:
        [finish] = [a for a in engine.tick(T0 + 10_000) if isinstance(a, Finish)]
        finishes = [finish]
    result = finishes[0].result
    want = oracle(s, old_steps, resume, 0, first_time, T0 + kill_time, expected)
    assert result.verdict is want, (result.summary, s, resume, expected)
    if first_time is not None:
        assert result.resume_step == resume
        assert result.recovery_time_seconds == pytest.approx(first_time - T0 - kill_time, abs=1e-5)


def test_a_checkpoint_counts_as_a_completed_step_when_progress_lines_were_skipped() -> None:
    engine = DrillEngine(spec(max_lost_steps=100), T0)
    # Rate-limited progress: only every 7th step was printed, the save at 20 was not missed.
    events = [ev(S, 0.0, "old")]
    events += [ev(P, s / 10, "old", s) for s in range(1, 20) if s % 7 == 0]
    events.append(ev(C, 2.0, "old", 20))
    drive(engine, events, kill_at=2.05)
    [finish] = drive(engine, new_run(5.0, resume=10))
    result = finish.result
    assert result.last_step_before_kill == 20
    assert result.lost_steps == 10
    assert result.lost_steps_upper_bound is not None
    assert result.lost_steps_upper_bound >= result.lost_steps


def test_a_replacement_whose_start_line_predates_the_kill_by_a_tick_is_still_new() -> None:
    # Process start times are read at a 10 ms tick: a replacement started right after the
    # kill can carry a start time a few ms before it. Its later lines decide.
    engine = DrillEngine(spec(), T0)
    drive(engine, old_run(25), kill_at=2.5)
    events = [ev(S, 2.497, "new"), ev(L, 2.6, "new", 20), ev(P, 2.7, "new", 21)]
    [finish] = drive(engine, events)
    assert finish.result.verdict is Verdict.PASS, finish.result.summary
    assert finish.result.breakdown["processStarted"] == pytest.approx(-0.003)


def test_a_late_start_line_of_an_old_process_stays_old() -> None:
    engine = DrillEngine(spec(recovery_timeout=30.0), T0)
    drive(engine, old_run(25), kill_at=2.5)
    # A second old rank-0 process that only now prints (its start predates the kill and
    # its lines too): it must not count as a recovery.
    assert drive(engine, [ev(S, 1.0, "other"), ev(P, 2.4, "other", 24)]) == []
    assert engine.phase is Phase.RECOVERING
