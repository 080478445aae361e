"""The local job's watcher thread: each scan of the job turned into group events (a worker
gone, torchrun restarting the group, the group complete again, the agent exited)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_recoverygate.engine import model
from pytest_recoverygate.orchestrators.local.scan import POLL_INTERVAL, worker_of
from pytest_recoverygate.orchestrators.local.torchrun import root_cause

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.local.kill import Struck
    from pytest_recoverygate.orchestrators.local.launch import LocalJob
    from pytest_recoverygate.orchestrators.local.processes import WorkerProc
    from pytest_recoverygate.orchestrators.local.scan import JobScan
    from pytest_recoverygate.registry.seams import Clock
    from pytest_recoverygate.shared.events import StreamEventSource

__all__ = ["IDLE_POLL_INTERVAL", "OUTPUT_DRAIN_TIMEOUT", "GroupWatch"]

IDLE_POLL_INTERVAL = 0.25  # seconds between scans otherwise (a scan costs ~3 ms of CPU)
OUTPUT_DRAIN_TIMEOUT = 0.5  # seconds to wait for the agent's final output once it exited


class GroupWatch:
    """The group's state as the watcher thread sees it, and the events it found.

    It scans ``scan`` every :data:`~.scan.POLL_INTERVAL` while :attr:`recovering`, every
    :data:`IDLE_POLL_INTERVAL` otherwise, or at once when ``poke`` is set, until ``stop``.
    The first worker it reports gone is ``struck``'s victim when that is among them; once
    ``job``'s agent ended it waits a moment for ``source`` to read its last words, and
    names the root cause from ``raw_output``.
    """

    def __init__(
        self,
        *,
        job: LocalJob,
        scan: JobScan,
        struck: Struck,
        source: StreamEventSource,
        raw_output: Callable[[], str],
        clock: Clock,
        stop: threading.Event,
        poke: threading.Event,
    ) -> None:
        self._job = job
        self._scan = scan
        self._struck = struck
        self._source = source
        self._raw_output = raw_output
        self._clock = clock
        self._stop = stop
        self._poke = poke
        self._lock = threading.Lock()
        self._events: list[model.GroupEvent] = []
        # group state, owned by the watcher thread after adopt()
        self._base_restart = 0
        self._generation = 0
        self._local_world_size = 0
        self._group: dict[int, WorkerProc] = {}
        self._gone_reported = False
        self._running_reported = True
        self._job_failed_reported = False
        #: A kill was sent: watch closely until the new group is up.
        self.recovering = False

    def adopt(self, group: dict[int, WorkerProc]) -> None:
        """The complete group discovery found: the generation the watch starts from."""
        with self._lock:
            self._local_world_size = len(group)
            self._group = dict(group)
            self._generation = next(iter(group.values())).restart_count
            self._base_restart = self._generation
            self._running_reported = True

    def drain(self) -> list[model.GroupEvent]:
        """Group events observed since the previous call."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def _emit(self, kind: model.GroupEventKind, detail: str, **extra: Any) -> None:
        with self._lock:
            self._events.append(model.GroupEvent(kind, self._clock.now(), detail, **extra))
        self._clock.wakeup()

    def run(self) -> None:
        """The watcher thread's loop."""
        while not self._stop.is_set():
            try:
                self.watch_once()
            except Exception as exc:  # never die silently: the drill would wait for nothing
                self._emit(model.GroupEventKind.JOB_FAILED, f"watching the job failed: {exc!r}")
                return
            if self._job_failed_reported:
                return
            self._poke.wait(POLL_INTERVAL if self.recovering else IDLE_POLL_INTERVAL)
            self._poke.clear()

    def watch_once(self) -> None:
        """One scan, and the events it shows."""
        scan = self._scan.scan()
        alive = {w.identity for w in scan.workers}
        # 1. a member of the current group disappeared
        if not self._gone_reported:
            missing = [w for w in self._group.values() if w.identity not in alive]
            if missing:
                victim = self._struck.victim
                first = next((w for w in missing if w.identity == victim), missing[0])
                self._gone_reported = True
                self._emit(
                    model.GroupEventKind.WORKER_GONE,
                    f"rank {first.rank} (pid {first.identity.pid}) is gone",
                    worker=worker_of(first),
                )
        # 2. a new restart generation appeared
        newest = max((w.restart_count for w in scan.workers), default=self._generation)
        if newest > self._generation:
            self._generation = newest
            self._group = {}
            self._gone_reported = False
            self._running_reported = False
            self._emit(
                model.GroupEventKind.RESTARTING,
                f"torchrun restarted the worker group (TORCHELASTIC_RESTART_COUNT={newest})",
                restart_count=newest - self._base_restart,
            )
        # 3. the new generation is complete
        current = {w.rank: w for w in scan.workers if w.restart_count == self._generation}
        for rank, worker in current.items():
            self._group.setdefault(rank, worker)
        if not self._running_reported and len(current) >= self._local_world_size:
            self._running_reported = True
            self.recovering = False
            pids = ", ".join(f"rank {r} pid {w.identity.pid}" for r, w in sorted(current.items()))
            self._emit(
                model.GroupEventKind.REPLACEMENT_RUNNING,
                f"all {len(current)} local ranks running again ({pids})",
                restart_count=self._generation - self._base_restart,
            )
        # 4. the agent exited: the job will not come back
        failure = self._job.ended()
        if failure is not None and not self._job_failed_reported:
            self._job_failed_reported = True
            # Let the reader drain the agent's last words (its root-cause summary).
            drained = time.monotonic() + OUTPUT_DRAIN_TIMEOUT
            while self._source.open_streams and time.monotonic() < drained:
                time.sleep(0.01)
            popen = self._job.popen
            if popen is not None and popen.poll() == 0:
                self._emit(model.GroupEventKind.JOB_SUCCEEDED, failure)
                return
            cause = root_cause(self._raw_output())
            self._emit(model.GroupEventKind.JOB_FAILED, f"{failure}{': ' + cause if cause else ''}")
