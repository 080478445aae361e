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
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError, DrillError
from pytest_recoverygate.orchestrators.local.badnode import BadNode
from pytest_recoverygate.orchestrators.local.netns import (
    IFACE,
    Network,
    NodeNet,
    node_command,
    require_capabilities,
)
from pytest_recoverygate.orchestrators.local.orchestrator import LocalOrchestrator
from pytest_recoverygate.orchestrators.local.processes import (
    Identity,
    pidfd_open,
    resolve_executable,
)
from pytest_recoverygate.orchestrators.local.sweep import OwnerRecord, claim
from pytest_recoverygate.registry.seams import cleanup_once
from pytest_recoverygate.shared.joboutput import JobOutput, WorkerOutput
from pytest_recoverygate.shared.procs import JobLaunch, LaunchedJob

if TYPE_CHECKING:
    from pytest_recoverygate.registry.seams import Clock

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
#: Node 0's rendezvous port: a fresh namespace has every port free.
RDZV_PORT = 29400
GONE_TIMEOUT = 10.0  # seconds a killed node's processes get to disappear
_ENDS = (model.GroupEventKind.JOB_FAILED, model.GroupEventKind.JOB_SUCCEEDED)
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


def expand(text: str, values: dict[str, str]) -> str:
    """Replace the node placeholders in ``text``; other braces (``{tmpdir}``) stay."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


@dataclass
class _NodeRun:
    """One node as launched: its namespace, its folder, its agent's orchestrator."""

    net: NodeNet
    node_dir: Path
    orch: LocalOrchestrator
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    killed: bool = False  # by a KillNode: its own "job failed" is not the job's
    finished: bool = False  # its agent ended with success
    cut: bool = False
    bad: BadNode | None = None  # StickyFault scope node: the node stays bad
    left: bool = False  # the bad node's agent ended: the node left the job


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
        self._runs: list[_NodeRun] = []  # every node ever launched, replacements too
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

    def _values(self, net: NodeNet, node_dir: Path) -> dict[str, str]:
        assert self._network is not None
        return {
            "nodeRank": str(net.rank),
            "nnodes": str(self.nodes),
            "nodeAddr": net.address,
            "rdzvEndpoint": f"{self._network.address(0)}:{RDZV_PORT}",
            "drillId": f"rg{self.drill_id}",
            "sharedDir": str(self.shared_dir),
            "nodeDir": str(node_dir),
            "nodeIface": IFACE,
        }

    # ------------------------------------------------------------------ launching

    def _launch(self, net: NodeNet) -> _NodeRun:
        assert self._root is not None
        assert self._network is not None
        generation = sum(1 for r in self._runs if r.net.rank == net.rank)
        node_dir = self._root / (f"node{net.rank}" + (f"-r{generation}" if generation else ""))
        node_dir.mkdir(parents=True)
        values = self._values(net, node_dir)
        program = resolve_executable(self.command[0])
        command = [program, *(expand(arg, values) for arg in self.command[1:])]
        env = {name: expand(value, values) for name, value in self.env.items()}
        env.setdefault("GLOO_SOCKET_IFNAME", IFACE)
        orch = LocalOrchestrator(
            JobLaunch(node_command(net, self._network.hosts_file, command), self.workdir, env),
            target_rank=None,
            clock=self._clock,
        )
        run = _NodeRun(net, node_dir, orch)
        with self._lock:
            self._runs.append(run)
        self._source.add(net.hostname, orch)
        return run

    def _discover_node(self, run: _NodeRun, deadline: float) -> None:
        try:
            run.orch.discover(deadline)
        except BaseException as exc:  # reported by whoever waits for this node
            run.error = exc
        finally:
            run.ready.set()
            self._clock.wakeup()

    def _start(self, run: _NodeRun, deadline: float) -> threading.Thread:
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
        return self._workload(runs)

    def _workload(self, runs: list[_NodeRun]) -> model.Workload:
        nodes = [self._node(run) for run in runs]
        workers = sorted((w for n in nodes for w in n.workers), key=lambda w: w.rank)
        agents = ", ".join(f"{r.net.hostname} (agent pid {r.orch.agent_pid})" for r in runs)
        return model.Workload(
            job=f"{self.nodes} torchrun nodes: {agents}",
            workers=tuple(workers),
            nodes=tuple(nodes),
        )

    def _node(self, run: _NodeRun) -> model.Node:
        workers = tuple(
            dataclasses.replace(w, node=run.net.hostname) for w in run.orch.current_workers()
        )
        return model.Node(
            run.net.rank,
            run.net.hostname,
            run.net.identity,
            workers,
            details=(
                ("netns", run.net.netns),
                ("address", run.net.address),
                ("nodeDir", str(run.node_dir)),
                ("agentPid", str(run.orch.agent_pid)),
            ),
        )

    def _current_run(self, rank: int) -> _NodeRun | None:
        with self._lock:
            runs = [r for r in self._runs if r.net.rank == rank]
        return runs[-1] if runs else None

    def current_node(self, index: int) -> model.Node | None:
        run = self._current_run(index)
        if run is None or run.killed or not run.ready.is_set() or run.error is not None:
            return None
        return self._node(run)

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
        run = self._current_run(node.index)
        now = self._clock.now()
        if run is None or run.killed or run.net.identity != node.identity:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                now,
                f"{node.describe()} is not the node running now; nothing was touched",
            )
        if fault.type == "PartitionNode":
            return self._partition(run, node, dry_run=dry_run)
        if fault.type != "KillNode":
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                now,
                f"{fault.type} is not a fault of the local backend",
            )
        targets = run.orch.processes()
        alive = {str(i.instance_id) for i in targets}
        if not any(w.instance_id in alive for w in node.workers):
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                now,
                f"none of the instances of {node.describe()} runs any more; nothing was touched",
            )
        if dry_run:
            return model.KillResult(
                model.KillOutcome.DRY_RUN,
                now,
                f"would SIGKILL {len(targets)} process(es) of {node.describe()}",
            )
        return self._kill_all(run, node, targets, replace=fault.replace)

    def _kill_all(
        self, run: _NodeRun, node: model.Node, targets: list[Identity], *, replace: bool
    ) -> model.KillResult:
        """SIGKILL every process of the node at once: pidfds first, each checked, then signals."""
        fds: list[tuple[Identity, int | None]] = []
        try:
            for identity in targets:
                fd = pidfd_open(identity.pid)
                if identity.process() is None:  # gone or recycled: never signalled
                    if fd is not None:
                        os.close(fd)
                    continue
                fds.append((identity, fd))
            run.killed = True
            timestamp = self._clock.now()
            sent = 0
            for identity, fd in fds:
                with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                    if fd is not None:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    else:
                        os.kill(identity.pid, signal.SIGKILL)
                    sent += 1
        finally:
            for _, fd in fds:
                if fd is not None:
                    os.close(fd)
        gone = [identity for identity, _ in fds]
        thread = threading.Thread(
            target=self._after_node_kill,
            args=(run, gone, replace),
            name=f"recoverygate-node{run.net.rank}-replace",
            daemon=True,
        )
        with self._lock:
            self._threads.append(thread)
        thread.start()
        return model.KillResult(
            model.KillOutcome.KILLED,
            timestamp,
            f"SIGKILL sent to {sent} process(es) of {node.describe()} (agent and workers)",
        )

    def _after_node_kill(self, run: _NodeRun, killed: list[Identity], replace: bool) -> None:
        """NODE_GONE once none of its processes runs; then, with ``replace``, a new node."""
        deadline = time.monotonic() + GONE_TIMEOUT
        while any(i.process() is not None for i in killed) and time.monotonic() < deadline:
            if self._stop.wait(0.02):
                return
        left = [i for i in killed if i.process() is not None]
        self._emit(
            model.GroupEventKind.NODE_GONE,
            f"every process of {run.net.hostname} is gone ({len(killed)} killed)"
            if not left
            else f"{len(left)} process(es) of {run.net.hostname} still run after SIGKILL",
        )
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
        run = self._current_run(node.index)
        now = self._clock.now()
        if run is None or run.killed or run.net.identity != node.identity:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                now,
                f"{node.describe()} is not the node running now; nothing was touched",
            )
        marker = run.orch.marker
        if marker is None or run.bad is not None:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE, now, f"{node.name} is bad already, or attached"
            )
        bad = BadNode(
            netns=run.net.netns,
            hostname=run.net.hostname,
            marker=marker,
            agent=run.orch.agent,
            mode=mode,
            after=after,
            emit=self._emit,
            now=self._clock.now,
        )
        what = (
            f"{bad.verb} each job process in {run.net.netns} (its drill marker and a RANK; "
            f"never its agent), the work there now at once, every later one {after:g}s after "
            "it starts, until the drill ends"
        )
        there = bad.look()
        if not there:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                now,
                f"no job process runs on {node.describe()} now; nothing was touched",
            )
        if dry_run:
            return model.KillResult(
                model.KillOutcome.DRY_RUN,
                now,
                f"would make {node.name} bad: {what} ({len(there)} there now)",
            )
        with self._launching:  # cleanup either sees the watcher, or it never starts
            if self._stop.is_set():
                return model.KillResult(model.KillOutcome.ALREADY_GONE, now, "cleanup began")
            run.bad = bad
            at, hits = bad.start()
        return model.KillResult(
            model.KillOutcome.KILLED if hits else model.KillOutcome.UNCONFIRMED,
            at,
            f"{node.name} is bad from now on: {what}; {hits} process(es) hit now",
        )

    def _partition(self, run: _NodeRun, node: model.Node, *, dry_run: bool) -> model.KillResult:
        assert self._network is not None
        now = self._clock.now()
        if dry_run:
            return model.KillResult(
                model.KillOutcome.DRY_RUN, now, f"would cut the link of {node.describe()}"
            )
        timestamp = self._clock.now()
        self._network.cut(run.net)
        run.cut = True
        return model.KillResult(
            model.KillOutcome.KILLED,
            timestamp,
            f"cut the link of {node.describe()} (bridge port {run.net.port} down; its "
            "processes keep running)",
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

    @staticmethod
    def _world_size_of(run: _NodeRun) -> int | None:
        """The WORLD_SIZE torchrun gave the node's newest workers (None: unreadable)."""
        for worker in run.orch.current_workers():
            identity = Identity.parse(worker.instance_id)
            proc = identity.process() if identity is not None else None
            if proc is None:
                continue
            with contextlib.suppress(psutil.Error, KeyError, ValueError):
                return int(proc.environ()["WORLD_SIZE"])
        return None

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
        out: list[model.GroupEvent] = []
        for run in runs:
            for seen in run.orch.watch_group():
                if run.killed:
                    continue  # the node we killed: its end is NODE_GONE, not the job's
                if run.bad is not None and seen.kind in _ENDS:
                    run.left = True  # the bad node's agent ended: the node left the job
                    out.append(self._left(run, seen))
                    continue
                event = seen
                if seen.kind is model.GroupEventKind.REPLACEMENT_RUNNING:
                    event = dataclasses.replace(seen, world_size=self._world_size_of(run))
                if seen.worker is not None:
                    event = dataclasses.replace(
                        seen, worker=dataclasses.replace(seen.worker, node=run.net.hostname)
                    )
                if event.kind is model.GroupEventKind.JOB_SUCCEEDED:
                    self._succeeded.add(id(run))
                    live = [r for r in runs if not r.killed and not r.left]
                    if any(id(r) not in self._succeeded for r in live):
                        continue  # the job ends when every live node's agent ended well
                out.append(dataclasses.replace(event, detail=f"{run.net.hostname}: {event.detail}"))
        return sorted(mine + out, key=lambda e: e.timestamp)

    def _left(self, run: _NodeRun, end: model.GroupEvent) -> model.GroupEvent:
        how = "with success" if end.kind is model.GroupEventKind.JOB_SUCCEEDED else end.detail
        return model.GroupEvent(
            model.GroupEventKind.NODE_GONE,
            end.timestamp,
            f"{run.net.hostname} left the job: its agent ended ({how}); nothing more is "
            "placed on the bad node",
        )

    def events(self) -> _MergedSource:
        return self._source

    def job_output(self) -> JobOutput:
        """Every node's output, its labels prefixed by the node (``node1 rank 2``)."""
        with self._lock:
            runs = list(self._runs)
        workers: list[WorkerOutput] = []
        failing: str | None = None
        for run in runs:
            prefix = run.net.netns.removeprefix(f"rg{self.drill_id}-")  # n1, n1-r1
            output = run.orch.job_output()
            for worker in output.workers:
                workers.append(dataclasses.replace(worker, label=f"{prefix} {worker.label}"))
            if output.failing is not None and not run.killed:
                failing = f"{prefix} {output.failing}"
        return JobOutput(
            tuple(workers),
            failing,
            "each node's torchrun output (its agent's stream, and each rank's prefixed lines)",
        )

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
