"""Backends, one module each, behind the :class:`~.base.Orchestrator` protocol.

:func:`build_orchestrator` imports the chosen backend lazily, so ``recoverygate --help``
and the unit tests never pay for ``kubernetes`` or ``psutil``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_recoverygate.orchestrators.base import (
    Clock,
    EventSource,
    JobOutputSource,
    Orchestrator,
    RealClock,
    SimulatedClock,
)

if TYPE_CHECKING:
    from pytest_recoverygate.config import DrillConfig

__all__ = [
    "Clock",
    "EventSource",
    "JobOutputSource",
    "Orchestrator",
    "RealClock",
    "SimulatedClock",
    "build_orchestrator",
]


def build_orchestrator(config: DrillConfig, clock: Clock) -> Orchestrator:
    """The backend named by ``workload.orchestrator``, built from the config."""
    kind = config.workload.orchestrator
    if kind == "fake":
        from pytest_recoverygate.orchestrators.fake import FakeOrchestrator

        return FakeOrchestrator.from_config(config, clock)
    if kind == "local":
        from pytest_recoverygate.orchestrators.local import LocalOrchestrator

        return LocalOrchestrator.from_config(config, clock)
    if kind == "kubernetes":
        from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator

        return KubernetesOrchestrator.from_config(config, clock)
    if kind == "slurm":
        from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator

        return SlurmOrchestrator.from_config(config, clock)
    raise AssertionError(f"unknown orchestrator {kind!r} passed validation")
