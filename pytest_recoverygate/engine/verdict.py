"""What a drill concludes: verdicts, checks, one record per recovery, the drill's result.

Plain frozen values with no behaviour beyond formatting, shared by the engine (which
builds them), the report, the CLI and the pytest plugin (which show them).

The policy, in one place (:class:`DrillResult` repeats it): every check is *passed*,
*failed* or *undecided*. FAIL when the evidence proves a check failed; ERROR marked
*inconclusive* when a check is undecided (the message says what would decide it); PASS
only when every check passed.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_recoverygate.engine.facts import Breach
from pytest_recoverygate.engine.model import LiveRecovery, TimelineEntry, Worker

__all__ = [
    "BREAKDOWN_PHASES",
    "EXIT_CODES",
    "Check",
    "DrillResult",
    "FailureReason",
    "IncarnationInfo",
    "Recovery",
    "StepContract",
    "Verdict",
    "combine",
    "format_seconds",
]


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


#: The CLI's exit code for each verdict (the one table; 2, invalid usage, is not a verdict
#: and lives with it as ``EXIT_USAGE``).
EXIT_CODES = {
    Verdict.PASS: 0,
    Verdict.DRY_RUN: 0,
    Verdict.FAIL: 1,
    Verdict.ERROR: 3,
    Verdict.INTERRUPTED: 130,
}
EXIT_USAGE = 2


class FailureReason(enum.Enum):
    """The named ways a recovery fails (and the one way the evidence cannot decide)."""

    RESTARTED_FROM_SCRATCH = "the job restarted from scratch"
    RESUMED_FROM_OLDER_CHECKPOINT = "the job resumed from an older checkpoint"
    RESUMED_FROM_UNEXPECTED_CHECKPOINT = "the job resumed from an unexpected checkpoint"
    STEPS_REPLAYED = "progress went backwards after the resume: steps were replayed"
    CHECKPOINT_NEVER_COMPLETED = "the expected checkpoint was never completed"
    STATE_DIFFERS = "the loaded state differs from the state that was saved"
    NEVER_CAME_BACK = "the job never came back"
    TOO_SLOW = "the job came back too slowly"
    LOST_TOO_MANY_STEPS = "the job lost too many steps"
    STOPPED_PROGRESSING = "training stopped progressing after resume"
    HANG_NOT_DETECTED = "the job did not notice the hung worker in time"
    NOT_SAVED_ON_PREEMPT = "no checkpoint was completed within the grace period"
    RESTART_BUDGET_MISMATCH = "the job's restart budget is not the expected one"
    HUNG_INSTEAD_OF_FAILING = "the job neither came back nor failed: it hangs"
    # recovery: live (pytest_recoverygate.engine.live)
    SURVIVORS_STALLED = "the surviving replicas stalled instead of training on"
    NEVER_REJOINED = "the killed replica never rejoined"
    REJOINED_FROM_CHECKPOINT = "the replacement loaded a checkpoint instead of healing from a peer"
    REJOINED_FROM_SCRATCH = "the replacement started from scratch instead of healing from a peer"
    HEALED_TO_OLDER_STEP = "the replacement healed to a step older than the survivors'"
    # expectations.replay (pytest_recoverygate.engine.rules.replay)
    REPLAY_DIVERGED = "the resumed job did not redo the killed run's steps the same way"
    # StorageFault (pytest_recoverygate.engine.rules.storage)
    SAVE_FAILURE_SWALLOWED = "a save the storage failed was counted or passed over in silence"
    LAST_GOOD_CHECKPOINT_DELETED = (
        "the job removed its last good checkpoint before the new one was durable"
    )
    STALLED_ON_STORAGE = "the job waited on its stalled storage instead of failing or going on"
    # KillDuringRecovery (pytest_recoverygate.engine.reentry)
    RECOVERY_NOT_REENTRANT = "a failure inside the recovery left the job unable to recover"
    # StickyFault (pytest_recoverygate.engine.sticky)
    CRASH_LOOP = "the job retried the same failure again and again"
    LOADED_CORRUPT_CHECKPOINT = "the job loaded a damaged checkpoint and trained on its state"
    NO_FALLBACK = "the job restarted from scratch though an older checkpoint was intact"
    BAD_NODE_REUSED = "the job kept placing work on a node that fails every time"
    INCONCLUSIVE = "the evidence cannot decide"


@dataclass(frozen=True, slots=True)
class Check:
    """One named check of the verdict with its expected and observed values.

    ``passed`` is ``True`` (proven), ``False`` (proven failed) or ``None`` (the evidence
    cannot decide; ``message`` says what would make it decidable). ``rule`` names the rule
    of the verdict that decided it (docs/verdict-rules.md). ``checked`` is
    ``False`` for a check that had nothing to verify (no rank said what it loaded): it
    neither passes nor fails the drill (``passed`` stays ``True``, so the verdict and
    the report's ``passed`` field read as before) and is shown as *not checked*.
    """

    name: str
    passed: bool | None
    expected: Any
    observed: Any
    message: str
    reason: FailureReason | None = None
    rule: str | None = None  # the rule that decided it (engine.rules.TABLE), when one did
    checked: bool = True

    @property
    def undecided(self) -> bool:
        return self.passed is None

    @property
    def status(self) -> str:
        """``passed``, ``failed``, ``undecided`` or ``unchecked`` (verified nothing)."""
        if not self.checked:
            return "unchecked"
        return {True: "passed", False: "failed", None: "undecided"}[self.passed]

    def as_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "passed": self.passed,
            "checked": self.checked,
            "status": self.status,
            "expected": self.expected,
            "observed": self.observed,
            "message": self.message,
            "reason": self.reason.name if self.reason else None,
        }
        if self.rule is not None:
            out["rule"] = self.rule
        return out


#: The recovery phases, each in seconds after the kill (reports list them by time):
#: failureDetected — the backend saw the target instance gone (for a hang: the job noticed);
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


def combine(checks: Sequence[Check], passed: str | None = None) -> tuple[Verdict, str]:
    """The one way checks become a verdict and its summary: any failed check FAILs (their
    messages), else any undecided one is an ERROR (each message said inconclusive), else
    PASS with ``passed`` (default: the messages of the checks that verified something)."""
    failed = [c for c in checks if c.passed is False]
    if failed:
        return Verdict.FAIL, "; ".join(c.message for c in failed)
    undecided = [c for c in checks if c.passed is None]
    if undecided:
        return Verdict.ERROR, "; ".join(
            c.message if c.message.startswith("inconclusive") else f"inconclusive: {c.message}"
            for c in undecided
        )
    if passed is None:
        passed = "; ".join(c.message for c in checks if c.checked)
    return Verdict.PASS, passed


def format_seconds(seconds: float) -> str:
    """A duration as people read it: ``4.05s``, ``3m30s``."""
    if seconds >= 120:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes)}m{rest:02.0f}s"
    return f"{seconds:.2f}s"


@dataclass(frozen=True, slots=True)
class StepContract:
    """What the first incarnation showed of the step contract.

    ``first_step`` and ``stride`` come from its first two progress lines; ``fresh_start``
    is ``None`` when the drill did not see the process start. ``breach`` is how the job
    breaks the contract, as the ledger found it (the verdict then cannot PASS);
    ``problem``, the sentence that words it for the result
    (:func:`pytest_recoverygate.engine.rules.wording.contract`), None until worded.
    ``metrics_thread``: its progress lines came only from threads that printed none of
    its checkpoint lines (:mod:`~pytest_recoverygate.engine.threads`), so where its first
    line fell against its first step was a race, not the contract.
    """

    first_step: int | None = None
    stride: int | None = None
    fresh_start: bool | None = None
    resumed_from: int | None = None
    problem: str | None = None
    grid: str = ""  # the reporting grid as learned from every line (grid.Grid.describe)
    regular: bool | None = None  # False: the lines keep no grid (irregular)
    first_special: bool = False  # the first step after a start, then a grid
    first_line_is_step: bool = False  # a process's first line comes after a step of it
    # issue 41: its progress came only from threads that printed none of its checkpoints
    metrics_thread: bool = False
    breach: Breach | None = None  # issue 44: the fact; ``problem`` is its wording

    def describe(self) -> str:
        if self.first_step is None:
            return "no progress seen before the kill"
        cadence = (
            "irregular (no reporting grid)"
            if self.regular is False
            else "stride unknown"
            if self.stride is None
            else ("the first step, then " if self.first_special else "")
            + ("every step" if self.stride == 1 else f"every {self.stride} steps")
        ) + (" from a metrics thread" if self.metrics_thread else "")
        start = (
            "a fresh start"
            if self.fresh_start
            else f"resumed from step {self.resumed_from}"
            if self.resumed_from is not None
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
            "grid": self.grid,
            "regular": self.regular,
            "firstLineIsStep": self.first_line_is_step,
            "metricsThread": self.metrics_thread,
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
    round: int = 0  # how many kills came before it was first seen
    parent: str | None = None  # the incarnation that started it, for a child of a worker
    child: bool = False  # a subprocess or forked child of a worker: never a replacement
    world_size: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "inc": self.inc,
            "rank": self.rank,
            "pid": self.pid,
            "host": self.host,
            "restart": self.restart,
            "new": self.new,
            "round": self.round,
            "firstSeen": self.first_seen,
            "started": self.started,
            "loadedStep": self.loaded_step,
            "firstStep": self.first_step,
            "lastStep": self.last_step,
            "parent": self.parent,
            "child": self.child,
            "worldSize": self.world_size,
        }


@dataclass(frozen=True, kw_only=True)
class _Figures:
    """The figures a kill (:class:`Recovery`) and a whole drill (:class:`DrillResult`)
    both report, given by keyword: the step the replacement resumed from and the one it
    should have, the steps lost (and their upper bound), the recovery time, the restarts.
    """

    resume_step: int | None = None
    expected_resume_step: int | None = None
    loaded_step: int | None = None
    last_step_before_kill: int | None = None
    last_step_before_kill_upper_bound: int | None = None
    lost_steps: int | None = None
    lost_steps_upper_bound: int | None = None
    recovery_time_seconds: float | None = None
    restarts: int | None = None


@dataclass(frozen=True, kw_only=True)
class _Judged(_Figures):
    """What a kill (:class:`Recovery`) and a whole drill (:class:`DrillResult`) both say
    of their judgement, given by keyword: the checks, the trigger checkpoint, the kill's
    time, the incarnation judged and the recovery's phases (``breakdown``)."""

    checks: tuple[Check, ...] = ()
    trigger_checkpoint: int | None = None
    kill_time: float | None = None
    judged_incarnation: str | None = None
    breakdown: dict[str, float | None] = field(default_factory=dict)

    @property
    def failed_checks(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if check.passed is False)

    @property
    def undecided_checks(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if check.passed is None)


@dataclass(frozen=True)
class Recovery(_Judged):
    """One injected failure and how the job came back from it (one per kill).

    Figures are those of :class:`DrillResult`, for this kill. ``fault`` is the injected
    failure type; ``position`` is where in the checkpoint interval the kill landed (0 right
    after a checkpoint, 1 just before the next one), when the interval is known.
    ``fault_details`` holds what each fault adds: ``intoSaveSeconds`` and ``saveSeconds``
    (KillDuringCheckpoint), ``savedStep`` and ``savedAfterSeconds`` (Preempt),
    ``detectionSeconds`` (HangWorker).
    """

    index: int
    fault: str
    verdict: Verdict
    summary: str
    delay_seconds: float | None = None
    position: float | None = None
    fault_details: dict[str, Any] = field(default_factory=dict)
    resume_basis: str | None = None  # checkpoint_loaded | inferred | unknown
    resume_upper_bound: int | None = None  # holds whatever the reporting grid
    sustained: dict[str, Any] | None = None  # the sustain window as it was held
    replay: dict[str, Any] | None = None  # expectations.replay's figures (engine/rules/replay.py)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "fault": self.fault,
            "verdict": self.verdict.value,
            "summary": self.summary,
            "triggerCheckpoint": self.trigger_checkpoint,
            "killTime": self.kill_time,
            "delaySeconds": self.delay_seconds,
            "position": self.position,
            "resumeStep": self.resume_step,
            "expectedResumeStep": self.expected_resume_step,
            "loadedStep": self.loaded_step,
            "lastStepBeforeKill": self.last_step_before_kill,
            "lastStepBeforeKillUpperBound": self.last_step_before_kill_upper_bound,
            "lostSteps": self.lost_steps,
            "lostStepsUpperBound": self.lost_steps_upper_bound,
            "recoveryTimeSeconds": self.recovery_time_seconds,
            "restarts": self.restarts,
            "judgedIncarnation": self.judged_incarnation,
            "breakdown": dict(self.breakdown),
            "faultDetails": dict(self.fault_details),
            "resumeStepBasis": self.resume_basis,
            "resumeStepUpperBound": self.resume_upper_bound,
            "sustained": self.sustained,
            "replay": self.replay,
            "checks": [c.as_dict() for c in self.checks],
        }


@dataclass(frozen=True)
class DrillResult(_Judged):
    """The outcome of one drill.

    Policy: PASS iff, for every kill, a new incarnation was seen, it resumed from the
    expected step, the recovery time is within ``maxRecoveryTime``, lost steps are within
    ``maxLostSteps`` (when set; the *upper* bound must be within it) and training
    progressed past the resume step (plus each fault's own expectations) — each proven by
    the evidence, on a job that keeps the step contract. FAIL names every check the
    evidence proves failed. ERROR is either *inconclusive* (``inconclusive`` is true: the
    evidence cannot decide, and the undecided checks say what would make it decidable) or
    a drill that could not be carried out. DRY_RUN means the flow ran minus the kill;
    INTERRUPTED means the user stopped it.

    The top-level figures are those of the first kill that did not pass, else of the last
    kill; ``recoveries`` holds every kill's. ``breakdown`` holds seconds since the kill for
    each recovery phase the backend could see, ``None`` for the ones it could not.
    """

    verdict: Verdict
    summary: str
    target: Worker | None = None
    step_contract: StepContract | None = None
    recoveries: tuple[Recovery, ...] = ()
    notes: tuple[str, ...] = ()
    incarnations: tuple[IncarnationInfo, ...] = ()
    checkpoints: tuple[tuple[int, float, str], ...] = ()  # (step, completed, incarnation)
    saves: tuple[tuple[int, float, float | None], ...] = ()  # (step, started, completed)
    costs: dict[str, Any] = field(default_factory=dict)
    timeline: tuple[TimelineEntry, ...] = ()
    malformed_lines: int = 0
    ignored_lines: int = 0  # lines stamped before the job started: not of this run
    progress: tuple[tuple[float, str, int], ...] = ()  # (time, incarnation, step) as seen
    started_at: float | None = None
    finished_at: float | None = None
    live: LiveRecovery | None = None  # recovery: live only (pytest_recoverygate.engine.live)

    @property
    def passed(self) -> bool:
        return self.verdict in (Verdict.PASS, Verdict.DRY_RUN)

    @property
    def headline(self) -> Recovery | None:
        """The recovery the top-level figures are of (the first that did not pass, else
        the last)."""
        judged = [r for r in self.recoveries if r.verdict is not Verdict.INTERRUPTED]
        return next(
            (r for r in judged if r.verdict is not Verdict.PASS),
            judged[-1] if judged else None,
        )

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    @property
    def replay(self) -> dict[str, Any] | None:
        """expectations.replay's figures of the headline recovery (engine/rules/replay.py)."""
        headline = self.headline
        return headline.replay if headline is not None else None

    @property
    def inconclusive(self) -> bool:
        """ERROR because the evidence cannot decide (not because the drill could not run)."""
        return self.verdict is Verdict.ERROR and any(c.undecided for c in self.checks)

    @property
    def reasons(self) -> tuple[FailureReason, ...]:
        """The reasons of the failed checks, then of the undecided ones."""
        checks = self.failed_checks + self.undecided_checks
        return tuple(dict.fromkeys(c.reason for c in checks if c.reason is not None))
