"""The nodes of a multi-node local job as launched: each node's run (its namespace, folder
and agent's orchestrator), the placeholder values it gets, and how the drill names it."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_recoverygate.engine import model
from pytest_recoverygate.orchestrators.local.netns import IFACE, NodeNet

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.local.badnode import BadNode
    from pytest_recoverygate.orchestrators.local.orchestrator import LocalOrchestrator

__all__ = ["RDZV_PORT", "NodeRun", "node_of", "node_values", "workload_of"]

#: Node 0's rendezvous port: a fresh namespace has every port free.
RDZV_PORT = 29400


@dataclass
class NodeRun:
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


def node_values(
    net: NodeNet,
    node_dir: Path,
    *,
    nodes: int,
    rdzv_address: str,
    drill_id: str,
    shared_dir: Path,
) -> dict[str, str]:
    """The node placeholders' values for node ``net`` (node 0 at ``rdzv_address``)."""
    return {
        "nodeRank": str(net.rank),
        "nnodes": str(nodes),
        "nodeAddr": net.address,
        "rdzvEndpoint": f"{rdzv_address}:{RDZV_PORT}",
        "drillId": f"rg{drill_id}",
        "sharedDir": str(shared_dir),
        "nodeDir": str(node_dir),
        "nodeIface": IFACE,
    }


def node_of(run: NodeRun) -> model.Node:
    """The node as the drill names it: its hostname, its namespace's identity, its workers."""
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


def workload_of(runs: list[NodeRun], nodes: int) -> model.Workload:
    """The job of ``nodes`` nodes: every node's workers, by rank."""
    found = [node_of(run) for run in runs]
    workers = sorted((w for n in found for w in n.workers), key=lambda w: w.rank)
    agents = ", ".join(f"{r.net.hostname} (agent pid {r.orch.agent_pid})" for r in runs)
    return model.Workload(
        job=f"{nodes} torchrun nodes: {agents}",
        workers=tuple(workers),
        nodes=tuple(found),
    )
