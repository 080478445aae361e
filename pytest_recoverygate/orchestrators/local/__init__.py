"""The local backend: a torchrun job on this machine, launched or attached to (docs/local.md).

- :mod:`.processes`: process instances by pid and start time, signals through pidfds;
- :mod:`.torchrun`: what torchrun's command line and output say (pure);
- :mod:`.orchestrator`: :class:`LocalOrchestrator`, the drill's four methods, composed
  from :mod:`.launch`, :mod:`.scan`, :mod:`.kill`, :mod:`.watch`, :mod:`.output` and
  :mod:`.cleanup`;
- :mod:`.members`: ``workload.group``, a job of several members (a torchft lighthouse
  and its replica groups), each a command of its own.

This module is the backend's registry entry (:data:`BACKEND`) and its ``workload``
section (:class:`LocalWorkload`); importing it does not import psutil.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, field_validator, model_validator

from pytest_recoverygate.config.fields import (
    Command,
    command_field,
    env_field,
    env_names,
    launch_or_attach,
    option,
    workdir_field,
)
from pytest_recoverygate.config.schema import (
    MAX_PID,
    IdNumber,
    InjectFailure,
    Section,
    WorkloadBase,
    command_arguments,
    file_path,
    id_option,
    node_count_field,
    refuse,
)
from pytest_recoverygate.orchestrators.local.torchrun import max_restarts
from pytest_recoverygate.registry.seams import Backend
from pytest_recoverygate.shared.procs import JobLaunch
from pytest_recoverygate.storage.scope import named_folders

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.local.members import GroupOrchestrator
    from pytest_recoverygate.orchestrators.local.orchestrator import (
        DRILL_MARKER,
        LocalOrchestrator,
    )
    from pytest_recoverygate.registry.seams import Clock, Orchestrator

__all__ = [
    "BACKEND",
    "DRILL_MARKER",
    "REPLICA_VARIABLES",
    "GroupOrchestrator",
    "LocalOrchestrator",
    "LocalWorkload",
    "Member",
    "replica_of",
]


_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: Where a member's replica group is read from, first match wins (the reporter's order).
REPLICA_VARIABLES = ("RECOVERYGATE_REPLICA", "REPLICA_GROUP_ID")


def replica_of(env: Mapping[str, str]) -> int | None:
    """The member's replica group from its environment, or None."""
    for name in REPLICA_VARIABLES:
        value = env.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


class Member(Section):
    """One member of ``workload.group``: a command of its own (docs/torchft.md)."""

    name: str = option(..., "a short unique name (letters, digits, _ . -)", "name: replica-0")
    command: Annotated[list[str], BeforeValidator(command_arguments)] = option(
        ...,
        "a non-empty list of strings, or one string split like a shell; {port:NAME} is a free port",
        'command: ["torchrun", "--nproc-per-node=1", "train_ft.py"]',
    )
    env: dict[str, str] = option(
        ...,
        "a mapping of names to text values ({port:NAME} is a free port)",
        'env: {REPLICA_GROUP_ID: "0"}',
        default_factory=dict,
    )
    workdir: Annotated[Path | None, file_path(must_be_dir=True)] = option(
        None,
        "an existing folder, relative to the config file's folder (default: workload.workdir)",
        "workdir: .",
    )
    service: bool = option(
        False,
        "true or false: runs for the others (a lighthouse) and never keeps the job alive",
        "service: true",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if _NAME.fullmatch(name) is None:
            raise refuse(
                "is not a usable member name",
                "1 to 64 of letters, digits, _ . -",
                "e.g. replica-0",
                got=repr(name),
            )
        return name


#: What to do about ``nodes: N`` with a group, or with attachPid.
_NODES_GROUP_FIX = "remove nodes, or give one command instead of the group"
_NODES_PID_FIX = "remove attachPid and give the command every node runs"


class LocalWorkload(WorkloadBase):
    """A torchrun job on this machine, launched by the drill or attached to by pid."""

    orchestrator: Literal["local"] = option(..., "local", "orchestrator: local")
    command: Command = command_field('command: ["torchrun", "--nproc-per-node=2", "train.py"]')
    workdir: Annotated[Path, file_path(must_be_dir=True, optional=False)] = workdir_field()
    env: dict[str, str] = env_field('env: {NCCL_DEBUG: "INFO"}')
    nodes: int = node_count_field()
    group: list[Member] | None = option(
        None,
        "a list of members, each with name and command (and env, workdir, service)",
        "group: [{name: replica-0, command: [torchrun, train_ft.py]}]",
    )
    attach_pid: IdNumber = id_option(
        "the pid of a running torchrun agent", "attachPid", 1234, MAX_PID
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        return env_names(env, "NCCL_DEBUG")

    @model_validator(mode="after")
    def _command_xor_attach(self) -> LocalWorkload:
        if self.group is not None:
            return self._one_group()
        launch_or_attach(
            ("command", self.command),
            ("attachPid", self.attach_pid),
            running="a torchrun agent already running",
            example='command: ["torchrun", "--nproc-per-node=2", "train.py"]',
        )
        return self

    @model_validator(mode="after")
    def _nodes_are_launched(self) -> LocalWorkload:
        for other, given, why, fix in (
            ("group", self.group, "a node runs one command", _NODES_GROUP_FIX),
            ("attachPid", self.attach_pid, "the drill launches each node itself", _NODES_PID_FIX),
        ):
            if self.nodes > 1 and given is not None:
                raise refuse(
                    f"cannot be combined with {other}: {why}",
                    f"nodes: 1 with {other}, or a command with nodes: N",
                    fix,
                    key=("nodes",),
                    got=str(self.nodes),
                )
        return self

    def _one_group(self) -> LocalWorkload:
        if self.command is not None or self.attach_pid is not None:
            key = "command" if self.command is not None else "attachPid"
            raise refuse(
                f"group and {key} cannot both be set",
                "either group (several members) or command / attachPid (one job)",
                f"remove {key}, or group",
                key=(key,),
            )
        group = self.group or []
        if not group:
            raise refuse("needs at least one member", "a list of members", key=("group",))
        seen: set[str] = set()
        for index, member in enumerate(group):
            if member.name in seen:
                raise refuse(
                    "is the name of another member too",
                    "a name no other member has",
                    key=("group", str(index), "name"),
                    got=member.name,
                )
            seen.add(member.name)
        if all(member.service for member in group):
            raise refuse(
                "has no member that trains (every member is service: true)",
                "at least one member without service: true",
                key=("group",),
            )
        return self

    def replicas(self) -> list[int]:
        """The replica groups of the group's members (REPLICA_GROUP_ID / RECOVERYGATE_REPLICA)."""
        envs = [{**self.env, **m.env} for m in (self.group or []) if not m.service]
        if self.group is None:
            envs = [dict(self.env)]
        return sorted({r for env in envs if (r := replica_of(env)) is not None})

    def check_failure(self, failure: InjectFailure) -> None:
        replica = failure.target_replica
        if replica is None:
            return
        known = self.replicas()
        if replica not in known:
            where = "workload.group members'" if self.group is not None else "workload.env's"
            raise refuse(
                f"is not among the {where} REPLICA_GROUP_ID / RECOVERYGATE_REPLICA values "
                f"({', '.join(map(str, known)) or 'none set'})",
                f"one of {known}" if known else "a replica the job's members declare",
                "set targetReplica to one of them, or give each member "
                'env: {REPLICA_GROUP_ID: "N"}',
                key=("targetReplica",),
                got=str(replica),
            )

    def target_member(self, replica: int | None) -> Member | None:
        """The member the drill kills in: the target replica's, else the first that trains."""
        trainers = [m for m in (self.group or []) if not m.service]
        for member in trainers:
            if replica is not None and replica_of({**self.env, **member.env}) == replica:
                return member
        return trainers[0] if trainers else None

    def launched_with(self) -> tuple[tuple[str, ...], Mapping[str, str]]:
        member = self.target_member(None)
        if member is not None:
            return tuple(member.command), {**self.env, **member.env}
        return tuple(self.command or ()), dict(self.env)

    def node_count(self) -> int:
        return self.nodes

    def storage_scope(self) -> tuple[Path, ...]:
        """Its working folders and every existing folder its commands and environment
        name (a path, or the value of ``--opt=path``), relative to the working folder."""
        folders = [self.workdir]
        words: list[tuple[Path, str]] = [(self.workdir, w) for w in self.command or []]
        words += [(self.workdir, v) for v in self.env.values()]
        for member in self.group or []:
            where = member.workdir if member.workdir is not None else self.workdir
            folders.append(where)
            words += [(where, w) for w in member.command]
            words += [(where, v) for v in member.env.values()]
        return tuple(dict.fromkeys([*folders, *named_folders(words)]))


def _create(workload: LocalWorkload, failure: InjectFailure, clock: Clock) -> Orchestrator:
    from pytest_recoverygate.orchestrators.local.orchestrator import LocalOrchestrator

    env = dict(workload.env)
    if workload.reporting_rank and "RECOVERYGATE_RANKS" not in os.environ:
        env.setdefault("RECOVERYGATE_RANKS", str(workload.reporting_rank))  # the reporter's filter
    if workload.group is not None:
        from pytest_recoverygate.orchestrators.local.members import GroupOrchestrator, MemberSpec

        members = [
            MemberSpec(
                m.name,
                tuple(m.command),
                dict(m.env),
                m.workdir if m.workdir is not None else workload.workdir,
                m.service,
            )
            for m in workload.group
        ]
        return GroupOrchestrator(
            members,
            env,
            target_replica=failure.target_replica,
            target_rank=failure.rank_for(workload.reporting_rank),
            clock=clock,
        )
    job = JobLaunch(workload.command or [], workload.workdir, env)
    if workload.nodes > 1:
        from pytest_recoverygate.orchestrators.local.nodes import LocalNodesOrchestrator

        return LocalNodesOrchestrator(job, nodes=workload.nodes, clock=clock)
    return LocalOrchestrator(
        job,
        target_rank=failure.rank_for(workload.reporting_rank),
        clock=clock,
        attach_pid=workload.attach_pid,
    )


def _restart_budget(workload: LocalWorkload) -> int | None:
    """torchrun's ``--max-restarts`` from the command the drill launches (None: attached)."""
    if workload.group is not None:
        member = workload.target_member(None)
        return max_restarts(member.command) if member is not None else None
    return max_restarts(workload.command) if workload.command is not None else None


BACKEND: Backend[LocalWorkload] = Backend(
    name="local",
    workload=LocalWorkload,
    create=_create,
    faults=frozenset(
        {
            "KillWorker",
            "KillDuringCheckpoint",
            "Preempt",
            "HangWorker",
            "KillNode",
            "PartitionNode",
            "StorageFault",
            "KillDuringRecovery",
            "StickyFault",
        }
    ),
    failure_keys=frozenset({"targetReplica"}),
    restart_budget=_restart_budget,
    summary="a torchrun job the drill launches (or attaches to) on this machine",
)


def __getattr__(name: str) -> Any:
    if name in ("DRILL_MARKER", "LocalOrchestrator"):  # imported on first use: psutil
        from pytest_recoverygate.orchestrators.local import orchestrator

        return getattr(orchestrator, name)
    if name == "GroupOrchestrator":
        from pytest_recoverygate.orchestrators.local import members

        return members.GroupOrchestrator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
