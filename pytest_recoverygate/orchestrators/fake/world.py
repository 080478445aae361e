"""Discovery in the simulated world: the incarnation running now, the workload (ranks
on nodes) it shows, where rank 0 runs, and which instances run now."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_recoverygate.engine.model import Node, Worker, Workload

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.fake.job import Incarnation
    from pytest_recoverygate.orchestrators.fake.orchestrator import FakeOrchestrator

__all__ = ["current", "current_node", "current_worker", "host", "running", "workload"]


def current(job: FakeOrchestrator) -> Incarnation | None:
    """The group's latest incarnation (it may not have started yet), or None."""
    return job._incarnations[-1] if job._incarnations else None


def workload(job: FakeOrchestrator) -> Workload:
    """The job as discover shows it: the current incarnation's ranks, on their nodes."""
    now = current(job)
    number = now.number if now else 0
    if not job._multi:
        workers = tuple(
            Worker(rank, f"fake-worker-{rank}", f"fake-{rank}-{number}", node="simulated")
            for rank in range(job.workers)
        )
        return Workload(job="fake-job", workers=workers)
    nodes = []
    for position, index in enumerate(job._nodes):
        name = f"fake-node-{index}"
        ranks = range(position * job.per_node, (position + 1) * job.per_node)
        on = tuple(
            Worker(rank, f"fake-worker-{rank}", f"fake-{rank}-{number}", node=name)
            for rank in ranks
        )
        nodes.append(Node(index, name, f"{name}@{job._generation[index]}", on))
    return Workload(
        job="fake-job",
        workers=tuple(w for node in nodes for w in node.workers),
        nodes=tuple(nodes),
    )


def host(job: FakeOrchestrator) -> str:
    """Where rank 0 runs (its reporter's ``host``)."""
    return f"fake-node-{job._nodes[0]}" if job._multi else "simulated"


def running(job: FakeOrchestrator) -> set[str]:
    """The instance ids that run now (see :meth:`FakeOrchestrator.running`)."""
    now = job.clock.now()
    started = [inc for inc in job._incarnations if inc.start <= now]
    if not job._running or not started:
        return set()
    inc = started[-1]
    return {f"fake-{rank}-{inc.number}" for rank in range(inc.ranks)} - job._dead


def current_worker(job: FakeOrchestrator, rank: int) -> Worker | None:
    """Rank ``rank`` of the incarnation running now, or None while the group is down."""
    inc = current(job)
    if not job._running or inc is None or inc.killed_at is not None:
        return None
    if inc.start > job.clock.now():
        return None  # the replacement is not running yet
    return workload(job).by_rank(rank)


def current_node(job: FakeOrchestrator, index: int) -> Node | None:
    """Node ``index`` as the group runs on it now, or None while its group is down."""
    inc = current(job)
    if not job._running or inc is None or index not in job._nodes:
        return None
    if inc.start > job.clock.now() or (inc.killed_at is not None and job._partition is None):
        return None  # its group is down (a replacement not started yet)
    return workload(job).node(index)
