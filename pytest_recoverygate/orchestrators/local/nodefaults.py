"""The node faults of a multi-node local job, each checked against the node running now:
KillNode's SIGKILL to every process of one node at once (and the wait until none runs),
PartitionNode's cut link, a StickyFault's bad node."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_recoverygate.engine import model
from pytest_recoverygate.orchestrators.local.badnode import BadNode, Emit
from pytest_recoverygate.orchestrators.local.processes import Identity, pidfd_open

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.local.netns import Network
    from pytest_recoverygate.orchestrators.local.noderuns import NodeRun
    from pytest_recoverygate.registry.seams import Clock

__all__ = ["GONE_TIMEOUT", "kill_all", "kill_node", "make_bad", "partition", "wait_gone"]

GONE_TIMEOUT = 10.0  # seconds a killed node's processes get to disappear


def kill_node(
    run: NodeRun | None,
    node: model.Node,
    fault: model.Fault,
    *,
    dry_run: bool,
    clock: Clock,
    network: Network | None,
    then: Callable[[NodeRun, list[Identity], bool], None],
) -> model.KillResult:
    """KillNode or PartitionNode of ``node`` if ``run`` (its newest run) still runs it.

    After a KillNode, ``then`` gets the run, the instances signalled and ``fault.replace``.
    """
    now = clock.now()
    if run is None or run.killed or run.net.identity != node.identity:
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE,
            now,
            f"{node.describe()} is not the node running now; nothing was touched",
        )
    if fault.type == "PartitionNode":
        assert network is not None
        return partition(network, run, node, dry_run=dry_run, clock=clock)
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
    result, killed = kill_all(run, node, targets, clock=clock)
    then(run, killed, fault.replace)
    return result


def kill_all(
    run: NodeRun, node: model.Node, targets: list[Identity], *, clock: Clock
) -> tuple[model.KillResult, list[Identity]]:
    """SIGKILL every process of the node at once: pidfds first, each checked, then signals.

    Returns the result and the instances signalled (the run is marked killed).
    """
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
        timestamp = clock.now()
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
    result = model.KillResult(
        model.KillOutcome.KILLED,
        timestamp,
        f"SIGKILL sent to {sent} process(es) of {node.describe()} (agent and workers)",
    )
    return result, [identity for identity, _ in fds]


def wait_gone(run: NodeRun, killed: list[Identity], stop: threading.Event) -> str | None:
    """Wait until none of the ``killed`` processes runs (at most :data:`GONE_TIMEOUT`); the
    NODE_GONE event's detail, or None when ``stop`` was set first."""
    deadline = time.monotonic() + GONE_TIMEOUT
    while any(i.process() is not None for i in killed) and time.monotonic() < deadline:
        if stop.wait(0.02):
            return None
    left = [i for i in killed if i.process() is not None]
    return (
        f"every process of {run.net.hostname} is gone ({len(killed)} killed)"
        if not left
        else f"{len(left)} process(es) of {run.net.hostname} still run after SIGKILL"
    )


def partition(
    network: Network, run: NodeRun, node: model.Node, *, dry_run: bool, clock: Clock
) -> model.KillResult:
    """PartitionNode: the node's bridge port down; its processes keep running."""
    now = clock.now()
    if dry_run:
        return model.KillResult(
            model.KillOutcome.DRY_RUN, now, f"would cut the link of {node.describe()}"
        )
    timestamp = clock.now()
    network.cut(run.net)
    run.cut = True
    return model.KillResult(
        model.KillOutcome.KILLED,
        timestamp,
        f"cut the link of {node.describe()} (bridge port {run.net.port} down; its "
        "processes keep running)",
    )


def make_bad(
    run: NodeRun | None,
    node: model.Node,
    *,
    dry_run: bool,
    mode: str,
    after: float,
    clock: Clock,
    emit: Emit,
    launching: threading.Lock,
    stop: threading.Event,
) -> model.KillResult:
    """StickyFault ``scope: node`` on ``node`` if ``run`` (its newest run) still runs it: a
    :class:`~.badnode.BadNode` watcher started under ``launching`` unless ``stop`` is set
    (cleanup began), its placements reported through ``emit``."""
    now = clock.now()
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
        emit=emit,
        now=clock.now,
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
    with launching:  # cleanup either sees the watcher, or it never starts
        if stop.is_set():
            return model.KillResult(model.KillOutcome.ALREADY_GONE, now, "cleanup began")
        run.bad = bad
        at, hits = bad.start()
    return model.KillResult(
        model.KillOutcome.KILLED if hits else model.KillOutcome.UNCONFIRMED,
        at,
        f"{node.name} is bad from now on: {what}; {hits} process(es) hit now",
    )
