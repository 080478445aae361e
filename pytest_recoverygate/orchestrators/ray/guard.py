"""The Ray drill's guard: nothing is signalled that the GCS and the node do not vouch for.

:class:`WorkerGuard` asks the cluster (through the kill server, see :mod:`.helper`) and
judges the answers with :mod:`.verify`:

- at discovery (:meth:`WorkerGuard.verify`), every worker Train's state lists is checked
  against the GCS (an alive ``RayTrainWorker`` actor of the drill's job, on that node,
  with that pid), then probed on its node by a pinned task (a child of that node's
  raylet, titled ``ray::RayTrainWorker…``, with the drill's marker in a cluster the drill
  started); the probe reads its start ticks there, so the identity a kill checks is the
  node's, never the one of whatever pid the state named. Any mismatch refuses the drill
  (ERROR at discovery, nothing signalled);
- before a signal (:meth:`WorkerGuard.target`), the GCS is read again for that actor, and
  a worker not probed yet (a replacement) is probed first; the signal itself checks the
  same identity once more on the node, through a pidfd;
- before ``KillNode`` (:meth:`WorkerGuard.check_node`), the node must host a worker that
  passes the GCS check, and must not be the head; a head the GCS does not name is a
  refusal;
- the worker logs are read from the session the GCS names for the worker's node, and only
  the file of that actor's worker id and pid (:meth:`WorkerGuard.log_files`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.orchestrators.ray.helper import environ_value
from pytest_recoverygate.orchestrators.ray.signals import Target
from pytest_recoverygate.orchestrators.ray.state import TrainWorker
from pytest_recoverygate.orchestrators.ray.verify import (
    GcsView,
    driver_job,
    head_node,
    logs_folder,
    parse_gcs,
    refusal,
)

__all__ = ["Ask", "WorkerGuard"]

#: One request to the cluster (the kill server, or a one-shot helper), with a timeout.
Ask = Callable[[dict[str, Any], float], dict[str, Any]]

TIMEOUT = 90.0  # seconds one request may take (a task on a busy node included)


class WorkerGuard:
    """What the GCS and the nodes vouch for: the drill's job, each worker's start ticks
    and worker id, each node's raylet and address."""

    def __init__(
        self,
        ask: Ask,
        *,
        local: Collection[str],
        marker: tuple[str, str] | None = None,
        within: Path | None = None,
    ) -> None:
        self._ask = ask
        self._local = local
        self.marker = marker
        self.within = within  # a cluster the drill started: its sessions live under it
        self.jobs: frozenset[str] = frozenset()  # the drill's Ray job(s), as the GCS names them
        self._lock = threading.Lock()
        self._ticks: dict[str, str] = {}  # actor id -> start ticks, read on its node
        self._raylets: dict[str, int] = {}  # node id -> its raylet's pid
        self._workers: dict[str, tuple[str, int]] = {}  # actor id -> (worker id, pid)
        self._node_ips: dict[str, str] = {}  # node id -> its address (the GCS's)
        self._logs: dict[str, Path] = {}  # node id -> its session's logs folder

    # ------------------------------------------------------------------ reads

    def gcs(self, actor_ids: Iterable[str]) -> GcsView:
        """The GCS's view of these actors, the jobs and the nodes (BackendError: unread)."""
        try:
            view = parse_gcs(self._ask({"op": "gcs", "actors": sorted(set(actor_ids))}, TIMEOUT))
        except ValueError as exc:
            raise BackendError(str(exc)) from None
        with self._lock:
            for node in view.nodes.values():
                self._node_ips[node.node_id] = node.ip
                logs = logs_folder(view, node.node_id, self.within)
                if logs is not None:
                    self._logs[node.node_id] = logs
        return view

    def find_job(self, view: GcsView, *, driver_pid: int | None, job: str | None) -> None:
        """The drill's job: the Ray Job's (``job``, from the Jobs API) or the one whose
        driver is the process the drill launched; in a cluster the drill started, when
        that process is not the driver itself (a wrapper script), every live job whose
        driver on this machine carries the drill's marker (no one else holds its token)."""
        if job is not None:
            self.jobs = frozenset({job})
            return
        own = driver_job(view, driver_pid, self._local) if driver_pid is not None else None
        if own is not None:
            self.jobs = frozenset({own})
        elif self.marker is not None:
            name, value = self.marker
            self.jobs = frozenset(
                j.job
                for j in view.jobs
                if not j.dead
                and j.driver_ip in self._local
                and environ_value(j.driver_pid, name) == value
            )

    def is_local(self, node_id: str) -> bool:
        """Whether the node is this machine, by the address its raylet registered."""
        with self._lock:
            return self._node_ips.get(node_id) in self._local

    def ticks(self, actor_id: str) -> str | None:
        with self._lock:
            return self._ticks.get(actor_id)

    # ------------------------------------------------------------------ checks

    def verify(
        self, workers: Iterable[TrainWorker], *, driver_pid: int | None, job: str | None
    ) -> None:
        """Discovery: every worker checked against the GCS, then probed on its node;
        DiscoveryError naming the first mismatch (nothing was signalled)."""
        workers = list(workers)
        try:
            view = self.gcs(w.actor_id for w in workers)
        except BackendError as exc:
            raise DiscoveryError(
                f"the drill could not read the GCS to check Train's workers ({exc}); "
                "nothing was signalled"
            ) from None
        self.find_job(view, driver_pid=driver_pid, job=job)
        for worker in workers:
            why = refusal(worker, view, self.jobs)
            if why is not None:
                raise DiscoveryError(
                    f"refusing the Train run: {why}. Train's state is written by job code; "
                    "the drill signals only what the GCS lists as the job's (nothing was "
                    "signalled)"
                )
            self._remember(view, worker)
        for worker in workers:
            try:
                self._probe(worker)
            except BackendError as exc:
                raise DiscoveryError(
                    f"refusing the Train run: {exc} (nothing was signalled)"
                ) from None

    def _remember(self, view: GcsView, worker: TrainWorker) -> None:
        actor = view.actors.get(worker.actor_id)
        if actor is not None:
            with self._lock:
                self._workers[worker.actor_id] = (actor.worker_id, actor.pid)

    def _probe(self, worker: TrainWorker) -> str:
        """The worker's start ticks, read on its node by a pinned task that also checks its
        parent (the node's raylet), title and marker; BackendError when it is not such a
        worker or the task did not answer."""
        answer = self._ask(
            {
                "op": "probe",
                "node": worker.node_id,
                "pid": worker.pid,
                "marker": list(self.marker) if self.marker else None,
            },
            TIMEOUT,
        )
        if answer.get("outcome") != "ok":
            raise BackendError(
                f"rank {worker.rank}'s pid {worker.pid} on node {worker.node_id[:12]}: "
                f"{answer.get('detail', answer.get('outcome'))}"
            )
        ticks, raylet = str(answer["ticks"]), int(answer["raylet"])
        with self._lock:
            self._ticks[worker.actor_id] = ticks
            self._raylets[worker.node_id] = raylet
        return ticks

    def target(self, worker: TrainWorker, ticks: str | None) -> Target | None:
        """The instance to signal, as the GCS and its node vouch for it: None when the
        GCS says the actor is gone; BackendError when anything disagrees (nothing is
        sent). ``ticks``: the identity the drill holds for it (None: probe it now)."""
        view = self.gcs([worker.actor_id])
        why = refusal(worker, view, self.jobs, gone_ok=True)
        if why is not None:
            raise BackendError(
                f"refusing to signal {worker.pid}: {why}; Train's state is written by job "
                "code (nothing was sent)"
            )
        actor = view.actors.get(worker.actor_id)
        if actor is None or actor.state != "ALIVE":
            return None
        self._remember(view, worker)
        known = ticks or self.ticks(worker.actor_id) or self._probe(worker)
        with self._lock:
            raylet = self._raylets.get(worker.node_id)
        return Target(
            worker.node_id,
            worker.pid,
            known,
            self.is_local(worker.node_id),
            raylet,
            self.marker,
        )

    def check_node(self, node_id: str, workers: Iterable[TrainWorker]) -> None:
        """KillNode: the node must host a worker the GCS vouches for, and not be the head
        (BackendError otherwise, nothing sent)."""
        workers = [w for w in workers if w.node_id == node_id]
        view = self.gcs(w.actor_id for w in workers)
        vouched = [w for w in workers if refusal(w, view, self.jobs) is None]
        if not vouched:
            reasons = (
                "; ".join(str(refusal(w, view, self.jobs)) for w in workers[:3])
                or "Train's state lists no worker there"
            )
            raise BackendError(
                f"refusing KillNode on node {node_id[:12]}: it hosts no worker the GCS lists as "
                f"the job's ({reasons}); nothing was sent"
            )
        head = head_node(view)
        if head is None:
            raise BackendError(
                f"refusing KillNode on node {node_id[:12]}: the GCS names no head node, so it "
                "cannot be shown not to be the head (its raylet's death would end the whole "
                "cluster); nothing was sent"
            )
        if node_id == head:
            raise BackendError(
                f"node {node_id[:12]} is the Ray head: ending its raylet ends the whole "
                "cluster, not a node of it; set injectFailure.targetRank (or targetNode) to "
                "a worker on another node"
            )

    # ------------------------------------------------------------------ logs

    def logs_folder(self, node_id: str) -> Path | None:
        """The logs folder of the session the GCS names for the node (if on this machine)."""
        with self._lock:
            return self._logs.get(node_id) if self._node_ips.get(node_id) in self._local else None

    def log_files(self, worker: TrainWorker) -> list[Path]:
        """The worker's own ``worker-<worker id>-<job>-<pid>.out`` in that folder; empty
        while the GCS has not vouched for it (it is asked, once per call)."""
        folder = self.logs_folder(worker.node_id)
        if folder is None:
            return []
        with self._lock:
            known = self._workers.get(worker.actor_id)
        if known is None:
            try:
                view = self.gcs([worker.actor_id])
            except BackendError:
                return []
            if refusal(worker, view, self.jobs) is not None:
                return []
            self._remember(view, worker)
            with self._lock:
                known = self._workers.get(worker.actor_id)
        if known is None or not all(c in "0123456789abcdef" for c in known[0]):
            return []
        worker_id, pid = known
        return sorted(folder.glob(f"worker-{worker_id}-*-{pid}.out"))
