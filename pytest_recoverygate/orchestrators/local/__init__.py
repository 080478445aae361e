"""The local backend: a torchrun job on this machine, launched or attached to (docs/local.md).

- :mod:`.processes`: process instances by pid and start time, signals through pidfds;
- :mod:`.torchrun`: what torchrun's command line and output say (pure);
- :mod:`.orchestrator`: :class:`LocalOrchestrator`, the drill's four methods.

This module is the backend's registry entry (:data:`BACKEND`) and its ``workload``
section (:class:`LocalWorkload`); importing it does not import psutil.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from pytest_recoverygate.orchestrators.base import Backend
from pytest_recoverygate.orchestrators.local.torchrun import max_restarts
from pytest_recoverygate.schema import (
    MAX_PID,
    InjectFailure,
    WorkloadBase,
    command_arguments,
    file_path,
    id_number,
    meta,
    node_count_field,
    refuse,
)

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.base import Clock, Orchestrator
    from pytest_recoverygate.orchestrators.local.orchestrator import (
        DRILL_MARKER,
        LocalOrchestrator,
    )

__all__ = ["BACKEND", "DRILL_MARKER", "LocalOrchestrator", "LocalWorkload"]


class LocalWorkload(WorkloadBase):
    """A torchrun job on this machine, launched by the drill or attached to by pid."""

    orchestrator: Literal["local"] = Field(json_schema_extra=meta("local", "orchestrator: local"))
    command: Annotated[list[str] | None, BeforeValidator(command_arguments)] = Field(
        default=None,
        json_schema_extra=meta(
            "a non-empty list of strings (plain numbers like 2 or 0.5 count as written), "
            "or one string split like a shell (no shell runs)",
            'command: ["torchrun", "--nproc-per-node=2", "train.py"]',
        ),
    )
    workdir: Annotated[Path, file_path(must_be_dir=True, optional=False)] = Field(
        default=Path(),
        validate_default=True,
        json_schema_extra=meta(
            "an existing folder, relative to the config file's folder", "workdir: ."
        ),
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra=meta(
            "a mapping of names to text values (plain numbers like 1 count as written)",
            'env: {NCCL_DEBUG: "INFO"}',
        ),
    )
    nodes: int = node_count_field()
    attach_pid: Annotated[int | None, BeforeValidator(id_number)] = Field(
        default=None,
        ge=1,
        le=MAX_PID,
        json_schema_extra=meta(
            'the pid of a running torchrun agent (a whole number, also quoted: "1234")',
            "attachPid: 1234",
        ),
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not name or "=" in name or "\x00" in name:
                raise refuse(
                    "is not a usable environment variable name",
                    "names without '=' or NUL, like NCCL_DEBUG",
                    key=(name,),
                    got=repr(name),
                )
        return env

    @model_validator(mode="after")
    def _command_xor_attach(self) -> LocalWorkload:
        if self.command is None and self.attach_pid is None:
            raise refuse(
                "required key is missing",
                "command (the job to launch) or attachPid (a torchrun agent already running)",
                'e.g. command: ["torchrun", "--nproc-per-node=2", "train.py"]',
                key=("command",),
                got="nothing",
            )
        if self.command is not None and self.attach_pid is not None:
            raise refuse(
                "attachPid and command cannot both be set",
                "either command (launch) or attachPid (attach)",
                "remove command to attach to the running job, or attachPid to launch one",
                key=("attachPid",),
                got=str(self.attach_pid),
            )
        return self

    @model_validator(mode="after")
    def _nodes_are_launched(self) -> LocalWorkload:
        if self.nodes > 1 and self.attach_pid is not None:
            raise refuse(
                "cannot be combined with attachPid: the drill launches each node itself",
                "nodes: 1 with attachPid, or a command with nodes: N",
                "remove attachPid and give the command every node runs",
                key=("nodes",),
                got=str(self.nodes),
            )
        return self

    def launched_with(self) -> tuple[tuple[str, ...], Mapping[str, str]]:
        return tuple(self.command or ()), dict(self.env)

    def node_count(self) -> int:
        return self.nodes


def _create(workload: LocalWorkload, failure: InjectFailure, clock: Clock) -> Orchestrator:
    from pytest_recoverygate.orchestrators.local.orchestrator import LocalOrchestrator

    env = dict(workload.env)
    if workload.reporting_rank and "RECOVERYGATE_RANKS" not in os.environ:
        env.setdefault("RECOVERYGATE_RANKS", str(workload.reporting_rank))  # the reporter's filter
    if workload.nodes > 1:
        from pytest_recoverygate.orchestrators.local.nodes import LocalNodesOrchestrator

        return LocalNodesOrchestrator(
            list(workload.command or []), workload.workdir, env, nodes=workload.nodes, clock=clock
        )
    return LocalOrchestrator(
        list(workload.command or []),
        workload.workdir,
        env,
        target_rank=failure.rank_for(workload.reporting_rank),
        clock=clock,
        attach_pid=workload.attach_pid,
    )


def _restart_budget(workload: LocalWorkload) -> int | None:
    """torchrun's ``--max-restarts`` from the command the drill launches (None: attached)."""
    return max_restarts(workload.command) if workload.command is not None else None


BACKEND: Backend[LocalWorkload] = Backend(
    name="local",
    workload=LocalWorkload,
    create=_create,
    faults=frozenset(
        {"KillWorker", "KillDuringCheckpoint", "Preempt", "HangWorker", "KillNode", "PartitionNode"}
    ),
    restart_budget=_restart_budget,
    summary="a torchrun job the drill launches (or attaches to) on this machine",
)


def __getattr__(name: str) -> Any:
    if name in ("DRILL_MARKER", "LocalOrchestrator"):  # imported on first use: psutil
        from pytest_recoverygate.orchestrators.local import orchestrator

        return getattr(orchestrator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
