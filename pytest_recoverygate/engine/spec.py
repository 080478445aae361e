"""What a drill asks for, in plain values: the engine's view of a validated config (shared by
the engine, the judging and the schema, below all three).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from pytest_recoverygate.engine.model import NODE_FAULTS
from pytest_recoverygate.engine.storage import StorageSpec
from pytest_recoverygate.engine.verdict import format_seconds

__all__ = [
    "DETECTED_FAULTS",
    "FAULTS",
    "MAX_KILLS",
    "Delay",
    "DrillSpec",
    "ReplayMode",
    "ReplaySpec",
    "StickySpec",
    "Sustain",
]


#: Fault types the engine knows (backends declare which of them they can carry out).
FAULTS = (
    "KillWorker",
    "KillStep",
    "Requeue",
    "KillDuringCheckpoint",
    "Preempt",
    "HangWorker",
    "KillNode",
    "PartitionNode",
    "DrainNode",
    "StorageFault",
    "KillDuringRecovery",
    "StickyFault",
)


#: Faults whose detection by the job is timed and checked (``maxDetectionTime``).
DETECTED_FAULTS = ("HangWorker", "PartitionNode")


#: ``count: untilBudgetExhausted`` stops here, inconclusive, if the job never gives up.
MAX_KILLS = 50


@dataclass(frozen=True, slots=True)
class Delay:
    """When the kill lands after its trigger checkpoint.

    ``seconds``: that long after it; ``fraction``: that fraction of the measured checkpoint
    interval (of the measured save time for KillDuringCheckpoint); ``before_next``: just
    before the next save is due; ``spread``: the N kills of ``count: N`` at 0, 1/N, 2/N …
    of the interval.
    """

    kind: Literal["seconds", "fraction", "before_next", "spread"] = "seconds"
    value: float = 0.0
    explicit: bool = False  # given in the config (KillDuringCheckpoint has its own default)

    def describe(self) -> str:
        if self.kind == "seconds":
            return format_seconds(self.value)
        if self.kind == "fraction":
            return f"{self.value:.0%}"
        return "beforeNextCheckpoint" if self.kind == "before_next" else "spread"


@dataclass(frozen=True, slots=True)
class Sustain:
    """How long a recovered job must keep training before it PASSes (``sustain``).

    The window opens at the replacement's first step past the resume step. It is held
    once ``lines`` further progress lines advanced the step, ``seconds`` passed and, with
    ``steps``, the job trained that many steps past the resume step. The default is the
    larger of 3 progress lines and 10 s. A stall inside it (no advancing line for the
    stall limit) FAILs "stopped progressing after resume".
    """

    lines: int = 3
    seconds: float = 10.0
    steps: int | None = None

    def describe(self) -> str:
        if self.steps is not None:
            return f"{self.steps} steps"
        if self.lines <= 1:
            return format_seconds(self.seconds)
        return f"{self.lines} progress lines and {format_seconds(self.seconds)}"


ReplayMode = Literal["report", "exact", "tolerance"]


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    """``expectations.replay`` in plain values (``mode`` report, exact or tolerance)."""

    mode: ReplayMode = "report"
    rtol: float = 0.0
    atol: float = 0.0
    max_divergent_steps: int = 0

    @property
    def judges(self) -> bool:
        """Whether the comparison is a check of the verdict (not ``report``)."""
        return self.mode != "report"

    @property
    def allowance(self) -> int:
        return self.max_divergent_steps if self.mode == "tolerance" else 0

    def describe(self) -> str:
        if self.mode == "tolerance":
            return (
                f"|new - old| <= {self.atol:g} + {self.rtol:g} * |old| on all but "
                f"{self.max_divergent_steps} of the replayed steps"
            )
        if self.mode == "exact":
            return "every replayed step's loss equal to the killed run's"
        return "report only"

    def matches(self, old: float, new: float) -> bool:
        """Whether a replayed loss ``new`` matches the killed run's ``old`` (NaN matches
        only NaN; ``exact`` compares the bits, so -0.0 differs from 0.0)."""
        if math.isnan(old) or math.isnan(new):
            return math.isnan(old) and math.isnan(new)
        if self.mode != "tolerance":  # exact: the same bits (-0.0 is not 0.0)
            return old == new and math.copysign(1.0, old) == math.copysign(1.0, new)
        if math.isinf(old) or math.isinf(new):
            return old == new
        return abs(new - old) <= self.atol + self.rtol * abs(old)


@dataclass(frozen=True, slots=True)
class StickySpec:
    """``injectFailure`` of a StickyFault (engine.sticky), in plain values."""

    scope: str  # step | checkpoint | node
    at_step: int | None = None  # scope step: the step every incarnation dies at
    max_crash_loop: int = 3  # expectations.maxCrashLoop
    damage: str = "truncate"  # scope checkpoint: truncate | zero | flip
    gpus: int | None = None  # projection.gpus: a crash loop's cost at that scale
    mode: str = "kill"  # scope node: what the bad node does to the work on it: kill | hang
    after: float = 0.0  # scope node: seconds after a job process starts there


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
    fault: str = "KillWorker"
    target_rank: int | None = 1  # None: the rank that reports the save (KillDuringCheckpoint)
    delay: Delay = field(default_factory=Delay)
    grace_period: float = 30.0
    count: int | None = 1  # None: until the job's restart budget is exhausted
    restart_budget: int | None = None
    max_detection_time: float | None = None
    saved_on_preempt: bool = False
    state_digest_matches: bool = False
    sustain: Sustain = field(default_factory=Sustain)
    max_stall: float | None = None  # None: the ledger's stall limit (from the job's gaps)
    all_ranks: bool = False  # a rank that says nothing about its resume FAILs
    target_node: int | None = None  # node faults: None = the node of target_rank
    replace_node: bool = True  # KillNode: a replacement node starts
    partition_duration: float | None = None  # PartitionNode: None = until noticed
    drain_node: bool = False  # KillNode on SLURM: DRAIN the node too
    cordon: bool = False  # KillNode/DrainNode on Kubernetes: cordon it first
    # issue 23: the trigger on progress, and live recovery (see pytest_recoverygate.engine.live)
    recovery: str = "restart"  # "restart" | "live"
    after_step: int | None = None  # kill once this step was reported (instead of a checkpoint)
    target_replica: int | None = None
    max_survivor_stall: float | None = None
    max_rejoin_time: float | None = None  # None: max_recovery_time
    rejoin_from: str = "peer"
    # issue 33: expectations.replay and replaySteps (pytest_recoverygate.engine.rules.replay)
    replay: ReplaySpec = field(default_factory=ReplaySpec)
    replay_steps: int = 5
    # issue 41: how the job reports (engine/advice.py): None, reporter calls; "patterns" or
    # a preset's name, its own log lines (evidence:), so messages name its lines and knobs
    evidence: str | None = None
    # issue 40: StorageFault (pytest_recoverygate.engine.storage, engine.faulted)
    storage: StorageSpec | None = None
    # issue 43: KillDuringRecovery (pytest_recoverygate.engine.reentry)
    recovery_phase: str | None = None  # startup | rendezvous | checkpointLoad | firstInterval
    second_target: int | None = None  # None: the first kill's rank
    # issue 43: StickyFault (pytest_recoverygate.engine.sticky)
    sticky: StickySpec | None = None

    def stall_limit(self, rate: float | None) -> float:
        """StorageFault's ``maxStall``: as set, else the larger of 60 s and 10 step times
        (``rate``: steps per second, when known)."""
        if self.max_stall is not None:
            return self.max_stall
        return max(60.0, 10.0 / rate) if rate else 60.0

    @property
    def on_node(self) -> bool:
        """The fault hits a node: a node fault, or a StickyFault's node that stays bad."""
        sticky = self.sticky
        return self.fault in NODE_FAULTS or (sticky is not None and sticky.scope == "node")

    @property
    def effective_recovery_timeout(self) -> float:
        """When "never came back" is decided, in seconds after the kill."""
        if self.recovery_timeout is not None:
            return max(self.recovery_timeout, self.max_recovery_time)
        return self.max_recovery_time + self.recovery_grace
