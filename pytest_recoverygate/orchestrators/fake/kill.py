"""The faults on the simulated job, one function per fault: a rank killed
(``KillWorker``, ``KillDuringCheckpoint``: a save in flight torn), preempted (``Preempt``)
or stopped (``HangWorker``); a node killed (``KillNode``) or cut off
(``PartitionNode``), and its link restored."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_recoverygate.engine.model import (
    Fault,
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    Node,
    Worker,
)
from pytest_recoverygate.orchestrators.fake.lines import generate, step_at
from pytest_recoverygate.orchestrators.fake.restart import after_kill
from pytest_recoverygate.orchestrators.fake.world import current, workload

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.fake.job import Incarnation
    from pytest_recoverygate.orchestrators.fake.orchestrator import FakeOrchestrator

__all__ = [
    "hang",
    "kill",
    "kill_every_rank",
    "kill_node",
    "kill_worker",
    "partition_node",
    "preempt",
    "restore_node",
    "tear",
]


# ------------------------------------------------------------------ one rank


def kill_worker(
    job: FakeOrchestrator, worker: Worker, *, dry_run: bool, fault: Fault
) -> KillResult:
    """``fault`` on ``worker``, by identity, once (see :meth:`FakeOrchestrator.kill`)."""
    job.kills.append((worker, dry_run))
    job.faults.append(fault)
    now = job.clock.now()
    generate(job)
    inc = current(job)
    alive = inc is not None and inc.killed_at is None
    if not alive or worker.instance_id not in {w.instance_id for w in workload(job).workers}:
        return KillResult(KillOutcome.ALREADY_GONE, now, f"{worker.instance_id} is not running")
    if job.kill_outcome is not None:
        return KillResult(job.kill_outcome, now, "forced by the fake backend")
    if dry_run:
        return KillResult(KillOutcome.DRY_RUN, now, f"would kill {worker.describe()}")
    assert inc is not None
    if fault.type == "Preempt":
        return preempt(job, inc, worker, now, fault.grace_period)
    if fault.type == "HangWorker":
        return hang(job, inc, worker, now)
    return kill(job, inc, worker, now)


def kill(job: FakeOrchestrator, inc: Incarnation, worker: Worker, now: float) -> KillResult:
    """``KillWorker`` and ``KillDuringCheckpoint``: SIGKILL (a save in flight is torn)."""
    inc.killed_at = now
    job._dead.add(worker.instance_id)
    tear(job, inc, now)
    after_kill(job, now, worker)
    return KillResult(KillOutcome.KILLED, now, f"killed {worker.describe()}")


def hang(job: FakeOrchestrator, inc: Incarnation, worker: Worker, now: float) -> KillResult:
    """``HangWorker``: the rank stops; the others notice after ``hang_timeout``."""
    inc.killed_at = now  # stopped: it prints nothing more
    after_kill(job, now + job.hang_timeout, worker, how="hung (SIGSTOP)")
    return KillResult(KillOutcome.KILLED, now, f"stopped {worker.describe()}")


def preempt(
    job: FakeOrchestrator, inc: Incarnation, worker: Worker, now: float, grace: float
) -> KillResult:
    """``Preempt``: SIGTERM; a job that ``saves_on_sigterm`` saves and exits within
    ``grace``, any other dies at the SIGKILL after it."""
    if job.saves_on_sigterm:
        step = max(inc.next_step - 1, inc.resume_step)
        done = now + max(job.save_time, 0.05)
        if done <= now + grace:
            inc.final_save = (step, done)
            job._checkpoints.append(step)  # durable before the replacement starts
            inc.killed_at = done
            after_kill(job, done, worker, how="exited after saving on SIGTERM")
            return KillResult(KillOutcome.KILLED, now, f"SIGTERM to {worker.describe()}")
    inc.killed_at = now + grace
    after_kill(job, now + grace, worker, how="killed by SIGKILL after the grace period")
    return KillResult(
        KillOutcome.KILLED, now, f"SIGTERM to {worker.describe()}; SIGKILL after {grace:g}s"
    )


def tear(job: FakeOrchestrator, inc: Incarnation, now: float) -> None:
    """A kill during a save: that checkpoint never completes (and may be left torn)."""
    for step in (inc.next_step, inc.next_step - 1):  # the save in flight, if any
        if step > 0 and step % job.checkpoint_every == 0:
            started = (
                step_at(
                    inc,
                    step,
                    checkpoint_every=job.checkpoint_every,
                    steps_per_second=job.steps_per_second,
                    save_time=job.save_time,
                )
                + 1e-4
            )
            if started <= now < started + job.save_time and not job.atomic_saves:
                job._torn = step


# ------------------------------------------------------------------ one node


def kill_node(job: FakeOrchestrator, node: Node, *, dry_run: bool, fault: Fault) -> KillResult:
    """``fault`` on every rank of ``node``, by identity, once (``KillNode``,
    ``PartitionNode``)."""
    job.faults.append(fault)
    for worker in node.workers:
        job.kills.append((worker, dry_run))
    now = job.clock.now()
    generate(job)
    inc = current(job)
    live = workload(job).node(node.index)
    if (
        inc is None
        or inc.killed_at is not None
        or live is None
        or live.identity != node.identity
        or not {w.instance_id for w in node.workers} <= {w.instance_id for w in live.workers}
    ):
        return KillResult(
            KillOutcome.ALREADY_GONE, now, f"{node.describe()} is not the node running now"
        )
    if job.kill_outcome is not None:
        return KillResult(job.kill_outcome, now, "forced by the fake backend")
    verb = "cut the link of" if fault.type == "PartitionNode" else "kill every rank of"
    if dry_run:
        return KillResult(KillOutcome.DRY_RUN, now, f"would {verb} {node.describe()}")
    if fault.type == "PartitionNode":
        return partition_node(job, inc, node, now)
    return kill_every_rank(job, inc, node, now, replace=fault.replace)


def partition_node(job: FakeOrchestrator, inc: Incarnation, node: Node, now: float) -> KillResult:
    """``PartitionNode``: the group stalls; the ranks notice after ``hang_timeout``."""
    inc.killed_at = now  # the group stalls in a collective with the cut node
    noticed = now + job.hang_timeout
    job._partition = (node.index, now, noticed)
    gone = node.workers[0] if node.workers else None
    job._group_events += [
        GroupEvent(
            GroupEventKind.WORKER_GONE,
            noticed,
            f"a collective timed out after {job.hang_timeout:g}s (the link of {node.name} is cut)",
            gone,
        ),
        GroupEvent(GroupEventKind.RESTARTING, noticed + 0.05, "re-rendezvous", None),
    ]
    return KillResult(KillOutcome.KILLED, now, f"cut the link of {node.describe()}")


def kill_every_rank(
    job: FakeOrchestrator, inc: Incarnation, node: Node, now: float, *, replace: bool
) -> KillResult:
    """``KillNode``: every rank of ``node`` ends; with ``replace`` a replacement node
    starts, without the group goes on with fewer nodes (``elastic``) or fails."""
    inc.killed_at = now
    job._dead.update(w.instance_id for w in node.workers)
    tear(job, inc, now)
    job._group_events.append(
        GroupEvent(
            GroupEventKind.NODE_GONE,
            now + 0.05,
            f"every process of {node.name} is gone ({len(node.workers)} rank(s))",
            node.workers[0] if node.workers else None,
        )
    )
    if replace:
        job._generation[node.index] += 1
        job._group_events.append(
            GroupEvent(
                GroupEventKind.NODE_REPLACEMENT_STARTED,
                now + job.restart_delay / 2,
                f"replacement node fake-node-{node.index}@{job._generation[node.index]}",
            )
        )
    elif job.elastic:
        job._nodes.remove(node.index)
        job.workers = job.per_node * len(job._nodes)
    else:
        job._group_events.append(
            GroupEvent(
                GroupEventKind.JOB_FAILED,
                now + job.restart_delay,
                f"the rendezvous never got {len(job._nodes)} nodes back (not elastic)",
            )
        )
        return KillResult(KillOutcome.KILLED, now, f"killed every rank of {node.describe()}")
    victim = node.workers[0] if node.workers else workload(job).workers[0]
    after_kill(job, now, victim, how=f"died with its node {node.name}")
    return KillResult(KillOutcome.KILLED, now, f"killed every rank of {node.describe()}")


def restore_node(job: FakeOrchestrator, node: Node) -> KillResult:
    """The link of a cut node back: a stall nobody noticed yet just ends; after a
    timeout the agents re-rendezvous and the group restarts."""
    job.restores.append(node)
    now = job.clock.now()
    partition = job._partition
    if partition is None or partition[0] != node.index:
        return KillResult(KillOutcome.ALREADY_GONE, now, f"{node.name} is not cut off")
    job._partition = None
    index, cut, noticed = partition
    job._group_events.append(
        GroupEvent(GroupEventKind.NODE_RESTORED, now, f"the link of {node.name} is back")
    )
    inc = current(job)
    assert inc is not None
    if now < noticed:  # nobody timed out yet: the stalled collective just finishes
        job._group_events = [e for e in job._group_events if e.timestamp < noticed]
        inc.killed_at = None
        inc.first_step_at += now - cut
        return KillResult(KillOutcome.KILLED, now, f"restored the link of {node.name}")
    victim = workload(job).node(index)
    worker = victim.workers[0] if victim and victim.workers else workload(job).workers[0]
    after_kill(job, now, worker, how="rejoined after the partition", gone=False)
    return KillResult(KillOutcome.KILLED, now, f"restored the link of {node.name}")
