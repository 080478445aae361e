"""Which ranks a Slurm job runs: its running training step, each rank's worker as the probe
step reads it on every node of that step, and discovery's wait until all of them run."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.orchestrators.slurm.commands import JobGone, SlurmCommands
from pytest_recoverygate.orchestrators.slurm.parsing import (
    FINAL_STATES,
    PROBE_SCRIPT,
    PROBE_STEP_NAME,
    JobInfo,
    ProcessRow,
    StepInfo,
    assign_ranks,
    parse_probe_output,
)
from pytest_recoverygate.registry.seams import Clock

__all__ = [
    "INSTANCE_ID",
    "JobSnapshot",
    "running_snapshot",
    "snapshot_workers",
    "training_steps",
    "wait_for_ranks",
    "worker_of",
]

#: A worker's identity as discovery issues it: ``job.step/pid@start``.
INSTANCE_ID = re.compile(r"(?P<job>[^./@]+)\.(?P<step>[^/@]+)/(?P<pid>\d+)@(?P<start>\d+)")


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """The ranks of the job's running training step, as read once."""

    job: JobInfo
    step: str  # the training step the workers were found in
    workers: dict[int, model.Worker]
    expected: int  # world size (WORLD_SIZE of the workers, else the step's task count)

    @property
    def complete(self) -> bool:
        return len(self.workers) >= self.expected


def training_steps(commands: SlurmCommands, job_id: str, step_name: str | None) -> list[StepInfo]:
    """The job's running training steps (only the one named ``step_name``, if given)."""
    return [
        s
        for s in commands.show_steps(job_id)
        if s.is_training and s.state == "RUNNING" and (step_name is None or s.name == step_name)
    ]


def snapshot_workers(
    commands: SlurmCommands, job: JobInfo, step_name: str | None
) -> JobSnapshot | None:
    """The ranks of the job's running training step, read on every node of the step."""
    steps = training_steps(commands, job.job_id, step_name)
    if not steps:
        return None
    if len(steps) > 1:
        names = ", ".join(f"{job.job_id}.{s.step} ({s.name})" for s in steps)
        if step_name is not None:
            raise DiscoveryError(
                f"job {job.job_id} runs several steps named {step_name!r} at once "
                f"({names}); give each replica group's srun a --job-name of its own"
            )
        raise DiscoveryError(
            f"job {job.job_id} runs several steps at once ({names}); RecoveryGate drills a job "
            "with one training step (or, with recovery: live, one step per replica group: "
            "workload.replicas)"
        )
    step = steps[0]
    rows: list[ProcessRow] = []
    for node in commands.hostnames(step.nodes or job.nodes):
        try:
            out = commands.srun_on_node(job.job_id, node, PROBE_STEP_NAME, PROBE_SCRIPT, job.job_id)
        except (JobGone, BackendError):
            return None  # the step or job ended while we looked; try again later
        found = parse_probe_output(out, node)
        if found is None:
            return None
        rows += [r for r in found if r.step == step.step]
    ranks = assign_ranks(rows)
    workers = {rank: worker_of(job, step.step, row, rank) for rank, row in ranks.items()}
    sizes = [r.world_size for r in ranks.values() if r.world_size is not None]
    expected = max(sizes) if sizes else step.tasks
    return JobSnapshot(job=job, step=step.step, workers=workers, expected=expected)


def worker_of(job: JobInfo, step: str, row: ProcessRow, rank: int) -> model.Worker:
    """The worker of ``rank``: its identity is ``job.step/pid@start`` (:data:`INSTANCE_ID`)."""
    details: tuple[tuple[str, str], ...] = (
        ("job", job.job_id),
        ("step", step),
        ("pid", str(row.pid)),
        ("start", row.start),
        ("restarts", str(job.restarts)),
        ("comm", row.comm),
        ("user", job.user),  # the job's owner, in the report's target
    )
    if row.restart_count is not None:
        details += (("torchelastic_restart_count", str(row.restart_count)),)
    return model.Worker(
        rank=rank,
        name=f"{job.job_id}.{step} rank {rank}",
        instance_id=f"{job.job_id}.{step}/{row.pid}@{row.start}",
        node=row.node,
        details=details,
    )


def running_snapshot(
    commands: SlurmCommands, job_id: str, step_name: str | None
) -> JobSnapshot | None:
    """The job's running training step now; None when it is not running (or gone)."""
    try:
        job = commands.show_job(job_id)
        return snapshot_workers(commands, job, step_name) if job.state == "RUNNING" else None
    except (JobGone, DiscoveryError):
        return None


def wait_for_ranks(
    commands: SlurmCommands,
    clock: Clock,
    job_id: str,
    *,
    fault: str,
    step_name: str | None,
    poll_interval: float,
    deadline: float,
) -> tuple[JobInfo, JobSnapshot]:
    """The job, running, and every rank of its training step; waits until ``deadline``
    (a DiscoveryError names what was last missing), refuses a job that ended or that a
    ``Requeue`` cannot requeue."""
    last_problem = "nothing checked yet"
    while True:
        try:
            job = commands.show_job(job_id)
        except JobGone:
            raise DiscoveryError(
                f"Slurm job {job_id} does not exist (or ended more than MinJobAge ago); "
                "check the jobId with 'squeue --me'"
            ) from None
        if job.state in FINAL_STATES:
            raise DiscoveryError(f"Slurm job {job_id} is not running: {job.describe_end()}")
        if fault == "Requeue" and not job.requeue:
            raise DiscoveryError(
                f"Slurm job {job_id} cannot be requeued (Requeue=0, submitted with "
                "--no-requeue or JobRequeue=0); submit it with --requeue, or drill it "
                "with type: KillWorker"
            )
        if job.state == "RUNNING":
            snapshot = snapshot_workers(commands, job, step_name)
            if snapshot is not None and snapshot.workers and snapshot.complete:
                return job, snapshot
            if snapshot is None:
                named = f" named {step_name!r}" if step_name is not None else ""
                last_problem = f"job {job_id} is running but has no training step{named} yet"
            else:
                last_problem = (
                    f"step {job_id}.{snapshot.step} shows {len(snapshot.workers)} of "
                    f"{snapshot.expected} ranks (ranks {sorted(snapshot.workers)})"
                )
        else:
            last_problem = f"job {job_id} is {job.state} (reason {job.reason})"
        if clock.now() >= deadline:
            raise DiscoveryError(f"gave up waiting for the workload: {last_problem}")
        clock.wait(min(poll_interval, max(deadline - clock.now(), 0.0)))
