"""The procgroup orchestrator: start N workers, kill one by identity, restart the group.

Each worker is ``command`` with ``RANK`` and ``WORLD_SIZE`` set, its stdout read into the
shared event source. A thread watches the group like an elastic agent: when a member
exits, the others are stopped and, while restarts are left, the whole group starts again
after ``restart_delay``; otherwise the job has failed.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from pytest_recoverygate.engine.model import (
    Fault,
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    Worker,
    Workload,
)
from pytest_recoverygate.orchestrators.base import Clock, cleanup_once
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.joboutput import JobOutput, OutputSplitter

__all__ = ["ProcGroupOrchestrator"]


class ProcGroupOrchestrator:
    """Worker processes this drill starts and supervises (``orchestrator: procgroup``)."""

    name = "procgroup"

    def __init__(
        self,
        command: Sequence[str],
        *,
        workers: int,
        restart_delay: float,
        max_restarts: int,
        workdir: Path,
        clock: Clock,
    ) -> None:
        self.command = [shutil.which(command[0]) or command[0], *command[1:]]
        self.workers = workers
        self.restart_delay = restart_delay
        self.max_restarts = max_restarts
        self.workdir = workdir
        self.clock = clock
        self._source = StreamEventSource(wakeup=clock.wakeup, clock=clock.now)
        self._output = OutputSplitter(lambda line: None, default="group")
        self._lock = threading.Lock()  # held while the group is looked at or changed
        self._group: dict[int, subprocess.Popen[bytes]] = {}
        self._generation = 0
        self._restarts = 0
        self._events: list[GroupEvent] = []
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # ------------------------------------------------------------------ Orchestrator

    def discover(self, deadline: float) -> Workload:
        """Start the group (once) and name its workers."""
        with self._lock:
            if not self._group:
                self._start_group()
        if self._watcher is None:
            self._watcher = threading.Thread(
                target=self._watch, name="procgroup-watch", daemon=True
            )
            self._watcher.start()
        return Workload(job=f"procgroup {Path(self.command[-1]).name}", workers=self._workers())

    def kill(self, worker: Worker, *, dry_run: bool, fault: Fault = Fault()) -> KillResult:
        """SIGKILL exactly that instance: a pid of the current generation still running.

        ``fault`` is always ``KillWorker`` here: validation refuses the types that
        ``BACKEND.faults`` does not list.
        """
        with self._lock:  # the watcher reaps under this lock: the pid cannot be reused
            proc = self._group.get(worker.rank)
            current = proc is not None and self._instance(proc) == worker.instance_id
            if proc is None or not current or proc.poll() is not None:
                return KillResult(KillOutcome.ALREADY_GONE, self.clock.now(), "not running")
            if dry_run:
                return KillResult(KillOutcome.DRY_RUN, self.clock.now(), f"would kill {proc.pid}")
            at = self.clock.now()
            proc.send_signal(signal.SIGKILL)
        return KillResult(KillOutcome.KILLED, at, f"SIGKILL sent to pid {proc.pid}")

    def current_worker(self, rank: int) -> Worker | None:
        """That rank's worker in the group running now (for ``count``'s later kills)."""
        return next((w for w in self._workers() if w.rank == rank), None)

    def watch_group(self) -> list[GroupEvent]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def events(self) -> StreamEventSource:
        return self._source

    def job_output(self) -> JobOutput:
        return self._output.output(note="each worker's stdout and stderr, per rank")

    @cleanup_once
    def cleanup(self) -> None:
        """Stop the watcher and every worker; close the event source."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
        with self._lock:
            self._end_group()
        self._source.close()

    # ------------------------------------------------------------------ the group

    def _instance(self, proc: subprocess.Popen[bytes]) -> str:
        return f"{proc.pid}@{self._generation}"

    def _workers(self) -> tuple[Worker, ...]:
        with self._lock:
            return tuple(
                Worker(rank, f"rank {rank} pid {proc.pid}", self._instance(proc), node="localhost")
                for rank, proc in sorted(self._group.items())
            )

    def _start_group(self) -> None:
        self._generation += 1
        for rank in range(self.workers):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(self.workers)}
            proc = subprocess.Popen(
                self.command,
                cwd=self.workdir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            assert proc.stdout is not None
            self._source.attach_pipe(
                proc.stdout,
                stream=(rank, self._generation),
                on_chunk=functools.partial(self._keep, f"rank {rank}"),
            )
            self._group[rank] = proc

    def _keep(self, label: str, chunk: bytes) -> None:
        """What a worker printed, for the report (``job_output``)."""
        self._output.feed(chunk, label, label=label)

    def _end_group(self) -> None:
        for proc in self._group.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)

    def _emit(self, kind: GroupEventKind, detail: str, worker: Worker | None = None) -> None:
        self._events.append(GroupEvent(kind, self.clock.now(), detail, worker, self._restarts))
        self.clock.wakeup()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            with self._lock:
                gone = {r: p for r, p in self._group.items() if p.poll() is not None}
                if not gone:
                    continue
                if all(p.returncode == 0 for p in self._group.values() if p.poll() is not None):
                    if len(gone) == len(self._group):
                        self._emit(GroupEventKind.JOB_SUCCEEDED, "every worker exited with 0")
                        return
                    continue
                rank, proc = min(gone.items())
                who = Worker(rank, f"rank {rank} pid {proc.pid}", self._instance(proc))
                self._emit(GroupEventKind.WORKER_GONE, f"rank {rank} exited", who)
                self._end_group()
                if self._restarts >= self.max_restarts:
                    self._emit(GroupEventKind.JOB_FAILED, f"no restart left ({self._restarts})")
                    return
                self._restarts += 1
                self._emit(GroupEventKind.RESTARTING, f"restart {self._restarts}")
            if self._stop.wait(self.restart_delay):
                return
            with self._lock:
                self._start_group()
                self._emit(GroupEventKind.REPLACEMENT_RUNNING, "the group runs again")
