"""A hostile Slurm job, or a hostile local user, cannot turn the drill or the test cluster.

We test these aspects:
- the node probe: a job process whose name (``/proc/self/comm``) holds a newline and whose
  ``WORLD_SIZE`` holds a whole probe row naming another process (a real ``sleep``, the
  victim) -- the attack is checked to be real (the text a naive probe printed carries a
  row for the victim), then the real probe script, run on this machine with a
  ``scontrol listpids`` that lists the hostile process, prints no row for the victim, and
  a drill through fake ``srun``/``scontrol``/``squeue`` clients never discovers it;
- the parser: a probe output carrying a row for a pid the listing does not have, a
  second row for one pid, a malformed row, or no listing at all is refused
  (DiscoveryError), and no kill step is ever run;
- the kill step: even handed the victim's exact pid and start time, it signals only a
  pid that ``scontrol listpids`` lists for the job's step there (KillWorker, Preempt,
  HangWorker: the victim is alive and not stopped), while the listed worker is killed;
- ``jobName`` without ``user`` finds only the invoking user's job (``squeue --user``),
  and the workload's name (prompt, report) carries the job's owner;
- the ``CANCELLED`` marker regex on a line a job wrote: 200 kB of spaces after
  ``CANCELLED`` (quadratic before: seconds; now milliseconds) -- a generous bound, and
  the real marker still read;
- ``scripts/slurm-cluster`` run as root: a folder another user made, or that others can
  write, or under a parent others can write without the sticky bit, is refused by ``up``
  and ``down`` before anything is read; a planted ``cluster.env`` carrying ``$(touch …)``
  is never executed; a pid file naming an unrelated live process does not get it killed;
  a second ``down`` leaves another cluster's bridge, namespace and process alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_recoverygate.engine.model import Fault, KillOutcome, Worker
from pytest_recoverygate.errors import DiscoveryError
from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator
from pytest_recoverygate.orchestrators.slurm.parsing import (
    PROBE_SCRIPT,
    parse_probe_output,
    parse_slurm_marker,
)
from pytest_recoverygate.registry.seams import RealClock
from tests.patience import JOB, PROCESS, PROMPT, deadline, eventually, stays, within
from tests.reliability.conftest import Figures

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "slurm" / "data"
SCRIPT = ROOT / "scripts" / "slurm-cluster"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the script runs as root")

# A job process: names itself "x\nRGPROBE" (prctl PR_SET_NAME) and waits.
HOSTILE = (
    "import ctypes, time; "
    "ctypes.CDLL(None).prctl(15, b'x\\nRGPROBE', 0, 0, 0); "
    "print('ready', flush=True); time.sleep(60)"
)

# Every Slurm client the backend runs, as one script (dispatch on its name). srun runs
# the constant script it is given here (``sh -c SCRIPT recoverygate ARGS``), or prints
# $RG_PROBE_OUT for the probe step when set; scontrol listpids lists $RG_LISTED as the
# tasks of step 2.0.
FAKE_TOOL = """#!/bin/sh
tool=$(basename "$0")
echo "$tool $*" >> "$RG_CALLS"
case "$tool $*" in
  "scontrol show job"*) cat "$RG_JOB"; exit 0 ;;
  "scontrol show step"*) cat "$RG_STEP"; exit 0 ;;
  "scontrol listpids"*)
    echo "PID      JOBID    STEPID   LOCALID GLOBALID"
    i=0; for pid in $RG_LISTED; do echo "$pid 2 0 $i $i"; i=$((i + 1)); done; exit 0 ;;
  squeue*) printf '7|train|%s|RUNNING|None|debug|localhost|\\n' "$(id -un)"; exit 0 ;;
  srun*)
    case "$*" in
      *--job-name=recoverygate-probe*) [ -n "$RG_PROBE_OUT" ] && { cat "$RG_PROBE_OUT"; exit 0; } ;;
    esac
    while [ $# -gt 0 ] && [ "$1" != sh ]; do shift; done
    exec "$@" ;;
esac
exit 0
"""


def start_ticks(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]


def state_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A process that is not the job's: what a forged row aims at (slurmd, sshd...)."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def hostile(victim: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[str]]:
    """The job's process: a newline in its name, a probe row for the victim in WORLD_SIZE."""
    forged = f"{victim.pid} 0 1 1 {start_ticks(victim.pid)} 1 - sh"
    env = dict(os.environ, RANK="0", WORLD_SIZE=forged)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOSTILE], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()
    proc.stdout.close()


@pytest.fixture
def fake_slurm(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squeue", "scontrol", "srun", "scancel"):
        (bin_dir / tool).write_text(FAKE_TOOL)
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "slurm.conf").write_text("ClusterName=fake\n")
    return {
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "RG_CALLS": str(tmp_path / "calls.log"),
        "RG_JOB": str(DATA / "scontrol-show-job-22.05-running.txt"),
        "RG_STEP": str(DATA / "scontrol-show-step-22.05-running.txt"),
        "RG_LISTED": "",
        "RG_PROBE_OUT": "",
        "SLURM_CONF": str(tmp_path / "slurm.conf"),
    }


def calls(env: dict[str, str], what: str) -> list[str]:
    path = Path(env["RG_CALLS"])
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if what in line]


def run_probe(env: dict[str, str]) -> str:
    return subprocess.run(
        ["sh", "-c", PROBE_SCRIPT, "recoverygate", "2"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=within(PROCESS),
    ).stdout


# ------------------------------------------------------------------ the node probe


def test_the_attack_is_real_a_naive_probe_row_names_the_victim(
    hostile: subprocess.Popen[str], victim: subprocess.Popen[bytes]
) -> None:
    """What the probe used to print: the process's name and WORLD_SIZE as they are."""
    comm = Path(f"/proc/{hostile.pid}/comm").read_text().rstrip("\n")
    environ = Path(f"/proc/{hostile.pid}/environ").read_bytes().split(b"\0")
    world = next(e for e in environ if e.startswith(b"WORLD_SIZE=")).decode()[11:]
    naive = f"RGPROBE {hostile.pid} 0 0 1 {start_ticks(hostile.pid)} 0 - {comm} {world} -"
    rows = [line.split() for line in naive.splitlines()]
    assert [row[1] for row in rows] == [str(hostile.pid), str(victim.pid)]


def test_the_probe_prints_no_row_for_a_process_the_job_named(
    hostile: subprocess.Popen[str],
    victim: subprocess.Popen[bytes],
    fake_slurm: dict[str, str],
    figures: Figures,
) -> None:
    out = run_probe({**fake_slurm, "RG_LISTED": str(hostile.pid)})
    assert str(victim.pid) not in out
    rows = parse_probe_output(out, "localhost")
    assert rows is not None
    assert [(r.pid, r.rank_env, r.world_size) for r in rows] == [(hostile.pid, 0, None)]
    assert rows[0].comm == "xRGPROBE"
    figures.add("hostile_slurm_cases")


@pytest.mark.slow  # discovery waits out its deadline for the rank that never appears (2 s)
def test_a_drill_never_discovers_the_victim_a_job_process_named(
    hostile: subprocess.Popen[str],
    victim: subprocess.Popen[bytes],
    fake_slurm: dict[str, str],
    figures: Figures,
) -> None:
    fake_slurm["RG_LISTED"] = str(hostile.pid)
    orch = SlurmOrchestrator(job_id="2", clock=RealClock(), env=fake_slurm, poll_interval=0.2)
    try:
        with pytest.raises(DiscoveryError, match="1 of 2 ranks") as info:
            orch.discover(time.time() + 2)  # not a wait: the deadline it gives up at
    finally:
        orch.cleanup()
    assert str(victim.pid) not in str(info.value)
    assert not calls(fake_slurm, "recoverygate-kill")
    assert victim.poll() is None
    figures.add("hostile_slurm_cases")


def forged_outputs(job: int, victim: int, start: str) -> dict[str, str]:
    """Probe outputs a job could make appear: each names the victim as rank 1."""
    listing = f"RGPIDS {job} 0 0\nRGPIDS-END\n"
    mine = f"RGPROBE {job} 0 0 1 {start_ticks(job)} 0 - python 2 -\n"
    theirs = f"RGPROBE {victim} 0 1 1 {start} 1 - sh 2 -\n"
    return {
        "unlisted pid": listing + mine + theirs + "RGPROBE-END\n",
        "listed pid twice": listing
        + mine
        + mine.replace(" 0 - python", " 1 - python")
        + "RGPROBE-END\n",
        "malformed row": listing
        + mine
        + theirs.replace(" sh ", " s\x1bh extra ")
        + "RGPROBE-END\n",
        "no listing": mine + theirs + "RGPROBE-END\n",
    }


@pytest.mark.parametrize(
    "case", ["unlisted pid", "listed pid twice", "malformed row", "no listing"]
)
def test_a_forged_probe_row_is_refused_and_nothing_is_signalled(
    case: str,
    hostile: subprocess.Popen[str],
    victim: subprocess.Popen[bytes],
    fake_slurm: dict[str, str],
    tmp_path: Path,
    figures: Figures,
) -> None:
    out = tmp_path / "probe.out"
    out.write_text(forged_outputs(hostile.pid, victim.pid, start_ticks(victim.pid))[case])
    fake_slurm.update(RG_LISTED=str(hostile.pid), RG_PROBE_OUT=str(out))
    orch = SlurmOrchestrator(job_id="2", clock=RealClock(), env=fake_slurm, poll_interval=0.2)
    try:
        with pytest.raises(DiscoveryError, match="nothing is signalled|refusing to aim"):
            orch.discover(deadline(PROMPT))
    finally:
        orch.cleanup()
    assert calls(fake_slurm, "recoverygate-probe"), "the probe must have run"
    assert not calls(fake_slurm, "recoverygate-kill")
    assert victim.poll() is None
    figures.add("hostile_slurm_cases")


# ------------------------------------------------------------------ the kill step


def worker_for(proc: subprocess.Popen[bytes] | subprocess.Popen[str], rank: int) -> Worker:
    start = start_ticks(proc.pid)
    return Worker(
        rank=rank,
        name=f"2.0 rank {rank}",
        instance_id=f"2.0/{proc.pid}@{start}",
        node="localhost",
        details=(("job", "2"), ("step", "0"), ("pid", str(proc.pid)), ("start", start)),
    )


@pytest.mark.parametrize("fault", ["KillWorker", "Preempt", "HangWorker"])
def test_the_kill_step_signals_only_a_pid_listpids_lists_for_the_step(
    fault: str,
    hostile: subprocess.Popen[str],
    victim: subprocess.Popen[bytes],
    fake_slurm: dict[str, str],
    figures: Figures,
) -> None:
    fake_slurm["RG_LISTED"] = str(hostile.pid)
    orch = SlurmOrchestrator(job_id="2", fault=fault, clock=RealClock(), env=fake_slurm)
    try:
        refused = orch.kill(worker_for(victim, 1), dry_run=False, fault=Fault(fault))
        assert refused.outcome is KillOutcome.ALREADY_GONE, refused.detail
        assert "nothing was signalled" in refused.detail
        stays(lambda: state_of(victim.pid) in ("S", "R"), "the victim runs on, not stopped")
        # the control: the same step on the listed process does reach it
        hit = orch.kill(worker_for(hostile, 0), dry_run=False, fault=Fault(fault))
        assert hit.outcome is KillOutcome.KILLED, hit.detail
    finally:
        orch.cleanup()
    assert victim.poll() is None
    figures.add("hostile_slurm_cases")


# ------------------------------------------------------------------ jobName, regexes


def test_a_job_name_alone_finds_only_the_invoking_user_s_job(fake_slurm: dict[str, str]) -> None:
    orch = SlurmOrchestrator(job_name="train", clock=RealClock(), env=fake_slurm)
    assert orch.commands.job_by_name("train", None, None) == "7"
    me = orch.commands.current_user()
    assert calls(fake_slurm, "squeue")[-1].endswith(f"--user {me}")
    orch.commands.job_by_name("train", "alice", None)
    assert calls(fake_slurm, "squeue")[-1].endswith("--user alice")


def test_the_workload_names_the_job_s_owner(
    hostile: subprocess.Popen[str], fake_slurm: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "probe.out"
    out.write_text(
        f"RGPIDS {hostile.pid} 0 0\nRGPIDS-END\n"
        f"RGPROBE {hostile.pid} 0 0 1 {start_ticks(hostile.pid)} - - python - -\nRGPROBE-END\n"
    )
    fake_slurm.update(RG_LISTED=str(hostile.pid), RG_PROBE_OUT=str(out))
    step = tmp_path / "step.txt"  # the canned step, with one task
    step.write_text(Path(fake_slurm["RG_STEP"]).read_text().replace("Tasks=2", "Tasks=1"))
    fake_slurm["RG_STEP"] = str(step)
    orch = SlurmOrchestrator(job_id="2", clock=RealClock(), env=fake_slurm, poll_interval=0.2)
    try:
        workload = orch.discover(deadline(PROMPT))
    finally:
        orch.cleanup()
    assert workload.job == "slurm job 2 (rgtest, user root)"  # UserId=root(0) in the capture
    assert dict(workload.workers[0].details)["user"] == "root"


def test_the_cancelled_marker_regex_is_linear_on_a_line_the_job_wrote(figures: Figures) -> None:
    # 200 kB of spaces and no closing "***": the old CANCELLED.*?\s*\*\*\* took seconds
    # here (40 kB: 2.3 s measured); bounded repetitions take milliseconds.
    hostile_line = "slurmstepd: error: *** JOB 1 ON n CANCELLED" + " " * 200_000 + "x"
    prefixes = "srun: error: " + "a" * 2000 + " " + "srun: error: " * 2000
    started = time.perf_counter()
    assert parse_slurm_marker(hostile_line) is None
    assert parse_slurm_marker(prefixes) is None
    assert time.perf_counter() - started < 1.0
    real = "slurmstepd: error: *** STEP 2.0 ON node1 CANCELLED AT 2026-11-29T11:47:14 ***   "
    assert parse_slurm_marker(real) == real.strip()
    figures.add("hostile_slurm_cases")


# ------------------------------------------------------------------ scripts/slurm-cluster


def cluster_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=within(JOB), check=False
    )


def marked_dir(parent: Path, name: str = "cluster") -> Path:
    """A folder as ``up`` leaves it: 0700, its mark, etc/ and run/."""
    folder = parent / name
    folder.mkdir(mode=0o700)
    (folder / ".slurm-cluster").write_text("rg-0123456789abcdef\n")
    (folder / "etc").mkdir()
    (folder / "run").mkdir()
    (folder / "munge").mkdir()
    return folder


@ROOT_ONLY
@pytest.mark.parametrize("command", ["up", "down"])
def test_a_folder_another_user_made_is_refused(
    command: str, tmp_path: Path, figures: Figures
) -> None:
    folder = marked_dir(tmp_path)
    os.chown(folder, 65534, 65534)
    proc = cluster_script(command, str(folder))
    assert proc.returncode == 1
    assert "belongs to another user" in proc.stderr
    assert sorted(p.name for p in folder.iterdir()) == [".slurm-cluster", "etc", "munge", "run"]
    figures.add("hostile_slurm_cases")


@ROOT_ONLY
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_folder_others_can_write_is_refused(mode: int, tmp_path: Path) -> None:
    folder = marked_dir(tmp_path)
    folder.chmod(mode)
    for command in ("up", "down"):
        proc = cluster_script(command, str(folder))
        assert proc.returncode == 1, proc.stderr
        assert "is writable by others" in proc.stderr


@ROOT_ONLY
def test_a_parent_others_can_write_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o777)
    proc = cluster_script("up", str(parent / "slurm"))
    assert proc.returncode == 1
    assert "writable by others without the sticky bit" in proc.stderr
    assert not (parent / "slurm").exists()
    parent.chmod(0o1777)  # /tmp's mode: others cannot move a folder they do not own
    folder = marked_dir(parent)
    assert cluster_script("down", str(folder)).returncode == 0


@ROOT_ONLY
def test_up_refuses_a_non_empty_folder_it_did_not_make(tmp_path: Path) -> None:
    # "up" on a non-empty folder without the mark stops before any daemon starts
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    (foreign / "etc").mkdir()
    proc = cluster_script("up", str(foreign))
    assert proc.returncode == 1
    assert "was not made by" in proc.stderr
    assert cluster_script("down", str(foreign)).returncode == 1


@ROOT_ONLY
@pytest.mark.parametrize(
    "text",
    ["NODES=1$(touch {marker})\n", "NODES=1\n$(touch {marker})\n", "NODES=`touch {marker}`\n"],
)
def test_a_planted_cluster_env_is_read_as_data_never_run(
    text: str, tmp_path: Path, figures: Figures
) -> None:
    folder = marked_dir(tmp_path)
    marker = tmp_path / "pwned"
    (folder / "etc" / "cluster.env").write_text(text.format(marker=marker))
    for command in ("down", "status"):
        proc = cluster_script(command, str(folder))
        assert proc.returncode == 1, (command, proc.stderr)
        assert "cluster.env" in proc.stderr
    assert not marker.exists(), "cluster.env was executed"
    figures.add("hostile_slurm_cases")


@ROOT_ONLY
def test_a_pid_file_naming_an_unrelated_process_does_not_get_it_killed(
    tmp_path: Path, figures: Figures
) -> None:
    folder = marked_dir(tmp_path)
    bystanders = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        files = [
            folder / "run" / "slurmctld.pid",
            folder / "run" / "slurmd-localhost.pid",
            folder / "munge" / "munged.pid",
        ]
        for file, bystander in zip(files, bystanders, strict=True):
            file.write_text(f"{bystander.pid}\n")
        down = cluster_script("down", str(folder))
        assert down.returncode == 0, down.stderr
        stays(lambda: [p.poll() for p in bystanders] == [None] * 3, "the bystanders run")
        assert down.stderr.count("left alone") == 3
    finally:
        for bystander in bystanders:
            bystander.kill()
            bystander.wait()
    figures.add("hostile_slurm_cases")


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=within(PROMPT), check=False
    )


@ROOT_ONLY
@pytest.mark.slow  # makes a bridge and a network namespace (run under the heavy lock)
def test_a_second_down_leaves_another_cluster_s_bridge_and_processes_alone(
    tmp_path: Path, figures: Figures
) -> None:
    """The worst case: a stale cluster.env names the index another cluster now holds."""
    k = 199
    if _ip("link", "show", f"rgsl{k}").returncode == 0:
        pytest.skip(f"rgsl{k} exists on this machine")
    folder = marked_dir(tmp_path)
    (folder / "etc" / "cluster.env").write_text(f"NODES=2\nNET_INDEX={k}\nSUBNET=10.217.{k}\n")
    ns = f"rgsl{k}-n1"
    other: subprocess.Popen[bytes] | None = None
    try:
        assert _ip("link", "add", f"rgsl{k}", "type", "bridge").returncode == 0
        _ip("link", "set", f"rgsl{k}", "alias", "rg-ffffffffffffffff")  # the other's mark
        assert _ip("netns", "add", ns).returncode == 0
        other = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"])
        comm = Path(f"/proc/{other.pid}/comm")
        eventually(lambda: comm.read_text().strip() == "sleep", "the other's process in its ns")
        proc = cluster_script("down", str(folder))
        assert proc.returncode == 0, proc.stderr
        assert "not this cluster's" in proc.stderr
        assert _ip("link", "show", f"rgsl{k}").returncode == 0, "the other's bridge was removed"
        assert ns in _ip("netns", "list").stdout
        assert other.poll() is None, "the other cluster's process was killed"
        assert not (folder / "etc" / "cluster.env").exists()
    finally:
        if other is not None:
            other.kill()
            other.wait()
        _ip("netns", "del", ns)
        _ip("link", "del", f"rgsl{k}")
    figures.add("hostile_slurm_cases")
