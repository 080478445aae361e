"""What the rules judge: one kill's record and the evidence a judgement reads (pure).

:class:`KillRecord` is what the state machine keeps of one kill while it waits (the
backend's group events, the replacement under judgement, its sustain :class:`Window`);
:class:`KillEvidence` is the evidence of one judgement, read once from the ledger and
the spec, that every rule of scope ``kill`` takes; :class:`DrillEvidence` the evidence of
the drill over its kills (scope ``drill``). The rules decide what the evidence proves;
the state machine decides when to judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_recoverygate.engine.badnode import BadNodeRecord
from pytest_recoverygate.engine.ledger import Ledger
from pytest_recoverygate.engine.model import GroupEventKind
from pytest_recoverygate.engine.records import Inc, Resume
from pytest_recoverygate.engine.spec import DrillSpec, StickySpec, Sustain
from pytest_recoverygate.engine.storage import StorageRecord
from pytest_recoverygate.engine.verdict import Recovery, StepContract, format_seconds

__all__ = [
    "ENDED_INSIDE_LINES",
    "DrillEvidence",
    "KillEvidence",
    "KillRecord",
    "StickyEvidence",
    "StorageEvidence",
    "Window",
    "ended_how",
]

#: A job that ends successfully inside the sustain window (exit 0, pod Succeeded, Slurm
#: COMPLETED, Ray SUCCEEDED) sustained its recovery once this many progress lines past the
#: resume advanced the step: it trained on, then finished.
ENDED_INSIDE_LINES = 3


@dataclass(slots=True)
class Window:
    """The sustain window of one judged replacement: its first step past the resume, the
    newest line that advanced the step, and how many did."""

    start: tuple[int, float]
    last: tuple[int, float]
    stall_limit: float
    lines: int = 0

    def held(self, sustain: Sustain, resume_step: int | None) -> bool:
        """Whether the recovery was held for the whole window."""
        if self.lines < sustain.lines or self.last[1] - self.start[1] < sustain.seconds:
            return False
        return sustain.steps is None or self.last[0] - (resume_step or 0) >= sustain.steps

    def ended_inside(self, sustain: Sustain, resume_step: int | None, succeeded: bool) -> bool:
        """Whether a job that ended successfully inside the window sustained its recovery:
        at least :data:`ENDED_INSIDE_LINES` (or the window's own line count, if larger)
        advancing progress lines past the resume, the first step past it included."""
        if not succeeded or self.held(sustain, resume_step):
            return False
        return self.lines + 1 >= max(ENDED_INSIDE_LINES, sustain.lines)


@dataclass(slots=True)
class KillRecord:
    """One kill under judgement and what the backend and the job showed since."""

    index: int
    step: int
    trigger_time: float
    time: float
    rank: int | None
    position: float | None = None
    group_seen: dict[GroupEventKind, float] = field(default_factory=dict)
    group_restarts: int = 0
    judged: Inc | None = None
    resume: Resume | None = None
    job_ended: tuple[float, str, bool] | None = None  # (time, detail, succeeded)
    detected: float | None = None  # HangWorker: when the job noticed
    details: dict[str, Any] = field(default_factory=dict)
    slipped: list[int] = field(default_factory=list)  # checkpoints between trigger and kill
    window: Window | None = None  # the sustain window, once it opened
    storage: StorageRecord | None = None  # StorageFault: the fault this recovery follows
    bad_node: BadNodeRecord | None = None  # StickyFault scope node: the node that stays bad


def ended_how(kill: KillRecord, now: float) -> str:
    if kill.job_ended is not None:
        _, detail, ok = kill.job_ended
        what = "the job finished" if ok else "the job failed"
        return f"{what} ({detail})" if detail else what
    return f"within {format_seconds(now - kill.time)} of the kill"


@dataclass(frozen=True, slots=True)
class KillEvidence:
    """The evidence of one kill's judgement (restart mode), read once for every rule.

    ``inc`` is the replacement judged (None: none came back); ``resume`` its resume as
    the ledger reads it and ``settled`` the same once the resume rule proved a restart
    from scratch whatever the grid (step 0); ``past`` its first step past the resume
    (None: it never trained past it); ``expected`` and ``floor`` the expected resume step
    and, with ``latest``, the newest checkpoint durable before it started; ``explicit``:
    ``expectations.resumeFromCheckpoint`` names the step (first kill only); ``final``:
    the drill's last word (a sustain window still open is undecided, not pending).
    """

    ledger: Ledger
    spec: DrillSpec
    kill: KillRecord
    inc: Inc | None
    resume: Resume | None
    contract: StepContract
    expected: int | None
    floor: int | None
    explicit: bool
    now: float
    final: bool
    ranks: Sequence[int]
    restarts: int
    past: tuple[int, float] | None = None
    settled: Resume | None = None

    @property
    def finished_ok(self) -> bool:
        """The job ended on its own with success."""
        return self.kill.job_ended is not None and self.kill.job_ended[2]

    @property
    def ended(self) -> str:
        """How the job ended, or how long after the kill it was judged."""
        return ended_how(self.kill, self.now)

    @property
    def trained(self) -> bool:
        """The replacement trained past its resume step (the resume can be judged)."""
        return self.inc is not None and self.resume is not None and self.past is not None

    @property
    def recovery_time(self) -> float | None:
        """From the kill to the replacement's first step past the resume."""
        return None if self.past is None else self.past[1] - self.kill.time


@dataclass(frozen=True, slots=True)
class DrillEvidence:
    """The evidence of the drill over its kills: each kill's :class:`Recovery`, the kill
    the job gave up on (index, time, detail), and the restart budget its launcher names."""

    spec: DrillSpec
    recoveries: Sequence[Recovery]
    gave_up: tuple[int, float, str] | None
    known_budget: int | None


@dataclass(frozen=True, slots=True)
class StorageEvidence:
    """The evidence of a StorageFault (scope ``storage``): its record, and how the job
    went on. ``restarted``: the job failed loudly or the drill killed it after the save
    (``killAfter``), so a recovery follows, judged by the ``kill`` rules; else ``window``
    is its training after the fault was lifted. ``stall_limit``: ``maxStall`` in effect
    (the larger of 60 s and 10 step times unless set)."""

    spec: DrillSpec
    record: StorageRecord
    now: float
    final: bool
    restarted: bool
    stall_limit: float
    window: Window | None = None


@dataclass(frozen=True, slots=True)
class StickyEvidence:
    """The evidence of a StickyFault with ``scope: step`` (scope ``sticky``): when the
    poison was armed, each death at the step (incarnation, time), the restarts the backend
    saw, how the job ended (time, detail, succeeded), the first step past the poisoned one
    the reporting rank reported, the judging time, and whether it is the last word."""

    spec: DrillSpec
    sticky: StickySpec
    armed_at: float
    deaths: tuple[tuple[str, float], ...]
    restarts: int
    ended: tuple[float, str, bool] | None
    past: tuple[int, float] | None
    now: float
    final: bool
