"""The Kubernetes backend: Kubeflow PyTorchJob / Trainer TrainJob pods (docs/kubernetes.md).

- :mod:`.pods`: which pods are the job, and which rank each runs (pure);
- :mod:`.api`: the connection, reads with retries, the threads and streams;
- :mod:`.kill`: the kill protocol (one DELETE of one pod instance);
- :mod:`.watch`: the group watch (pods changing, turned into group events);
- :mod:`.logs`: the reporting rank's pod log, followed into training events;
- :mod:`.orchestrator`: :class:`KubernetesOrchestrator`, the drill's four methods.

This module is the backend's registry entry (:data:`BACKEND`) and its ``workload``
section (:class:`KubernetesWorkload`). The only package that imports ``kubernetes``,
lazily: importing this module costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from pytest_recoverygate.config.fields import check_target_replica, distinct_items, option
from pytest_recoverygate.config.schema import (
    MAX_RANK,
    InjectFailure,
    Section,
    WorkloadBase,
    file_path,
    refuse,
)
from pytest_recoverygate.engine.model import Worker, Workload
from pytest_recoverygate.registry.seams import Backend
from pytest_recoverygate.shared.lock import LockScope

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.kubernetes.orchestrator import KubernetesOrchestrator
    from pytest_recoverygate.orchestrators.kubernetes.replicas import ReplicaGroupsOrchestrator
    from pytest_recoverygate.registry.seams import Clock, Orchestrator

__all__ = [
    "BACKEND",
    "FAULT_TYPES",
    "PARTITION_REFUSED",
    "KubernetesOrchestrator",
    "KubernetesReplica",
    "KubernetesWorkload",
    "ReplicaGroupsOrchestrator",
]

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
#: What one DELETE can do to a pod: kill it now, or terminate it gracefully (Preempt);
#: a node's pods (KillNode, DrainNode: :mod:`.nodes`); or, KillDuringRecovery, kill the
#: target's pod, then its replacement pod once the recovery shows the drill's phase.
FAULT_TYPES = (
    "KillWorker",
    "KillDuringCheckpoint",
    "Preempt",
    "KillNode",
    "DrainNode",
    "KillDuringRecovery",
)
#: Why PartitionNode is refused (the schema says it in these words).
PARTITION_REFUSED = (
    "PartitionNode cannot be injected on kubernetes: the Kubernetes API has no operation "
    "that cuts a node's network while its pods keep running (that takes the CNI or the "
    "cloud's network policy, outside what a drill may touch). Use KillNode or DrainNode, "
    "or drill partitions with orchestrator: local (nodes: N)"
)

#: Why HangWorker is refused.
_HANG_REFUSED = (
    "HangWorker cannot be injected on kubernetes: the drill's pods-only RBAC (pods "
    "list/watch/delete, pods/log get) cannot stop a process inside a container"
)

#: Why StorageFault is refused (until issue 42's real cluster: docs/faults.md).
_STORAGE_REFUSED = (
    "StorageFault cannot be injected on kubernetes yet: the drill covers a checkpoint "
    "folder with a storage layer mounted on its own machine, so the pod's volume would "
    "have to be a host folder (hostPath) of the node the drill runs on, which a drill "
    "with pods-only RBAC cannot check, and no test cluster here runs pods on the drill's "
    "machine to measure it. Drill the checkpoint storage with orchestrator: local, slurm "
    "or ray"
)


def _strip(value: Any) -> Any:
    """A selector without its surrounding blanks; an empty one is refused."""
    if isinstance(value, str):
        stripped = value.strip()
        if not stripped:
            raise refuse(
                "must not be empty (an empty selector matches every pod)",
                "a label selector naming one job",
                'e.g. selector: "training-run=llama"',
            )
        return stripped
    return value


#: A targetReplica without workload.replicas: why the drill needs them, how to add them.
_REPLICAS_NEEDED = (
    "needs workload.replicas on kubernetes: the drill finds a replica group's pods by a "
    "label selector of its own",
    'add replicas: [{replica: 0, selector: "..."}, {replica: 1, selector: "..."}] instead '
    "of selector",
)


class KubernetesReplica(Section):
    """One replica group of a torchft job (``workload.replicas``, recovery: live): the
    pods its own label selector matches (docs/torchft.md)."""

    replica: int = option(
        ..., "a whole number >= 0 (its REPLICA_GROUP_ID)", "replica: 1", ge=0, le=MAX_RANK
    )
    selector: Annotated[str, Field(min_length=1, max_length=1024)] = option(
        ...,
        "a non-empty label selector matching this replica group's pods",
        'selector: "training.kubeflow.org/job-name=ft-replica-1"',
    )

    _strip_selector = field_validator("selector", mode="before")(_strip)


class KubernetesWorkload(WorkloadBase):
    """Pods of one training job (e.g. a Kubeflow PyTorchJob), found by label selector; or
    the replica groups of a torchft job, one selector each (``replicas``)."""

    orchestrator: Literal["kubernetes"] = option(..., "kubernetes", "orchestrator: kubernetes")
    selector: Annotated[str, Field(min_length=1, max_length=1024)] | None = option(
        None, "a non-empty label selector", 'selector: "training-run=llama"'
    )
    replicas: list[KubernetesReplica] | None = option(
        None,
        "a list of {replica, selector}: one label selector per replica group (recovery: live)",
        'replicas: [{replica: 0, selector: "job-name=ft-0"}, '
        '{replica: 1, selector: "job-name=ft-1"}]',
    )
    namespace: str | None = option(
        None,
        "a namespace name (lowercase letters, digits, '-')",
        "namespace: default",
        pattern=DNS_LABEL,
    )
    context: str | None = option(None, "a kubeconfig context name", "context: my-ctx", min_length=1)
    kubeconfig: Annotated[Path | None, file_path()] = option(
        None, "a path to a kubeconfig file", "kubeconfig: ~/.kube/config"
    )
    container: str | None = option(
        None,
        "a container name (lowercase letters, digits, '-')",
        "container: pytorch",
        pattern=DNS_LABEL,
    )

    _strip_selector = field_validator("selector", mode="before")(_strip)

    def reads_job_log(self) -> bool:
        return True  # evidence.podLogs: the reporting rank's pod log (logs.py)

    @model_validator(mode="after")
    def _selector_or_replicas(self) -> KubernetesWorkload:
        if self.replicas is None:
            if self.selector is None:
                raise refuse(
                    "required key is missing",
                    "selector (one job), or replicas (one selector per replica group)",
                    'e.g. selector: "training-run=llama"',
                    key=("selector",),
                    got="nothing",
                )
            return self
        if self.selector is not None:
            raise refuse(
                "selector and replicas cannot both be set",
                "selector (one job) or replicas (one selector per replica group)",
                "keep replicas for recovery: live, or selector for one job",
                key=("selector",),
                got=self.selector,
            )
        if not self.replicas:
            raise refuse(
                "needs at least one replica group",
                "a list of {replica, selector}",
                key=("replicas",),
                got="[]",
            )
        distinct_items(self.replicas, "replica", allowed="a replica id no other item has")
        distinct_items(
            self.replicas, "selector", why=" (two replica groups cannot be the same pods)"
        )
        return self

    def replica_ids(self) -> list[int]:
        """The replica groups ``replicas`` declares (empty without it)."""
        return sorted(item.replica for item in self.replicas or [])

    def check_failure(self, failure: InjectFailure) -> None:
        known = self.replica_ids() if self.replicas is not None else None
        check_target_replica(failure.target_replica, known, *_REPLICAS_NEEDED)


def _create(workload: KubernetesWorkload, failure: InjectFailure, clock: Clock) -> Orchestrator:
    from pytest_recoverygate.orchestrators.kubernetes.orchestrator import KubernetesOrchestrator

    # What either orchestrator takes from the section: where the pods are and who reports.
    where: dict[str, Any] = {
        "namespace": workload.namespace,
        "context": workload.context,
        "kubeconfig": workload.kubeconfig,
        "container": workload.container,
        "target_rank": failure.rank_for(workload.reporting_rank),
        "reporting_rank": workload.reporting_rank,
        "clock": clock,
    }
    if workload.replicas is not None:
        from pytest_recoverygate.orchestrators.kubernetes.replicas import (
            ReplicaGroupsOrchestrator,
        )

        return ReplicaGroupsOrchestrator(
            {item.replica: item.selector for item in workload.replicas},
            target_replica=failure.target_replica if failure.target_replica is not None else 0,
            **where,
        )
    assert workload.selector is not None  # _selector_or_replicas
    return KubernetesOrchestrator(
        selector=workload.selector,
        fault=failure.type,
        cordon=bool(failure.cordon),
        **where,
    )


def _lock_scope(workload: Workload, target: Worker) -> LockScope:
    """A job is one in its namespace: the same name in two namespaces is two jobs."""
    return LockScope(workload.job, namespace=dict(target.details).get("namespace", ""))


BACKEND: Backend[KubernetesWorkload] = Backend(
    name="kubernetes",
    workload=KubernetesWorkload,
    create=_create,
    faults=frozenset(FAULT_TYPES),
    refusals={
        "HangWorker": _HANG_REFUSED,
        "PartitionNode": PARTITION_REFUSED,
        "StorageFault": _STORAGE_REFUSED,
    },
    failure_keys=frozenset({"cordon", "targetReplica"}),
    lock_scope=_lock_scope,
    summary="Kubeflow PyTorchJob / Trainer TrainJob pods, through the kubernetes client",
)


def __getattr__(name: str) -> Any:
    if name == "KubernetesOrchestrator":
        from pytest_recoverygate.orchestrators.kubernetes.orchestrator import KubernetesOrchestrator

        return KubernetesOrchestrator
    if name == "ReplicaGroupsOrchestrator":
        from pytest_recoverygate.orchestrators.kubernetes.replicas import (
            ReplicaGroupsOrchestrator,
        )

        return ReplicaGroupsOrchestrator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
