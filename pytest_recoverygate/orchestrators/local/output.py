"""The local job's output as the drill keeps it: the merged stream's last few MiB (for
error messages, the root cause and the report) and each rank's prefixed lines."""

from __future__ import annotations

import codecs
import dataclasses
import threading
from collections import deque

from pytest_recoverygate.orchestrators.local.torchrun import ERROR_LINE, root_cause_fields
from pytest_recoverygate.shared.joboutput import JobOutput, OutputSplitter, torchrun_rank_of
from pytest_recoverygate.shared.textbounds import MAX_MATCH_LINE

__all__ = ["RAW_OUTPUT_LIMIT", "KeptOutput"]

RAW_OUTPUT_LIMIT = 4 * 1024 * 1024  # characters of the job's output kept in memory


class KeptOutput:
    """The job's output read so far, fed chunk by chunk by the pipe reader or the file tail.

    ``stream`` names torchrun's merged stream (one member of a group names its own).
    """

    def __init__(self, stream: str) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._raw: deque[str] = deque()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._raw_size = 0
        # torchrun's whole stream, plus each rank's prefixed lines ([default1]:, [rank1]:)
        self._output = OutputSplitter(torchrun_rank_of, merged=stream)

    def keep(self, chunk: bytes) -> None:
        """One chunk of the job's output, as read."""
        self._output.feed(chunk)
        text = self._decoder.decode(chunk)
        with self._lock:
            self._raw.append(text)
            self._raw_size += len(text)
            while self._raw_size > RAW_OUTPUT_LIMIT and len(self._raw) > 1:
                self._raw_size -= len(self._raw.popleft())

    def raw(self) -> str:
        """The job's merged stdout/stderr as read so far (the last few MiB)."""
        with self._lock:
            return "".join(self._raw)

    def tail(self, lines: int) -> str:
        """The last ``lines`` lines of the job's output, for error messages."""
        return "\n".join(self.raw().splitlines()[-lines:])

    def job_output(self) -> JobOutput:
        """torchrun's merged output under its stream's name; per rank, the lines with its
        prefix; the failing worker as :meth:`.LocalOrchestrator.job_output` says."""
        output = self._output.output(
            note=(
                "torchrun's stdout and stderr as one stream (torchrun); lines a rank prefix "
                "marks ([default1]: with torchrun --tee=3, [rank1]: on torch tracebacks) "
                "also in that rank's file"
            ),
            order=[self._stream],
        )
        cause = root_cause_fields(self.raw())
        if cause and output.failing not in (None, self._stream):
            root = output.get(f"rank {cause[0]}")
            if root is not None and any(
                ERROR_LINE.match(line[:MAX_MATCH_LINE]) for line in root.text.splitlines()[-200:]
            ):
                output = dataclasses.replace(output, failing=root.label)
        return output
