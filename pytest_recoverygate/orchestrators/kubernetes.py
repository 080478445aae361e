"""Kubernetes backend: the pods of one Kubeflow training job, through the official client.

The only module that imports ``kubernetes`` (lazily, so ``recoverygate --help`` and the
other backends never pay for it). It needs exactly these permissions, in one namespace:
pods list/watch/delete and pods/log get (``examples/kubernetes/rbac.yaml``).

How each promise of the drill maps onto the API:

- **discover**: ``list pods`` by label selector. Ranks come from Kubeflow's labels --
  PyTorchJob ``training.kubeflow.org/replica-type`` + ``replica-index`` (with a Master,
  RANK is the index, +1 for workers), Trainer v2 TrainJob/JobSet
  ``jobset.sigs.k8s.io/replicatedjob-name=node`` + ``batch.kubernetes.io/job-completion-index``
  -- then an explicit ``rank`` label, then a literal ``RANK``/``PET_NODE_RANK`` env. An empty
  selector, no pods, pods of two jobs, a rank claimed twice, or an absent target rank are
  refused before anything is touched.
- **kill**: one ``DELETE`` with ``gracePeriodSeconds=0`` and a ``preconditions.uid``, so it
  can only ever reach the discovered pod *instance*: a replacement has another uid and gets
  409. urllib3's own retries are off for every request (``Configuration.retries = False``),
  because urllib3 re-sends a DELETE on 429/503 with Retry-After and on some connection
  errors. Reads are retried here with tenacity; the DELETE is sent again only after a 429,
  which the apiserver answers before any handler runs. Any other failure is *checked* by
  listing: the uid gone or terminating means KILLED, still there means UNCONFIRMED (the
  runner reports ERROR), and it is never re-sent. KILLED is stamped when the acting DELETE
  was *sent*, never when its answer or the confirming list came back: the pod died no
  earlier, and a later stamp would make a replacement that started meanwhile look like
  the old incarnation. A dry run sends the same DELETE with
  ``dryRun=All``: authorisation and admission run, nothing is deleted.
- **watch_group**: a background thread lists, then watches from the list's
  resourceVersion with bookmarks and a bounded ``timeoutSeconds``; a clean end or a dropped
  connection resumes from the last resourceVersion the stream delivered (a stream cut every
  few events still advances), a 410 re-lists (backing off only when 410s repeat with
  nothing delivered in between). The replacement is
  the pod with the victim's rank, another uid, no deletionTimestamp: Pending, then Running.
  PyTorchJob reuses the pod name; TrainJob pods get new names while a finalizer keeps the
  old one Terminating -- both are the same rule.
- **events**: a background thread follows the reporting rank's log with kubelet
  timestamps and feeds each line to a :class:`StreamEventSource` with the *kubelet's* time
  as the receive time, so recovery time excludes streaming delay. The stream ends when the
  container stops; it is reopened on whichever pod now holds that rank (400 "waiting to
  start" while it is Pending is retried), from ``sinceSeconds`` covering the gap, and lines
  already seen (same kubelet timestamp and content) are dropped.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import queue
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pytest_recoverygate.errors import (
    BackendError,
    DiscoveryError,
    DrillError,
    PermissionDeniedError,
    UsageError,
)
from pytest_recoverygate.events import StreamEventSource
from pytest_recoverygate.joboutput import JobOutput, OutputSplitter
from pytest_recoverygate.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEvent,
    Worker,
    Workload,
)
from pytest_recoverygate.orchestrators.base import Clock, EventSource, RealClock

if TYPE_CHECKING:
    from pytest_recoverygate.config import DrillConfig

__all__ = [
    "RBAC_EXAMPLE",
    "KubernetesOrchestrator",
    "job_of",
    "parse_kubelet_timestamp",
    "pod_rank",
]

Pod = dict[str, Any]
T = TypeVar("T")

RBAC_EXAMPLE = "examples/kubernetes/rbac.yaml"

PT_JOB = "training.kubeflow.org/job-name"
PT_REPLICA_TYPE = "training.kubeflow.org/replica-type"
PT_REPLICA_INDEX = "training.kubeflow.org/replica-index"
JS_JOBSET = "jobset.sigs.k8s.io/jobset-name"
JS_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"
TRAINER_NODE = "node"  # Trainer v2's replicated job that runs the training nodes

_TRANSIENT_STATUS = frozenset({0, 429, 500, 502, 503, 504})
_SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_LOG_DEDUPE_WINDOW = 600.0  # seconds of kubelet time kept for dropping re-sent lines


# ---------------------------------------------------------------------- pure helpers


def _labels(pod: Pod) -> dict[str, str]:
    return dict(pod.get("metadata", {}).get("labels") or {})


def _annotations(pod: Pod) -> dict[str, str]:
    return dict(pod.get("metadata", {}).get("annotations") or {})


def _name(pod: Pod) -> str:
    return str(pod.get("metadata", {}).get("name", "?"))


def _uid(pod: Pod) -> str:
    return str(pod.get("metadata", {}).get("uid", ""))


def _terminating(pod: Pod) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def _phase(pod: Pod) -> str:
    return str((pod.get("status") or {}).get("phase") or "Unknown")


def job_of(pod: Pod) -> str:
    """The training job a pod belongs to, as ``Kind/name`` ('' when it carries no job label)."""
    labels = _labels(pod)
    if PT_JOB in labels:
        return f"PyTorchJob/{labels[PT_JOB]}"
    if JS_JOBSET in labels:
        return f"TrainJob/{labels[JS_JOBSET]}"
    return ""


def _int_label(pod: Pod, key: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise DiscoveryError(
            f"pod {_name(pod)!r} has {key}={value!r}, which is not a rank "
            "(expected a non-negative integer)"
        )
    return number


def pod_rank(pod: Pod, *, job_has_master: bool) -> int | None:
    """The node rank a pod runs, or None when it is not a training node.

    Non-node members of a job (a TrainJob's initializer, a PyTorchJob replica type other
    than Master/Worker) are None. A pod with no rank information at all is an error,
    because guessing would risk killing the wrong thing.
    """
    labels, annotations = _labels(pod), _annotations(pod)
    replica_type = labels.get(PT_REPLICA_TYPE)
    if replica_type is not None and PT_REPLICA_INDEX in labels:
        index = _int_label(pod, PT_REPLICA_INDEX, labels[PT_REPLICA_INDEX])
        kind = replica_type.lower()
        if kind == "master":
            return index
        if kind == "worker":
            return index + 1 if job_has_master else index
        return None
    if JS_JOBSET in labels and JS_REPLICATED_JOB in labels:
        if labels[JS_REPLICATED_JOB] != TRAINER_NODE:
            return None
        value = labels.get(JOB_COMPLETION_INDEX) or annotations.get(JOB_COMPLETION_INDEX)
        if value is not None:
            return _int_label(pod, JOB_COMPLETION_INDEX, value)
    if "rank" in labels:
        return _int_label(pod, "rank", labels["rank"])
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") in ("RANK", "PET_NODE_RANK") and env.get("value") is not None:
                return _int_label(pod, f"env {env['name']}", str(env["value"]))
    raise DiscoveryError(
        f"cannot tell the rank of pod {_name(pod)!r}: it has no Kubeflow replica labels "
        f"({PT_REPLICA_TYPE}/{PT_REPLICA_INDEX} or {JS_REPLICATED_JOB}/{JOB_COMPLETION_INDEX}), "
        "no 'rank' label and no literal RANK or PET_NODE_RANK env. "
        "Fix: add a label rank=<N> to the pod template, or narrow the selector to the job's pods."
    )


def _has_master(pods: list[Pod]) -> bool:
    return any((_labels(p).get(PT_REPLICA_TYPE) or "").lower() == "master" for p in pods)


def _waiting_reasons(pod: Pod) -> list[str]:
    reasons = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reasons.append(str(waiting["reason"]))
    return reasons


def _restart_total(pod: Pod) -> int:
    return sum(
        int(s.get("restartCount") or 0)
        for s in (pod.get("status") or {}).get("containerStatuses") or []
    )


def parse_kubelet_timestamp(text: str) -> float:
    """``2026-11-29T11:47:14.123456789Z`` as POSIX seconds (ValueError when malformed)."""
    if not text.endswith("Z") or len(text) < 20:
        raise ValueError(text)
    base = datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    fraction = text[20:-1] if len(text) > 20 and text[19] == "." else ""
    if fraction and not fraction.isdigit():
        raise ValueError(text)
    return base.timestamp() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def _status_message(exc: Any) -> str:
    """The ``message`` of an apiserver Status body, else the HTTP reason."""
    body = getattr(exc, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = json.loads(body).get("message")
            if message:
                return str(message)
    return str(getattr(exc, "reason", "") or exc)


def _retry_after(exc: BaseException) -> float | None:
    headers = getattr(exc, "headers", None)
    if not headers:
        return None
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        value = headers.get("Retry-After")
        if value is not None:
            return max(0.0, float(value))
    return None


def _pick_container(pod: Pod, wanted: str | None) -> str | None:
    containers = [str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or []]
    if wanted:
        return wanted
    if len(containers) <= 1:
        return None  # the server picks the only one
    default = _annotations(pod).get(DEFAULT_CONTAINER_ANNOTATION)
    if default in containers:
        return default
    for name in ("pytorch", "node", "trainer"):  # PyTorchJob's and Trainer v2's conventions
        if name in containers:
            return name
    return containers[0]


@dataclass
class _Watched:
    """What the group watcher knows about the victim and what it already reported."""

    victim: Worker | None = None
    gone: bool = False
    pending_uid: str = ""
    running_uid: str = ""
    failed: bool = False
    restarts: int = 0


class _PodLogEvents:
    """The adapter's EventSource: the shared parser, plus the log thread's fatal errors."""

    def __init__(self, source: StreamEventSource, owner: KubernetesOrchestrator) -> None:
        self._source = source
        self._owner = owner

    def poll(self) -> list[TrainingEvent]:
        self._owner._raise_fatal()
        return self._source.poll()

    @property
    def malformed_lines(self) -> int:
        return self._source.malformed_lines

    def close(self) -> None:
        self._source.close()


# ---------------------------------------------------------------------- the adapter


class KubernetesOrchestrator:
    """The pods of one training job, found by label selector, in one namespace."""

    name = "kubernetes"

    def __init__(
        self,
        *,
        selector: str,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | Path | None = None,
        container: str | None = None,
        target_rank: int = 1,
        reporting_rank: int = 0,
        clock: Clock | None = None,
        api_client: Any = None,
        watch_timeout_seconds: int = 60,
        request_timeout: float = 30.0,
    ) -> None:
        self.selector = selector.strip()
        self.namespace = namespace
        self.context = context
        self.kubeconfig = str(Path(kubeconfig).expanduser()) if kubeconfig else None
        self.container = container
        self.target_rank = target_rank
        self.reporting_rank = reporting_rank
        self.clock: Clock = clock if clock is not None else RealClock()
        self.watch_timeout_seconds = watch_timeout_seconds
        self.request_timeout = request_timeout
        self._given_client = api_client
        self._configuration: Any = None
        self._clients: list[Any] = []
        self._main: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pods: dict[str, Pod] = {}
        self._ranks: dict[str, int] = {}
        self._job = ""
        self._job_key = ""
        self._job_has_master = False
        self._list_rv = ""
        self._watch_cursor: str | None = None  # the watch thread's last resourceVersion seen
        self._watched = _Watched()
        self._events: queue.SimpleQueue[GroupEvent] = queue.SimpleQueue()
        self._fatal: DrillError | None = None
        self._threads: list[threading.Thread] = []
        self._open_responses: set[Any] = set()
        self._source = StreamEventSource(wakeup=self.clock.wakeup)
        self._event_source = _PodLogEvents(self._source, self)
        self._seen_lines: dict[tuple[str, bytes], float] = {}
        self._last_log_time: float | None = None
        self._log_fresh = 0  # new lines the log thread's current stream delivered so far
        # the followed pods' logs, per pod (a replacement with the pod's name shares its file)
        self._output = OutputSplitter(lambda line: None, default="pod log")
        self._log_labels: dict[Any, str] = {}
        self._cleaned = False

    @classmethod
    def from_config(cls, config: DrillConfig, clock: Clock) -> KubernetesOrchestrator:
        workload = config.workload
        return cls(
            selector=workload.selector,  # type: ignore[union-attr]
            namespace=workload.namespace,  # type: ignore[union-attr]
            context=workload.context,  # type: ignore[union-attr]
            kubeconfig=workload.kubeconfig,  # type: ignore[union-attr]
            container=workload.container,  # type: ignore[union-attr]
            target_rank=config.inject_failure.target_rank,
            reporting_rank=workload.reporting_rank,
            clock=clock,
        )

    # ------------------------------------------------------------------ connection

    def _connect(self) -> None:
        """Load the client configuration once: given client, in-cluster, or kubeconfig."""
        if self._configuration is not None:
            return
        try:
            import kubernetes.config
            from kubernetes import client
        except ImportError:
            raise UsageError(
                "orchestrator: kubernetes needs the kubernetes client, which is not "
                f"installed in the environment RecoveryGate runs in ({sys.executable}): "
                "pip install 'kubernetes>=35' (it comes with pip install recoverygate)"
            ) from None

        config: Any = kubernetes.config  # untyped in some client versions
        if self._given_client is not None:
            configuration = copy.deepcopy(self._given_client.configuration)
        else:
            configuration = client.Configuration()
            in_cluster = (
                self.kubeconfig is None
                and self.context is None
                and "KUBERNETES_SERVICE_HOST" in os.environ
            )
            loaded = False
            if in_cluster:
                try:
                    config.load_incluster_config(client_configuration=configuration)
                    loaded = True
                    if self.namespace is None and _SA_NAMESPACE_FILE.exists():
                        self.namespace = _SA_NAMESPACE_FILE.read_text().strip() or None
                except config.ConfigException:
                    loaded = False
            if not loaded:
                where = self.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
                try:
                    config.load_kube_config(
                        config_file=self.kubeconfig,
                        context=self.context,
                        client_configuration=configuration,
                        persist_config=False,
                    )
                    if self.namespace is None:
                        self.namespace = self._kubeconfig_namespace()
                except (config.ConfigException, OSError, ValueError, TypeError) as exc:
                    context = f" context {self.context!r}" if self.context else ""
                    raise UsageError(
                        f"cannot load the Kubernetes configuration from {where}{context}: {exc}. "
                        "Fix: set workload.kubeconfig / workload.context, or run in a pod "
                        "with a ServiceAccount."
                    ) from None
        # Deliberate: urllib3 would silently re-send GET *and DELETE* on 429/503 with
        # Retry-After and on some connection errors. Reads are retried below, the kill never.
        configuration.retries = False
        if hasattr(configuration, "client_go_retries"):
            configuration.client_go_retries = False
        self._configuration = configuration
        if self.namespace is None:
            self.namespace = "default"

    def _kubeconfig_namespace(self) -> str | None:
        import kubernetes.config

        config: Any = kubernetes.config
        contexts, active = config.list_kube_config_contexts(self.kubeconfig)
        chosen = active
        if self.context is not None:
            chosen = next((c for c in contexts if c.get("name") == self.context), None)
        if not chosen:
            return None
        namespace = (chosen.get("context") or {}).get("namespace")
        return str(namespace) if namespace else None

    def _new_api(self) -> Any:
        """A CoreV1Api on its own connection pool (each thread, and each kill, gets one)."""
        from kubernetes import client

        self._connect()
        api_client = client.ApiClient(configuration=self._configuration)
        with self._lock:
            self._clients.append(api_client)
        return client.CoreV1Api(api_client)

    # ------------------------------------------------------------------ errors and retries

    def _forbidden(self, verb: str, resource: str, exc: Any) -> PermissionDeniedError:
        return PermissionDeniedError(
            f"Kubernetes refused to {verb} {resource} in namespace {self.namespace!r} "
            f"(403 Forbidden: {_status_message(exc)}). RecoveryGate needs exactly pods "
            f"list/watch/delete and pods/log get in that namespace. Fix: kubectl apply -n "
            f"{self.namespace} -f {RBAC_EXAMPLE} and run as its ServiceAccount "
            "(or grant those verbs to your user)."
        )

    @staticmethod
    def _is_transient(exc: BaseException) -> bool:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        if isinstance(exc, ApiException):
            return exc.status in _TRANSIENT_STATUS or (exc.status or 0) >= 500
        return isinstance(exc, (HTTPError, OSError))

    @staticmethod
    def _backoff(attempt: int, exc: BaseException | None) -> float:
        after = _retry_after(exc) if exc is not None else None
        if after is not None:
            return min(after, 5.0)
        return min(0.1 * 2.0**attempt, 2.0) * (0.5 + random.random() / 2)

    def _read(
        self,
        verb: str,
        resource: str,
        call: Callable[[], T],
        *,
        deadline: float | None = None,
        passthrough: frozenset[int] = frozenset(),
    ) -> T:
        """A read with retries on 429/5xx/connection errors (tenacity), 403 made clear.

        Statuses in ``passthrough`` are re-raised as the client's ApiException for the
        caller to interpret; anything else that does not clear becomes a DrillError.
        """
        from kubernetes.client.exceptions import ApiException
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay

        stop: Any = stop_after_attempt(8)
        if deadline is not None:
            stop = stop | stop_after_delay(max(0.0, deadline - self.clock.now()))
        retrying = Retrying(
            retry=retry_if_exception(self._is_transient),
            stop=stop,
            wait=lambda state: self._backoff(
                state.attempt_number, state.outcome.exception() if state.outcome else None
            ),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    if self._stop.is_set():
                        raise BackendError("the drill is cleaning up")
                    return call()
        except ApiException as exc:
            if exc.status in passthrough:
                raise
            if exc.status == 403:
                raise self._forbidden(verb, resource, exc) from None
            raise BackendError(
                f"Kubernetes API error on {verb} {resource} in namespace {self.namespace!r}: "
                f"{exc.status} {_status_message(exc)}"
            ) from None
        except DrillError:
            raise
        except Exception as exc:
            if self._is_transient(exc):
                raise BackendError(
                    f"cannot reach the Kubernetes API at {self._host()} to {verb} {resource}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _host(self) -> str:
        return str(getattr(self._configuration, "host", "?"))

    def _list_pods(
        self, api: Any, *, deadline: float | None = None, passthrough: frozenset[int] = frozenset()
    ) -> tuple[list[Pod], str]:
        def call() -> tuple[list[Pod], str]:
            resp = api.list_namespaced_pod(
                self.namespace,
                label_selector=self.selector,
                _preload_content=False,
                _request_timeout=(5, self.request_timeout),
            )
            try:
                body = json.loads(resp.data)
            finally:
                resp.release_conn()
            return list(body.get("items") or []), str(
                (body.get("metadata") or {}).get("resourceVersion", "")
            )

        return self._read("list", "pods", call, deadline=deadline, passthrough=passthrough)

    # ------------------------------------------------------------------ discover

    def discover(self, deadline: float) -> Workload:
        if not self.selector:
            raise DiscoveryError(
                "refusing an empty label selector: it would match every pod in the namespace. "
                "Fix: set workload.selector to one job, "
                'e.g. "training.kubeflow.org/job-name=my-job".'
            )
        self._connect()  # first: it says how to install a missing client
        from kubernetes.client.exceptions import ApiException

        if self._main is None:
            self._main = self._new_api()
        try:
            pods, rv = self._list_pods(self._main, deadline=deadline, passthrough=frozenset({400}))
        except ApiException as exc:
            raise DiscoveryError(
                f"the API server rejected selector {self.selector!r}: {_status_message(exc)}. "
                "Fix: use label selector syntax, e.g. 'app=x,tier in (a,b)'."
            ) from None
        workload, ranks = self._workload(pods)
        if workload.by_rank(self.target_rank) is None:
            raise DiscoveryError(
                f"target rank {self.target_rank} is not among the ranks of {workload.job} "
                f"({', '.join(str(w.rank) for w in workload.workers)}). "
                "Fix: set injectFailure.targetRank to one of them."
            )
        if workload.by_rank(self.reporting_rank) is None:
            raise DiscoveryError(
                f"reporting rank {self.reporting_rank} is not among the ranks of {workload.job} "
                f"({', '.join(str(w.rank) for w in workload.workers)}); its log carries the "
                "training events. Fix: set workload.reportingRank to the rank that reports."
            )
        with self._lock:
            self._pods = {_uid(p): p for p in pods}
            self._ranks = ranks
            self._job = workload.job
            self._list_rv = rv
            self._watched.restarts = sum(_restart_total(p) for p in pods)
        if not self._threads:
            self._start_thread(self._watch_loop, "recoverygate-k8s-watch")
            self._start_thread(self._log_loop, "recoverygate-k8s-logs")
        return workload

    def _workload(self, pods: list[Pod]) -> tuple[Workload, dict[str, int]]:
        """Group, rank and check the listed pods (every refusal happens here)."""
        where = f"namespace {self.namespace!r}"
        if not pods:
            raise DiscoveryError(
                f"no pods match selector {self.selector!r} in {where} (server {self._host()}). "
                f"Check with: kubectl get pods -n {self.namespace} -l '{self.selector}'"
            )
        live = [p for p in pods if not _terminating(p)]
        if not live:
            raise DiscoveryError(f"every pod matching {self.selector!r} in {where} is terminating")
        jobs: dict[str, list[Pod]] = {}
        for pod in live:
            jobs.setdefault(job_of(pod), []).append(pod)
        if len(jobs) > 1:
            names = ", ".join(sorted(job or "pods without a Kubeflow job label" for job in jobs))
            raise DiscoveryError(
                f"selector {self.selector!r} matches pods of {len(jobs)} jobs in {where}: {names}. "
                "Refusing to pick one. Fix: narrow the selector to one job, e.g. "
                f"'{PT_JOB}=<name>' or '{JS_JOBSET}=<name>'."
            )
        job_key, members = next(iter(jobs.items()))
        self._job_key = job_key
        job = job_key or f"pods matching {self.selector!r}"
        self._job = job
        has_master = _has_master(members)
        self._job_has_master = has_master
        by_rank: dict[int, list[Pod]] = {}
        ranks: dict[str, int] = {}
        for pod in members:
            rank = pod_rank(pod, job_has_master=has_master)
            if rank is not None:
                by_rank.setdefault(rank, []).append(pod)
                ranks[_uid(pod)] = rank
        if not by_rank:
            raise DiscoveryError(
                f"{job} in {where} has no training-node pods matching {self.selector!r}"
            )
        workers = []
        for rank, claimants in sorted(by_rank.items()):
            active = [p for p in claimants if _phase(p) in ("Pending", "Running")] or claimants
            if len(active) > 1:
                raise DiscoveryError(
                    f"{len(active)} pods claim rank {rank} of {job}: "
                    f"{', '.join(_name(p) for p in active)}. Refusing to guess which to kill."
                )
            workers.append(self._worker(active[0], rank))
        return Workload(job=job, workers=tuple(workers)), ranks

    def _worker(self, pod: Pod, rank: int) -> Worker:
        return Worker(
            rank=rank,
            name=_name(pod),
            instance_id=_uid(pod),
            node=str((pod.get("spec") or {}).get("nodeName") or ""),
            details=(
                ("namespace", str(self.namespace)),
                ("phase", _phase(pod)),
                ("job", self._job),
            ),
        )

    # ------------------------------------------------------------------ kill

    def kill(self, worker: Worker, *, dry_run: bool) -> KillResult:
        """One DELETE of exactly this pod instance (uid precondition, grace period 0)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api = self._new_api()  # a fresh pool: the DELETE never rides a stale keep-alive socket
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=worker.instance_id)
        )
        target = f"pod {worker.name!r} (uid {worker.instance_id}) in namespace {self.namespace!r}"

        def delete() -> None:
            resp = api.delete_namespaced_pod(
                worker.name,
                self.namespace,
                body=body,
                dry_run="All" if dry_run else None,
                _preload_content=False,
                _request_timeout=(5, self.request_timeout),
            )
            resp.release_conn()

        if dry_run:
            try:  # a dry run changes nothing: safe to retry like a read
                self._read("delete", "pods", delete, passthrough=frozenset({404, 409}))
            except ApiException as exc:
                return self._result(
                    KillOutcome.ALREADY_GONE,
                    f"{target} no longer exists ({exc.status}: {_status_message(exc)})",
                )
            return self._result(
                KillOutcome.DRY_RUN, f"the API server accepted a dry-run delete of {target}"
            )

        with self._lock:
            self._watched = _Watched(victim=worker, restarts=self._watched.restarts)
        refusals = 0
        while True:
            # The pod cannot have died before this DELETE left: stamp the kill here, not when
            # the answer (or the confirming list) came back. The engine counts lines stamped
            # after the kill as the new incarnation, so an early stamp is the safe side; a
            # late one makes a replacement that started meanwhile look old ("never came back").
            sent_at = self.clock.now()
            try:
                delete()
            except ApiException as exc:
                if exc.status in (404, 409):
                    return self._result(
                        KillOutcome.ALREADY_GONE,
                        f"{target} was already gone ({exc.status}: {_status_message(exc)}); "
                        "nothing else was deleted",
                    )
                if exc.status == 403:
                    raise self._forbidden("delete", "pods", exc) from None
                if exc.status == 429 and refusals < 3:
                    # The apiserver's flow control answers 429 before any handler runs, so
                    # nothing was deleted; the uid precondition guards the retry anyway.
                    refusals += 1
                    time.sleep(self._backoff(refusals, exc))
                    continue
                if exc.status is not None and 400 <= exc.status < 500:
                    raise BackendError(
                        f"the API server refused to delete {target}: "
                        f"{exc.status} {_status_message(exc)}"
                    ) from None
                return self._confirm(
                    worker,
                    f"the delete of {target} got {exc.status} {_status_message(exc)}",
                    sent_at,
                )
            except Exception as exc:
                if not self._is_transient(exc):
                    raise
                return self._confirm(
                    worker,
                    f"the connection failed during the delete of {target} ({type(exc).__name__})",
                    sent_at,
                )
            return self._result(
                KillOutcome.KILLED, f"deleted {target} with grace period 0", at=sent_at
            )

    def _confirm(self, worker: Worker, why: str, sent_at: float) -> KillResult:
        """After an unanswered delete: look, never re-send. KILLED is stamped ``sent_at``."""
        try:
            pods, _ = self._list_pods(self._new_api())
        except DrillError as exc:
            return self._result(
                KillOutcome.UNCONFIRMED, f"{why}; checking afterwards failed too: {exc}"
            )
        pod = next((p for p in pods if _uid(p) == worker.instance_id), None)
        if pod is None:
            return self._result(
                KillOutcome.KILLED,
                f"{why}; the pod instance is gone, so the delete took effect",
                at=sent_at,
            )
        if _terminating(pod):
            return self._result(
                KillOutcome.KILLED,
                f"{why}; the pod instance is terminating, so the delete took effect",
                at=sent_at,
            )
        return self._result(
            KillOutcome.UNCONFIRMED,
            f"{why}; the pod instance still exists and is not terminating. The delete was not "
            "sent again, so that nothing can be deleted twice",
        )

    def _result(self, outcome: KillOutcome, detail: str, *, at: float | None = None) -> KillResult:
        """A kill result stamped ``at`` (when the acting DELETE was sent), else now."""
        return KillResult(
            outcome=outcome, timestamp=self.clock.now() if at is None else at, detail=detail
        )

    # ------------------------------------------------------------------ watch_group

    def watch_group(self) -> list[GroupEvent]:
        self._raise_fatal()
        out = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def _raise_fatal(self) -> None:
        with self._lock:
            fatal = self._fatal
        if fatal is not None:
            raise fatal

    def _set_fatal(self, error: DrillError) -> None:
        with self._lock:
            if self._fatal is None:
                self._fatal = error
        self.clock.wakeup()

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
                timestamp=self.clock.now(),
                detail=detail,
                worker=worker,
                restart_count=restarts,
            )
        )
        self.clock.wakeup()

    def _apply(self, event: str, pod: Pod) -> None:
        """One watch event into the pod table, then what changed for the drill."""
        uid = _uid(pod)
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
            restarts = sum(_restart_total(p) for p in pods)
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
                current = next((p for p in pods if _uid(p) == victim.instance_id), None)
                if not watched.gone and (
                    current is None
                    or _terminating(current)
                    or _phase(current) in ("Failed", "Succeeded")
                ):
                    watched.gone = True
                    state = (
                        "deleted"
                        if current is None
                        else ("terminating" if _terminating(current) else _phase(current))
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
                    uid = _uid(pod)
                    if (
                        uid == victim.instance_id
                        or ranks.get(uid) != victim.rank
                        or _terminating(pod)
                    ):
                        continue
                    worker = self._worker(pod, victim.rank)
                    phase = _phase(pod)
                    if phase == "Pending" and uid not in (watched.pending_uid, watched.running_uid):
                        watched.pending_uid = uid
                        emits.append(
                            (
                                GroupEventKind.REPLACEMENT_PENDING,
                                f"replacement pod {_name(pod)} (uid {uid}) is Pending",
                                worker,
                                None,
                            )
                        )
                    elif phase == "Running" and watched.running_uid != uid:
                        watched.running_uid = uid
                        emits.append(
                            (
                                GroupEventKind.REPLACEMENT_RUNNING,
                                f"replacement pod {_name(pod)} (uid {uid}) is Running",
                                worker,
                                None,
                            )
                        )
                    if "CrashLoopBackOff" in _waiting_reasons(pod) and not watched.failed:
                        watched.failed = True
                        emits.append(
                            (
                                GroupEventKind.JOB_FAILED,
                                f"replacement pod {_name(pod)} is in CrashLoopBackOff",
                                worker,
                                None,
                            )
                        )
            members = [p for p in pods if _uid(p) in ranks and not _terminating(p)]
            if members and all(_phase(p) == "Failed" for p in members) and not watched.failed:
                watched.failed = True
                emits.append(
                    (GroupEventKind.JOB_FAILED, f"every pod of {self._job} is Failed", None, None)
                )
        for kind, detail, who, count in emits:
            self._emit(kind, detail, who, count)

    def _watch_loop(self) -> None:
        """List, then watch from its resourceVersion; resume on drops, re-list on 410."""
        from kubernetes.client.exceptions import ApiException

        api = self._new_api()
        rv: str | None = self._list_rv
        failures = 0
        expired = 0  # 410s in a row with no event in between
        while not self._stop.is_set():
            self._watch_cursor = None
            try:
                if rv is None:
                    if expired > 1:  # a watch cache that keeps expiring us: do not spin
                        self._stop.wait(self._backoff(min(expired, 5), None))
                    pods, rv = self._list_pods(api)
                    self._replace_all(pods)
                    self._watch_cursor = rv
                listed = self._watch_cursor
                rv = self._watch_once(api, rv)
                failures = 0
                # a 410 after the stream delivered something is no sign of a stuck cache
                delivered = self._watch_cursor not in (None, listed)
                expired = expired + 1 if rv is None and not delivered else 0
                continue
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
                    expired += 1
                    continue
                if exc.status == 403:
                    self._set_fatal(self._forbidden("watch", "pods", exc))
                    return
                error: BaseException | None = exc
            except PermissionDeniedError as exc:
                self._set_fatal(exc)
                return
            except Exception as exc:  # a dropped stream, a timeout, a retried-out list
                if self._stop.is_set():
                    return
                error = exc if self._is_transient(exc) else None
            # Resume from the last resourceVersion this stream delivered, not the one it
            # started from: a stream cut every few events would otherwise replay the same
            # few events forever. A stream that delivered something was no failure.
            cursor = self._watch_cursor
            if cursor is not None and cursor != rv:
                rv, failures, expired = cursor, 0, 0
            failures += 1
            self._stop.wait(self._backoff(failures, error))

    def _watch_once(self, api: Any, rv: str) -> str | None:
        """One watch request; returns the resourceVersion to resume from (None: re-list)."""
        from kubernetes.client.exceptions import ApiException

        resp = api.list_namespaced_pod(
            self.namespace,
            label_selector=self.selector,
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_seconds,
            _preload_content=False,
            _request_timeout=(5, self.watch_timeout_seconds + 30),
        )
        with self._tracked(resp):
            for line in _iter_lines(resp):
                if self._stop.is_set():
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
                self._watch_cursor = rv  # where to resume if the stream breaks now
        return rv

    def _replace_all(self, pods: list[Pod]) -> None:
        """After a re-list: pods missing from it were deleted while we were not watching."""
        listed = {_uid(p) for p in pods}
        with self._lock:
            missing = [p for uid, p in self._pods.items() if uid not in listed]
        for pod in missing:
            self._apply("DELETED", pod)
        for pod in pods:
            self._apply("MODIFIED", pod)

    # ------------------------------------------------------------------ events (pod logs)

    def events(self) -> EventSource:
        return self._event_source

    def _reporting_pod(self) -> Pod | None:
        with self._lock:
            candidates = [
                p
                for uid, p in self._pods.items()
                if self._ranks.get(uid) == self.reporting_rank and not _terminating(p)
            ]
        candidates.sort(key=lambda p: (_phase(p) != "Running", _phase(p) != "Pending"))
        return candidates[0] if candidates else None

    def _log_loop(self) -> None:
        from kubernetes.client.exceptions import ApiException

        api = self._new_api()
        failures = 0
        while not self._stop.is_set():
            pod = self._reporting_pod()
            if pod is None:
                failures += 1
                self._stop.wait(min(0.05 * 2**failures, 1.0))
                continue
            try:
                fresh = self._follow(api, pod)
                failures = 0 if fresh else failures + 1
                if not fresh:
                    self._stop.wait(min(0.05 * 2**failures, 1.0))
            except ApiException as exc:
                if exc.status == 403:
                    self._set_fatal(self._forbidden("get", "pods/log", exc))
                    return
                # 400 "waiting to start" (Pending replacement), 404 (pod just replaced), 429, 5xx
                failures += 1
                self._stop.wait(self._backoff(min(failures, 5), exc))
            except Exception as exc:
                if self._stop.is_set():
                    return
                # A stream cut after it delivered new lines was no failure: reopen soon, or
                # a stream cut every few lines would lag further behind with each cut.
                failures = 1 if self._log_fresh else failures + 1
                self._stop.wait(
                    self._backoff(min(failures, 5), exc if self._is_transient(exc) else None)
                )

    def _follow(self, api: Any, pod: Pod) -> int:
        """Follow one pod's log until it ends; returns how many new lines arrived."""
        since = None
        if self._last_log_time is not None:
            since = max(1, math.ceil(time.time() - self._last_log_time + 5))
        kwargs: dict[str, Any] = {
            "follow": True,
            "timestamps": True,
            "_preload_content": False,
            "_request_timeout": (5, max(self.request_timeout, 300.0)),
        }
        container = _pick_container(pod, self.container)
        if container:
            kwargs["container"] = container
        if since is not None:
            kwargs["since_seconds"] = since
        resp = api.read_namespaced_pod_log(_name(pod), self.namespace, **kwargs)
        self._log_fresh = 0
        stream = ("pod-log", _uid(pod))
        label = f"pod {_name(pod)}"
        if stream not in self._log_labels:
            if label in self._log_labels.values():  # PyTorchJob reuses the name
                self._output.feed(
                    f"[recoverygate: pod {_name(pod)} was replaced; this is the log of "
                    f"uid {_uid(pod)}]\n".encode(),
                    label=label,
                )
            self._log_labels[stream] = label
        with self._tracked(resp):
            for line in _iter_lines(resp):
                if self._feed_line(line, stream):
                    self._log_fresh += 1
                if self._stop.is_set():
                    break
        self._source.end_stream(stream)
        return self._log_fresh

    def _feed_line(self, line: bytes, stream: Any) -> bool:
        """Parse the kubelet timestamp, drop lines seen before, feed the rest."""
        stamp, _, content = line.partition(b" ")
        try:
            ts_text = stamp.decode("ascii")
            received = parse_kubelet_timestamp(ts_text)
        except (UnicodeDecodeError, ValueError):
            ts_text, received, content = "", time.time(), line
        key = (ts_text, content)
        if key in self._seen_lines:
            return False
        last = self._last_log_time
        if last is not None and received < last - _LOG_DEDUPE_WINDOW:
            return False
        self._seen_lines[key] = received
        if last is None or received > last:
            self._last_log_time = received
            if len(self._seen_lines) > 10_000:
                horizon = received - _LOG_DEDUPE_WINDOW
                self._seen_lines = {k: v for k, v in self._seen_lines.items() if v >= horizon}
        self._source.feed(content + b"\n", received, stream=stream)
        self._output.feed(content + b"\n", stream, label=self._log_labels.get(stream))
        return True

    def job_output(self) -> JobOutput:
        """The logs of the reporting rank's pods the drill followed, one file per pod."""
        return self._output.output(
            note=(
                f"the logs of the reporting rank's pods (rank {self.reporting_rank}), as the "
                "drill streamed them; other pods: kubectl logs POD (--previous for a "
                "restarted container)"
            )
        )

    # ------------------------------------------------------------------ threads and cleanup

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        """Start a background thread, unless cleanup has begun (it would never be joined)."""
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            if self._stop.is_set():
                return
            self._threads.append(thread)
        thread.start()

    @contextlib.contextmanager
    def _tracked(self, resp: Any) -> Iterator[None]:
        """Register a streamed response so that cleanup can cut it.

        Cleanup sets ``_stop`` and then cuts the responses registered so far, under the
        lock. A response that arrives later (its request was in flight) is registered
        after that, so it must see ``_stop`` here and cut itself: otherwise its thread
        blocks on a silent stream and cleanup waits out its join.
        """
        with self._lock:
            self._open_responses.add(resp)
            stopping = self._stop.is_set()
        if stopping:
            _shutdown(resp)
        try:
            yield
        finally:
            with self._lock:
                self._open_responses.discard(resp)
            with contextlib.suppress(Exception):
                resp.close()
            with contextlib.suppress(Exception):
                resp.release_conn()

    def cleanup(self) -> None:
        """Stop the threads (cutting their streams), close the pools. Idempotent."""
        if self._cleaned:
            return
        self._cleaned = True
        with self._lock:  # after this, no thread starts and no response goes unseen
            self._stop.set()
            responses = list(self._open_responses)
            threads = list(self._threads)
        for resp in responses:
            _shutdown(resp)
        for thread in threads:
            thread.join(timeout=10)
        self._source.close()
        with self._lock:
            clients, self._clients = self._clients, []
        for api_client in clients:
            with contextlib.suppress(Exception):
                api_client.close()


def _iter_lines(resp: Any) -> Iterator[bytes]:
    """Lines of a streamed urllib3 response, as they arrive."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk.encode() if isinstance(chunk, str) else chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                break
            line, buffer = buffer[:end], buffer[end + 1 :]
            if line:
                yield line
    if buffer:
        yield buffer


def _shutdown(resp: Any) -> None:
    """Unblock a thread reading ``resp`` (urllib3 >= 2.3 has shutdown(); else the socket)."""
    shutdown = getattr(resp, "shutdown", None)
    if callable(shutdown):
        with contextlib.suppress(Exception):
            shutdown()
            return
    conn = getattr(resp, "connection", None) or getattr(resp, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
