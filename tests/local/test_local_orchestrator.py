"""The local torchrun backend against real torchrun and examples/local/train.py.

We test these aspects:

- discovery finds every local rank with its own pid, and refuses a job that exits
  before its workers appear or never shows a worker group before the deadline;
- a kill names an instance: a stale identity (wrong start time, or a victim that has
  already been replaced) is refused with ALREADY_GONE and touches nothing; a dry run
  kills nothing; a real kill ends only the target rank;
- watch_group reports the victim gone, the restart and the new group running, and
  reports JOB_FAILED promptly with torchrun's root cause when no restart is left;
- cleanup leaves no process behind, also when the agent was SIGKILLed and its workers
  were orphaned; torchrun hands the drill's marker (which cleanup goes by) to its workers;
- attach mode follows the output file of an agent the user started and leaves the job
  running, skips what the file held before the drill, keeps reading after the file is
  truncated (an agent restarted with ``> train.log``), and refuses an agent whose output
  it cannot read.

Each test starts its own torchrun (2-5 s of ``import torch`` per start on a small
machine), so they are marked ``local`` and kept few.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import recoverygate

from pytest_recoverygate.engine.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    Worker,
    Workload,
)
from pytest_recoverygate.errors import DiscoveryError
from pytest_recoverygate.orchestrators.local import DRILL_MARKER, LocalOrchestrator
from pytest_recoverygate.registry.seams import Orchestrator, RealClock
from pytest_recoverygate.shared.procs import JobLaunch
from tests.patience import JOB, PROCESS, PROMPT, QUIET, deadline, eventually, gather, stays, within

# Real torchrun processes: run with the drills, one at a time (under xdist, beside another
# worker's tests, the orphaned-workers cleanup found a process of the job it could not end).
pytestmark = [pytest.mark.local, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "local" / "train.py"


def job_env() -> dict[str, str]:
    """Make ``recoverygate`` importable in the job even when it is not installed."""
    reporter_root = str(Path(recoverygate.__file__).resolve().parent.parent)
    current = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(p for p in (reporter_root, current) if p)}


def torchrun(tmp_path: Path, *, max_restarts: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        f"--max-restarts={max_restarts}",
        str(TRAIN),
        f"--ckpt-dir={tmp_path / 'checkpoints'}",
        "--ckpt-every=20",
        "--step-time=0.02",
    ]


def pids_of(workload: Workload) -> dict[int, int]:
    return {w.rank: int(w.instance_id.split("@")[0]) for w in workload.workers}


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def has(kind: GroupEventKind) -> Callable[[list[GroupEvent]], bool]:
    return lambda seen: any(e.kind is kind for e in seen)


def shown(orchestrator: LocalOrchestrator) -> Callable[[list[GroupEvent]], str]:
    """What a wait that ran out shows: the group events so far and the job's output."""
    return lambda got: f"{[e.kind.value for e in got]}\n{orchestrator.output_tail(30)}"


@pytest.fixture
def launched() -> Iterator[list[LocalOrchestrator]]:
    """Orchestrators a test creates; each is cleaned up and checked to leave no process."""
    created: list[LocalOrchestrator] = []
    yield created
    for orchestrator in created:
        orchestrator.cleanup()


def start(
    launched: list[LocalOrchestrator], command: list[str], workdir: Path
) -> LocalOrchestrator:
    orchestrator = LocalOrchestrator(JobLaunch(command, workdir, job_env()), clock=RealClock())
    launched.append(orchestrator)
    return orchestrator


def test_it_conforms_to_the_orchestrator_protocol(tmp_path: Path) -> None:
    _: Orchestrator = LocalOrchestrator(JobLaunch(["torchrun"], tmp_path), clock=RealClock())
    assert isinstance(_, Orchestrator)


def test_it_discovers_each_rank_and_refuses_stale_identities_and_kills_nothing_in_a_dry_run(
    tmp_path: Path, launched: list[LocalOrchestrator]
) -> None:
    orchestrator = start(launched, torchrun(tmp_path, max_restarts=3), tmp_path)
    workload = orchestrator.discover(deadline(JOB))

    assert [w.rank for w in workload.workers] == [0, 1]
    pids = pids_of(workload)
    assert pids[0] != pids[1]
    assert all(alive(pid) for pid in pids.values())
    # Cleanup finds the job by this marker: torchrun must hand it on to its workers.
    job_processes = [orchestrator.agent_pid, *pids.values()]
    markers = {psutil.Process(pid).environ().get(DRILL_MARKER) for pid in job_processes}
    assert len(markers) == 1
    assert None not in markers
    assert DRILL_MARKER not in os.environ, "the marker is the job's, not the drill's own"

    target = workload.by_rank(1)
    assert target is not None
    pid, _, created = target.instance_id.partition("@")
    recycled = Worker(rank=1, name=target.name, instance_id=f"{pid}@{float(created) - 60:.3f}")
    assert orchestrator.kill(recycled, dry_run=False).outcome is KillOutcome.ALREADY_GONE

    assert orchestrator.kill(target, dry_run=True).outcome is KillOutcome.DRY_RUN
    stays(
        lambda: all(alive(pid) for pid in pids.values()) and not orchestrator.watch_group(),
        "the job untouched by a dry run",
        QUIET,
    )

    scratch = orchestrator.scratch_dir
    assert scratch is not None
    assert scratch.is_dir()
    job = [orchestrator.agent_pid, *pids.values()]
    orchestrator.cleanup()
    assert not any(alive(pid) for pid in job if pid is not None)
    assert not scratch.exists()


def test_it_reports_the_victim_gone_the_restart_and_the_new_group_and_never_kills_a_replacement(
    tmp_path: Path, launched: list[LocalOrchestrator]
) -> None:
    orchestrator = start(launched, torchrun(tmp_path, max_restarts=3), tmp_path)
    workload = orchestrator.discover(deadline(JOB))
    target = workload.by_rank(1)
    assert target is not None
    old = pids_of(workload)

    result = orchestrator.kill(target, dry_run=False)
    assert result.outcome is KillOutcome.KILLED

    events = gather(
        orchestrator.watch_group,
        has(GroupEventKind.REPLACEMENT_RUNNING),
        "replacement running",
        JOB,
        seen=shown(orchestrator),
    )
    kinds = [e.kind for e in events]
    assert kinds[0] is GroupEventKind.WORKER_GONE
    assert events[0].worker is not None
    assert events[0].worker.instance_id == target.instance_id
    assert kinds.index(GroupEventKind.RESTARTING) < kinds.index(GroupEventKind.REPLACEMENT_RUNNING)
    assert events[kinds.index(GroupEventKind.RESTARTING)].restart_count == 1
    assert GroupEventKind.JOB_FAILED not in kinds
    assert not alive(old[1])

    # The victim's identity now names nothing: a retry must not hit the replacement.
    again = orchestrator.kill(target, dry_run=False)
    assert again.outcome is KillOutcome.ALREADY_GONE
    stays(lambda: not has(GroupEventKind.WORKER_GONE)(orchestrator.watch_group()), "no kill", QUIET)


def test_it_reports_job_failed_promptly_with_the_root_cause_when_no_restart_is_left(
    tmp_path: Path, launched: list[LocalOrchestrator]
) -> None:
    orchestrator = start(launched, torchrun(tmp_path, max_restarts=0), tmp_path)
    workload = orchestrator.discover(deadline(JOB))
    target = workload.by_rank(1)
    assert target is not None

    result = orchestrator.kill(target, dry_run=False)
    events = gather(
        orchestrator.watch_group,
        has(GroupEventKind.JOB_FAILED),
        "job failed",
        JOB,
        seen=shown(orchestrator),
    )

    failed = next(e for e in events if e.kind is GroupEventKind.JOB_FAILED)
    assert failed.timestamp - result.timestamp < within(PROMPT)  # not torchrun's timeouts
    assert "exited with code 1" in failed.detail
    assert "ChildFailedError" in failed.detail
    # torchrun's root cause is our SIGKILL of rank 1; rank 0 was only stopped by the agent.
    assert "root cause rank 1, exit code -9" in failed.detail
    assert GroupEventKind.RESTARTING not in [e.kind for e in events]


def test_its_cleanup_reaches_the_workers_orphaned_by_a_killed_agent(
    tmp_path: Path, launched: list[LocalOrchestrator]
) -> None:
    orchestrator = start(launched, torchrun(tmp_path, max_restarts=3), tmp_path)
    workload = orchestrator.discover(deadline(JOB))
    workers = list(pids_of(workload).values())
    agent = psutil.Process(workers[0]).ppid()

    os.kill(agent, signal.SIGKILL)
    gather(
        orchestrator.watch_group,
        has(GroupEventKind.JOB_FAILED),
        "job failed",
        JOB,
        seen=shown(orchestrator),
    )
    assert all(alive(pid) for pid in workers), "orphaned workers keep training"

    orchestrator.cleanup()
    assert not any(alive(pid) for pid in [agent, *workers])
    adopted = [c.pid for c in psutil.Process().children() if c.pid in [agent, *workers]]
    assert adopted == [], "adopted orphans must be reaped, not left as zombies"
    orchestrator.cleanup()  # idempotent


def test_it_refuses_a_job_that_exits_before_its_workers_appear(
    tmp_path: Path, launched: list[LocalOrchestrator]
) -> None:
    command = [sys.executable, "-c", "print('cannot find train.py'); raise SystemExit(3)"]
    orchestrator = start(launched, command, tmp_path)
    with pytest.raises(DiscoveryError, match=r"(?s)exited with code 3.*cannot find train\.py"):
        orchestrator.discover(deadline(PROCESS))


def test_it_refuses_a_job_that_shows_no_worker_group_before_the_deadline(
    tmp_path: Path, launched: list[LocalOrchestrator]
) -> None:
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    orchestrator = start(launched, command, tmp_path)
    with pytest.raises(DiscoveryError, match="no complete torchrun worker group"):
        orchestrator.discover(time.time() + 1.0)  # not a wait: the deadline it gives up at
    sleeper = orchestrator.agent_pid
    orchestrator.cleanup()
    assert sleeper is not None
    assert not alive(sleeper)


def test_it_attaches_to_a_running_agent_reads_its_output_file_and_leaves_it_running(
    tmp_path: Path,
) -> None:
    log = tmp_path / "train.log"
    with open(log, "wb") as out:
        job = subprocess.Popen(
            torchrun(tmp_path, max_restarts=3),
            cwd=tmp_path,
            env={**os.environ, **job_env(), "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        orchestrator = LocalOrchestrator(
            JobLaunch([], tmp_path), clock=RealClock(), attach_pid=job.pid
        )
        workload = orchestrator.discover(deadline(JOB))
        assert [w.rank for w in workload.workers] == [0, 1]

        eventually(orchestrator.events().poll, "a RECOVERYGATE/v1 line from the agent's file", JOB)

        orchestrator.cleanup()
        assert job.poll() is None
        assert all(alive(pid) for pid in pids_of(workload).values())
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=within(PROCESS))


AGENT_LIKE = """
import os, subprocess, sys, time
for rank in range(2):
    env = {**os.environ, "RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
time.sleep(120)
"""


def test_attach_skips_the_history_and_follows_the_file_through_a_truncation(
    tmp_path: Path,
) -> None:
    """A torchrun-like agent (two children carrying RANK, no torch): what the log held
    before the drill is history; a truncation and rewrite is read from its start."""
    log = tmp_path / "train.log"

    def line(step: int, inc: str) -> bytes:
        return (
            f'RECOVERYGATE/v1 {{"event":"progress","time":{time.time():.6f},'
            f'"inc":"{inc}","rank":0,"step":{step}}}\n'
        ).encode()

    log.write_bytes(line(1, "old-run"))
    with open(log, "ab") as out:
        agent = subprocess.Popen(
            [sys.executable, "-c", AGENT_LIKE], stdout=out, start_new_session=True
        )
    orchestrator = LocalOrchestrator(
        JobLaunch([], tmp_path), clock=RealClock(), attach_pid=agent.pid
    )
    try:
        orchestrator.discover(deadline(PROCESS))
        seen: list[tuple[str, int | None]] = []

        def read_until(wanted: tuple[str, int]) -> None:
            def arrived() -> bool:
                seen.extend((e.incarnation, e.step) for e in orchestrator.events().poll())
                return wanted in seen

            eventually(arrived, f"the line {wanted}", seen=lambda: seen)

        with open(log, "ab") as writer:
            writer.write(line(2, "this-run"))
        read_until(("this-run", 2))
        log.write_bytes(line(3, "restarted"))  # truncated and rewritten, shorter than before
        read_until(("restarted", 3))
        assert ("old-run", 1) not in seen
    finally:
        orchestrator.cleanup()
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=within(PROCESS))


def test_it_refuses_to_attach_to_an_agent_whose_output_is_not_a_file(tmp_path: Path) -> None:
    job = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE
    )
    try:
        orchestrator = LocalOrchestrator(
            JobLaunch([], tmp_path), clock=RealClock(), attach_pid=job.pid
        )
        with pytest.raises(DiscoveryError, match="stdout is not a file"):
            orchestrator.discover(deadline(PROMPT))
        orchestrator.cleanup()
        assert job.poll() is None
    finally:
        job.kill()
        job.wait()
        assert job.stdout is not None
        job.stdout.close()


def test_it_names_the_workers_own_error_when_the_job_fails_on_its_own(
    tmp_path: Path, launched: list[LocalOrchestrator]
) -> None:
    script = tmp_path / "crash.py"
    script.write_text(
        "import os, time\n"
        "time.sleep(3)\n"
        "if os.environ['RANK'] == '1':\n"
        "    raise RuntimeError('checkpoint folder is read-only')\n"
        "time.sleep(60)\n"
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=0",
        str(script),
    ]
    orchestrator = start(launched, command, tmp_path)
    orchestrator.discover(deadline(JOB))

    events = gather(
        orchestrator.watch_group,
        has(GroupEventKind.JOB_FAILED),
        "job failed",
        JOB,
        seen=shown(orchestrator),
    )

    failed = next(e for e in events if e.kind is GroupEventKind.JOB_FAILED)
    assert "root cause rank 1, exit code 1" in failed.detail
    assert "RuntimeError: checkpoint folder is read-only" in failed.detail
