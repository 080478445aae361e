"""Bounds on the job's text before a regex or a buffer sees it.

A job controls every byte it prints, and the drill reads that output with regexes (the
root cause of a failed torchrun, the launchers' line prefixes, the failure signatures) and
splits it into lines. Two bounds keep a hostile or merely odd output from freezing the
drill (issue 30, finding 4):

- :data:`MAX_MATCH_LINE`: the characters of one line that a regex of the drill is given.
  :func:`cap_lines` cuts longer lines for matching (and counts them); what the report
  keeps of the output has its own limits (:mod:`.joboutput`). The regexes themselves are
  written to be linear (no nested or adjacent unbounded quantifiers over the same
  characters); the cap is the second wall, so that no line costs more than a bounded
  amount however a pattern backtracks.
- :class:`LineSplitter`: lines of a byte stream fed in chunks, holding at most
  ``max_line`` bytes of an unfinished line (:data:`MAX_LINE_BYTES` by default). A longer
  line is handed on cut at ``max_line`` (a :class:`CutLine`) as soon as it reaches it,
  the rest of it up to its newline is dropped, and :attr:`LineSplitter.truncated` counts
  such lines. Each chunk is scanned once (no search from the start of a growing buffer,
  no copy of the rest per line).
"""

from __future__ import annotations

__all__ = ["MAX_LINE_BYTES", "MAX_MATCH_LINE", "CutLine", "LineSplitter", "cap_lines"]

MAX_MATCH_LINE = 4096  # characters of one line a regex of the drill sees
MAX_LINE_BYTES = 1024 * 1024  # bytes of one unfinished line a splitter holds


def cap_lines(text: str, limit: int = MAX_MATCH_LINE) -> tuple[str, int]:
    """``text`` with every ``\\n``-separated line cut to ``limit`` characters, and how many
    lines were cut (``text`` itself when none is longer)."""
    lines = text.split("\n")
    cut = 0
    for index, line in enumerate(lines):
        if len(line) > limit:
            lines[index] = line[:limit]
            cut += 1
    return ("\n".join(lines) if cut else text), cut


class CutLine(bytes):
    """The first ``max_line`` bytes of a line that was longer (the rest was dropped)."""

    __slots__ = ()


class LineSplitter:
    """Complete lines (without their ``\\n``) from chunks of a byte stream, in bounded memory.

    Not thread-safe: one splitter per stream.
    """

    __slots__ = ("_buffer", "_dropping", "max_line", "truncated")

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        if max_line < 1:
            raise ValueError(f"max_line must be at least 1, got {max_line}")
        self.max_line = max_line
        self.truncated = 0  # lines longer than max_line, handed on cut
        self._buffer = bytearray()
        self._dropping = False  # inside the dropped rest of a line that was too long

    @property
    def buffered(self) -> int:
        """Bytes of an unfinished line held now (at most ``max_line``)."""
        return len(self._buffer)

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` completes (a line cut at ``max_line`` counts as complete)."""
        out: list[bytes] = []
        start, size = 0, len(chunk)
        while start < size:
            end = chunk.find(b"\n", start)
            if end < 0:
                self._take(chunk[start:], ended=False, out=out)
                break
            self._take(chunk[start:end], ended=True, out=out)
            start = end + 1
        return out

    def flush(self) -> list[bytes]:
        """End of stream: the unfinished last line, if any."""
        line = bytes(self._buffer)
        self._buffer.clear()
        self._dropping = False
        return [line] if line else []

    def _take(self, piece: bytes, *, ended: bool, out: list[bytes]) -> None:
        if self._dropping:
            self._dropping = not ended
            return
        room = self.max_line - len(self._buffer)
        if len(piece) > room:
            self._buffer += piece[:room]
            out.append(CutLine(self._buffer))
            self._buffer.clear()
            self.truncated += 1
            self._dropping = not ended
            return
        self._buffer += piece
        if ended:
            out.append(bytes(self._buffer))
            self._buffer.clear()
