"""``orchestrator: procgroup``: N worker processes the drill starts, restarted as a group.

The registry entry. It is imported whenever a config names the backend, so it holds only
the config section and the Backend object; the orchestrator is imported by ``create``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BeforeValidator, Field

from pytest_recoverygate.config.schema import (
    InjectFailure,
    WorkloadBase,
    command_arguments,
    duration,
    file_path,
    meta,
    refuse,
)
from pytest_recoverygate.orchestrators.base import Backend

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.base import Clock, Orchestrator

__all__ = ["BACKEND", "ProcGroupWorkload"]


class ProcGroupWorkload(WorkloadBase):
    """The ``workload`` section: what to start, how many, how the group comes back."""

    orchestrator: Literal["procgroup"] = Field(
        json_schema_extra=meta("procgroup", "orchestrator: procgroup")
    )
    command: Annotated[list[str], BeforeValidator(command_arguments)] = Field(
        json_schema_extra=meta("a list of strings, or one string", "command: [python3, train.py]")
    )
    workers: int = Field(
        default=2, ge=2, le=64, json_schema_extra=meta("a whole number from 2 to 64", "workers: 2")
    )
    restart_delay: Annotated[float, duration(maximum=600.0)] = Field(
        default=1.0, json_schema_extra=meta("a duration up to 10m", "restartDelay: 1s")
    )
    max_restarts: int = Field(
        default=3, ge=0, le=100, json_schema_extra=meta("a whole number >= 0", "maxRestarts: 3")
    )
    workdir: Annotated[Path, file_path(must_be_dir=True, optional=False)] = Field(
        default=Path(),
        validate_default=True,
        json_schema_extra=meta("an existing folder, relative to the config file", "workdir: ."),
    )

    def check_failure(self, failure: InjectFailure) -> None:
        if failure.target_rank is not None and failure.target_rank >= self.workers:
            raise refuse(
                f"rank {failure.target_rank} does not exist in a group of {self.workers}",
                f"a rank from 0 to {self.workers - 1}",
                key=("targetRank",),
                got=str(failure.target_rank),
            )


def _create(workload: ProcGroupWorkload, failure: InjectFailure, clock: Clock) -> Orchestrator:
    from rg_procgroup.orchestrator import ProcGroupOrchestrator

    return ProcGroupOrchestrator(
        workload.command,
        workers=workload.workers,
        restart_delay=workload.restart_delay,
        max_restarts=workload.max_restarts,
        workdir=workload.workdir,
        clock=clock,
    )


BACKEND: Backend[ProcGroupWorkload] = Backend(
    name="procgroup",
    workload=ProcGroupWorkload,
    create=_create,
    faults=frozenset({"KillWorker"}),
    restart_budget=lambda workload: workload.max_restarts,
    summary="worker processes the drill starts and restarts as a group",
)
