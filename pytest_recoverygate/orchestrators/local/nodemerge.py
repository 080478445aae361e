"""Every node's group events and output merged into the multi-node job's: a killed node's
end left out, a bad node's end as the node leaving, success once every live node's agent
ended well, each label prefixed by its node."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING

import psutil

from pytest_recoverygate.engine import model
from pytest_recoverygate.orchestrators.local.processes import Identity
from pytest_recoverygate.shared.joboutput import JobOutput, WorkerOutput

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.local.noderuns import NodeRun

__all__ = ["left_event", "merged_events", "merged_output", "world_size_of"]

_ENDS = (model.GroupEventKind.JOB_FAILED, model.GroupEventKind.JOB_SUCCEEDED)


def merged_events(runs: list[NodeRun], succeeded: set[int]) -> list[model.GroupEvent]:
    """Every live node's new group events, the killed nodes' own end left out.

    ``succeeded`` holds (by ``id``) the runs whose agent ended well so far, across calls.
    """
    out: list[model.GroupEvent] = []
    for run in runs:
        for seen in run.orch.watch_group():
            if run.killed:
                continue  # the node we killed: its end is NODE_GONE, not the job's
            if run.bad is not None and seen.kind in _ENDS:
                run.left = True  # the bad node's agent ended: the node left the job
                out.append(left_event(run, seen))
                continue
            event = seen
            if seen.kind is model.GroupEventKind.REPLACEMENT_RUNNING:
                event = dataclasses.replace(seen, world_size=world_size_of(run))
            if seen.worker is not None:
                event = dataclasses.replace(
                    seen, worker=dataclasses.replace(seen.worker, node=run.net.hostname)
                )
            if event.kind is model.GroupEventKind.JOB_SUCCEEDED:
                succeeded.add(id(run))
                live = [r for r in runs if not r.killed and not r.left]
                if any(id(r) not in succeeded for r in live):
                    continue  # the job ends when every live node's agent ended well
            out.append(dataclasses.replace(event, detail=f"{run.net.hostname}: {event.detail}"))
    return out


def world_size_of(run: NodeRun) -> int | None:
    """The WORLD_SIZE torchrun gave the node's newest workers (None: unreadable)."""
    for worker in run.orch.current_workers():
        identity = Identity.parse(worker.instance_id)
        proc = identity.process() if identity is not None else None
        if proc is None:
            continue
        with contextlib.suppress(psutil.Error, KeyError, ValueError):
            return int(proc.environ()["WORLD_SIZE"])
    return None


def left_event(run: NodeRun, end: model.GroupEvent) -> model.GroupEvent:
    """The bad node's agent ended (``end``): the node left the job."""
    how = "with success" if end.kind is model.GroupEventKind.JOB_SUCCEEDED else end.detail
    return model.GroupEvent(
        model.GroupEventKind.NODE_GONE,
        end.timestamp,
        f"{run.net.hostname} left the job: its agent ended ({how}); nothing more is "
        "placed on the bad node",
    )


def merged_output(runs: list[NodeRun], drill_id: str) -> JobOutput:
    """Every node's output, its labels prefixed by the node (``node1 rank 2``)."""
    workers: list[WorkerOutput] = []
    failing: str | None = None
    for run in runs:
        prefix = run.net.netns.removeprefix(f"rg{drill_id}-")  # n1, n1-r1
        output = run.orch.job_output()
        for worker in output.workers:
            workers.append(dataclasses.replace(worker, label=f"{prefix} {worker.label}"))
        if output.failing is not None and not run.killed:
            failing = f"{prefix} {output.failing}"
    return JobOutput(
        tuple(workers),
        failing,
        "each node's torchrun output (its agent's stream, and each rank's prefixed lines)",
    )
