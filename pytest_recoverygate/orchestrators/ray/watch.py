"""Train's run state, polled into group events: the attempt errored (worker death
detected), its workers all dead (group shut down), a new attempt pending (new group being
placed) then running (train function restarted), a node's workers gone with its raylet;
the run ERRORED/ABORTED or the driver exiting non-zero is the job failing.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_recoverygate.engine import model
from pytest_recoverygate.orchestrators.ray.runs import POLL_INTERVAL
from pytest_recoverygate.orchestrators.ray.state import failed_worker, failure_of, first_words

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.ray.runs import TrainRuns
    from pytest_recoverygate.orchestrators.ray.state import TrainAttempt, TrainWorker
    from pytest_recoverygate.registry.seams import Clock

__all__ = ["GroupWatch"]


class GroupWatch:
    """A background thread that reads the drill's run again and again, the group events it
    found, and the workers and nodes the drill killed (their deaths are the drill's)."""

    def __init__(
        self,
        runs: TrainRuns,
        *,
        follow: Callable[[TrainAttempt], None],
        worker: Callable[[TrainWorker], model.Worker],
        clock: Clock,
    ) -> None:
        self._runs = runs
        self._follow = follow  # the attempt's worker logs, tailed
        self._worker = worker  # a Train worker as the drill names it
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._events: list[model.GroupEvent] = []
        self._watcher: threading.Thread | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._killed_nodes: set[str] = set()  # node ids whose raylet the drill ended
        self._killed: set[str] = set()  # actor ids of the workers the drill signalled
        self._seen_attempts: set[str] = set()
        self._reported: set[tuple[str, str]] = set()  # (attempt id, phase) already emitted
        self._ran: set[str] = set()  # attempts the run was seen RUNNING with (state.failure_of)
        self._ended = False

    def start(self, attempt_id: str, popen: subprocess.Popen[bytes] | None) -> None:
        """Watch from the attempt discovery saw running (``popen``: the driver launched)."""
        self._popen = popen
        with self._lock:
            self._seen_attempts.add(attempt_id)
            self._reported.add((attempt_id, "running"))
        self._watcher = threading.Thread(target=self._watch, name="recoverygate-ray", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=10)

    def drain(self) -> list[model.GroupEvent]:
        """The group events found since the last call."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def killing(self, actor_id: str) -> None:
        """The drill signals that worker now (before the signal: the watcher may look
        before the task answers)."""
        with self._lock:
            self._killed.add(actor_id)

    def spared(self, actor_id: str) -> None:
        """Nothing was sent to that worker: its death is not the drill's."""
        with self._lock:
            self._killed.discard(actor_id)

    def killing_node(self, node_id: str) -> None:
        with self._lock:
            self._killed_nodes.add(node_id)

    def _emit(
        self, kind: model.GroupEventKind, detail: str, worker: model.Worker | None = None
    ) -> None:
        run = self._runs.latest()
        with self._lock:
            restarts = max(len(run.attempts) - 1, 0) if run is not None else None
            self._events.append(model.GroupEvent(kind, self._clock.now(), detail, worker, restarts))
        self._clock.wakeup()

    def _once(self, attempt: str, phase: str) -> bool:
        with self._lock:
            if (attempt, phase) in self._reported:
                return False
            self._reported.add((attempt, phase))
            return True

    def _watch(self) -> None:
        while not self._stop.wait(POLL_INTERVAL):
            try:
                self._look()
            except Exception as exc:  # a watcher that dies silently would hang the drill
                self._emit(model.GroupEventKind.JOB_FAILED, f"watching Train's state failed: {exc}")
                return
            if self._ended:
                return

    def _look(self) -> None:
        run = self._runs.fetch()
        if self._popen is not None and self._popen.poll() is not None and not self._ended:
            self._ended = True
            code = self._popen.returncode
            if code == 0:
                self._emit(model.GroupEventKind.JOB_SUCCEEDED, "the driver exited with 0")
            else:
                status = (
                    f" (run {run.status}: {first_words(run.detail)})" if run is not None else ""
                )
                self._emit(
                    model.GroupEventKind.JOB_FAILED, f"the driver exited with {code}{status}"
                )
            return
        if run is None:
            return
        with self._lock:
            killed_nodes, victims = sorted(self._killed_nodes), set(self._killed)
        for node_id in killed_nodes:
            on_node = [w for a in run.attempts for w in a.workers if w.node_id == node_id]
            if on_node and not any(w.alive for w in on_node) and self._once(node_id, "node gone"):
                self._emit(
                    model.GroupEventKind.NODE_GONE,
                    f"every worker of node {on_node[0].node} is gone with its raylet",
                )
        if run.current is not None and run.current.running:
            self._follow(run.current)  # until the GCS vouched for each worker's log
        if run.status == "RUNNING" and run.attempts:
            self._ran.add(run.attempts[-1].attempt_id)
        for index, attempt in enumerate(run.attempts):
            aid = attempt.attempt_id
            old = index < len(run.attempts) - 1 or attempt.status in ("ERRORED", "ABORTED")
            dead = [w for w in attempt.workers if not w.alive]
            seen = aid in self._seen_attempts
            failed = failure_of(run, index, dead, victims, ran=aid in self._ran)
            if seen and failed is not None and self._once(aid, "gone"):
                who = failed_worker(attempt, dead, victims)
                self._emit(
                    model.GroupEventKind.WORKER_GONE,
                    failed,
                    self._worker(who) if who is not None else None,
                )
            shut_down = (
                seen and old and attempt.workers and not any(w.alive for w in attempt.workers)
            )
            if shut_down and not run.terminal and self._once(aid, "shut down"):
                self._emit(
                    model.GroupEventKind.RESTARTING,
                    f"group shut down (run {run.status}); Train restarts it",
                )
            if aid not in self._seen_attempts and index == len(run.attempts) - 1:
                if self._once(aid, "pending"):
                    self._emit(
                        model.GroupEventKind.REPLACEMENT_PENDING,
                        f"new group being placed: {attempt.detail or attempt.status}",
                    )
                if attempt.running and self._once(aid, "running"):
                    with self._lock:
                        self._seen_attempts.add(aid)
                    self._follow(attempt)
                    self._emit(
                        model.GroupEventKind.REPLACEMENT_RUNNING,
                        f"new group placed, train function restarted "
                        f"({len(attempt.workers)} workers)",
                    )
        if run.terminal and self._once(run.run_id, "terminal"):
            if run.status == "FINISHED":
                self._emit(model.GroupEventKind.JOB_SUCCEEDED, "the Train run FINISHED")
            else:
                self._emit(
                    model.GroupEventKind.JOB_FAILED,
                    f"the Train run {run.status}: {first_words(run.detail)}",
                )
