"""The job's own output, kept per worker in bounded memory, for the report and the CLI.

After a FAIL or an ERROR the first question is "what did the job print?". Every backend
already reads the job's output for the RECOVERYGATE/v1 lines; this module keeps a copy of
it, split per worker where the backend can tell workers apart:

- local: torchrun's merged stdout/stderr as ``torchrun``, and, per rank, the lines that
  carry a rank prefix (``[default1]:`` with ``torchrun --tee=3``, ``[rank1]:`` on the
  tracebacks torch.distributed prints);
- kubernetes: each followed pod's log (the reporting rank's pods, all incarnations);
- slurm: the job's output file as ``job``, and per task the lines ``srun --label`` prefixes
  with ``N: ``.

Each worker keeps at most :data:`PER_WORKER_LIMIT` bytes: the first half and the last
half, with a visible marker line where the middle was cut. Everything here is pure and
thread-safe enough for one writer thread (the backend's reader) and one reader after the
drill (the runner).

The seam is :class:`JobOutput`, returned by a backend's optional ``job_output()`` method
(see :class:`pytest_recoverygate.registry.seams.JobOutputSource`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pytest_recoverygate.shared.textbounds import MAX_MATCH_LINE

__all__ = [
    "EXCEPTION_LINE",
    "PER_WORKER_LIMIT",
    "JobOutput",
    "OutputSplitter",
    "WorkerLog",
    "WorkerOutput",
    "failure_excerpt",
    "file_name",
    "slurm_task_of",
    "torchrun_rank_of",
]

PER_WORKER_LIMIT = 1024 * 1024  # bytes of one worker's output kept (head + tail)
MAX_WORKERS = 64  # workers kept apart (64 MiB at most); later ones share "other workers"
MAX_PARTIAL_LINE = 64 * 1024  # an unfinished line longer than this is stored as it is
EXCERPT_LINES = 20
SENTINEL_TEXT = "RECOVERYGATE/v1 {"

#: Launcher prefixes a line may carry, outermost first: SLURM's ``--label`` (``0: ``),
#: torchrun's ``--tee`` (``[default1]:``), torch.distributed's traceback prefix (``[rank1]:``).
#: The spaces are ``[^\S\n]``, never ``\s``: a ``\s*`` that crosses newlines made the
#: multi-line search quadratic in the number of blank lines (8000: 1.5 s).
_PREFIXES = r"(?:[^\S\n]*\d{1,9}: )?(?:\[[A-Za-z_][\w-]{0,127}\]:){0,8}"
#: The last line of a Python traceback (``RuntimeError: …``), under any launcher prefix.
#: Linear in the line: give it at most MAX_MATCH_LINE characters of one (:func:`_is_worker_error`).
EXCEPTION_LINE = re.compile(
    rf"^{_PREFIXES}[^\S\n]*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit))"
    r"(?::[ \t]*(.*))?$"
)
#: Exceptions of a launcher reporting a worker's failure, not a worker's own error.
_LAUNCHER_ERRORS = ("ChildFailedError",)

#: ``[defaultN]:`` / ``[rankN]:``: a bounded name, its trailing digits read without a
#: regex (the lazy ``[\w-]*?(\d+)\]`` this replaces was quadratic: 8 kB of digits, 0.2 s).
_TORCHRUN_PREFIX = re.compile(rb"\[([A-Za-z_][\w-]{0,127})\]:")
_SLURM_LABEL = re.compile(rb"\s{0,64}(\d{1,9}): ")
_DIGITS = b"0123456789"


def torchrun_rank_of(line: bytes) -> str | None:
    """``rank N`` for a line torchrun (``[defaultN]:``) or torch (``[rankN]:``) prefixed."""
    match = _TORCHRUN_PREFIX.match(line)
    if match is None:
        return None
    name = match.group(1)
    digits = name[len(name.rstrip(_DIGITS)) :]
    return f"rank {int(digits)}" if digits else None


def slurm_task_of(line: bytes) -> str | None:
    """``task N`` for a line ``srun --label`` prefixed with ``N: ``."""
    match = _SLURM_LABEL.match(line)
    return f"task {int(match.group(1))}" if match else None


def file_name(label: str) -> str:
    """The file a worker's output is written to: ``rank 1`` -> ``rank-1.log``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in label.strip())
    return (safe.strip(".-") or "output") + ".log"


def _is_worker_error(line: str) -> bool:
    match = EXCEPTION_LINE.match(line[:MAX_MATCH_LINE])
    return match is not None and match.group(1).rsplit(".", 1)[-1] not in _LAUNCHER_ERRORS


class WorkerLog:
    """One worker's output in at most ``limit`` bytes: the first half, then the last half.

    When the middle is dropped, :meth:`text` shows a marker line saying how many bytes
    were cut, so a reader never mistakes the two halves for one continuous output.
    """

    def __init__(self, limit: int = PER_WORKER_LIMIT) -> None:
        self.limit = limit
        self._head = bytearray()
        self._tail = bytearray()
        self._cut = 0
        self._lock = threading.Lock()

    @property
    def cut_bytes(self) -> int:
        """How many bytes of the middle were dropped."""
        return self._cut

    @property
    def size(self) -> int:
        """Bytes kept."""
        return len(self._head) + len(self._tail)

    def write(self, data: bytes) -> None:
        half = self.limit // 2
        with self._lock:
            room = half - len(self._head)
            if room > 0 and not self._cut and not self._tail:
                self._head += data[:room]
                data = data[room:]
            if not data:
                return
            self._tail += data
            excess = len(self._tail) - (self.limit - len(self._head))
            if excess > 0:
                del self._tail[:excess]
                self._cut += excess

    def text(self) -> str:
        """The kept output as text, with the cut marker where bytes were dropped."""
        with self._lock:
            head, tail, cut = bytes(self._head), bytes(self._tail), self._cut
        if not cut:
            return (head + tail).decode("utf-8", "replace")
        # Resume the tail on a line boundary: half a line after the marker reads as garbage.
        newline = tail.find(b"\n")
        if 0 <= newline < len(tail) - 1 and newline < 4096:
            cut += newline + 1
            tail = tail[newline + 1 :]
        marker = (
            f"\n[... recoverygate: {cut} bytes of this output were cut here; the first and "
            f"the last {self.limit // 2} bytes are kept ...]\n"
        )
        head_text = head.decode("utf-8", "replace").rstrip("\n")
        return head_text + marker + tail.decode("utf-8", "replace")


def failure_excerpt(text: str, lines: int = EXCERPT_LINES) -> tuple[str, ...]:
    """The last ``lines`` lines of ``text`` that end at the worker's last error.

    A worker's own exception line (``RuntimeError: …``) ends the excerpt, so a launcher's
    summary printed after it (torchrun's ChildFailedError block) does not push the
    worker's traceback out of view. Without an error line: simply the last lines. The
    reporter's RECOVERYGATE/v1 lines are left out (they are the drill's events, kept in
    events.jsonl; the output file keeps them too).
    """
    all_lines = [line for line in text.splitlines() if SENTINEL_TEXT not in line]
    end = len(all_lines)
    for index in range(len(all_lines) - 1, -1, -1):
        if _is_worker_error(all_lines[index]):
            end = index + 1
            break
    return tuple(all_lines[max(0, end - lines) : end])


@dataclass(frozen=True, slots=True)
class WorkerOutput:
    """One worker's kept output. ``label`` names it (``rank 1``, ``pod trainer-0``)."""

    label: str
    text: str
    cut_bytes: int = 0

    @property
    def file_name(self) -> str:
        return file_name(self.label)


@dataclass(frozen=True, slots=True)
class JobOutput:
    """What the job printed, per worker, as a backend could capture it.

    ``failing`` is the label of the worker whose output shows the failure (the last
    worker error in the order the output arrived), ``None`` when no output shows one;
    ``note`` says what the backend captures, for the report (e.g. that Kubernetes streams
    only the reporting rank's pods).
    """

    workers: tuple[WorkerOutput, ...] = ()
    failing: str | None = None
    note: str = ""

    def get(self, label: str) -> WorkerOutput | None:
        return next((w for w in self.workers if w.label == label), None)

    @property
    def text(self) -> str:
        """Every worker's output, one after the other (what a diagnosis reads)."""
        return "\n".join(w.text for w in self.workers)

    def excerpt(self, lines: int = EXCERPT_LINES) -> tuple[str, tuple[str, ...]] | None:
        """The failing worker (or, without one, the last worker) and its last lines."""
        chosen = self.get(self.failing) if self.failing else None
        if chosen is None:
            chosen = next((w for w in reversed(self.workers) if w.text.strip()), None)
        if chosen is None:
            return None
        return chosen.label, failure_excerpt(chosen.text, lines)


class OutputSplitter:
    """A merged byte stream, split into per-worker :class:`WorkerLog` s by line prefix.

    ``label_of(line)`` names the worker of a complete line (``None``: not one worker's).
    ``merged`` names a log that receives every byte as it came (torchrun's whole stream,
    a SLURM output file); lines ``label_of`` does not place go only there. Without
    ``merged``, unplaced lines go to ``default``. The splitter remembers the worker of the
    last error line in arrival order: :attr:`failing`.
    """

    def __init__(
        self,
        label_of: Callable[[bytes], str | None],
        *,
        merged: str | None = None,
        default: str = "output",
        limit: int = PER_WORKER_LIMIT,
    ) -> None:
        self._label_of = label_of
        self._merged = merged
        self._default = default
        self._limit = limit
        self._logs: dict[str, WorkerLog] = {}
        self._partial: dict[object, bytes] = {}
        self._lock = threading.Lock()
        self.failing: str | None = None

    def _log(self, label: str) -> WorkerLog:
        log = self._logs.get(label)
        if log is None:
            if len(self._logs) >= MAX_WORKERS:
                label = "other workers"
                log = self._logs.get(label)
            if log is None:
                log = self._logs[label] = WorkerLog(self._limit)
        return log

    def feed(self, data: bytes, stream: object = None, *, label: str | None = None) -> None:
        """Add a chunk of ``stream`` (several streams keep their partial lines apart).

        ``label`` puts all of the chunk's lines in that worker's log (a stream that is
        one worker's, like a pod's log) instead of asking ``label_of``.
        """
        with self._lock:
            if self._merged is not None:
                self._log(self._merged).write(data)
            buffer = self._partial.pop(stream, b"") + data
            lines = buffer.split(b"\n")
            rest = lines.pop()
            for line in lines:
                self._place(line + b"\n", label)
            if len(rest) > MAX_PARTIAL_LINE:
                self._place(rest, label)
            elif rest:
                self._partial[stream] = rest

    def end(self, stream: object = None, *, label: str | None = None) -> None:
        """The stream ended: its unfinished last line counts as a line."""
        with self._lock:
            rest = self._partial.pop(stream, b"")
            if rest:
                self._place(rest, label)

    def _place(self, line: bytes, label: str | None = None) -> None:
        label = label or self._label_of(line)
        if label is not None:
            self._log(label).write(line)
        elif self._merged is None:
            self._log(self._default).write(line)
        if b"Error" in line or b"Exception" in line or b"Interrupt" in line or b"Exit" in line:
            text = line.decode("utf-8", "replace").rstrip("\r\n")
            if _is_worker_error(text):
                placed = label or self._merged or self._default
                self.failing = placed

    def output(self, note: str = "", order: Iterable[str] = ()) -> JobOutput:
        """A snapshot: every worker's text, ``order`` first, then the rest by label.

        A line still unfinished stays pending for the next :meth:`feed` (call :meth:`end`
        when a stream is over); a merged log already holds its bytes.
        """
        with self._lock:  # an unfinished line stays pending (the merged log has its bytes)
            logs = dict(self._logs)
            failing = self.failing
        first = [label for label in order if label in logs]
        others = sorted((label for label in logs if label not in first), key=_natural)
        workers = tuple(
            WorkerOutput(label, logs[label].text(), logs[label].cut_bytes)
            for label in [*first, *others]
        )
        return JobOutput(workers, failing, note)


def _natural(label: str) -> tuple[str, int, str]:
    """``rank 2`` before ``rank 10``."""
    match = re.match(r"^(.*?)(\d+)(.*)$", label)
    if match is None:
        return (label, -1, "")
    return (match.group(1), int(match.group(2)), match.group(3))
