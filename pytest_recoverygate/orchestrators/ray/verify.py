"""Which Train workers the drill may signal: Train's state checked against the GCS (pure).

Train's run state is job input: the workers' metadata is written by the workers
themselves, and the detached state actor that holds it can be updated by any driver of
the cluster. So a worker it names is only a candidate. The drill signals a process only
when the GCS, as each raylet registered it, agrees (:func:`refusal`):

- the actor exists, is a ``RayTrainWorker`` and is ``ALIVE``;
- it is an actor of the drill's job (the job whose driver the drill launched, or the
  Ray Job ``submissionId`` names; in a cluster the drill started, a job whose driver
  carries the drill's marker), never of another job of the cluster;
- its node and its pid are the ones Train's state names.

On the node itself (:func:`.helper.check_here`, through a task pinned there) the pid
must then be a child of that node's raylet titled ``ray::RayTrainWorker…`` (and, in a
cluster the drill started, carry the drill's marker). The logs folder is the session
the GCS names for the worker's node (:func:`logs_folder`), never the path Train's state
gives; the head is the node the GCS marks as head, and a head that cannot be read is a
refusal, not a guess.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_recoverygate.orchestrators.ray.state import TrainWorker

__all__ = [
    "WORKER_CLASS",
    "GcsActor",
    "GcsJob",
    "GcsNode",
    "GcsView",
    "driver_job",
    "head_node",
    "logs_folder",
    "parse_gcs",
    "refusal",
]

#: The class of Train's worker actor (Ray 2.60: ``ray.train.v2``'s ``RayTrainWorker``).
WORKER_CLASS = "RayTrainWorker"


@dataclass(frozen=True)
class GcsActor:
    """One actor as the GCS holds it."""

    actor_id: str
    cls: str
    state: str
    job: str
    node_id: str
    ip: str
    pid: int
    worker_id: str


@dataclass(frozen=True)
class GcsNode:
    """One node as its raylet registered it."""

    node_id: str
    alive: bool
    ip: str
    head: bool
    raylet_socket: str


@dataclass(frozen=True)
class GcsJob:
    """One job (one driver) as the GCS holds it."""

    job: str
    driver_pid: int
    driver_ip: str
    dead: bool


@dataclass(frozen=True)
class GcsView:
    """The GCS's answer to the helper's ``gcs`` request."""

    actors: Mapping[str, GcsActor | None]
    jobs: tuple[GcsJob, ...]
    nodes: Mapping[str, GcsNode]


def parse_gcs(answer: Mapping[str, Any]) -> GcsView:
    """The helper's ``gcs`` answer as a :class:`GcsView` (ValueError when malformed)."""
    try:
        actors: dict[str, GcsActor | None] = {}
        for actor_id, row in dict(answer.get("actors") or {}).items():
            actors[str(actor_id)] = (
                None
                if row is None
                else GcsActor(
                    str(actor_id),
                    str(row["class"]),
                    str(row["state"]),
                    str(row["job"]),
                    str(row["node"]),
                    str(row["ip"]),
                    int(row["pid"]),
                    str(row["worker"]),
                )
            )
        jobs = tuple(
            GcsJob(str(j["job"]), int(j["driverPid"]), str(j["driverIp"]), bool(j["dead"]))
            for j in answer.get("jobs") or []
        )
        nodes = {
            str(node_id): GcsNode(
                str(node_id),
                bool(row["alive"]),
                str(row["ip"]),
                bool(row["head"]),
                str(row["raylet"]),
            )
            for node_id, row in dict(answer.get("nodes") or {}).items()
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"the GCS answer is malformed: {exc!r}") from None
    return GcsView(actors, jobs, nodes)


def driver_job(view: GcsView, driver_pid: int, local: Collection[str]) -> str | None:
    """The live job whose driver is the process the drill launched (its pid, on this
    machine); None when the GCS lists none, or more than one."""
    found = {
        j.job
        for j in view.jobs
        if not j.dead and j.driver_pid == driver_pid and j.driver_ip in local
    }
    return found.pop() if len(found) == 1 else None


def refusal(
    worker: TrainWorker, view: GcsView, jobs: Collection[str], *, gone_ok: bool = False
) -> str | None:
    """Why the drill must not take ``worker`` (as Train's state names it) for a worker of
    its job, or None when the GCS agrees with every field the drill would act on.

    ``gone_ok``: an actor the GCS lists as dead (or no longer lists) is no refusal: it is
    gone, and the caller says so (nothing is signalled either way).
    """
    who = f"rank {worker.rank} (actor {worker.actor_id[:16]}, pid {worker.pid})"
    actor = view.actors.get(worker.actor_id)
    if actor is None:
        return None if gone_ok else f"the GCS has no actor {worker.actor_id!r} for {who}"
    if actor.state != "ALIVE":
        return None if gone_ok else f"the GCS lists the actor of {who} as {actor.state}"
    if actor.cls != WORKER_CLASS:
        return f"the actor of {who} is a {actor.cls!r} in the GCS, not a {WORKER_CLASS}"
    if not jobs:
        return f"the drill's own Ray job is unknown, so {who} cannot be shown to be of it"
    if actor.job not in jobs:
        return (
            f"the actor of {who} belongs to job {actor.job}, not to the drill's job "
            f"{', '.join(sorted(jobs))}"
        )
    if actor.node_id != worker.node_id:
        return (
            f"Train's state puts {who} on node {worker.node_id[:12]}, the GCS on node "
            f"{actor.node_id[:12]}"
        )
    if actor.pid != worker.pid:
        return (
            f"Train's state names pid {worker.pid} for {who}; its raylet registered pid {actor.pid}"
        )
    return None


def head_node(view: GcsView) -> str | None:
    """The node id of the cluster's head (None: the GCS marks none)."""
    heads = [n.node_id for n in view.nodes.values() if n.head]
    return heads[0] if len(heads) == 1 else None


def logs_folder(view: GcsView, node_id: str, within: Path | None = None) -> Path | None:
    """The ``logs`` folder of the session the GCS names for ``node_id`` (its raylet's
    socket is ``<session>/sockets/raylet``); with ``within``, only a session under it (a
    cluster the drill started lives under its own ``RAY_TMPDIR``). None otherwise."""
    node = view.nodes.get(node_id)
    if node is None or not node.raylet_socket:
        return None
    socket = Path(node.raylet_socket)
    if not socket.is_absolute() or socket.parent.name != "sockets" or ".." in socket.parts:
        return None
    session = socket.parent.parent
    if within is not None and not session.is_relative_to(within):
        return None
    return session / "logs"
