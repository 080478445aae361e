"""The drill's domain values, shared by the engine, the runner and every backend.

Everything here is a frozen dataclass or an enum: no I/O, no third-party imports.
Timestamps are POSIX seconds (float, microsecond resolution) on the emitter's clock
for training events and on the drill's clock for everything else; both are the same
wall clock on one machine, and NTP-close across a cluster.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KILL",
    "Fault",
    "GroupEvent",
    "GroupEventKind",
    "KillOutcome",
    "KillResult",
    "LiveRecovery",
    "ReplicaSteps",
    "TimelineEntry",
    "TrainingEvent",
    "TrainingEventKind",
    "Worker",
    "Workload",
]


class TrainingEventKind(enum.Enum):
    """What a RECOVERYGATE/v1 line reported."""

    START = "start"
    PROGRESS = "progress"
    CHECKPOINT_STARTED = "checkpoint_started"
    CHECKPOINT_COMPLETED = "checkpoint_completed"
    CHECKPOINT_LOADED = "checkpoint_loaded"


@dataclass(frozen=True, slots=True)
class TrainingEvent:
    """One event read from the training job's output.

    ``incarnation`` is the reporter's per-process id: a restarted process has a new one,
    so a late line of the old process is never mistaken for the replacement.
    ``digest`` and ``digest_parts`` (checkpoint completed/loaded, when the job sent them)
    fingerprint the saved or loaded state: lower-case hex, parts as (name, digest) pairs
    sorted by name; see docs/state-digest.md. ``replica`` (start events) is the replica
    group of the process (torchft's ``REPLICA_GROUP_ID``); ``source`` (checkpoint loaded)
    is ``"peer"`` when the state was copied from a live replica (``peer``: its rank), else
    ``None`` (a checkpoint); see docs/torchft.md.
    """

    kind: TrainingEventKind
    timestamp: float
    incarnation: str
    step: int | None = None
    received: float | None = None
    rank: int | None = None
    pid: int | None = None
    host: str | None = None
    restart_count: int | None = None
    digest: str | None = None
    digest_parts: tuple[tuple[str, str], ...] = ()
    replica: int | None = None
    source: str | None = None
    peer: int | None = None


@dataclass(frozen=True, slots=True)
class Worker:
    """One worker instance of the job.

    ``instance_id`` changes whenever the worker is replaced (pod UID, ``pid@start_time``,
    ``jobid.step/pid``): a kill names an instance, never just a rank.
    """

    rank: int
    name: str
    instance_id: str
    node: str = ""
    details: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        where = f" on {self.node}" if self.node else ""
        return f"rank {self.rank} ({self.name}{where}, instance {self.instance_id})"


@dataclass(frozen=True, slots=True)
class Workload:
    """What discovery found: one job and its workers, sorted by rank."""

    job: str
    workers: tuple[Worker, ...]

    def by_rank(self, rank: int) -> Worker | None:
        for worker in self.workers:
            if worker.rank == rank:
                return worker
        return None


class GroupEventKind(enum.Enum):
    """A change in the worker group, as the orchestrator sees it.

    In the order a healthy recovery shows them::

        WORKER_GONE -> RESTARTING -> REPLACEMENT_PENDING -> REPLACEMENT_RUNNING
                                   \\-> JOB_FAILED (the job will not come back)

    ``JOB_SUCCEEDED``: the job ended on its own with success (torchrun exited 0, every
    pod Succeeded, the SLURM job COMPLETED); after a kill that means it finished training.
    """

    WORKER_GONE = "worker_gone"
    RESTARTING = "restarting"
    REPLACEMENT_PENDING = "replacement_pending"
    REPLACEMENT_RUNNING = "replacement_running"
    JOB_FAILED = "job_failed"
    JOB_SUCCEEDED = "job_succeeded"


@dataclass(frozen=True, slots=True)
class GroupEvent:
    """A group state change with the time the orchestrator observed it.

    ``restart_count`` is the number of group restarts seen so far, when the backend knows.
    """

    kind: GroupEventKind
    timestamp: float
    detail: str = ""
    worker: Worker | None = None
    restart_count: int | None = None


@dataclass(frozen=True, slots=True)
class Fault:
    """How to hit the target instance (``injectFailure.type`` and its parameters).

    ``KillWorker``, ``KillDuringCheckpoint``: SIGKILL (the second differs only in *when*).
    ``Preempt``: SIGTERM, then SIGKILL after ``grace_period`` if the instance still lives.
    ``HangWorker``: SIGSTOP (cleanup continues a stopped instance before anything else).
    ``KillStep``, ``Requeue``: SLURM's own ways (the step, the whole job).
    """

    type: str = "KillWorker"
    grace_period: float = 30.0

    @property
    def kills(self) -> bool:
        """A SIGKILL of the instance, whatever the timing."""
        return self.type in ("KillWorker", "KillDuringCheckpoint")


#: The default fault: SIGKILL, now.
KILL = Fault()


class KillOutcome(enum.Enum):
    """What happened when the drill tried to kill the target instance."""

    KILLED = "killed"  # the target instance received the kill
    DRY_RUN = "dry_run"  # the kill would be allowed; nothing was touched
    ALREADY_GONE = "already_gone"  # the instance no longer existed; nothing else was touched
    UNCONFIRMED = "unconfirmed"  # it cannot be known whether the kill happened


@dataclass(frozen=True, slots=True)
class KillResult:
    """The orchestrator's account of one kill attempt."""

    outcome: KillOutcome
    timestamp: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One timestamped line of the drill's timeline (for the report)."""

    timestamp: float
    kind: str
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReplicaSteps:
    """One replica group's committed steps around the kill (recovery: live).

    ``before``: its last committed step reported before the kill; ``at_rejoin``: its last
    before the replacement's first committed step; ``last``: its last seen at all;
    ``stall_seconds``: its longest gap between committed steps from the kill to the rejoin
    (the gaps spanning both included); ``target``: the replica the drill killed.
    """

    replica: int
    target: bool
    before: int | None
    at_rejoin: int | None
    last: int | None
    stall_seconds: float | None
    incarnations: int
    incs: tuple[str, ...] = ()  # its incarnation ids, oldest first


@dataclass(frozen=True, slots=True)
class LiveRecovery:
    """The figures of a live recovery (torchft: survivors train on, the replacement heals).

    ``rejoin_step``: the step of the state the replacement healed to (as ``resumeStep``
    is the loaded step); ``rejoin_source``: ``peer``, ``checkpoint``, ``scratch`` or
    ``None`` (unknown); ``phases``: seconds after the kill of the replacement's start,
    its heal and its first committed step; ``lost_throughput_steps``: steps the job did
    not make while the world was smaller (the survivors' rate before the kill x the
    missing replica's share of it over the rejoin time).
    """

    target_replica: int
    survivor_stall_seconds: float | None
    rejoin_time_seconds: float | None
    rejoin_step: int | None
    rejoin_source: str | None
    rejoin_peer: int | None
    survivors_kept_training: bool | None
    replicas: tuple[ReplicaSteps, ...] = ()
    phases: dict[str, float | None] = field(default_factory=dict)
    lost_throughput_steps: float | None = None
