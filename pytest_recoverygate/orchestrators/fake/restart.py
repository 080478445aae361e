"""What follows a kill in the simulated job: what the ranks print, the group events it
foresees, and the next incarnation by ``resume`` (or the crash loop on a torn
checkpoint, or none once the restarts run out)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_recoverygate.engine.model import GroupEvent, GroupEventKind, Worker
from pytest_recoverygate.orchestrators.fake.job import Incarnation
from pytest_recoverygate.orchestrators.fake.lines import print_rank

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.fake.orchestrator import FakeOrchestrator

__all__ = ["after_kill", "start_incarnation"]


def start_incarnation(job: FakeOrchestrator, at: float, resume_step: int) -> None:
    """The group starts again at ``at``, resuming after ``resume_step``."""
    load = 0.05 if resume_step > 0 else 0.0
    job._incarnations.append(
        Incarnation(
            number=len(job._incarnations),
            start=at,
            resume_step=resume_step,
            first_step_at=at + job.startup_delay + load,
            next_step=resume_step + 1,
            ranks=job.workers,
        )
    )


def after_kill(
    job: FakeOrchestrator,
    now: float,
    worker: Worker,
    how: str = "was killed by SIGKILL",
    *,
    gone: bool = True,
) -> None:
    """``worker`` ended at ``now`` (``how``; ``gone``: its process exited): what the ranks
    print, the group events that follow, and the restart ``resume`` and the budget allow."""
    print_rank(job, worker.rank, f"[fake job] rank {worker.rank} ({worker.instance_id}) {how}\n")
    for label, text in job.output.items():
        job._printed.feed(text.encode("utf-8", "replace"), label=label)
    restart_at = now + job.restart_delay
    if gone:
        job._group_events += [
            GroupEvent(GroupEventKind.WORKER_GONE, now + 0.1, f"{worker.name} exited", worker),
            GroupEvent(GroupEventKind.RESTARTING, now + 0.15, "restarting the group", None, 1),
        ]
    if job.resume == "never":
        for rank in range(job.workers):
            print_rank(job, rank, "[fake job] the group does not restart (resume: never)\n")
        return
    job._restarts += 1
    if job.max_restarts is not None and job._restarts > job.max_restarts:
        job._group_events.append(
            GroupEvent(
                GroupEventKind.JOB_FAILED,
                now + 0.2,
                f"max restarts ({job.max_restarts}) exhausted",
            )
        )
        return
    job._group_events.append(
        GroupEvent(
            GroupEventKind.REPLACEMENT_RUNNING,
            restart_at,
            "all ranks running",
            world_size=job.workers,
        )
    )
    done = job._checkpoints
    if job._torn is not None:  # it loads the partial file and crashes, again and again
        start_incarnation(job, restart_at, resume_step=job._torn)
        job._incarnations[-1].crashes_at = restart_at + 0.5
        _restart_crash_loop(job, restart_at + 0.5, worker)
        return
    if job.resume in ("latest", "fresh-optimizer"):
        step = done[-1] if done else 0
    elif job.resume == "older":
        step = done[-2] if len(done) >= 2 else 0
    else:
        step = 0
    start_incarnation(job, restart_at, resume_step=step)


def _restart_crash_loop(job: FakeOrchestrator, at: float, worker: Worker) -> None:
    """Each restart dies loading the torn checkpoint, until the restarts run out."""
    while job.max_restarts is None or job._restarts < job.max_restarts:
        job._restarts += 1
        job._group_events.append(
            GroupEvent(
                GroupEventKind.RESTARTING,
                at + 0.05,
                "restarting the group",
                None,
                job._restarts,
            )
        )
        at += job.restart_delay + 0.5
        if job._restarts > 20:
            break
    print_rank(
        job,
        worker.rank,
        "[fake job] torch.load: PytorchStreamReader failed reading "
        "zip archive: failed finding central directory\n",
    )
    job._group_events.append(
        GroupEvent(
            GroupEventKind.JOB_FAILED,
            at,
            "the job failed: every restart crashed loading a truncated checkpoint",
        )
    )
