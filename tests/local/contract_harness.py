"""The Orchestrator contract suite's harnesses for the local backend
(tests/contract/harness.py): real torchrun with examples/local/train.py (built as
tests/local/test_local_orchestrator builds it), and two real network namespaces each
running the torchrun stand-in (two ranks a node); processes are checked with psutil by
pid + start time."""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

import psutil
import pytest

from pytest_recoverygate.engine.model import Worker
from pytest_recoverygate.orchestrators.local.processes import Identity
from pytest_recoverygate.registry.seams import Orchestrator, RealClock
from pytest_recoverygate.shared.procs import JobLaunch
from tests.contract.harness import Harness, ThreadSpy, process_alive
from tests.patience import JOB, deadline

__all__ = ["build_local", "build_local_nodes"]


def build_local(purpose: str, label: str, tmp: Path, spy: ThreadSpy) -> Harness:
    from pytest_recoverygate.orchestrators.local import LocalOrchestrator
    from tests.local.test_local_orchestrator import job_env, torchrun

    clock = RealClock()
    harness_stack = contextlib.ExitStack()
    with spy.labelled(label):
        orchestrator = LocalOrchestrator(
            JobLaunch(torchrun(tmp, max_restarts=3), tmp, job_env()), clock=clock
        )
        harness_stack.callback(orchestrator.cleanup)
        conforming: Orchestrator = orchestrator  # the static check (mypy)
        try:
            workload = conforming.discover(deadline(JOB))
        except BaseException:
            harness_stack.close()
            raise
    agent = psutil.Process(int(workload.workers[0].instance_id.split("@")[0])).ppid()

    def alive(worker: Worker) -> bool:
        pid, _, created = worker.instance_id.partition("@")
        return pid.isdigit() and process_alive(int(pid), created)

    def current(rank: int) -> Worker | None:
        """The agent's newest live child whose environment says RANK=rank."""
        best: psutil.Process | None = None
        try:
            children = psutil.Process(agent).children()
        except psutil.NoSuchProcess:
            return None
        for proc in children:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if proc.environ().get("RANK") != str(rank):
                    continue
                if best is None or proc.create_time() > best.create_time():
                    best = proc
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if best is None:
            return None
        try:
            return Worker(rank, f"pid {best.pid}", Identity.of(best).instance_id)
        except psutil.NoSuchProcess:
            return None

    def stale_id(worker: Worker) -> str:
        pid, _, created = worker.instance_id.partition("@")
        return f"{pid}@{float(created) - 60:.3f}"

    return Harness(
        kind="local",
        label=label,
        orchestrator=orchestrator,
        clock=clock,
        workload=workload,
        alive=alive,
        current=current,
        stale_id=stale_id,
        pause=time.sleep,
        patience=JOB,
        exit_stack=harness_stack,
    )


def build_local_nodes(purpose: str, label: str, tmp: Path, spy: ThreadSpy) -> Harness:
    """Two real network namespaces, each node running the torchrun stand-in (2 ranks)."""
    import sys

    from pytest_recoverygate.orchestrators.local.netns import missing_capabilities
    from pytest_recoverygate.orchestrators.local.nodes import LocalNodesOrchestrator

    if missing_capabilities():
        pytest.skip("local nodes need root: CAP_NET_ADMIN, CAP_SYS_ADMIN, ip")
    standin = Path(__file__).resolve().parents[1] / "reliability" / "standin_job.py"
    tag = uuid.uuid4().hex
    command = [sys.executable, str(standin), *(
        "--nproc 2 --node-rank {nodeRank} --ckpt {sharedDir}/ckpt{nodeRank} "
        "--ckpt-every 5 --step-time 0.02"
    ).split()]  # fmt: skip
    clock = RealClock()
    harness_stack = contextlib.ExitStack()
    with spy.labelled(label):
        job = JobLaunch(command, tmp, {"RG_CONTRACT_TAG": tag})
        orchestrator = LocalNodesOrchestrator(job, nodes=2, clock=clock)
        harness_stack.callback(orchestrator.cleanup)
        conforming: Orchestrator = orchestrator  # the static check (mypy)
        try:
            workload = conforming.discover(deadline(JOB))
        except BaseException:
            harness_stack.close()
            raise

    def alive(worker: Worker) -> bool:
        pid, _, created = worker.instance_id.partition("@")
        return pid.isdigit() and process_alive(int(pid), created)

    def current(rank: int) -> Worker | None:
        """The newest live process of this job (its tag) whose environment says RANK=rank."""
        best: psutil.Process | None = None
        for proc in psutil.process_iter():
            try:
                env = proc.environ()
                if env.get("RG_CONTRACT_TAG") != tag or env.get("RANK") != str(rank):
                    continue
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if best is None or proc.create_time() > best.create_time():
                    best = proc
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if best is None:
            return None
        try:
            return Worker(rank, f"pid {best.pid}", Identity.of(best).instance_id)
        except psutil.NoSuchProcess:
            return None

    def stale_id(worker: Worker) -> str:
        pid, _, created = worker.instance_id.partition("@")
        return f"{pid}@{float(created) - 60:.3f}"

    return Harness(
        kind="local",
        label=label,
        orchestrator=orchestrator,
        clock=clock,
        workload=workload,
        alive=alive,
        current=current,
        stale_id=stale_id,
        pause=time.sleep,
        patience=JOB,
        exit_stack=harness_stack,
    )
