"""SlurmOrchestrator against the real one-node cluster (marker ``slurm``).

We test these aspects:
- discovery: every rank of the training step, with pid + start time as identity; by id
  and by name; clear errors for an unknown job, missing clients, a missing SLURM_CONF
  and an unreachable controller;
- the kill: exactly one rank dies (the other task keeps running), a second kill of the
  same instance touches nothing, a dry run touches nothing;
- the watch: each recovery path (torchrun restarting its workers inside the step, a new
  step in the same allocation, a requeue) and a job that ends instead of recovering;
- the output tail: events come from the job's StdOut file and start over when a requeue
  truncates it.

The jobs are small on purpose (``sleep``, torchrun with ``--no-python sleep``): the
orchestrator sees processes, steps and job states, not training. Drills with the real
training script are in test_slurm_drills.py.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    TrainingEvent,
    TrainingEventKind,
)
from pytest_recoverygate.orchestrators.base import RealClock
from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator
from pytest_recoverygate.orchestrators.slurm.parsing import parse_listpids
from tests.slurm.slurm_testcluster import SlurmCluster

pytestmark = pytest.mark.slurm

TWO_TASKS = "#!/bin/bash\nsrun --overcommit -n2 sleep 600\n"
TORCHRUN = (
    "#!/bin/bash\n"
    "srun -n1 torchrun --standalone --nproc-per-node=2 --max-restarts=2 --monitor-interval=0.2 "
    "--no-python sleep 600\n"
)
SRUN_LOOP = (
    "#!/bin/bash\n"
    "for attempt in 1 2 3; do\n"
    "  srun --overcommit --kill-on-bad-exit=1 -n2 sleep 600 && break\n"
    "done\n"
)
REPORTING = (
    "#!/bin/bash\n"
    "python3 -c 'from recoverygate import reporter; reporter.checkpoint_completed(10)'\n"
    "srun --overcommit -n2 sleep 600\n"
)


def make(slurm: SlurmCluster, job_id: str, **kwargs: object) -> SlurmOrchestrator:
    return SlurmOrchestrator(
        job_id=job_id,
        clock=RealClock(),
        env=slurm.env,
        poll_interval=0.5,
        **kwargs,  # type: ignore[arg-type]
    )


def wait_for_group(
    orch: SlurmOrchestrator,
    done: Callable[[list[GroupEvent]], bool],
    timeout: float = 60,
) -> list[GroupEvent]:
    seen: list[GroupEvent] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen += orch.watch_group()
        if done(seen):
            return seen
        time.sleep(0.1)
    raise AssertionError(
        f"timed out; group events so far: {[(e.kind.value, e.detail) for e in seen]}"
    )


def kinds(events: list[GroupEvent]) -> list[GroupEventKind]:
    return [e.kind for e in events]


def has(kind: GroupEventKind) -> Callable[[list[GroupEvent]], bool]:
    return lambda events: kind in kinds(events)


def task_pids(slurm: SlurmCluster, job_id: str) -> dict[int, int]:
    """Task id -> pid of the job's numbered steps, read with scontrol listpids."""
    out = slurm.run("scontrol", "listpids", job_id, check=False)
    return {
        r.global_id: r.pid
        for r in parse_listpids(out)
        if r.global_id is not None and r.step.isdigit()
    }


def test_it_discovers_every_rank_of_a_two_task_step(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", "-J", "rg-two", workdir=tmp_path)
    orch = make(slurm, job)
    try:
        workload = orch.discover(time.time() + 60)
    finally:
        orch.cleanup()
    assert [w.rank for w in workload.workers] == [0, 1]
    pids = task_pids(slurm, job)
    for worker in workload.workers:
        details = dict(worker.details)
        assert worker.node == "localhost"
        assert int(details["pid"]) == pids[worker.rank]
        assert worker.instance_id == f"{job}.0/{details['pid']}@{details['start']}"


def test_it_finds_the_job_by_name_and_refuses_an_ambiguous_name(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", "-J", "rg-by-name", workdir=tmp_path)
    orch = SlurmOrchestrator(job_name="rg-by-name", user="root", clock=RealClock(), env=slurm.env)
    try:
        assert orch.discover(time.time() + 60).job.startswith(f"slurm job {job} ")
    finally:
        orch.cleanup()
    slurm.submit(TWO_TASKS, "-n2", "--overcommit", "-J", "rg-by-name", workdir=tmp_path)
    twice = SlurmOrchestrator(job_name="rg-by-name", clock=RealClock(), env=slurm.env)
    with pytest.raises(DiscoveryError, match="2 Slurm jobs match name 'rg-by-name'"):
        twice.discover(time.time() + 10)


def test_it_kills_exactly_one_rank_and_the_other_keeps_running(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", workdir=tmp_path)
    orch = make(slurm, job)
    try:
        workload = orch.discover(time.time() + 60)
        target = workload.by_rank(1)
        assert target is not None
        before = task_pids(slurm, job)
        result = orch.kill(target, dry_run=False)
        assert result.outcome is KillOutcome.KILLED, result.detail
        events = wait_for_group(orch, has(GroupEventKind.WORKER_GONE))
        assert events[0].worker == target
        after = task_pids(slurm, job)
        assert after.get(0) == before[0], "rank 0 must keep running"
        assert 1 not in after
        again = orch.kill(target, dry_run=False)
        assert again.outcome is KillOutcome.ALREADY_GONE, again.detail
    finally:
        orch.cleanup()


def test_a_dry_run_kill_touches_nothing(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", workdir=tmp_path)
    orch = make(slurm, job)
    try:
        target = orch.discover(time.time() + 60).by_rank(1)
        assert target is not None
        before = task_pids(slurm, job)
        result = orch.kill(target, dry_run=True)
        assert result.outcome is KillOutcome.DRY_RUN, result.detail
        time.sleep(1)
        assert task_pids(slurm, job) == before
    finally:
        orch.cleanup()


def test_it_sees_torchrun_restart_the_workers_inside_the_step(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(TORCHRUN, "-n1", "-c2", workdir=tmp_path)
    orch = make(slurm, job)
    try:
        workload = orch.discover(time.time() + 90)
        assert [w.rank for w in workload.workers] == [0, 1]
        target = workload.by_rank(1)
        assert target is not None
        assert orch.kill(target, dry_run=False).outcome is KillOutcome.KILLED
        events = wait_for_group(orch, has(GroupEventKind.REPLACEMENT_RUNNING), timeout=90)
    finally:
        orch.cleanup()
    assert kinds(events)[:3] == [
        GroupEventKind.WORKER_GONE,
        GroupEventKind.RESTARTING,
        GroupEventKind.REPLACEMENT_RUNNING,
    ]
    assert "torchrun restarted the workers inside step" in events[1].detail
    replacement = events[2].worker
    assert replacement is not None
    assert replacement.rank == 1
    assert replacement.instance_id != target.instance_id
    assert replacement.instance_id.startswith(f"{job}.0/")


def test_it_sees_a_new_step_in_the_same_allocation(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.submit(SRUN_LOOP, "-n2", "--overcommit", workdir=tmp_path)
    orch = make(slurm, job)
    try:
        target = orch.discover(time.time() + 60).by_rank(1)
        assert target is not None
        assert orch.kill(target, dry_run=False).outcome is KillOutcome.KILLED
        events = wait_for_group(orch, has(GroupEventKind.REPLACEMENT_RUNNING))
    finally:
        orch.cleanup()
    restarting = next(e for e in events if e.kind is GroupEventKind.RESTARTING)
    assert "new step" in restarting.detail
    replacement = events[-1].worker
    assert replacement is not None
    assert replacement.rank == 1
    assert dict(replacement.details)["step"] != dict(target.details)["step"]


def test_it_sees_a_requeue_and_the_tail_starts_over(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.submit(REPORTING, "-n2", "--overcommit", "--requeue", workdir=tmp_path)
    orch = make(slurm, job, fault="Requeue")
    try:
        target = orch.discover(time.time() + 60).by_rank(1)
        assert target is not None
        source = orch.events()
        first = wait_for_events(source.poll, TrainingEventKind.CHECKPOINT_COMPLETED, 1)
        result = orch.kill(target, dry_run=False)
        assert result.outcome is KillOutcome.KILLED, result.detail
        events = wait_for_group(orch, has(GroupEventKind.REPLACEMENT_RUNNING), timeout=90)
        second = wait_for_events(source.poll, TrainingEventKind.CHECKPOINT_COMPLETED, 1)
    finally:
        orch.cleanup()
    assert kinds(events) == [
        GroupEventKind.WORKER_GONE,
        GroupEventKind.RESTARTING,
        GroupEventKind.REPLACEMENT_PENDING,
        GroupEventKind.REPLACEMENT_RUNNING,
    ]
    assert events[1].restart_count == 1
    assert first[0].incarnation != second[0].incarnation


def wait_for_events(
    poll: Callable[[], list[TrainingEvent]],
    kind: TrainingEventKind,
    count: int,
    timeout: float = 60,
) -> list[TrainingEvent]:
    got: list[TrainingEvent] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got += [e for e in poll() if e.kind is kind]
        if len(got) >= count:
            return got
        time.sleep(0.1)
    raise AssertionError(f"saw {len(got)} {kind.value} events, wanted {count}")


def test_it_reports_a_job_that_ends_instead_of_recovering(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", workdir=tmp_path)
    orch = make(slurm, job, fault="KillStep")
    try:
        target = orch.discover(time.time() + 60).by_rank(1)
        assert target is not None
        result = orch.kill(target, dry_run=False)
        assert result.outcome is KillOutcome.KILLED, result.detail
        assert result.detail == f"scancel --signal=KILL {job}.0"
        events = wait_for_group(orch, has(GroupEventKind.JOB_FAILED))
    finally:
        orch.cleanup()
    assert f"job {job} ended: state FAILED" in events[-1].detail


def test_a_requeue_drill_refuses_a_job_that_cannot_be_requeued(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", "--no-requeue", workdir=tmp_path)
    orch = make(slurm, job, fault="Requeue")
    with pytest.raises(DiscoveryError, match="cannot be requeued .* submit it with --requeue"):
        orch.discover(time.time() + 60)


def test_it_refuses_an_unknown_job_clearly(slurm: SlurmCluster) -> None:
    orch = make(slurm, "999999")
    with pytest.raises(DiscoveryError, match="Slurm job 999999 does not exist"):
        orch.discover(time.time() + 5)


def test_it_says_what_to_do_when_the_clients_are_missing(slurm: SlurmCluster) -> None:
    env = {**slurm.env, "PATH": "/nonexistent"}
    orch = SlurmOrchestrator(job_id=1, clock=RealClock(), env=env)
    with pytest.raises(BackendError, match="'squeue' is not on PATH"):
        orch.discover(time.time() + 5)


def test_it_says_what_to_do_without_a_slurm_conf(slurm: SlurmCluster, tmp_path: Path) -> None:
    orch = SlurmOrchestrator(
        job_id=1, clock=RealClock(), env=slurm.env, slurm_conf=str(tmp_path / "nope.conf")
    )
    with pytest.raises(BackendError, match=r"SLURM_CONF=.*nope.conf does not exist"):
        orch.discover(time.time() + 5)


def test_an_unreachable_controller_is_a_clear_error_after_retries(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    conf = Path(slurm.conf).read_text()
    port = next(
        line.split("=")[1] for line in conf.splitlines() if line.startswith("SlurmctldPort=")
    )
    dead = tmp_path / "slurm.conf"
    # Nothing listens on port 1; MessageTimeout=2 keeps each client's own retries short.
    dead.write_text(
        conf.replace(f"SlurmctldPort={port}", "SlurmctldPort=1").replace(
            "MessageTimeout=10", "MessageTimeout=2"
        )
    )
    orch = SlurmOrchestrator(job_id=1, clock=RealClock(), env=slurm.env, slurm_conf=str(dead))
    orch.commands.retry = dataclasses.replace(orch.commands.retry, attempts=2)
    started = time.monotonic()
    with pytest.raises(BackendError, match="kept failing after 2 attempts"):
        orch.discover(time.time() + 5)
    assert time.monotonic() - started < 60
