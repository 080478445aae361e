"""What the job's lines left undecided or broken, as typed facts with their figures (pure).

The ledger (:mod:`~pytest_recoverygate.engine.ledger`, and the grid it reads) answers
with these, never with sentences; :mod:`~pytest_recoverygate.engine.rules.wording` words
each for the user. One kind per reason, each with the figures its sentence names:

- :class:`Undecided` — why a replacement's resume step cannot be told
  (:attr:`Resume.undecided <pytest_recoverygate.engine.records.Resume.undecided>`);
- :class:`Indistinct` — why a resume from a checkpoint could not be told from a fresh
  start, so the drill does not trigger on it;
- :class:`Breach` — how the job breaks the step contract
  (:attr:`StepContract.breach <pytest_recoverygate.engine.verdict.StepContract.breach>`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "Breach",
    "BreachKind",
    "Indistinct",
    "IndistinctKind",
    "Undecided",
    "UndecidedKind",
]


class UndecidedKind(enum.Enum):
    """Why a replacement's resume step cannot be told."""

    HELD_TICKS = "held_ticks"  # its first lines may be a timer ticking the state it holds
    NO_GRID = "no_grid"  # the job's lines keep no grid (or come from a metrics thread)
    ONE_LINE = "one_line"  # one progress line: the stride is unknown
    OFF_GRID = "off_grid"  # checkpoints off the reporting grid: the step lies in a stride
    LOADED_ONE_LINE = "loaded_one_line"  # loaded, then one line: the stride is unknown
    LOADED_FAR = "loaded_far"  # its first step came more than a stride after its load


@dataclass(frozen=True, slots=True)
class Undecided:
    """Why a replacement's resume step cannot be told, with the figures that show it.

    ``first``: its first step (past the loaded step, for ``LOADED_*``); ``upper``: the
    step it resumed from at most (``NO_GRID``); ``stride``: the progress stride
    (``OFF_GRID``, ``LOADED_FAR``); ``loaded``: its ``checkpoint_loaded`` step
    (``LOADED_*``); ``lines`` and ``zero_dropped``: its first step printed that many
    times, a 0 before it (``HELD_TICKS``); ``grid``: the job's reporting grid as learned
    and ``metrics_thread``: its progress came from a metrics thread (``NO_GRID``);
    ``off_grid``: the checkpoints off the grid (``OFF_GRID``).
    """

    kind: UndecidedKind
    first: int
    upper: int | None = None
    stride: int | None = None
    loaded: int | None = None
    lines: int = 1
    zero_dropped: bool = False
    grid: str = ""
    metrics_thread: bool = False
    off_grid: tuple[int, ...] = ()


class IndistinctKind(enum.Enum):
    """Why a resume from a checkpoint could not be told from a fresh start."""

    ZERO = "zero"  # checkpoint 0 holds the state of a fresh start
    BEFORE_PROGRESS = "before_progress"  # it came before any progress line
    BEFORE_FIRST_STEP = "before_first_step"  # the first progress line came after it
    WITHIN_STRIDE = "within_stride"  # it lies within the first progress stride


@dataclass(frozen=True, slots=True)
class Indistinct:
    """Why a resume from checkpoint ``step`` could not be told from a fresh start:
    ``first``, the first progress line's step (``BEFORE_FIRST_STEP``); ``stride``, the
    progress stride (``WITHIN_STRIDE``)."""

    kind: IndistinctKind
    step: int
    first: int | None = None
    stride: int | None = None


class BreachKind(enum.Enum):
    """How the job's first lines break the step contract."""

    BACKWARDS = "backwards"  # progress went backwards right after the start
    BELOW_LOADED = "below_loaded"  # the first step after a load was below the loaded step
    ZERO_FIRST = "zero_first"  # the first step after a fresh start was 0: progress(epoch)


@dataclass(frozen=True, slots=True)
class Breach:
    """How the job breaks the step contract: ``first``, its first step; ``second``, the
    step after it (``BACKWARDS``); ``loaded``, the checkpoint it loaded (``BELOW_LOADED``)."""

    kind: BreachKind
    first: int
    second: int | None = None
    loaded: int | None = None
