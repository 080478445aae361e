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

from pydantic import Field, field_validator

from pytest_recoverygate.config.schema import InjectFailure, WorkloadBase, file_path, meta, refuse
from pytest_recoverygate.engine.model import Worker, Workload
from pytest_recoverygate.registry.seams import Backend
from pytest_recoverygate.shared.lock import LockScope

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.kubernetes.orchestrator import KubernetesOrchestrator
    from pytest_recoverygate.registry.seams import Clock

__all__ = [
    "BACKEND",
    "FAULT_TYPES",
    "PARTITION_REFUSED",
    "KubernetesOrchestrator",
    "KubernetesWorkload",
]

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
#: What one DELETE can do to a pod: kill it now, or terminate it gracefully (Preempt).
FAULT_TYPES = ("KillWorker", "KillDuringCheckpoint", "Preempt", "KillNode", "DrainNode")
#: Why PartitionNode is refused (the schema says it in these words).
PARTITION_REFUSED = (
    "PartitionNode cannot be injected on kubernetes: the Kubernetes API has no operation "
    "that cuts a node's network while its pods keep running (that takes the CNI or the "
    "cloud's network policy, outside what a drill may touch). Use KillNode or DrainNode, "
    "or drill partitions with orchestrator: local (nodes: N)"
)


class KubernetesWorkload(WorkloadBase):
    """Pods of one training job (e.g. a Kubeflow PyTorchJob), found by label selector."""

    orchestrator: Literal["kubernetes"] = Field(
        json_schema_extra=meta("kubernetes", "orchestrator: kubernetes")
    )
    selector: Annotated[str, Field(min_length=1, max_length=1024)] = Field(
        json_schema_extra=meta("a non-empty label selector", 'selector: "training-run=llama"')
    )
    namespace: str | None = Field(
        default=None,
        pattern=DNS_LABEL,
        json_schema_extra=meta(
            "a namespace name (lowercase letters, digits, '-')", "namespace: default"
        ),
    )
    context: str | None = Field(
        default=None,
        min_length=1,
        json_schema_extra=meta("a kubeconfig context name", "context: my-ctx"),
    )
    kubeconfig: Annotated[Path | None, file_path()] = Field(
        default=None,
        json_schema_extra=meta("a path to a kubeconfig file", "kubeconfig: ~/.kube/config"),
    )
    container: str | None = Field(
        default=None,
        pattern=DNS_LABEL,
        json_schema_extra=meta(
            "a container name (lowercase letters, digits, '-')", "container: pytorch"
        ),
    )

    @field_validator("selector", mode="before")
    @classmethod
    def _strip_selector(cls, value: Any) -> Any:
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


def _create(
    workload: KubernetesWorkload, failure: InjectFailure, clock: Clock
) -> KubernetesOrchestrator:
    from pytest_recoverygate.orchestrators.kubernetes.orchestrator import KubernetesOrchestrator

    return KubernetesOrchestrator(
        selector=workload.selector,
        namespace=workload.namespace,
        context=workload.context,
        kubeconfig=workload.kubeconfig,
        container=workload.container,
        target_rank=failure.rank_for(workload.reporting_rank),
        reporting_rank=workload.reporting_rank,
        clock=clock,
        fault=failure.type,
        cordon=bool(failure.cordon),
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
        "HangWorker": (
            "HangWorker cannot be injected on kubernetes: the drill's pods-only RBAC (pods "
            "list/watch/delete, pods/log get) cannot stop a process inside a container"
        ),
        "PartitionNode": PARTITION_REFUSED,
    },
    failure_keys=frozenset({"cordon"}),
    lock_scope=_lock_scope,
    summary="Kubeflow PyTorchJob / Trainer TrainJob pods, through the kubernetes client",
)


def __getattr__(name: str) -> Any:
    if name == "KubernetesOrchestrator":
        from pytest_recoverygate.orchestrators.kubernetes.orchestrator import KubernetesOrchestrator

        return KubernetesOrchestrator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
