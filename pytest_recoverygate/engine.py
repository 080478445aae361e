"""The drill state machine and its verdict: pure, no I/O, no clock of its own.

Training events, group events, kill results and clock ticks go in; actions come out
(:class:`KillTarget` once, then :class:`Finish` with the :class:`DrillResult`). Every
backend drives the same engine through the runner, and the tests drive it directly.

Phases (the table :data:`TRANSITIONS` is the only source of truth; :meth:`DrillEngine._move`
is the only function that changes the phase, and an illegal move raises)::

    DISCOVERING --discovered--> WAITING_FOR_CHECKPOINT --trigger--> KILLING
         |                            |                               |  killed
         |                            | timeout, job ended: ERROR     v
         |                            |                           RECOVERING
         |                            |                               |  a replacement loaded a
         |                            |                               |  checkpoint, or trained
         |                            |                               v  a step not yet decisive
         +----------------------------+--------> DONE <---------- VERIFYING
                                     (every phase may end the drill)

**The step contract.** ``step`` is the number of training steps *completed* when the call
is made: ``progress(n)`` after the n-th step, ``checkpoint_completed(n)`` when the durable
checkpoint holds the state after n steps, ``checkpoint_loaded(n)`` when the resumed
process holds it. A fresh start reports 1 (or its stride k) first; a correct resume from
checkpoint n reports n + k first. The engine learns the contract from the first
incarnation (its first two progress lines, which the reporter always prints, give the
first step and the stride) and holds the job to it: a broken contract makes the verdict
*inconclusive*, never a PASS resting on a guess.

**Which incarnation is which.** Every reporter line carries its process's incarnation id.
An incarnation seen before the kill is *old*; one first seen after the kill, with a line
stamped after the kill, is *new*. Old lines stamped after the kill (a survivor still
training) are neither "before the kill" nor recovery. The resume is judged on the new
incarnation that actually trains: one that loads a checkpoint and dies is in the timeline,
not in the verdict.

**The resume step** of a new incarnation with first progress ``p`` and stride ``k``:
``checkpoint_loaded(L)`` when it reported one (checked against ``p``: ``p <= L`` means
steps were replayed), else ``p - k``. Inference is used only where it is sound: an unknown
stride, or sparse progress whose grid the checkpoints are not on, leaves it undecided.

**Verdict.** Each check is passed, failed, or undecided (``Check.passed is None``). FAIL
when any check failed (proven by the evidence), else ERROR with an "inconclusive" summary
when any check is undecided, else PASS.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections import deque
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
    "TRANSITIONS",
    "Check",
    "DrillEngine",
    "DrillResult",
    "DrillSpec",
    "FailureReason",
    "Finish",
    "IllegalTransition",
    "IncarnationInfo",
    "KillTarget",
    "Phase",
    "StepContract",
    "Verdict",
    "format_seconds",
]


class Phase(enum.Enum):
    """Where the drill is; see the module docstring and :data:`TRANSITIONS`."""

    DISCOVERING = "discovering"
    WAITING_FOR_CHECKPOINT = "waiting for checkpoint"
    KILLING = "killing"
    RECOVERING = "recovering"
    VERIFYING = "verifying"
    DONE = "done"


#: Every legal phase change. Anything else is a bug and raises :class:`IllegalTransition`.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.DISCOVERING: frozenset({Phase.WAITING_FOR_CHECKPOINT, Phase.DONE}),
    Phase.WAITING_FOR_CHECKPOINT: frozenset({Phase.KILLING, Phase.DONE}),
    Phase.KILLING: frozenset({Phase.RECOVERING, Phase.DONE}),
    Phase.RECOVERING: frozenset({Phase.VERIFYING, Phase.DONE}),
    Phase.VERIFYING: frozenset({Phase.RECOVERING, Phase.DONE}),
    Phase.DONE: frozenset(),
}


class IllegalTransition(RuntimeError):
    """The engine was asked to move between two phases the table does not connect."""


class Verdict(enum.Enum):
    """The drill's outcome and the exit code the CLI maps it to."""

    PASS = "PASS"  # noqa: S105 - a verdict, not a password
    FAIL = "FAIL"
    ERROR = "ERROR"
    DRY_RUN = "DRY-RUN"
    INTERRUPTED = "INTERRUPTED"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self]


#: The CLI's exit code for each verdict (2, invalid usage, is not a verdict: see the CLI).
EXIT_CODES = {
    Verdict.PASS: 0,
    Verdict.DRY_RUN: 0,
    Verdict.FAIL: 1,
    Verdict.ERROR: 3,
    Verdict.INTERRUPTED: 130,
}


class FailureReason(enum.Enum):
    """The named ways a recovery fails (and the one way the evidence cannot decide)."""

    RESTARTED_FROM_SCRATCH = "the job restarted from scratch"
    RESUMED_FROM_OLDER_CHECKPOINT = "the job resumed from an older checkpoint"
    RESUMED_FROM_UNEXPECTED_CHECKPOINT = "the job resumed from an unexpected checkpoint"
    STEPS_REPLAYED = "progress went backwards after the resume: steps were replayed"
    CHECKPOINT_NEVER_COMPLETED = "the expected checkpoint was never completed"
    NEVER_CAME_BACK = "the job never came back"
    TOO_SLOW = "the job came back too slowly"
    LOST_TOO_MANY_STEPS = "the job lost too many steps"
    STOPPED_PROGRESSING = "training stopped progressing after resume"
    INCONCLUSIVE = "the evidence cannot decide"


@dataclass(frozen=True, slots=True)
class Check:
    """One named check of the verdict with its expected and observed values.

    ``passed`` is ``True`` (proven), ``False`` (proven failed) or ``None`` (the evidence
    cannot decide; ``message`` says what would make it decidable).
    """

    name: str
    passed: bool | None
    expected: Any
    observed: Any
    message: str
    reason: FailureReason | None = None

    @property
    def undecided(self) -> bool:
        return self.passed is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "expected": self.expected,
            "observed": self.observed,
            "message": self.message,
            "reason": self.reason.name if self.reason else None,
        }


#: The recovery phases, each in seconds after the kill (the report sorts them by time):
#: failureDetected — the backend saw the target instance gone;
#: replacementScheduled — the backend saw a restart or replacement scheduled;
#: replacementRunning — the backend saw the whole replacement group running;
#: processStarted — the judged replacement process started (its start line);
#: firstReport — its first reporter line after the start (import and initialisation end);
#: checkpointLoaded — it reported checkpoint_loaded;
#: firstStepAfterResume — its first progress past the resume step (the recovery time).
BREAKDOWN_PHASES = (
    "failureDetected",
    "replacementScheduled",
    "replacementRunning",
    "processStarted",
    "firstReport",
    "checkpointLoaded",
    "firstStepAfterResume",
)


@dataclass(frozen=True, slots=True)
class StepContract:
    """What the first incarnation showed of the step contract.

    ``first_step`` and ``stride`` come from its first two progress lines; ``fresh_start``
    is ``None`` when the drill did not see the process start. ``problem`` is the precise
    message when the job breaks the contract (the verdict then cannot PASS).
    """

    first_step: int | None = None
    stride: int | None = None
    fresh_start: bool | None = None
    resumed_from: int | None = None
    problem: str | None = None

    def describe(self) -> str:
        if self.first_step is None:
            return "no progress seen before the kill"
        cadence = (
            "stride unknown" if self.stride is None
            else "every step" if self.stride == 1 else f"every {self.stride} steps"
        )
        start = (
            "a fresh start" if self.fresh_start
            else f"resumed from step {self.resumed_from}" if self.resumed_from is not None
            else "start not seen"
        )
        return f"first step {self.first_step} ({start}), progress {cadence}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "firstStep": self.first_step,
            "stride": self.stride,
            "freshStart": self.fresh_start,
            "resumedFrom": self.resumed_from,
            "problem": self.problem,
        }


@dataclass(frozen=True, slots=True)
class IncarnationInfo:
    """One process the drill heard from (for the report and the timeline)."""

    inc: str
    rank: int | None
    pid: int | None
    host: str | None
    restart: int | None
    new: bool
    first_seen: float
    started: float | None
    loaded_step: int | None
    first_step: int | None
    last_step: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "inc": self.inc,
            "rank": self.rank,
            "pid": self.pid,
            "host": self.host,
            "restart": self.restart,
            "new": self.new,
            "firstSeen": self.first_seen,
            "started": self.started,
            "loadedStep": self.loaded_step,
            "firstStep": self.first_step,
            "lastStep": self.last_step,
        }


@dataclass(frozen=True)
class DrillResult:
    """The outcome of one drill.

    Policy: PASS iff a new incarnation was seen, it resumed from the expected step, the
    recovery time is within ``maxRecoveryTime``, lost steps are within ``maxLostSteps``
    (when set; the *upper* bound must be within it) and training progressed past the
    resume step — each proven by the evidence, on a job that keeps the step contract.
    FAIL names every check the evidence proves failed. ERROR is either *inconclusive*
    (``inconclusive`` is true: the evidence cannot decide, and the undecided checks say
    what would make it decidable) or a drill that could not be carried out. DRY_RUN means
    the flow ran minus the kill; INTERRUPTED means the user stopped it. ``breakdown`` holds
    seconds since the kill for each recovery phase the backend could see, ``None`` for the
    ones it could not.
    """

    verdict: Verdict
    summary: str
    checks: tuple[Check, ...] = ()
    resume_step: int | None = None
    expected_resume_step: int | None = None
    loaded_step: int | None = None
    last_step_before_kill: int | None = None
    last_step_before_kill_upper_bound: int | None = None
    lost_steps: int | None = None
    lost_steps_upper_bound: int | None = None
    recovery_time_seconds: float | None = None
    restarts: int | None = None
    trigger_checkpoint: int | None = None
    kill_time: float | None = None
    target: Worker | None = None
    judged_incarnation: str | None = None
    step_contract: StepContract | None = None
    notes: tuple[str, ...] = ()
    incarnations: tuple[IncarnationInfo, ...] = ()
    checkpoints: tuple[tuple[int, float], ...] = ()
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
    def inconclusive(self) -> bool:
        """ERROR because the evidence cannot decide (not because the drill could not run)."""
        return self.verdict is Verdict.ERROR and any(c.undecided for c in self.checks)

    @property
    def failed_checks(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if check.passed is False)

    @property
    def undecided_checks(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if check.passed is None)

    @property
    def reasons(self) -> tuple[FailureReason, ...]:
        """The reasons of the failed checks, then of the undecided ones."""
        checks = self.failed_checks + self.undecided_checks
        return tuple(dict.fromkeys(c.reason for c in checks if c.reason is not None))


@dataclass(frozen=True, slots=True)
class DrillSpec:
    """What the engine needs from the config, in plain values (seconds, steps)."""

    max_recovery_time: float
    after_checkpoint: int | None = None  # None: the next checkpoint after the start
    expected_resume_step: int | None = None  # None: the latest checkpoint durable at the load
    max_lost_steps: int | None = None
    checkpoint_timeout: float = 3600.0
    recovery_timeout: float | None = None  # None: max_recovery_time + recovery_grace
    recovery_grace: float = 30.0
    reporting_rank: int | None = 0  # events of other ranks are ignored; None: all ranks

    @property
    def effective_recovery_timeout(self) -> float:
        """When "never came back" is decided, in seconds after the kill."""
        if self.recovery_timeout is not None:
            return max(self.recovery_timeout, self.max_recovery_time)
        return self.max_recovery_time + self.recovery_grace


@dataclass(frozen=True, slots=True)
class KillTarget:
    """Action: kill the target instance now (exactly once)."""

    checkpoint_step: int


@dataclass(frozen=True, slots=True)
class Finish:
    """Action: the drill is over."""

    result: DrillResult


Action = KillTarget | Finish


def format_seconds(seconds: float) -> str:
    """A duration as people read it: ``4.05s``, ``3m30s``."""
    if seconds >= 120:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes)}m{rest:02.0f}s"
    return f"{seconds:.2f}s"


_fmt_seconds = format_seconds


def _steps(values: list[int], limit: int = 6) -> str:
    shown = ", ".join(str(v) for v in values[-limit:])
    return ("…, " if len(values) > limit else "") + shown if values else "none"


@dataclass(slots=True)
class _Inc:
    """What the drill knows of one process (one incarnation id)."""

    id: str
    rank: int | None
    new: bool
    first_seen: float
    start_time: float | None = None
    start_seen: bool = False
    pid: int | None = None
    host: str | None = None
    restart: int | None = None
    first_line: float | None = None  # its first line that is not the start line
    loaded: int | None = None  # checkpoint_loaded before its first progress
    loaded_at: float | None = None
    first: tuple[int, float] | None = None  # (step, time) of its first progress line
    second: tuple[int, float] | None = None
    last: tuple[int, float] | None = None
    backwards: tuple[int, int] | None = None  # its first step decrease (from, to)

    def info(self) -> IncarnationInfo:
        return IncarnationInfo(
            inc=self.id, rank=self.rank, pid=self.pid, host=self.host, restart=self.restart,
            new=self.new, first_seen=self.first_seen, started=self.start_time,
            loaded_step=self.loaded,
            first_step=self.first[0] if self.first else None,
            last_step=self.last[0] if self.last else None,
        )


@dataclass(frozen=True, slots=True)
class _Ckpt:
    step: int
    time: float
    inc: str
    after_kill: bool


@dataclass(frozen=True, slots=True)
class _Resume:
    """How a replacement resumed, as far as the evidence goes."""

    step: int | None  # the step it resumed counting from (first progress - stride)
    loaded: int | None = None
    replayed: bool = False  # it loaded ``loaded`` and then reported a step <= loaded
    undecided: str | None = None  # why the step cannot be told, and the fix


class DrillEngine:
    """One drill's state machine. Feed it; it tells you what to do."""

    def __init__(self, spec: DrillSpec, started_at: float) -> None:
        self.spec = spec
        self.phase = Phase.DISCOVERING
        self.started_at = started_at
        self._timeline: list[TimelineEntry] = []
        self._incs: dict[str, _Inc] = {}
        self._order: list[_Inc] = []  # incarnations in the order first seen
        self._pending_starts: dict[str, TrainingEvent] = {}
        self._checkpoints: list[_Ckpt] = []
        self._skipped_triggers: set[int] = set()
        # Old incarnations' progress: the newest pre-kill point, a few before it for the
        # step rate, and the earliest and highest post-kill points (a survivor).
        self._pre: tuple[int, float] | None = None
        self._recent: deque[tuple[int, float]] = deque(maxlen=16)
        self._pre_ckpt = -1
        self._post_first: tuple[int, float] | None = None
        self._post_max = -1
        self._group_restarts = 0
        self._group_seen: dict[GroupEventKind, float] = {}
        self._job_ended: tuple[float, str, bool] | None = None  # (time, detail, succeeded)
        self.trigger_step: int | None = None
        self.kill_time: float | None = None
        self._judged: _Inc | None = None
        self._resume: _Resume | None = None
        self.current_step: int | None = None
        self.result: DrillResult | None = None

    # ------------------------------------------------------------------ phase

    def _move(self, to: Phase) -> None:
        """The one place the phase changes."""
        if to is self.phase:
            return
        if to not in TRANSITIONS[self.phase]:
            raise IllegalTransition(f"{self.phase.name} -> {to.name} is not a drill transition")
        self.phase = to

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

    @property
    def resume_step(self) -> int | None:
        return self._resume.step if self._resume is not None else None

    def discovered(self, now: float, detail: str) -> None:
        """The runner found the workload: start waiting for the trigger checkpoint."""
        self.note(now, "discovered", detail)
        self._move(Phase.WAITING_FOR_CHECKPOINT)

    def note(self, at: float, kind: str, detail: str = "", **data: Any) -> None:
        """Add a line to the drill's one timeline (the runner's notes go here too)."""
        self._timeline.append(TimelineEntry(at, kind, detail, dict(data)))

    def timeline_entries(self) -> list[TimelineEntry]:
        """Every timeline entry so far, in the order noted."""
        return list(self._timeline)

    def status(self, now: float) -> str:
        """What the drill is doing right now, in one sentence for a live display."""
        if self.phase is Phase.DISCOVERING:
            return "discovering the workload"
        if self.phase is Phase.WAITING_FOR_CHECKPOINT:
            last = self._checkpoints[-1].step if self._checkpoints else None
            seen = f"; last checkpoint step {last}" if last is not None else ""
            return f"waiting for {self.waiting_for}{seen}"
        if self.phase is Phase.KILLING:
            return "killing the target"
        if self.phase in (Phase.RECOVERING, Phase.VERIFYING):
            new = [inc for inc in self._order if inc.new]
            if not new:
                latest = max(self._group_seen.items(), key=lambda kv: kv[1], default=None)
                what = f"; the backend reports {latest[0].value}" if latest else ""
                return f"killed; waiting for a replacement to report{what}"
            inc = new[-1]
            if inc.first is not None and self._resume is None:
                return (
                    f"the replacement's first step was {inc.first[0]}; waiting for its next "
                    "progress line to learn the progress stride"
                )
            if inc.loaded is not None and inc.loaded_at is not None:
                return (
                    f"replacement loaded checkpoint {inc.loaded} "
                    f"{max(now - inc.loaded_at, 0.0):.1f}s ago; no training step yet"
                )
            since = inc.start_time if inc.start_time is not None else inc.first_seen
            return (
                f"replacement process started {max(now - since, 0.0):.1f}s ago; "
                "no training step yet"
            )
        return str(self.phase.value)

    def on_training_event(self, event: TrainingEvent) -> list[Action]:
        if self.phase is Phase.DONE:
            return []
        rank = self.spec.reporting_rank
        if rank is not None and event.rank is not None and event.rank != rank:
            return []
        inc_id = event.incarnation
        known = self._incs.get(inc_id)
        if (
            known is None
            and self.kill_time is not None
            and event.kind is TrainingEventKind.START
            and event.timestamp <= self.kill_time
        ):
            # A start line carries the process's start time, read at a coarse tick: a
            # replacement restarted within a tick of the kill can look older than the kill.
            # Its first line that is not a start line decides which incarnation it is.
            self._pending_starts[inc_id] = event
            return []
        if known is None:
            new = self.kill_time is not None and event.timestamp > self.kill_time
            known = _Inc(inc_id, event.rank, new, event.timestamp)
            self._incs[inc_id] = known
            self._order.append(known)
        pending = self._pending_starts.pop(inc_id, None)
        actions: list[Action] = []
        if pending is not None:
            actions += self._on_event(known, pending)
        return actions + self._on_event(known, event)

    def on_group_event(self, event: GroupEvent) -> list[Action]:
        if self.phase is Phase.DONE:
            return []
        self.note(event.timestamp, f"group:{event.kind.value}", event.detail)
        ended = event.kind in (GroupEventKind.JOB_FAILED, GroupEventKind.JOB_SUCCEEDED)
        if self.kill_time is None:
            if ended:
                how = "failed" if event.kind is GroupEventKind.JOB_FAILED else "finished"
                step = f" at step {self.current_step}" if self.current_step is not None else ""
                fix = (
                    "" if event.kind is GroupEventKind.JOB_FAILED
                    else "; lengthen the run or pick an earlier injectFailure.afterCheckpoint"
                )
                return self._finish_error(
                    event.timestamp,
                    f"the job {how}{step} before the drill could kill anything"
                    f"{': ' + event.detail if event.detail else ''}{fix}",
                )
            return []
        self._group_seen.setdefault(event.kind, event.timestamp)
        if event.kind is GroupEventKind.RESTARTING:
            if event.restart_count is not None:
                self._group_restarts = max(self._group_restarts, event.restart_count)
            else:
                self._group_restarts += 1
        if ended:
            self._job_ended = (
                event.timestamp, event.detail, event.kind is GroupEventKind.JOB_SUCCEEDED
            )
            return self._finish_verdict(event.timestamp)
        return []

    def on_kill_result(self, result: KillResult) -> list[Action]:
        if self.phase is not Phase.KILLING:
            return []
        if result.outcome is KillOutcome.KILLED:
            self.kill_time = result.timestamp
            self._move(Phase.RECOVERING)
            self.note(result.timestamp, "kill", result.detail)
            return []
        if result.outcome is KillOutcome.DRY_RUN:
            self.note(result.timestamp, "kill:dry-run", result.detail)
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
        self.note(result.timestamp, f"kill:{result.outcome.value}", result.detail)
        detail = f": {result.detail}" if result.detail else ""
        return self._finish_error(result.timestamp, f"{what}{detail}")

    def tick(self, now: float) -> list[Action]:
        deadline = self.deadline
        if deadline is None or now < deadline:
            return []
        if self.phase is Phase.WAITING_FOR_CHECKPOINT:
            last = self._checkpoints[-1].step if self._checkpoints else None
            seen = f"the last checkpoint seen was step {last}" if last is not None else (
                "no checkpoint was seen at all"
            )
            return self._finish_error(
                now,
                f"timed out after {format_seconds(self.spec.checkpoint_timeout)} waiting for "
                f"{self.waiting_for}; {seen} (timeouts.checkpoint)",
            )
        return self._finish_verdict(now)

    def abort(self, now: float, verdict: Verdict, message: str) -> DrillResult:
        """End the drill from outside (errors, interrupts) with what is known so far."""
        if self.result is not None:
            return self.result
        self.note(now, verdict.value.lower(), message)
        self.result = self._result(now, verdict, message, ())
        self._move(Phase.DONE)
        return self.result

    # ------------------------------------------------------------------ events

    def _on_event(self, inc: _Inc, event: TrainingEvent) -> list[Action]:
        kind = event.kind
        if event.restart_count is not None:
            inc.restart = event.restart_count
        if kind is TrainingEventKind.START:
            inc.start_seen = True
            inc.start_time = event.timestamp
            inc.pid = event.pid
            inc.host = event.host
            what = "new incarnation" if inc.new else "incarnation"
            self.note(event.timestamp, "start", f"{what} {inc.id}", pid=event.pid)
            return []
        if inc.first_line is None:
            inc.first_line = event.timestamp
        step = event.step
        if step is None:
            return []
        if kind is TrainingEventKind.PROGRESS:
            return self._on_progress(inc, step, event.timestamp)
        if kind is TrainingEventKind.CHECKPOINT_COMPLETED:
            return self._on_checkpoint(inc, step, event.timestamp)
        if kind is TrainingEventKind.CHECKPOINT_LOADED:
            if inc.first is None:
                inc.loaded = step
                inc.loaded_at = event.timestamp
            if inc.new and self.phase is Phase.RECOVERING:
                self._move(Phase.VERIFYING)  # it resumed: now it must train past the step
            where = "replacement " if inc.new else ""
            self.note(event.timestamp, "checkpoint_loaded", f"{where}step {step}", step=step)
            if not inc.new and self.kill_time is None and inc.first is None:
                self.note(
                    event.timestamp, "note",
                    f"the job resumed from step {step} when the drill started",
                )
        return []

    def _on_progress(self, inc: _Inc, step: int, at: float) -> list[Action]:
        if inc.first is None:
            inc.first = (step, at)
        elif inc.second is None:
            inc.second = (step, at)
        last = inc.last
        if last is not None and step < last[0] and inc.backwards is None:
            inc.backwards = (last[0], step)
        inc.last = (step, at)
        if inc.new:
            return self._on_new_progress(inc, step, at)
        kill = self.kill_time
        if kill is None or at <= kill:
            pre = self._pre
            if pre is None or step >= pre[0]:
                self._pre = (step, at)
                self._recent.append((step, at))
            if kill is None:
                self.current_step = step
        else:  # a survivor still training after the kill
            post = self._post_first
            if post is None or at < post[1]:
                self._post_first = (step, at)
            self._post_max = max(self._post_max, step)
        return []

    def _on_checkpoint(self, inc: _Inc, step: int, at: float) -> list[Action]:
        after_kill = self.kill_time is not None and at > self.kill_time
        if inc.new:
            self.note(at, "checkpoint", f"replacement checkpoint step {step}", step=step)
            return []
        self._checkpoints.append(_Ckpt(step, at, inc.id, after_kill))
        if not after_kill:
            self._pre_ckpt = max(self._pre_ckpt, step)
        detail = f"step {step}" + (" (completed after the kill)" if after_kill else "")
        self.note(at, "checkpoint", detail, step=step)
        if self.phase is Phase.WAITING_FOR_CHECKPOINT and self._triggers(step, at):
            refusal = self._indistinguishable(step)
            if refusal is not None:
                if step not in self._skipped_triggers:
                    self._skipped_triggers.add(step)
                    self.note(at, "note", refusal)
                return []
            self.trigger_step = step
            self._move(Phase.KILLING)
            return [KillTarget(step)]
        return []

    def _triggers(self, step: int, at: float) -> bool:
        if self.spec.after_checkpoint is None:
            return at >= self.started_at
        return step >= self.spec.after_checkpoint

    def _indistinguishable(self, step: int) -> str | None:
        """Why a resume from this checkpoint could not be told from a fresh start, if so."""
        if step == 0:
            return (
                "checkpoint 0 holds the state of a fresh start: a resume from it cannot be "
                "told from a restart from scratch; waiting for a later checkpoint"
            )
        base = self._baseline()
        if base is None and any(i.start_seen for i in self._order):
            return (
                f"checkpoint {step} came before any progress line, so a resume from it might "
                "report the same first step as a fresh start; waiting for a later checkpoint"
            )
        if base is not None and base.start_seen and base.first is not None and (
            base.first[0] > step
        ):
            return (
                f"the first progress line reported step {base.first[0]}, after checkpoint "
                f"{step}: a resume from it might report the same first step as a fresh "
                "start; waiting for a later checkpoint"
            )
        stride = self._contract().stride
        if stride is not None and stride > 1 and step < stride:
            return (
                f"progress is reported every {stride} steps, so a resume from checkpoint "
                f"{step} would report the same first step ({stride}) as a fresh start; "
                f"waiting for a checkpoint at step {stride} or later"
            )
        return None

    def _on_new_progress(self, inc: _Inc, step: int, at: float) -> list[Action]:
        self.current_step = step
        if inc.first == (step, at):
            self.note(at, "progress", f"replacement's first step {step}", step=step)
        resume = self._resume_of(inc, final=False)
        if resume is None:
            self._move(Phase.VERIFYING)
            return []
        self._judged, self._resume = inc, resume
        self.note(at, "resume", self._describe_resume(inc, resume), step=resume.step)
        return self._finish_verdict(at)

    # ------------------------------------------------------------------ evidence

    def _baseline(self) -> _Inc | None:
        """The first incarnation that reported progress before the kill."""
        for inc in self._order:
            if not inc.new and inc.first is not None:
                return inc
        return None

    def _contract(self) -> StepContract:
        base = self._baseline()
        if base is None or base.first is None:
            return StepContract()
        first = base.first[0]
        # Only the first two progress calls of a process are always printed: without its
        # start line, the first lines seen may be rate-limited ones, not its first calls.
        if not base.start_seen and base.loaded is None:
            return StepContract(first_step=first)
        second = base.second[0] if base.second is not None else None
        stride = second - first if second is not None and second > first else None
        problem: str | None = None
        fresh: bool | None = None
        resumed: int | None = None
        if second is not None and second == first:
            problem = (
                f"step {first} was reported twice in a row: call progress(step) once per "
                "completed step (with gradient accumulation: once per optimizer step)"
            )
        elif second is not None and second < first:
            problem = (
                f"progress went backwards right after the start ({first}, then {second}): "
                "report the number of steps completed"
            )
        if base.loaded is not None:
            fresh, resumed = False, base.loaded
            if first <= base.loaded:
                problem = problem or (
                    f"after loading checkpoint {base.loaded} the first step was reported as "
                    f"{first}: report progress(n) after the n-th completed step (a resume "
                    f"from checkpoint {base.loaded} reports {base.loaded + 1} first)"
                )
        elif base.start_seen:
            if first == 0:
                fresh = True
                problem = problem or (
                    "the first step after a fresh start was reported as 0: report "
                    "progress(epoch + 1), not progress(epoch) — `step` is the number of "
                    "steps completed, so a fresh start reports 1 first"
                )
            elif stride is not None and first > stride:
                fresh, resumed = False, first - stride
            elif stride is not None or first == 1:
                fresh = True
        return StepContract(first, stride, fresh, resumed, problem)

    def _stride_for(self, inc: _Inc) -> int | None:
        contract = self._contract()
        if contract.stride is not None and contract.problem is None:
            return contract.stride
        if inc.first is not None and inc.second is not None and inc.second[0] > inc.first[0]:
            return inc.second[0] - inc.first[0]
        return None

    def _resume_of(self, inc: _Inc, *, final: bool) -> _Resume | None:
        """The resume step of a replacement that reported progress (None: wait for more)."""
        assert inc.first is not None
        first = inc.first[0]
        stride = self._stride_for(inc)
        loaded = inc.loaded
        if loaded is not None:
            if first <= loaded:  # replayed; it counts from first - stride (if that is known)
                counts = max(first - stride, 0) if stride else (0 if first <= 1 else None)
                return _Resume(counts, loaded, replayed=True)
            if stride is None:
                if first == loaded + 1:
                    return _Resume(loaded, loaded)
                if not final:
                    return None
                return _Resume(loaded, loaded, undecided=(
                    f"the replacement loaded checkpoint {loaded} and then reported step "
                    f"{first}, and the progress stride is unknown (one progress line): let "
                    "it train longer, or report progress every step"
                ))
            if first > loaded + stride:
                return _Resume(loaded, loaded, undecided=(
                    f"the replacement reported checkpoint_loaded({loaded}) but its first step "
                    f"was {first}, more than one progress stride ({stride}) later: report "
                    "checkpoint_loaded(n) with the step the resumed process holds"
                ))
            return _Resume(loaded, loaded)
        if first <= 1 or (stride is not None and first <= stride):
            return _Resume(0)
        if stride is None:
            if not final:
                return None
            return _Resume(None, undecided=(
                f"the replacement reported one progress line (step {first}), so the "
                "progress stride is unknown and its resume step cannot be inferred: call "
                "reporter.checkpoint_loaded(step) after loading a checkpoint, or let it "
                "train longer"
            ))
        step = first - stride
        off_grid = [c.step for c in self._checkpoints if c.step % stride]
        if stride > 1 and off_grid:
            return _Resume(step, undecided=(
                f"progress is reported every {stride} steps and checkpoints "
                f"{_steps(off_grid, 3)} are not on that grid, so the resume step lies "
                f"between {first - stride} and {first - 1}: call "
                "reporter.checkpoint_loaded(step) after loading, or report progress every step"
            ))
        return _Resume(step)

    def _describe_resume(self, inc: _Inc, resume: _Resume) -> str:
        if resume.replayed:
            return (
                f"loaded checkpoint {resume.loaded}, then reported step "
                f"{inc.first[0] if inc.first else '?'}"
            )
        if resume.step is None:
            return "resume step undecided"
        how = "checkpoint_loaded" if resume.loaded is not None else "inferred from progress"
        return f"resumed from step {resume.step} ({how})"

    def _load_window(self, inc: _Inc) -> tuple[float, float]:
        """(the replacement started, it had loaded): checkpoints durable in between count."""
        started = inc.start_time if inc.start_time is not None else inc.first_seen
        if inc.loaded_at is not None:
            loaded = inc.loaded_at
        elif inc.first is not None:
            loaded = inc.first[1]
        else:
            loaded = started
        return min(started, loaded), loaded

    def _rate(self) -> float | None:
        """The fastest step rate among the last pre-kill progress lines (steps/s).

        With fewer than two lines before the kill, the replacement's first two lines (the
        same job at the same step time) stand in.
        """
        best: float | None = None
        points = list(self._recent)
        if len(points) < 2:
            judged = self._judged
            if judged is not None and judged.first is not None and judged.second is not None:
                points = [judged.first, judged.second]
        for (s0, t0), (s1, t1) in itertools.pairwise(points):
            if s1 > s0 and t1 > t0:
                rate = (s1 - s0) / (t1 - t0)
                best = rate if best is None else max(best, rate)
        return best

    def _last_before_kill(self) -> tuple[int | None, int | None]:
        """(proven, bound) of the last step completed before the kill.

        Proven: the highest step reported (progress or checkpoint) stamped at or before
        the kill. Bound: the last pre-kill line extrapolated to the kill at the fastest
        step rate seen just before it, capped by the first line a survivor printed after
        the kill (that step had not completed at the kill).
        """
        if self.kill_time is None:
            return None, None
        pre_step = self._pre[0] if self._pre is not None else -1
        proven = max(pre_step, self._pre_ckpt)
        if proven < 0:
            return None, None
        bound: int | None = None
        rate = self._rate()
        if self._pre is not None and rate is not None:
            gap = max(self.kill_time - self._pre[1], 0.0)
            bound = self._pre[0] + math.ceil(rate * gap - 1e-9)
        if self._post_first is not None:
            bound = self._post_first[0] if bound is None else min(bound, self._post_first[0])
        if bound is not None:
            bound = max(bound, proven)
        return proven, bound

    def _reach_bound(self) -> int | None:
        """The highest step the old incarnations can have reached.

        The reporter prints at least one line per interval while training goes on, so a
        process that reached further than one line gap (at the fastest rate seen) past its
        last line would have printed again: the bound is the highest old step seen plus
        the steps of the longest line gap seen, plus one stride.
        """
        highest = max(self._post_max, self._pre[0] if self._pre else -1, self._pre_ckpt,
                      max((c.step for c in self._checkpoints), default=-1))
        if highest < 0:
            return None
        rate = self._rate()
        points = list(self._recent)
        gaps = [t1 - t0 for (_, t0), (_, t1) in itertools.pairwise(points)]
        stride = self._contract().stride or 1
        if rate is None or not gaps:
            return highest + stride
        return highest + math.ceil(rate * max(gaps)) + stride

    def _restarts(self) -> int | None:
        if self.kill_time is None:
            return None
        counted = [self._group_restarts]
        olds = [i.restart for i in self._order if not i.new and i.restart is not None]
        news = [i.restart for i in self._order if i.new and i.restart is not None]
        if news and olds:
            counted.append(max(news) - max(olds))
        per_rank: dict[int | None, int] = {}
        for inc in self._order:
            if inc.new:
                per_rank[inc.rank] = per_rank.get(inc.rank, 0) + 1
        counted.append(max(per_rank.values(), default=0))
        return max(counted)

    # ------------------------------------------------------------------ verdict

    def _candidate(self) -> _Inc | None:
        """The replacement to judge when none decided: the newest that trained, else newest."""
        new = [inc for inc in self._order if inc.new]
        trained = [inc for inc in new if inc.first is not None]
        if trained:
            return trained[-1]
        return new[-1] if new else None

    def _ended_how(self, now: float) -> str:
        assert self.kill_time is not None
        if self._job_ended is not None:
            _, detail, ok = self._job_ended
            what = "the job finished" if ok else "the job failed"
            return f"{what} ({detail})" if detail else what
        return f"within {format_seconds(now - self.kill_time)} of the kill"

    def _finish_verdict(self, now: float) -> list[Action]:
        assert self.kill_time is not None
        spec = self.spec
        inc = self._judged or self._candidate()
        resume = self._resume
        if resume is None and inc is not None and inc.first is not None:
            resume = self._resume_of(inc, final=True)
        elif resume is None and inc is not None and inc.loaded is not None:
            resume = _Resume(inc.loaded, inc.loaded)  # it holds that state, but never trained
        self._resume = resume
        finished_ok = self._job_ended is not None and self._job_ended[2]
        ended = self._ended_how(now)
        contract = self._contract()
        checks: list[Check] = []
        restarts = self._restarts() or 0
        came_back = inc is not None
        checks.append(Check(
            "new_incarnation",
            True if came_back else (None if finished_ok else False),
            "a new incarnation reports training events",
            f"{sum(1 for i in self._order if i.new)} new incarnation(s), {restarts} restart(s)",
            (
                f"a new incarnation came back after {restarts} restart(s)" if came_back
                else "inconclusive: the job finished before a replacement reported; "
                "lengthen the run so it is still training at the kill" if finished_ok
                else f"never came back: no new incarnation reported — {ended}"
            ),
            None if came_back else (
                FailureReason.INCONCLUSIVE if finished_ok else FailureReason.NEVER_CAME_BACK
            ),
        ))
        checks.append(self._contract_check(contract))
        expected, floor = self._expected(inc)
        recovery: float | None = None
        lost: tuple[int | None, int | None] = (None, None)
        if inc is not None and inc.first is None:
            checks += self._no_progress_checks(inc, expected, ended, finished_ok)
        elif inc is not None and resume is not None:
            checks.append(self._resume_check(inc, resume, expected, floor, contract))
            assert inc.first is not None
            recovery = inc.first[1] - self.kill_time
            ok = recovery <= spec.max_recovery_time
            checks.append(Check(
                "recovery_time", ok, f"<= {format_seconds(spec.max_recovery_time)}",
                round(recovery, 6),
                (
                    f"recovered in {format_seconds(recovery)} "
                    f"(limit {format_seconds(spec.max_recovery_time)})" if ok
                    else f"came back too slowly: {format_seconds(recovery)} > "
                    f"{format_seconds(spec.max_recovery_time)}"
                ),
                None if ok else FailureReason.TOO_SLOW,
            ))
            lost = self._lost(resume)
            if spec.max_lost_steps is not None:
                checks.append(self._lost_check(lost, spec.max_lost_steps))
        failed = [c for c in checks if c.passed is False]
        undecided = [c for c in checks if c.passed is None]
        if failed:
            verdict, summary = Verdict.FAIL, "; ".join(c.message for c in failed)
        elif undecided:
            verdict = Verdict.ERROR
            summary = "; ".join(
                c.message if c.message.startswith("inconclusive") else f"inconclusive: {c.message}"
                for c in undecided
            )
        else:
            assert recovery is not None
            assert resume is not None
            verdict = Verdict.PASS
            summary = (
                f"resumed from step {resume.step} as expected and recovered in "
                f"{format_seconds(recovery)}"
            )
        return self._finish(
            now, verdict, summary, tuple(checks), recovery=recovery, lost=lost,
            resume=resume, judged=inc, expected=expected,
        )

    def _contract_check(self, contract: StepContract) -> Check:
        if contract.problem is not None:
            return Check(
                "step_contract", None, "progress(n) after the n-th completed step",
                contract.describe(),
                f"the job breaks the step contract, so the resume cannot be judged: "
                f"{contract.problem}",
                FailureReason.INCONCLUSIVE,
            )
        return Check(
            "step_contract", True, "progress(n) after the n-th completed step",
            contract.describe(), f"step contract: {contract.describe()}",
        )

    def _expected(self, inc: _Inc | None) -> tuple[int | None, int | None]:
        """(expected resume step, the newest checkpoint durable before the replacement started).

        With ``latest`` the expected step is the newest checkpoint durable before the
        replacement loaded; any checkpoint that became durable while it was starting and
        loading (between the two) is a legitimate latest too.
        """
        if self.spec.expected_resume_step is not None:
            step = self.spec.expected_resume_step
            return step, step
        if inc is None:
            done = [c.step for c in self._checkpoints]
            return (max(done) if done else None), (max(done) if done else None)
        started, loaded = self._load_window(inc)
        durable = [c.step for c in self._checkpoints if c.time <= loaded]
        before = [c.step for c in self._checkpoints if c.time <= started]
        expected = max(durable) if durable else None
        floor = max(before) if before else expected
        return expected, floor

    def _resume_check(
        self, inc: _Inc, resume: _Resume, expected: int | None, floor: int | None,
        contract: StepContract,
    ) -> Check:
        observed = resume.step
        first = inc.first[0] if inc.first else None
        completed = sorted({c.step for c in self._checkpoints})
        name = "resume_step"

        def check(passed: bool | None, message: str, reason: FailureReason | None) -> Check:
            if passed and resume.loaded is None and observed is not None and first is not None:
                # Inferred from progress alone: the first step also fits a replacement that
                # loaded a newer checkpoint and redid steps. Only a PASS needs to rule it out.
                inside = [c for c in completed if observed < c <= first]
                if inside:
                    return Check(name, None, expected, observed, (
                        f"the replacement's first step ({first}) fits a resume from step "
                        f"{observed} as well as one that loaded checkpoint {inside[-1]} and "
                        "redid steps: call reporter.checkpoint_loaded(step) after loading so "
                        "the drill knows which"
                    ), FailureReason.INCONCLUSIVE)
            return Check(name, passed, expected, observed, message, reason)

        if resume.replayed:
            assert first is not None
            return check(False, (
                f"loaded checkpoint {resume.loaded}, but the first step reported after it was "
                f"{first}: steps {first}–{resume.loaded} were done again (progress went "
                "backwards after the resume)"
            ), FailureReason.STEPS_REPLAYED)
        if observed is None:
            return check(None, resume.undecided or "the resume step is unknown",
                         FailureReason.INCONCLUSIVE)
        scratch = observed == 0 and (expected or 0) > 0
        fresh_signature = (
            inc.loaded is None and contract.fresh_start and first == contract.first_step
        )
        if contract.problem is not None and not (scratch and fresh_signature):
            return check(None, (
                f"the replacement resumed from step {observed} by the job's own count, but "
                "the job breaks the step contract (see step_contract), so that count cannot "
                "be trusted"
            ), FailureReason.INCONCLUSIVE)
        if resume.undecided is not None:
            return check(None, resume.undecided, FailureReason.INCONCLUSIVE)
        if expected is None:
            return check(False, f"resumed from step {observed}, but no checkpoint was seen to "
                         "expect", FailureReason.RESUMED_FROM_UNEXPECTED_CHECKPOINT)
        how = "loaded" if resume.loaded is not None else "resumed from"
        if self.spec.expected_resume_step is not None:
            if observed == expected:
                return check(True, f"resumed from step {observed} as expected", None)
            if expected not in completed:
                return check(False, (
                    f"resumed from step {observed}, expected step {expected} — checkpoint "
                    f"{expected} was never completed; completed: {_steps(completed)}"
                ), FailureReason.CHECKPOINT_NEVER_COMPLETED)
        else:
            durable = {c.step for c in self._checkpoints if c.time <= self._load_window(inc)[1]}
            lowest = floor if floor is not None else expected
            if observed in durable and observed >= lowest:
                return check(True, f"resumed from the latest checkpoint, step {observed}", None)
            if observed > max(completed, default=-1):
                reach = self._reach_bound()
                if reach is not None and observed <= reach:
                    return check(True, (
                        f"{how} checkpoint {observed}, which the drill never saw completed; "
                        f"it is newer than every checkpoint seen ({expected}) and within the "
                        f"steps the job reached (at most {reach})"
                    ), None)
                return check(False, (
                    f"resumed from step {observed}, expected step {expected} — beyond any "
                    f"step the job can have reached"
                    + (f" (at most {reach})" if reach is not None else "")
                ), FailureReason.RESUMED_FROM_UNEXPECTED_CHECKPOINT)
        if observed == 0:
            what = (
                "loaded checkpoint 0" if resume.loaded == 0 else "loaded no checkpoint"
            )
            return check(False, (
                f"resumed from step 0, expected step {expected} — the job restarted from "
                f"scratch ({what})"
            ), FailureReason.RESTARTED_FROM_SCRATCH)
        if observed > expected:
            return check(False, (
                f"resumed from step {observed}, expected step {expected} — the job resumed "
                "from a checkpoint newer than expected"
            ), FailureReason.RESUMED_FROM_UNEXPECTED_CHECKPOINT)
        if observed in completed:
            alt = (
                "" if resume.loaded is not None
                else " (or it loaded a newer one and redid steps: call checkpoint_loaded "
                "to tell them apart)"
            )
            return check(False, (
                f"resumed from step {observed}, expected step {expected} — the job resumed "
                f"from an older checkpoint{alt}"
            ), FailureReason.RESUMED_FROM_OLDER_CHECKPOINT)
        if resume.loaded is not None:
            return check(False, (
                f"loaded checkpoint {observed}, expected step {expected} — no checkpoint of "
                f"step {observed} was completed (completed: {_steps(completed)})"
            ), FailureReason.RESUMED_FROM_UNEXPECTED_CHECKPOINT)
        above = [c for c in completed if c > observed]
        return check(False, (
            f"resumed from step {observed}, expected step {expected} — no checkpoint exists "
            f"at step {observed}, so steps {observed + 1}–{above[0] if above else expected} "
            "were done again (a resume off by one, such as range(stored_epoch, …)?)"
        ), FailureReason.STEPS_REPLAYED)

    def _no_progress_checks(
        self, inc: _Inc, expected: int | None, ended: str, finished_ok: bool
    ) -> list[Check]:
        if inc.loaded is None:
            if finished_ok:
                return [Check(
                    "resume_step", None, expected, None,
                    "inconclusive: the job finished right after it came back, before any "
                    "training step; lengthen the run", FailureReason.INCONCLUSIVE,
                )]
            return [Check(
                "resume_step", False, expected, None,
                f"never came back: a new incarnation started but reported no training step "
                f"— {ended}", FailureReason.NEVER_CAME_BACK,
            )]
        checks: list[Check] = []
        if expected is not None and inc.loaded != expected:
            checks.append(Check(
                "resume_step", False, expected, inc.loaded,
                f"loaded checkpoint {inc.loaded}, expected step {expected}",
                FailureReason.RESTARTED_FROM_SCRATCH if inc.loaded == 0
                else FailureReason.RESUMED_FROM_OLDER_CHECKPOINT if inc.loaded < expected
                else FailureReason.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
            ))
        if finished_ok:
            checks.append(Check(
                "progress_after_resume", None, f"a step after {inc.loaded}", None,
                "inconclusive: the job finished right after resuming, before any step past "
                f"checkpoint {inc.loaded}; lengthen the run", FailureReason.INCONCLUSIVE,
            ))
        else:
            checks.append(Check(
                "progress_after_resume", False, f"a step after {inc.loaded}", None,
                f"training stopped progressing after resuming from step {inc.loaded} ({ended})",
                FailureReason.STOPPED_PROGRESSING,
            ))
        return checks

    def _lost(self, resume: _Resume) -> tuple[int | None, int | None]:
        """(proven, upper bound) of the steps done before the kill and done again after it."""
        if resume.step is None:
            return None, None
        proven, bound = self._last_before_kill()
        lo = None if proven is None else max(proven - resume.step, 0)
        hi = None if bound is None else max(bound - resume.step, 0)
        return lo, hi

    def _lost_check(self, lost: tuple[int | None, int | None], limit: int) -> Check:
        lo, hi = lost
        observed = lo if hi is None or hi == lo else f"{lo}–{hi}"
        if hi is not None and hi <= limit:
            return Check("lost_steps", True, f"<= {limit}", observed,
                         f"lost {observed} step(s) (limit {limit})")
        if lo is not None and lo > limit:
            return Check("lost_steps", False, f"<= {limit}", observed,
                         f"lost too many steps: {lo} > {limit}"
                         + (f" (at most {hi})" if hi is not None and hi != lo else ""),
                         FailureReason.LOST_TOO_MANY_STEPS)
        span = "an unknown number of" if lo is None else (
            f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        )
        return Check(
            "lost_steps", None, f"<= {limit}", observed,
            f"the job lost {span} steps against a limit of {limit}: the last step before the "
            "kill is not known precisely enough; report progress on every step "
            "(RECOVERYGATE_PROGRESS_INTERVAL=0) so it is",
            FailureReason.INCONCLUSIVE,
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
        lost: tuple[int | None, int | None] = (None, None),
        resume: _Resume | None = None,
        judged: _Inc | None = None,
        expected: int | None = None,
    ) -> list[Action]:
        self.note(now, "verdict", f"{verdict.value}: {summary}")
        self.result = self._result(
            now, verdict, summary, checks, recovery=recovery, lost=lost, resume=resume,
            judged=judged, expected=expected,
        )
        self._move(Phase.DONE)
        return [Finish(self.result)]

    def _breakdown(self, judged: _Inc | None) -> dict[str, float | None]:
        kill = self.kill_time
        if kill is None:
            return {}
        seen = self._group_seen
        scheduled = [
            seen[k] for k in (GroupEventKind.RESTARTING, GroupEventKind.REPLACEMENT_PENDING)
            if k in seen
        ]
        times: dict[str, float | None] = {
            "failureDetected": seen.get(GroupEventKind.WORKER_GONE),
            "replacementScheduled": min(scheduled) if scheduled else None,
            "replacementRunning": seen.get(GroupEventKind.REPLACEMENT_RUNNING),
            "processStarted": None,
            "firstReport": None,
            "checkpointLoaded": None,
            "firstStepAfterResume": None,
        }
        if judged is not None:
            times["processStarted"] = judged.start_time
            times["firstReport"] = judged.first_line
            times["checkpointLoaded"] = judged.loaded_at
            if judged.first is not None and self._resume is not None:
                times["firstStepAfterResume"] = judged.first[1]
        relative = {
            k: (round(v - kill, 6) if v is not None else None) for k, v in times.items()
        }
        order = sorted(
            BREAKDOWN_PHASES,
            key=lambda k: (relative[k] is None, relative[k] or 0.0, BREAKDOWN_PHASES.index(k)),
        )
        return {k: relative[k] for k in order}

    def _notes(self, contract: StepContract, resume: _Resume | None) -> tuple[str, ...]:
        notes: list[str] = []
        if contract.resumed_from is not None:
            notes.append(f"the job resumed from step {contract.resumed_from} when the drill "
                         "started (a checkpoint left by an earlier run)")
        notes += [e.detail for e in self._timeline if e.kind == "note"
                  and "waiting for" in e.detail]
        if resume is not None and resume.undecided and resume.step is not None:
            notes.append(resume.undecided)
        return tuple(dict.fromkeys(notes))

    def _result(
        self,
        now: float,
        verdict: Verdict,
        summary: str,
        checks: tuple[Check, ...],
        *,
        recovery: float | None = None,
        lost: tuple[int | None, int | None] = (None, None),
        resume: _Resume | None = None,
        judged: _Inc | None = None,
        expected: int | None = None,
    ) -> DrillResult:
        proven, bound = self._last_before_kill()
        contract = self._contract()
        if expected is None and self.kill_time is not None:
            expected = self._expected(judged or self._candidate())[0]
        return DrillResult(
            verdict=verdict,
            summary=summary,
            checks=checks,
            resume_step=resume.step if resume is not None else None,
            expected_resume_step=expected if self.kill_time is not None else None,
            loaded_step=(
                resume.loaded if resume is not None
                else judged.loaded if judged is not None else None
            ),
            last_step_before_kill=proven,
            last_step_before_kill_upper_bound=bound,
            lost_steps=lost[0],
            lost_steps_upper_bound=lost[1],
            recovery_time_seconds=round(recovery, 6) if recovery is not None else None,
            restarts=self._restarts(),
            trigger_checkpoint=self.trigger_step,
            kill_time=self.kill_time,
            judged_incarnation=judged.id if judged is not None else None,
            step_contract=contract if contract.first_step is not None else None,
            notes=self._notes(contract, resume),
            incarnations=tuple(inc.info() for inc in self._order),
            checkpoints=tuple((c.step, c.time) for c in self._checkpoints),
            breakdown=self._breakdown(judged),
            timeline=tuple(sorted(self._timeline, key=lambda e: e.timestamp)),
            started_at=self.started_at,
            finished_at=now,
        )
