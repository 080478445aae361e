"""The reporting grid: which steps a process reports, learned from every line it printed (pure).

A job does not have to call ``progress`` on every step. It may call it every N-th step,
log the first step after a start and then every N-th, or report the completed count
from a timer thread. The reporter prints the first calls of a process unthrottled (the
replay window, RECOVERYGATE_REPLAY_WINDOW) and then at most one line per interval, so
what the drill sees is a subset of the calls. What it can learn from the lines, and what
it uses them for (resume steps inferred from progress alone), is this module's job:

- **held-state line**: a first line equal to the state the process holds (the loaded
  step, or 0 at a fresh start), printed before any step of this process — a timer
  ticking at start, a log of the state it holds. It is no step and no replay. How many
  lines repeated it before the first step line is counted (``held_lines``).
- **regular grid** (``stride``): the first two lines are consecutive calls, and every
  later line is a whole number of strides after the first. Rate-limited lines keep it.
- **first step, then a grid** (``first_special``): the first line is the first step
  after the held state, the rest a grid (``1, 10, 20, 30``: "log the first step, then
  every 10th"); the stride is the common divisor of the later lines' gaps.
- **irregular**: no grid fits (a timer thread reporting the completed count). Resume
  steps cannot be inferred from progress; only facts that hold whatever the grid (a
  process that reports F steps completed resumed from at most F) can decide a failure.

Each :class:`GridTracker` is updated in O(1) per line; :meth:`GridTracker.grid` gives the
current :class:`Grid`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pytest_recoverygate.engine.facts import Undecided, UndecidedKind

__all__ = ["Grid", "GridTracker", "held_ticks"]


@dataclass(frozen=True, slots=True)
class Grid:
    """What the lines of one process show of its reporting grid.

    ``stride`` is ``None`` while fewer than two step lines were seen, or when the lines
    keep no grid (``regular`` is then ``False``). ``first_line`` is the first step line
    (the held-state line excluded); ``held_line`` says the process printed its held state
    first. ``first_special``: the first step line is the first step after the held state,
    off the grid the later lines keep.
    """

    first_line: int | None = None
    stride: int | None = None
    regular: bool | None = None  # None: fewer than two step lines
    first_special: bool = False
    held_line: bool = False
    lines: int = 0

    def describe(self) -> str:
        if self.first_line is None:
            return "no progress line"
        held = ", after a line of the state it held" if self.held_line else ""
        if self.regular is None:
            return f"one step line ({self.first_line}){held}: grid unknown"
        if not self.regular:
            return f"irregular (no reporting grid fits its {self.lines} step lines){held}"
        every = "every step" if self.stride == 1 else f"every {self.stride} steps"
        if self.first_special:
            return f"the first step after a start, then {every}{held}"
        return f"{every}{held}"


class GridTracker:
    """Learns one process's :class:`Grid` from its progress lines, one line at a time."""

    __slots__ = (
        "_base",
        "_first",
        "_gcd_rest",
        "_held",
        "_held_line",
        "_held_lines",
        "_lines",
        "_prev",
        "_regular_a",
        "_second",
        "_started",
    )

    def __init__(self) -> None:
        self._started = False
        self._held: int | None = None
        self._held_line = False
        self._held_lines = 0  # lines of the held state before the first step line
        self._first: int | None = None
        self._second: int | None = None
        self._prev: int | None = None
        self._regular_a = True
        self._gcd_rest = 0
        self._base = 0  # the previous step line from the second one on
        self._lines = 0

    def add(self, step: int, held: int | None) -> None:
        """One progress line; ``held`` is the state the process held before its first
        step (its loaded step, 0 at a seen fresh start, None when unknown)."""
        if not self._started:
            self._started = True
            self._held = held
            if held is not None and step == held:
                self._held_line = True
                self._held_lines = 1
                self._prev = step
                return
        if step == self._prev:
            if self._first is None and self._held_line:
                self._held_lines += 1
            return  # the same count again (a timer between two steps): no new information
        self._prev = step
        self._lines += 1
        if self._first is None:
            self._first = step
            return
        if self._second is None:
            self._second = self._base = step
            return
        stride = self._second - self._first
        if stride <= 0 or (step - self._first) % stride:
            self._regular_a = False
        self._gcd_rest = math.gcd(self._gcd_rest, abs(step - self._base))
        self._base = step

    @property
    def held_line(self) -> bool:
        return self._held_line

    @property
    def held_lines(self) -> int:
        """How many lines repeated the held state before the first step line."""
        return self._held_lines

    @property
    def first(self) -> int | None:
        return self._first

    def grid(self) -> Grid:
        first, second = self._first, self._second
        if first is None:
            return Grid(held_line=self._held_line)
        if second is None:
            return Grid(first, None, None, held_line=self._held_line, lines=self._lines)
        stride = second - first
        if stride > 0 and self._regular_a:
            return Grid(first, stride, True, held_line=self._held_line, lines=self._lines)
        held = self._held
        if held is not None and first == held + 1 and self._lines >= 3 and second > first:
            rest = self._gcd_rest
            if rest > 0 and second - first <= rest:
                return Grid(first, rest, True, True, self._held_line, self._lines)
        return Grid(first, None, False, held_line=self._held_line, lines=self._lines)


def held_ticks(first: int, first_lines: int, zero_dropped: bool) -> Undecided | None:
    """Why a replacement's first lines may be a metrics thread ticking the state it holds,
    or None: it printed its first step on several lines (``first_lines`` > 1), or a 0
    before it (``zero_dropped``), then a step past it. For a job whose lines come after
    steps, without checkpoint_loaded, and a first step at a checkpoint's step, that reads
    as a resume from that checkpoint as well as that step done again."""
    if first_lines <= 1 and not zero_dropped:
        return None
    return Undecided(UndecidedKind.HELD_TICKS, first, lines=first_lines, zero_dropped=zero_dropped)
