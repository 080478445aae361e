"""The job's output into training events: the driver's output read (kept for the report,
buffered until the evidence is chosen), each Train worker's ``logs/worker-*.out`` tailed
when the session's logs folder is on this machine; one evidence source per drill, never
both (a line would count twice).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_recoverygate.shared.filetail import OutputTail
from pytest_recoverygate.shared.joboutput import JobOutput, OutputSplitter

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.ray.guard import WorkerGuard
    from pytest_recoverygate.orchestrators.ray.state import TrainAttempt
    from pytest_recoverygate.registry.seams import Clock
    from pytest_recoverygate.shared.events import StreamEventSource

__all__ = ["DRIVER_BUFFER_CHUNKS", "JobLogs"]

DRIVER_BUFFER_CHUNKS = 4096  # chunks of driver output kept until the evidence is chosen


class JobLogs:
    """The driver's output and the workers' log files, fed to ``source`` (the evidence)
    and kept for the report."""

    def __init__(self, source: StreamEventSource, guard: WorkerGuard, *, clock: Clock) -> None:
        self._source = source
        self._guard = guard
        self._clock = clock
        self._output = OutputSplitter(lambda line: None, default="driver")
        self._lock = threading.Lock()
        self._tails: dict[str, OutputTail] = {}
        self._worker_logs: Path | None = None  # the session's logs folder, when on this machine
        self.driver_evidence: bool | None = None  # None: not decided yet (buffered)
        self._driver_buffer: list[tuple[bytes, float]] = []
        self._reader: threading.Thread | None = None
        self._followed: set[str] = set()  # actor ids whose worker log is tailed

    # ------------------------------------------------------------------ the driver

    def read_driver(self, pipe: Any) -> None:
        """Start reading the driver's output from ``pipe`` (a thread of its own)."""
        self._reader = threading.Thread(
            target=self._read_driver, args=(pipe,), name="ray-driver", daemon=True
        )
        self._reader.start()

    def join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)

    def _read_driver(self, pipe: Any) -> None:
        """The driver's output: kept for the report; evidence only in the fallback mode."""
        fd = pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self._driver_chunk(chunk, self._clock.now())
        with contextlib.suppress(OSError):
            pipe.close()
        self._output.end("driver", label="driver")
        with self._lock:
            evidence = self.driver_evidence
        if evidence:
            self._source.end_stream("driver")

    def _driver_chunk(self, chunk: bytes, received: float) -> None:
        self._output.feed(chunk, "driver", label="driver")
        with self._lock:
            if self.driver_evidence is None:
                self._driver_buffer.append((chunk, received))
                if len(self._driver_buffer) > DRIVER_BUFFER_CHUNKS:
                    del self._driver_buffer[0]
                return
            evidence = self.driver_evidence
        if evidence:
            self._source.feed(chunk, received, stream="driver")

    # ------------------------------------------------------------------ the workers

    def choose(self, attempt: TrainAttempt) -> None:
        """Worker logs when the session folder the GCS names is on this machine, else the
        driver's copy (never the folder Train's state names: job code writes that)."""
        for worker in attempt.workers:
            logs = self._guard.logs_folder(worker.node_id)
            if logs is not None and self._guard.log_files(worker):
                self._worker_logs = logs
                break
        with self._lock:
            self.driver_evidence = self._worker_logs is None
            buffered, self._driver_buffer = self._driver_buffer, []
            if self.driver_evidence:  # under the lock: the reader's next chunk comes after
                for chunk, received in buffered:
                    self._source.feed(chunk, received, stream="driver")
        self.follow(attempt)

    def follow(self, attempt: TrainAttempt) -> None:
        """Tail the log of each of the attempt's workers not tailed yet (worker logs only)."""
        if self._worker_logs is None:
            return
        try:  # the logs folder's user writes the worker logs (not followed if a link)
            owner: int | None = os.lstat(self._worker_logs).st_uid
        except OSError:
            owner = None
        for worker in attempt.workers:
            if worker.actor_id in self._followed:
                continue
            for path in self._guard.log_files(worker):
                self._followed.add(worker.actor_id)
                key = str(path)
                if key in self._tails:
                    continue
                label = f"rank {worker.rank} pid {worker.pid}"
                tail = OutputTail(
                    key,
                    functools.partial(self._worker_chunk, key, label),
                    self._clock,
                    interval=0.2,
                    name=f"ray-worker-{worker.pid}",
                    owner=owner,
                    on_notice=self._source.notice,
                )
                self._tails[key] = tail
                tail.start()

    def _worker_chunk(self, key: str, label: str, chunk: bytes, received: float) -> None:
        self._output.feed(chunk, key, label=label)
        self._source.feed(chunk, received, stream=key)

    def stop_tails(self) -> None:
        for tail in list(self._tails.values()):
            tail.stop()

    # ------------------------------------------------------------------ the report

    def job_output(self) -> JobOutput:
        source = "the driver's output (fallback)" if self.driver_evidence else "logs/worker-*.out"
        return self._output.output(
            note=(
                "the driver's stdout and stderr (driver); each Train worker's own "
                f"logs/worker-*.out by rank and pid; training events read from {source}"
            ),
            order=("driver",),
        )

    def output_tail(self, lines: int = 15) -> str:
        text = self._output.output().text
        return "\n".join(text.splitlines()[-lines:]) or "(nothing)"
