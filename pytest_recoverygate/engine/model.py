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
    "NODE_FAULTS",
    "Fault",
    "GroupEvent",
    "GroupEventKind",
    "KillOutcome",
    "KillResult",
    "LiveRecovery",
    "Node",
    "ReplicaSteps",
    "StorageEvent",
    "StorageEventKind",
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
    CHECKPOINT_FAILED = "checkpoint_failed"
    CHECKPOINT_LOAD_STARTED = "checkpoint_load_started"
    POISONED = "poisoned"  # the reporter's own: a StickyFault's step ended this process


@dataclass(frozen=True, slots=True)
class TrainingEvent:
    """One event read from the training job's output.

    ``incarnation`` is the reporter's per-process id: a restarted process has a new one,
    so a late line of the old process is never mistaken for the replacement.
    ``digest`` and ``digest_parts`` (checkpoint completed/loaded, when the job sent them)
    fingerprint the saved or loaded state: lower-case hex, parts as (name, digest) pairs
    sorted by name; see docs/state-digest.md. ``ppid``, ``parent`` and ``world_size``
    (start events) say how the process was launched: ``parent`` is set for a subprocess
    or forked child of a process that had the reporter loaded, never for a worker its
    launcher started. ``replica`` (start events) is the replica
    group of the process (torchft's ``REPLICA_GROUP_ID``); ``source`` (checkpoint loaded)
    is ``"peer"`` when the state was copied from a live replica (``peer``: its rank), else
    ``None`` (a checkpoint); see docs/torchft.md. ``loss`` and ``data`` (progress, when
    the job passed them) are the step's loss and a fingerprint of its batch, compared
    with the killed run's by ``expectations.replay`` (docs/replay.md); ``loss_decimals``:
    the loss was read from a line the job printed with that many decimals. ``error``
    (checkpoint failed) is what the job said failed the save. ``thread`` (any event but
    start, when the writer says) numbers the thread of its process that printed it (the
    reporter: 0, or ``None``, for the first thread that printed a line, then 1, 2, ...):
    a metrics thread's progress lines are told from the training loop's checkpoint lines
    (docs/step-contract.md, "A metrics thread").
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
    ppid: int | None = None
    parent: str | None = None  # the incarnation that started this process, if it reported
    world_size: int | None = None
    replica: int | None = None
    source: str | None = None
    peer: int | None = None
    loss: float | None = None
    data: str | None = None
    loss_decimals: int | None = None
    error: str | None = None
    thread: int | None = None


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
    """What discovery found: one job and its workers, sorted by rank.

    ``started_at``: when the job started, where the backend knows (the drill's own launch
    of it): reporter lines stamped before it are no evidence of this run.
    """

    job: str
    workers: tuple[Worker, ...]
    started_at: float | None = None

    nodes: tuple[Node, ...] = ()

    def by_rank(self, rank: int) -> Worker | None:
        for worker in self.workers:
            if worker.rank == rank:
                return worker
        return None

    def node(self, index: int) -> Node | None:
        """The node with that index (``injectFailure.targetNode``), or None."""
        for node in self.nodes:
            if node.index == index:
                return node
        return None

    def node_of(self, worker: Worker) -> Node | None:
        """The node that hosts ``worker`` (by instance, else by node name), or None."""
        for node in self.nodes:
            if any(w.instance_id == worker.instance_id for w in node.workers):
                return node
        for node in self.nodes:
            if worker.node and node.name == worker.node:
                return node
        return None


@dataclass(frozen=True, slots=True)
class Node:
    """One node of the job: what a host is to a real cluster (its processes, its local
    disk, its network), and the unit a node fault hits.

    ``index`` is what ``injectFailure.targetNode`` names: the node rank where the backend
    launches one agent per node (local: ``{nodeRank}``), else the node's position in the
    job's sorted node list. ``name`` is the host name the workers report (``Worker.node``).
    ``identity`` changes when the node is replaced (local: namespace name and creation
    time; SLURM: NodeName and slurmd boot; Kubernetes: the node's uid), the way
    ``Worker.instance_id`` changes when a worker is. ``workers`` are the job's instances
    on it when it was looked at; a node fault acts on each of them by identity (and on
    the node's own processes the backend knows, such as a torchrun agent), never on an
    instance of another node.
    """

    index: int
    name: str
    identity: str
    workers: tuple[Worker, ...] = ()
    details: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        ranks = ", ".join(str(w.rank) for w in self.workers) or "none"
        return f"node {self.index} ({self.name}, identity {self.identity}; ranks {ranks})"


class GroupEventKind(enum.Enum):
    """A change in the worker group, as the orchestrator sees it.

    In the order a healthy recovery shows them::

        WORKER_GONE -> RESTARTING -> REPLACEMENT_PENDING -> REPLACEMENT_RUNNING
                                   \\-> JOB_FAILED (the job will not come back)

    Node faults add: ``NODE_GONE`` (every process of the target node is gone: a KillNode
    landed; a StickyFault's bad node left the job: its agent ended), ``NODE_REPLACEMENT_STARTED``
    (a replacement node came up: fresh identity, same index), ``NODE_RESTORED`` (a
    PartitionNode's link is back). A StickyFault with ``scope: node`` adds
    ``BAD_NODE_PLACEMENT`` (the job placed work on the bad node: a worker group started
    there) and ``BAD_NODE_HIT`` (the drill killed or stopped that work, ``after`` seconds
    after it started), each with the placement's number (1: the work running there when
    the node went bad).

    ``JOB_SUCCEEDED``: the job ended on its own with success (torchrun exited 0, every
    pod Succeeded, the SLURM job COMPLETED); after a kill that means it finished training.
    """

    WORKER_GONE = "worker_gone"
    RESTARTING = "restarting"
    REPLACEMENT_PENDING = "replacement_pending"
    REPLACEMENT_RUNNING = "replacement_running"
    JOB_FAILED = "job_failed"
    JOB_SUCCEEDED = "job_succeeded"
    NODE_GONE = "node_gone"
    NODE_REPLACEMENT_STARTED = "node_replacement_started"
    NODE_RESTORED = "node_restored"
    BAD_NODE_PLACEMENT = "bad_node_placement"
    BAD_NODE_HIT = "bad_node_hit"


@dataclass(frozen=True, slots=True)
class GroupEvent:
    """A group state change with the time the orchestrator observed it.

    ``restart_count`` is the number of group restarts seen so far, when the backend knows;
    ``world_size`` the group's WORLD_SIZE (on REPLACEMENT_RUNNING), when it knows;
    ``placement`` the number of a placement on a StickyFault's bad node (BAD_NODE_*).
    """

    kind: GroupEventKind
    timestamp: float
    detail: str = ""
    worker: Worker | None = None
    restart_count: int | None = None
    world_size: int | None = None
    placement: int | None = None


@dataclass(frozen=True, slots=True)
class Fault:
    """How to hit the target instance (``injectFailure.type`` and its parameters).

    ``KillWorker``, ``KillDuringCheckpoint``: SIGKILL (the second differs only in *when*).
    ``Preempt``: SIGTERM, then SIGKILL after ``grace_period`` if the instance still lives.
    ``HangWorker``: SIGSTOP (cleanup continues a stopped instance before anything else).
    ``KillStep``, ``Requeue``: SLURM's own ways (the step, the whole job).

    Node faults (:data:`NODE_FAULTS`) hit every instance of one :class:`Node`:
    ``KillNode`` SIGKILLs all of them at once (``replace``: a replacement node with the
    same index starts; ``drain_node`` (SLURM) sets the node DRAIN, ``cordon``
    (Kubernetes) cordons it first, so the replacements land elsewhere);
    ``PartitionNode`` cuts the node's link for ``duration`` seconds (None: until the job
    noticed, or ``maxDetectionTime`` passed) while its processes keep running;
    ``DrainNode`` (Kubernetes) evicts the node's pods as ``kubectl drain`` does.
    """

    type: str = "KillWorker"
    grace_period: float = 30.0
    replace: bool = True
    duration: float | None = None
    drain_node: bool = False
    cordon: bool = False

    @property
    def kills(self) -> bool:
        """A SIGKILL of the instance, whatever the timing."""
        return self.type in ("KillWorker", "KillDuringCheckpoint")

    @property
    def on_node(self) -> bool:
        """A node fault: it hits a :class:`Node`, not one worker."""
        return self.type in NODE_FAULTS


#: The faults whose target is a node (every instance of it), not one worker instance.
NODE_FAULTS = ("KillNode", "PartitionNode", "DrainNode")


class StorageEventKind(enum.Enum):
    """What the storage layer over the job's checkpoint folder saw (StorageFault).

    ``FAILED``: the fault failed an operation; ``STALLED``: the fault holds operations (the
    first one); ``DELAYED``: the fault delays operations (the first one); ``WROTE``: a
    file closed after the job wrote to it (``size``: its size then); ``RENAMED`` (``to``:
    the new name; ``detail`` ``replaced`` when it replaced a file), ``REMOVED``,
    ``TRUNCATED`` (a file's contents cut: opened for truncation, or truncated shorter);
    ``AUDIT``: the drill read a file back after the fault was lifted
    (``detail``: ``ok``, ``missing``, ``short``, ``unreadable``, ``refused``; ``content``:
    the text of a small file).
    """

    FAILED = "failed"
    STALLED = "stalled"
    DELAYED = "delayed"
    WROTE = "wrote"
    RENAMED = "renamed"
    REMOVED = "removed"
    TRUNCATED = "truncated"
    AUDIT = "audit"


@dataclass(frozen=True, slots=True)
class StorageEvent:
    """One thing the storage layer (or the drill's audit) saw, stamped on this machine's
    clock. ``path`` is relative to the checkpoint folder; ``op`` the operation (``write``,
    ``fsync``, ``rename``, ``read``, ...); ``error`` its errno name (``ENOSPC``); ``pid``
    the process that made it, where the layer knows."""

    kind: StorageEventKind
    timestamp: float
    path: str = ""
    op: str = ""
    error: str = ""
    pid: int | None = None
    size: int | None = None
    first: float | None = None  # WROTE: its first write
    to: str = ""
    detail: str = ""
    content: str = ""


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
