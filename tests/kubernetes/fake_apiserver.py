"""A small Kubernetes API server for the tests that need one to misbehave on cue.

Why it exists: the Kubernetes drills run on a real cluster (tests/kubernetes/kube_cluster.py),
but a real API server cannot be made to answer one chosen request with a 500 or a 429, to
reset a connection before or after it acted, to hold or slow a request, to drop a watch or
end it with 410 Gone, or to cut a log stream after N lines; nor does it keep a log of the
requests it got, which is how a test sees that a request was never sent. This server does,
and speaks the wire protocol the real ``kubernetes`` client uses, so the adapter is tested
through the real client, its urllib3 pool, its retries and its (de)serialisation.

Standard library only. What it emulates (core/v1 pods in any namespace), no more than what
the adapter sends:

- ``GET  /api/v1/namespaces/{ns}/pods``: list, ``labelSelector`` (equality: ``=``, ``==``,
  ``!=``), ``watch=true`` with ``resourceVersion`` resume, ``timeoutSeconds``,
  ``allowWatchBookmarks``; a resourceVersion older than the last :meth:`compact` gets
  what the apiserver sends: HTTP 200, then an ``ERROR`` event carrying a 410 Status.
- ``DELETE /api/v1/namespaces/{ns}/pods/{name}``: ``DeleteOptions`` body with
  ``preconditions.uid`` (409 Conflict on mismatch), ``gracePeriodSeconds`` (0: a MODIFIED
  event with ``deletionTimestamp`` then DELETED), finalizers (the pod stays Terminating
  until they are removed), ``dryRun=All`` (authorised and validated, nothing changes).
- ``GET  /api/v1/namespaces/{ns}/pods/{name}/log``: ``follow``, ``timestamps`` (RFC 3339
  with 9 fractional digits, as the kubelet writes them), ``sinceSeconds``; 400 "is waiting
  to start" while the container has not started; a followed stream ends when the
  container stops.
- ``GET``/``PATCH /api/v1/nodes/{name}`` (a merge patch of ``spec``, dry run) and
  ``POST .../pods/{name}/eviction`` (dry run, else a graceful delete): what KillNode,
  DrainNode and cordon send, for the node tests under faults.
- Status bodies for 400/401/403/404/409/410/429/500 shaped like the apiserver's; an RBAC
  allow-list of (verb, resource) pairs.
- Fault injection per request (:class:`Fault` from :attr:`FakeApiServer.fault_hook`):
  delay, a gate, a Status error with ``Retry-After``, a TCP reset before or after acting, a
  stream cut after N lines (or N lines after a log's replayed backlog), a log backlog
  re-sent newest first, a watch ended by a 410 ``ERROR`` event after N events;
  :meth:`drop_streams` cuts every open stream at once.
- A stream handler ends when its client hangs up (checked while the stream is silent), and
  every connection has TCP_NODELAY, so a kept-alive request does not wait ~40 ms for the
  client's delayed ACK.
- A request log (:class:`LoggedRequest`): method, path, query, verb, resource, status,
  whether a destructive change happened and to which pod instance.

What it does not emulate (the real cluster's tests cover the real thing): other resources
and API groups, creating or reading single pods over HTTP, set-based selectors and a label
change moving a pod out of a watch's selector, field selectors, pagination, discovery (so
no kubectl), ``sinceTime``/``tailLines``/``previous`` logs and choosing a container,
PodDisruptionBudgets, server-side apply, admission, protobuf, TLS and real authentication
(a bearer token is checked only when one is configured), watch-cache lag, and the kubelet
and operators (the helpers in :mod:`tests.kubernetes.fake_cluster` play those).
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import json
import re
import select
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "RBAC_DRILL_RULES",
    "RBAC_NODE_RULES",
    "ContainerLog",
    "FakeApiServer",
    "Fault",
    "LoggedRequest",
    "RequestInfo",
    "format_timestamp",
    "parse_selector",
    "selector_matches",
]

Pod = dict[str, Any]

#: The permissions a drill needs, exactly as examples/kubernetes/rbac.yaml grants them.
RBAC_DRILL_RULES: frozenset[tuple[str, str]] = frozenset(
    {("list", "pods"), ("watch", "pods"), ("delete", "pods"), ("get", "pods/log")}
)
#: What examples/kubernetes/rbac-nodes.yaml adds, opt-in: cordon (nodes get/patch, a
#: ClusterRole: nodes are cluster-scoped) and DrainNode (pods/eviction create).
RBAC_NODE_RULES: frozenset[tuple[str, str]] = frozenset(
    {("get", "nodes"), ("patch", "nodes"), ("create", "pods/eviction")}
)


def format_timestamp(ts: float) -> str:
    """The kubelet's log timestamp: RFC 3339, UTC, always 9 fractional digits."""
    whole = int(ts)
    nanos = round((ts - whole) * 1e9)
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    base = datetime.fromtimestamp(whole, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{nanos:09d}Z"


def _rfc3339(ts: float) -> str:
    """Object timestamps (creationTimestamp, deletionTimestamp): second resolution."""
    return datetime.fromtimestamp(int(ts), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------- label selectors

Requirement = tuple[str, str, str]  # (key, operator "=" or "!=", value)

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"


def parse_selector(text: str) -> list[Requirement]:
    """An equality-based label selector (``a=b,c!=d``); ValueError for anything else."""
    requirements: list[Requirement] = []
    if not text.strip():
        return requirements
    for raw in text.split(","):
        part = raw.strip()
        match = re.fullmatch(rf"({_KEY})\s*(==|!=|=)\s*(.*)", part)
        if match is None:
            raise ValueError(f"unable to parse requirement: {part!r}")
        key, op, value = match.group(1), match.group(3), match.group(4).strip()
        if not re.fullmatch(_VALUE, value):
            raise ValueError(f"invalid label value: {value!r}")
        requirements.append((key, "!=" if op == "!=" else "=", value))
    return requirements


def selector_matches(requirements: list[Requirement], labels: dict[str, str]) -> bool:
    return all((labels.get(key) == value) == (op == "=") for key, op, value in requirements)


# ---------------------------------------------------------------------- faults and log


@dataclass(frozen=True)
class RequestInfo:
    """What the fault hook sees of a request before the server acts on it."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    resource: str
    namespace: str
    name: str
    body: dict[str, Any] | None
    seq: int


@dataclass(frozen=True)
class Fault:
    """What to do to one request; the fields compose (delay, then the rest).

    ``reset_before``: close the TCP connection with a reset before acting (the client sees a
    connection error and nothing happened). ``reset_after``: act, then reset instead of
    answering (the client cannot know it happened). ``status``: answer with that Status
    code (and ``Retry-After`` when given) without acting. ``drop_after_lines``: for watch and
    log streams, reset the connection after that many lines. ``gate``: hold the request
    (logged, not acted on) until the test sets the event: a barrier, where ``delay`` is a
    time window.

    Stream faults that model what a log pipeline or a busy apiserver does across reconnects:
    ``drop_after_new_lines`` (log) resets the stream that many lines after the backlog it
    replays (the lines already written when the request came, from ``sinceSeconds`` on);
    ``replay_backwards`` (log) sends the backlog's last N lines once more, newest first,
    after the backlog (duplicated and out of order); ``expire_after_lines`` (watch) ends the
    stream with an ``ERROR`` event carrying a 410 Status after that many events, as the
    apiserver does when the watch cache drops the watcher's resourceVersion mid-stream.
    """

    delay: float = 0.0
    gate: threading.Event | None = None
    status: int | None = None
    retry_after: int | None = None
    message: str = ""
    reset_before: bool = False
    reset_after: bool = False
    drop_after_lines: int | None = None
    drop_after_new_lines: int | None = None
    replay_backwards: int = 0
    expire_after_lines: int | None = None

    def describe(self) -> str:
        parts = []
        if self.delay:
            parts.append(f"delay {self.delay:g}s")
        if self.gate is not None:
            parts.append("held at a gate")
        if self.status is not None:
            parts.append(f"status {self.status}")
        if self.reset_before:
            parts.append("reset before acting")
        if self.reset_after:
            parts.append("reset after acting")
        if self.drop_after_lines is not None:
            parts.append(f"drop after {self.drop_after_lines} lines")
        if self.drop_after_new_lines is not None:
            parts.append(f"drop {self.drop_after_new_lines} lines after the backlog")
        if self.replay_backwards:
            parts.append(f"replay {self.replay_backwards} lines backwards")
        if self.expire_after_lines is not None:
            parts.append(f"410 after {self.expire_after_lines} events")
        return ", ".join(parts) or "none"


FaultHook = Callable[[RequestInfo], "Fault | None"]


@dataclass
class LoggedRequest:
    """One request as the server saw it. ``acted``: a destructive change was made."""

    seq: int
    time: float
    method: str
    path: str
    query: dict[str, str]
    verb: str
    resource: str
    namespace: str
    name: str
    status: int | None = None  # None: the connection was reset instead of answered
    acted: bool = False
    dry_run: bool = False
    precondition_uid: str | None = None
    target_uid: str | None = None  # the pod instance a delete reached
    grace_period: int | None = None  # a delete's gracePeriodSeconds (None: not given)
    fault: str = ""
    lines_sent: int = 0
    finished: float | None = None  # when its handler was done (None: still at work)

    @property
    def streams(self) -> bool:
        """A watch or a followed log: open for as long as the client reads it."""
        return self.verb == "watch" or self.query.get("follow") in _TRUE


@dataclass
class ContainerLog:
    """One container instance's output; a restart starts a new instance."""

    name: str
    state: str = "waiting"  # waiting | running | terminated
    waiting_reason: str = "ContainerCreating"
    lines: list[tuple[float, str]] = field(default_factory=list)
    exit_code: int | None = None


class _Reset(Exception):
    """Raised inside a handler to reset the client's connection."""


class _Expired(Exception):
    """Raised inside a watch handler once it has ended the stream with a 410 ERROR event."""


# ---------------------------------------------------------------------- the server


class FakeApiServer:
    """The store, the watch history and the HTTP front end, on 127.0.0.1:<free port>.

    Use as a context manager or call :meth:`start` / :meth:`stop`. All state sits behind
    one condition variable; watchers and log followers wait on it.
    """

    def __init__(
        self,
        *,
        allowed: frozenset[tuple[str, str]] | None = None,
        token: str | None = None,
        bookmark_interval: float = 1.0,
    ) -> None:
        self.allowed = allowed
        self.token = token
        self.bookmark_interval = bookmark_interval
        self.user = "system:serviceaccount:default:recoverygate"
        self.fault_hook: FaultHook | None = None
        self.requests: list[LoggedRequest] = []
        self._cond = threading.Condition()
        self._rv = 1000
        self._pods: dict[tuple[str, str], Pod] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        self._history: list[tuple[int, str, Pod]] = []
        self._compacted_rv = 0
        self._logs: dict[str, dict[str, ContainerLog]] = {}
        self._subscribers: list[Callable[[str, Pod], None]] = []
        self._stream_generation = 0
        self._closing = False
        self._seq = 0
        self._timers: list[threading.Timer] = []
        self._connections: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeApiServer:
        server = self

        class Handler(_Handler):
            api = server

        httpd = _QuietServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        httpd.block_on_close = False
        self._httpd = httpd
        self._thread = threading.Thread(  # a short poll: stop() waits one poll interval
            target=httpd.serve_forever, args=(0.05,), name="fake-apiserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._closing = True
            timers = list(self._timers)
            self._cond.notify_all()
        for timer in timers:
            timer.cancel()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        for conn in list(self._connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() the server first"
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def write_kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        """A kubeconfig whose current context points at this server (JSON is valid YAML)."""
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake-user", "user": user}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake-user", "namespace": namespace},
                }
            ],
            "current-context": "fake",
            "preferences": {},
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    # ------------------------------------------------------------------ store API (helpers)

    def subscribe(self, callback: Callable[[str, Pod], None]) -> None:
        """Call ``callback(event_type, pod_copy)`` after every change (outside the lock)."""
        with self._cond:
            self._subscribers.append(callback)

    def create_pod(self, pod: Pod) -> Pod:
        """Store a new pod (``generateName`` honoured); returns the stored copy."""
        with self._cond:
            created = self._create_locked(copy.deepcopy(pod))
        self._notify("ADDED", created)
        return created

    def update_pod(self, namespace: str, name: str, mutate: Callable[[Pod], None]) -> Pod:
        """Apply ``mutate`` to the stored pod and record a MODIFIED event."""
        with self._cond:
            pod = self._pods[(namespace, name)]
            mutate(pod)
            updated = self._touch_locked(pod, "MODIFIED")
            # Removing the last finalizer of a terminating pod completes its deletion.
            if pod["metadata"].get("deletionTimestamp") and not pod["metadata"].get("finalizers"):
                self._remove_locked(pod)
                removed = copy.deepcopy(pod)
            else:
                removed = None
        self._notify("MODIFIED", updated)
        if removed is not None:
            self._notify("DELETED", removed)
        return updated

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        with self._cond:
            pod = self._pods.get((namespace, name))
            return copy.deepcopy(pod) if pod is not None else None

    def pods(self, namespace: str | None = None) -> list[Pod]:
        with self._cond:
            return [
                copy.deepcopy(p)
                for (ns, _), p in sorted(self._pods.items())
                if namespace in (None, ns)
            ]

    # ------------------------------------------------------------------ nodes

    def add_node(self, name: str) -> dict[str, Any]:
        """A Ready, schedulable node (``/api/v1/nodes/NAME``); returns its copy."""
        with self._cond:
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "uid": str(uuid.uuid4()),
                    "creationTimestamp": _rfc3339(time.time()),
                    "resourceVersion": str(self._next_rv()),
                    "labels": {"kubernetes.io/hostname": name},
                },
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
            self._nodes[name] = node
            return copy.deepcopy(node)

    def unschedulable(self, name: str) -> bool:
        """Is the node cordoned (``spec.unschedulable``)?"""
        with self._cond:
            node = self._nodes.get(name)
            return bool(node and node["spec"].get("unschedulable"))

    def _patch_node(
        self, name: str, body: dict[str, Any], query: dict[str, str], entry: LoggedRequest
    ) -> tuple[int, dict[str, Any]]:
        """A merge patch of ``spec`` (what ``kubectl cordon`` sends); ``dryRun=All`` previews."""
        with self._cond:
            node = self._nodes.get(name)
            if node is None:
                return 404, _status(404, "NotFound", f'nodes "{name}" not found', name=name)
            spec = body.get("spec")
            if not isinstance(spec, dict) or set(body) - {"spec", "metadata"}:
                return 400, _status(400, "BadRequest", f"the fake patches node spec only: {body}")
            result = copy.deepcopy(node)
            for key, value in spec.items():
                if value is None:
                    result["spec"].pop(key, None)
                else:
                    result["spec"][key] = value
            if query.get("dryRun") == "All":
                entry.dry_run = True
                return 200, result
            entry.acted = True
            result["metadata"]["resourceVersion"] = str(self._next_rv())
            self._nodes[name] = result
            return 200, copy.deepcopy(result)

    def _evict(
        self,
        namespace: str,
        name: str,
        body: dict[str, Any],
        query: dict[str, str],
        entry: LoggedRequest,
    ) -> tuple[int, dict[str, Any]]:
        """policy/v1 Eviction: a graceful delete of the pod (no PodDisruptionBudgets here:
        the real cluster's DrainNode drills have those)."""
        options = dict(body.get("deleteOptions") or {})
        dry_run = query.get("dryRun") == "All" or options.get("dryRun") == ["All"]
        with self._cond:
            pod = self._pods.get((namespace, name))
            if pod is None:
                return 404, _status(404, "NotFound", f'pods "{name}" not found', name=name)
            if "gracePeriodSeconds" not in options:
                spec_grace = pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)
                options["gracePeriodSeconds"] = spec_grace
        if dry_run:
            options["dryRun"] = ["All"]
        code, result = self._delete(namespace, name, options, {}, entry)
        if code != 200:
            return code, result
        done = _status(201, "", "")
        done.update(status="Success", code=201)
        return 201, done

    def remove_finalizers(self, namespace: str, name: str) -> None:
        if self.get_pod(namespace, name) is None:
            return
        self.update_pod(namespace, name, lambda pod: pod["metadata"].pop("finalizers", None))

    def start_container(self, namespace: str, name: str, *, status_lag: float = 0.0) -> None:
        """The kubelet started the (first) container: phase Running, logs can be read.

        ``status_lag``: a restart's new log is served at once and the pod's status shows
        the restart that many seconds later, as a kubelet that posts status on its own
        schedule (its list and its watch both lag).
        """
        started = time.time()
        restarted = False

        def start_log(pod: Pod) -> None:
            nonlocal restarted
            uid = pod["metadata"]["uid"]
            cname = _first(pod)
            log = self._logs[uid][cname]
            if log.state == "terminated":  # a restart: a new instance, a new log
                log = self._logs[uid][cname] = ContainerLog(cname)
                restarted = True
            log.state = "running"

        def show(pod: Pod) -> None:
            cname = _first(pod)
            if restarted:
                self._bump_restart(pod, cname)
            pod["status"]["phase"] = "Running"
            pod["status"].setdefault("startTime", _rfc3339(started))
            self._set_container_status(
                pod, cname, {"running": {"startedAt": _rfc3339(started)}}, ready=True
            )

        with self._cond:
            start_log(self._pods[(namespace, name)])
            self._cond.notify_all()

        def post() -> None:
            self.update_pod(namespace, name, show)

        if restarted and status_lag > 0:
            self._schedule(status_lag, post)
        else:
            post()

    def stop_container(
        self,
        namespace: str,
        name: str,
        *,
        exit_code: int = 0,
        phase: str | None = None,
    ) -> None:
        """The (first) container exited: followers of its log see the end of the stream."""

        def mutate(pod: Pod) -> None:
            cname = _first(pod)
            self._terminate_log(pod["metadata"]["uid"], cname, exit_code)
            reason = "Completed" if exit_code == 0 else "Error"
            running = next(
                (
                    (c.get("state") or {}).get("running") or {}
                    for c in pod["status"].get("containerStatuses", [])
                    if c["name"] == cname
                ),
                {},
            )
            state = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": reason,
                    "startedAt": running.get("startedAt") or _rfc3339(time.time()),
                    "finishedAt": _rfc3339(time.time()),
                }
            }
            self._set_container_status(pod, cname, state, ready=False)
            if phase is not None:
                pod["status"]["phase"] = phase

        self.update_pod(namespace, name, mutate)

    def set_waiting(self, namespace: str, name: str, reason: str) -> None:
        """Container waiting (e.g. ``CrashLoopBackOff``); its last instance's log stays readable."""

        def mutate(pod: Pod) -> None:
            self._set_container_status(
                pod, _first(pod), {"waiting": {"reason": reason}}, ready=False
            )

        self.update_pod(namespace, name, mutate)

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        self.update_pod(namespace, name, lambda pod: pod["status"].__setitem__("phase", phase))

    def append_log(
        self,
        namespace: str,
        name: str,
        text: str,
        *,
        ts: float | None = None,
    ) -> bool:
        """Append a line (no newline) to the running container; False if none is running."""
        with self._cond:
            pod = self._pods.get((namespace, name))
            if pod is None:
                return False
            log = self._logs[pod["metadata"]["uid"]][_first(pod)]
            if log.state != "running":
                return False
            log.lines.append((time.time() if ts is None else ts, text))
            self._cond.notify_all()
            return True

    def compact(self) -> int:
        """Forget the watch history: a watch from any older resourceVersion gets 410."""
        with self._cond:
            self._compacted_rv = self._rv
            self._history.clear()
            self._cond.notify_all()
            return self._rv

    def drop_streams(self) -> None:
        """Reset every open watch and log stream (as a load balancer or apiserver restart would)."""
        with self._cond:
            self._stream_generation += 1
            self._cond.notify_all()

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def deletes(self, *, acted_only: bool = False) -> list[LoggedRequest]:
        with self._cond:
            return [
                r for r in self.requests if r.method == "DELETE" and (r.acted or not acted_only)
            ]

    def unfinished(self) -> list[LoggedRequest]:
        """Requests whose handler is still at work (a delayed fault sleeping, a delete
        about to act), streams left out: what a test waits on before it reads the log."""
        with self._cond:
            return [r for r in self.requests if r.finished is None and not r.streams]

    def requests_outside(
        self, rules: frozenset[tuple[str, str]] = RBAC_DRILL_RULES
    ) -> list[LoggedRequest]:
        """Logged resource requests whose (verb, resource) is not in ``rules``."""
        with self._cond:
            return [r for r in self.requests if r.resource and (r.verb, r.resource) not in rules]

    # ------------------------------------------------------------------ internals (locked)

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _create_locked(self, pod: Pod) -> Pod:
        meta = pod.setdefault("metadata", {})
        namespace = meta.setdefault("namespace", "default")
        if not meta.get("name"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if (namespace, meta["name"]) in self._pods:
            raise KeyError(f"pod {namespace}/{meta['name']} already exists")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _rfc3339(time.time())
        meta.setdefault("labels", {})
        pod.setdefault("apiVersion", "v1")
        pod.setdefault("kind", "Pod")
        spec = pod.setdefault("spec", {})
        spec.setdefault("containers", [{"name": "main", "image": "busybox"}])
        status = pod.setdefault("status", {})
        status.setdefault("phase", "Pending")
        self._logs[meta["uid"]] = {c["name"]: ContainerLog(c["name"]) for c in spec["containers"]}
        for container in spec["containers"]:
            self._set_container_status(
                pod, container["name"], {"waiting": {"reason": "ContainerCreating"}}, ready=False
            )
        self._pods[(namespace, meta["name"])] = pod
        return self._touch_locked(pod, "ADDED")

    def _touch_locked(self, pod: Pod, event: str) -> Pod:
        pod["metadata"]["resourceVersion"] = str(self._next_rv())
        snapshot = copy.deepcopy(pod)
        self._history.append((self._rv, event, snapshot))
        self._cond.notify_all()
        return copy.deepcopy(snapshot)

    def _remove_locked(self, pod: Pod) -> None:
        meta = pod["metadata"]
        self._pods.pop((meta["namespace"], meta["name"]), None)
        for cname in list(self._logs.get(meta["uid"], {})):
            self._terminate_log(meta["uid"], cname, 137)
        meta["resourceVersion"] = str(self._next_rv())
        self._history.append((self._rv, "DELETED", copy.deepcopy(pod)))
        self._cond.notify_all()

    def _terminate_log(self, uid: str, cname: str, exit_code: int) -> None:
        log = self._logs.get(uid, {}).get(cname)
        if log is not None and log.state != "terminated":
            log.state = "terminated"
            log.exit_code = exit_code
        self._cond.notify_all()

    @staticmethod
    def _set_container_status(pod: Pod, cname: str, state: dict[str, Any], *, ready: bool) -> None:
        statuses = pod["status"].setdefault("containerStatuses", [])
        for entry in statuses:
            if entry["name"] == cname:
                if "terminated" in entry["state"]:
                    entry["lastState"] = entry["state"]
                entry["state"] = state
                entry["ready"] = ready
                entry["started"] = ready
                return
        image = next(
            (c.get("image", "") for c in pod["spec"]["containers"] if c["name"] == cname), ""
        )
        statuses.append(
            {
                "name": cname,
                "image": image,
                "imageID": "",
                "ready": ready,
                "restartCount": 0,
                "started": ready,
                "state": state,
            }
        )

    @staticmethod
    def _bump_restart(pod: Pod, cname: str) -> None:
        for entry in pod["status"].get("containerStatuses", []):
            if entry["name"] == cname:
                entry["restartCount"] = entry.get("restartCount", 0) + 1

    def _notify(self, event: str, pod: Pod) -> None:
        with self._cond:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback(event, copy.deepcopy(pod))

    def _schedule(self, delay: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(delay, action)
        timer.daemon = True
        with self._cond:
            if self._closing:
                return
            self._timers.append(timer)
        timer.start()

    # ------------------------------------------------------------------ request handling

    def _log_request(self, entry: LoggedRequest) -> None:
        with self._cond:
            self.requests.append(entry)

    def _seq_next(self) -> int:
        with self._cond:
            self._seq += 1
            return self._seq

    def _delete(
        self,
        namespace: str,
        name: str,
        body: dict[str, Any],
        query: dict[str, str],
        entry: LoggedRequest,
    ) -> tuple[int, dict[str, Any]]:
        preconditions = body.get("preconditions") or {}
        entry.precondition_uid = preconditions.get("uid")
        grace = query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
        grace_s = 30 if grace is None else int(grace)
        entry.grace_period = None if grace is None else grace_s
        dry_run = query.get("dryRun") == "All" or body.get("dryRun") == ["All"]
        entry.dry_run = dry_run
        if query.get("dryRun") not in (None, "All"):
            return 400, _status(400, "BadRequest", f"unsupported dry run value {query['dryRun']!r}")
        removed: Pod | None = None
        with self._cond:
            pod = self._pods.get((namespace, name))
            if pod is None:
                return 404, _status(404, "NotFound", f'pods "{name}" not found', name=name)
            uid = pod["metadata"]["uid"]
            if entry.precondition_uid is not None and entry.precondition_uid != uid:
                message = (
                    f'Operation cannot be fulfilled on pods "{name}": Precondition failed: '
                    f"UID in precondition: {entry.precondition_uid}, UID in object meta: {uid}"
                )
                return 409, _status(409, "Conflict", message, name=name)
            if dry_run:
                preview = copy.deepcopy(pod)
                preview["metadata"].setdefault("deletionTimestamp", _rfc3339(time.time() + grace_s))
                preview["metadata"]["deletionGracePeriodSeconds"] = grace_s
                return 200, preview
            entry.target_uid = uid
            entry.acted = True
            already = bool(pod["metadata"].get("deletionTimestamp"))
            if not already or grace_s < pod["metadata"].get("deletionGracePeriodSeconds", 30):
                pod["metadata"]["deletionTimestamp"] = _rfc3339(time.time() + grace_s)
                pod["metadata"]["deletionGracePeriodSeconds"] = grace_s
            updated = self._touch_locked(pod, "MODIFIED")
            if grace_s == 0:
                for cname in list(self._logs.get(uid, {})):
                    self._terminate_log(uid, cname, 137)
                if not pod["metadata"].get("finalizers"):
                    self._remove_locked(pod)
                    removed = copy.deepcopy(pod)
            result = removed if removed is not None else updated
        self._notify("MODIFIED", updated)
        if removed is not None:
            self._notify("DELETED", removed)
        elif grace_s > 0:
            self._schedule(grace_s, lambda: self._finish_graceful(namespace, name, uid))
        return 200, result

    def containers_exited(self, namespace: str, name: str, uid: str, exit_code: int = 143) -> None:
        """The containers of a terminating pod exited by themselves (after SIGTERM, within
        the grace period): the kubelet removes the pod now, as it does."""
        self._finish_graceful(namespace, name, uid, exit_code)

    def _finish_graceful(self, namespace: str, name: str, uid: str, exit_code: int = 137) -> None:
        """The kubelet killed the containers after the grace period."""
        removed = None
        with self._cond:
            pod = self._pods.get((namespace, name))
            if pod is None or pod["metadata"]["uid"] != uid:
                return
            for cname in list(self._logs.get(uid, {})):
                self._terminate_log(uid, cname, exit_code)
            if not pod["metadata"].get("finalizers"):
                self._remove_locked(pod)
                removed = copy.deepcopy(pod)
        if removed is not None:
            self._notify("DELETED", removed)

    def _watch_events(
        self, namespace: str, requirements: list[Requirement], since: int
    ) -> tuple[list[tuple[str, Pod]], int, bool]:
        """Events after ``since`` as the watcher should see them; (events, cursor, expired)."""
        if since < self._compacted_rv:
            return [], since, True
        out: list[tuple[str, Pod]] = []
        cursor = since
        # The history is in resourceVersion order: start after ``since`` instead of scanning
        # it all on every wake-up (every change wakes every watcher of every namespace).
        start = bisect.bisect_right(self._history, since, key=lambda entry: entry[0])
        for rv, event, obj in self._history[start:]:
            cursor = rv
            if obj["metadata"].get("namespace") == namespace and selector_matches(
                requirements, obj["metadata"].get("labels", {})
            ):
                out.append((event, obj))
        return out, max(cursor, since), False


class _QuietServer(ThreadingHTTPServer):
    """Connections reset on purpose are not worth a traceback on stderr."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


def _status(
    code: int, reason: str, message: str, *, name: str = "", kind: str = "pods"
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if name:
        body["details"] = {"name": name, "kind": kind}
    return body


def _first(pod: Pod) -> str:
    """The container whose log and state the helpers play: the pod's first."""
    return str(pod["spec"]["containers"][0]["name"])


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

#: What Go's strconv.ParseBool reads as true: client 35 sends "True", client 37 "true".
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})

_POD_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)(?:/(log|eviction))?)?$")
_NODE_PATH = re.compile(r"^/api/v1/nodes(?:/([^/]+))?$")


def _classify(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str, str]:
    """(verb, resource, namespace, name) as the apiserver's RBAC would see the request."""
    node = _NODE_PATH.match(path)
    if node is not None:
        name = node.group(1) or ""
        if method == "GET":
            verb = "get" if name else ("watch" if query.get("watch") in _TRUE else "list")
        else:
            verb = {"PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())
        return verb, "nodes", "", name
    match = _POD_PATH.match(path)
    if match is None:
        return ("get", "", "", "") if method == "GET" else (method.lower(), "", "", "")
    namespace, name, sub = match.group(1), match.group(2) or "", match.group(3)
    resource = f"pods/{sub}" if sub else "pods"
    if method == "GET":
        if sub or name:
            return "get", resource, namespace, name
        verb = "watch" if query.get("watch") in _TRUE else "list"
        return verb, resource, namespace, name
    verbs = {"DELETE": "delete", "POST": "create", "PATCH": "patch"}
    return verbs.get(method, method.lower()), resource, namespace, name


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, chunked streaming, and resets on demand."""

    api: FakeApiServer
    protocol_version = "HTTP/1.1"
    _next_gone_check = 0.0
    server_version = "fake-kube-apiserver"

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the request log is the record."""

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in separate sends; with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms per request on a kept-alive connection, 0.8 ms off).
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.api._cond:
            self.api._connections.add(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        with self.api._cond:
            self.api._connections.discard(self.connection)

    def do_GET(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    # ------------------------------------------------------------------ plumbing

    def _reset(self) -> None:
        """Close with RST: the client sees 'connection reset by peer'."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            self.connection.close()

    def _client_gone(self) -> bool:
        """Has the client closed a stream it no longer reads? (checked at most every 0.1 s)

        A silent stream's handler would otherwise wait for its next line forever, and each
        such thread wakes on every change of the store: over a thousand scenarios on one
        server they pile up and slow everything down.
        """
        now = time.monotonic()
        if now < self._next_gone_check:
            return False
        self._next_gone_check = now + 0.1
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _send_json(
        self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _start_chunked(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def _read_body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            return {"_invalid": raw.decode("utf-8", "replace")}
        return body if isinstance(body, dict) else {"_invalid": body}

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self) -> None:
        api = self.api
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        verb, resource, namespace, name = _classify(self.command, split.path, query)
        body = self._read_body()
        seq = api._seq_next()
        entry = LoggedRequest(
            seq=seq,
            time=time.time(),
            method=self.command,
            path=split.path,
            query=query,
            verb=verb,
            resource=resource,
            namespace=namespace,
            name=name,
        )
        api._log_request(entry)
        info = RequestInfo(
            self.command, split.path, query, verb, resource, namespace, name, body, seq
        )
        try:
            self._handle(entry, info)
        finally:
            entry.finished = time.time()  # the request's own log says when it was done

    def _handle(self, entry: LoggedRequest, info: RequestInfo) -> None:
        api = self.api
        fault = api.fault_hook(info) if api.fault_hook is not None else None
        if fault is not None:
            entry.fault = fault.describe()
            if fault.delay:
                time.sleep(fault.delay)
            if fault.gate is not None:
                fault.gate.wait()
            if fault.reset_before:
                self._reset()
                return
            if fault.status is not None:
                headers = (
                    {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                )
                reason = _REASONS.get(fault.status, "InternalError")
                message = fault.message or f"injected fault: {reason}"
                entry.status = fault.status
                self._send_json(fault.status, _status(fault.status, reason, message), headers)
                return
        try:
            self._route(
                info.query,
                info.body,
                info.verb,
                info.resource,
                info.namespace,
                info.name,
                entry,
                fault,
            )
        except _Reset:
            self._reset()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(
        self,
        query: dict[str, str],
        body: dict[str, Any] | None,
        verb: str,
        resource: str,
        namespace: str,
        name: str,
        entry: LoggedRequest,
        fault: Fault | None,
    ) -> None:
        api = self.api
        if api.token is not None and self.headers.get("Authorization") != f"Bearer {api.token}":
            entry.status = 401
            self._send_json(401, _status(401, "Unauthorized", "Unauthorized"))
            return
        if not resource:  # no discovery: the client needs none, kubectl is the real cluster's
            entry.status = 404
            self._send_json(
                404, _status(404, "NotFound", "the server could not find the requested resource")
            )
            return
        if api.allowed is not None and (verb, resource) not in api.allowed:
            kind = resource.split("/", maxsplit=1)[0]
            what = f'{kind} "{name}"' if name else kind
            scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
            message = (
                f'{what} is forbidden: User "{api.user}" cannot {verb} resource "{resource}" '
                f'in API group "" {scope}'
            )
            entry.status = 403
            self._send_json(403, _status(403, "Forbidden", message, name=name, kind=kind))
            return
        reset_after = fault is not None and fault.reset_after
        drop_after = fault.drop_after_lines if fault is not None else None
        if resource == "pods/log":
            self._log(namespace, name, query, entry, drop_after, reset_after, fault)
            return
        if resource == "nodes" or resource == "pods/eviction":
            if resource == "pods/eviction" and verb == "create":
                code, result = api._evict(namespace, name, body or {}, query, entry)
            elif verb == "patch" and name:
                code, result = api._patch_node(name, body or {}, query, entry)
            elif verb == "get" and name:
                with api._cond:
                    found = copy.deepcopy(api._nodes.get(name))
                code, result = (
                    (200, found)
                    if found is not None
                    else (404, _status(404, "NotFound", f'nodes "{name}" not found', name=name))
                )
            else:
                code, result = 405, _status(405, "MethodNotAllowed", f"{verb} {resource}: no")
            if reset_after:
                raise _Reset
            entry.status = code
            self._send_json(code, result)
            return
        if verb == "delete":
            # As the apiserver (k8s.io/apiserver handlers/delete.go): a DELETE with a body
            # takes its options from the body alone; the query is read only without one,
            # so ``?dryRun=All`` beside a body deletes for real.
            code, result = api._delete(namespace, name, body or {}, {} if body else query, entry)
            if reset_after:
                raise _Reset
            entry.status = code
            self._send_json(code, result)
            return
        try:
            requirements = parse_selector(query.get("labelSelector", ""))
        except ValueError as exc:
            entry.status = 400
            self._send_json(400, _status(400, "BadRequest", f"unable to parse requirement: {exc}"))
            return
        if verb == "list":
            with api._cond:
                items = [
                    copy.deepcopy(p)
                    for (ns, _), p in sorted(api._pods.items())
                    if ns == namespace
                    and selector_matches(requirements, p["metadata"].get("labels", {}))
                ]
                rv = api._rv
            if reset_after:
                raise _Reset
            entry.status = 200
            self._send_json(
                200,
                {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(rv)},
                    "items": items,
                },
            )
            return
        if verb == "watch":
            self._watch(namespace, requirements, query, entry, drop_after, reset_after, fault)
            return
        entry.status = 405
        self._send_json(
            405, _status(405, "MethodNotAllowed", f"{verb} is not supported by the fake")
        )

    def _watch(
        self,
        namespace: str,
        requirements: list[Requirement],
        query: dict[str, str],
        entry: LoggedRequest,
        drop_after: int | None,
        reset_after: bool,
        fault: Fault | None = None,
    ) -> None:
        api = self.api
        expire_after = fault.expire_after_lines if fault is not None else None
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in _TRUE
        rv_param = query.get("resourceVersion", "")
        deadline = time.monotonic() + timeout
        with api._cond:
            generation = api._stream_generation
            initial: list[tuple[str, Pod]] = []
            if rv_param in ("", "0"):
                initial = [
                    ("ADDED", copy.deepcopy(p))
                    for (ns, _), p in sorted(api._pods.items())
                    if ns == namespace
                    and selector_matches(requirements, p["metadata"].get("labels", {}))
                ]
                cursor = api._rv
            else:
                try:
                    cursor = int(rv_param)
                except ValueError:
                    entry.status = 400
                    self._send_json(
                        400, _status(400, "BadRequest", f"invalid resource version {rv_param!r}")
                    )
                    return
        entry.status = 200
        self._start_chunked("application/json")
        if reset_after:
            raise _Reset
        sent = 0

        def emit(event: str, obj: dict[str, Any]) -> None:
            nonlocal sent
            if drop_after is not None and sent >= drop_after:
                raise _Reset
            if expire_after is not None and sent >= expire_after:
                message = "too old resource version: the watch cache dropped this watcher"
                self._chunk(
                    json.dumps(
                        {"type": "ERROR", "object": _status(410, "Expired", message)}
                    ).encode()
                    + b"\n"
                )
                self._end_chunked()
                raise _Expired
            self._chunk(json.dumps({"type": event, "object": obj}).encode() + b"\n")
            sent += 1
            entry.lines_sent = sent

        try:
            self._watch_stream(
                namespace, requirements, initial, cursor, generation, deadline, bookmarks, emit
            )
        except _Expired:
            return

    def _watch_stream(
        self,
        namespace: str,
        requirements: list[Requirement],
        initial: list[tuple[str, Pod]],
        cursor: int,
        generation: int,
        deadline: float,
        bookmarks: bool,
        emit: Callable[[str, dict[str, Any]], None],
    ) -> None:
        api = self.api
        for event, obj in initial:
            emit(event, obj)
        next_bookmark = time.monotonic() + api.bookmark_interval
        while True:
            with api._cond:
                while True:
                    if api._closing or api._stream_generation != generation:
                        dropped = True
                        break
                    events, new_cursor, expired = api._watch_events(namespace, requirements, cursor)
                    now = time.monotonic()
                    if (
                        events
                        or expired
                        or new_cursor != cursor
                        or now >= deadline
                        or (bookmarks and now >= next_bookmark)
                    ):
                        dropped = False
                        break
                    wake = min(deadline, next_bookmark if bookmarks else deadline)
                    api._cond.wait(max(0.0, min(wake - now, 0.5)))
                    if self._client_gone():
                        dropped = True
                        break
                current_rv = api._rv
            if dropped:
                raise _Reset
            if expired:
                message = f"too old resource version: {cursor} ({api._compacted_rv})"
                emit("ERROR", _status(410, "Expired", message))
                self._end_chunked()
                return
            for event, obj in events:
                emit(event, obj)
            cursor = new_cursor
            now = time.monotonic()
            if bookmarks and now >= next_bookmark:
                emit(
                    "BOOKMARK",
                    {
                        "kind": "Pod",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(current_rv)},
                    },
                )
                cursor = max(cursor, current_rv)
                next_bookmark = now + api.bookmark_interval
            if now >= deadline:
                self._end_chunked()
                return

    def _log(
        self,
        namespace: str,
        name: str,
        query: dict[str, str],
        entry: LoggedRequest,
        drop_after: int | None,
        reset_after: bool,
        fault: Fault | None = None,
    ) -> None:
        api = self.api
        drop_after_new = fault.drop_after_new_lines if fault is not None else None
        replay = fault.replay_backwards if fault is not None else 0
        follow = query.get("follow") in _TRUE
        timestamps = query.get("timestamps") in _TRUE
        with api._cond:
            generation = api._stream_generation
            pod = api._pods.get((namespace, name))
            if pod is None:
                entry.status = 404
                self._send_json(
                    404, _status(404, "NotFound", f'pods "{name}" not found', name=name)
                )
                return
            cname = _first(pod)
            log = api._logs[pod["metadata"]["uid"]][cname]
            if log.state == "waiting":
                message = (
                    f'container "{cname}" in pod "{name}" is waiting to start: {log.waiting_reason}'
                )
                entry.status = 400
                self._send_json(400, _status(400, "BadRequest", message))
                return
            lines = list(log.lines)
            position = len(lines)
        if "sinceSeconds" in query:
            since = time.time() - int(query["sinceSeconds"])
            lines = [line for line in lines if line[0] >= since]

        def render(ts: float, text: str) -> bytes:
            return ((format_timestamp(ts) + " " if timestamps else "") + text + "\n").encode()

        if not follow:
            data = b"".join(render(ts, text) for ts, text in lines)
            if reset_after:
                raise _Reset
            entry.status = 200
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        entry.status = 200
        self._start_chunked("text/plain")
        if reset_after:
            raise _Reset
        sent = 0

        backlog = lines + (list(reversed(lines[-replay:])) if replay else [])
        cut_at = None if drop_after_new is None else len(backlog) + drop_after_new

        def emit(ts: float, text: str) -> None:
            nonlocal sent
            if drop_after is not None and sent >= drop_after:
                raise _Reset
            if cut_at is not None and sent >= cut_at:
                raise _Reset
            self._chunk(render(ts, text))
            sent += 1
            entry.lines_sent = sent

        for ts, text in backlog:
            emit(ts, text)
        while True:
            with api._cond:
                while True:
                    if api._closing or api._stream_generation != generation:
                        raise _Reset
                    fresh = log.lines[position:]
                    if fresh or log.state == "terminated":
                        break
                    api._cond.wait(0.5)
                    if self._client_gone():
                        raise _Reset
                position += len(fresh)
                ended = log.state == "terminated" and position >= len(log.lines)
            for ts, text in fresh:
                emit(ts, text)
            if ended:
                self._end_chunked()
                return
