"""The group watch: the job's pods as the API server changes them, turned into group events.

A background thread lists, then watches from the list's resourceVersion with bookmarks
and a bounded ``timeoutSeconds``; a clean end or a dropped connection resumes from the
last resourceVersion the stream delivered (a stream cut every few events still
advances), a 410 re-lists (backing off only when 410s repeat with nothing delivered in
between). Each change updates the pod table and is judged against the victim: gone
(deleted, terminating, or ended), restarted containers, the replacement -- the pod with
the victim's rank, another uid, no deletionTimestamp -- Pending then Running, a
replacement in CrashLoopBackOff or every pod Failed (the job will not come back).
PyTorchJob reuses the pod name; TrainJob pods get new names while a finalizer keeps the
old one Terminating: both are the same rule.
"""

from __future__ import annotations

import json
import queue
import threading
from dataclasses import dataclass
from typing import Any

from pytest_recoverygate.engine.model import GroupEvent, GroupEventKind, Worker
from pytest_recoverygate.errors import DiscoveryError, PermissionDeniedError
from pytest_recoverygate.orchestrators.kubernetes.api import ApiSession, is_transient, iter_lines
from pytest_recoverygate.orchestrators.kubernetes.pods import (
    Job,
    Pod,
    is_terminating,
    job_of,
    pod_name,
    pod_phase,
    pod_rank,
    pod_uid,
    restart_total,
    waiting_reasons,
    worker_of,
)

__all__ = ["GroupWatch"]


@dataclass
class _Watched:
    """What the group watcher knows about the victim and what it already reported."""

    victim: Worker | None = None
    gone: bool = False
    pending_uid: str = ""
    running_uid: str = ""
    failed: bool = False
    succeeded: bool = False
    restarts: int = 0
    node: str = ""  # a node fault: every pod of the job on it, by uid (NODE_GONE once all go)
    node_uids: frozenset[str] = frozenset()
    node_gone: bool = False


class GroupWatch:
    """The job's pod table, kept by a watch thread, and the group events it shows."""

    def __init__(self, session: ApiSession, *, watch_timeout_seconds: int) -> None:
        self._session = session
        self._clock = session.clock
        self.watch_timeout_seconds = watch_timeout_seconds
        self._lock = threading.Lock()
        self._pods: dict[str, Pod] = {}
        self._ranks: dict[str, int] = {}
        self._job = ""
        self._job_key = ""
        self._job_has_master = False
        self._list_rv = ""
        self._cursor: str | None = None  # the watch thread's last resourceVersion seen
        self._watched = _Watched()
        self._events: queue.SimpleQueue[GroupEvent] = queue.SimpleQueue()

    # ------------------------------------------------------------------ the orchestrator's side

    def adopt(self, job: Job, pods: list[Pod], resource_version: str) -> None:
        """Start from what discovery listed."""
        with self._lock:
            self._pods = {pod_uid(p): p for p in pods}
            self._ranks = dict(job.ranks)
            self._job = job.name
            self._job_key = job.key
            self._job_has_master = job.has_master
            self._list_rv = resource_version
            self._watched.restarts = sum(restart_total(p) for p in pods)

    def arm(
        self, victim: Worker, *, node: str = "", node_uids: frozenset[str] = frozenset()
    ) -> None:
        """A real kill of ``victim`` is about to be sent: watch for its end and replacement
        (and, for a node fault, for every pod ``node_uids`` of ``node`` to be gone)."""
        with self._lock:
            self._watched = _Watched(
                victim=victim, restarts=self._watched.restarts, node=node, node_uids=node_uids
            )

    def drain(self) -> list[GroupEvent]:
        """The group events seen since the previous call."""
        out = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def ranks(self) -> list[int]:
        """Every rank the job's pods hold (or held)."""
        with self._lock:
            return sorted(set(self._ranks.values()))

    def pod_of_rank(self, rank: int) -> Pod | None:
        """The live pod that holds ``rank`` now (Running first, then Pending)."""
        with self._lock:
            candidates = [
                p
                for uid, p in self._pods.items()
                if self._ranks.get(uid) == rank and not is_terminating(p)
            ]
        candidates.sort(key=lambda p: (pod_phase(p) != "Running", pod_phase(p) != "Pending"))
        return candidates[0] if candidates else None

    # ------------------------------------------------------------------ the thread

    def run(self) -> None:
        """List, then watch from its resourceVersion; resume on drops, re-list on 410."""
        from kubernetes.client.exceptions import ApiException

        session, stop = self._session, self._session.stop
        api = session.new_api()
        rv: str | None = self._list_rv
        failures = 0
        expired = 0  # 410s in a row with no event in between
        while not stop.is_set():
            self._cursor = None
            try:
                if rv is None:
                    if expired > 1:  # a watch cache that keeps expiring us: do not spin
                        stop.wait(session.retry.wait(min(expired, 5)))
                    pods, rv = session.list_pods(api)
                    self._replace_all(pods)
                    self._cursor = rv
                listed = self._cursor
                rv = self._watch_once(api, rv)
                failures = 0
                # a 410 after the stream delivered something is no sign of a stuck cache
                delivered = self._cursor not in (None, listed)
                expired = expired + 1 if rv is None and not delivered else 0
                continue
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
                    expired += 1
                    continue
                if exc.status == 403:
                    session.set_fatal(session.forbidden("watch", "pods", exc))
                    return
                error: BaseException | None = exc
            except PermissionDeniedError as exc:
                session.set_fatal(exc)
                return
            except Exception as exc:  # a dropped stream, a timeout, a retried-out list
                if stop.is_set():
                    return
                error = exc if is_transient(exc) else None
            # Resume from the last resourceVersion this stream delivered, not the one it
            # started from: a stream cut every few events would otherwise replay the same
            # few events forever. A stream that delivered something was no failure.
            cursor = self._cursor
            if cursor is not None and cursor != rv:
                rv, failures, expired = cursor, 0, 0
            failures += 1
            stop.wait(session.retry.wait(failures, error))

    def _watch_once(self, api: Any, rv: str) -> str | None:
        """One watch request; returns the resourceVersion to resume from (None: re-list)."""
        from kubernetes.client.exceptions import ApiException

        session = self._session
        resp = api.list_namespaced_pod(
            session.namespace,
            label_selector=session.selector,
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_seconds,
            _preload_content=False,
            _request_timeout=(5, self.watch_timeout_seconds + 30),
        )
        with session.tracked(resp):
            for line in iter_lines(resp):
                if session.stop.is_set():
                    return rv
                try:
                    event = json.loads(line)
                    kind, obj = event["type"], event["object"]
                except (ValueError, KeyError, TypeError):
                    continue
                if kind == "ERROR":
                    code = obj.get("code") if isinstance(obj, dict) else None
                    if code == 410:
                        return None
                    raise ApiException(
                        status=code or 500, reason=str(obj.get("message", "watch error"))
                    )
                new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._apply(kind, obj)
                rv = new_rv
                self._cursor = rv  # where to resume if the stream breaks now
        return rv

    def _replace_all(self, pods: list[Pod]) -> None:
        """After a re-list: pods missing from it were deleted while we were not watching."""
        listed = {pod_uid(p) for p in pods}
        with self._lock:
            missing = [p for uid, p in self._pods.items() if uid not in listed]
        for pod in missing:
            self._apply("DELETED", pod)
        for pod in pods:
            self._apply("MODIFIED", pod)

    # ------------------------------------------------------------------ judging a change

    def _apply(self, event: str, pod: Pod) -> None:
        """One watch event into the pod table, then what changed for the drill."""
        uid = pod_uid(pod)
        if job_of(pod) != self._job_key:
            return  # another job's pod that also matches the selector: not ours
        with self._lock:
            if event == "DELETED":
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = pod
                if uid not in self._ranks:
                    try:
                        rank = pod_rank(pod, job_has_master=self._job_has_master)
                    except DiscoveryError:
                        rank = None
                    if rank is not None:
                        self._ranks[uid] = rank
        self._evaluate()

    def _evaluate(self) -> None:
        with self._lock:
            watched = self._watched
            pods = list(self._pods.values())
            ranks = dict(self._ranks)
        emits: list[tuple[GroupEventKind, str, Worker | None, int | None]] = []
        with self._lock:
            restarts = sum(restart_total(p) for p in pods)
            if watched.victim is not None and restarts > watched.restarts:
                watched.restarts = restarts
                emits.append(
                    (
                        GroupEventKind.RESTARTING,
                        f"containers of {self._job} restarted ({restarts} restarts in all)",
                        None,
                        restarts,
                    )
                )
            victim = watched.victim
            if victim is not None:
                emits += self._victim_changes(watched, victim, pods, ranks)
            members = [p for p in pods if pod_uid(p) in ranks and not is_terminating(p)]
            if members and all(pod_phase(p) == "Failed" for p in members) and not watched.failed:
                watched.failed = True
                emits.append(
                    (GroupEventKind.JOB_FAILED, f"every pod of {self._job} is Failed", None, None)
                )
            if (
                members
                and all(pod_phase(p) == "Succeeded" for p in members)
                and not (watched.succeeded or watched.failed)
            ):
                # The job finished: a recovery that trained on and ended inside the sustain
                # window is judged on it (a successful end, not a stall).
                watched.succeeded = True
                emits.append(
                    (
                        GroupEventKind.JOB_SUCCEEDED,
                        f"every pod of {self._job} is Succeeded",
                        None,
                        None,
                    )
                )
        for kind, detail, who, count in emits:
            self._emit(kind, detail, who, count)

    def _victim_changes(
        self, watched: _Watched, victim: Worker, pods: list[Pod], ranks: dict[str, int]
    ) -> list[tuple[GroupEventKind, str, Worker | None, int | None]]:
        """The victim's end and its replacement's progress (called under the lock)."""
        emits: list[tuple[GroupEventKind, str, Worker | None, int | None]] = []
        current = next((p for p in pods if pod_uid(p) == victim.instance_id), None)
        if watched.node and not watched.node_gone:
            live = {pod_uid(p) for p in pods if not is_terminating(p)}
            if not watched.node_uids & live:
                watched.node_gone = True
                emits.append(
                    (
                        GroupEventKind.NODE_GONE,
                        f"every pod of {self._job} on node {watched.node} is gone "
                        f"({len(watched.node_uids)} pod(s))",
                        victim,
                        None,
                    )
                )
        if not watched.gone and (
            current is None
            or is_terminating(current)
            or pod_phase(current) in ("Failed", "Succeeded")
        ):
            watched.gone = True
            state = (
                "deleted"
                if current is None
                else ("terminating" if is_terminating(current) else pod_phase(current))
            )
            emits.append(
                (
                    GroupEventKind.WORKER_GONE,
                    f"pod {victim.name} (uid {victim.instance_id}) is {state}",
                    victim,
                    None,
                )
            )
        for pod in pods:
            uid = pod_uid(pod)
            if uid == victim.instance_id or ranks.get(uid) != victim.rank or is_terminating(pod):
                continue
            worker = worker_of(pod, victim.rank, namespace=self._session.namespace, job=self._job)
            phase = pod_phase(pod)
            if phase == "Pending" and uid not in (watched.pending_uid, watched.running_uid):
                watched.pending_uid = uid
                emits.append(
                    (
                        GroupEventKind.REPLACEMENT_PENDING,
                        f"replacement pod {pod_name(pod)} (uid {uid}) is Pending",
                        worker,
                        None,
                    )
                )
            elif phase == "Running" and watched.running_uid != uid:
                watched.running_uid = uid
                emits.append(
                    (
                        GroupEventKind.REPLACEMENT_RUNNING,
                        f"replacement pod {pod_name(pod)} (uid {uid}) is Running",
                        worker,
                        None,
                    )
                )
            if "CrashLoopBackOff" in waiting_reasons(pod) and not watched.failed:
                watched.failed = True
                emits.append(
                    (
                        GroupEventKind.JOB_FAILED,
                        f"replacement pod {pod_name(pod)} is in CrashLoopBackOff",
                        worker,
                        None,
                    )
                )
        return emits

    def _emit(
        self,
        kind: GroupEventKind,
        detail: str,
        worker: Worker | None = None,
        restarts: int | None = None,
    ) -> None:
        self._events.put(
            GroupEvent(
                kind=kind,
                timestamp=self._clock.now(),
                detail=detail,
                worker=worker,
                restart_count=restarts,
            )
        )
        self._clock.wakeup()
