"""Exactly one kill on the local and SLURM backends, when the world changes under the kill.

We test these aspects:
- local, pid reuse: a victim that exited and a new, unrelated process that now has its
  pid (a live process with another start time) -- the kill touches nothing and says
  ALREADY_GONE; also a victim whose pid is simply free;
- SLURM, a destructive command (``scontrol requeue``, ``scancel``, the ``srun`` kill step;
  fake clients on PATH that log each call) that times out or loses its answer *after
  acting*: sent once, and the kill is UNCONFIRMED (the drill ends in ERROR), never
  "nothing was killed"; sent again only when it certainly never started (no connection
  to slurmctld, srun made no step), and then it acts once.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pytest_recoverygate.engine.model import KillOutcome, Worker
from pytest_recoverygate.orchestrators.local import LocalOrchestrator
from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator
from pytest_recoverygate.registry.seams import RealClock
from pytest_recoverygate.shared.procs import JobLaunch
from tests.patience import stays
from tests.reliability.conftest import Figures

DATA = Path(__file__).resolve().parents[1] / "slurm" / "data"


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated live process: what a recycled pid points at."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.local
@pytest.mark.parametrize("shift", [-5.0, 0.5, 3600.0])
def test_a_recycled_pid_is_never_killed(
    bystander: subprocess.Popen[bytes], tmp_path: Path, shift: float, figures: Figures
) -> None:
    created = psutil.Process(bystander.pid).create_time()
    victim = Worker(1, "rank 1", f"{bystander.pid}@{created + shift:.3f}")  # the old instance
    backend = LocalOrchestrator(JobLaunch([sys.executable], tmp_path), clock=RealClock())
    try:
        result = backend.kill(victim, dry_run=False)
    finally:
        backend.cleanup()
    assert result.outcome is KillOutcome.ALREADY_GONE
    stays(lambda: bystander.poll() is None, "the process that reused the pid runs")
    figures.add("pid_reuse_cases")


@pytest.mark.local
def test_a_victim_whose_pid_is_free_is_not_signalled(tmp_path: Path, figures: Figures) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    created = psutil.Process(proc.pid).create_time()
    proc.wait()
    backend = LocalOrchestrator(JobLaunch([sys.executable], tmp_path), clock=RealClock())
    try:
        result = backend.kill(Worker(1, "rank 1", f"{proc.pid}@{created:.3f}"), dry_run=False)
    finally:
        backend.cleanup()
    assert result.outcome is KillOutcome.ALREADY_GONE
    figures.add("pid_reuse_cases")


# ---------------------------------------------------------------------- SLURM

FAKE_TOOL = """#!/bin/sh
# A Slurm client that logs each call. Reads answer from the canned files; the k-th
# destructive call (requeue, scancel, srun) follows the k-th word of $RG_PLAN (the last
# word repeats): ok, hang (acts, then hangs past the timeout), lost (acts, then loses the
# answer), ranthenlost (the kill step ran and printed, then srun failed), refused (never
# reached slurmctld), nostep (srun made no step), gone (the job does not exist).
tool=$(basename "$0")
echo "$tool $*" >> "$RG_CALLS"
case "$tool $*" in
  "scontrol show job"*) cat "$RG_JOB"; exit 0 ;;
  "scontrol show step"*) cat "$RG_STEP"; exit 0 ;;
  "scontrol requeue"*|scancel*|srun*) ;;
  *) exit 0 ;;
esac
echo x >> "$RG_CALLS.n"
k=$(wc -l < "$RG_CALLS.n")
plan=$(echo "$RG_PLAN" | cut -d, -f"$k")
[ -n "$plan" ] || plan=${RG_PLAN##*,}
acted() { echo "$tool" >> "$RG_CALLS.acted"; }
case "$plan" in
  ok) acted; [ "$tool" = srun ] && echo "RGKILL killed"; exit 0 ;;
  hang) acted; exec sleep 30 ;;
  lost) acted; echo "$tool: error: Socket timed out on send/recv operation" >&2; exit 1 ;;
  ranthenlost) acted; echo "RGKILL killed"
    echo "srun: error: Unable to contact slurm controller (connect failure)" >&2; exit 1 ;;
  refused) echo "$tool: error: Unable to contact slurm controller (connect failure)" >&2
    exit 1 ;;
  nostep) echo "srun: error: Unable to create step for job 2: Requested nodes are busy" >&2
    exit 1 ;;
  gone) echo "$tool: error: Invalid job id specified" >&2; exit 1 ;;
esac
exit 1
"""

DESTRUCTIVE = {"Requeue": "scontrol requeue", "KillStep": "scancel", "KillWorker": "srun"}


@pytest.fixture
def fake_slurm(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squeue", "scontrol", "srun", "scancel"):
        path = bin_dir / tool
        path.write_text(FAKE_TOOL)
        path.chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=fake\n")
    return {
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "RG_CALLS": str(tmp_path / "calls.log"),
        "RG_JOB": str(DATA / "scontrol-show-job-22.05-running.txt"),
        "RG_STEP": str(DATA / "scontrol-show-step-22.05-running.txt"),
        "RG_PLAN": "hang",
        "SLURM_CONF": str(conf),
    }


def calls(env: dict[str, str], prefix: str) -> list[str]:
    path = Path(env["RG_CALLS"])
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if line.startswith(prefix)]


def acted(env: dict[str, str]) -> int:
    """How many times a destructive command acted (the fake notes it before answering)."""
    path = Path(env["RG_CALLS"] + ".acted")
    return len(path.read_text().splitlines()) if path.exists() else 0


def slurm_worker() -> Worker:
    return Worker(
        1,
        "2.0 rank 1",
        "2.0/4242@123",
        node="node1",
        details=(("job", "2"), ("step", "0"), ("pid", "4242"), ("start", "123"), ("restarts", "0")),
    )


def slurm_kill(env: dict[str, str], fault: str, figures: Figures) -> tuple[KillOutcome, str]:
    """One kill through the real adapter against the fake clients; checks one action."""
    backend = SlurmOrchestrator(
        job_id="2", fault=fault, clock=RealClock(), env=env, command_timeout=0.5
    )
    # retry waits are not under test here
    backend.commands.retry = dataclasses.replace(backend.commands.retry, base=0.01, cap=0.01)
    try:
        result = backend.kill(slurm_worker(), dry_run=False)
    finally:
        backend.cleanup()
    figures.add("slurm_timeout_cases")
    figures.add("double_kills", max(acted(env) - 1, 0))
    assert acted(env) <= 1, calls(env, DESTRUCTIVE[fault])
    return result.outcome, result.detail


@pytest.mark.slurm
@pytest.mark.parametrize("fault", ["Requeue", "KillStep"])
def test_a_requeue_that_times_out_after_acting_is_never_sent_twice(
    fault: str, fake_slurm: dict[str, str], figures: Figures
) -> None:
    outcome, detail = slurm_kill(fake_slurm, fault, figures)
    assert len(calls(fake_slurm, DESTRUCTIVE[fault])) == 1, calls(fake_slurm, "")
    assert outcome is KillOutcome.UNCONFIRMED, detail
    assert "timed out" in detail


@pytest.mark.slurm
def test_a_kill_step_that_times_out_after_acting_is_not_called_nothing_killed(
    fake_slurm: dict[str, str], figures: Figures
) -> None:
    outcome, detail = slurm_kill(fake_slurm, "KillWorker", figures)
    assert len(calls(fake_slurm, "srun")) == 1, calls(fake_slurm, "srun")
    assert outcome is KillOutcome.UNCONFIRMED, detail
    assert "nothing was killed" not in detail


# fault, the plan of the destructive calls, outcome, calls made, times it acted.
RESEND_TABLE = [
    ("Requeue", "lost", KillOutcome.UNCONFIRMED, 1, 1),
    ("Requeue", "refused,ok", KillOutcome.KILLED, 2, 1),
    ("Requeue", "refused", KillOutcome.UNCONFIRMED, 4, 0),
    ("Requeue", "gone", KillOutcome.ALREADY_GONE, 1, 0),
    ("Requeue", "ok", KillOutcome.KILLED, 1, 1),
    ("KillStep", "lost", KillOutcome.UNCONFIRMED, 1, 1),
    ("KillStep", "refused,ok", KillOutcome.KILLED, 2, 1),
    ("KillWorker", "lost", KillOutcome.UNCONFIRMED, 1, 1),
    ("KillWorker", "ranthenlost", KillOutcome.UNCONFIRMED, 1, 1),
    ("KillWorker", "refused,ok", KillOutcome.KILLED, 2, 1),
    ("KillWorker", "nostep,ok", KillOutcome.KILLED, 2, 1),
    ("KillWorker", "nostep", KillOutcome.UNCONFIRMED, 4, 0),
    ("KillWorker", "gone", KillOutcome.ALREADY_GONE, 1, 0),
    ("KillWorker", "ok", KillOutcome.KILLED, 1, 1),
]


@pytest.mark.slurm
@pytest.mark.parametrize(("fault", "plan", "outcome", "sent", "times_acted"), RESEND_TABLE)
def test_a_destructive_slurm_command_is_sent_again_only_when_it_never_started(
    fault: str,
    plan: str,
    outcome: KillOutcome,
    sent: int,
    times_acted: int,
    fake_slurm: dict[str, str],
    figures: Figures,
) -> None:
    fake_slurm["RG_PLAN"] = plan
    got, detail = slurm_kill(fake_slurm, fault, figures)
    assert got is outcome, detail
    assert len(calls(fake_slurm, DESTRUCTIVE[fault])) == sent, calls(fake_slurm, "")
    assert acted(fake_slurm) == times_acted
    if got is KillOutcome.UNCONFIRMED:
        # what the drill's ERROR says must match what happened
        assert ("nothing was" in detail) is (times_acted == 0), detail
