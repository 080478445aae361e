"""The Orchestrator contract suite's harness for the Ray backend
(tests/contract/harness.py): examples/ray/train_ray.py on a Ray cluster its driver
starts (2 CPUs); workers are checked in ``/proc`` by pid + start ticks, replacements
found in Train's state as the dashboard serves it (the raw JSON, not the orchestrator's
reading of it)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from pytest_recoverygate.engine.model import Worker
from pytest_recoverygate.registry.seams import Orchestrator, RealClock
from pytest_recoverygate.shared.procs import JobLaunch
from tests.contract.harness import Harness, ThreadSpy, proc_stat
from tests.patience import CLUSTER, PROMPT, deadline, within

__all__ = ["build_ray"]


def build_ray(purpose: str, label: str, tmp: Path, spy: ThreadSpy) -> Harness:
    import json
    import sys
    import urllib.request

    from pytest_recoverygate.orchestrators.ray.orchestrator import RayOrchestrator

    examples = Path(__file__).resolve().parents[2] / "examples" / "ray"
    clock = RealClock()
    stack = contextlib.ExitStack()
    with spy.labelled(label):
        orchestrator = RayOrchestrator(
            JobLaunch(
                [sys.executable, "train_ray.py", "--steps=100000", "--ckpt-every=50"],
                examples,
                {"RECOVERYGATE_AUTO": "1"},
            ),
            address=None,
            submission_id=None,
            clock=clock,
        )
        stack.callback(orchestrator.cleanup)
        conforming: Orchestrator = orchestrator  # the static check (mypy)
        try:
            workload = conforming.discover(deadline(CLUSTER))
        except BaseException:
            stack.close()
            raise
    dashboard, token = orchestrator._cluster.dashboard, orchestrator._cluster.token

    def ticks(pid: int) -> str | None:
        stat = proc_stat(pid)
        return stat[19] if stat is not None and stat[0] != "Z" else None

    def alive(worker: Worker) -> bool:
        head, _, start = worker.instance_id.partition("@")
        pid = head.rpartition(":")[2]
        return pid.isdigit() and ticks(int(pid)) == start

    def current(rank: int) -> Worker | None:
        """The rank's worker in the newest attempt of the newest run, when it runs."""
        request = urllib.request.Request(
            f"{dashboard}/api/train/v2/runs/v1", headers={"Authorization": f"Bearer {token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=within(PROMPT)) as answer:
                runs = json.loads(answer.read())["train_runs"]
        except OSError:
            return None
        if not runs:
            return None
        run = max(runs, key=lambda r: r["start_time_ns"])
        attempts = sorted(run["attempts"], key=lambda a: a["start_time_ns"])
        if not attempts or attempts[-1]["status"] != "RUNNING":
            return None
        for w in attempts[-1]["workers"]:
            start = ticks(int(w["pid"]))
            if w["world_rank"] == rank and w.get("status") == "ALIVE" and start is not None:
                return Worker(rank, f"pid {w['pid']}", f"{w['actor_id']}:{w['pid']}@{start}")
        return None

    def stale_id(worker: Worker) -> str:
        head, _, start = worker.instance_id.partition("@")
        return f"{head}@{int(start) - 100}"

    return Harness(
        kind="ray",
        label=label,
        orchestrator=orchestrator,
        clock=clock,
        workload=workload,
        alive=alive,
        current=current,
        stale_id=stale_id,
        pause=time.sleep,
        patience=CLUSTER,
        exit_stack=stack,
    )
