"""Which pods are the job, and which rank each one runs: read from the pods themselves.

Pure: pod dicts (as the API server returns them) in, values out. Ranks come from
Kubeflow's labels -- PyTorchJob ``training.kubeflow.org/replica-type`` + ``replica-index``
(with a Master, RANK is the index, +1 for workers), Trainer v2 TrainJob/JobSet
``jobset.sigs.k8s.io/replicatedjob-name=node`` + ``batch.kubernetes.io/job-completion-index``
-- then an explicit ``rank`` label, then a literal ``RANK``/``PET_NODE_RANK`` env.
:func:`find_job` makes every refusal of discovery: no pods, only terminating ones, pods
of two jobs, no training node, a rank claimed twice; a pod whose rank cannot be told is
refused by :func:`pod_rank`, because guessing would risk killing the wrong thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pytest_recoverygate.engine.model import Worker
from pytest_recoverygate.errors import DiscoveryError

__all__ = [
    "JS_JOBSET",
    "PT_JOB",
    "Job",
    "Pod",
    "find_job",
    "has_master",
    "instance_of_line",
    "is_terminating",
    "job_of",
    "pick_container",
    "pod_name",
    "pod_phase",
    "pod_rank",
    "pod_uid",
    "restart_total",
    "waiting_reasons",
    "worker_of",
]

Pod = dict[str, Any]

PT_JOB = "training.kubeflow.org/job-name"
PT_REPLICA_TYPE = "training.kubeflow.org/replica-type"
PT_REPLICA_INDEX = "training.kubeflow.org/replica-index"
JS_JOBSET = "jobset.sigs.k8s.io/jobset-name"
JS_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"
TRAINER_NODE = "node"  # Trainer v2's replicated job that runs the training nodes


def _labels(pod: Pod) -> dict[str, str]:
    return dict(pod.get("metadata", {}).get("labels") or {})


def _annotations(pod: Pod) -> dict[str, str]:
    return dict(pod.get("metadata", {}).get("annotations") or {})


def pod_name(pod: Pod) -> str:
    """``metadata.name`` (``?`` when missing)."""
    return str(pod.get("metadata", {}).get("name", "?"))


def pod_uid(pod: Pod) -> str:
    """``metadata.uid``: the pod *instance* (a replacement with the same name has another)."""
    return str(pod.get("metadata", {}).get("uid", ""))


def is_terminating(pod: Pod) -> bool:
    """The pod has a ``deletionTimestamp``: it is on its way out."""
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def pod_phase(pod: Pod) -> str:
    """``status.phase`` (``Unknown`` when missing)."""
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
            f"pod {pod_name(pod)!r} has {key}={value!r}, which is not a rank "
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
        f"cannot tell the rank of pod {pod_name(pod)!r}: it has no Kubeflow replica labels "
        f"({PT_REPLICA_TYPE}/{PT_REPLICA_INDEX} or {JS_REPLICATED_JOB}/{JOB_COMPLETION_INDEX}), "
        "no 'rank' label and no literal RANK or PET_NODE_RANK env. "
        "Fix: add a label rank=<N> to the pod template, or narrow the selector to the job's pods."
    )


def has_master(pods: list[Pod]) -> bool:
    """A PyTorchJob with a Master replica (its workers' ranks then start at 1)."""
    return any((_labels(p).get(PT_REPLICA_TYPE) or "").lower() == "master" for p in pods)


def waiting_reasons(pod: Pod) -> list[str]:
    """Why the pod's containers wait (``CrashLoopBackOff``, ``ContainerCreating``…)."""
    reasons = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reasons.append(str(waiting["reason"]))
    return reasons


def restart_total(pod: Pod) -> int:
    """How often the kubelet restarted the pod's containers, in all."""
    return sum(
        int(s.get("restartCount") or 0)
        for s in (pod.get("status") or {}).get("containerStatuses") or []
    )


def _seconds(text: Any) -> float | None:
    """An RFC 3339 time of a pod's status (``2026-12-07T20:03:23Z``) as POSIX seconds."""
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _times(state: dict[str, Any] | None, key: str) -> tuple[float, float | None] | None:
    """(startedAt, finishedAt) of a containerStatus ``state`` or ``lastState`` in ``key``
    (running: no finish); None when it is not in that state."""
    times = (state or {}).get(key)
    if not isinstance(times, dict):
        return None
    started = _seconds(times.get("startedAt"))
    if started is None:
        return None
    return started, _seconds(times.get("finishedAt")) if key == "terminated" else None


def instance_of_line(pod: Pod, container: str | None, when: float) -> tuple[int, bool] | None:
    """Which instance of the container printed a log line stamped ``when``: (the
    :func:`restart_total` the pod had while it ran, whether that is sure); None when this
    view of the pod does not show that instance yet.

    The kubelet serves a restarted container's log as soon as it prints, and posts the
    pod's status (the restart count, the new container running) on its own schedule: a
    list made when such a log is opened can still show the previous container
    terminated. The status's times are whole seconds, cut: an instance that shows
    ``finishedAt`` F ended before F+1, and the next one started after F. So a line
    stamped before F is that instance's; one in [F, F+1) may be the next one's (not
    sure); a later one is the next one's. Only the newest instance (``state``) and the
    one before it (``lastState``) are in a pod's status.
    """
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    chosen = [s for s in statuses if container is None or s.get("name") == container]
    if len(chosen) != 1:
        return None
    status = chosen[0]
    count = int(status.get("restartCount") or 0)
    newest = restart_total(pod)
    state, last = status.get("state"), status.get("lastState")
    running = _times(state, "running")
    if running is not None and running[0] <= when:
        return newest, True
    ended = _times(state, "terminated")
    if ended is not None and ended[1] is not None and ended[0] <= when < ended[1] + 1.0:
        return newest, when < ended[1]
    before = _times(last, "terminated")
    if count and before is not None and before[1] is not None:
        started, finished = before[0], before[1]
        if started <= when < finished + 1.0:  # sure: the newest one started after the line
            return newest - 1, running is not None or when < finished
    return None


def pick_container(pod: Pod, wanted: str | None) -> str | None:
    """The container whose log carries the training events (None: the only one)."""
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


def worker_of(pod: Pod, rank: int, *, namespace: str | None, job: str) -> Worker:
    """The drill's view of one pod: named by the pod, identified by its uid."""
    return Worker(
        rank=rank,
        name=pod_name(pod),
        instance_id=pod_uid(pod),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        details=(
            ("namespace", str(namespace)),
            ("phase", pod_phase(pod)),
            ("job", job),
        ),
    )


@dataclass(frozen=True, slots=True)
class Job:
    """The training job discovery found: its pods' ranks and the pod of each rank."""

    key: str  # "PyTorchJob/name", "TrainJob/name", or "" for pods without a job label
    name: str  # the key, or "pods matching <selector>"
    has_master: bool
    ranks: dict[str, int]  # uid -> rank, for every training-node pod of the job
    members: dict[int, Pod]  # rank -> the pod that runs it now


def find_job(pods: list[Pod], *, selector: str, namespace: str | None, host: str) -> Job:
    """Group, rank and check the listed pods (every refusal of discovery happens here)."""
    where = f"namespace {namespace!r}"
    if not pods:
        raise DiscoveryError(
            f"no pods match selector {selector!r} in {where} (server {host}). "
            f"Check with: kubectl get pods -n {namespace} -l '{selector}'"
        )
    live = [p for p in pods if not is_terminating(p)]
    if not live:
        raise DiscoveryError(f"every pod matching {selector!r} in {where} is terminating")
    jobs: dict[str, list[Pod]] = {}
    for pod in live:
        jobs.setdefault(job_of(pod), []).append(pod)
    if len(jobs) > 1:
        names = ", ".join(sorted(job or "pods without a Kubeflow job label" for job in jobs))
        raise DiscoveryError(
            f"selector {selector!r} matches pods of {len(jobs)} jobs in {where}: {names}. "
            "Refusing to pick one. Fix: narrow the selector to one job, e.g. "
            f"'{PT_JOB}=<name>' or '{JS_JOBSET}=<name>'."
        )
    job_key, members = next(iter(jobs.items()))
    job = job_key or f"pods matching {selector!r}"
    master = has_master(members)
    by_rank: dict[int, list[Pod]] = {}
    ranks: dict[str, int] = {}
    for pod in members:
        rank = pod_rank(pod, job_has_master=master)
        if rank is not None:
            by_rank.setdefault(rank, []).append(pod)
            ranks[pod_uid(pod)] = rank
    if not by_rank:
        raise DiscoveryError(f"{job} in {where} has no training-node pods matching {selector!r}")
    chosen: dict[int, Pod] = {}
    for rank, claimants in sorted(by_rank.items()):
        active = [p for p in claimants if pod_phase(p) in ("Pending", "Running")] or claimants
        if len(active) > 1:
            raise DiscoveryError(
                f"{len(active)} pods claim rank {rank} of {job}: "
                f"{', '.join(pod_name(p) for p in active)}. Refusing to guess which to kill."
            )
        chosen[rank] = active[0]
    return Job(job_key, job, master, ranks, chosen)
