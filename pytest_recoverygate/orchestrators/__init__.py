"""The backends, one package each; and, for backends written against this path,
everything of :mod:`pytest_recoverygate.registry` (docs/backends.md).
"""

from __future__ import annotations

from pytest_recoverygate import registry
from pytest_recoverygate.config.schema import DrillConfig
from pytest_recoverygate.registry import *  # noqa: F403
from pytest_recoverygate.registry import Clock, Orchestrator, get_backend

__all__ = [*registry.__all__, "build_orchestrator"]  # noqa: PLE0604


def build_orchestrator(config: DrillConfig, clock: Clock) -> Orchestrator:
    """The backend ``workload.orchestrator`` names, built from the config."""
    backend = get_backend(config.workload.orchestrator)
    return backend.create(config.workload, config.inject_failure, clock)
