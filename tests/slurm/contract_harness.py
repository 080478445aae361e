"""The Orchestrator contract suite's harness for the Slurm backend
(tests/contract/harness.py): jobs on the cluster of tests/slurm (its session fixture);
ranks are checked in ``/proc`` by pid + start ticks, replacements found with ``scontrol
listpids``."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_recoverygate.engine.model import Worker
from pytest_recoverygate.registry.seams import Orchestrator, RealClock
from tests.contract.harness import Harness, ThreadSpy, proc_environ, proc_stat
from tests.patience import JOB, deadline

if TYPE_CHECKING:
    from tests.slurm.slurm_testcluster import SlurmCluster

__all__ = ["SLURM_DISPOSABLE", "SLURM_SHARED", "build_slurm"]

SLURM_SHARED = (  # prints one RECOVERYGATE/v1 line, then two ranks that do nothing
    "#!/bin/bash\n"
    "python3 -c 'from recoverygate import reporter; reporter.checkpoint_completed(10)'\n"
    "srun --overcommit -n2 sleep 600\n"
)
SLURM_DISPOSABLE = (  # torchrun restarts the killed rank inside the step: a replacement
    "#!/bin/bash\n"
    "srun -n1 torchrun --standalone --nproc-per-node=2 --max-restarts=2 --monitor-interval=0.2 "
    "--no-python sleep 600\n"
)


def build_slurm(
    purpose: str, label: str, tmp: Path, spy: ThreadSpy, cluster: SlurmCluster
) -> Harness:
    from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator

    script = SLURM_SHARED if purpose == "shared" else SLURM_DISPOSABLE
    args: tuple[str, ...] = ("-n2",) if purpose == "shared" else ("-n1",)
    if purpose == "shared" and len(cluster.nodes) > 1:
        # one rank per node: the node seam's checks run on the shared job
        script = script.replace(
            "srun --overcommit -n2", "srun --overcommit -N2 --ntasks-per-node=1"
        )
        args = ("-N2", "--ntasks-per-node=1")
    # --overcommit and --oversubscribe: both jobs fit the 2-CPU node at once.
    job_id = cluster.submit(script, *args, "--overcommit", "--oversubscribe", workdir=tmp)
    clock = RealClock()
    stack = contextlib.ExitStack()
    stack.callback(lambda: cluster.run("scancel", job_id, check=False))
    try:
        with spy.labelled(label):
            orchestrator = SlurmOrchestrator(
                job_id=job_id, clock=clock, env=cluster.env, poll_interval=0.5
            )
            stack.callback(orchestrator.cleanup)
            conforming: Orchestrator = orchestrator  # the static check (mypy)
            workload = conforming.discover(deadline(JOB))
    except BaseException:
        stack.close()
        raise

    def alive(worker: Worker) -> bool:
        pid, _, start = worker.instance_id.rpartition("/")[2].partition("@")
        stat = proc_stat(int(pid)) if pid.isdigit() else None
        return stat is not None and stat[0] != "Z" and stat[19] == start

    def current(rank: int) -> Worker | None:
        """The job's live process that is rank ``rank`` (its RANK, else its task id)."""
        listing = cluster.listpids(job_id)
        rows = []
        for line in listing.splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[0].isdigit() and parts[2].isdigit():
                env = proc_environ(int(parts[0]))
                rows.append((int(parts[0]), parts[2], parts[4], env.get("RANK")))
        by_rank_env = any(r[3] is not None for r in rows)
        pids = {r[0] for r in rows}
        for pid, step, global_id, rank_env in rows:
            own = rank_env if by_rank_env else global_id
            if own != str(rank):
                continue
            stat = proc_stat(pid)
            if stat is None or stat[0] == "Z":
                continue
            parent = int(stat[1])
            if by_rank_env and parent in pids and proc_environ(parent).get("RANK"):
                continue  # a rank's own child
            return Worker(rank, f"{job_id}.{step} rank {rank}", f"{job_id}.{step}/{pid}@{stat[19]}")
        return None

    def stale_id(worker: Worker) -> str:
        head, _, start = worker.instance_id.rpartition("@")
        return f"{head}@{int(start) - 1}"

    return Harness(
        kind="slurm",
        label=label,
        orchestrator=orchestrator,
        clock=clock,
        workload=workload,
        alive=alive,
        current=current,
        stale_id=stale_id,
        pause=time.sleep,
        patience=JOB,
        exit_stack=stack,
    )
