"""The Kubernetes backend: Kubeflow PyTorchJob / Trainer TrainJob pods (docs/kubernetes.md).

- :mod:`.pods`: which pods are the job, and which rank each runs (pure);
- :mod:`.api`: the connection, reads with retries, the threads and streams;
- :mod:`.kill`: the kill protocol (one DELETE of one pod instance);
- :mod:`.watch`: the group watch (pods changing, turned into group events);
- :mod:`.logs`: the reporting rank's pod log, followed into training events;
- :mod:`.orchestrator`: :class:`KubernetesOrchestrator`, the drill's four methods.

The only package that imports ``kubernetes``, lazily: importing this one costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.kubernetes.orchestrator import KubernetesOrchestrator

__all__ = ["KubernetesOrchestrator"]


def __getattr__(name: str) -> Any:
    if name == "KubernetesOrchestrator":
        from pytest_recoverygate.orchestrators.kubernetes.orchestrator import (
            KubernetesOrchestrator,
        )

        return KubernetesOrchestrator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
