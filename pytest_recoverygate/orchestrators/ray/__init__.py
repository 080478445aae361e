"""The Ray backend: a Ray Train job (``TorchTrainer`` + ``FailureConfig``) (docs/ray.md).

- :mod:`.helper`: the only module that imports ``ray``, run as a subprocess: the
  dashboard's address, the kill tasks pinned to a node (a worker, or a node's raylet);
- :mod:`.server`: the kill server, a helper connected to the cluster once at discovery;
- :mod:`.signals`: the signal of each fault to one worker by identity, and what cleanup
  owes the job (the SIGCONT of a stopped worker, first of all);
- :mod:`.state`: Train's run state as the dashboard serves it, read (pure);
- :mod:`.orchestrator`: :class:`RayOrchestrator`, the drill's methods: the driver it
  launches, the session's ``worker-*.out`` logs it reads, the group it watches.

This module is the backend's registry entry (:data:`BACKEND`) and its ``workload``
section (:class:`RayWorkload`); importing it does not import ``ray``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import field_validator, model_validator

from pytest_recoverygate.config.fields import (
    Command,
    command_field,
    env_field,
    env_names,
    file_path,
    launch_or_attach,
    option,
    refuse,
    workdir_field,
)
from pytest_recoverygate.config.schema import InjectFailure, WorkloadBase
from pytest_recoverygate.links import docs_link
from pytest_recoverygate.registry.seams import Backend
from pytest_recoverygate.shared.procs import JobLaunch
from pytest_recoverygate.storage.scope import named_folders

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.ray.orchestrator import RayOrchestrator
    from pytest_recoverygate.registry.seams import Clock

__all__ = ["BACKEND", "FAULT_TYPES", "INSTALL_HINT", "RayOrchestrator", "RayWorkload"]

#: What this backend can inject (docs/ray.md, "What each fault does"); StorageFault on the
#: run's ``storage_path``, of a cluster the driver starts on this machine.
FAULT_TYPES = (
    "KillWorker",
    "KillDuringCheckpoint",
    "Preempt",
    "HangWorker",
    "KillNode",
    "StorageFault",
)
#: How to get what this backend imports.
INSTALL_HINT = 'pip install "recoverygate[ray]" (it brings ray[default,train])'


class RayWorkload(WorkloadBase):
    """A Ray Train job: a driver the drill launches, or a Ray Job already running."""

    orchestrator: Literal["ray"] = option(..., "ray", "orchestrator: ray")
    entrypoint: Command = command_field("entrypoint: [python, train_ray.py]", "the driver")
    workdir: Annotated[Path, file_path(must_be_dir=True, optional=False)] = workdir_field()
    env: dict[str, str] = env_field('env: {RECOVERYGATE_AUTO: "1"}')
    address: str | None = option(
        None,
        "a running Ray cluster: auto, or the head's host:port (its GCS address)",
        "address: 127.0.0.1:6379",
        min_length=1,
    )
    submission_id: str | None = option(
        None,
        "the submission id of a running Ray Job (with address)",
        "submissionId: raysubmit_XYZ",
        min_length=1,
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        return env_names(env, "RECOVERYGATE_AUTO")

    @field_validator("address")
    @classmethod
    def _address_form(cls, address: str | None) -> str | None:
        if address is None or address == "auto":
            return address
        host, sep, port = address.rpartition(":")
        if address.startswith("ray://") or not sep or not host or not port.isdigit():
            raise refuse(
                "is not the address of a Ray cluster's head",
                "auto, or host:port of the head's GCS (what `ray start --head` prints)",
                "e.g. address: 127.0.0.1:6379",
                got=address,
            )
        if not 0 < int(port) < 65536:
            raise refuse("has no usable port", "a port from 1 to 65535", got=address)
        return address

    @model_validator(mode="after")
    def _entrypoint_xor_submission(self) -> RayWorkload:
        launch_or_attach(
            ("entrypoint", self.entrypoint),
            ("submissionId", self.submission_id),
            running="a Ray Job already running",
            example="entrypoint: [python, train_ray.py]",
        )
        if self.submission_id is not None and self.address is None:
            raise refuse(
                "submissionId needs the cluster it runs on",
                "address: the head's host:port, together with submissionId",
                "e.g. address: 127.0.0.1:6379",
                key=("submissionId",),
                got=self.submission_id,
            )
        return self

    def launched_with(self) -> tuple[tuple[str, ...], Mapping[str, str]]:
        return tuple(self.entrypoint or ()), dict(self.env)

    def check_failure(self, failure: InjectFailure) -> None:
        if failure.type != "StorageFault" or (self.address is None and self.entrypoint):
            return
        key = "address" if self.address is not None else "submissionId"
        raise refuse(
            f"StorageFault on ray covers the run's storage_path as this machine sees it, so "
            f"the drill launches the driver and its ray.init() starts the cluster here; with "
            f"{key} the workers may run on other machines, which a mount made here misses",
            "StorageFault with entrypoint and no address",
            f"remove {key} and give the entrypoint ({docs_link('ray.md')})",
            key=("type",),
            got=failure.type,
        )

    def storage_scope(self) -> tuple[Path, ...] | None:
        """Where a StorageFault may point: the working folder and the folders the
        entrypoint and environment name (the ``storage_path`` it passes, ``--storage=…``);
        None for a running Ray Job (refused by :meth:`check_failure`)."""
        if not self.entrypoint:
            return None
        words = [(self.workdir, w) for w in (*self.entrypoint, *self.env.values())]
        return tuple(dict.fromkeys([self.workdir, *named_folders(words)]))


def _create(workload: RayWorkload, failure: InjectFailure, clock: Clock) -> RayOrchestrator:
    from pytest_recoverygate.orchestrators.ray.orchestrator import RayOrchestrator

    env = dict(workload.env)
    if workload.reporting_rank:
        env.setdefault("RECOVERYGATE_RANKS", str(workload.reporting_rank))  # the reporter's filter
    return RayOrchestrator(
        JobLaunch(workload.entrypoint or [], workload.workdir, env),
        address=workload.address,
        submission_id=workload.submission_id,
        target_rank=failure.rank_for(workload.reporting_rank),
        clock=clock,
    )


BACKEND: Backend[RayWorkload] = Backend(
    name="ray",
    workload=RayWorkload,
    create=_create,
    faults=frozenset(FAULT_TYPES),
    summary="a Ray Train job (TorchTrainer) the drill launches, or a running Ray Job",
)


def __getattr__(name: str) -> Any:
    if name == "RayOrchestrator":  # imported on first use
        from pytest_recoverygate.orchestrators.ray.orchestrator import RayOrchestrator

        return RayOrchestrator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
