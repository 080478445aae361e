"""KillDuringRecovery in the engine, driven directly (no backend, no clock).

We test these aspects:
- the second kill lands at the sign of the named phase of the first recovery
  (``startup``: the backend saw the replacement's first process; ``rendezvous``: the whole
  group running; ``checkpointLoad``: a ``checkpoint_load_started`` line; ``firstInterval``:
  the replacement's first step past its resume), on the target's *current* instance
  (index 2), and is aimed again while no replacement instance is there yet;
- the first recovery is recorded as interrupted, never judged; the second is judged from
  the newest durable checkpoint, its recovery time counted from the second kill;
- a job that comes back passes; one the second failure leaves crash-looping, hung or
  failed fails ``RECOVERY_NOT_REENTRANT`` with the phase named; one that restarts from
  scratch fails as such;
- a recovery that never shows the phase is an ERROR saying what would show it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pytest_recoverygate.engine.machine import (
    DrillEngine,
    DrillResult,
    FailureReason,
    Finish,
    KillTarget,
    Verdict,
)
from pytest_recoverygate.engine.model import (
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEventKind,
)
from pytest_recoverygate.engine.spec import DrillSpec
from tests.engine_events import LS, T0, C, G, L, P, S, ev, group_ev

R = FailureReason


def spec(phase: str, **kw: object) -> DrillSpec:
    return DrillSpec(
        max_recovery_time=float(kw.pop("max_recovery_time", 30.0)),  # type: ignore[arg-type]
        after_checkpoint=20,
        fault="KillDuringRecovery",
        recovery_phase=phase,
        recovery_timeout=float(kw.pop("recovery_timeout", 60.0)),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


@dataclass
class Drill:
    engine: DrillEngine
    kills: list[KillTarget] = field(default_factory=list)
    result: DrillResult | None = None
    gone: int = 0  # kills answered ALREADY_GONE (no replacement instance yet)
    late: float = 0.0  # seconds after its sign the second kill lands (the backend's latency)

    @classmethod
    def start(cls, s: DrillSpec, gone: int = 0) -> Drill:
        engine = DrillEngine(s, T0)
        engine.discovered(T0, "job", ranks=(0, 1))
        return cls(engine, gone=gone)

    def answer(self, actions: list[object], t: float) -> None:
        for action in actions:
            if isinstance(action, Finish):
                self.result = action.result
            elif isinstance(action, KillTarget):
                self.kills.append(action)
                if action.index == 2 and self.gone > 0:
                    self.gone -= 1
                    outcome = KillOutcome.ALREADY_GONE
                else:
                    outcome = KillOutcome.KILLED
                at = T0 + t + (self.late if action.index == 2 else 0.0)
                self.answer(list(self.engine.on_kill_result(KillResult(outcome, at))), t)

    def line(self, kind: TrainingEventKind, t: float, inc: str, step: int | None = None,
             rank: int = 0) -> Drill:  # fmt: skip
        self.answer(list(self.engine.on_training_event(ev(kind, t, inc, step, rank))), t)
        return self

    def group(self, kind: GroupEventKind, t: float) -> Drill:
        self.answer(list(self.engine.on_group_event(group_ev(kind, t))), t)
        return self

    def train(self, inc: str, t: float, steps: range, dt: float = 0.1, every: int = 0) -> float:
        for step in steps:
            self.line(P, t, inc, step)
            if every and step % every == 0:
                self.line(C, t + 0.01, inc, step)
            t += dt
        return t

    def until(self, t_end: float, t: float) -> Drill:
        while t <= t_end and self.result is None:
            self.answer(list(self.engine.tick(T0 + t)), t)
            t += 0.5
        return self

    def checks(self) -> dict[str, object]:
        assert self.result is not None
        return {c.name: c for c in self.result.checks}


def first_kill(d: Drill) -> float:
    d.line(S, 0.0, "a")
    t = d.train("a", 0.1, range(1, 26), every=10)
    assert [k.index for k in d.kills] == [1]
    d.group(G.WORKER_GONE, t)
    return t


def recover(d: Drill, inc: str, t: float, loaded: int = 20) -> float:
    d.line(S, t, inc)
    d.line(LS, t + 0.5, inc, loaded)
    d.line(L, t + 1.0, inc, loaded)
    return d.train(inc, t + 1.1, range(loaded + 1, loaded + 200))


def test_a_job_that_comes_back_from_a_kill_in_its_load_passes() -> None:
    d = Drill.start(spec("checkpointLoad"))
    t = first_kill(d)
    d.line(S, t + 1.0, "b")
    d.line(LS, t + 1.5, "b", 20)  # the load begins: the second kill lands here
    assert [k.index for k in d.kills] == [1, 2]
    assert d.kills[1].rank == 1
    t2 = recover(d, "c", t + 4.0)
    assert d.result is not None
    assert d.result.verdict is Verdict.PASS, d.result.summary
    first, second = d.result.recoveries
    assert first.verdict is Verdict.INTERRUPTED and "checkpointLoad" in first.summary
    assert second.resume_step == 20 and second.kill_time == T0 + t + 1.5
    assert second.recovery_time_seconds is not None and second.recovery_time_seconds < t2 - t
    assert d.checks()["reentrant"].passed is True  # type: ignore[attr-defined]


def test_a_second_kill_that_lands_after_the_load_is_over_is_inconclusive() -> None:
    """The backend's kill took longer than the load (a probe and a kill step on Slurm):
    the replacement that began loading had loaded before the kill landed, so the drill
    tested a failure in the first interval, not in the load; it must not pass as one."""
    d = Drill.start(spec("checkpointLoad"))
    d.late = 0.8
    t = first_kill(d)
    d.line(S, t + 1.0, "b")
    d.line(LS, t + 1.5, "b", 20)  # the kill is sent now, lands at t + 2.3
    d.line(L, t + 1.9, "b", 20)  # the load was over first
    recover(d, "c", t + 4.0)
    assert d.result is not None
    assert d.result.verdict is Verdict.ERROR, d.result.summary
    check = d.checks()["reentrant"]
    assert check.passed is None  # type: ignore[attr-defined]
    assert "landed after the checkpointLoad phase was over" in d.result.summary
    assert "had loaded step 20 0.40s before" in d.result.summary
    second = d.result.recoveries[1].fault_details
    assert second["phaseIncarnation"] == "b" and second["afterFirstKillSeconds"] > 0


def test_a_second_kill_that_lands_inside_the_load_passes_with_its_figures() -> None:
    d = Drill.start(spec("checkpointLoad"))
    d.late = 0.3
    t = first_kill(d)
    d.line(S, t + 1.0, "b")
    d.line(LS, t + 1.5, "b", 20)  # lands at t + 1.8: "b" never loads (it was cut)
    recover(d, "c", t + 4.0)
    assert d.result is not None
    assert d.result.verdict is Verdict.PASS, d.result.summary
    second = d.result.recoveries[1].fault_details
    assert second["secondKillPhase"] == "checkpointLoad"
    assert second["phaseSign"] == "checkpoint_load_started(20)"


def test_a_first_interval_kill_after_the_first_new_checkpoint_is_inconclusive() -> None:
    d = Drill.start(spec("firstInterval"))
    d.late = 2.0
    t = first_kill(d)
    d.line(S, t + 1.0, "b")
    d.line(L, t + 1.5, "b", 20)
    d.line(P, t + 1.6, "b", 21)  # the sign: the kill lands at t + 3.6
    d.train("b", t + 1.7, range(22, 32), every=10)  # checkpoint 30 completes at ~t + 2.6
    recover(d, "c", t + 5.0, loaded=30)
    assert d.result is not None
    assert d.result.verdict is Verdict.ERROR, d.result.summary
    assert "checkpoint 30 had completed" in d.result.summary


@pytest.mark.parametrize(
    ("phase", "sign"),
    [("startup", G.RESTARTING), ("rendezvous", G.REPLACEMENT_RUNNING)],
)
def test_the_backend_group_changes_time_the_startup_and_rendezvous_kills(
    phase: str, sign: GroupEventKind
) -> None:
    d = Drill.start(spec(phase))
    t = first_kill(d)
    d.group(G.RESTARTING, t + 0.3)
    d.group(G.REPLACEMENT_RUNNING, t + 0.6)
    assert [k.index for k in d.kills] == [1, 2]
    kills = [r for r in d.engine.timeline_entries() if r.kind == "kill"]
    assert len(kills) == 2
    second = kills[1]
    assert second.timestamp == pytest.approx(T0 + t + (0.3 if sign is G.RESTARTING else 0.6))


def test_the_second_kill_is_aimed_again_until_a_replacement_is_there() -> None:
    d = Drill.start(spec("startup"), gone=2)
    t = first_kill(d)
    d.group(G.RESTARTING, t + 0.3)
    d.until(t + 1.6, t=t + 0.4)  # two looks find no replacement instance, the third does
    assert [k.index for k in d.kills] == [1, 2, 2, 2]
    assert d.engine._second_sent


def test_the_first_interval_kill_lands_at_the_first_step_past_the_resume() -> None:
    d = Drill.start(spec("firstInterval"))
    t = first_kill(d)
    d.line(S, t + 1.0, "b")
    d.line(L, t + 1.5, "b", 20)
    d.line(P, t + 1.6, "b", 21)
    assert [k.index for k in d.kills] == [1, 2]
    recover(d, "c", t + 4.0)
    assert d.result is not None
    assert d.result.verdict is Verdict.PASS, d.result.summary


def test_a_job_that_a_second_kill_leaves_crash_looping_is_not_reentrant() -> None:
    d = Drill.start(spec("checkpointLoad", max_recovery_time=10.0, recovery_timeout=20.0))
    t = first_kill(d)
    d.line(S, t + 1.0, "b")
    d.line(LS, t + 1.5, "b", 20)
    for i in range(3):  # each restart dies before it reports a step
        d.group(G.RESTARTING, t + 3.0 + 4 * i)
    d.group(G.JOB_FAILED, t + 16.0)
    assert d.result is not None
    assert d.result.verdict is Verdict.FAIL
    check = d.checks()["reentrant"]
    assert check.reason is R.RECOVERY_NOT_REENTRANT  # type: ignore[attr-defined]
    assert "checkpointLoad" in check.message  # type: ignore[attr-defined]


def test_a_job_a_second_kill_leaves_hung_is_not_reentrant() -> None:
    d = Drill.start(spec("checkpointLoad", max_recovery_time=5.0, recovery_timeout=10.0))
    t = first_kill(d)
    d.line(S, t + 1.0, "b")
    d.line(LS, t + 1.5, "b", 20)
    d.until(t + 20.0, t=t + 2.0)
    assert d.result is not None
    assert d.result.verdict is Verdict.FAIL
    check = d.checks()["reentrant"]
    assert "it hung" in check.message  # type: ignore[attr-defined]


def test_a_second_recovery_from_scratch_fails_as_such() -> None:
    d = Drill.start(spec("checkpointLoad"))
    t = first_kill(d)
    d.line(S, t + 1.0, "b")
    d.line(LS, t + 1.5, "b", 20)
    d.line(S, t + 4.0, "c")
    d.train("c", t + 5.0, range(1, 200))
    assert d.result is not None
    assert d.result.verdict is Verdict.FAIL
    assert R.RESTARTED_FROM_SCRATCH in d.result.reasons


def test_a_recovery_that_never_shows_its_load_is_an_error_saying_what_would() -> None:
    d = Drill.start(spec("checkpointLoad"))
    t = first_kill(d)
    d.line(S, t + 1.0, "b")
    d.line(L, t + 1.5, "b", 20)  # loaded, but never said it began to load
    d.train("b", t + 1.6, range(21, 300))
    assert d.result is not None
    assert d.result.verdict is Verdict.ERROR
    assert "checkpoint_load_started" in d.result.summary


# ------------------------------------------------------------------ lost steps of the second kill


def quiet_recovery(d: Drill) -> float:
    """The first kill at checkpoint 20, the group broken at once (no line of anyone until
    the replacement starts 20 s later: imports, rendezvous), the second kill as it loads;
    the next replacement resumes from 20. Returns when the first kill landed."""
    d.line(S, 0.0, "a")
    t = d.train("a", 0.1, range(1, 21), every=10)  # the kill lands at checkpoint 20
    assert [k.index for k in d.kills] == [1]
    d.group(G.WORKER_GONE, t)
    d.line(S, t + 20.0, "b")
    d.line(LS, t + 20.5, "b", 20)  # the second kill lands here
    assert [k.index for k in d.kills] == [1, 2]
    recover(d, "c", t + 25.0)
    return t


def test_the_second_kill_s_lost_steps_are_bounded_by_the_lines_before_the_first() -> None:
    """No line of anyone between the two kills: nothing trained longer than one line gap
    unseen after the first, so the second's last step before it is the first's plus at
    most one gap, not the line before the first kill extrapolated over the whole first
    recovery (a real drill's maxLostSteps was left undecided so: 9 to 223)."""
    d = Drill.start(spec("checkpointLoad", max_lost_steps=10))
    quiet_recovery(d)
    assert d.result is not None
    assert d.result.verdict is Verdict.PASS, d.result.summary
    second = d.result.recoveries[1]
    assert second.last_step_before_kill == 20
    bound = second.last_step_before_kill_upper_bound
    assert bound is not None and 20 <= bound <= 23, bound  # one 0.1 s gap at 10 steps/s
    assert d.checks()["lost_steps"].passed is True  # type: ignore[attr-defined]


def test_a_line_between_the_kills_keeps_the_extrapolation_to_the_second() -> None:
    """The replacement trained (21..28) before the second kill landed: the bound must
    cover what it reached, so the line before the first kill is extrapolated to the
    second kill as for any kill."""
    d = Drill.start(spec("firstInterval"))
    d.late = 0.75  # the second kill lands while "b" trains on
    d.line(S, 0.0, "a")
    t = d.train("a", 0.1, range(1, 21), every=10)
    d.group(G.WORKER_GONE, t)
    d.line(S, t + 1.0, "b")
    d.line(L, t + 1.5, "b", 20)
    d.train("b", t + 1.6, range(21, 29))  # the sign at 21, the kill lands at t + 2.35
    recover(d, "c", t + 5.0)
    assert d.result is not None
    second = d.result.recoveries[1]
    bound = second.last_step_before_kill_upper_bound
    assert bound is not None and bound >= 28, (bound, d.result.summary)
