"""A real Slurm cluster, brought up once per test session and shared by every folder.

The cluster is scripts/slurm-cluster's: slurmctld + munged + one slurmd per node under one
temporary folder, reached through SLURM_CONF. By default it has three nodes (node1..node3),
each slurmd in its own network, UTS and mount namespace (``up --nodes 3``), so jobs are
spread over nodes as on a real cluster and a two-node job has a spare node to be requeued
onto off a drained one (the third slurmd adds about 0.3 s to ``up``);
RECOVERYGATE_SLURM_NODES=2 runs two nodes, RECOVERYGATE_SLURM_NODES=1 the one-node
cluster on loopback. Tests that need it skip with the reason when Slurm is not
installed here (CI installs it). Set RECOVERYGATE_SLURM_CLUSTER=DIR to reuse a cluster
that is already up (``scripts/slurm-cluster up [--nodes N] DIR``) instead.

``slurm_one_node`` is a one-node cluster whichever the session's is (its own, beside a
session cluster of several nodes): the StorageFault drills need the slurmd, and so the
job, in the drill's mount namespace.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.patience import JOB, within
from tests.slurm.slurm_testcluster import SlurmCluster

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm-cluster"
VENV_BIN = ROOT / ".venv" / "bin"


def _slurm_missing() -> str | None:
    for binary in ("slurmctld", "slurmd", "munged"):
        if shutil.which(binary) is None and not Path("/usr/sbin", binary).exists():
            return (
                f"Slurm is not installed here ({binary} not found); "
                "run 'scripts/slurm-cluster install' (CI does)"
            )
    if os.geteuid() != 0:
        return "the test cluster runs its daemons as root (and makes namespaces); run the slurm tests as root"
    return None


@contextlib.contextmanager
def slurm_up(nodes: str, reuse: str | None = None) -> Iterator[SlurmCluster]:
    """A cluster of ``nodes`` nodes (scripts/slurm-cluster ``up``), ``down`` afterwards;
    with ``reuse``, the cluster already up in that folder, left up."""
    # Not under pytest's basetemp (mode 0700): as on a real cluster, every user can read
    # slurm.conf and reach munge's socket (the drainNode test runs a drill as nobody).
    folder = Path(reuse) if reuse else Path(tempfile.mkdtemp(prefix="recoverygate-slurm-"))
    if not reuse:
        folder.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env["SLURM_CONF"] = str(folder / "etc" / "slurm.conf")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "reporter")])
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    if not reuse:
        # Two sessions starting at once (two engineers, CI and a developer) can pick the
        # same free port pair for slurmctld; the loser's up fails and cleans up after
        # itself, and a second up picks the next free pair.
        for attempt in (1, 2):
            try:
                proc = subprocess.run(
                    [str(SCRIPT), "up", "--nodes", nodes, str(folder)],
                    capture_output=True,
                    text=True,
                    timeout=within(JOB),
                    check=False,
                )
                failed = proc.stderr if proc.returncode != 0 else None
            except subprocess.TimeoutExpired as exc:  # SIGKILLed: its own clean-up never ran
                failed = f"it did not finish within {exc.timeout:.0f} s: {exc.stderr!r}"
            if failed is None:
                break
            subprocess.run(
                [str(SCRIPT), "down", str(folder)],
                capture_output=True,
                timeout=within(JOB),
                check=False,
            )
            if attempt == 2:
                shutil.rmtree(folder, ignore_errors=True)
                pytest.fail(f"scripts/slurm-cluster up failed twice:\n{failed}")
    cluster = SlurmCluster(folder=folder, conf=env["SLURM_CONF"], env=env)
    if len(cluster.nodes) > 1:
        # Every node's namespace has eth0 on the bridge: gloo reaches the other nodes over
        # it, and a job whose tasks Slurm spreads over two nodes still trains.
        env["GLOO_SOCKET_IFNAME"] = "eth0"
    try:
        yield cluster
    finally:
        cluster.cancel_all()
        if not reuse:
            subprocess.run(
                [str(SCRIPT), "down", str(folder)],
                capture_output=True,
                timeout=within(JOB),
                check=False,
            )
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    reason = _slurm_missing()
    if reason:
        pytest.skip(reason)
    nodes = os.environ.get("RECOVERYGATE_SLURM_NODES", "3")
    with slurm_up(nodes, os.environ.get("RECOVERYGATE_SLURM_CLUSTER")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_one_node(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """A one-node cluster, whose slurmd runs in the host's namespaces (a mount made here
    is seen by its jobs): the session cluster when it has one node, else one of its own
    (about 0.3 s to bring up), beside it."""
    if slurm_cluster.nodes == ["localhost"]:
        yield slurm_cluster
        return
    with slurm_up("1") as cluster:
        yield cluster
