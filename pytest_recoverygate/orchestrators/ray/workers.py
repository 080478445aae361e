"""Train's workers as the drill names them: a worker's instance id
(``ACTOR_ID:PID@TICKS``) and back, and an attempt's nodes in the order of their lowest
world rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_recoverygate.engine import model

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.ray.guard import WorkerGuard
    from pytest_recoverygate.orchestrators.ray.state import TrainAttempt, TrainWorker

__all__ = ["identity", "nodes_of", "worker_of"]


def worker_of(guard: WorkerGuard, worker: TrainWorker) -> model.Worker:
    """The drill's worker, its instance id with the start ticks the guard's probe read on
    its node."""
    ticks = guard.ticks(worker.actor_id)  # read on its node by the guard's probe
    instance = f"{worker.actor_id}:{worker.pid}" + (f"@{ticks}" if ticks else "")
    return model.Worker(
        worker.rank,
        f"RayTrainWorker pid {worker.pid}",
        instance,
        node=worker.node,
        details=(
            ("actorId", worker.actor_id),
            ("nodeId", worker.node_id),
            ("pid", str(worker.pid)),
        ),
    )


def identity(instance_id: str) -> tuple[str, int, str | None]:
    """An instance id's actor id, pid (-1: not a number) and start ticks (None: unknown)."""
    actor, _, rest = instance_id.partition(":")
    pid, _, ticks = rest.partition("@")
    try:
        return actor, int(pid), ticks or None
    except ValueError:
        return actor, -1, None


def nodes_of(guard: WorkerGuard, attempt: TrainAttempt) -> tuple[model.Node, ...]:
    """The attempt's nodes, each with its live workers, in the order of their lowest
    world rank (index 0: rank 0's node). Not Train's ``node_rank``: Train numbers nodes
    by IP address, and the nodes of one machine share it."""
    by_node: dict[str, list[TrainWorker]] = {}
    for worker in sorted(attempt.workers, key=lambda w: w.rank):
        by_node.setdefault(worker.node_id, []).append(worker)
    nodes = []
    for index, (node_id, workers) in enumerate(by_node.items()):
        first = workers[0]
        nodes.append(
            model.Node(
                index,
                first.node,
                node_id,
                tuple(worker_of(guard, w) for w in workers if w.alive),
                (("nodeIp", first.node_ip),),
            )
        )
    return tuple(nodes)
