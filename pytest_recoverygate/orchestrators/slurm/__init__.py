"""The SLURM backend: a running SLURM job, three recovery layouts (docs/slurm.md).

- :mod:`.parsing`: what the Slurm clients and the node scripts print, read (pure);
- :mod:`.commands`: running the clients (timeouts, retries, destructive commands once);
- :mod:`.events`: the job's output file tailed into training events;
- :mod:`.orchestrator`: :class:`SlurmOrchestrator`, the drill's four methods.

This module is the backend's registry entry (:data:`BACKEND`) and its ``workload``
section (:class:`SlurmWorkload`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from pytest_recoverygate.fields import exactly_one
from pytest_recoverygate.orchestrators.base import Backend
from pytest_recoverygate.schema import (
    InjectFailure,
    WorkloadBase,
    duration,
    file_path,
    id_number,
    meta,
    refuse,
)

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.base import Clock
    from pytest_recoverygate.orchestrators.slurm.orchestrator import SlurmOrchestrator

__all__ = ["BACKEND", "FAULT_TYPES", "SlurmOrchestrator", "SlurmWorkload"]

MAX_SLURM_JOB_ID = 2**32 - 1
#: What this backend can inject: a signal to one rank through a kill step on its node
#: (SIGKILL, SIGKILL mid-save, SIGTERM then SIGKILL, SIGSTOP), the whole step, or a
#: requeue of the job, or every process of the job's step on one node (KillNode, with
#: ``drain_node`` also the node DRAIN) (docs/slurm.md, "What each fault does").
FAULT_TYPES = (
    "KillWorker",
    "KillDuringCheckpoint",
    "Preempt",
    "HangWorker",
    "KillStep",
    "Requeue",
    "KillNode",
)


class SlurmWorkload(WorkloadBase):
    """One SLURM job, by id or by name (+ user)."""

    orchestrator: Literal["slurm"] = Field(json_schema_extra=meta("slurm", "orchestrator: slurm"))
    job_id: Annotated[int | None, BeforeValidator(id_number)] = Field(
        default=None,
        ge=1,
        le=MAX_SLURM_JOB_ID,
        json_schema_extra=meta(
            'a SLURM job id (a whole number, also quoted: "12345")', "jobId: 12345"
        ),
    )
    job_name: str | None = Field(
        default=None, min_length=1, json_schema_extra=meta("a SLURM job name", "jobName: llama-ft")
    )
    user: str | None = Field(
        default=None, min_length=1, json_schema_extra=meta("a user name", "user: alice")
    )
    partition: str | None = Field(
        default=None, min_length=1, json_schema_extra=meta("a partition name", "partition: gpu")
    )
    output: Annotated[Path | None, file_path()] = Field(
        default=None,
        json_schema_extra=meta(
            "the job's stdout file (SLURM patterns like %j allowed)", "output: slurm-%j.out"
        ),
    )
    poll_interval: Annotated[float, duration(0.1, 60.0)] = Field(
        default=1.0, json_schema_extra=meta("a duration from 100ms to 1m", "pollInterval: 1s")
    )

    @model_validator(mode="after")
    def _one_job(self) -> SlurmWorkload:
        exactly_one(
            ("jobId", self.job_id),
            ("jobName", self.job_name),
            missing=("jobId or jobName (exactly one)", "e.g. jobId: 12345"),
            both=("exactly one of jobId / jobName", "keep the one that names the job"),
        )
        if self.user is not None and self.job_name is None:
            raise refuse(
                "user only applies with jobName",
                "user together with jobName",
                "remove user: a job id is unique",
                key=("user",),
                got=self.user,
            )
        return self


def _create(workload: SlurmWorkload, failure: InjectFailure, clock: Clock) -> SlurmOrchestrator:
    from pytest_recoverygate.orchestrators.slurm.orchestrator import SlurmOrchestrator

    return SlurmOrchestrator(
        job_id=workload.job_id,
        job_name=workload.job_name,
        user=workload.user,
        partition=workload.partition,
        output=str(workload.output) if workload.output is not None else None,
        poll_interval=workload.poll_interval,
        fault=failure.type,
        target_rank=failure.rank_for(workload.reporting_rank),
        reporting_rank=workload.reporting_rank,
        clock=clock,
        drain_node=bool(failure.drain_node),
    )


BACKEND: Backend[SlurmWorkload] = Backend(
    name="slurm",
    workload=SlurmWorkload,
    create=_create,
    faults=frozenset(FAULT_TYPES),
    refusals={
        "PartitionNode": (
            "PartitionNode cannot be injected on slurm: a node's network is the cluster's, "
            "not the job's, and nothing a job's user may run cuts it. Use KillNode (with "
            "drainNode: true to keep the requeued job off that node), or drill partitions "
            "with orchestrator: local (nodes: N)"
        ),
        "DrainNode": (
            "DrainNode is Kubernetes' eviction; on slurm use KillNode with drainNode: true "
            "(the node's tasks SIGKILLed, the node set DRAIN, RESUMEd at cleanup)"
        ),
    },
    failure_keys=frozenset({"drainNode"}),
    summary="a running SLURM job, three recovery layouts",
)


def __getattr__(name: str) -> Any:
    if name == "SlurmOrchestrator":  # imported on first use: it pulls in subprocess & co.
        from pytest_recoverygate.orchestrators.slurm.orchestrator import SlurmOrchestrator

        return SlurmOrchestrator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
