"""The drill state machine and its verdict: pure, no I/O, no clock of its own.

Training events, group events, kill results and clock ticks go in; actions come out
(:class:`KillTarget` once, then :class:`Finish` with the :class:`DrillResult`). Every
backend drives the same engine through the runner, and the tests drive it directly.

Phases::

    WAITING_FOR_CHECKPOINT --trigger--> KILLING --killed--> RECOVERING
        |                                 |                     | first progress of a new
        | timeout, job ended: ERROR       | dry run: DRY_RUN    | incarnation: resume known
        v                                 | not done: ERROR     v
       DONE <-----------------------------+                 VERIFYING
        ^                                                       |
        +--- progress past the resume step, job failed, deadline +

Which incarnation is which: every reporter line carries its process's incarnation id.
An incarnation seen before the kill is *old*; one first seen after the kill, with a line
stamped after the kill, is *new*. Late lines of an old process never count as recovery.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from pytest_recoverygate.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    TimelineEntry,
    TrainingEvent,
    TrainingEventKind,
    Worker,
)

__all__ = [
    "BREAKDOWN_PHASES",
    "Check",
    "DrillEngine",
    "DrillResult",
    "DrillSpec",
    "FailureReason",
    "Finish",
    "KillTarget",
    "Phase",
    "Verdict",
    "step_ref",
]


class Phase(enum.Enum):
    """Where the drill is; see the module docstring for the transitions."""

    DISCOVERING = "discovering"
    WAITING_FOR_CHECKPOINT = "waiting for checkpoint"
    KILLING = "killing"
    RECOVERING = "recovering"
    VERIFYING = "verifying"
    DONE = "done"


class Verdict(enum.Enum):
    """The drill's outcome and the exit code the CLI maps it to."""

    PASS = "PASS"  # noqa: S105 - a verdict, not a password
    FAIL = "FAIL"
    ERROR = "ERROR"
    DRY_RUN = "DRY-RUN"
    INTERRUPTED = "INTERRUPTED"

    @property
    def exit_code(self) -> int:
        return _EXIT_CODES[self]


_EXIT_CODES = {
    Verdict.PASS: 0,
    Verdict.DRY_RUN: 0,
    Verdict.FAIL: 1,
    Verdict.ERROR: 3,
    Verdict.INTERRUPTED: 130,
}


class FailureReason(enum.Enum):
    """The named ways a recovery fails."""

    RESTARTED_FROM_SCRATCH = "the job restarted from scratch"
    RESUMED_FROM_OLDER_CHECKPOINT = "the job resumed from an older checkpoint"
    RESUMED_FROM_UNEXPECTED_CHECKPOINT = "the job resumed from an unexpected checkpoint"
    NEVER_CAME_BACK = "the job never came back"
    TOO_SLOW = "the job came back too slowly"
    LOST_TOO_MANY_STEPS = "the job lost too many steps"
    STOPPED_PROGRESSING = "training stopped progressing after resume"


@dataclass(frozen=True, slots=True)
class Check:
    """One named check of the verdict with its expected and observed values."""

    name: str
    passed: bool
    expected: Any
    observed: Any
    message: str
    reason: FailureReason | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "expected": self.expected,
            "observed": self.observed,
            "message": self.message,
            "reason": self.reason.name if self.reason else None,
        }


BREAKDOWN_PHASES = (
    "failureDetected",
    "replacementScheduled",
    "replacementRunning",
    "processStarted",
    "checkpointLoaded",
    "firstStepAfterResume",
)


@dataclass(frozen=True)
class DrillResult:
    """The outcome of one drill.

    Policy: PASS iff a new incarnation was seen, it resumed from the expected step, the
    recovery time is within ``maxRecoveryTime``, lost steps are within ``maxLostSteps``
    (when set) and training progressed past the resume step. FAIL names every failed
    check. ERROR means the drill could not be carried out (nothing was concluded about
    the job); DRY_RUN means the flow ran minus the kill; INTERRUPTED means the user
    stopped it. ``breakdown`` holds seconds since the kill for each recovery phase the
    backend could see, ``None`` for the ones it could not.
    """

    verdict: Verdict
    summary: str
    checks: tuple[Check, ...] = ()
    resume_step: int | None = None
    expected_resume_step: int | None = None
    last_step_before_kill: int | None = None
    lost_steps: int | None = None
    lost_steps_upper_bound: int | None = None
    recovery_time_seconds: float | None = None
    restarts: int | None = None
    trigger_checkpoint: int | None = None
    kill_time: float | None = None
    target: Worker | None = None
    breakdown: dict[str, float | None] = field(default_factory=dict)
    timeline: tuple[TimelineEntry, ...] = ()
    malformed_lines: int = 0
    progress: tuple[tuple[float, str, int], ...] = ()  # (time, incarnation, step) as seen
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def passed(self) -> bool:
        return self.verdict in (Verdict.PASS, Verdict.DRY_RUN)

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    @property
    def failed_checks(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if not check.passed)

    @property
    def reasons(self) -> tuple[FailureReason, ...]:
        return tuple(c.reason for c in self.failed_checks if c.reason is not None)


@dataclass(frozen=True, slots=True)
class DrillSpec:
    """What the engine needs from the config, in plain values (seconds, steps)."""

    max_recovery_time: float
    after_checkpoint: int | None = None  # None: the next checkpoint after the start
    expected_resume_step: int | None = None  # None: the latest checkpoint before the kill
    max_lost_steps: int | None = None
    checkpoint_timeout: float = 3600.0
    recovery_timeout: float | None = None  # None: 2 x max_recovery_time + 30 s
    reporting_rank: int | None = 0  # events of other ranks are ignored; None: all ranks

    @property
    def effective_recovery_timeout(self) -> float:
        if self.recovery_timeout is not None:
            return max(self.recovery_timeout, self.max_recovery_time)
        return 2 * self.max_recovery_time + 30.0


@dataclass(frozen=True, slots=True)
class KillTarget:
    """Action: kill the target instance now (exactly once)."""

    checkpoint_step: int


@dataclass(frozen=True, slots=True)
class Finish:
    """Action: the drill is over."""

    result: DrillResult


Action = KillTarget | Finish


def _fmt_seconds(seconds: float) -> str:
    if seconds >= 120:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes)}m{rest:02.0f}s"
    return f"{seconds:.2f}s"


def step_ref(step: int | None) -> str:
    return "unknown" if step is None else f"step {step}"


class DrillEngine:
    """One drill's state machine. Feed it; it tells you what to do."""

    def __init__(self, spec: DrillSpec, started_at: float) -> None:
        self.spec = spec
        self.phase = Phase.WAITING_FOR_CHECKPOINT
        self.started_at = started_at
        self._timeline: list[TimelineEntry] = []
        self._old_incs: set[str] = set()
        self._new_incs: set[str] = set()
        self._pending_starts: dict[str, TrainingEvent] = {}
        self._checkpoints: list[tuple[int, float]] = []  # old incarnations' completed saves
        # The last two (step, time) progress points of old incarnations, newest last.
        self._prev_progress: tuple[int, float] | None = None
        self._last_progress: tuple[int, float] | None = None
        self._last_step_old: int | None = None
        self._old_restart_count = -1
        self._new_restart_count = -1
        self._group_restarts = 0
        self.trigger_step: int | None = None
        self.kill_time: float | None = None
        self._loaded_step: int | None = None
        self.resume_step: int | None = None
        self._phase_times: dict[str, float] = {}
        self.current_step: int | None = None
        self.result: DrillResult | None = None

    # ------------------------------------------------------------------ inputs

    @property
    def deadline(self) -> float | None:
        """When :meth:`tick` must be called at the latest (drill clock)."""
        if self.phase is Phase.WAITING_FOR_CHECKPOINT:
            return self.started_at + self.spec.checkpoint_timeout
        if self.phase in (Phase.RECOVERING, Phase.VERIFYING) and self.kill_time is not None:
            return self.kill_time + self.spec.effective_recovery_timeout
        return None

    @property
    def waiting_for(self) -> str:
        """A short description of the trigger the drill waits for."""
        if self.spec.after_checkpoint is None:
            return "the next checkpoint"
        return f"checkpoint >= step {self.spec.after_checkpoint}"

    def on_training_event(self, event: TrainingEvent) -> list[Action]:
        if self.phase is Phase.DONE:
            return []
        rank = self.spec.reporting_rank
        if rank is not None and event.rank is not None and event.rank != rank:
            return []
        inc = event.incarnation
        if (
            self.kill_time is not None
            and event.kind is TrainingEventKind.START
            and event.timestamp <= self.kill_time
            and inc not in self._old_incs
            and inc not in self._new_incs
        ):
            # A start line carries the process's start time, read at a coarse tick: a
            # replacement restarted within a tick of the kill can look older than the kill.
            # Its first line that is not a start line decides which incarnation it is.
            self._pending_starts[inc] = event
            return []
        if self._is_new(event):
            actions: list[Action] = []
            pending = self._pending_starts.pop(inc, None)
            if pending is not None:
                actions += self._on_new_incarnation_event(pending)
            return actions + self._on_new_incarnation_event(event)
        pending = self._pending_starts.pop(inc, None)
        if pending is not None:
            self._on_old_incarnation_event(pending)
        return self._on_old_incarnation_event(event)

    def on_group_event(self, event: GroupEvent) -> list[Action]:
        if self.phase is Phase.DONE:
            return []
        self._note(event.timestamp, f"group:{event.kind.value}", event.detail)
        if self.kill_time is None:
            if event.kind is GroupEventKind.JOB_FAILED:
                return self._finish_error(
                    event.timestamp,
                    f"the job ended before the drill could kill anything: {event.detail}",
                )
            return []
        key = {
            GroupEventKind.WORKER_GONE: "failureDetected",
            GroupEventKind.RESTARTING: "replacementScheduled",
            GroupEventKind.REPLACEMENT_PENDING: "replacementScheduled",
            GroupEventKind.REPLACEMENT_RUNNING: "replacementRunning",
        }.get(event.kind)
        if key is not None:
            self._phase_times.setdefault(key, event.timestamp)
        if event.kind is GroupEventKind.RESTARTING:
            if event.restart_count is not None:
                self._group_restarts = max(self._group_restarts, event.restart_count)
            else:
                self._group_restarts += 1
        if event.kind is GroupEventKind.JOB_FAILED:
            return self._finish_verdict(event.timestamp, job_failed=event.detail or "job failed")
        return []

    def on_kill_result(self, result: KillResult) -> list[Action]:
        if self.phase is not Phase.KILLING:
            return []
        if result.outcome is KillOutcome.KILLED:
            self.kill_time = result.timestamp
            self.phase = Phase.RECOVERING
            self._note(result.timestamp, "kill", result.detail)
            return []
        if result.outcome is KillOutcome.DRY_RUN:
            self._note(result.timestamp, "kill:dry-run", result.detail)
            check = Check(
                "kill_allowed",
                True,
                "the kill is allowed",
                result.detail or "allowed",
                "dry run: the trigger checkpoint was reached and the kill would be allowed",
            )
            return self._finish(
                result.timestamp,
                Verdict.DRY_RUN,
                f"dry run: reached checkpoint step {self.trigger_step}; "
                "the kill would be allowed; nothing was killed",
                (check,),
            )
        what = (
            "the target instance was already gone; nothing was killed"
            if result.outcome is KillOutcome.ALREADY_GONE
            else "the kill could not be confirmed"
        )
        self._note(result.timestamp, f"kill:{result.outcome.value}", result.detail)
        detail = f": {result.detail}" if result.detail else ""
        return self._finish_error(result.timestamp, f"{what}{detail}")

    def tick(self, now: float) -> list[Action]:
        deadline = self.deadline
        if deadline is None or now < deadline:
            return []
        if self.phase is Phase.WAITING_FOR_CHECKPOINT:
            last = self._checkpoints[-1][0] if self._checkpoints else None
            seen = f"the last checkpoint seen was step {last}" if last is not None else (
                "no checkpoint was seen at all"
            )
            return self._finish_error(
                now,
                f"timed out after {_fmt_seconds(self.spec.checkpoint_timeout)} waiting for "
                f"{self.waiting_for}; {seen} (timeouts.checkpoint)",
            )
        return self._finish_verdict(now, job_failed=None)

    def abort(self, now: float, verdict: Verdict, message: str) -> DrillResult:
        """End the drill from outside (errors, interrupts) with what is known so far."""
        if self.result is not None:
            return self.result
        self._note(now, verdict.value.lower(), message)
        self.result = self._result(now, verdict, message, ())
        self.phase = Phase.DONE
        return self.result

    # ------------------------------------------------------------------ events

    def _is_new(self, event: TrainingEvent) -> bool:
        if event.incarnation in self._new_incs:
            return True
        if event.incarnation in self._old_incs:
            return False
        if self.kill_time is not None and event.timestamp > self.kill_time:
            self._new_incs.add(event.incarnation)
            return True
        self._old_incs.add(event.incarnation)
        return False

    def _on_old_incarnation_event(self, event: TrainingEvent) -> list[Action]:
        kind = event.kind
        step = event.step
        if kind is TrainingEventKind.START:
            self._note(event.timestamp, "start", f"incarnation {event.incarnation}")
            if event.restart_count is not None:
                self._old_restart_count = max(self._old_restart_count, event.restart_count)
            return []
        if step is None:
            return []
        if kind is TrainingEventKind.PROGRESS:
            if self._last_step_old is None or step >= self._last_step_old:
                self._last_step_old = step
                self._prev_progress = self._last_progress
                self._last_progress = (step, event.timestamp)
            if self.kill_time is None:
                self.current_step = step
            return []
        if kind is TrainingEventKind.CHECKPOINT_COMPLETED:
            self._checkpoints.append((step, event.timestamp))
            # A saved step was completed, even if its progress line was rate-limited away.
            if self._last_step_old is None or step > self._last_step_old:
                self._last_step_old = step
            self._note(event.timestamp, "checkpoint", f"step {step}", step=step)
            if self.phase is Phase.WAITING_FOR_CHECKPOINT and self._triggers(event):
                self.trigger_step = step
                self.phase = Phase.KILLING
                return [KillTarget(step)]
        return []

    def _triggers(self, event: TrainingEvent) -> bool:
        assert event.step is not None
        if self.spec.after_checkpoint is None:
            return event.timestamp >= self.started_at
        return event.step >= self.spec.after_checkpoint

    def _on_new_incarnation_event(self, event: TrainingEvent) -> list[Action]:
        kind = event.kind
        if event.restart_count is not None:
            self._new_restart_count = max(self._new_restart_count, event.restart_count)
        if kind is TrainingEventKind.START:
            self._phase_times.setdefault("processStarted", event.timestamp)
            self._note(event.timestamp, "start", f"new incarnation {event.incarnation}")
            return []
        if event.step is None:
            return []
        if kind is TrainingEventKind.CHECKPOINT_LOADED:
            self._phase_times.setdefault("checkpointLoaded", event.timestamp)
            if self._loaded_step is None:
                self._loaded_step = event.step
            self._note(event.timestamp, "checkpoint_loaded", f"step {event.step}", step=event.step)
            return []
        if kind is not TrainingEventKind.PROGRESS:
            return []
        self.current_step = event.step
        self._phase_times.setdefault("processStarted", event.timestamp)
        if self.resume_step is None:
            self.resume_step = self._resume_from(event.step)
            self.phase = Phase.VERIFYING
            self._note(
                event.timestamp, "resume", f"resumed from step {self.resume_step}",
                step=self.resume_step,
            )
        if event.step > self.resume_step:
            self._phase_times.setdefault("firstStepAfterResume", event.timestamp)
            self._note(event.timestamp, "progress", f"step {event.step}", step=event.step)
            return self._finish_verdict(event.timestamp, job_failed=None)
        return []

    def _resume_from(self, first_step: int) -> int:
        if self._loaded_step is not None:
            return self._loaded_step
        saved = [step for step, _ in self._checkpoints if step <= first_step]
        return max(saved) if saved else 0

    # ------------------------------------------------------------------ verdict

    def _expected_resume(self) -> int | None:
        if self.spec.expected_resume_step is not None:
            return self.spec.expected_resume_step
        return self._checkpoints[-1][0] if self._checkpoints else None

    def _restarts(self) -> int | None:
        counted = [self._group_restarts] if self._group_restarts else []
        if self._new_restart_count >= 0 and self._old_restart_count >= 0:
            counted.append(self._new_restart_count - self._old_restart_count)
        elif self._new_restart_count >= 0 and self._old_restart_count < 0:
            counted.append(1)
        if counted:
            return max(counted)
        return 0 if self.kill_time is not None else None

    def _lost_steps_upper_bound(self) -> int | None:
        if self.resume_step is None or self._last_step_old is None or self.kill_time is None:
            return None
        if self._prev_progress is None or self._last_progress is None:
            return None
        (s0, t0), (s1, t1) = self._prev_progress, self._last_progress
        if t1 <= t0 or s1 <= s0:
            return None
        rate = (s1 - s0) / (t1 - t0)
        extra = int(rate * max(0.0, self.kill_time - t1))
        bound = max(s1 + extra, self._last_step_old) - self.resume_step
        return max(bound, 0)

    def _finish_verdict(self, now: float, *, job_failed: str | None) -> list[Action]:
        assert self.kill_time is not None
        spec = self.spec
        checks: list[Check] = []
        restarts = self._restarts()
        came_back = bool(self._new_incs)
        progressed = "firstStepAfterResume" in self._phase_times
        waited = _fmt_seconds(now - self.kill_time)
        ended = f"the job failed ({job_failed})" if job_failed else f"after {waited}"

        checks.append(
            Check(
                "new_incarnation",
                came_back,
                "a new incarnation reports training events",
                f"{len(self._new_incs)} new incarnation(s), {restarts or 0} restart(s)",
                (
                    f"a new incarnation came back after {restarts or 0} restart(s)"
                    if came_back
                    else f"never came back: no new incarnation reported {ended}"
                ),
                None if came_back else FailureReason.NEVER_CAME_BACK,
            )
        )
        expected = self._expected_resume()
        if self.resume_step is not None:
            checks.append(self._resume_check(expected))
        elif came_back:
            checks.append(
                Check(
                    "resume_step",
                    False,
                    expected,
                    None,
                    f"never came back: a new incarnation started but reported no training "
                    f"step ({ended})",
                    FailureReason.NEVER_CAME_BACK,
                )
            )
        recovery: float | None = None
        if progressed:
            recovery = self._phase_times["firstStepAfterResume"] - self.kill_time
            ok = recovery <= spec.max_recovery_time
            checks.append(
                Check(
                    "recovery_time",
                    ok,
                    f"<= {_fmt_seconds(spec.max_recovery_time)}",
                    round(recovery, 6),
                    (
                        f"recovered in {_fmt_seconds(recovery)} "
                        f"(limit {_fmt_seconds(spec.max_recovery_time)})"
                        if ok
                        else f"came back too slowly: {_fmt_seconds(recovery)} > "
                        f"{_fmt_seconds(spec.max_recovery_time)}"
                    ),
                    None if ok else FailureReason.TOO_SLOW,
                )
            )
        lost: int | None = None
        if self.resume_step is not None and self._last_step_old is not None:
            lost = max(0, self._last_step_old - self.resume_step)
        if spec.max_lost_steps is not None and lost is not None:
            ok = lost <= spec.max_lost_steps
            checks.append(
                Check(
                    "lost_steps",
                    ok,
                    f"<= {spec.max_lost_steps}",
                    lost,
                    (
                        f"lost {lost} step(s) (limit {spec.max_lost_steps})"
                        if ok
                        else f"lost too many steps: {lost} > {spec.max_lost_steps}"
                    ),
                    None if ok else FailureReason.LOST_TOO_MANY_STEPS,
                )
            )
        if self.resume_step is not None:
            checks.append(
                Check(
                    "progress_after_resume",
                    progressed,
                    f"a step after {self.resume_step}",
                    self.current_step,
                    (
                        f"training progressed to step {self.current_step}"
                        if progressed
                        else f"training stopped progressing after resuming from step "
                        f"{self.resume_step} ({ended})"
                    ),
                    None if progressed else FailureReason.STOPPED_PROGRESSING,
                )
            )
        failed = [c for c in checks if not c.passed]
        verdict = Verdict.FAIL if failed else Verdict.PASS
        if failed:
            summary = "; ".join(c.message for c in failed)
        else:
            assert recovery is not None
            summary = (
                f"resumed from step {self.resume_step} as expected and recovered in "
                f"{_fmt_seconds(recovery)}"
            )
        return self._finish(now, verdict, summary, tuple(checks), recovery=recovery, lost=lost)

    def _resume_check(self, expected: int | None) -> Check:
        observed = self.resume_step
        assert observed is not None
        if expected is None or observed == expected:
            return Check(
                "resume_step", expected is not None, expected, observed,
                f"resumed from step {observed}" + (" as expected" if expected is not None else
                                                   ", but no checkpoint was seen to expect"),
                None if expected is not None else FailureReason.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
            )
        if observed == 0:
            reason = FailureReason.RESTARTED_FROM_SCRATCH
            why = "the job restarted from scratch"
        elif observed < expected:
            reason = FailureReason.RESUMED_FROM_OLDER_CHECKPOINT
            why = "the job resumed from an older checkpoint"
        else:
            reason = FailureReason.RESUMED_FROM_UNEXPECTED_CHECKPOINT
            why = "the job resumed from a checkpoint newer than expected"
        return Check(
            "resume_step",
            False,
            expected,
            observed,
            f"resumed from step {observed}, expected step {expected} — {why}",
            reason,
        )

    # ------------------------------------------------------------------ output

    def _finish_error(self, now: float, message: str) -> list[Action]:
        return self._finish(now, Verdict.ERROR, message, ())

    def _finish(
        self,
        now: float,
        verdict: Verdict,
        summary: str,
        checks: tuple[Check, ...],
        *,
        recovery: float | None = None,
        lost: int | None = None,
    ) -> list[Action]:
        self._note(now, "verdict", f"{verdict.value}: {summary}")
        self.result = self._result(now, verdict, summary, checks, recovery=recovery, lost=lost)
        self.phase = Phase.DONE
        return [Finish(self.result)]

    def _result(
        self,
        now: float,
        verdict: Verdict,
        summary: str,
        checks: tuple[Check, ...],
        *,
        recovery: float | None = None,
        lost: int | None = None,
    ) -> DrillResult:
        breakdown: dict[str, float | None] = {}
        for key in BREAKDOWN_PHASES:
            at = self._phase_times.get(key)
            breakdown[key] = (
                round(at - self.kill_time, 6) if at is not None and self.kill_time else None
            )
        return DrillResult(
            verdict=verdict,
            summary=summary,
            checks=checks,
            resume_step=self.resume_step,
            expected_resume_step=self._expected_resume() if self.kill_time else None,
            last_step_before_kill=self._last_step_old,
            lost_steps=lost,
            lost_steps_upper_bound=self._lost_steps_upper_bound(),
            recovery_time_seconds=round(recovery, 6) if recovery is not None else None,
            restarts=self._restarts(),
            trigger_checkpoint=self.trigger_step,
            kill_time=self.kill_time,
            breakdown=breakdown if self.kill_time is not None else {},
            timeline=tuple(sorted(self._timeline, key=lambda e: e.timestamp)),
            started_at=self.started_at,
            finished_at=now,
        )

    def _note(self, at: float, kind: str, detail: str, **data: Any) -> None:
        self._timeline.append(TimelineEntry(at, kind, detail, dict(data)))
