"""The signals a Ray drill sends to one Train worker, and what it still owes the job.

Every signal goes to one instance by identity (pid + its start time in clock ticks, its
parent the node's raylet, its title a Train worker's, checked on the worker's node
through a pidfd, see :mod:`.helper`): a Ray task pinned to the node sends it, or, for a
worker on this machine whose raylet is known, the drill itself. What a fault
leaves behind is kept here until cleanup:

- ``HangWorker``: the stopped instance, remembered *before* the SIGSTOP is sent, so that
  :meth:`WorkerSignals.continue_all` (cleanup's first step, on every exit path) sends it
  SIGCONT whatever the answer was; a SIGCONT is as identity-checked as the stop: a
  replacement that took the pid is never touched;
- ``Preempt``: the SIGKILL owed after the grace period, to the same identity (the ticks
  the SIGTERM's task saw), unless the drill ends first (its cluster is ended by cleanup,
  or it is the user's: its own scheduler would).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from pytest_recoverygate.errors import BackendError
from pytest_recoverygate.orchestrators.ray.helper import signal_here

__all__ = ["Send", "Target", "WorkerSignals"]


@dataclasses.dataclass(frozen=True)
class Target:
    """One worker instance: its node, pid, start ticks (``-``: not known yet), whether its
    node is this machine, that node's raylet (the worker's parent; None: not known, the
    node's task checks it) and the marker it must carry (a cluster the drill started)."""

    node_id: str
    pid: int
    ticks: str
    local: bool
    raylet: int | None = None
    marker: tuple[str, str] | None = None

    def describe(self) -> str:
        return f"pid {self.pid} on node {self.node_id[:12]}"


#: Sends one signal through the cluster (a task pinned to the node): the task's answer.
Send = Callable[[Target, str], dict[str, Any]]


class WorkerSignals:
    """One signal per call, to exactly one instance; the stops and escalations owed."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stopped: dict[tuple[str, int], Target] = {}
        self._threads: list[threading.Thread] = []
        self.escalations: list[str] = []  # what each Preempt's SIGKILL did

    def send(self, target: Target, sig: str) -> dict[str, Any]:
        """Send ``sig`` to ``target``: the answer of :func:`.helper.signal_here` (a worker
        on this machine whose ticks are known) or of the node's task; BackendError when
        the task did not answer."""
        if target.local and target.ticks != "-" and target.raylet is not None:
            try:
                answer = signal_here(
                    target.pid, target.ticks, sig, raylet=target.raylet, marker=target.marker
                )
                return {**answer, "by": "the drill"}
            except PermissionError:
                pass  # a cluster of another user: its own task may
        return {**self._send(target, sig), "by": "a task on its node"}

    def stop(self, target: Target) -> dict[str, Any]:
        """SIGSTOP, remembered first: cleanup continues it even if the answer is lost."""
        key = (target.node_id, target.pid)
        with self._lock:
            self._stopped[key] = target
        try:
            answer = self.send(target, "STOP")
        except BackendError:
            raise  # it may have landed: keep it, cleanup sends SIGCONT (identity-checked)
        with self._lock:
            if answer.get("outcome") == "killed":
                ticks = str(answer.get("ticks") or target.ticks)
                self._stopped[key] = dataclasses.replace(target, ticks=ticks)
            else:
                self._stopped.pop(key, None)  # never stopped: nothing to undo
        return answer

    def escalate_later(self, target: Target, grace: float) -> None:
        """Preempt: SIGKILL that same instance after ``grace`` seconds if it still runs."""

        def escalate() -> None:
            if self._stop.wait(grace):
                self._note("SIGKILL not sent: the drill ended within the grace period")
                return
            try:
                answer = self.send(target, "KILL")
            except Exception as exc:  # recorded, never raised in a thread
                self._note(f"SIGKILL after the grace period failed: {exc}")
                return
            if answer.get("outcome") == "killed":
                self._note(f"SIGKILL sent to {target.describe()} after {grace:g}s")
            else:
                self._note(f"no SIGKILL needed: {answer.get('detail', 'gone')}")

        thread = threading.Thread(target=escalate, name="recoverygate-ray-preempt", daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def continue_all(self) -> list[str]:
        """SIGCONT every instance a HangWorker stopped (first of cleanup); the ones that
        could not be continued, each with the command that does it by hand."""
        with self._lock:
            stopped, self._stopped = list(self._stopped.values()), {}
        stuck = []
        for target in stopped:
            try:
                answer = self.send(target, "CONT")
            except Exception as exc:  # named below: a stopped worker must never go unsaid
                stuck.append(
                    f"{target.describe()}: {exc} (continue it on its node: kill -CONT {target.pid})"
                )
                continue
            if answer.get("outcome") not in ("killed", "already_gone"):
                stuck.append(f"{target.describe()}: {answer} (kill -CONT {target.pid})")
        return stuck

    def close(self) -> None:
        """Cancel the escalations still waiting and join them."""
        self._stop.set()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=100.0)

    def _note(self, text: str) -> None:
        with self._lock:
            self.escalations.append(text)
