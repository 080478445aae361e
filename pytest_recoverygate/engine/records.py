"""What the ledger keeps of each process, checkpoint and save, and how a replacement
resumed (pure records; :mod:`pytest_recoverygate.engine.ledger` decides what they prove).

- :class:`Inc`: one process the drill heard from (one incarnation id): its start line,
  its load, its progress points and reporting grid, which of its threads printed what
  (:mod:`~pytest_recoverygate.engine.threads`);
- :class:`Checkpoint`: a completed checkpoint line; :class:`Save`: a save the job
  announced with ``checkpoint_started``;
- :class:`Resume`: how a replacement resumed, as far as the evidence goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_recoverygate.engine.facts import Undecided
from pytest_recoverygate.engine.grid import GridTracker
from pytest_recoverygate.engine.threads import Threads
from pytest_recoverygate.engine.verdict import IncarnationInfo

__all__ = ["Checkpoint", "Inc", "Resume", "Save", "save_loaded"]


@dataclass(slots=True)
class Inc:
    """What the drill knows of one process (one incarnation id)."""

    id: str
    rank: int | None
    born: int  # kills before it was first seen; it is "new" for kill number ``born``
    first_seen: float
    start_time: float | None = None
    start_seen: bool = False
    pid: int | None = None
    host: str | None = None
    restart: int | None = None
    first_line: float | None = None  # its first line that is not the start line
    loaded: int | None = None  # checkpoint_loaded before its first progress
    loaded_at: float | None = None
    loaded_digest: str | None = None
    loaded_parts: tuple[tuple[str, str], ...] = ()
    first: tuple[int, float] | None = None  # (step, time) of its first progress line
    second: tuple[int, float] | None = None
    last: tuple[int, float] | None = None
    backwards: tuple[int, int] | None = None  # its first step decrease (from, to)
    ppid: int | None = None
    parent: str | None = None  # the incarnation that started it (a child of a worker)
    world_size: int | None = None
    child: bool = False  # a subprocess or forked child of a known incarnation: no worker
    tracker: GridTracker = field(default_factory=GridTracker)
    points: list[tuple[int, float]] = field(default_factory=list)  # first distinct steps
    lines: int = 0  # progress lines
    advanced: tuple[int, float] | None = None  # its newest line that raised its step
    # issue 33 (engine/rules/replay.py): step -> every (loss, data) line of it, in order
    replay_points: dict[int, tuple[tuple[float | None, str | None], ...]] = field(
        default_factory=dict
    )
    first_lines: int = 0  # lines at its first step before any advance (a timer repeats it)
    loss_decimals: int | None = None  # the fewest decimals a loss it printed had (log lines)
    zero_dropped: bool = False  # it printed 0 before a jump past one stride (a held state)
    before_kill: tuple[int, float] | None = None  # its last line at or before the last kill
    threads: Threads = field(default_factory=Threads)  # which thread printed what (issue 41)

    def info(self) -> IncarnationInfo:
        return IncarnationInfo(
            inc=self.id,
            rank=self.rank,
            pid=self.pid,
            host=self.host,
            restart=self.restart,
            new=self.born > 0,
            first_seen=self.first_seen,
            started=self.start_time,
            loaded_step=self.loaded,
            first_step=self.first[0] if self.first else None,
            last_step=self.last[0] if self.last else None,
            round=self.born,
            parent=self.parent,
            child=self.child,
            world_size=self.world_size,
        )

    def first_past(self, step: int | None) -> tuple[int, float] | None:
        """Its first progress point with a step above ``step`` (the first step it trained)."""
        if step is None:
            return self.first
        return next((p for p in self.points if p[0] > step), None)

    def only_zero(self) -> bool:
        """Whether every progress line it printed said 0 steps completed (no step yet)."""
        return self.first is not None and self.first[0] == 0 and self.advanced == self.first

    def only_held(self, step: int) -> bool:
        """Whether it printed progress, every line 0 or ``step`` (no step completed yet)."""
        return self.first is not None and all(s in (0, step) for s, _ in self.points)

    def forget_progress(self) -> None:
        """Drop its progress lines (lines of the state it held before it loaded)."""
        self.first = self.second = self.last = self.advanced = self.backwards = None
        self.tracker = GridTracker()
        self.points = []
        self.lines = 0
        self.first_lines = 0

    def first_trained(self, resume: Resume) -> tuple[int, float] | None:
        """Its first step past the resume: a first line at the loaded step (a line of the
        state it holds, not a step) does not count; a progress-only resume counts its
        first line."""
        if resume.loaded is None or resume.replayed or not resume.held_line:
            return self.first
        return self.first_past(resume.loaded)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    step: int
    time: float
    inc: str
    after_kill: bool
    digest: str | None = None
    parts: tuple[tuple[str, str], ...] = ()
    lineage: str = ""  # the worker it came from (a forked writer's parent), else ``inc``


def save_loaded(saves: list[Checkpoint], step: int, inc: Inc) -> Checkpoint | None:
    """The save of ``step`` with a digest that ``inc`` can have loaded: the newest one
    completed by its load (or its first line, when it reported no load time) and made by
    another process than ``inc`` (neither it nor a writer it forked). A save of the same
    step made after the load -- the replacement saving at the top of its loop the state it
    just loaded -- holds what it loaded, not what was saved before: comparing with it
    would pass any state. None: no such save."""
    by = inc.loaded_at if inc.loaded_at is not None else inc.first_line
    return next(
        (
            c
            for c in reversed(saves)
            if c.step == step
            and c.digest is not None
            and inc.id not in (c.inc, c.lineage)
            and (by is None or c.time <= by)
        ),
        None,
    )


@dataclass(slots=True)
class Save:
    """A checkpoint save the job announced with ``checkpoint_started``."""

    step: int
    started: float
    rank: int | None
    completed: float | None = None


@dataclass(frozen=True, slots=True)
class Resume:
    """How a replacement resumed, as far as the evidence goes."""

    step: int | None  # the step it resumed counting from (first progress - stride)
    loaded: int | None = None
    replayed: bool = False  # it loaded ``loaded`` and then completed a step <= loaded again
    undecided: Undecided | None = None  # why the step cannot be told (rules.wording words it)
    # What holds whatever the reporting grid: the replacement resumed from at most this
    # step (its first line, minus one when the job's lines come after steps).
    upper: int | None = None
    held_line: bool = False  # its first line was the loaded step itself, before any step

    @property
    def basis(self) -> str:
        """How the step is known: ``checkpoint_loaded``, ``inferred`` (from the reporting
        grid), or ``unknown`` (only the grid-free upper bound holds)."""
        if self.loaded is not None:
            return "checkpoint_loaded"
        return "inferred" if self.step is not None else "unknown"
