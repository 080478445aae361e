"""A Slurm job the drill submits itself (``workload.script``), on the real cluster.

We test these aspects, with a small job (two ``sleep`` tasks in one step):
- the job gets the drill's environment: the workload's ``env`` and the drill's own
  additions (what carries a StickyFault's poison) reach the batch script and its tasks;
  ``sbatchArgs`` and ``workdir`` are sbatch's; the job carries the drill's mark;
- cleanup cancels exactly that job and returns only once squeue lists it no more; the
  owner record is gone; a job sbatch refused leaves nothing either;
- a drill SIGKILLed with its job running leaves its record and its job; ``recoverygate
  sweep`` (dry run: says so) cancels that job, by its mark, and removes the record; a
  running drill's record, and its job, are left alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_recoverygate.errors import DiscoveryError
from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator
from pytest_recoverygate.orchestrators.slurm.commands import SlurmCommands
from pytest_recoverygate.orchestrators.slurm.submit import (
    RECORD_PREFIX,
    Submission,
    SubmittedJob,
    marked_jobs,
    sweep,
)
from pytest_recoverygate.registry.seams import RealClock
from tests.patience import JOB, PROCESS, PROMPT, deadline, eventually, within
from tests.slurm.slurm_testcluster import SlurmCluster

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
#: Says what the job got, then runs two tasks that say it too and wait.
SCRIPT = (
    "#!/bin/bash\n"
    'echo "batch: RG_FROM_ENV=$RG_FROM_ENV RG_FROM_DRILL=$RG_FROM_DRILL pwd=$(pwd)"\n'
    "srun --overcommit -n2 sh -c 'echo task $SLURM_PROCID: $RG_FROM_DRILL; exec sleep 600'\n"
)


@pytest.fixture
def lock_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lock folder of this test's own: the records it finds are this test's."""
    folder = tmp_path / "locks"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("RECOVERYGATE_LOCK_DIR", str(folder))
    return folder


@pytest.fixture
def job_script(tmp_path: Path) -> Path:
    path = tmp_path / "job.sbatch"
    path.write_text(SCRIPT)
    return path


@pytest.fixture
def cluster(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    monkeypatch.setenv("SLURM_CONF", slurm.conf)
    return slurm


def orchestrator(
    cluster: SlurmCluster, script: Path, workdir: Path, **env: str
) -> SlurmOrchestrator:
    submission = Submission(
        script,
        ("-n2", "--overcommit", "--job-name=rg-submit", "--output=%x-%j.out"),
        workdir,
        {"RG_FROM_ENV": "from-workload-env", **env},
    )
    return SlurmOrchestrator(
        submission=submission, clock=RealClock(), env=cluster.env, poll_interval=0.5
    )


def output_of(workdir: Path, job_id: str, *, says: str, timeout: float = PROCESS) -> str:
    path = workdir / f"rg-submit-{job_id}.out"

    def text() -> str:
        return path.read_text() if path.exists() else ""

    def said() -> str:
        now = text()
        return now if says in now else ""

    return eventually(said, f"{says!r} in {path}", timeout, seen=text)


def listed(cluster: SlurmCluster, job_id: str) -> str:
    return cluster.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).strip()


def test_the_job_gets_the_drills_environment_and_is_cancelled_at_cleanup(
    cluster: SlurmCluster, lock_folder: Path, job_script: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "submit-here"
    workdir.mkdir()
    orch = orchestrator(cluster, job_script, workdir, RG_FROM_DRILL="the-poison")
    try:
        workload = orch.discover(deadline(JOB))
        job_id = orch.job_id
        assert job_id is not None and [w.rank for w in workload.workers] == [0, 1]
        assert orch.submitted is not None
        assert cluster.job_field(job_id, "Comment") == orch.submitted.mark
        assert cluster.job_field(job_id, "WorkDir") == str(workdir)
        text = output_of(workdir, job_id, says="task 1:")
        assert f"RG_FROM_ENV=from-workload-env RG_FROM_DRILL=the-poison pwd={workdir}" in text
        assert "task 0: the-poison" in text and "task 1: the-poison" in text
        assert list(lock_folder.glob(f"{RECORD_PREFIX}*")) == [orch.submitted.record]
    finally:
        orch.cleanup()
    assert listed(cluster, job_id) == "", "cleanup returned with the job still listed"
    assert cluster.job_field(job_id, "JobState") == "CANCELLED"
    assert not list(lock_folder.glob(f"{RECORD_PREFIX}*"))


def test_a_job_sbatch_refuses_leaves_nothing(
    cluster: SlurmCluster, lock_folder: Path, job_script: Path, tmp_path: Path
) -> None:
    submission = Submission(job_script, ("--partition=no-such-partition",), tmp_path)
    orch = SlurmOrchestrator(submission=submission, clock=RealClock(), env=cluster.env)
    try:
        with pytest.raises(DiscoveryError, match="sbatch refused the job"):
            orch.discover(deadline(PROCESS))
    finally:
        orch.cleanup()
    assert not list(lock_folder.glob(f"{RECORD_PREFIX}*"))


DEAD_DRILL = """
import sys, time
from pathlib import Path
from pytest_recoverygate.orchestrators.slurm.commands import SlurmCommands
from pytest_recoverygate.orchestrators.slurm.submit import Submission, SubmittedJob
job = SubmittedJob(Submission(Path(sys.argv[1]), ("-n2", "--overcommit"), Path(sys.argv[2])),
                   SlurmCommands())
print(job.submit(), job.mark, flush=True)
time.sleep(600)
"""


def first_line(drill: subprocess.Popen[str]) -> list[str]:
    """What the stand-in drill printed: the job id and its mark."""
    assert drill.stdout is not None
    return drill.stdout.readline().split()


def test_the_sweep_cancels_the_job_of_a_sigkilled_drill_and_leaves_a_running_ones(
    cluster: SlurmCluster, lock_folder: Path, job_script: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'reporter'}"}
    drills = [
        subprocess.Popen(
            [sys.executable, "-c", DEAD_DRILL, str(job_script), str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        (dead_job, dead_mark), (live_job, live_mark) = (first_line(d) for d in drills)
        os.kill(drills[0].pid, signal.SIGKILL)  # its cleanup never runs
        drills[0].wait(within(PROMPT))
        commands = SlurmCommands()
        assert marked_jobs(commands, dead_mark) == [dead_job]

        listed_only = sweep(dry_run=True)
        assert f"would cancel {dead_job}" in "\n".join(listed_only.lines), listed_only.lines
        assert marked_jobs(commands, dead_mark) == [dead_job]  # a dry run cancels nothing

        report = sweep()
        said = "\n".join(report.lines)
        assert not report.problems, report.problems
        assert f"cancelled {dead_job}; record removed" in said, said
        assert "its drill is running; left alone" in said, said
        assert listed(cluster, dead_job) == ""
        assert marked_jobs(commands, live_mark) == [live_job]  # the running drill's
        assert [p.name for p in lock_folder.glob(f"{RECORD_PREFIX}*")] == [
            f"{RECORD_PREFIX}{live_mark.rsplit('-', 1)[1]}.json"
        ]
    finally:
        for drill in drills:
            drill.kill()
            drill.wait(within(PROMPT))
            if drill.stdout is not None:
                drill.stdout.close()
        sweep()
    assert not list(lock_folder.glob(f"{RECORD_PREFIX}*"))


def test_a_submitted_job_is_never_cancelled_without_its_mark(
    cluster: SlurmCluster, lock_folder: Path, job_script: Path, tmp_path: Path
) -> None:
    """Another job of the same user, submitted by hand, is not the drill's to cancel."""
    other = cluster.submit(SCRIPT, "-n2", "--overcommit", workdir=tmp_path)
    job = SubmittedJob(Submission(job_script, ("-n2", "--overcommit"), tmp_path), SlurmCommands())
    try:
        job.submit()
        assert job.cancel(time.sleep, time.monotonic) is None
        assert listed(cluster, other) in ("PENDING", "RUNNING")
    finally:
        job.close()
        cluster.cancel_all()
