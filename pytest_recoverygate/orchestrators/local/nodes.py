"""The local backend's multi-node mode (``workload.nodes: N``): N torchrun agents, one per
node, each node a network namespace the drill makes (:mod:`.netns`; docs/nodes.md).

Each node runs the workload's command once, with the node placeholders expanded
(:data:`PLACEHOLDERS`), through its own :class:`~.orchestrator.LocalOrchestrator` (the
process scan, the identity-checked kills, the drill marker and the cleanup are that
class's); this module composes them into one job:

- discovery starts every node at once (their agents rendezvous with each other) and waits
  until every node's group is up; workers and nodes are named by the node's hostname, a
  node's identity is its namespace and when it was made;
- the event source merges every node's output (a replacement node's too);
- ``kill_node`` for KillNode SIGKILLs the node's agent and every process under it, each
  through a pidfd opened and identity-checked before any signal is sent, then reports
  ``NODE_GONE`` once none of them runs; with ``replace`` a fresh namespace (same node
  rank and address, an empty ``{nodeDir}``) runs the node's command again
  (``NODE_REPLACEMENT_STARTED``). The dead node's own "agent exited" is not the job's
  failure and is not passed on; every other node's group events are;
- PartitionNode takes the node's bridge port down; ``restore_node`` (and cleanup, always)
  brings it back up;
- ``make_node_bad`` for a StickyFault with ``scope: node``: from now on every job process
  in the node's namespace is killed or stopped (:mod:`.badnode`), its placements reported
  as group events; the node's agent ending is then the node leaving the job
  (``NODE_GONE``), not the job's failure;
- cleanup stops the bad node's watcher (continuing and killing what it stopped), ends
  every node's processes, then deletes every namespace (and with them every veth and the
  bridge) and the drill's folder with ``{sharedDir}`` and the ``{nodeDir}`` folders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError, DrillError
from pytest_recoverygate.orchestrators.local.netns import (
    IFACE,
    Network,
    NodeNet,
    node_command,
    require_capabilities,
)
from pytest_recoverygate.orchestrators.local.nodefaults import kill_node, make_bad, wait_gone
from pytest_recoverygate.orchestrators.local.nodemerge import merged_events, merged_output
from pytest_recoverygate.orchestrators.local.noderuns import (
    RDZV_PORT,
    NodeRun,
    node_of,
    node_values,
    workload_of,
)
from pytest_recoverygate.orchestrators.local.orchestrator import LocalOrchestrator
from pytest_recoverygate.orchestrators.local.processes import resolve_executable
from pytest_recoverygate.orchestrators.local.sweep import OwnerRecord, claim
from pytest_recoverygate.registry.seams import cleanup_once
from pytest_recoverygate.shared.procs import JobLaunch, LaunchedJob

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.local.processes import Identity
    from pytest_recoverygate.registry.seams import Clock
    from pytest_recoverygate.shared.joboutput import JobOutput

__all__ = ["PLACEHOLDERS", "RDZV_PORT", "LocalNodesOrchestrator", "expand"]

#: The placeholders a multi-node command (and env value) may use, expanded per node.
PLACEHOLDERS = (
    "nodeRank",
    "nnodes",
    "nodeAddr",
    "rdzvEndpoint",
    "drillId",
    "sharedDir",
    "nodeDir",
    "nodeIface",
)
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


def expand(text: str, values: dict[str, str]) -> str:
    """Replace the node placeholders in ``text``; other braces (``{tmpdir}``) stay."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


class _MergedSource:
    """Every node's event source as one (replacement nodes join it)."""

    def __init__(self) -> None:
        self._sources: list[tuple[str, LocalOrchestrator]] = []
        self._lock = threading.Lock()
        self._closed = False

    def add(self, host: str, orch: LocalOrchestrator) -> None:
        with self._lock:
            self._sources.append((host, orch))

    def poll(self) -> list[model.TrainingEvent]:
        with self._lock:
            sources = list(self._sources)
        events: list[model.TrainingEvent] = []
        for _, orch in sources:
            events += orch.events().poll()
        events.sort(key=lambda e: e.received if e.received is not None else e.timestamp)
        return events

    @property
    def malformed_lines(self) -> int:
        with self._lock:
            return sum(orch.events().malformed_lines for _, orch in self._sources)

    def close(self) -> None:
        with self._lock:
            sources, self._closed = list(self._sources), True
        for _, orch in sources:
            orch.events().close()


class LocalNodesOrchestrator(LaunchedJob):
    """``nodes`` torchrun agents on this machine, each in its own network namespace."""

    name = "local"
    command_what = "the torchrun command"

    def __init__(self, job: JobLaunch, *, nodes: int, clock: Clock) -> None:
        super().__init__(job, clock=clock)
        self.nodes = nodes
        self._root: Path | None = None
        self._network: Network | None = None
        self._owner: OwnerRecord | None = None  # held while the namespaces may exist
        self._runs: list[NodeRun] = []  # every node ever launched, replacements too
        self._source = _MergedSource()
        self._lock = threading.Lock()
        self._events: list[model.GroupEvent] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._launching = threading.Lock()  # a replacement launch, or cleanup's start
        self._succeeded: set[int] = set()

    # ------------------------------------------------------------------ placeholders

    @property
    def shared_dir(self) -> Path:
        assert self._root is not None
        return self._root / "shared"

    @property
    def drill_id(self) -> str:
        assert self._network is not None
        return self._network.drill_id

    # ------------------------------------------------------------------ launching

    def _launch(self, net: NodeNet) -> NodeRun:
        assert self._root is not None
        assert self._network is not None
        generation = sum(1 for r in self._runs if r.net.rank == net.rank)
        node_dir = self._root / (f"node{net.rank}" + (f"-r{generation}" if generation else ""))
        node_dir.mkdir(parents=True)
        values = node_values(
            net,
            node_dir,
            nodes=self.nodes,
            rdzv_address=self._network.address(0),
            drill_id=self.drill_id,
            shared_dir=self.shared_dir,
        )
        program = resolve_executable(self.command[0])
        command = [program, *(expand(arg, values) for arg in self.command[1:])]
        env = {name: expand(value, values) for name, value in self.env.items()}
        env.setdefault("GLOO_SOCKET_IFNAME", IFACE)
        orch = LocalOrchestrator(
            JobLaunch(node_command(net, self._network.hosts_file, command), self.workdir, env),
            target_rank=None,
            clock=self._clock,
        )
        run = NodeRun(net, node_dir, orch)
        with self._lock:
            self._runs.append(run)
        self._source.add(net.hostname, orch)
        return run

    def _discover_node(self, run: NodeRun, deadline: float) -> None:
        try:
            run.orch.discover(deadline)
        except BaseException as exc:  # reported by whoever waits for this node
            run.error = exc
        finally:
            run.ready.set()
            self._clock.wakeup()

    def _start(self, run: NodeRun, deadline: float) -> threading.Thread:
        thread = threading.Thread(
            target=self._discover_node,
            args=(run, deadline),
            name=f"recoverygate-node{run.net.rank}-discover",
            daemon=True,
        )
        thread.start()
        with self._lock:
            self._threads.append(thread)
        return thread

    # ------------------------------------------------------------------ Orchestrator

    def discover(self, deadline: float) -> model.Workload:
        """Make the network, start every node's agent, wait until every node's group is up."""
        require_capabilities(self.nodes)
        if not self.workdir.is_dir():
            raise DiscoveryError(
                f"workload.workdir {str(self.workdir)!r} is not a directory; fix the path"
            )
        self._root = Path(tempfile.mkdtemp(prefix="recoverygate-nodes-"))
        self.shared_dir.mkdir()
        self._network = Network(self.nodes, self._root / "hosts")
        # Claimed before the first namespace: should this process be SIGKILLed, the
        # unlocked record lets `recoverygate sweep` find and remove what it left (sweep.py).
        self._owner = claim(self._network.drill_id, self._root)
        nets = self._network.open()
        runs = [self._launch(net) for net in nets]
        threads = [self._start(run, deadline) for run in runs]
        for thread in threads:
            thread.join(max(deadline - self._clock.now(), 0.0) + 5.0)
        for run in runs:
            if run.error is not None:
                if isinstance(run.error, DrillError):
                    raise type(run.error)(f"node {run.net.rank}: {run.error}") from run.error
                raise DiscoveryError(f"node {run.net.rank}: {run.error!r}") from run.error
            if not run.ready.is_set():
                raise DiscoveryError(f"node {run.net.rank} did not start before the deadline")
        return workload_of(runs, self.nodes)

    def _current_run(self, rank: int) -> NodeRun | None:
        with self._lock:
            runs = [r for r in self._runs if r.net.rank == rank]
        return runs[-1] if runs else None

    def current_node(self, index: int) -> model.Node | None:
        run = self._current_run(index)
        if run is None or run.killed or not run.ready.is_set() or run.error is not None:
            return None
        return node_of(run)

    def current_worker(self, rank: int) -> model.Worker | None:
        with self._lock:
            runs = [r for r in self._runs if not r.killed and r.ready.is_set()]
        for run in runs:
            for worker in run.orch.current_workers():
                if worker.rank == rank:
                    return dataclasses.replace(worker, node=run.net.hostname)
        return None

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault = model.KILL
    ) -> model.KillResult:
        """A worker fault: the node that runs that instance carries it out."""
        with self._lock:
            runs = [r for r in self._runs if not r.killed]
        for run in runs:
            if any(w.instance_id == worker.instance_id for w in run.orch.current_workers()):
                return run.orch.kill(worker, dry_run=dry_run, fault=fault)
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE,
            self._clock.now(),
            f"{worker.describe()} runs on no node now; nothing was touched",
        )

    def kill_node(self, node: model.Node, *, dry_run: bool, fault: model.Fault) -> model.KillResult:
        return kill_node(
            self._current_run(node.index),
            node,
            fault,
            dry_run=dry_run,
            clock=self._clock,
            network=self._network,
            then=self._start_after_kill,
        )

    def _start_after_kill(self, run: NodeRun, killed: list[Identity], replace: bool) -> None:
        """The thread that reports NODE_GONE and, with ``replace``, launches a new node."""
        thread = threading.Thread(
            target=self._after_node_kill,
            args=(run, killed, replace),
            name=f"recoverygate-node{run.net.rank}-replace",
            daemon=True,
        )
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _after_node_kill(self, run: NodeRun, killed: list[Identity], replace: bool) -> None:
        """NODE_GONE once none of its processes runs; then, with ``replace``, a new node."""
        gone = wait_gone(run, killed, self._stop)
        if gone is None:
            return
        self._emit(model.GroupEventKind.NODE_GONE, gone)
        with contextlib.suppress(DrillError, Exception):
            run.orch.cleanup()  # its threads and pipe; every process of it is dead already
        if not replace:
            return
        assert self._network is not None
        with self._launching:  # cleanup either sees the replacement, or it never starts
            if self._stop.is_set():
                return
            try:
                self._network.remove_node(run.net)
                net = self._network.add_node(run.net.rank)
                new = self._launch(net)
            except (DrillError, OSError) as exc:
                self._emit(
                    model.GroupEventKind.JOB_FAILED, f"the replacement node could not start: {exc}"
                )
                return
        self._emit(
            model.GroupEventKind.NODE_REPLACEMENT_STARTED,
            f"replacement node {net.hostname} ({net.netns}, empty nodeDir {new.node_dir})",
        )
        self._emit(
            model.GroupEventKind.REPLACEMENT_PENDING, f"replacement node {net.hostname} started"
        )
        self._discover_node(new, self._clock.now() + 600.0)

    def make_node_bad(
        self, node: model.Node, *, dry_run: bool, mode: str, after: float
    ) -> model.KillResult:
        """StickyFault ``scope: node``: the node stays bad until cleanup: each job process
        in it is SIGKILLed (``mode: kill``) or SIGSTOPped (``hang``), the work running
        there now at once, every later one ``after`` seconds after it started."""
        return make_bad(
            self._current_run(node.index),
            node,
            dry_run=dry_run,
            mode=mode,
            after=after,
            clock=self._clock,
            emit=self._emit,
            launching=self._launching,
            stop=self._stop,
        )

    def restore_node(self, node: model.Node) -> model.KillResult:
        assert self._network is not None
        run = self._current_run(node.index)
        now = self._clock.now()
        if run is None or not run.cut or not self._network.restore(run.net):
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE, now, f"{node.name} is not cut off"
            )
        run.cut = False
        self._emit(model.GroupEventKind.NODE_RESTORED, f"the link of {node.name} is back")
        return model.KillResult(model.KillOutcome.KILLED, now, f"restored the link of {node.name}")

    def _emit(
        self,
        kind: model.GroupEventKind,
        detail: str,
        timestamp: float | None = None,
        **extra: Any,
    ) -> None:
        at = self._clock.now() if timestamp is None else timestamp
        with self._lock:
            self._events.append(model.GroupEvent(kind, at, detail, **extra))
        self._clock.wakeup()

    def watch_group(self) -> list[model.GroupEvent]:
        """Every live node's group events, the killed nodes' own end left out."""
        with self._lock:
            runs = list(self._runs)
            mine, self._events = self._events, []
        return sorted(mine + merged_events(runs, self._succeeded), key=lambda e: e.timestamp)

    def events(self) -> _MergedSource:
        return self._source

    def job_output(self) -> JobOutput:
        """Every node's output, its labels prefixed by the node (``node1 rank 2``)."""
        with self._lock:
            runs = list(self._runs)
        drill_id = self.drill_id if runs else ""  # a node runs only once the network is up
        return merged_output(runs, drill_id)

    @cleanup_once
    def cleanup(self) -> None:
        """Every node's processes, then every link restored, namespace and folder removed."""
        with self._launching:
            self._stop.set()
        problems: list[str] = []
        for run in list(self._runs):  # first: no watcher left, nothing left stopped
            if run.bad is not None:
                problems += run.bad.stop()
        if self._network is not None:
            with contextlib.suppress(BackendError):
                for run in list(self._runs):
                    if run.cut:
                        self._network.restore(run.net)
        with self._lock:
            runs = list(self._runs)
        for run in runs:
            try:
                run.orch.cleanup()
            except Exception as exc:
                problems.append(f"node {run.net.rank}: {exc}")
        self._source.close()
        for thread in list(self._threads):
            thread.join(timeout=5.0)
        if self._network is not None:
            problems += self._network.close()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        if self._owner is not None and self._network is not None:
            # Kept, unlocked, for `recoverygate sweep` when anything may be left.
            left = problems or Network.leftovers(self._network.drill_id)
            self._owner.release(done=not left and not (self._root and self._root.exists()))
        if problems:
            raise BackendError("cleanup of the nodes failed: " + "; ".join(problems))
