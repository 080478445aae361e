"""The fake backend: an in-memory simulated training job (``orchestrator: fake``).

It is a shipped adapter, not a test double: a new user runs a whole drill in seconds
with no infrastructure, and our own tests drive the engine and the runner through it on
a :class:`~pytest_recoverygate.registry.seams.SimulatedClock` (a drill over
simulated minutes takes milliseconds).

The simulated job: ``workers`` ranks train at ``steps_per_second``; rank 0 reports every
step and saves a checkpoint every ``checkpoint_every`` steps. When a worker is killed,
the group restarts after ``restart_delay`` and the new incarnation resumes according to
``resume``: ``latest`` (the last completed checkpoint), ``zero`` (from scratch),
``older`` (the checkpoint before the last one) or ``never`` (the job does not come back).
Events are generated lazily from the clock, so any clock works.

Every fault of the catalogue is simulated: a save takes ``save_time`` (announced with
``checkpoint_started``; training pauses meanwhile), so a KillDuringCheckpoint tears it
(with ``atomic_saves=False`` every restart then crashes loading the partial file);
Preempt is SIGTERM, after which a job with ``saves_on_sigterm`` saves its current step
and exits, and one without dies at the SIGKILL after the grace period; HangWorker stops
the rank, and the others notice after ``hang_timeout`` (the collective timeout); after
``max_restarts`` restarts the next failure ends the job. Checkpoint lines carry a state
digest (with parts); ``resume: fresh-optimizer`` loads the weights but not the optimizer.

Nodes: ``workload.nodes: N`` splits the ranks evenly over N simulated nodes
(``fake-node-0`` … with rank 0 on node 0; identity ``fake-node-K@G``, G counting the
node's replacements). ``KillNode`` ends every rank of the node at once (``NODE_GONE``);
with ``replace`` a replacement node (same index, next G) starts after half the
``restart_delay`` and the group restarts on it after the delay; without, the group
restarts on the surviving nodes with fewer ranks (``elastic``; a job that is not
elastic fails: its rendezvous never gets its nodes back). ``PartitionNode`` stalls the
whole group (a collective waits on the cut node) and the ranks notice after
``hang_timeout``; once the link is restored the agents re-rendezvous (``rejoined``, no
node replaced) and the group restarts after ``restart_delay``; a link restored before
anyone noticed lets the stalled collective finish and training simply goes on.

Faults for tests: ``raise_in`` maps a method name (``discover``, ``kill``,
``watch_group``, ``poll``, ``cleanup``) to an exception raised by that call, and
``kill_outcome`` forces what a kill reports; ``progress_before_step`` makes the job
report ``progress(step)`` before each step instead of after it (breaking the step
contract: a fresh start reports 0 first); ``start_events=False`` makes it print no start
lines (like a non-Python emitter) and ``loaded_events=False`` no ``checkpoint_loaded``
lines, so the drill infers the resume step from the replacement's first two lines.

Replica groups (``replicas: N``, for ``recovery: live``; docs/torchft.md): N replica
groups commit every step together, each group's rank 0 reporting with its ``replica``
on the start line (:class:`FakeLiveOrchestrator`). The killed group restarts after
``restart_delay`` and heals (``heal``: ``peer`` copies the survivors' state,
``checkpoint`` loads the last checkpoint, ``scratch`` starts over); the survivors commit
again after ``heartbeat_timeout`` (the lighthouse's), or, when ``min_replicas`` exceeds
them, only once the replacement rejoined.

What the simulated job prints (``job_output()``): rank 0's reporter lines for starts,
loads and checkpoints, and one line per rank for each kill and restart. ``output`` adds
text a worker printed after the kill, by label (``{"rank 1": "Traceback …"}``): how tests
give the fake job the output of a real failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import model_validator
from recoverygate import wire

from pytest_recoverygate.config.fields import option
from pytest_recoverygate.config.schema import (
    MAX_STEP,
    InjectFailure,
    Section,
    WorkloadBase,
    duration,
    node_count_field,
    refuse,
)
from pytest_recoverygate.engine.model import (
    KILL,
    Fault,
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    Node,
    TrainingEvent,
    TrainingEventKind,
    Worker,
    Workload,
)
from pytest_recoverygate.orchestrators.fake import losses
from pytest_recoverygate.orchestrators.fake.losses import ReplayMode
from pytest_recoverygate.registry.seams import Backend
from pytest_recoverygate.shared.joboutput import JobOutput, OutputSplitter

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.fake.live import FakeLiveOrchestrator
    from pytest_recoverygate.registry.seams import Clock

__all__ = [
    "BACKEND",
    "FakeEventSource",
    "FakeJobSpec",
    "FakeOrchestrator",
    "FakeWorkload",
    "SimulatedJob",
]

ResumeMode = Literal["latest", "zero", "older", "never", "fresh-optimizer"]


# ------------------------------------------------------------------ the config section


class FakeJobSpec(Section):
    """The simulated training job of ``orchestrator: fake`` (the whole block is optional)."""

    workers: int = option(2, "a whole number from 2 to 1024", "workers: 2", ge=2, le=1024)
    steps_per_second: float = option(
        50.0,
        "a number above 0 and at most 1000000",
        "stepsPerSecond: 50",
        gt=0,
        le=1_000_000,
        allow_inf_nan=False,
    )
    checkpoint_every: int = option(
        20, "a whole number >= 1 (steps)", "checkpointEvery: 20", ge=1, le=MAX_STEP
    )
    restart_delay: Annotated[float, duration()] = option(
        1.0, "a duration like 1s", "restartDelay: 1s"
    )
    resume: ResumeMode = option("latest", "latest, zero, older or never", "resume: latest")
    startup_delay: Annotated[float, duration()] = option(
        0.0, "a duration like 0s", "startupDelay: 0s"
    )
    save_time: Annotated[float, duration()] = option(
        0.0, "a duration: checkpoint_started -> completed", "saveTime: 0.2s"
    )
    atomic_saves: bool = option(
        True,
        "true or false (false: a torn save is loaded, and the restart crashes)",
        "atomicSaves: true",
    )
    saves_on_sigterm: bool = option(
        False, "true or false: save and exit on SIGTERM", "savesOnSigterm: true"
    )
    hang_timeout: Annotated[float, duration(zero_ok=False)] = option(
        1800.0,
        "a duration: when the other ranks notice a hung one (the collective timeout)",
        "hangTimeout: 10s",
    )
    max_restarts: int | None = option(
        None,
        "a whole number >= 0: the restarts the job survives (default: unlimited)",
        "maxRestarts: 3",
        ge=0,
        le=1000,
    )
    elastic: bool = option(
        True,
        "true or false: after a KillNode with replace: false, carry on with fewer nodes",
        "elastic: true",
    )
    replay: ReplayMode = option(
        "none",
        "none, exact, noise, data or spike: report each step's loss and batch, and how a "
        "replacement redoes them (fake/losses.py; expectations.replay)",
        "replay: exact",
    )
    replay_noise: float = option(
        1e-6, "a number >= 0 (replay: noise): relative", "replayNoise: 1e-6", ge=0, le=1
    )
    replay_spikes: int = option(
        2, "a whole number >= 0 (replay: spike)", "replaySpikes: 2", ge=0, le=1000
    )
    # replica groups (recovery: live): FakeLiveOrchestrator
    replicas: int | None = option(
        None,
        "a whole number from 2 to 64: torchft-style replica groups (recovery: live)",
        "replicas: 2",
        ge=2,
        le=64,
    )
    min_replicas: int = option(
        1,
        "a whole number >= 1 (replicas): the groups a step needs (torchft's min_replica_size)",
        "minReplicas: 1",
        ge=1,
        le=64,
    )
    heal: Literal["peer", "peer-unapplied", "checkpoint", "scratch"] = option(
        "peer",
        "peer, peer-unapplied, checkpoint or scratch (replicas): how the restarted group "
        "gets its state (peer-unapplied: healed, but its state digest is not the peer's)",
        "heal: peer",
    )
    heartbeat_timeout: Annotated[float, duration()] = option(
        2.0,
        "a duration (replicas): how long the survivors wait before training without "
        "the dead group (the lighthouse's heartbeat timeout)",
        "heartbeatTimeout: 2s",
    )


class FakeWorkload(WorkloadBase):
    """An in-memory simulated job: try the whole tool with no infrastructure."""

    orchestrator: Literal["fake"] = option(..., "fake", "orchestrator: fake")
    fake: FakeJobSpec = option(
        ...,
        "a mapping of the fake job's settings",
        "fake: {workers: 2}",
        default_factory=FakeJobSpec,
    )
    nodes: int = node_count_field()

    @model_validator(mode="after")
    def _reporting_rank_exists(self) -> FakeWorkload:
        self._rank_exists(self.reporting_rank, "reportingRank")
        if self.fake.workers % self.nodes:
            raise refuse(
                f"does not divide the job's {self.fake.workers} workers (fake.workers) "
                "evenly: every simulated node runs the same number of ranks",
                f"a divisor of {self.fake.workers}",
                f"set fake.workers to a multiple of {self.nodes}",
                key=("nodes",),
                got=str(self.nodes),
            )
        return self

    def node_count(self) -> int:
        return self.nodes

    def check_failure(self, failure: InjectFailure) -> None:
        if failure.target_rank is not None:
            self._rank_exists(failure.target_rank, "targetRank")

    def _rank_exists(self, rank: int, key: str) -> None:
        if rank >= self.fake.workers:
            raise refuse(
                f"rank {rank} does not exist in a job of {self.fake.workers} workers",
                f"a rank from 0 to {self.fake.workers - 1}",
                key=(key,),
                got=str(rank),
            )


# ------------------------------------------------------------------ the simulated job


@dataclass
class _Incarnation:
    number: int
    start: float
    resume_step: int
    first_step_at: float
    killed_at: float | None = None
    emitted: list[TrainingEvent] = field(default_factory=list)
    next_step: int = 0
    start_emitted: bool = False
    load_emitted: bool = False
    crashes_at: float | None = None  # it dies loading a torn checkpoint
    progress_sent: int = -1  # the last step whose progress line was generated
    started_sent: int = -1  # the last step whose checkpoint_started line was generated
    final_save: tuple[int, float] | None = None  # (step, completed at): a save on SIGTERM
    ranks: int = 0  # how many ranks it runs

    @property
    def inc_id(self) -> str:
        return f"fake-incarnation-{self.number}"


class FakeEventSource:
    """The simulated job's reporter lines, generated up to the clock's now."""

    def __init__(self, owner: FakeOrchestrator) -> None:
        self._owner = owner
        self.closed = False

    def poll(self) -> list[TrainingEvent]:
        self._owner._maybe_raise("poll")
        if self.closed:
            return []
        return self._owner._generate()

    @property
    def malformed_lines(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


@dataclass(eq=False, kw_only=True)
class SimulatedJob:
    """What both fake orchestrators simulate alike, with ``workload.fake``'s defaults:
    ``workers`` ranks on ``clock`` training at ``steps_per_second``, a checkpoint every
    ``checkpoint_every`` steps, a restart ``restart_delay`` after a kill and the first
    step ``startup_delay`` after a start; the group events it foresees, which
    ``watch_group`` hands out once they are due."""

    name = "fake"

    clock: Clock
    workers: int = 2
    steps_per_second: float = 50.0
    checkpoint_every: int = 20
    restart_delay: float = 1.0
    startup_delay: float = 0.0

    def __post_init__(self) -> None:
        self._group_events: list[GroupEvent] = []  # foreseen, handed out once they are due

    def watch_group(self) -> list[GroupEvent]:
        now = self.clock.now()
        due = [e for e in self._group_events if e.timestamp <= now]
        self._group_events = [e for e in self._group_events if e.timestamp > now]
        return due


@dataclass(eq=False, kw_only=True)
class FakeOrchestrator(SimulatedJob):
    """A simulated distributed training job that a drill can kill."""

    resume: ResumeMode = "latest"
    raise_in: dict[str, BaseException] = field(default_factory=dict)
    kill_outcome: KillOutcome | None = None
    progress_before_step: bool = False
    start_events: bool = True
    loaded_events: bool = True
    output: Mapping[str, str] = field(default_factory=dict)
    save_time: float = 0.0
    atomic_saves: bool = True
    saves_on_sigterm: bool = False
    hang_timeout: float = 1800.0
    max_restarts: int | None = None
    nodes: int = 1
    elastic: bool = True
    replay: ReplayMode = "none"  # fake/losses.py
    replay_noise: float = 1e-6
    replay_spikes: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        workers, nodes = self.workers, self.nodes
        if nodes < 1 or workers % nodes:
            raise ValueError(f"{workers} workers do not split evenly over {nodes} nodes")
        self.per_node = workers // nodes
        self.raise_in, self.output = dict(self.raise_in), dict(self.output)  # the caller's: copied
        self._nodes = list(range(nodes))  # the node indexes the group runs on now
        self._generation = dict.fromkeys(range(nodes), 0)  # replacements of each node
        self._multi = nodes > 1
        self._partition: tuple[int, float, float] | None = None  # (node, cut, noticed)
        self.restores: list[Node] = []  # every restore_node call
        self._dead: set[str] = set()  # instance ids a kill ended
        self.faults: list[Fault] = []  # the fault of every kill call
        self._torn: int | None = None  # a torn save a non-atomic job will load
        self._restarts = 0
        self._printed = OutputSplitter(lambda line: None, default="rank 0")
        self.kills: list[tuple[Worker, bool]] = []  # (worker, dry_run) for every kill call
        self.cleanups = 0
        self._incarnations: list[_Incarnation] = []
        self._checkpoints: list[int] = []
        self._source = FakeEventSource(self)
        self._running = False

    # ---------------------------------------------------------------- protocol

    def discover(self, deadline: float) -> Workload:
        self._maybe_raise("discover")
        if not self._running:
            self._start_incarnation(self.clock.now(), resume_step=0)
            self._running = True
        return self._workload()

    def kill(self, worker: Worker, *, dry_run: bool, fault: Fault = KILL) -> KillResult:
        self._maybe_raise("kill")
        self.kills.append((worker, dry_run))
        self.faults.append(fault)
        now = self.clock.now()
        self._generate()
        current = self._current()
        alive = current is not None and current.killed_at is None
        if not alive or worker.instance_id not in {w.instance_id for w in self._workload().workers}:
            return KillResult(KillOutcome.ALREADY_GONE, now, f"{worker.instance_id} is not running")
        if self.kill_outcome is not None:
            return KillResult(self.kill_outcome, now, "forced by the fake backend")
        if dry_run:
            return KillResult(KillOutcome.DRY_RUN, now, f"would kill {worker.describe()}")
        assert current is not None
        if fault.type == "Preempt":
            return self._preempt(current, worker, now, fault.grace_period)
        if fault.type == "HangWorker":
            current.killed_at = now  # stopped: it prints nothing more
            self._after_kill(now + self.hang_timeout, worker, how="hung (SIGSTOP)")
            return KillResult(KillOutcome.KILLED, now, f"stopped {worker.describe()}")
        current.killed_at = now
        self._dead.add(worker.instance_id)
        self._tear(current, now)
        self._after_kill(now, worker)
        return KillResult(KillOutcome.KILLED, now, f"killed {worker.describe()}")

    def current_worker(self, rank: int) -> Worker | None:
        current = self._current()
        if not self._running or current is None or current.killed_at is not None:
            return None
        if current.start > self.clock.now():
            return None  # the replacement is not running yet
        return self._workload().by_rank(rank)

    def current_node(self, index: int) -> Node | None:
        current = self._current()
        if not self._running or current is None or index not in self._nodes:
            return None
        if current.start > self.clock.now() or (
            current.killed_at is not None and self._partition is None
        ):
            return None  # its group is down (a replacement not started yet)
        return self._workload().node(index)

    def kill_node(self, node: Node, *, dry_run: bool, fault: Fault) -> KillResult:
        self._maybe_raise("kill")
        self.faults.append(fault)
        for worker in node.workers:
            self.kills.append((worker, dry_run))
        now = self.clock.now()
        self._generate()
        current = self._current()
        live = self._workload().node(node.index)
        if (
            current is None
            or current.killed_at is not None
            or live is None
            or live.identity != node.identity
            or not {w.instance_id for w in node.workers} <= {w.instance_id for w in live.workers}
        ):
            return KillResult(
                KillOutcome.ALREADY_GONE, now, f"{node.describe()} is not the node running now"
            )
        if self.kill_outcome is not None:
            return KillResult(self.kill_outcome, now, "forced by the fake backend")
        verb = "cut the link of" if fault.type == "PartitionNode" else "kill every rank of"
        if dry_run:
            return KillResult(KillOutcome.DRY_RUN, now, f"would {verb} {node.describe()}")
        if fault.type == "PartitionNode":
            current.killed_at = now  # the group stalls in a collective with the cut node
            noticed = now + self.hang_timeout
            self._partition = (node.index, now, noticed)
            gone = node.workers[0] if node.workers else None
            self._group_events += [
                GroupEvent(
                    GroupEventKind.WORKER_GONE,
                    noticed,
                    f"a collective timed out after {self.hang_timeout:g}s (the link of "
                    f"{node.name} is cut)",
                    gone,
                ),
                GroupEvent(GroupEventKind.RESTARTING, noticed + 0.05, "re-rendezvous", None),
            ]
            return KillResult(KillOutcome.KILLED, now, f"cut the link of {node.describe()}")
        current.killed_at = now
        self._dead.update(w.instance_id for w in node.workers)
        self._tear(current, now)
        self._group_events.append(
            GroupEvent(
                GroupEventKind.NODE_GONE,
                now + 0.05,
                f"every process of {node.name} is gone ({len(node.workers)} rank(s))",
                node.workers[0] if node.workers else None,
            )
        )
        if fault.replace:
            self._generation[node.index] += 1
            self._group_events.append(
                GroupEvent(
                    GroupEventKind.NODE_REPLACEMENT_STARTED,
                    now + self.restart_delay / 2,
                    f"replacement node fake-node-{node.index}@{self._generation[node.index]}",
                )
            )
        elif self.elastic:
            self._nodes.remove(node.index)
            self.workers = self.per_node * len(self._nodes)
        else:
            self._group_events.append(
                GroupEvent(
                    GroupEventKind.JOB_FAILED,
                    now + self.restart_delay,
                    f"the rendezvous never got {len(self._nodes)} nodes back (not elastic)",
                )
            )
            return KillResult(KillOutcome.KILLED, now, f"killed every rank of {node.describe()}")
        victim = node.workers[0] if node.workers else self._workload().workers[0]
        self._after_kill(now, victim, how=f"died with its node {node.name}")
        return KillResult(KillOutcome.KILLED, now, f"killed every rank of {node.describe()}")

    def restore_node(self, node: Node) -> KillResult:
        self._maybe_raise("restore")
        self.restores.append(node)
        now = self.clock.now()
        partition = self._partition
        if partition is None or partition[0] != node.index:
            return KillResult(KillOutcome.ALREADY_GONE, now, f"{node.name} is not cut off")
        self._partition = None
        index, cut, noticed = partition
        self._group_events.append(
            GroupEvent(GroupEventKind.NODE_RESTORED, now, f"the link of {node.name} is back")
        )
        current = self._current()
        assert current is not None
        if now < noticed:  # nobody timed out yet: the stalled collective just finishes
            self._group_events = [e for e in self._group_events if e.timestamp < noticed]
            current.killed_at = None
            current.first_step_at += now - cut
            return KillResult(KillOutcome.KILLED, now, f"restored the link of {node.name}")
        victim = self._workload().node(index)
        worker = victim.workers[0] if victim and victim.workers else self._workload().workers[0]
        self._after_kill(now, worker, how="rejoined after the partition", gone=False)
        return KillResult(KillOutcome.KILLED, now, f"restored the link of {node.name}")

    def watch_group(self) -> list[GroupEvent]:
        self._maybe_raise("watch_group")
        return super().watch_group()

    def events(self) -> FakeEventSource:
        return self._source

    def job_output(self) -> JobOutput:
        """What the simulated workers printed, per rank (see the module docstring)."""
        self._generate()
        return self._printed.output(note="the fake job's simulated output, per rank")

    def cleanup(self) -> None:
        self.cleanups += 1
        self._partition = None  # every cut link restored
        self._running = False
        self._source.close()
        self._maybe_raise("cleanup")

    # ---------------------------------------------------------------- simulation

    def _maybe_raise(self, where: str) -> None:
        error = self.raise_in.get(where)
        if error is not None:
            raise error

    def running(self) -> set[str]:
        """The instance ids that run now, as the simulated world has them: an incarnation's
        workers run from its start until the next one starts, unless a kill ended them
        (how tests look at the world without asking discover)."""
        now = self.clock.now()
        started = [inc for inc in self._incarnations if inc.start <= now]
        if not self._running or not started:
            return set()
        inc = started[-1]
        return {f"fake-{rank}-{inc.number}" for rank in range(inc.ranks)} - self._dead

    def _host(self) -> str:
        """Where rank 0 runs (its reporter's ``host``)."""
        return f"fake-node-{self._nodes[0]}" if self._multi else "simulated"

    def _current(self) -> _Incarnation | None:
        return self._incarnations[-1] if self._incarnations else None

    def _workload(self) -> Workload:
        current = self._current()
        number = current.number if current else 0
        if not self._multi:
            workers = tuple(
                Worker(rank, f"fake-worker-{rank}", f"fake-{rank}-{number}", node="simulated")
                for rank in range(self.workers)
            )
            return Workload(job="fake-job", workers=workers)
        nodes = []
        for position, index in enumerate(self._nodes):
            name = f"fake-node-{index}"
            ranks = range(position * self.per_node, (position + 1) * self.per_node)
            on = tuple(
                Worker(rank, f"fake-worker-{rank}", f"fake-{rank}-{number}", node=name)
                for rank in ranks
            )
            nodes.append(Node(index, name, f"{name}@{self._generation[index]}", on))
        return Workload(
            job="fake-job",
            workers=tuple(w for node in nodes for w in node.workers),
            nodes=tuple(nodes),
        )

    def _start_incarnation(self, at: float, resume_step: int) -> None:
        load = 0.05 if resume_step > 0 else 0.0
        self._incarnations.append(
            _Incarnation(
                number=len(self._incarnations),
                start=at,
                resume_step=resume_step,
                first_step_at=at + self.startup_delay + load,
                next_step=resume_step + 1,
                ranks=self.workers,
            )
        )

    def _print(self, rank: int, text: str) -> None:
        self._printed.feed(text.encode("utf-8", "replace"), label=f"rank {rank}")

    def _step_at(self, inc: _Incarnation, step: int) -> float:
        """When ``step`` completes (synchronous saves pause training for ``save_time``)."""
        saves = (step - 1) // self.checkpoint_every - inc.resume_step // self.checkpoint_every
        return (
            inc.first_step_at
            + (step - inc.resume_step) / self.steps_per_second
            + max(saves, 0) * self.save_time
        )

    def _tear(self, inc: _Incarnation, now: float) -> None:
        """A kill during a save: that checkpoint never completes (and may be left torn)."""
        for step in (inc.next_step, inc.next_step - 1):  # the save in flight, if any
            if step > 0 and step % self.checkpoint_every == 0:
                started = self._step_at(inc, step) + 1e-4
                if started <= now < started + self.save_time and not self.atomic_saves:
                    self._torn = step

    def _preempt(self, inc: _Incarnation, worker: Worker, now: float, grace: float) -> KillResult:
        if self.saves_on_sigterm:
            step = max(inc.next_step - 1, inc.resume_step)
            done = now + max(self.save_time, 0.05)
            if done <= now + grace:
                inc.final_save = (step, done)
                self._checkpoints.append(step)  # durable before the replacement starts
                inc.killed_at = done
                self._after_kill(done, worker, how="exited after saving on SIGTERM")
                return KillResult(KillOutcome.KILLED, now, f"SIGTERM to {worker.describe()}")
        inc.killed_at = now + grace
        self._after_kill(now + grace, worker, how="killed by SIGKILL after the grace period")
        return KillResult(
            KillOutcome.KILLED, now, f"SIGTERM to {worker.describe()}; SIGKILL after {grace:g}s"
        )

    def _after_kill(
        self, now: float, worker: Worker, how: str = "was killed by SIGKILL", *, gone: bool = True
    ) -> None:
        self._print(worker.rank, f"[fake job] rank {worker.rank} ({worker.instance_id}) {how}\n")
        for label, text in self.output.items():
            self._printed.feed(text.encode("utf-8", "replace"), label=label)
        restart_at = now + self.restart_delay
        if gone:
            self._group_events += [
                GroupEvent(GroupEventKind.WORKER_GONE, now + 0.1, f"{worker.name} exited", worker),
                GroupEvent(GroupEventKind.RESTARTING, now + 0.15, "restarting the group", None, 1),
            ]
        if self.resume == "never":
            for rank in range(self.workers):
                self._print(rank, "[fake job] the group does not restart (resume: never)\n")
            return
        self._restarts += 1
        if self.max_restarts is not None and self._restarts > self.max_restarts:
            self._group_events.append(
                GroupEvent(
                    GroupEventKind.JOB_FAILED,
                    now + 0.2,
                    f"max restarts ({self.max_restarts}) exhausted",
                )
            )
            return
        self._group_events.append(
            GroupEvent(
                GroupEventKind.REPLACEMENT_RUNNING,
                restart_at,
                "all ranks running",
                world_size=self.workers,
            )
        )
        done = self._checkpoints
        if self._torn is not None:  # it loads the partial file and crashes, again and again
            self._start_incarnation(restart_at, resume_step=self._torn)
            self._incarnations[-1].crashes_at = restart_at + 0.5
            self._restart_crash_loop(restart_at + 0.5, worker)
            return
        if self.resume in ("latest", "fresh-optimizer"):
            step = done[-1] if done else 0
        elif self.resume == "older":
            step = done[-2] if len(done) >= 2 else 0
        else:
            step = 0
        self._start_incarnation(restart_at, resume_step=step)

    def _restart_crash_loop(self, at: float, worker: Worker) -> None:
        """Each restart dies loading the torn checkpoint, until the restarts run out."""
        while self.max_restarts is None or self._restarts < self.max_restarts:
            self._restarts += 1
            self._group_events.append(
                GroupEvent(
                    GroupEventKind.RESTARTING,
                    at + 0.05,
                    "restarting the group",
                    None,
                    self._restarts,
                )
            )
            at += self.restart_delay + 0.5
            if self._restarts > 20:
                break
        self._print(
            worker.rank,
            "[fake job] torch.load: PytorchStreamReader failed reading "
            "zip archive: failed finding central directory\n",
        )
        self._group_events.append(
            GroupEvent(
                GroupEventKind.JOB_FAILED,
                at,
                "the job failed: every restart crashed loading a truncated checkpoint",
            )
        )

    def _generate(self) -> list[TrainingEvent]:
        now = self.clock.now()
        out: list[TrainingEvent] = []
        for inc in self._incarnations:
            out += self._generate_for(inc, now)
        out.sort(key=lambda e: e.timestamp)
        return out

    def _generate_for(self, inc: _Incarnation, now: float) -> list[TrainingEvent]:
        out: list[TrainingEvent] = []
        end = now if inc.killed_at is None else min(now, inc.killed_at)
        if inc.crashes_at is not None:
            end = min(end, inc.crashes_at)

        def event(
            kind: TrainingEventKind,
            at: float,
            step: int | None,
            digest: tuple[tuple[str, str], ...] = (),
        ) -> TrainingEvent:
            loss, data = (None, None)
            if kind is TrainingEventKind.PROGRESS and step is not None:
                loss, data = losses.point(
                    self.replay,
                    step,
                    resumed_from=inc.resume_step if inc.number else None,
                    noise=self.replay_noise,
                    spikes=self.replay_spikes,
                )
            return TrainingEvent(
                kind,
                at,
                inc.inc_id,
                step=step,
                received=now,
                rank=0,
                pid=1000 + inc.number,
                host=self._host(),
                restart_count=inc.number,
                digest=wire.combine_parts(digest) if digest else None,
                digest_parts=digest,
                world_size=inc.ranks if kind is TrainingEventKind.START else None,
                loss=loss,
                data=data,
            )

        if not inc.start_emitted and inc.start <= end:
            inc.start_emitted = True
            if self.start_events:
                out.append(event(TrainingEventKind.START, inc.start, None))
            self._print_start(inc)
        load_at = inc.first_step_at - 0.01
        if inc.resume_step > 0 and not inc.load_emitted and load_at <= end:
            inc.load_emitted = True
            if self.loaded_events and inc.crashes_at is None:
                parts = _parts(inc.resume_step, fresh_optimizer=self.resume == "fresh-optimizer")
                out.append(
                    event(TrainingEventKind.CHECKPOINT_LOADED, load_at, inc.resume_step, parts)
                )
                self._print(
                    0,
                    wire.format_step(
                        "checkpoint_loaded", load_at, inc.inc_id, inc.resume_step, rank=0
                    ),
                )
        while inc.crashes_at is None:
            step = inc.next_step
            at = self._step_at(inc, step)
            if at > end:
                break
            if inc.progress_sent != step:
                reported = step - 1 if self.progress_before_step else step
                out.append(event(TrainingEventKind.PROGRESS, at, reported))
                inc.progress_sent = step
            if step % self.checkpoint_every == 0:
                started, done = at + 1e-4, at + 1e-4 + self.save_time
                if self.save_time > 0:
                    if started > end:
                        break
                    if inc.started_sent != step:
                        out.append(event(TrainingEventKind.CHECKPOINT_STARTED, started, step))
                        inc.started_sent = step
                if done > end:
                    if inc.killed_at is not None and inc.killed_at < done:
                        inc.next_step += 1  # torn by the kill: never completes
                    break
                out.append(event(TrainingEventKind.CHECKPOINT_COMPLETED, done, step, _parts(step)))
                self._checkpoints.append(step)
                self._print(
                    0, wire.format_step("checkpoint_completed", done, inc.inc_id, step, rank=0)
                )
            inc.next_step += 1
        if inc.final_save is not None and inc.final_save[1] <= now:
            step, done = inc.final_save
            inc.final_save = None
            out.append(event(TrainingEventKind.CHECKPOINT_COMPLETED, done, step, _parts(step)))
        return out

    def _print_start(self, inc: _Incarnation) -> None:
        """What an incarnation's processes print when they start."""
        if self.start_events:
            self._print(
                0,
                wire.format_start(
                    inc.start,
                    inc.inc_id,
                    pid=1000 + inc.number,
                    host=self._host(),
                    rank=0,
                    restart=inc.number,
                    world_size=inc.ranks,
                ),
            )
        for rank in range(self.workers):
            self._print(rank, f"[fake job] incarnation {inc.number} started\n")


def _parts(step: int, *, fresh_optimizer: bool = False) -> tuple[tuple[str, str], ...]:
    """The simulated state's digest parts after ``step`` steps (a fresh optimizer: empty)."""
    optimizer = "0" * 16 if fresh_optimizer else f"{(step * 7919) % 2**64:016x}"
    return (("model", f"{(step * 104729) % 2**64:016x}"), ("optimizer", optimizer))


#: The keys of ``workload.fake`` each fake orchestrator takes as keywords of the same name:
#: the replica groups' own go to the live one only, every other key to the solo one, and
#: the live one takes those of the job both simulate (SimulatedJob's) too.
_LIVE_ONLY = {"replicas", "min_replicas", "heal", "heartbeat_timeout"}
_SOLO_KEYS = set(FakeJobSpec.model_fields) - _LIVE_ONLY
_LIVE_KEYS = _LIVE_ONLY | {f.name for f in fields(SimulatedJob)} - {"clock"}


def _create(
    workload: FakeWorkload, failure: InjectFailure, clock: Clock
) -> FakeOrchestrator | FakeLiveOrchestrator:
    spec = workload.fake
    if spec.replicas is not None:
        from pytest_recoverygate.orchestrators.fake.live import FakeLiveOrchestrator

        return FakeLiveOrchestrator(
            clock=clock,
            target_replica=failure.target_replica if failure.target_replica is not None else 1,
            **spec.model_dump(include=_LIVE_KEYS),
        )
    return FakeOrchestrator(
        clock=clock, nodes=workload.nodes, **spec.model_dump(include=_SOLO_KEYS)
    )


#: The fake backend: its job lives inside one orchestrator object, so no other drill can
#: reach it and it needs no drill lock (fake drills may run side by side in one process).
BACKEND: Backend[FakeWorkload] = Backend(
    name="fake",
    workload=FakeWorkload,
    create=_create,
    faults=frozenset(
        {
            "KillWorker",
            "KillDuringCheckpoint",
            "Preempt",
            "HangWorker",
            "KillNode",
            "PartitionNode",
        }
    ),
    failure_keys=frozenset({"targetReplica"}),
    lock_scope=lambda workload, target: None,
    restart_budget=lambda workload: workload.fake.max_restarts,
    summary="an in-memory simulated job, on any clock",
)
