"""The backends, one package each; and, for backends written against this path,
everything of :mod:`pytest_recoverygate.registry` (docs/backends.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_recoverygate import registry
from pytest_recoverygate.config.schema import DrillConfig, WorkloadBase
from pytest_recoverygate.registry import *  # noqa: F403
from pytest_recoverygate.registry import Clock, Orchestrator, get_backend

__all__ = [*registry.__all__, "AUTO_ENV", "build_orchestrator", "with_evidence"]  # noqa: PLE0604

#: The reporter's start-up hook variable (recoverygate.integrations.auto).
AUTO_ENV = "RECOVERYGATE_AUTO"


def build_orchestrator(
    config: DrillConfig, clock: Clock, environment: Mapping[str, str] | None = None
) -> Orchestrator:
    """The backend ``workload.orchestrator`` names, built from the config.

    With an ``evidence`` section, a job the drill launches gets the patterns in
    ``RECOVERYGATE_AUTO`` (its ``env``, which group members and Ray entrypoints inherit);
    with ``evidence.podLogs`` the Kubernetes backend matches the pod log itself.
    ``environment`` is the drill's own addition to a launched job's ``env`` (a
    StickyFault's poison), over the workload's.
    """
    backend = get_backend(config.workload.orchestrator)
    workload = with_evidence(config)
    if environment:
        env = getattr(workload, "env", None)
        if not isinstance(env, dict):
            raise TypeError(f"{backend.name} workloads carry no env for the drill's variables")
        workload = workload.model_copy(update={"env": {**env, **environment}})
    orchestrator = backend.create(workload, config.inject_failure, clock)
    if config.evidence is not None and config.evidence.pod_logs:
        orchestrator.match_log_evidence(config.evidence.spec())  # type: ignore[attr-defined]
    return orchestrator


def with_evidence(config: DrillConfig) -> WorkloadBase:
    """``config.workload``, its ``env`` carrying the evidence spec when there is one."""
    workload = config.workload
    env = getattr(workload, "env", None)
    if config.evidence is None or config.evidence.pod_logs or not isinstance(env, dict):
        return workload
    evidence = config.evidence
    update: dict[str, Any] = {"env": {**env, AUTO_ENV: evidence.environment(env.get(AUTO_ENV))}}
    group = getattr(workload, "group", None)
    if group:  # a member's own RECOVERYGATE_AUTO wins over the workload's: it gets the spec too
        update["group"] = [
            m.model_copy(update={"env": {**m.env, AUTO_ENV: evidence.environment(m.env[AUTO_ENV])}})
            if AUTO_ENV in m.env
            else m
            for m in group
        ]
    return workload.model_copy(update=update)
