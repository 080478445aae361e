"""The fake orchestrator: an in-memory simulated training job (``orchestrator: fake``).

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

The facade's methods are the drill's seams, each a delegation: discovery is
:mod:`.world`, each fault :mod:`.kill`, what follows a kill :mod:`.restart`, the lines the
job prints :mod:`.lines`; the job's shape is :mod:`.job`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_recoverygate.engine.model import (
    KILL,
    Fault,
    GroupEvent,
    KillOutcome,
    KillResult,
    Node,
    Worker,
    Workload,
)
from pytest_recoverygate.orchestrators.fake import kill as inject
from pytest_recoverygate.orchestrators.fake import world
from pytest_recoverygate.orchestrators.fake.job import Incarnation, SimulatedJob
from pytest_recoverygate.orchestrators.fake.lines import FakeEventSource, generate
from pytest_recoverygate.orchestrators.fake.losses import ReplayMode
from pytest_recoverygate.orchestrators.fake.restart import start_incarnation
from pytest_recoverygate.orchestrators.fake.spec import ResumeMode
from pytest_recoverygate.shared.joboutput import JobOutput, OutputSplitter

__all__ = ["FakeOrchestrator"]


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
        self._incarnations: list[Incarnation] = []
        self._checkpoints: list[int] = []
        self._source = FakeEventSource(self)
        self._running = False

    # ---------------------------------------------------------------- protocol

    def discover(self, deadline: float) -> Workload:
        self._maybe_raise("discover")
        if not self._running:
            start_incarnation(self, self.clock.now(), resume_step=0)
            self._running = True
        return world.workload(self)

    def kill(self, worker: Worker, *, dry_run: bool, fault: Fault = KILL) -> KillResult:
        self._maybe_raise("kill")
        return inject.kill_worker(self, worker, dry_run=dry_run, fault=fault)

    def current_worker(self, rank: int) -> Worker | None:
        return world.current_worker(self, rank)

    def current_node(self, index: int) -> Node | None:
        return world.current_node(self, index)

    def kill_node(self, node: Node, *, dry_run: bool, fault: Fault) -> KillResult:
        self._maybe_raise("kill")
        return inject.kill_node(self, node, dry_run=dry_run, fault=fault)

    def restore_node(self, node: Node) -> KillResult:
        self._maybe_raise("restore")
        return inject.restore_node(self, node)

    def watch_group(self) -> list[GroupEvent]:
        self._maybe_raise("watch_group")
        return super().watch_group()

    def events(self) -> FakeEventSource:
        return self._source

    def job_output(self) -> JobOutput:
        """What the simulated workers printed, per rank (see the module docstring)."""
        generate(self)
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
        return world.running(self)
