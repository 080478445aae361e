"""Training events from raw job output: the event source every backend shares.

Each backend gets bytes from somewhere different -- a pipe from torchrun (local), an
HTTP log stream per pod (Kubernetes), a growing output file (SLURM) -- but all of them
carry RECOVERYGATE/v1 lines. :class:`StreamEventSource` turns those bytes into
:class:`~pytest_recoverygate.engine.model.TrainingEvent` values with one
:class:`recoverygate.wire.StreamParser` per stream, so the line format is parsed in
exactly one place.

Backends either call :meth:`StreamEventSource.feed` themselves or hand a pipe to
:meth:`StreamEventSource.attach_pipe`, which reads it on a daemon thread (64 KiB
``os.read`` calls: larger reads from a 64 KiB pipe are slower, not faster) and calls
the runner's ``wakeup()`` as soon as events arrive, so detection latency is the pipe's
(well under a millisecond), not a poll interval.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable, Hashable
from typing import BinaryIO, Protocol

from recoverygate.wire import Record, StreamParser

from pytest_recoverygate.engine.model import TrainingEvent, TrainingEventKind

__all__ = ["READ_SIZE", "StreamEventSource", "to_training_event"]

READ_SIZE = 64 * 1024
_KINDS = {kind.value: kind for kind in TrainingEventKind}
_JOIN_TIMEOUT = 5.0
_NOTICE_LIMIT = 100  # notices kept between two polls (a file flapping between kinds)


class _Readable(Protocol):
    def fileno(self) -> int: ...

    def close(self) -> None: ...


def to_training_event(record: Record, received: float | None) -> TrainingEvent:
    """The engine's view of one parsed line; ``received`` is the drill's clock."""
    return TrainingEvent(
        kind=_KINDS[record.event],
        timestamp=record.time,
        incarnation=record.inc,
        step=record.step,
        received=received,
        rank=record.rank,
        pid=record.pid,
        host=record.host,
        restart_count=record.restart,
        digest=record.digest,
        digest_parts=record.parts,
        ppid=record.ppid,
        parent=record.parent,
        world_size=record.world_size,
        replica=record.replica,
        source=None if record.source == "checkpoint" else record.source,
        peer=record.peer,
        loss=record.loss,
        data=record.data,
        loss_decimals=record.loss_decimals,
        error=record.error,
        thread=record.thread,
    )


class StreamEventSource:
    """A thread-safe :class:`~pytest_recoverygate.registry.seams.EventSource`.

    Bytes go in through :meth:`feed` (from any thread, one ``stream`` key per byte
    stream so partial lines of two pods never mix) or through reader threads started by
    :meth:`attach_pipe`; :meth:`poll` drains the events parsed so far. :meth:`close`
    stops and joins every reader thread; it is idempotent.
    """

    def __init__(
        self,
        *,
        wakeup: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._wakeup = wakeup
        self._clock = clock
        self._lock = threading.Lock()
        self._events: list[TrainingEvent] = []
        self._parsers: dict[Hashable, StreamParser] = {}
        self._finished_malformed = 0
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._stop: tuple[int, int] | None = None  # a pipe, readable once close() is called
        self._open_streams = 0
        self._notices: list[tuple[float, str]] = []

    # ------------------------------------------------------------------ EventSource

    def poll(self) -> list[TrainingEvent]:
        """Events parsed since the last call, in arrival order. Never blocks."""
        with self._lock:
            events = self._events
            self._events = []
        return events

    @property
    def malformed_lines(self) -> int:
        """Sentinels that were not followed by a valid event, over every stream."""
        with self._lock:
            return self._finished_malformed + sum(p.malformed for p in self._parsers.values())

    def close(self) -> None:
        """Stop every reader thread and wait for it; later feeds are ignored."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            stop = self._stop
        if stop is None:
            return
        os.write(stop[1], b"x")
        for thread in self._threads:
            thread.join(_JOIN_TIMEOUT)
        self._threads = [t for t in self._threads if t.is_alive()]
        if not self._threads:  # a reader stuck in a callback keeps the pipe it polls
            os.close(stop[0])
            os.close(stop[1])

    # ------------------------------------------------------------------ notices

    def notice(self, text: str) -> None:
        """Say something about the reading itself (a file refused, and why) for the
        drill's timeline; from any thread."""
        at = self._clock()
        with self._lock:
            if len(self._notices) < _NOTICE_LIMIT:
                self._notices.append((at, text))
        if self._wakeup is not None:
            self._wakeup()

    def notices(self) -> list[tuple[float, str]]:
        """The notices since the last call, (time, text), oldest first."""
        with self._lock:
            notices, self._notices = self._notices, []
        return notices

    # ------------------------------------------------------------------ feeding

    def feed(
        self, chunk: bytes | str, received: float | None = None, *, stream: Hashable = None
    ) -> int:
        """Parse ``chunk`` of ``stream``; return how many events it completed.

        ``received`` defaults to now on the source's clock. Text is encoded as UTF-8
        (bytes are cheaper: pass them when you have them). The wakeup callback runs
        when at least one event was added.
        """
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", "surrogateescape")
        if received is None:
            received = self._clock()
        with self._lock:
            if self._closed:
                return 0
            parser = self._parsers.get(stream)
            if parser is None:
                parser = self._parsers[stream] = StreamParser()
            try:
                records = parser.feed(chunk)
                events = [to_training_event(r, received) for r in records]
            except Exception:  # last resort: hostile bytes are malformed, never fatal
                self._finished_malformed += parser.malformed + 1
                self._parsers[stream] = StreamParser()
                records = []
                events = []
            self._events.extend(events)
        if records and self._wakeup is not None:
            self._wakeup()
        return len(records)

    def end_stream(self, stream: Hashable = None, received: float | None = None) -> int:
        """``stream`` ended: complete its last unterminated event and forget it."""
        if received is None:
            received = self._clock()
        with self._lock:
            parser = self._parsers.pop(stream, None)
            if parser is None:
                return 0
            records = parser.flush()
            self._finished_malformed += parser.malformed
            self._events.extend(to_training_event(r, received) for r in records)
        if records and self._wakeup is not None:
            self._wakeup()
        return len(records)

    @property
    def open_streams(self) -> int:
        """Reader threads still reading (0 once every attached pipe reached EOF)."""
        with self._lock:
            return self._open_streams

    def attach_pipe(
        self,
        pipe: int | _Readable,
        *,
        stream: Hashable = None,
        tee_to: BinaryIO | None = None,
        on_chunk: Callable[[bytes], None] | None = None,
        close_pipe: bool = True,
        name: str = "recoverygate-events",
    ) -> threading.Thread:
        """Read ``pipe`` (an fd or an object with ``fileno()``) on a daemon thread.

        Every chunk is copied to ``tee_to`` (the raw log for the report) and passed to
        ``on_chunk`` before it is parsed; a failing tee or callback is dropped, never
        fatal. The pipe is closed when reading ends if ``close_pipe``. The thread ends
        at EOF or on :meth:`close`.
        """
        fd = pipe if isinstance(pipe, int) else pipe.fileno()
        key = stream if stream is not None else f"fd{fd}"
        with self._lock:
            if self._closed:
                raise RuntimeError("this event source is closed")
            if self._stop is None:
                self._stop = os.pipe()
            stop_fd = self._stop[0]
            self._open_streams += 1
        thread = threading.Thread(
            target=self._read,
            args=(fd, stop_fd),
            kwargs={
                "pipe": pipe,
                "key": key,
                "tee_to": tee_to,
                "on_chunk": on_chunk,
                "close_pipe": close_pipe,
            },
            name=name,
            daemon=True,
        )
        self._threads.append(thread)
        thread.start()
        return thread

    # ------------------------------------------------------------------ reader thread

    def _read(
        self,
        fd: int,
        stop_fd: int,
        *,
        pipe: int | _Readable,
        key: Hashable,
        tee_to: BinaryIO | None,
        on_chunk: Callable[[bytes], None] | None,
        close_pipe: bool,
    ) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        poller.register(stop_fd, select.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if stop_fd in ready:
                    break
                if not ready:
                    continue
                try:
                    chunk = os.read(fd, READ_SIZE)
                except OSError:
                    break
                if not chunk:
                    break
                received = self._clock()
                if tee_to is not None:
                    try:
                        tee_to.write(chunk)
                    except (OSError, ValueError):
                        tee_to = None
                if on_chunk is not None:
                    try:
                        on_chunk(chunk)
                    except Exception:  # a reporting callback must not stop event reading
                        on_chunk = None
                try:
                    self.feed(chunk, received, stream=key)
                except Exception:  # never let hostile output close the job's pipe
                    with self._lock:
                        self._finished_malformed += 1
        finally:
            self.end_stream(key)
            if tee_to is not None:
                with contextlib.suppress(OSError, ValueError):
                    tee_to.flush()
            if close_pipe:
                with contextlib.suppress(OSError):
                    if isinstance(pipe, int):
                        os.close(pipe)
                    else:
                        pipe.close()
            with self._lock:
                self._open_streams -= 1
            if self._wakeup is not None:
                self._wakeup()
