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
  truncates it;
- the faults that signal one rank: the kill step's signal argument (KILL, TERM, STOP,
  CONT; anything else refused; a replaced start time never signalled), a Preempt's
  SIGKILL after the grace period reaching that same instance only (a recycled pid is
  never hit), cleanup stopping the escalation and SIGCONTing a HangWorker's victim, and
  ``current_worker`` never handing back an instance already hit.

The kill script and the escalation run on this machine through ``ThisMachine`` (the
orchestrator's commands with the kill step run by ``sh`` here instead of ``srun`` on a
node), with real processes: no cluster needed.

The jobs are small on purpose (``sleep``, torchrun with ``--no-python sleep``): the
orchestrator sees processes, steps and job states, not training. Drills with the real
training script are in test_slurm_drills.py.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_recoverygate.engine.model import (
    Fault,
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    TrainingEvent,
    TrainingEventKind,
    Worker,
)
from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator
from pytest_recoverygate.orchestrators.slurm.commands import SlurmCommands
from pytest_recoverygate.orchestrators.slurm.parsing import KILL_SCRIPT, parse_listpids
from pytest_recoverygate.registry.seams import RealClock
from tests.patience import JOB, PROCESS, PROMPT, QUIET, deadline, eventually, gather, stays, within
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


def kinds(events: list[GroupEvent]) -> list[GroupEventKind]:
    return [e.kind for e in events]


def has(kind: GroupEventKind) -> Callable[[list[GroupEvent]], bool]:
    return lambda events: kind in kinds(events)


def task_pids(slurm: SlurmCluster, job_id: str, step: str | None = None) -> dict[int, int]:
    """Task id -> pid of the job's numbered steps (or of ``step`` only: the probe and kill
    steps are numbered steps too), read with scontrol listpids."""
    out = slurm.listpids(job_id)
    return {
        r.global_id: r.pid
        for r in parse_listpids(out)
        if r.global_id is not None and r.step.isdigit() and step in (None, r.step)
    }


def test_it_discovers_every_rank_of_a_two_task_step(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", "-J", "rg-two", workdir=tmp_path)
    orch = make(slurm, job)
    try:
        workload = orch.discover(deadline(JOB))
    finally:
        orch.cleanup()
    assert [w.rank for w in workload.workers] == [0, 1]
    pids = task_pids(slurm, job)
    for worker in workload.workers:
        details = dict(worker.details)
        assert worker.node in slurm.nodes
        assert int(details["pid"]) == pids[worker.rank]
        assert worker.instance_id == f"{job}.0/{details['pid']}@{details['start']}"


def test_it_finds_the_job_by_name_and_refuses_an_ambiguous_name(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", "-J", "rg-by-name", workdir=tmp_path)
    orch = SlurmOrchestrator(job_name="rg-by-name", user="root", clock=RealClock(), env=slurm.env)
    try:
        assert orch.discover(deadline(JOB)).job.startswith(f"slurm job {job} ")
    finally:
        orch.cleanup()
    slurm.submit(TWO_TASKS, "-n2", "--overcommit", "-J", "rg-by-name", workdir=tmp_path)
    twice = SlurmOrchestrator(job_name="rg-by-name", clock=RealClock(), env=slurm.env)
    with pytest.raises(DiscoveryError, match="2 Slurm jobs match name 'rg-by-name'"):
        twice.discover(deadline(PROCESS))


def test_it_kills_exactly_one_rank_and_the_other_keeps_running(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", workdir=tmp_path)
    orch = make(slurm, job)
    try:
        workload = orch.discover(deadline(JOB))
        target = workload.by_rank(1)
        assert target is not None
        before = task_pids(slurm, job)
        result = orch.kill(target, dry_run=False)
        assert result.outcome is KillOutcome.KILLED, result.detail
        events = gather(orch.watch_group, has(GroupEventKind.WORKER_GONE), "worker gone", JOB)
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
        target = orch.discover(deadline(JOB)).by_rank(1)
        assert target is not None
        before = task_pids(slurm, job)
        result = orch.kill(target, dry_run=True)
        assert result.outcome is KillOutcome.DRY_RUN, result.detail
        stays(lambda: task_pids(slurm, job) == before, "both ranks run", QUIET)
    finally:
        orch.cleanup()


def test_it_sees_torchrun_restart_the_workers_inside_the_step(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(TORCHRUN, "-n1", "-c2", workdir=tmp_path)
    orch = make(slurm, job)
    try:
        workload = orch.discover(deadline(JOB))
        assert [w.rank for w in workload.workers] == [0, 1]
        target = workload.by_rank(1)
        assert target is not None
        assert orch.kill(target, dry_run=False).outcome is KillOutcome.KILLED
        events = gather(
            orch.watch_group, has(GroupEventKind.REPLACEMENT_RUNNING), "replacement running", JOB
        )
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
        target = orch.discover(deadline(JOB)).by_rank(1)
        assert target is not None
        assert orch.kill(target, dry_run=False).outcome is KillOutcome.KILLED
        events = gather(
            orch.watch_group, has(GroupEventKind.REPLACEMENT_RUNNING), "replacement running", JOB
        )
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
        target = orch.discover(deadline(JOB)).by_rank(1)
        assert target is not None
        source = orch.events()
        first = gather(
            source.poll, of_kind(TrainingEventKind.CHECKPOINT_COMPLETED, 1), "a checkpoint", JOB
        )
        result = orch.kill(target, dry_run=False)
        assert result.outcome is KillOutcome.KILLED, result.detail
        events = gather(
            orch.watch_group, has(GroupEventKind.REPLACEMENT_RUNNING), "replacement running", JOB
        )
        second = gather(
            source.poll, of_kind(TrainingEventKind.CHECKPOINT_COMPLETED, 1), "a checkpoint", JOB
        )
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


def of_kind(kind: TrainingEventKind, count: int) -> Callable[[list[TrainingEvent]], bool]:
    return lambda seen: sum(e.kind is kind for e in seen) >= count


def test_it_reports_a_job_that_ends_instead_of_recovering(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", workdir=tmp_path)
    orch = make(slurm, job, fault="KillStep")
    try:
        target = orch.discover(deadline(JOB)).by_rank(1)
        assert target is not None
        result = orch.kill(target, dry_run=False)
        assert result.outcome is KillOutcome.KILLED, result.detail
        assert result.detail == f"scancel --signal=KILL {job}.0"
        events = gather(orch.watch_group, has(GroupEventKind.JOB_FAILED), "job failed", JOB)
    finally:
        orch.cleanup()
    assert f"job {job} ended: state FAILED" in events[-1].detail


def test_it_reports_a_job_that_completes_as_succeeded(slurm: SlurmCluster, tmp_path: Path) -> None:
    # A job that trains to its end: a successful end the verdict is told of (issue 31).
    job = slurm.submit(
        "#!/bin/bash\nsrun --overcommit -n2 sleep 8\n", "-n2", "--overcommit", workdir=tmp_path
    )
    orch = make(slurm, job)
    try:
        assert orch.discover(deadline(JOB)).by_rank(1) is not None
        events = gather(orch.watch_group, has(GroupEventKind.JOB_SUCCEEDED), "job succeeded", JOB)
    finally:
        orch.cleanup()
    assert f"job {job} ended: state COMPLETED" in events[-1].detail
    assert GroupEventKind.JOB_FAILED not in kinds(events)


def test_a_requeue_drill_refuses_a_job_that_cannot_be_requeued(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", "--no-requeue", workdir=tmp_path)
    orch = make(slurm, job, fault="Requeue")
    with pytest.raises(DiscoveryError, match="cannot be requeued .* submit it with --requeue"):
        orch.discover(deadline(JOB))


def test_it_refuses_an_unknown_job_clearly(slurm: SlurmCluster) -> None:
    orch = make(slurm, "999999")
    with pytest.raises(DiscoveryError, match="Slurm job 999999 does not exist"):
        orch.discover(deadline(PROMPT))


def test_it_says_what_to_do_when_the_clients_are_missing(slurm: SlurmCluster) -> None:
    env = {**slurm.env, "PATH": "/nonexistent"}
    orch = SlurmOrchestrator(job_id=1, clock=RealClock(), env=env)
    with pytest.raises(BackendError, match="'squeue' is not on PATH"):
        orch.discover(deadline(PROMPT))


def test_it_says_what_to_do_without_a_slurm_conf(slurm: SlurmCluster, tmp_path: Path) -> None:
    orch = SlurmOrchestrator(
        job_id=1, clock=RealClock(), env=slurm.env, slurm_conf=str(tmp_path / "nope.conf")
    )
    with pytest.raises(BackendError, match=r"SLURM_CONF=.*nope.conf does not exist"):
        orch.discover(deadline(PROMPT))


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
    with pytest.raises(BackendError, match="kept failing after 2 attempts"):
        orch.discover(time.time() + 5)  # not a wait: the retries end it first


def test_a_hung_rank_is_not_handed_out_again_and_cleanup_continues_it(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm.submit(TWO_TASKS, "-n2", "--overcommit", workdir=tmp_path)
    orch = make(slurm, job)
    try:
        workload = orch.discover(deadline(JOB))
        target, other = workload.by_rank(1), workload.by_rank(0)
        assert target is not None and other is not None
        result = orch.kill(target, dry_run=False, fault=Fault("HangWorker"))
        assert result.outcome is KillOutcome.KILLED, result.detail
        assert result.detail.startswith("kill -STOP rank 1"), result.detail
        pid = int(dict(target.details)["pid"])
        assert process_state(pid) == "T"
        assert orch.current_worker(1) is None  # the instance hit, still there, stopped
        assert orch.current_worker(0) == other
    finally:
        orch.cleanup()
    assert process_state(pid) in ("S", "R"), "cleanup must continue the stopped rank"


def test_a_preempt_sigkills_a_rank_that_ignores_sigterm_and_only_that_rank(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    ignores = "#!/bin/bash\nsrun --overcommit -n2 bash -c \"trap '' TERM; exec sleep 600\"\n"
    job = slurm.submit(ignores, "-n2", "--overcommit", workdir=tmp_path)
    orch = make(slurm, job)
    try:
        target = orch.discover(deadline(JOB)).by_rank(1)
        assert target is not None
        before = task_pids(slurm, job, step="0")
        grace = 3 * within(QUIET)  # well past the look below (SETTLE)
        result = orch.kill(target, dry_run=False, fault=Fault("Preempt", grace_period=grace))
        assert result.outcome is KillOutcome.KILLED, result.detail
        ignored = "SIGTERM is ignored: both ranks still run"
        stays(lambda: task_pids(slurm, job, step="0") == before, ignored)
        gather(orch.watch_group, has(GroupEventKind.WORKER_GONE), "worker gone", JOB)
        assert orch.escalations[0].startswith(f"kill -KILL {target.instance_id}: killed ")
        assert task_pids(slurm, job, step="0").get(0) == before[0], "rank 0 must keep running"
    finally:
        orch.cleanup()


# --------------------------------------------------------------------- on this machine


# ``scontrol listpids`` on this machine: the pids in $RG_LISTED as tasks of step 7.0.
FAKE_LISTPIDS = """#!/bin/sh
echo "PID      JOBID    STEPID   LOCALID GLOBALID"
for pid in $RG_LISTED; do echo "$pid 7 0 0 0"; done
"""


_FAKE_BIN: list[Path] = []


@pytest.fixture(autouse=True, scope="module")
def _fake_listpids(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("listpids")
    (folder / "scontrol").write_text(FAKE_LISTPIDS)
    (folder / "scontrol").chmod(0o755)
    _FAKE_BIN[:] = [folder]


def listing_env(pids: list[int]) -> dict[str, str]:
    """This environment with a ``scontrol`` that lists ``pids`` for step 7.0 (the kill step
    signals only a pid that listpids lists for the job's step)."""
    folder = _FAKE_BIN[0]
    return {
        **os.environ,
        "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}",
        "RG_LISTED": " ".join(map(str, pids)),
    }


class ThisMachine(SlurmCommands):
    """The kill step run here by ``sh`` instead of ``srun`` on a node; ``calls`` logs it."""

    def __init__(self, listed: list[int]) -> None:
        super().__init__(env=listing_env(listed))
        self.calls: list[tuple[str, ...]] = []

    def srun_on_node(
        self,
        job_id: str,
        node: str,
        step_name: str,
        script: str,
        *args: str,
        destructive: bool = False,
    ) -> str:
        self.calls.append(args)
        command = ["sh", "-c", script, "recoverygate", *args]
        return self.run_destructive(command) if destructive else self.run(command)


def start_ticks(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]


def process_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def kill_script(pid: int, start: str, mode: str, sig: str) -> str:
    """The kill step for pid as a task of step 7.0 (listed by a fake ``scontrol``)."""
    return subprocess.run(
        ["sh", "-c", KILL_SCRIPT, "recoverygate", "7", "0", str(pid), start, mode, sig],
        capture_output=True,
        text=True,
        check=True,
        env=listing_env([pid]),
    ).stdout.strip()


IGNORES_SIGTERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)"
)


Spawn = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start a Python process that says it is ready; every one is ended after the test."""
    procs: list[subprocess.Popen[str]] = []

    def start(
        code: str = "import time; print('ready', flush=True); time.sleep(60)",
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def on_this_machine(
    proc: subprocess.Popen[str], rank: int = 1
) -> tuple[SlurmOrchestrator, Worker, ThisMachine]:
    """An orchestrator whose kill steps run here, and ``proc`` as its worker of ``rank``."""
    orch = SlurmOrchestrator(job_id=7, clock=RealClock())
    here = orch.commands = ThisMachine([proc.pid])
    start = start_ticks(proc.pid)
    worker = Worker(
        rank=rank,
        name=f"7.0 rank {rank}",
        instance_id=f"7.0/{proc.pid}@{start}",
        node="localhost",
        details=(("job", "7"), ("step", "0"), ("pid", str(proc.pid)), ("start", start)),
    )
    return orch, worker, here


def preempt_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "recoverygate-slurm-preempt"]


@pytest.mark.parametrize(("sig", "returncode"), [("KILL", -9), ("TERM", -15)])
def test_the_kill_script_sends_the_signal_it_is_given(
    spawn: Spawn, sig: str, returncode: int
) -> None:
    proc = spawn()
    answer = kill_script(proc.pid, start_ticks(proc.pid), "kill", sig)
    assert answer.startswith("RGKILL killed ")
    assert proc.wait(timeout=within(PROMPT)) == returncode


def test_the_kill_script_stops_and_continues(spawn: Spawn) -> None:
    proc = spawn()
    start = start_ticks(proc.pid)
    assert kill_script(proc.pid, start, "kill", "STOP").startswith("RGKILL killed ")
    assert process_state(proc.pid) == "T"
    assert kill_script(proc.pid, start, "check", "CONT") == "RGKILL alive T"
    assert kill_script(proc.pid, start, "kill", "CONT").startswith("RGKILL killed ")
    assert process_state(proc.pid) in ("S", "R")


def test_the_kill_script_refuses_another_signal_and_spares_another_instance(spawn: Spawn) -> None:
    proc = spawn()
    start = start_ticks(proc.pid)
    assert kill_script(proc.pid, start, "kill", "HUP") == "RGKILL refused HUP"
    assert kill_script(proc.pid, "1", "kill", "KILL") == f"RGKILL replaced {start}"
    stays(lambda: proc.poll() is None, "the other instance runs")
    proc.kill()
    proc.wait()
    assert kill_script(proc.pid, start, "kill", "KILL") == "RGKILL gone"


def test_a_preempt_sigkills_that_same_instance_after_the_grace_period(spawn: Spawn) -> None:
    proc = spawn(IGNORES_SIGTERM)
    orch, worker, here = on_this_machine(proc)
    try:
        sent = time.monotonic()
        result = orch.kill(worker, dry_run=False, fault=Fault("Preempt", grace_period=0.5))
        assert result.outcome is KillOutcome.KILLED, result.detail
        assert result.detail.startswith("kill -TERM rank 1"), result.detail
        assert "SIGKILL after the 0.5 s grace period" in result.detail
        assert proc.wait(timeout=within(PROMPT)) == -9
        assert time.monotonic() - sent >= 0.5
        eventually(lambda: orch.escalations, "the escalation's record", PROMPT)
    finally:
        orch.cleanup()
    assert [c[5] for c in here.calls] == ["TERM", "KILL"]
    assert len({c[:4] for c in here.calls}) == 1
    assert orch.escalations[0].startswith(f"kill -KILL {worker.instance_id}: killed ")
    assert not preempt_threads()


def test_cleanup_within_the_grace_period_sends_no_sigkill_and_leaves_no_thread(
    spawn: Spawn,
) -> None:
    proc = spawn(IGNORES_SIGTERM)
    orch, worker, here = on_this_machine(proc)
    grace = 30.0
    result = orch.kill(worker, dry_run=False, fault=Fault("Preempt", grace_period=grace))
    assert result.outcome is KillOutcome.KILLED, result.detail
    begun = time.monotonic()
    orch.cleanup()
    assert time.monotonic() - begun < grace  # it did not wait the grace period out
    assert not preempt_threads()
    assert orch.escalations == ["not sent: the drill ended within the grace period"]
    assert [c[5] for c in here.calls] == ["TERM"]
    assert proc.poll() is None


def test_cleanup_continues_what_a_hang_stopped_before_anything_else(spawn: Spawn) -> None:
    proc = spawn()
    orch, worker, here = on_this_machine(proc)
    result = orch.kill(worker, dry_run=False, fault=Fault("HangWorker"))
    assert result.outcome is KillOutcome.KILLED, result.detail
    # a SIGSTOP is delivered when the target is next scheduled
    eventually(lambda: process_state(proc.pid) == "T", "the target stopped", PROMPT)
    orch.cleanup()
    assert process_state(proc.pid) in ("S", "R")
    assert [c[5] for c in here.calls] == ["STOP", "CONT"]


def reuse_pid(pid: int) -> subprocess.Popen[str] | None:
    """A new process on ``pid`` (root: ``ns_last_pid``), or None when others took it first."""
    for _ in range(50):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(["sleep", "60"], text=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="recycling a pid on purpose needs root")
def test_the_escalation_never_hits_a_process_that_took_the_pid(spawn: Spawn) -> None:
    proc = spawn()  # dies of the SIGTERM
    orch, worker, here = on_this_machine(proc)
    reused = None
    try:
        result = orch.kill(worker, dry_run=False, fault=Fault("Preempt", grace_period=1.0))
        assert result.outcome is KillOutcome.KILLED, result.detail
        assert proc.wait(timeout=within(PROMPT)) == -15
        reused = reuse_pid(proc.pid)
        if reused is None:
            pytest.skip(f"could not start a process on pid {proc.pid} again")
        eventually(lambda: orch.escalations, "the escalation's record", PROMPT)
        assert orch.escalations[0].startswith(f"kill -KILL {worker.instance_id}: replaced ")
        stays(lambda: reused.poll() is None, "the process that took the pid runs")
        assert [c[5] for c in here.calls] == ["TERM", "KILL"]
    finally:
        orch.cleanup()
        if reused is not None:
            reused.kill()
            reused.wait()
