"""The seams every backend implements: Orchestrator, EventSource and Clock, and the
:class:`Backend` entry through which the registry knows a backend.

A backend is one module (or package) exporting one :class:`Backend` object: its name,
its ``workload`` section, the faults it can inject, a factory for its
:class:`Orchestrator` and what its drill lock covers (docs/backends.md). The
orchestrator is a class satisfying :class:`Orchestrator` (five drill methods plus
``events()`` for its event source). The runner drives it from a single loop, so every
method here is *non-blocking* except ``discover`` and ``kill``:

- ``discover(deadline)`` finds (or, for backends that launch the job, starts) the
  workload and returns its workers. It raises ``DiscoveryError`` for an ambiguous or
  unsafe target and may block until ``deadline`` (drill clock seconds).
- ``kill(worker, dry_run=..., fault=...)`` injects ``fault`` (a
  :class:`~pytest_recoverygate.engine.model.Fault`, one of the backend's ``Backend.faults``)
  into exactly that worker *instance* (never a replacement with the same rank) and
  returns a :class:`KillResult` stamped with the moment it acted. It is called once per
  kill of the drill (``count`` kills again only after a verified recovery, always with a
  freshly found instance) and must never retry in a way that could hit another instance.
  A Preempt's SIGKILL after the grace period goes to the same instance or to none. With
  ``dry_run=True`` it checks that the kill would be allowed and touches nothing.
- ``current_worker(rank)`` is that rank's instance as the backend sees it now (after a
  recovery: the replacement), or ``None`` when there is none running; never blocks long.
- ``watch_group()`` returns the group events observed since the previous call.
- ``events()`` returns the backend's :class:`EventSource` (same object every call).
- ``cleanup()`` releases everything the backend started; it may be called twice (and
  from two threads): decorate it with :func:`cleanup_once` and only the first call runs.

Backends that run threads call ``wakeup()`` (given at construction) when something new
arrives, so the runner reacts within milliseconds instead of a poll interval.

One optional method, :class:`JobOutputSource`: ``job_output()`` returns what the job
printed, per worker where the backend can tell them apart, each kept in bounded memory
(:mod:`pytest_recoverygate.shared.joboutput`). The runner calls it once, after ``cleanup()``
(so every byte the readers got is in), to keep the job's output in the report folder,
to show the failing worker's last lines and to diagnose known failure signatures. It
never blocks, never raises for a job that printed nothing (an empty :class:`JobOutput`),
and is safe to call after ``cleanup()``. Every shipped backend implements it; a backend
without it still works, its reports just carry no job output.

The node seam, :class:`NodeFaults`, is required of a backend whose ``Backend.faults``
name a node fault (``KillNode``, ``PartitionNode``, ``DrainNode``; docs/nodes.md):

- ``discover`` also fills ``Workload.nodes``: one :class:`~pytest_recoverygate.engine.model.Node`
  per node of the job (its index, name, identity and the workers on it), and each
  worker's ``node`` is its node's name;
- ``current_node(index)`` is that node as it is now (a replacement node after a
  KillNode with ``replace``), with the instances running on it, or None;
- ``kill_node(node, dry_run=..., fault=...)`` injects the node fault into every instance
  of that node, each by identity (and into the node's own processes the backend knows,
  such as a torchrun agent), never into an instance of another node; it returns one
  :class:`KillResult` for the whole node (KILLED when the node was hit; ALREADY_GONE when
  its identity is no longer the node's, or none of its instances still runs) and reports
  ``NODE_GONE`` through ``watch_group`` once every process of the node is gone;
- ``restore_node(node)`` ends a PartitionNode (the link back up), idempotent, and
  reports ``NODE_RESTORED``; ``cleanup()`` restores every cut link first, whatever else
  fails. A backend without PartitionNode returns ALREADY_GONE ("nothing to restore").

The bad-node seam, :class:`StickyNodes`, is what a backend offers for a StickyFault with
``scope: node`` (docs/faults.md): ``make_node_bad(node, dry_run=, mode=, after=)`` keeps
the node bad until cleanup (each job process on it killed or stopped, by identity) and
reports each placement there, each hit and the node leaving the job through
``watch_group``.

The storage seam, :class:`StorageScope`, is what a backend offers for a StorageFault
(docs/faults.md) when its ``workload`` section cannot say at config time which folders
the job uses (``WorkloadBase.storage_scope()`` returns None: a job the drill attaches
to, such as a Slurm job by id or name). The runner then mounts the storage layer after
discovery, not before it:

- ``storage_scope(target)`` returns the folders the running job can be shown to use (its
  working folder, the folders its command or script names), read from the backend; the
  fault's ``path`` must lie in one of them, or the drill is refused (``DiscoveryError``,
  nothing touched). It raises ``DiscoveryError`` itself, with the reason, when a mount
  made on the drill's machine would not cover the folder as ``target``'s processes see
  it (they run on another node, or in a mount namespace of their own). A StickyFault
  ``scope: checkpoint`` asks with ``mount=False``: it writes over the files the job's
  save wrote, and needs no mount.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from pytest_recoverygate.engine import model
from pytest_recoverygate.shared.clock import Clock, RealClock, SimulatedClock
from pytest_recoverygate.shared.joboutput import JobOutput
from pytest_recoverygate.shared.lock import LockScope, job_scope

__all__ = [
    "Backend",
    "Clock",
    "EventSource",
    "JobOutputSource",
    "NodeFaults",
    "Notices",
    "Orchestrator",
    "RealClock",
    "SimulatedClock",
    "StickyNodes",
    "StorageScope",
    "cleanup_once",
    "node_moved",
]

S = TypeVar("S")
R = TypeVar("R")
W = TypeVar("W", bound=BaseModel)
_ONCE_LOCK = threading.Lock()


def cleanup_once(method: Callable[[S], R]) -> Callable[[S], R | None]:
    """Make a cleanup idempotent: the first call runs ``method``, every later one (a
    second ``cleanup()``, another thread's) returns None at once.

    The first call counts as done when it starts, so a cleanup that raised is not run a
    second time half-way: what it could not release, it reported.
    """
    flag = f"_{method.__name__}_started"

    @functools.wraps(method)
    def once(self: S) -> R | None:
        with _ONCE_LOCK:
            if getattr(self, flag, False):
                return None
            setattr(self, flag, True)
        return method(self)

    return once


def node_moved(
    node: model.Node, now: model.Node | None, clock: Clock, absent: str
) -> model.KillResult | None:
    """ALREADY_GONE when ``node``, as a node fault was aimed at it, is not the job's node
    ``node.index`` any more: ``now`` is that node as the backend sees it now (None: there
    is none, which ``absent`` says in the backend's words). None while it still is."""
    if now is not None and now.identity == node.identity and node.workers:
        return None
    seen = now.describe() if now is not None else absent
    return model.KillResult(
        model.KillOutcome.ALREADY_GONE,
        clock.now(),
        f"{node.describe()} is not the job's node {node.index} any more ({seen}); "
        "nothing was touched",
    )


@runtime_checkable
class EventSource(Protocol):
    """Training events read from the job's output (RECOVERYGATE/v1 lines)."""

    def poll(self) -> list[model.TrainingEvent]:
        """Events parsed since the last call, in arrival order. Never blocks."""
        ...

    @property
    def malformed_lines(self) -> int:
        """How many sentinel lines could not be parsed so far."""
        ...

    def close(self) -> None:
        """Stop reading. Idempotent."""
        ...


@runtime_checkable
class Orchestrator(Protocol):
    """A backend: finds the job's workers, kills one instance, watches the group."""

    name: str

    def discover(self, deadline: float) -> model.Workload: ...

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault = ...
    ) -> model.KillResult: ...

    def current_worker(self, rank: int) -> model.Worker | None: ...

    def watch_group(self) -> list[model.GroupEvent]: ...

    def events(self) -> EventSource: ...

    def cleanup(self) -> None: ...


@runtime_checkable
class JobOutputSource(Protocol):
    """Optional for a backend: the job's own output, per worker (see the module docstring)."""

    def job_output(self) -> JobOutput:
        """What the job printed so far, per worker, bounded; callable after ``cleanup()``."""
        ...


@runtime_checkable
class Notices(Protocol):
    """Optional for an event source: what it refused to read, and why, for the timeline."""

    def notices(self) -> list[tuple[float, str]]:
        """The notices (time, text) since the last call, oldest first. Never blocks."""
        ...


@runtime_checkable
class NodeFaults(Protocol):
    """Required for node faults: a node as it is now, a fault on all of it, the link back."""

    def current_node(self, index: int) -> model.Node | None:
        """Node ``index`` as the backend sees it now (its running instances), or None."""
        ...

    def kill_node(self, node: model.Node, *, dry_run: bool, fault: model.Fault) -> model.KillResult:
        """Inject ``fault`` into every instance of ``node``, each by identity, once."""
        ...

    def restore_node(self, node: model.Node) -> model.KillResult:
        """End a partition of ``node`` (idempotent; cleanup does it too)."""
        ...


@runtime_checkable
class StickyNodes(Protocol):
    """Optional, for a StickyFault with ``scope: node``: a node that stays bad."""

    def make_node_bad(
        self, node: model.Node, *, dry_run: bool, mode: str, after: float
    ) -> model.KillResult:
        """From now until cleanup, kill (``mode: kill``) or stop (``hang``) each job
        process on ``node``: the work there now at once, each later one ``after`` seconds
        after it starts, each by identity; report each placement there and each hit
        (``BAD_NODE_PLACEMENT``, ``BAD_NODE_HIT``) and the node leaving the job
        (``NODE_GONE``) through ``watch_group``. KILLED once the work there was hit;
        DRY_RUN touches nothing; cleanup ends it and leaves nothing stopped."""
        ...


@runtime_checkable
class StorageScope(Protocol):
    """Optional, for a StorageFault on a job the config cannot scope (see the module)."""

    def storage_scope(self, target: model.Worker, *, mount: bool = True) -> tuple[Path, ...]:
        """The folders the discovered job can be shown to use; with ``mount``,
        DiscoveryError, with the reason, when ``target``'s processes would not see a mount
        made on this machine (without: a StickyFault's damage, which mounts nothing)."""
        ...


def _unknown_budget(workload: Any) -> int | None:
    return None


@dataclass(frozen=True)
class Backend(Generic[W]):
    """One backend as the registry knows it: everything about it but its orchestrator's code.

    - ``name``: what ``workload.orchestrator`` says (and the entry point's name);
    - ``workload``: its ``workload`` section, a
      :class:`~pytest_recoverygate.config.schema.WorkloadBase` subclass declaring
      ``orchestrator: Literal[name]`` and the backend's own keys;
    - ``create(workload, failure, clock)``: the :class:`Orchestrator` of one drill, from
      its validated section, the ``injectFailure`` section and the drill's clock (import
      heavy modules inside it, not at the top of the entry module);
    - ``faults``: the fault types it can inject; a config naming another one is refused,
      in the backend's own words when ``refusals`` has them for that fault, else naming
      the backends that can (a node fault needs the orchestrator to be a
      :class:`NodeFaults` too);
    - ``failure_keys``: the backend-specific ``injectFailure`` keys it honours
      (``drainNode``: SLURM, ``cordon``: Kubernetes); a config giving one to a backend
      that does not list it is refused;
    - ``lock_scope(workload, target)``: what "one drill at a time" covers for the job it
      found (:class:`~pytest_recoverygate.shared.lock.LockScope`; None: a job no other drill can
      reach, so no lock);
    - ``restart_budget(workload)``: the job's own restart budget when the backend can
      read it from the config (torchrun's ``--max-restarts``), else None;
    - ``summary``: one line for listings.
    """

    name: str
    workload: type[W]
    create: Callable[[W, Any, Clock], Orchestrator]  # (workload, InjectFailure, clock)
    faults: frozenset[str] = frozenset({"KillWorker"})
    refusals: Mapping[str, str] = field(default_factory=dict)
    failure_keys: frozenset[str] = frozenset()
    lock_scope: Callable[[model.Workload, model.Worker], LockScope | None] = job_scope
    restart_budget: Callable[[W], int | None] = _unknown_budget
    summary: str = ""
