"""The engine's fault catalogue, driven directly (no backend, no clock).

We test these aspects:
- ``delay``: a duration, a fraction of the measured checkpoint interval (which needs two
  checkpoints, and the drill waits for them), ``beforeNextCheckpoint`` (just before the
  next save is due, and a note when a checkpoint slipped in anyway), ``spread``;
- ``count: N``: a kill after each verified recovery, at the first checkpoint completed
  after it; every recovery judged; the drill stops at the first that does not pass;
- ``count: untilBudgetExhausted``: the job survives its budget and then gives up loudly;
  one that gives up early or late fails, one that hangs instead of failing fails;
- KillDuringCheckpoint: the kill lands inside the save (half the measured save time, at
  once when none was measured), aimed at the rank that reports it; resuming from the torn
  checkpoint fails; a save that completes first moves the aim to the next save;
- Preempt: a checkpoint completed in the grace period is the latest, and
  ``savedOnPreempt`` requires one;
- HangWorker: the time until the job notices is checked against ``maxDetectionTime``;
- ``stateDigestMatches``: the loaded digest against the saved one, part by part, and a
  trigger checkpoint without a digest refused before the kill.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_recoverygate.engine.machine import (
    DrillEngine,
    DrillResult,
    FailureReason,
    Finish,
    KillTarget,
    Phase,
    RestoreTarget,
    Verdict,
)
from pytest_recoverygate.engine.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEvent,
)
from pytest_recoverygate.engine.spec import MAX_KILLS, Delay, DrillSpec, Sustain
from pytest_recoverygate.engine.state import MAX_REAIMS
from pytest_recoverygate.transcript.read import read_transcript
from pytest_recoverygate.transcript.rejudge import replay
from tests.engine_events import ST, T0, C, L, P, S, ev

R = FailureReason


def combined(parts: tuple[tuple[str, str], ...]) -> str | None:
    """One digest over the parts (like reporter.state_digest's combined digest)."""
    return f"{zlib.crc32(repr(parts).encode()):016x}" if parts else None


@dataclass
class Life:
    """One incarnation of the simulated job."""

    inc: str
    start: float
    resume: int  # the state it trains from
    loaded: int | None
    events: list[TrainingEvent] = field(default_factory=list)  # in time order
    end: float = math.inf
    sent: int = 0  # how many of ``events`` the engine has been given


class SimJob:
    """A simulated job that reacts to the engine's kills (lines generated in time order).

    It trains at ``rate`` steps/s, saves every ``every`` steps (``save`` seconds from
    checkpoint_started to checkpoint_completed, training paused meanwhile), and after a kill
    restarts ``restart`` seconds later from its latest completed checkpoint (``resume``:
    ``latest``, ``zero``, ``torn``: from the save the kill cut). ``budget`` restarts, then it
    fails (``gives_up``) or hangs. Preempt: it saves its current step ``term_save`` seconds
    after SIGTERM (None: it ignores SIGTERM). HangWorker: the others notice after
    ``hang_timeout`` seconds. ``digests`` sends a digest per checkpoint (and ``bad_parts``
    loads a different optimizer).
    """

    def __init__(
        self,
        *,
        rate: float = 10.0,
        every: int = 10,
        save: float = 0.0,
        restart: float = 2.0,
        resume: str = "latest",
        budget: int = 100,
        gives_up: bool = True,
        term_save: float | None = None,
        hang_timeout: float = 3.0,  # not a wait: the simulated job's, in its own time
        digests: bool = False,
        bad_parts: bool = False,
    ) -> None:
        self.rate, self.every, self.save, self.restart = rate, every, save, restart
        self.resume, self.budget, self.gives_up = resume, budget, gives_up
        self.term_save, self.hang_timeout = term_save, hang_timeout
        self.digests, self.bad_parts = digests, bad_parts
        self.lives = [self._life(0.0, 0, None)]
        self.group: list[GroupEvent] = []
        self.kills = 0

    def _parts(self, step: int, *, loading: bool = False) -> tuple[tuple[str, str], ...]:
        optimizer = "f" * 16 if loading and self.bad_parts else f"{step:016x}"
        return (("model", f"{step + 1:016x}"), ("optimizer", optimizer))

    def _life(self, start: float, resume: int, loaded: int | None) -> Life:
        life = Life(f"inc{len(getattr(self, 'lives', []))}", start, resume, loaded)
        life.events.append(ev(S, start, life.inc))
        if loaded is not None:
            parts = self._parts(loaded, loading=True) if self.digests else ()
            digest = combined(parts)
            life.events.append(
                ev(L, start + 0.05, life.inc, loaded, digest=digest, digest_parts=parts)
            )
        t = start + 0.1
        for step in range(resume + 1, resume + 2000):
            t += 1 / self.rate
            life.events.append(ev(P, t, life.inc, step))
            if step % self.every == 0:
                life.events.append(ev(ST, t + 0.001, life.inc, step))
                parts = self._parts(step) if self.digests else ()
                digest = combined(parts)
                t += self.save
                life.events.append(
                    ev(C, t + 0.002, life.inc, step, digest=digest, digest_parts=parts)
                )
        life.events.sort(key=lambda e: e.timestamp)  # stable: lines of one instant keep order
        return life

    def lines_until(self, now: float) -> list[TrainingEvent]:
        out = []
        for life in self.lives:
            horizon = min(now, life.end)
            while life.sent < len(life.events) and life.events[life.sent].timestamp - T0 <= horizon:
                out.append(life.events[life.sent])
                life.sent += 1
        return sorted(out, key=lambda e: e.timestamp)

    def group_until(self, now: float) -> list[GroupEvent]:
        due = [g for g in self.group if g.timestamp - T0 <= now]
        self.group = [g for g in self.group if g.timestamp - T0 > now]
        return due

    def completed(self, before: float) -> list[int]:
        return [
            e.step
            for life in self.lives
            for e in life.events
            if e.kind is C and e.step is not None and e.timestamp - T0 <= min(before, life.end)
        ]

    def kill(self, target: KillTarget, at: float) -> None:
        life = self.lives[-1]
        self.kills += 1
        end = at
        if target.fault == "Preempt" and self.term_save is not None:
            step = max(
                [
                    e.step
                    for e in life.events
                    if e.kind is P and e.timestamp - T0 <= at and e.step is not None
                ],
                default=0,
            )
            life.events = [e for e in life.events if e.timestamp - T0 <= at]
            life.events.append(ev(C, at + self.term_save, life.inc, step))
            end = at + self.term_save + 0.01
        elif target.fault == "Preempt":
            end = at + target.grace_period  # it ignores SIGTERM until SIGKILL
        life.end = end
        noticed = end + (self.hang_timeout if target.fault == "HangWorker" else 0.0)
        if target.fault == "HangWorker":
            life.end = at  # stopped: it prints nothing more
        self.group.append(GroupEvent(GroupEventKind.WORKER_GONE, T0 + noticed + 0.05, "gone"))
        if self.kills > self.budget:
            if self.gives_up:
                self.group.append(
                    GroupEvent(
                        GroupEventKind.JOB_FAILED, T0 + noticed + 0.5, "max restarts exhausted"
                    )
                )
            return
        self.group.append(
            GroupEvent(GroupEventKind.RESTARTING, T0 + noticed + 0.1, restart_count=self.kills)
        )
        done = self.completed(end)
        latest = max(done, default=0)
        if self.resume == "zero":
            resume, loaded = 0, None
        elif self.resume == "torn":
            started = [
                e.step
                for e in life.events
                if e.kind is ST and e.step is not None and e.timestamp - T0 <= at
            ]
            resume = loaded = max(started, default=latest)
        else:
            resume, loaded = latest, (latest or None)
        self.lives.append(self._life(noticed + self.restart, resume, loaded))


class Drill:
    """Runs the engine against a :class:`SimJob` on a 10 ms simulated tick."""

    def __init__(self, job: SimJob | None = None, **spec: object) -> None:
        base: dict[str, object] = {"max_recovery_time": 10.0, "after_checkpoint": 20}
        base.update(spec)
        self.engine = DrillEngine(DrillSpec(**base), T0)  # type: ignore[arg-type]
        self.engine.discovered(T0, "test")
        self.job = job or SimJob()
        self.kills: list[KillTarget] = []
        self.kill_times: list[float] = []
        self.result: DrillResult | None = None
        self.stalls: list[tuple[float, float]] = []  # the drill does nothing in these

    def act(self, actions: Sequence[KillTarget | RestoreTarget | Finish], now: float) -> None:
        for action in actions:
            if isinstance(action, KillTarget):
                self.kills.append(action)
                self.kill_times.append(now)
                self.job.kill(action, now)
                self.act(self.engine.on_kill_result(KillResult(KillOutcome.KILLED, T0 + now)), now)
            else:
                self.result = action.result

    def run(self, until: float = 300.0) -> DrillResult:
        now = 0.0
        while self.result is None and now < until:
            now = round(now + 0.01, 6)
            if any(start <= now < end for start, end in self.stalls):
                continue  # starved: what the job prints meanwhile is read when it wakes
            for event in self.job.lines_until(now):
                if self.result is None:
                    self.act(self.engine.on_training_event(event), now)
            for group in self.job.group_until(now):
                if self.result is None:
                    self.act(self.engine.on_group_event(group), now)
            if self.result is None:
                self.act(self.engine.tick(T0 + now), now)
        assert self.result is not None, "the drill did not end"
        return self.result


# ------------------------------------------------------------------ delay


def test_a_duration_delay_kills_that_long_after_the_trigger() -> None:
    drill = Drill(delay=Delay("seconds", 0.55, explicit=True))
    result = drill.run()
    assert result.verdict is Verdict.PASS, result.summary
    assert drill.kill_times == [pytest.approx(2.102 + 0.55, abs=0.011)]
    assert result.recoveries[0].delay_seconds == pytest.approx(0.55, abs=0.011)


def test_a_fraction_delay_waits_for_the_interval_then_lands_inside_it() -> None:
    drill = Drill(after_checkpoint=10, delay=Delay("fraction", 0.5, explicit=True))
    result = drill.run()
    # checkpoint 10 cannot be timed (no interval yet); 20 can: 50% of 1 s after it
    assert [k.checkpoint_step for k in drill.kills] == [20]
    assert drill.kill_times[0] == pytest.approx(2.102 + 0.5, abs=0.011)
    assert result.recoveries[0].position == pytest.approx(0.5, abs=0.02)
    assert any("needs the checkpoint interval" in note for note in result.notes)


def test_before_next_checkpoint_kills_just_before_the_next_save() -> None:
    drill = Drill(after_checkpoint=20, delay=Delay("before_next"), max_lost_steps=10)
    result = drill.run()
    # interval 1 s, margin max(10 %, two steps) = 0.2 s: the kill lands 0.8 s after 20
    assert drill.kill_times[0] == pytest.approx(2.102 + 0.8, abs=0.011)
    assert drill.kill_times[0] < 3.101  # before checkpoint 30 starts
    assert result.verdict is Verdict.PASS, result.summary
    assert result.lost_steps == 8  # the worst case at this interval: 8 of 10 steps


def test_a_before_next_kill_the_save_beat_is_aimed_again_not_landed_late() -> None:
    # The drill is starved from 2.85 s to 3.2 s: the kill due at 2.9 s (just before the save
    # of checkpoint 30 at 3.1 s) would land after it, the best case instead of the worst.
    drill = Drill(after_checkpoint=20, delay=Delay("before_next"), max_lost_steps=10)
    drill.stalls.append((2.85, 3.2))
    result = drill.run()
    # aimed again from checkpoint 30 with twice the margin (0.4 s): 0.6 s after it
    assert drill.kill_times == [pytest.approx(3.102 + 0.6, abs=0.011)]
    [recovery] = result.recoveries
    assert [k.checkpoint_step for k in drill.kills] == [30]
    assert "checkpointsBeforeKill" not in recovery.fault_details
    assert result.lost_steps == 6
    assert any(
        "aiming again (re-aim 1 of 3), before the save after checkpoint 30" in n
        for n in result.notes
    )
    assert recovery.fault_details["reaims"] == 1
    assert result.verdict is Verdict.PASS, result.summary


def test_re_aims_with_slow_saves_still_land_inside_the_training_before_the_next_save() -> None:
    # Saves take 1 s of a 2 s interval (an adversarial try): a margin capped at half the
    # interval would be all the training, and the third re-aim would kill right after
    # checkpoint 50. Capped at half the training (0.5 s), it lands 0.5 s after it.
    drill = Drill(SimJob(save=1.0), after_checkpoint=20, delay=Delay("before_next"))
    drill.stalls += [(4.85, 6.2), (6.65, 8.2), (8.25, 10.2)]
    result = drill.run()
    [recovery] = result.recoveries
    assert recovery.fault_details["reaims"] == MAX_REAIMS
    assert [k.checkpoint_step for k in drill.kills] == [50]
    assert drill.kill_times == [pytest.approx(10.102 + 0.5, abs=0.011)]
    assert result.verdict is Verdict.PASS, result.summary


def test_a_checkpoint_read_after_the_kill_was_sent_leaves_the_kill_armed() -> None:
    # Saves take 9 s of a 10 s interval: the margin (10 %, 1 s) is the whole second of
    # training, so the kill is sent inside the handler of checkpoint 20.
    # Checkpoint 30's line is read before the kill's result (one batch of lines): the kill
    # already sent is not aimed again, and its result finds it armed.
    job = SimJob(save=9.0)
    engine = DrillEngine(
        DrillSpec(after_checkpoint=20, delay=Delay("before_next"), max_recovery_time=60.0), T0
    )
    engine.discovered(T0, "test")
    sent: list[KillTarget] = []
    for event in job.lives[0].events:
        actions = engine.on_training_event(event)
        sent += [a for a in actions if isinstance(a, KillTarget)]
        if sent and event.kind is C and event.step == 30:
            break
    assert [k.checkpoint_step for k in sent] == [20]
    engine.on_kill_result(KillResult(KillOutcome.KILLED, T0 + 25.0))  # no AssertionError
    assert not any("aiming again" in e.detail for e in engine.timeline_entries())


def test_a_before_next_kill_is_aimed_again_at_most_max_reaims_times() -> None:
    drill = Drill(after_checkpoint=20, delay=Delay("before_next"), max_lost_steps=20)
    # Starved across each aim (2.9 s; then 0.6 s after checkpoint 30; then half the interval,
    # the most margin there is, after 40 and 50): the last aim lands late, where it was
    # aimed, and the report names the checkpoint it missed.
    drill.stalls += [(2.85, 3.2), (3.65, 4.2), (4.25, 5.2), (5.25, 6.2)]
    result = drill.run()
    [recovery] = result.recoveries
    assert [k.checkpoint_step for k in drill.kills] == [20 + 10 * MAX_REAIMS]
    assert recovery.fault_details["checkpointsBeforeKill"] == [30 + 10 * MAX_REAIMS]
    assert sum("aiming again" in n for n in result.notes) == MAX_REAIMS
    assert result.verdict is Verdict.PASS, result.summary


def test_a_delay_past_the_checkpoint_timeout_still_kills_once_the_trigger_was_reached() -> None:
    # timeouts.checkpoint bounds the wait for the trigger checkpoint (reached at 2.1 s), not
    # the delay after it: the kill lands at 2.1 + 5 s, no "timed out waiting" ERROR at 3 s.
    drill = Drill(delay=Delay("seconds", 5.0, explicit=True), checkpoint_timeout=3.0)
    result = drill.run()
    assert drill.kill_times == [pytest.approx(2.102 + 5.0, abs=0.011)]
    assert result.verdict is Verdict.PASS, result.summary


def test_a_job_that_ends_during_the_delay_is_told_the_delay_not_the_trigger() -> None:
    # The trigger (checkpoint 20, at 2.1 s) was reached; the job finished at 30 s, long
    # before the 500 s delay ended: the fix is the delay, not an earlier afterCheckpoint.
    job = SimJob()
    job.lives[0].events = [e for e in job.lives[0].events if e.timestamp - T0 <= 30.0]
    job.group.append(GroupEvent(GroupEventKind.JOB_SUCCEEDED, T0 + 30.1, "done"))
    drill = Drill(job, delay=Delay("seconds", 500.0, explicit=True))
    result = drill.run(until=40.0)
    assert result.verdict is Verdict.ERROR and drill.kills == []
    assert "(checkpoint 20 triggered the kill, due 7m52s later)" in result.summary
    assert result.summary.endswith("shorten injectFailure.delay or lengthen the run")


def test_a_checkpoint_slipping_in_before_a_late_kill_is_named() -> None:
    drill = Drill(after_checkpoint=20, delay=Delay("seconds", 1.5, explicit=True))
    result = drill.run()
    [recovery] = result.recoveries
    assert recovery.fault_details["checkpointsBeforeKill"] == [30]
    assert recovery.expected_resume_step == 30
    assert result.verdict is Verdict.PASS, result.summary


# ------------------------------------------------------------------ count


def test_count_kills_again_after_each_verified_recovery_and_judges_each() -> None:
    drill = Drill(count=3)
    result = drill.run()
    assert result.verdict is Verdict.PASS, result.summary
    assert [k.index for k in drill.kills] == [1, 2, 3]
    steps = [k.checkpoint_step for k in drill.kills]
    assert steps[0] == 20 and steps[1] > 20 and steps[2] > steps[1]
    assert [r.resume_step for r in result.recoveries] == steps
    assert all(r.verdict is Verdict.PASS for r in result.recoveries)
    assert "all 3 recoveries passed" in result.summary
    # each later kill waits for a checkpoint completed after the previous recovery
    for before, after in zip(result.recoveries, result.recoveries[1:], strict=False):
        assert before.kill_time is not None and after.kill_time is not None
        assert after.kill_time > before.kill_time + (before.recovery_time_seconds or 0)


def test_count_stops_at_the_first_recovery_that_fails() -> None:
    job = SimJob()
    drill = Drill(job, count=3)
    original = job.kill

    def kill(target: KillTarget, at: float) -> None:
        job.resume = "zero" if target.index == 2 else "latest"
        original(target, at)

    job.kill = kill  # type: ignore[method-assign]
    result = drill.run()
    assert result.verdict is Verdict.FAIL
    assert [r.verdict for r in result.recoveries] == [Verdict.PASS, Verdict.FAIL]
    assert result.reasons[0] is R.RESTARTED_FROM_SCRATCH
    assert result.summary.startswith("kill 2 of 2: resumed from step 0")
    assert len(drill.kills) == 2


def test_spread_places_the_kills_evenly_through_the_interval() -> None:
    drill = Drill(count=4, after_checkpoint=20, delay=Delay("spread"))
    result = drill.run()
    assert result.verdict is Verdict.PASS, result.summary
    positions = [r.position for r in result.recoveries]
    assert positions == pytest.approx([0.0, 0.25, 0.5, 0.75], abs=0.02)
    lost = [r.lost_steps for r in result.recoveries]
    assert lost == [0, 2, 5, 7]  # the job's own steps at those points of a 10-step interval


# ------------------------------------------------------------------ until budget exhausted


def test_until_budget_exhausted_passes_a_job_that_survives_its_budget_then_gives_up() -> None:
    drill = Drill(SimJob(budget=2), count=None, restart_budget=2)
    result = drill.run()
    assert result.verdict is Verdict.PASS, result.summary
    assert len(drill.kills) == 3
    assert "survived 2 kill(s) and gave up loudly on kill 3" in result.summary
    assert any(c.name == "restart_budget" and c.passed for c in result.checks)


def test_a_job_that_gives_up_before_its_budget_fails() -> None:
    drill = Drill(SimJob(budget=1), count=None, restart_budget=2)
    result = drill.run()
    assert result.verdict is Verdict.FAIL
    assert R.RESTART_BUDGET_MISMATCH in result.reasons
    assert "survived 1 kill(s), but restartBudget is 2" in result.summary


def test_a_job_that_survives_more_than_its_budget_fails() -> None:
    drill = Drill(SimJob(budget=5), count=None, restart_budget=2)
    result = drill.run()
    assert result.verdict is Verdict.FAIL
    assert R.RESTART_BUDGET_MISMATCH in result.reasons
    assert len(drill.kills) == 3  # it stops at the kill that should have been the last


def test_a_job_that_never_gives_up_without_a_restart_budget_is_inconclusive() -> None:
    drill = Drill(SimJob(budget=1000), count=None)
    result = drill.run(until=3000.0)
    assert result.verdict is Verdict.ERROR and result.inconclusive, result.summary
    assert f"the job survived {MAX_KILLS} kills without giving up" in result.summary
    assert "set expectations.restartBudget" in result.summary
    assert len(drill.kills) == MAX_KILLS


def test_a_fast_job_that_never_gives_up_is_inconclusive_at_the_last_kill() -> None:
    # The same on a job that saves every 2 steps of 10 ms and restarts in 0.1 s, held one
    # line: its 50 recoveries take seconds, not minutes (the rule's fixture is its transcript)
    job = SimJob(rate=100.0, every=2, restart=0.1, budget=1000)
    drill = Drill(job, count=None, sustain=Sustain(lines=1, seconds=0.0))
    result = drill.run(until=300.0)
    assert result.verdict is Verdict.ERROR and result.inconclusive, result.summary
    assert f"the job survived {MAX_KILLS} kills without giving up" in result.summary
    assert len(drill.kills) == MAX_KILLS


def test_a_job_that_hangs_instead_of_giving_up_fails() -> None:
    drill = Drill(SimJob(budget=2, gives_up=False), count=None, restart_budget=2)
    result = drill.run()
    assert result.verdict is Verdict.FAIL
    assert R.HUNG_INSTEAD_OF_FAILING in result.reasons
    assert "neither came back nor failed" in result.summary


# ------------------------------------------------------------------ KillDuringCheckpoint


def test_kill_during_checkpoint_lands_inside_the_save_aimed_at_the_saving_rank() -> None:
    drill = Drill(SimJob(save=0.4), fault="KillDuringCheckpoint", target_rank=None)
    result = drill.run()
    [kill] = drill.kills
    assert kill.checkpoint_step == 20 and kill.rank == 0 and kill.fault == "KillDuringCheckpoint"
    details = result.recoveries[0].fault_details
    assert details["intoSaveSeconds"] == pytest.approx(0.2, abs=0.011)  # half of 0.4 s
    assert details["saveSeconds"] == pytest.approx(0.4, abs=0.01)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 10  # the last completed checkpoint, not the torn 20


def test_resuming_from_a_save_the_kill_cut_is_undecided_and_names_the_fix() -> None:
    # Torn on disk, or complete and reported late: the lines are the same, so no FAIL
    # (and no PASS). Found on real HF and Lightning jobs whose callbacks report after a
    # barrier / at the next hook: a complete checkpoint loaded and a false FAIL.
    drill = Drill(SimJob(save=0.4, resume="torn"), fault="KillDuringCheckpoint", target_rank=None)
    result = drill.run()
    assert result.verdict is Verdict.ERROR and result.inconclusive, result.summary
    assert result.reasons == (R.INCONCLUSIVE,)
    assert result.resume_step == 20
    assert "before the kill and was cut and never completed" in result.summary
    assert "checkpoint_completed(step) as soon as the checkpoint is durable" in result.summary


def test_a_cut_save_never_turns_a_resume_from_an_older_checkpoint_into_inconclusive() -> None:
    # An adversarial review's case: the save of 10 announced and never completed, 20 and 30
    # durable, the replacement loads 10. Older than the latest: FAIL, torn or not.
    engine = DrillEngine(DrillSpec(max_recovery_time=10.0, after_checkpoint=30), T0)
    engine.discovered(T0, "test")
    events = [ev(S, 0.0, "old")]
    for step in range(1, 36):
        events.append(ev(P, step * 0.1, "old", step))
        if step == 10:
            events.append(ev(ST, step * 0.1 + 0.001, "old", step))
        elif step in (20, 30):
            events.append(ev(ST, step * 0.1 + 0.001, "old", step))
            events.append(ev(C, step * 0.1 + 0.002, "old", step))
    actions = [a for e in events for a in engine.on_training_event(e)]
    assert any(isinstance(a, KillTarget) for a in actions)
    engine.on_kill_result(KillResult(KillOutcome.KILLED, T0 + 3.55))
    result = None
    for e in [ev(S, 5.0, "new"), ev(L, 5.1, "new", 10)] + [
        ev(P, 5.2 + i * 0.1, "new", 10 + i) for i in range(1, 6)
    ]:
        for action in engine.on_training_event(e):
            if isinstance(action, Finish):
                result = action.result
    result = result or next(a.result for a in engine.tick(T0 + 60.0) if isinstance(a, Finish))
    assert result.verdict is Verdict.FAIL, result.summary
    # 10 was never completed, so it is not "the older checkpoint" but an unexpected one
    assert result.reasons == (R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,), result.summary
    assert "expected step 30" in result.summary


def test_a_cut_save_of_step_zero_never_hides_a_restart_from_scratch() -> None:
    engine = DrillEngine(DrillSpec(max_recovery_time=10.0, after_checkpoint=20), T0)
    engine.discovered(T0, "test")
    events = [ev(S, 0.0, "old"), ev(ST, 0.05, "old", 0)]  # a save of step 0, never completed
    for step in range(1, 26):
        events.append(ev(P, step * 0.1, "old", step))
        if step in (10, 20):
            events.append(ev(C, step * 0.1 + 0.002, "old", step))
    assert any(isinstance(a, KillTarget) for e in events for a in engine.on_training_event(e))
    engine.on_kill_result(KillResult(KillOutcome.KILLED, T0 + 2.55))
    finished = [
        a.result
        for e in [ev(S, 5.0, "new"), *[ev(P, 5.1 + i * 0.1, "new", i) for i in range(1, 6)]]
        for a in engine.on_training_event(e)
        if isinstance(a, Finish)
    ]
    result = (
        finished[0]
        if finished
        else next(a.result for a in engine.tick(T0 + 60.0) if isinstance(a, Finish))
    )
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons == (R.RESTARTED_FROM_SCRATCH,), result.summary


def test_the_first_save_is_hit_at_once_when_no_save_time_was_measured() -> None:
    drill = Drill(
        SimJob(save=0.4), fault="KillDuringCheckpoint", target_rank=None, after_checkpoint=10
    )
    result = drill.run()
    assert result.recoveries[0].fault_details["intoSaveSeconds"] == pytest.approx(0.0, abs=0.011)


def test_a_save_that_completes_before_the_kill_moves_the_aim_to_the_next_save() -> None:
    drill = Drill(
        SimJob(save=0.3),
        fault="KillDuringCheckpoint",
        target_rank=None,
        delay=Delay("seconds", 0.5, explicit=True),
    )
    result = drill.run()
    # 0.5 s into a 0.3 s save is always too late: the next save is hit a quarter into it
    assert [k.checkpoint_step for k in drill.kills] == [30]
    into = result.recoveries[0].fault_details["intoSaveSeconds"]
    assert into == pytest.approx(0.075, abs=0.011)
    assert any("aiming at the next save, a quarter into it" in note for note in result.notes)


class LateKill(Drill):
    """The kill lands ``lag`` seconds after the engine asked (a slow kill step)."""

    lag = 0.3

    def act(self, actions: Sequence[KillTarget | RestoreTarget | Finish], now: float) -> None:
        for action in actions:
            if isinstance(action, KillTarget):
                self.kills.append(action)
                landed = now + self.lag
                self.job.kill(action, landed)
                result = KillResult(KillOutcome.KILLED, T0 + landed)
                self.act(self.engine.on_kill_result(result), now)
            else:
                self.result = action.result


def test_a_save_that_completed_just_before_a_late_kill_is_not_reported_torn() -> None:
    # Aimed 0.2 s into a 0.4 s save, landed 0.5 s in: the completion line arrives after
    # the kill was sent, stamped before it landed. Nothing was torn.
    drill = LateKill(SimJob(save=0.4), fault="KillDuringCheckpoint", target_rank=None)
    result = drill.run()
    details = result.recoveries[0].fault_details
    assert "tornStep" not in details and "intoSaveSeconds" not in details
    assert details["completedBeforeKillSeconds"] == pytest.approx(0.1, abs=0.011)
    assert any("nothing was torn" in note for note in result.notes)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 20  # the save completed: it is the latest checkpoint


class ShardedJob(SimJob):
    """A SimJob whose rank 1 saves a shard too: it reports each save's start after rank 0."""

    def _life(self, start: float, resume: int, loaded: int | None) -> Life:
        life = super()._life(start, resume, loaded)
        shards = [
            ev(ST, e.timestamp - T0 + 0.0005, f"{life.inc}-rank1", e.step, rank=1)
            for e in life.events
            if e.kind is ST
        ]
        life.events = sorted(life.events + shards, key=lambda e: e.timestamp)
        return life


def test_a_target_rank_that_reports_its_own_saves_is_not_said_to_save_nothing() -> None:
    # Ray: every rank reports its shard's save; rank 0's line comes first and triggers.
    drill = Drill(ShardedJob(save=0.4), fault="KillDuringCheckpoint", target_rank=1)
    result = drill.run()
    assert drill.kills[0].rank == 1
    assert not any("does not report the save" in note for note in result.notes), result.notes
    assert result.verdict is Verdict.PASS, result.summary


def test_a_user_picked_rank_that_does_not_save_is_named() -> None:
    drill = Drill(SimJob(save=0.4), fault="KillDuringCheckpoint", target_rank=1)
    result = drill.run()
    assert drill.kills[0].rank == 1
    assert any("rank 1 does not report the save" in note for note in result.notes)


# ------------------------------------------------------------------ Preempt


def test_a_checkpoint_saved_in_the_grace_period_is_the_latest_and_used() -> None:
    drill = Drill(SimJob(term_save=0.4), fault="Preempt", grace_period=5.0, saved_on_preempt=True)
    result = drill.run()
    assert result.verdict is Verdict.PASS, result.summary
    details = result.recoveries[0].fault_details
    assert details["savedStep"] == 20
    assert details["savedAfterSeconds"] == pytest.approx(0.4, abs=0.011)
    assert details["savedUsed"] is True
    assert any("after SIGTERM; the resume used it" in c.message for c in result.checks)


def test_saved_on_preempt_fails_a_job_that_ignores_sigterm() -> None:
    # it trains on through a 0.5 s grace period that holds no regular checkpoint
    drill = Drill(SimJob(term_save=None), fault="Preempt", grace_period=0.5, saved_on_preempt=True)
    result = drill.run()
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (R.NOT_SAVED_ON_PREEMPT,)


def test_a_save_in_flight_at_the_sigterm_is_not_saved_on_preempt() -> None:
    # Saves take 1 s (Ray registers a checkpoint 1-2 s after its report): the kill lands
    # 1.5 s after checkpoint 20, inside the save of 30 that began before it; checkpoint 30
    # completes in the grace period, but the job ignored the SIGTERM.
    job = SimJob(term_save=None, save=1.0)
    drill = Drill(
        job,
        fault="Preempt",
        grace_period=1.5,  # it trains on, ignoring SIGTERM: no save of its own in it
        saved_on_preempt=True,
        delay=Delay("seconds", 1.5),
    )
    result = drill.run()
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons == (R.NOT_SAVED_ON_PREEMPT,)
    assert "savedStep" not in result.recoveries[0].fault_details
    assert any(
        "checkpoint 30 completed after SIGTERM, but its save began" in note for note in result.notes
    ), result.notes


KEPT_PREEMPT = Path(__file__).resolve().parent / "data" / "ci-k8s-preempt"


def test_the_save_on_preempt_is_the_newest_in_the_grace_period() -> None:
    # Kept by CI on the real cluster (tests/data/ci-k8s-preempt/README.md): a periodic
    # save completed 9 ms after the DELETE, before the kubelet's SIGTERM reached the job;
    # the job's own save on SIGTERM followed, and the resume used it.
    transcript = read_transcript(KEPT_PREEMPT / "transcript.jsonl")
    recorded = json.loads((KEPT_PREEMPT / "report.json").read_text())
    assert recorded["recoveries"][0]["faultDetails"]["savedStep"] == 280
    result, _ = replay(transcript)
    assert result.verdict is Verdict.PASS, result.summary
    details = result.recoveries[0].fault_details
    assert details["savedStep"] == 281 and details["savedUsed"] is True, details
    assert result.recoveries[0].resume_step == 281


# ------------------------------------------------------------------ HangWorker


def test_a_hang_noticed_in_time_passes_with_the_detection_in_the_breakdown() -> None:
    drill = Drill(
        SimJob(hang_timeout=3.0), fault="HangWorker", max_detection_time=5.0, max_recovery_time=20.0
    )
    result = drill.run()
    assert result.verdict is Verdict.PASS, result.summary
    detection = result.recoveries[0].fault_details["detectionSeconds"]
    assert detection == pytest.approx(3.05, abs=0.02)
    assert result.breakdown["failureDetected"] == pytest.approx(detection)


def test_a_hang_noticed_too_late_fails() -> None:
    drill = Drill(
        SimJob(hang_timeout=4.0), fault="HangWorker", max_detection_time=2.0, max_recovery_time=20.0
    )
    result = drill.run()
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (R.HANG_NOT_DETECTED,)


def test_a_hang_never_noticed_fails_at_the_deadline_naming_the_timeout_default() -> None:
    drill = Drill(
        SimJob(hang_timeout=1800.0),
        fault="HangWorker",
        max_detection_time=2.0,
        max_recovery_time=20.0,
    )
    result = drill.run(until=200.0)
    assert result.verdict is Verdict.FAIL
    assert R.HANG_NOT_DETECTED in result.reasons
    assert "30-minute default" in result.summary


# ------------------------------------------------------------------ state digests


def test_a_matching_digest_passes() -> None:
    result = Drill(SimJob(digests=True), state_digest_matches=True).run()
    assert result.verdict is Verdict.PASS, result.summary
    assert any(c.name == "state_digest" and c.passed for c in result.checks)


def test_a_differing_part_is_named() -> None:
    result = Drill(SimJob(digests=True, bad_parts=True), state_digest_matches=True).run()
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (R.STATE_DIFFERS,)
    assert (
        "loaded checkpoint 20 but the state differs from the one saved at step 20: "
        "optimizer state differs" in result.summary
    )


def test_state_digest_matches_without_digests_is_refused_before_the_kill() -> None:
    drill = Drill(SimJob(digests=False), state_digest_matches=True)
    result = drill.run()
    assert drill.kills == []
    assert result.verdict is Verdict.ERROR
    assert "carried no digest" in result.summary and "nothing was killed" in result.summary
    assert drill.engine.phase is Phase.DONE
