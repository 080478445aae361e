"""The kills, one function per fault: one signal to exactly one worker instance
(``KillWorker``, ``KillDuringCheckpoint``, ``Preempt``, ``HangWorker``), or ``KillNode``'s
SIGKILL to a node's raylet; each from a task pinned to the node, after the guard vouched
for it, never retried.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError
from pytest_recoverygate.orchestrators.ray.cluster import HELPER_TIMEOUT
from pytest_recoverygate.orchestrators.ray.workers import identity

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.ray.guard import Ask, WorkerGuard
    from pytest_recoverygate.orchestrators.ray.signals import WorkerSignals
    from pytest_recoverygate.orchestrators.ray.state import TrainRun
    from pytest_recoverygate.orchestrators.ray.watch import GroupWatch
    from pytest_recoverygate.registry.seams import Clock

__all__ = ["SIGNAL_OF", "kill_node", "kill_worker"]

#: The signal of each fault (the others: SIGKILL).
SIGNAL_OF = {"Preempt": "TERM", "HangWorker": "STOP"}


def kill_worker(
    worker: model.Worker,
    run: TrainRun | None,
    *,
    guard: WorkerGuard,
    signals: WorkerSignals,
    watch: GroupWatch,
    clock: Clock,
    dry_run: bool,
    fault: model.Fault,
) -> model.KillResult:
    """One signal to exactly that instance of ``run``'s current attempt, by the fault's
    signal (:meth:`.orchestrator.RayOrchestrator.kill`); never retried."""
    sig = SIGNAL_OF.get(fault.type, "KILL")
    actor_id, pid, ticks = identity(worker.instance_id)
    current = run.current if run is not None else None
    found = next((w for w in (current.workers if current else ()) if w.actor_id == actor_id), None)
    if found is None or not found.alive or found.pid != pid:
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE,
            clock.now(),
            f"{worker.describe()} is no longer a live worker of the run; nothing was touched",
        )
    target = guard.target(found, ticks)  # BackendError: refused, nothing sent
    if target is None:
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE,
            clock.now(),
            f"the GCS lists {worker.describe()} as gone; nothing was touched",
        )
    if dry_run:
        return model.KillResult(
            model.KillOutcome.DRY_RUN,
            clock.now(),
            f"would send SIG{sig} to pid {pid} (actor {actor_id}, node "
            f"{found.node_id[:12]}); nothing was sent",
        )
    before = clock.now()
    watch.killing(actor_id)  # before the signal: the watcher may look before the task answers
    try:
        result = signals.stop(target) if sig == "STOP" else signals.send(target, sig)
    except BackendError as exc:
        return model.KillResult(
            model.KillOutcome.UNCONFIRMED,
            before,
            f"the task sending SIG{sig} to pid {pid} did not answer ({exc}); not retried",
        )
    if result.get("outcome") != "killed":
        watch.spared(actor_id)  # nothing was sent: its death is not ours
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE, clock.now(), str(result.get("detail", "gone"))
        )
    by = str(result.get("by", "a task on its node"))
    detail = f"SIG{sig} sent to pid {pid} (actor {actor_id}, node {found.node_id[:12]}) by {by}"
    if sig == "TERM":
        exact = dataclasses.replace(target, ticks=str(result.get("ticks") or target.ticks))
        signals.escalate_later(exact, fault.grace_period)
        detail += f"; SIGKILL after {fault.grace_period:g}s if that same instance still runs"
    elif sig == "STOP":
        detail += "; cleanup sends SIGCONT to that same instance first"
    return model.KillResult(model.KillOutcome.KILLED, float(result.get("at", before)), detail)


def kill_node(
    node: model.Node,
    run: TrainRun | None,
    *,
    guard: WorkerGuard,
    ask: Ask,
    watch: GroupWatch,
    clock: Clock,
    dry_run: bool,
) -> model.KillResult:
    """``KillNode``: SIGKILL the node's raylet from a task pinned to it, when ``run``'s
    current attempt has a live worker there; never the head, never retried."""
    current = run.current if run is not None else None
    live = [
        w for w in (current.workers if current else ()) if w.node_id == node.identity and w.alive
    ]
    if not live:
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE,
            clock.now(),
            f"{node.describe()} runs no live worker of the run now; nothing was touched",
        )
    # Only a node hosting a worker the GCS vouches for, never the head (BackendError)
    guard.check_node(node.identity, live)
    if dry_run:
        return model.KillResult(
            model.KillOutcome.DRY_RUN,
            clock.now(),
            f"would SIGKILL the raylet of {node.describe()} from a task pinned to it",
        )
    before = clock.now()
    watch.killing_node(node.identity)
    try:
        result = ask({"op": "raylet", "node": node.identity}, HELPER_TIMEOUT)
    except BackendError as exc:
        return model.KillResult(
            model.KillOutcome.UNCONFIRMED,
            before,
            f"the raylet kill task did not answer ({exc})",
        )
    if result.get("outcome") != "killed":
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE, clock.now(), str(result.get("detail", "gone"))
        )
    return model.KillResult(
        model.KillOutcome.KILLED,
        float(result.get("at", before)),
        f"SIGKILL sent to the raylet of {node.describe()} by a task on that node "
        f"({result.get('detail', '')})",
    )
