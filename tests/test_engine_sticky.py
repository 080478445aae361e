"""StickyFault (``scope: step``) in the engine, driven directly (no backend, no clock).

We test these aspects:
- at the trigger the engine asks for the fault once; the backend's answer (the poison
  armed) moves it to the faulted phase, where nothing more is killed;
- each incarnation of the target rank that dies at the poisoned step (its reporter's
  ``poisoned`` line) is one death, counted once per incarnation, on either rank;
- a job that stops retrying within ``maxCrashLoop`` passes: it gives up with a non-zero
  exit, or trains past the step; more deaths fail ``CRASH_LOOP`` as soon as proven, with
  the deaths, restarts and time burned in the message and ``faultDetails``;
- a poison never reached, or a job that neither dies again, gives up nor trains on, is
  inconclusive (ERROR) with what would decide it; a finished job after deaths too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_recoverygate.engine.machine import (
    DrillEngine,
    DrillResult,
    FailureReason,
    Finish,
    KillTarget,
    Phase,
    Verdict,
)
from pytest_recoverygate.engine.model import (
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEventKind,
)
from pytest_recoverygate.engine.spec import DrillSpec, StickySpec, Sustain
from tests.engine_events import T0, C, G, L, P, S, X, ev, group_ev

R = FailureReason
AT = 30  # the poisoned step


def spec(
    target_rank: int = 1, max_crash_loop: int = 3, sticky_gpus: int | None = None, **kw: object
) -> DrillSpec:
    return DrillSpec(
        max_recovery_time=30.0,
        after_checkpoint=20,
        fault="StickyFault",
        target_rank=target_rank,
        sticky=StickySpec("step", at_step=AT, max_crash_loop=max_crash_loop, gpus=sticky_gpus),
        recovery_timeout=60.0,
        checkpoint_timeout=float(kw.pop("checkpoint_timeout", 600.0)),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


@dataclass
class Drill:
    engine: DrillEngine
    target: int
    kills: list[KillTarget] = field(default_factory=list)
    result: DrillResult | None = None
    incarnation: int = 0

    @classmethod
    def start(cls, s: DrillSpec) -> Drill:
        engine = DrillEngine(s, T0)
        engine.discovered(T0, "job", ranks=(0, 1))
        assert s.target_rank is not None
        return cls(engine, s.target_rank)

    def answer(self, actions: list[object], t: float) -> None:
        for action in actions:
            if isinstance(action, Finish):
                self.result = action.result
            elif isinstance(action, KillTarget):
                self.kills.append(action)
                armed = KillResult(KillOutcome.KILLED, T0 + t, "step 30 is poisoned")
                self.answer(list(self.engine.on_kill_result(armed)), t)

    def line(self, kind: TrainingEventKind, t: float, inc: str, step: int | None = None,
             rank: int = 0, restart: int | None = None) -> Drill:  # fmt: skip
        if self.result is None:
            event = ev(kind, t, inc, step, rank, restart_count=restart)
            self.answer(list(self.engine.on_training_event(event)), t)
        return self

    def group(self, kind: GroupEventKind, t: float) -> Drill:
        if self.result is None:
            self.answer(list(self.engine.on_group_event(group_ev(kind, t))), t)
        return self

    def incarnation_runs(
        self, t: float, first: int, last: int, *, dies: bool, restart: int | None = None
    ) -> float:
        """Both ranks start (their launcher's ``restart`` count in the start line) and
        train ``first..last``; the target dies at ``AT`` if told."""
        n = self.incarnation = self.incarnation + 1
        for rank in (0, 1):
            self.line(S, t, f"r{rank}-{n}", rank=rank, restart=restart)
        if first > 1:
            for rank in (0, 1):
                self.line(L, t + 0.05, f"r{rank}-{n}", first - 1, rank=rank)
        t += 0.1
        for step in range(first, last + 1):
            for rank in (0, 1):
                if dies and step == AT and rank == self.target:
                    self.line(X, t, f"r{rank}-{n}", step, rank=rank)
                    return t + 0.1
                self.line(P, t, f"r{rank}-{n}", step, rank=rank)
            if step % 10 == 0:
                self.line(C, t + 0.01, f"r0-{n}", step, rank=0)
            t += 0.1
        return t

    def until(self, t_end: float, t: float) -> Drill:
        while t <= t_end and self.result is None:
            self.answer(list(self.engine.tick(T0 + t)), t)
            t += 0.5
        return self

    def checks(self) -> dict[str, object]:
        assert self.result is not None
        return {c.name: c for c in self.result.checks}

    def details(self) -> dict[str, object]:
        assert self.result is not None
        (recovery,) = self.result.recoveries
        sticky = recovery.fault_details["sticky"]
        assert isinstance(sticky, dict)
        return sticky


def armed_then_dies(d: Drill, deaths: int) -> float:
    """The job trains past the trigger (step 20), then ``deaths`` incarnations die at AT,
    each restart resuming from step 20."""
    t = d.incarnation_runs(0.0, 1, 40, dies=True)
    assert len(d.kills) == 1 and d.engine.phase is Phase.FAULTED
    for _ in range(deaths - 1):
        d.group(G.RESTARTING, t)
        t = d.incarnation_runs(t + 1.0, 21, 40, dies=True)
    return t


def test_the_poison_is_armed_once_and_nothing_is_killed_while_it_is() -> None:
    d = Drill.start(spec())
    t = armed_then_dies(d, 2)
    assert [k.fault for k in d.kills] == ["StickyFault"]
    assert d.result is None
    assert "2 death(s)" in d.engine.status(T0 + t)


def test_a_job_that_gives_up_within_its_budget_passes() -> None:
    d = Drill.start(spec())
    t = armed_then_dies(d, 3)
    d.group(G.JOB_FAILED, t + 0.5)
    assert d.result is not None
    assert d.result.verdict is Verdict.PASS, d.result.summary
    checks = d.checks()
    assert checks["fault_hit"].passed is True  # type: ignore[attr-defined]
    assert "3 death(s) at step 30 the job gave up loudly" in d.result.summary
    details = d.details()
    assert details["deaths"] == 3 and details["restarts"] == 2
    assert details["stepPast"] is None


def test_restarts_are_read_from_the_start_lines_when_the_backend_reports_none() -> None:
    """Slurm's torchrun restarts its workers inside the step, which its backend follows
    only after a kill of its own: the launcher's TORCHELASTIC_RESTART_COUNT in each
    process's start line counts the restarts instead."""
    d = Drill.start(spec())
    t = d.incarnation_runs(0.0, 1, 40, dies=True, restart=0)
    for restart in (1, 2):  # no RESTARTING group event
        t = d.incarnation_runs(t + 1.0, 21, 40, dies=True, restart=restart)
    d.group(G.JOB_FAILED, t + 0.5)
    assert d.result is not None
    assert d.result.verdict is Verdict.PASS, d.result.summary
    assert d.details()["deaths"] == 3 and d.details()["restarts"] == 2
    assert d.result.recoveries[0].restarts == 2


def test_more_deaths_than_max_crash_loop_fail_when_proven() -> None:
    d = Drill.start(spec(max_crash_loop=2))
    t = armed_then_dies(d, 3)  # the third death proves it: no end of the job is awaited
    assert d.result is not None and d.result.verdict is Verdict.FAIL
    assert [c.reason for c in d.result.failed_checks] == [R.CRASH_LOOP]
    assert "crash-loops on step 30: 3 incarnations died there, 2 restart(s)" in d.result.summary
    assert d.result.recoveries[0].fault_details["sticky"]["deaths"] == 3
    assert t < 10.0


def test_a_death_counts_once_per_incarnation() -> None:
    d = Drill.start(spec(max_crash_loop=1))
    t = d.incarnation_runs(0.0, 1, 40, dies=True)
    d.line(X, t, "r1-1", AT, rank=1)  # the same process's line again
    assert d.result is None
    d.group(G.JOB_FAILED, t + 0.5)
    assert d.result is not None and d.result.verdict is Verdict.PASS


def test_the_poison_works_on_the_reporting_rank_too() -> None:
    d = Drill.start(spec(target_rank=0, max_crash_loop=1))
    t = armed_then_dies(d, 2)
    assert d.result is not None, d.engine.status(T0 + t)
    assert [c.reason for c in d.result.failed_checks] == [R.CRASH_LOOP]
    assert t > 0


def test_a_job_that_steps_past_the_poison_passes() -> None:
    d = Drill.start(spec())
    t = armed_then_dies(d, 1)
    d.group(G.RESTARTING, t)
    d.incarnation_runs(t + 1.0, 21, 35, dies=False)  # e.g. it skipped the bad batch
    assert d.result is not None
    assert d.result.verdict is Verdict.PASS, d.result.summary
    assert "went on past it (step 31)" in d.result.summary
    assert d.details()["stepPast"] == 31


def test_a_poison_never_reached_is_inconclusive() -> None:
    d = Drill.start(spec())
    t = d.incarnation_runs(0.0, 1, 25, dies=True)  # the run ends before step 30
    d.group(G.JOB_SUCCEEDED, t)
    assert d.result is not None and d.result.verdict is Verdict.ERROR
    assert "no incarnation of rank 1 reached step 30" in d.result.summary
    assert "reporter.progress" in d.result.summary


def test_no_death_by_the_checkpoint_timeout_is_inconclusive() -> None:
    d = Drill.start(spec(checkpoint_timeout=20.0))
    t = d.incarnation_runs(0.0, 1, 25, dies=True)
    d.until(60.0, t)
    assert d.result is not None and d.result.verdict is Verdict.ERROR
    assert "reached step 30" in d.result.summary


def test_a_job_silent_after_a_death_is_inconclusive_at_the_deadline() -> None:
    d = Drill.start(spec())
    t = armed_then_dies(d, 1)  # then nothing: no restart, no failure, no step
    d.until(t + 120.0, t)
    assert d.result is not None and d.result.verdict is Verdict.ERROR
    assert "neither died again, gave up nor trained past the step" in d.result.summary


def test_a_job_that_finishes_after_a_death_is_inconclusive() -> None:
    d = Drill.start(spec())
    t = armed_then_dies(d, 1)
    d.group(G.JOB_SUCCEEDED, t + 0.5)
    assert d.result is not None and d.result.verdict is Verdict.ERROR
    assert "the job finished" in d.result.summary


def test_with_a_projection_the_crash_loop_says_the_gpu_hours_it_burns() -> None:
    d = Drill.start(spec(max_crash_loop=2, sticky_gpus=1024))
    armed_then_dies(d, 3)
    assert d.result is not None and d.result.verdict is Verdict.FAIL
    deaths = d.details()["deathSeconds"]
    assert isinstance(deaths, list)
    per_retry = 1024 * (deaths[-1] - deaths[0]) / 2 / 3600
    assert f"{per_retry:.3g} more for each retry" in d.result.summary
    assert "at projection.gpus 1024 that is" in d.result.summary
    assert d.details()["gpuHours"] is not None


# ------------------------------------------------------------------ scope: checkpoint
#
# The trigger checkpoint (step 20) is damaged, then rank 1 is killed; checkpoint 10 is
# intact. What the job did next is told by its lines alone.

DAMAGED = ("ckpt/step-20.pt (4096 bytes): the byte at offset 2048 inverted",)


def damage_spec(max_crash_loop: int = 3) -> DrillSpec:
    return DrillSpec(
        max_recovery_time=30.0,
        after_checkpoint=20,
        fault="StickyFault",
        sticky=StickySpec("checkpoint", max_crash_loop=max_crash_loop, damage="flip"),
        recovery_timeout=60.0,
        sustain=Sustain(lines=3, seconds=0.0),
    )


@dataclass
class Damage:
    engine: DrillEngine
    result: DrillResult | None = None
    kills: int = 0

    def feed(self, kind: TrainingEventKind, t: float, inc: str, step: int | None = None,
             digest: str | None = None) -> None:  # fmt: skip
        event = ev(kind, t, inc, step, digest=digest)
        self.answer(list(self.engine.on_training_event(event)), t)

    def answer(self, actions: list[object], t: float) -> None:
        for action in actions:
            if isinstance(action, Finish):
                self.result = action.result
            elif isinstance(action, KillTarget):
                self.kills += 1
                window = self.engine.sticky_save_window(20)
                assert window is not None and window[0] < window[1] <= T0 + t
                self.engine.sticky_damaged(20, DAMAGED, T0 + t)
                killed = KillResult(KillOutcome.KILLED, T0 + t + 0.01, "killed rank 1")
                self.answer(list(self.engine.on_kill_result(killed)), t)

    def group(self, kind: GroupEventKind, t: float, detail: str = "") -> None:
        if self.result is None:
            event = group_ev(kind, t, detail)
            self.answer(list(self.engine.on_group_event(event)), t)


def damaged_at_20() -> tuple[Damage, float]:
    """Steps 1..22, checkpoints 10 and 20 (digests d10, d20) with their save lines."""
    engine = DrillEngine(damage_spec(), T0)
    engine.discovered(T0, "job", ranks=(0, 1))
    d = Damage(engine)
    d.feed(S, 0.0, "a")
    t = 0.1
    for step in range(1, 23):
        d.feed(P, t, "a", step)
        if step % 10 == 0:
            d.feed(TrainingEventKind.CHECKPOINT_STARTED, t + 0.01, "a", step)
            d.feed(C, t + 0.05, "a", step, digest=f"d{step}")
        t += 0.1
    assert d.kills == 1
    return d, t


def comes_back(d: Damage, t: float, loaded: int, digest: str | None, inc: str = "b") -> None:
    d.group(G.RESTARTING, t + 0.5)
    d.feed(S, t + 1.0, inc)
    if loaded:
        d.feed(L, t + 1.1, inc, loaded, digest=digest)
    for step in range(loaded + 1, loaded + 8):
        d.feed(P, t + 1.2 + 0.1 * (step - loaded), inc, step)


def test_a_job_that_falls_back_past_the_damage_passes() -> None:
    d, t = damaged_at_20()
    comes_back(d, t, 10, "d10")
    assert d.result is not None
    assert d.result.verdict is Verdict.PASS, d.result.summary
    (recovery,) = d.result.recoveries
    assert recovery.expected_resume_step == 10 and recovery.resume_step == 10
    check = next(c for c in d.result.checks if c.name == "damage_handled")
    assert check.message == "the job fell back past the damaged checkpoint 20 to step 10"
    damage = recovery.fault_details["damage"]
    assert damage["step"] == 20 and damage["files"] == list(DAMAGED)


def test_a_job_that_loads_the_damaged_state_fails_by_its_digest() -> None:
    d, t = damaged_at_20()
    comes_back(d, t, 20, "garbage")
    assert d.result is not None and d.result.verdict is Verdict.FAIL
    reasons = [c.reason for c in d.result.failed_checks]
    assert reasons[0] is R.LOADED_CORRUPT_CHECKPOINT, d.result.summary


def test_a_load_of_the_damaged_step_with_the_saved_digest_passes() -> None:
    d, t = damaged_at_20()
    comes_back(d, t, 20, "d20")  # e.g. a replica's intact copy
    assert d.result is not None, d.engine.status(T0 + t)
    check = next(c for c in d.result.checks if c.name == "damage_handled")
    assert check.passed is True and "intact copy" in check.message


def test_a_load_of_the_damaged_step_without_digests_is_undecided() -> None:
    d, t = damaged_at_20()
    comes_back(d, t, 20, None)
    assert d.result is not None
    check = next(c for c in d.result.checks if c.name == "damage_handled")
    assert check.passed is None and "state digest" in check.message


def test_a_job_that_starts_from_scratch_has_no_fallback() -> None:
    d, t = damaged_at_20()
    comes_back(d, t, 0, None)
    assert d.result is not None and d.result.verdict is Verdict.FAIL
    reasons = [c.reason for c in d.result.failed_checks]
    assert reasons[0] is R.NO_FALLBACK, d.result.summary
    assert "checkpoint 10 was intact" in d.result.summary


def test_a_crash_loop_on_the_damaged_checkpoint_fails_when_proven() -> None:
    d, t = damaged_at_20()
    for n in range(4):  # each replacement dies loading step 20, before its first step
        d.group(G.RESTARTING, t + 0.5)
        d.feed(S, t + 1.0, f"r{n}")
        t += 2.0
        if n < 3:
            assert d.result is None
    assert d.result is not None and d.result.verdict is Verdict.FAIL
    reasons = [c.reason for c in d.result.failed_checks]
    assert reasons[0] is R.CRASH_LOOP, d.result.summary
    assert "crash-loops on the damaged checkpoint 20: 4 restarts" in d.result.summary


def test_a_loud_failure_naming_the_file_passes() -> None:
    d, t = damaged_at_20()
    d.group(G.RESTARTING, t + 0.5)
    d.feed(S, t + 1.0, "b")
    d.group(G.JOB_FAILED, t + 2.0, "exit 1: ValueError: ckpt/step-20.pt fails its checksum")
    assert d.result is not None
    check = next(c for c in d.result.checks if c.name == "damage_handled")
    assert check.passed is True and "naming the damaged ckpt/step-20.pt" in check.message


def test_a_loud_failure_that_names_nothing_is_undecided() -> None:
    d, t = damaged_at_20()
    d.group(G.JOB_FAILED, t + 2.0, "exit 1: RuntimeError: failed finding central directory")
    assert d.result is not None
    check = next(c for c in d.result.checks if c.name == "damage_handled")
    assert check.passed is None and "or fall back to checkpoint 10" in check.message


def test_the_save_window_never_reaches_back_past_the_previous_checkpoint() -> None:
    engine = DrillEngine(damage_spec(), T0)
    engine.discovered(T0, "job", ranks=(0, 1))
    d = Damage(engine)
    d.feed(S, 0.0, "a")
    d.feed(P, 0.1, "a", 10)
    d.feed(C, 0.2, "a", 10)
    d.feed(TrainingEventKind.CHECKPOINT_STARTED, -5.0, "a", 20)  # stamped long before
    assert engine.sticky_save_window(20) is None  # not completed yet
    d.feed(P, 0.3, "a", 20)
    d.feed(C, 0.4, "a", 20)
    assert engine.sticky_save_window(20) == (T0 + 0.2, T0 + 0.4)
