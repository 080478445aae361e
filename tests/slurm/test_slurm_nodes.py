"""KillNode on the real two-node Slurm cluster (``scripts/slurm-cluster up --nodes 2``).

We test these aspects, with a job whose one step runs a task on each node, and each task
three processes (a shell and two children: a launcher and its workers, as torchrun):
- the cluster: each node is its own host (hostname, address) and both nodes run tasks;
- KillNode of rank 1 SIGKILLs every process of the step on rank 1's node at once, by
  one identity-checked kill step, and not one process of the other node;
- a dry run names what it would kill and touches nothing; a stale instance touches
  nothing;
- ``drain_node``: the node is DRAIN right after the kill and idle again after cleanup;
  run as a user without Slurm operator rights, discovery refuses before anything is
  touched, with the reason.

The processes of every node are visible here (the nodes share this machine's pid
namespace), so the test reads them from /proc directly.
"""

from __future__ import annotations

import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_recoverygate.engine.model import Fault, KillOutcome, Worker
from pytest_recoverygate.errors import PermissionDeniedError
from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator
from pytest_recoverygate.registry.seams import RealClock
from tests.patience import JOB, PROCESS, QUIET, deadline, eventually, stays, within
from tests.slurm.slurm_testcluster import SlurmCluster

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
PER_NODE = (
    "#!/bin/bash\nsrun -N2 --ntasks-per-node=1 --overcommit sh -c 'sleep 600 & sleep 600 & wait'\n"
)


@pytest.fixture(autouse=True)
def _two_nodes(slurm: SlurmCluster) -> None:
    if len(slurm.nodes) < 2:
        pytest.skip("needs two nodes or more (RECOVERYGATE_SLURM_NODES=3, the default)")


def step_processes(slurm: SlurmCluster, job_id: str, node: str) -> dict[int, str]:
    """pid -> start ticks of the job's step 0 processes on ``node`` (its slurmd's view)."""
    found: dict[int, str] = {}
    for line in slurm.on_node(node, "scontrol", "listpids", f"{job_id}.0").splitlines():
        parts = line.split()
        if parts and parts[0].isdigit():
            start = start_ticks(int(parts[0]))
            if start:
                found[int(parts[0])] = start
    return found


def start_ticks(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
    except (FileNotFoundError, ProcessLookupError):
        return ""


def alive(processes: dict[int, str]) -> dict[int, str]:
    return {pid: start for pid, start in processes.items() if start_ticks(pid) == start}


def node_state(slurm: SlurmCluster, node: str) -> str:
    return slurm.run("sinfo", "-h", "-N", "-n", node, "-o", "%T").strip()


def make(slurm: SlurmCluster, job_id: str, **kwargs: object) -> SlurmOrchestrator:
    return SlurmOrchestrator(
        job_id=job_id,
        fault="KillNode",
        clock=RealClock(),
        env=slurm.env,
        poll_interval=0.5,
        **kwargs,  # type: ignore[arg-type]
    )


def discover_per_node(
    slurm: SlurmCluster, tmp_path: Path, **kwargs: object
) -> tuple[str, SlurmOrchestrator, Worker, dict[str, dict[int, str]]]:
    job = slurm.submit(PER_NODE, "-N2", workdir=tmp_path)
    orch = make(slurm, job, **kwargs)
    workload = orch.discover(deadline(JOB))
    target = workload.by_rank(1)
    assert target is not None
    other = workload.by_rank(0)
    assert other is not None and other.node != target.node, "one task per node"
    procs = {node: step_processes(slurm, job, node) for node in (target.node, other.node)}
    assert all(len(p) == 3 for p in procs.values()), procs
    return job, orch, target, procs


def test_each_node_is_its_own_host(slurm: SlurmCluster) -> None:
    out = slurm.run("srun", "-N2", "-n2", "sh", "-c", "echo $(hostname) $SLURMD_NODENAME")
    rows = sorted(line.split() for line in out.splitlines())
    assert len(rows) == 2 and all(len(r) == 2 and r[0] == r[1] for r in rows), rows
    placed = [r[0] for r in rows]
    assert len(set(placed)) == 2 and set(placed) <= set(slurm.nodes), (placed, slurm.nodes)
    for node in placed:
        addresses = slurm.on_node(node, "ip", "-4", "-o", "addr", "show", "eth0")
        address = addresses.split()[3].split("/")[0]
        assert f"{address} {node}" in (slurm.folder / "etc/hosts").read_text()
        # A lookup the hosts file cannot answer fails at once (torch's reverse lookup of a
        # v4-mapped address waited 10.7 s for the machine's unreachable nameserver).
        started = time.monotonic()
        out = slurm.on_node(node, sys.executable, "-c", LOOKUP.format(address=address))
        assert time.monotonic() - started < 3 * within(QUIET), out  # not the resolver's 10 s
        assert out.split() == [node, "failed"], out


LOOKUP = """
import socket
print(socket.gethostbyaddr("{address}")[0])
try:
    socket.getnameinfo(("::ffff:{address}", 80, 0, 0), 0)
    print("answered")
except OSError:
    print("failed")
"""


def test_killnode_kills_every_process_of_the_node_and_none_of_the_other(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    _job, orch, target, procs = discover_per_node(slurm, tmp_path)
    try:
        victim, survivor = target.node, next(n for n in procs if n != target.node)
        result = orch.kill(target, dry_run=False, fault=Fault("KillNode"))
        assert result.outcome is KillOutcome.KILLED, result.detail
        assert f"on node {victim}: 3 processes" in result.detail
        eventually(lambda: alive(procs[victim]) == {}, "every process of the killed node gone")
        assert alive(procs[survivor]) == procs[survivor], "the other node is untouched"
        again = orch.kill(target, dry_run=False, fault=Fault("KillNode"))
        assert again.outcome is KillOutcome.ALREADY_GONE, again.detail
        assert alive(procs[survivor]) == procs[survivor]
    finally:
        orch.cleanup()


def test_a_dry_run_killnode_names_the_processes_and_touches_nothing(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    _job, orch, target, procs = discover_per_node(slurm, tmp_path)
    try:
        result = orch.kill(target, dry_run=True, fault=Fault("KillNode"))
        assert result.outcome is KillOutcome.DRY_RUN, result.detail
        for pid in procs[target.node]:
            assert str(pid) in result.detail
        stays(lambda: all(alive(p) == p for p in procs.values()), "nothing killed", QUIET)
        stale = Worker(
            rank=1,
            name=target.name,
            instance_id=target.instance_id.rsplit("@", 1)[0] + "@1",
            node=target.node,
            details=target.details,
        )
        gone = orch.kill(stale, dry_run=False, fault=Fault("KillNode"))
        assert gone.outcome is KillOutcome.ALREADY_GONE, gone.detail
        assert all(alive(p) == p for p in procs.values())
    finally:
        orch.cleanup()


def test_drain_node_drains_the_killed_node_and_cleanup_resumes_it(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    _job, orch, target, procs = discover_per_node(slurm, tmp_path, drain_node=True)
    try:
        result = orch.kill(target, dry_run=False, fault=Fault("KillNode"))
        assert result.outcome is KillOutcome.KILLED, result.detail
        assert f"node {target.node} set DRAIN" in result.detail
        assert node_state(slurm, target.node).startswith("drain"), node_state(slurm, target.node)
        other = next(n for n in procs if n != target.node)
        assert not node_state(slurm, other).startswith("drain")
    finally:
        orch.cleanup()
    assert orch.resumed == [f"node {target.node} RESUMEd"]
    state = node_state(slurm, target.node)
    assert not state.startswith("drain"), state


def test_drain_node_without_operator_rights_is_refused_before_anything_is_touched(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    user = pwd.getpwnam("nobody")
    as_nobody = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    env = {**slurm.env, "HOME": "/tmp", "PYTHONPATH": str(ROOT)}
    # nobody needs to read this checkout and its venv: a clone in a private folder (mktemp
    # -d makes one 0700) cannot be tested so.

    def run_as_nobody(code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*as_nobody, sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=within(JOB),
            check=False,
            cwd="/",
        )

    probe = run_as_nobody("import pytest_recoverygate.orchestrators.slurm")
    if probe.returncode != 0:
        pytest.skip(
            f"user nobody cannot import the package from {ROOT} (a folder on the way is "
            f"private; clone to a world-readable folder to run this): {probe.stderr[-300:]}"
        )
    job = slurm.submit(PER_NODE, "-N2", workdir=tmp_path)
    eventually(lambda: slurm.job_field(job, "JobState") == "RUNNING", f"job {job} running", JOB)
    placed = slurm.run("scontrol", "show", "hostnames", slurm.job_field(job, "NodeList")).split()
    before: dict[str, dict[int, str]] = {}

    def three_each() -> bool:
        before.update({node: step_processes(slurm, job, node) for node in placed})
        return all(len(p) == 3 for p in before.values())

    eventually(three_each, "three processes of the step on each node", seen=lambda: before)
    code = (
        "import sys, time\n"
        "from pytest_recoverygate.registry.seams import RealClock\n"
        "from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator\n"
        f"o = SlurmOrchestrator(job_id={job}, fault='KillNode', drain_node=True, "
        "clock=RealClock())\n"
        "try:\n"
        f"    o.discover(time.time() + {within(PROCESS)})\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    proc = run_as_nobody(code)
    out = proc.stdout + proc.stderr
    assert PermissionDeniedError.__name__ in out, out
    assert "needs Slurm operator rights (root or SlurmUser root); this drill runs as nobody" in out
    for node in slurm.nodes:
        assert not node_state(slurm, node).startswith("drain")
    assert all(alive(p) == p and len(p) == 3 for p in before.values()), "nothing was touched"
