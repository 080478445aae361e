"""The SLURM backend: a running SLURM job, three recovery layouts (docs/slurm.md).

- :mod:`.parsing`: what the Slurm clients and the node scripts print, read (pure);
- :mod:`.commands`: running the clients (timeouts, retries, destructive commands once);
- :mod:`.events`: the job's output file tailed into training events;
- :mod:`.storage`: StorageFault's scope, read from the running job (the folders it
  uses, and whether the target rank sees a mount made by the drill);
- :mod:`.submit`: a job the drill submits itself (``workload.script``) with the drill's
  environment (a StickyFault's poison), cancelled at cleanup, swept after a dead drill;
- :mod:`.orchestrator`: :class:`SlurmOrchestrator`, the drill's four methods.

This module is the backend's registry entry (:data:`BACKEND`) and its ``workload``
section (:class:`SlurmWorkload`): a running job by ``jobId`` or ``jobName``, or a batch
script the drill submits (``script``, ``sbatchArgs``, ``workdir``, ``env``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import field_validator, model_validator

from pytest_recoverygate.config.fields import (
    check_target_replica,
    distinct_items,
    env_names,
    option,
)
from pytest_recoverygate.config.schema import (
    MAX_RANK,
    IdNumber,
    InjectFailure,
    Section,
    WorkloadBase,
    duration,
    file_path,
    id_option,
    refuse,
)
from pytest_recoverygate.registry.seams import Backend

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.slurm.orchestrator import SlurmOrchestrator
    from pytest_recoverygate.orchestrators.slurm.submit import Submission
    from pytest_recoverygate.registry.seams import Clock

__all__ = ["BACKEND", "FAULT_TYPES", "SlurmOrchestrator", "SlurmReplica", "SlurmWorkload"]

MAX_SLURM_JOB_ID = 2**32 - 1
#: What this backend can inject: a signal to one rank through a kill step on its node
#: (SIGKILL, SIGKILL mid-save, SIGTERM then SIGKILL, SIGSTOP), the whole step, or a
#: requeue of the job, or every process of the job's step on one node (KillNode, with
#: ``drain_node`` also the node DRAIN); or its checkpoint folder, covered by a storage
#: layer once discovery showed the job's folders (StorageFault: :mod:`.storage`); a
#: second SIGKILL of the target's replacement inside its recovery (KillDuringRecovery);
#: a failure that comes back (StickyFault: a poisoned step in a job the drill submits,
#: or the trigger checkpoint's files damaged in a folder the job shows, then a SIGKILL)
#: (docs/slurm.md, "What each fault does").
FAULT_TYPES = (
    "KillWorker",
    "KillDuringCheckpoint",
    "Preempt",
    "HangWorker",
    "KillStep",
    "Requeue",
    "KillNode",
    "StorageFault",
    "KillDuringRecovery",
    "StickyFault",
)
#: sbatch options the drill sets itself on a job it submits (``sbatchArgs`` may not):
#: the environment it passes, the mark it finds the job by, one job and a script.
_DRILL_SBATCH_OPTIONS = {
    "--export": "the drill passes its environment with --export=ALL: set variables in workload.env",
    "--comment": "the drill marks the job it submits with --comment (cleanup and the sweep "
    "find it by that mark)",
    "--wrap": "the drill submits workload.script: remove --wrap",
    "--array": "the drill drills one job: remove --array",
    "-a": "the drill drills one job: remove -a (--array)",
}

#: A targetReplica without workload.replicas: why the drill needs them, how to add them.
_REPLICAS_NEEDED = (
    "needs workload.replicas on slurm: the drill finds a replica group by the name of its job step",
    "add replicas: [{replica: 0, step: replica-0}, {replica: 1, step: replica-1}] (each "
    "replica group's srun --job-name)",
)


class SlurmReplica(Section):
    """One replica group of a torchft job (``workload.replicas``, recovery: live): the
    job step its ``srun --job-name`` names (docs/torchft.md)."""

    replica: int = option(
        ..., "a whole number >= 0 (its REPLICA_GROUP_ID)", "replica: 1", ge=0, le=MAX_RANK
    )
    step: str = option(
        ...,
        "the name of this replica group's job step (srun --job-name), no blanks",
        "step: replica-1",
        min_length=1,
        max_length=200,
        pattern=r"^[^\s]+$",
    )


class SlurmWorkload(WorkloadBase):
    """One SLURM job, by id or by name (+ user); with ``replicas``, one job step per
    replica group of a torchft job."""

    orchestrator: Literal["slurm"] = option(..., "slurm", "orchestrator: slurm")
    job_id: IdNumber = id_option("a SLURM job id", "jobId", 12345, MAX_SLURM_JOB_ID)
    job_name: str | None = option(None, "a SLURM job name", "jobName: llama-ft", min_length=1)
    user: str | None = option(None, "a user name", "user: alice", min_length=1)
    partition: str | None = option(None, "a partition name", "partition: gpu", min_length=1)
    output: Annotated[Path | None, file_path()] = option(
        None, "the job's stdout file (SLURM patterns like %j allowed)", "output: slurm-%j.out"
    )
    poll_interval: Annotated[float, duration(0.1, 60.0)] = option(
        1.0, "a duration from 100ms to 1m", "pollInterval: 1s"
    )
    replicas: list[SlurmReplica] | None = option(
        None,
        "a list of {replica, step}: the job step of each replica group (recovery: live)",
        "replicas: [{replica: 0, step: replica-0}, {replica: 1, step: replica-1}]",
    )
    script: Annotated[Path | None, file_path()] = option(
        None,
        "a batch script the drill submits with sbatch (relative to the config file's "
        "folder) and cancels at cleanup",
        "script: torchrun-in-step.sbatch",
    )
    sbatch_args: list[str] = option(
        ...,
        "a list of sbatch options put before the script (with script), e.g. --job-name",
        'sbatchArgs: ["--job-name=rg-drill", "--output=%x-%j.out"]',
        default_factory=list,
    )
    workdir: Annotated[Path | None, file_path(must_be_dir=True)] = option(
        None,
        "an existing folder sbatch runs in, the job's SLURM_SUBMIT_DIR (with script; "
        "default: the config file's folder)",
        "workdir: .",
    )
    env: dict[str, str] | None = option(
        None,
        "a mapping of names to text values the submitted job gets on top of the drill's "
        "environment (with script)",
        'env: {MAX_RESTARTS: "2"}',
    )

    @model_validator(mode="before")
    @classmethod
    def _submitted_env(cls, data: Any) -> Any:
        """A job the drill submits has an environment the drill adds to (its evidence
        patterns, a StickyFault's poison), even when the config gives none."""
        if isinstance(data, Mapping) and data.get("script") is not None and "env" not in data:
            return {**data, "env": {}}
        return data

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str] | None) -> dict[str, str] | None:
        return None if env is None else env_names(env, "MAX_RESTARTS")

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, args: list[str]) -> list[str]:
        for index, arg in enumerate(args):
            name = arg.split("=", 1)[0]
            why = _DRILL_SBATCH_OPTIONS.get(name)
            if why is not None:
                raise refuse(
                    f"is an option the drill sets itself: {why}",
                    "sbatch options other than " + ", ".join(_DRILL_SBATCH_OPTIONS),
                    key=(str(index),),
                    got=arg,
                )
        return args

    @model_validator(mode="after")
    def _one_job(self) -> SlurmWorkload:
        given = {
            key: str(value)
            for key, value in (
                ("jobId", self.job_id),
                ("jobName", self.job_name),
                ("script", self.script),
            )
            if value is not None
        }
        if not given:
            raise refuse(
                "required key is missing",
                "jobId or jobName (a running job), or script (a job the drill submits)",
                "e.g. jobId: 12345",
                key=("jobId",),
                got="nothing",
            )
        if len(given) > 1:
            last = list(given)[-1]
            raise refuse(
                f"{' and '.join(given)} cannot both be set",
                "exactly one of jobId / jobName (a running job) / script (a job the drill submits)",
                "keep the one that names the job",
                key=(last,),
                got=given[last],
            )
        if self.user is not None and self.job_name is None:
            raise refuse(
                "user only applies with jobName",
                "user together with jobName",
                "remove user: a job id is unique",
                key=("user",),
                got=self.user,
            )
        self._submit_keys()
        if self.replicas is not None:
            _distinct_replicas(self.replicas)
        return self

    def _submit_keys(self) -> None:
        """``sbatchArgs``, ``workdir`` and ``env`` belong to ``script``; ``partition`` to
        ``jobName`` (with ``script``, sbatch's ``--partition`` says it)."""
        if self.script is not None:
            if self.partition is not None:
                raise refuse(
                    "partition picks a running job by name; with script it does not apply",
                    "partition together with jobName",
                    'put it in sbatchArgs: ["--partition=gpu"]',
                    key=("partition",),
                    got=self.partition,
                )
            if not self.script.is_file():
                raise refuse(
                    f"is not a file: {self.script}",
                    "an existing batch script, relative to the config file's folder",
                    key=("script",),
                )
            return
        for key, given in (
            ("sbatchArgs", bool(self.sbatch_args)),
            ("workdir", self.workdir is not None),
            ("env", self.env is not None),
        ):
            if given:
                raise refuse(
                    "only applies with script: the drill passes nothing to a job it did not submit",
                    f"{key} together with script",
                    f"remove {key}, or give the batch script the drill submits",
                    key=(key,),
                )

    def replica_ids(self) -> list[int]:
        """The replica groups ``replicas`` declares (empty without it)."""
        return sorted(item.replica for item in self.replicas or [])

    def check_failure(self, failure: InjectFailure) -> None:
        if failure.type == "StickyFault" and failure.scope == "step" and self.script is None:
            key = "jobId" if self.job_id is not None else "jobName"
            raise refuse(
                "StickyFault scope: step poisons the step through the job's environment "
                "(RECOVERYGATE_POISON, read by the reporter as each process starts), and the "
                f"environment of a running job ({key}) cannot be changed",
                "scope: step with script (the drill submits the job with the poison in its "
                "environment)",
                "give the batch script as workload.script (sbatch options in sbatchArgs) "
                f"instead of {key}",
                key=("scope",),
                got="step",
            )
        if self.replicas is not None and failure.type not in ("KillWorker", "KillStep"):
            raise refuse(
                "with workload.replicas the drill kills one rank (KillWorker) or the whole "
                "job step (KillStep) of the target replica group",
                "type: KillWorker or KillStep with workload.replicas",
                "use type: KillWorker, or remove replicas",
                key=("type",),
                got=failure.type,
            )
        known = self.replica_ids() if self.replicas is not None else None
        check_target_replica(failure.target_replica, known, *_REPLICAS_NEEDED)

    def launched_with(self) -> tuple[tuple[str, ...], Mapping[str, str]]:
        if self.script is None:
            return (), {}
        return ("sbatch", *self.sbatch_args, str(self.script)), dict(self.env or {})

    def submission(self) -> Submission | None:
        """What the drill submits (``script``), or None for a running job."""
        if self.script is None:
            return None
        from pytest_recoverygate.orchestrators.slurm.submit import Submission

        workdir = self.workdir if self.workdir is not None else self.script.parent
        return Submission(self.script, tuple(self.sbatch_args), workdir, dict(self.env or {}))

    def step_of(self, replica: int | None) -> str | None:
        """The job step name of ``replica`` (None without ``replicas``)."""
        for item in self.replicas or []:
            if item.replica == replica:
                return item.step
        return None


def _distinct_replicas(items: list[SlurmReplica]) -> None:
    if not items:
        raise refuse(
            "needs at least one replica group", "a list of {replica, step}", key=("replicas",)
        )
    for field_name in ("replica", "step"):
        distinct_items(items, field_name)


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
        step_name=workload.step_of(failure.target_replica),
        submission=workload.submission(),
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
    failure_keys=frozenset({"drainNode", "targetReplica"}),
    summary="a running SLURM job, three recovery layouts",
)


def __getattr__(name: str) -> Any:
    if name == "SlurmOrchestrator":  # imported on first use: it pulls in subprocess & co.
        from pytest_recoverygate.orchestrators.slurm.orchestrator import SlurmOrchestrator

        return SlurmOrchestrator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
