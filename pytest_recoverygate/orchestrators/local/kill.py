"""One fault's signal to exactly one worker instance of the local job, through a pidfd and
never retried; Preempt's SIGKILL, after the grace period, to that same instance."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import PermissionDeniedError
from pytest_recoverygate.orchestrators.local.processes import (
    Identity,
    pidfd_open,
    signal_exactly,
)

if TYPE_CHECKING:
    from pytest_recoverygate.registry.seams import Clock

__all__ = ["Struck", "escalate_later", "kill_instance"]


@dataclass
class Struck:
    """What the drill's signals hit: the victim (the watcher names it first among the
    workers gone) and the instances a HangWorker stopped (cleanup continues them first)."""

    victim: Identity | None = None
    stopped: set[Identity] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_stopped(self) -> set[Identity]:
        """The stopped instances, forgotten here: whoever takes them continues them."""
        with self.lock:
            stopped, self.stopped = set(self.stopped), set()
        return stopped


def kill_instance(
    worker: model.Worker,
    *,
    dry_run: bool,
    fault: model.Fault,
    clock: Clock,
    struck: Struck,
    stop: threading.Event,
    threads: list[threading.Thread],
    on_signalled: Callable[[], None],
) -> model.KillResult:
    """Signal exactly the instance named by ``worker.instance_id``; never retried.

    KillWorker / KillDuringCheckpoint: SIGKILL. Preempt: SIGTERM now, and SIGKILL after
    the grace period to the same instance (its pidfd) if it still runs, unless ``stop``
    is set first (the escalation's thread joins ``threads``). HangWorker: SIGSTOP.
    ``on_signalled`` runs once the signal is sent.
    """
    sig = {"Preempt": signal.SIGTERM, "HangWorker": signal.SIGSTOP}.get(fault.type, signal.SIGKILL)
    identity = Identity.parse(worker.instance_id)
    if identity is None:
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE,
            clock.now(),
            f"{worker.instance_id!r} is not a pid@start_time instance id; nothing was touched",
        )
    pidfd = pidfd_open(identity.pid)
    try:
        # With a pidfd open, the identity check below holds for the signal too:
        # the fd pins this exact process even if its pid is recycled meanwhile.
        if identity.process() is None:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                clock.now(),
                f"{worker.describe()} no longer exists (pid gone or reused); nothing was touched",
            )
        if dry_run:
            try:
                os.kill(identity.pid, 0)
            except PermissionError as exc:
                raise PermissionDeniedError(
                    f"not allowed to signal {worker.describe()}: {exc}; run the drill as the "
                    "user that owns the job"
                ) from exc
            except ProcessLookupError:
                return model.KillResult(
                    model.KillOutcome.ALREADY_GONE, clock.now(), "exited just now"
                )
            return model.KillResult(
                model.KillOutcome.DRY_RUN,
                clock.now(),
                f"would send {sig.name} to pid {identity.pid} ({worker.describe()})",
            )
        with struck.lock:
            struck.victim = identity
        if sig is signal.SIGSTOP:
            with struck.lock:
                struck.stopped.add(identity)  # before the signal: cleanup always sees it
        timestamp = clock.now()
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            else:
                os.kill(identity.pid, sig)
        except ProcessLookupError:
            with struck.lock:
                struck.victim = None
            return model.KillResult(model.KillOutcome.ALREADY_GONE, clock.now(), "exited just now")
        except PermissionError as exc:
            with struck.lock:
                struck.victim = None
            raise PermissionDeniedError(
                f"not allowed to kill {worker.describe()}: {exc}; run the drill as the user "
                "that owns the job"
            ) from exc
        on_signalled()
        detail = f"{sig.name} sent to pid {identity.pid}"
        if sig is signal.SIGTERM:
            threads.append(escalate_later(identity, pidfd, fault.grace_period, stop))
            pidfd = None  # the escalation owns it now
            detail += f"; SIGKILL after {fault.grace_period:g}s if it still runs"
        return model.KillResult(model.KillOutcome.KILLED, timestamp, detail)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def escalate_later(
    identity: Identity, pidfd: int | None, grace: float, stop: threading.Event
) -> threading.Thread:
    """Preempt: SIGKILL that same instance after ``grace`` unless it is gone (or ``stop``
    is set: cleanup ends every process anyway); the thread that will, started.

    The pidfd (closed by the thread) pins the instance, so the SIGKILL can only reach it:
    a replacement with the same pid (or rank) is never hit.
    """

    def escalate() -> None:
        try:
            if stop.wait(grace):
                return  # cleanup ends every process anyway
            if pidfd is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            else:
                signal_exactly(identity, signal.SIGKILL)
        finally:
            if pidfd is not None:
                os.close(pidfd)

    thread = threading.Thread(target=escalate, name="recoverygate-preempt", daemon=True)
    thread.start()
    return thread
