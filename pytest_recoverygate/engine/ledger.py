"""The ledger of the job's own lines, and what they prove about one recovery (pure).

:class:`Ledger` records every reporter line of the reporting rank (incarnations,
progress, checkpoints started and completed, digests) and, for the kill under judgement,
answers the questions a verdict rests on:

- **the step contract**, from the first incarnation's first two progress lines;
- **the resume step** of a replacement: its ``checkpoint_loaded`` (checked against its
  first step) or its first step minus the stride, only where that inference is sound;
- **the expected step**: with ``latest``, the newest checkpoint durable before the
  replacement loaded (a survivor's checkpoint after the kill included);
- **the last step before the kill**, proven and bounded (the fastest rate seen).

Nothing here has a clock, a phase or an action: :mod:`pytest_recoverygate.engine.machine`
decides *when* to judge; this module decides *what* the evidence says.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter, deque
from dataclasses import dataclass, field

from pytest_recoverygate.engine.caps import MAX_REPLAY_POINTS, MAX_STEP_LINES, no_room
from pytest_recoverygate.engine.facts import (
    Breach,
    BreachKind,
    Indistinct,
    IndistinctKind,
    Undecided,
    UndecidedKind,
)
from pytest_recoverygate.engine.grid import held_ticks
from pytest_recoverygate.engine.model import TrainingEvent, TrainingEventKind
from pytest_recoverygate.engine.rankless import RanklessLines
from pytest_recoverygate.engine.records import Checkpoint, Inc, Resume, Save
from pytest_recoverygate.engine.verdict import FailureReason, StepContract

__all__ = ["Ledger"]

R = FailureReason


@dataclass(slots=True)
class _Round:
    """Trackers for the kill under judgement (reset when the next kill is armed)."""

    kill_time: float | None = None
    pre: tuple[int, float] | None = None  # newest progress point stamped <= the kill
    recent: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=16))
    pre_ckpt: int = -1
    post_first: tuple[int, float] | None = None  # a survivor's first line after the kill
    post_max: int = -1
    # A kill inside the recovery of the one before (KillDuringRecovery's second): the
    # earlier kill's time, and whether any progress or checkpoint line is stamped between
    # the two (the first such line after a kill, until a second comes).
    cut_at: float | None = None
    first_after: float | None = None
    between: bool = False


class Ledger:
    """Every reporter line of the reporting rank, and what it proves about one kill."""

    def __init__(self) -> None:
        self.incs: dict[str, Inc] = {}
        self.order: list[Inc] = []
        self.checkpoints: list[Checkpoint] = []
        self.saves: dict[int, Save] = {}
        self.kills = 0  # kills so far; the one under judgement is number ``kills``
        self.open = False  # a kill is under judgement: its replacements are "new"
        self.round = _Round()
        self.current_step: int | None = None
        self.advance_gap = 0.0  # the longest gap between advancing lines of the old workers
        self.ignored_lines = 0  # lines not of this run (stamped before it), not evidence
        self.ignored_incs: set[str] = set()
        # The other ranks' start and checkpoint lines (each rank's resume is held to the step)
        self.others: dict[str, Inc] = {}
        # rank -> step -> its saves of the step, in order (caps.MAX_SAVES_OF_A_STEP)
        self.rank_saves: dict[int, dict[int, list[Checkpoint]]] = {}
        self.capped_lines = 0  # lines past MAX_INCARNATIONS / MAX_CHECKPOINTS: not evidence
        self.checkpoint_lines: Counter[TrainingEventKind] = Counter()  # accepted, per kind
        self.started_ranks: set[int] = set()  # the other ranks seen starting a save
        self.not_durable: set[int] = set()  # StorageFault: failed saves counted anyway
        self.damaged: dict[int, tuple[str, ...]] = {}  # StickyFault: step -> files damaged
        self.rankless = RanklessLines()  # issue 41: rank-less lines once ranked ones came

    def over_cap(self, event: TrainingEvent, *, other: bool) -> bool:
        """Whether the ledger has no room left for ``event`` (:func:`.caps.no_room`); such
        a line is counted in :attr:`capped_lines`, never used."""
        saves = self.rank_saves.get(event.rank, {}) if other and event.rank is not None else {}
        pool = self.others if other else self.incs
        full = no_room(event, pool, saves, self.checkpoint_lines, other=other)
        self.capped_lines += full
        return full

    # ------------------------------------------------------------------ recording

    def incarnation(self, event: TrainingEvent) -> Inc:
        """The incarnation of ``event``, created (new or old for this kill) on first sight."""
        inc = self.incs.get(event.incarnation)
        if inc is None:
            inc = self._first_sight(event)
            self.incs[event.incarnation] = inc
            self.order.append(inc)
        inc.threads.saw(event)
        return inc

    def _first_sight(self, event: TrainingEvent) -> Inc:
        """The incarnation ``event`` is the first line of: new or old for this kill."""
        kill = self.round.kill_time
        if kill is not None:
            born = self.kills if event.timestamp > kill else max(self.kills - 1, 0)
        else:  # before the first kill, or between two kills (old for the next one)
            born = self.kills
        return Inc(event.incarnation, event.rank, born, event.timestamp)

    def is_new(self, inc: Inc) -> bool:
        """A replacement for the kill under judgement (a worker, never a child of one)."""
        new = self.open and inc.born == self.kills > 0
        return new and not self.is_child(inc) and not self.rankless.stands_in(inc.rank)

    def other_rank(self, event: TrainingEvent) -> None:
        """A start or checkpoint line of a rank other than the reporting one."""
        inc = self.others.get(event.incarnation)
        if inc is None:
            inc = self._first_sight(event)
            self.others[event.incarnation] = inc
        if event.kind is TrainingEventKind.START:
            self.start(inc, event)
            return
        if event.step is None:
            return
        if event.kind is TrainingEventKind.CHECKPOINT_LOADED:
            if inc.loaded is None and inc.first_line is None:
                inc.loaded, inc.loaded_at = event.step, event.timestamp
                inc.loaded_digest, inc.loaded_parts = event.digest, event.digest_parts
            return
        if event.kind is TrainingEventKind.CHECKPOINT_STARTED and inc.rank is not None:
            self.started_ranks.add(inc.rank)
            return
        if event.kind is TrainingEventKind.CHECKPOINT_COMPLETED and inc.rank is not None:
            if inc.first_line is None:
                inc.first_line = event.timestamp
            self.rank_saves.setdefault(inc.rank, {}).setdefault(event.step, []).append(
                Checkpoint(
                    event.step,
                    event.timestamp,
                    inc.id,
                    self.round.kill_time is not None and event.timestamp > self.round.kill_time,
                    event.digest,
                    event.digest_parts,
                )
            )

    def start(self, inc: Inc, event: TrainingEvent) -> None:
        inc.start_seen = True
        inc.start_time = event.timestamp
        inc.pid = event.pid
        inc.host = event.host
        inc.ppid = event.ppid
        inc.parent = event.parent
        inc.world_size = event.world_size

    def world_size(self, born: int) -> int | None:
        """The WORLD_SIZE on the newest start line of the workers of round ``born``.

        Round 0 is the group before the first kill, round ``k`` the group that came back
        after kill ``k`` (every rank's start line counts, the reporting rank's or not; a
        worker's child does not). ``None`` when no such start line carries it.
        """
        sized = [
            inc
            for inc in itertools.chain(self.order, self.others.values())
            if inc.born == born and inc.world_size is not None and not self.is_child(inc)
        ]
        newest = max(sized, key=lambda i: i.start_time or i.first_seen, default=None)
        return newest.world_size if newest is not None else None

    def is_child(self, inc: Inc) -> bool:
        """A subprocess or forked child of another process the drill heard from.

        Its start line names its parent's incarnation (the reporter passes it down), or
        its parent pid is a known process's on the same host. A child of a worker
        (warm-up, evaluation, data preparation, a forked checkpoint writer) inherits RANK
        but is never a worker of the group, so never the replacement of a killed one.
        """
        if inc.child:
            return True
        parent = (self.incs.get(inc.parent) or self.others.get(inc.parent)) if inc.parent else None
        if parent is None and inc.ppid is not None:
            known = itertools.chain(self.order, self.others.values())
            parent = next(
                (o for o in known if o is not inc and o.pid == inc.ppid and o.host == inc.host),
                None,
            )
        # A child inherits RANK: a process of another rank started by a worker (Lightning's
        # launcher starts ranks 1..N-1 from rank 0) is a worker itself.
        same_rank = (
            parent is None or parent.rank is None or inc.rank is None or (parent.rank == inc.rank)
        )
        if parent is not None and parent is not inc and same_rank:
            inc.child = True
            inc.parent = parent.id
        return inc.child

    def names_launcher(self, inc: Inc) -> bool:
        """Whether the parent ``inc`` names, never heard from, was named by a worker of an
        earlier group too: a launcher that loaded the reporter and printed nothing (it
        outlives the groups it starts), not a worker whose child ``inc`` may be."""
        parent = inc.parent
        if parent is None or parent in self.incs or parent in self.others:
            return False
        return any(
            o is not inc and o.parent == parent and o.born < inc.born and not self.is_child(o)
            for o in itertools.chain(self.order, self.others.values())
        )

    def root(self, inc: Inc) -> Inc:
        """The worker a child descends from (itself for a worker)."""
        seen = {inc.id}
        while self.is_child(inc) and inc.parent in self.incs and inc.parent not in seen:
            inc = self.incs[inc.parent]
            seen.add(inc.id)
        return inc

    def loaded(self, inc: Inc, event: TrainingEvent) -> None:
        if inc.loaded is None and event.step is not None and inc.only_held(event.step):
            # Its lines so far said 0 steps completed, or the step it now loads (a metrics
            # thread ticking while the checkpoint loads, a counter restored before the
            # weights): lines of the state before the load, no step of it.
            inc.forget_progress()
        if inc.first is None and event.step is not None:
            inc.loaded = event.step
            inc.loaded_at = event.timestamp
            inc.loaded_digest = event.digest
            inc.loaded_parts = event.digest_parts

    def progress(
        self,
        inc: Inc,
        step: int,
        at: float,
        *,
        new: bool,
        point: TrainingEvent | None = None,
    ) -> None:
        loss, data = (point.loss, point.data) if point is not None else (None, None)
        if point is not None and point.loss_decimals is not None:  # issue 41: as printed
            held, printed = inc.loss_decimals, point.loss_decimals
            inc.loss_decimals = printed if held is None else min(held, printed)
        if loss is not None or data is not None:  # issue 33: kept for engine/rules/replay.py
            points = inc.replay_points
            seen = points.pop(step, ())  # a step reported again: every line, newest place
            points[step] = (*seen, (loss, data)) if len(seen) < MAX_STEP_LINES else seen
            if len(points) > MAX_REPLAY_POINTS:
                del points[next(iter(points))]
        if new and step > 0 and inc.loaded is None and inc.only_zero():
            contract = self.contract()
            # With progress(epoch), 0 is a step, unless the next line jumps past one stride:
            # no fresh start's next epoch, so the 0 was a line of the state before the load.
            if contract.breach is None or step > (contract.stride or 1):
                inc.forget_progress()  # 0 steps completed: lines of the state before a step
                inc.zero_dropped = True
        if inc.first is not None and step == inc.first[0] and inc.advanced == inc.first:
            inc.first_lines += 1
        if inc.first is None:
            inc.first_lines = 1
            inc.first = (step, at)
            held = inc.loaded if inc.loaded is not None else (0 if inc.start_seen else None)
            if new and inc.loaded is None:
                held = None  # a replacement without checkpoint_loaded: its state is unknown
            inc.tracker.add(step, held)
        else:
            if inc.second is None:
                inc.second = (step, at)
            inc.tracker.add(step, None)
        inc.lines += 1
        if (not inc.points or step != inc.points[-1][0]) and len(inc.points) < 64:
            inc.points.append((step, at))
        last = inc.last
        if last is not None and step < last[0] and inc.backwards is None:
            inc.backwards = (last[0], step)
        if inc.advanced is None or step > inc.advanced[0]:
            if inc.advanced is not None and not new:
                # The longest wait between two advancing lines before the kill (repeated
                # counts of a timer and evaluation pauses included): what a stall must beat.
                self.advance_gap = max(self.advance_gap, at - inc.advanced[1])
            inc.advanced = (step, at)
        inc.last = (step, at)
        self.current_step = step
        rnd = self.round
        kill = rnd.kill_time
        inc.before_kill = (step, at) if kill is None or at <= kill else inc.before_kill
        self._stamped(at)
        if new:
            return
        if kill is None or at <= kill:
            if rnd.pre is None or step >= rnd.pre[0]:
                rnd.pre = (step, at)
                rnd.recent.append((step, at))
        else:  # a survivor still training after the kill
            if rnd.post_first is None or at < rnd.post_first[1]:
                rnd.post_first = (step, at)
            rnd.post_max = max(rnd.post_max, step)

    def checkpoint(self, inc: Inc, event: TrainingEvent, *, new: bool) -> Checkpoint:
        assert event.step is not None
        self._stamped(event.timestamp)
        kill = self.round.kill_time
        after_kill = kill is not None and event.timestamp > kill
        ckpt = Checkpoint(
            event.step,
            event.timestamp,
            inc.id,
            after_kill,
            event.digest,
            event.digest_parts,
            self.root(inc).id,
        )
        self.checkpoints.append(ckpt)
        save = self.saves.get(event.step)
        if save is not None and save.completed is None:
            save.completed = event.timestamp
        if not new and not after_kill:
            self.round.pre_ckpt = max(self.round.pre_ckpt, event.step)
        return ckpt

    def save_started(self, inc: Inc, event: TrainingEvent) -> Save:
        assert event.step is not None
        save = Save(event.step, event.timestamp, event.rank if event.rank is not None else inc.rank)
        self.saves.setdefault(event.step, save)
        return self.saves[event.step]

    # ------------------------------------------------------------------ rounds

    def _stamped(self, at: float) -> None:
        """A progress or checkpoint line of any incarnation, stamped ``at``: is it one
        between a kill and a second kill inside its recovery (see :meth:`last_before_kill`)?"""
        rnd = self.round
        if rnd.kill_time is None:
            return
        if rnd.cut_at is None:
            if at > rnd.kill_time and (rnd.first_after is None or at < rnd.first_after):
                rnd.first_after = at
        elif rnd.cut_at < at <= rnd.kill_time:
            rnd.between = True

    def killed(self, at: float) -> None:
        """A kill happened: its replacements are judged until :meth:`closed`. A kill while
        the previous one is still under judgement (KillDuringRecovery's second, inside
        the recovery of the first) keeps the round: the lines before the first kill stay
        its "before"."""
        self.kills += 1
        rnd = self.round
        if self.open and rnd.kill_time is not None and rnd.cut_at is None:
            rnd.cut_at = rnd.kill_time
            rnd.between = rnd.first_after is not None and rnd.first_after <= at
        self.open = True
        rnd.kill_time = at

    def closed(self, judged: Inc | None) -> None:
        """The kill was judged: the lineage it left is the "before" of the next kill."""
        self.open = False
        rnd = _Round()
        if judged is not None:
            for point in (judged.first, judged.second, judged.last):
                if point is not None and (rnd.pre is None or point[0] >= rnd.pre[0]):
                    rnd.pre = point
                    rnd.recent.append(point)
        self.round = rnd

    # ------------------------------------------------------------------ the contract

    def baseline(self) -> Inc | None:
        """The first worker (no child of one) that reported progress before the first kill."""
        for inc in self.order:
            if inc.born == 0 and inc.first is not None and not self.is_child(inc):
                return inc
        return None

    def contract(self) -> StepContract:
        """The step contract and the reporting grid, learned from every line of the baseline.

        The grid comes from :class:`~pytest_recoverygate.engine.grid.GridTracker` (every line,
        not only the first two); a first line equal to the state held (0 at a fresh start,
        the loaded step) is a line of that state, not a step — except ``0, 1, …`` at a
        fresh start, which is what a job reporting ``progress(epoch)`` prints.
        """
        base = self.baseline()
        if base is None or base.first is None:
            return StepContract()
        first = base.first[0]
        grid = base.tracker.grid()
        # Only a process's first progress calls are always printed (the replay window): without its
        # start line, the first lines seen may be rate-limited ones, not its first calls.
        if not base.start_seen and base.loaded is None:
            return StepContract(first_step=first, grid=grid.describe(), regular=None)
        stride = grid.stride if grid.regular else None
        metrics = base.threads.metrics_thread()
        breach: Breach | None = None
        fresh: bool | None = None
        resumed: int | None = None
        second = base.second[0] if base.second is not None else None
        if second is not None and second < first:
            breach = Breach(BreachKind.BACKWARDS, first, second=second)
        if base.loaded is not None:
            fresh, resumed = False, base.loaded
            if first < base.loaded:
                breach = breach or Breach(BreachKind.BELOW_LOADED, first, loaded=base.loaded)
        elif (
            first == 0
            and grid.first_line in (None, 1)
            and base.tracker.held_lines < 2
            and not metrics
        ):
            # One 0, then 1: progress(epoch) after each epoch. The count 0 on several lines
            # (progress(global_step) per micro-batch, a timer) is the fresh state held, and
            # a metrics thread's 0 then 1 is its samples around a slow first step.
            fresh = True
            breach = breach or Breach(BreachKind.ZERO_FIRST, first)
        elif grid.held_line:
            fresh = True  # a line of the fresh state (0) before the first step
        elif stride is not None and not grid.first_special and first > stride:
            fresh, resumed = False, first - stride
        elif stride is not None or first == 1:
            fresh = True
        # The job's own lines show that a process's first line comes after a step (not a
        # line of the state it holds): then a replacement's first line F means it resumed
        # from at most F - 1.
        seen = base.start_seen or base.loaded is not None  # its first line is its first call
        after_step = bool(
            breach is None and not grid.held_line and seen and grid.regular is not False
        )
        held_line = grid.held_line and breach is None and grid.first_line is not None
        return StepContract(
            grid.first_line if held_line and grid.first_line is not None else first,
            stride,
            fresh,
            resumed,
            grid=grid.describe(),
            regular=grid.regular,
            first_special=grid.first_special,
            first_line_is_step=after_step,
            metrics_thread=metrics,
            breach=breach,
        )

    def indistinguishable(self, step: int) -> Indistinct | None:
        """Why a resume from this checkpoint could not be told from a fresh start, if so."""
        if step == 0:
            return Indistinct(IndistinctKind.ZERO, step)
        base = self.baseline()
        if base is None and any(i.start_seen for i in self.order):
            return Indistinct(IndistinctKind.BEFORE_PROGRESS, step)
        if (
            base is not None
            and base.start_seen
            and base.first is not None
            and (base.first[0] > step)
        ):
            return Indistinct(IndistinctKind.BEFORE_FIRST_STEP, step, first=base.first[0])
        stride = self.contract().stride
        if stride is not None and stride > 1 and step < stride:
            return Indistinct(IndistinctKind.WITHIN_STRIDE, step, stride=stride)
        return None

    def stride_for(self, inc: Inc) -> int | None:
        contract = self.contract()
        if contract.stride is not None and contract.breach is None:
            return contract.stride
        if contract.regular is False:
            return None  # the job's lines keep no grid: no process's two lines make one
        grid = inc.tracker.grid()
        return grid.stride if grid.regular and not grid.first_special else None

    # ------------------------------------------------------------------ the resume

    def resume_of(self, inc: Inc, *, final: bool) -> Resume | None:
        """The resume step of a replacement that reported progress (None: wait for more).

        With ``checkpoint_loaded(L)``: a line below L, or L as its first step when the
        job's lines come after steps, is a replay; L as a first line of a job whose lines
        may show the state held (a timer ticking at start, a metrics thread:
        :mod:`~.threads`) is no step at all. Without it, the step is inferred from the
        reporting grid where the job keeps one, and ``upper`` (its first line, minus one
        when lines come after steps) is what holds whatever the grid; first lines that may
        be a timer ticking the state it holds, at a checkpoint's step, leave it undecided
        (:func:`~.grid.held_ticks`).
        """
        assert inc.first is not None
        contract = self.contract()
        first = inc.first[0]
        stride = self.stride_for(inc)
        # A metrics thread's first tick races the first step: its lines prove no order.
        stepwise = contract.first_line_is_step and not contract.metrics_thread
        if inc.loaded is not None:
            return self._resume_loaded(inc, inc.loaded, final)
        upper = max(first - 1, 0) if stepwise else first
        ticked = held_ticks(first, inc.first_lines, inc.zero_dropped)  # (a timer's ticks)
        saved = {c.step for c in self.checkpoints}
        if ticked and stepwise and inc.advanced != inc.first and first in saved:
            return Resume(None, upper=first, undecided=ticked)
        if (contract.regular is False or contract.metrics_thread) and contract.breach is None:
            why = Undecided(
                UndecidedKind.NO_GRID,
                first,
                upper=upper,
                grid=contract.grid,
                metrics_thread=contract.metrics_thread,
            )
            return Resume(None, upper=upper, undecided=why)
        if first <= 1 or (stride is not None and first <= stride and not contract.first_special):
            return Resume(0, upper=upper)
        if contract.first_special and contract.breach is None:
            return Resume(first - 1, upper=upper)
        if stride is None:
            if not final:
                return None
            return Resume(None, upper=upper, undecided=Undecided(UndecidedKind.ONE_LINE, first))
        step = first - stride
        off_grid = [c.step for c in self.checkpoints if c.step % stride]
        if stride > 1 and off_grid:
            why = Undecided(UndecidedKind.OFF_GRID, first, stride=stride, off_grid=tuple(off_grid))
            return Resume(step, upper=upper, undecided=why)
        return Resume(step, upper=upper)

    def _resume_loaded(self, inc: Inc, loaded: int, final: bool) -> Resume | None:
        """:meth:`resume_of` of a replacement that reported ``checkpoint_loaded(loaded)``."""
        assert inc.first is not None
        contract, first, stride = self.contract(), inc.first[0], self.stride_for(inc)
        # Its line at the loaded step is a metrics thread's tick of the state it holds when
        # its progress, like the first run's, came from a thread that saved or loaded nothing.
        ticker = contract.metrics_thread and inc.threads.metrics_thread()
        stepwise = contract.first_line_is_step and not ticker
        if first < loaded or (first == loaded and (stepwise or contract.breach is not None)):
            # It completed a step at or below the one it loaded: done again.
            counts = max(first - stride, 0) if stride else (0 if first <= 1 else None)
            return Resume(counts, loaded, replayed=True)
        held = first == loaded
        past = inc.first_past(loaded) if held else inc.first
        if past is None:
            # Only a line of the state it holds so far: the next one says more.
            return Resume(loaded, loaded, held_line=True) if final else None
        first = past[0]
        if stride is None or ticker:  # a metrics thread's samples bound no step either
            if first == loaded + 1 or contract.regular is False or ticker:
                return Resume(loaded, loaded, held_line=held)
            if not final:
                return None
            why = Undecided(UndecidedKind.LOADED_ONE_LINE, first, loaded=loaded)
            return Resume(loaded, loaded, held_line=held, undecided=why)
        within = loaded + 1 if contract.first_special else loaded + stride
        if first > max(within, loaded + 1):
            why = Undecided(UndecidedKind.LOADED_FAR, first, stride=stride, loaded=loaded)
            return Resume(loaded, loaded, held_line=held, undecided=why)
        return Resume(loaded, loaded, held_line=held)

    def load_window(self, inc: Inc) -> tuple[float, float]:
        """(the replacement started, it had loaded): checkpoints durable in between count."""
        started = inc.start_time if inc.start_time is not None else inc.first_seen
        if inc.loaded_at is not None:
            loaded = inc.loaded_at
        elif inc.first is not None:
            loaded = inc.first[1]
        else:
            loaded = started
        return min(started, loaded), loaded

    def before(self, inc: Inc) -> list[Checkpoint]:
        """The checkpoints completed before ``inc`` reported its first step (or loaded)."""
        limit = inc.first[1] if inc.first is not None else self.load_window(inc)[1]
        return [c for c in self.checkpoints if c.time <= limit]

    def expected(self, inc: Inc | None, explicit: int | None) -> tuple[int | None, int | None]:
        """(expected resume step, the newest checkpoint durable before the replacement started).

        With ``latest`` the expected step is the newest checkpoint durable before the
        replacement loaded; any checkpoint that became durable while it was starting and
        loading (between the two) is a legitimate latest too.
        """
        if explicit is not None:
            return explicit, explicit
        bad = self.not_durable
        if inc is None:
            kill = self.round.kill_time
            done = [
                c.step
                for c in self.checkpoints
                if (kill is None or c.time <= kill) and c.step not in bad
            ]
            return (max(done) if done else None), (max(done) if done else None)
        started, loaded = self.load_window(inc)
        durable = [c.step for c in self.checkpoints if c.time <= loaded and c.step not in bad]
        before = [c.step for c in self.checkpoints if c.time <= started and c.step not in bad]
        expected = max(durable) if durable else None
        floor = max(before) if before else expected
        return expected, floor

    def unreported_shards(self, by: float) -> dict[int, list[int]]:
        """Checkpoints of the reporting rank durable by ``by`` that another rank, one that
        reported its own save of an earlier checkpoint (its shard), never reported by then:
        step -> those ranks. Its shard may be torn (the kill cut it), or complete with its
        report cut: the lines cannot tell."""
        out: dict[int, list[int]] = {}
        for step in sorted({c.step for c in self.checkpoints if c.time <= by}):
            for rank, saved in sorted(self.rank_saves.items()):
                done = saved.get(step)
                if any(s < step for s in saved) and (not done or done[0].time > by):
                    out.setdefault(step, []).append(rank)
        return out

    def torn(self) -> set[int]:
        """Saves started before the kill and never completed: the torn checkpoints."""
        kill = self.round.kill_time
        if kill is None:
            return set()
        done = {c.step for c in self.checkpoints}
        return {s.step for s in self.saves.values() if s.started <= kill and s.step not in done}

    def cut(self) -> dict[int, float]:
        """Saves started before the kill whose completion was not reported before it:
        step -> seconds from the save's start to the kill. Torn, or complete on disk and
        reported late (after a barrier, at the next hook): the lines cannot tell which."""
        kill = self.round.kill_time
        if kill is None:
            return {}
        done = {c.step for c in self.checkpoints if c.time <= kill}
        return {
            s.step: kill - s.started
            for s in self.saves.values()
            if s.started <= kill and s.step not in done
        }

    # ------------------------------------------------------------------ step bounds

    def rate(self, judged: Inc | None = None) -> float | None:
        """The fastest step rate among the last pre-kill progress lines (steps/s).

        With fewer than two lines before the kill, the replacement's first two lines (the
        same job at the same step time) stand in.
        """
        best: float | None = None
        points = list(self.round.recent)
        if len(points) < 2 and judged is not None and judged.first and judged.second:
            points = [judged.first, judged.second]
        for (s0, t0), (s1, t1) in itertools.pairwise(points):
            if s1 > s0 and t1 > t0:
                rate = (s1 - s0) / (t1 - t0)
                best = rate if best is None else max(best, rate)
        return best

    def last_before_kill(self, judged: Inc | None = None) -> tuple[int | None, int | None]:
        """(proven, bound) of the last step completed before the kill.

        Proven: the highest step reported (progress or checkpoint) stamped at or before
        the kill. Bound: the last pre-kill line extrapolated to the kill at the fastest
        step rate seen just before it, capped by the first line a survivor printed after
        the kill (that step had not completed at the kill).

        A second kill inside the recovery of the first with no progress or checkpoint
        line of anyone stamped between the two: nothing trained longer than one line gap
        unseen after the first kill (the reporter prints at least one line per interval
        while training goes on, as :meth:`reach_bound` reads it), so the line is
        extrapolated to the first kill plus the longest gap seen, plus one stride, not over
        the whole first recovery. With a line between them, the extrapolation runs to the
        second kill as for any kill.
        """
        rnd = self.round
        if rnd.kill_time is None:
            return None, None
        pre_step = rnd.pre[0] if rnd.pre is not None else -1
        proven = max(pre_step, rnd.pre_ckpt)
        if proven < 0:
            return None, None
        bound: int | None = None
        rate = self.rate(judged)
        if rnd.pre is not None and rate is not None:
            end, extra = rnd.kill_time, 0
            quiet = self._quiet_gap() if rnd.cut_at is not None and not rnd.between else None
            if quiet is not None:
                assert rnd.cut_at is not None
                end, extra = min(end, rnd.cut_at + quiet), self.contract().stride or 1
            gap = max(end - rnd.pre[1], 0.0)
            bound = rnd.pre[0] + math.ceil(rate * gap - 1e-9) + extra
        if rnd.post_first is not None:
            bound = rnd.post_first[0] if bound is None else min(bound, rnd.post_first[0])
        if bound is not None:
            bound = max(bound, proven)
        return proven, bound

    def _quiet_gap(self) -> float | None:
        """The longest wait between two lines of the old workers before the kill (None:
        fewer than two lines seen)."""
        points = list(self.round.recent)
        gaps = [t1 - t0 for (_, t0), (_, t1) in itertools.pairwise(points)]
        if not gaps:
            return None
        return max(*gaps, self.advance_gap)

    def reach_bound(self) -> int | None:
        """The highest step the old incarnations can have reached.

        The reporter prints at least one line per interval while training goes on, so a
        process that reached further than one line gap (at the fastest rate seen) past its
        last line would have printed again: the bound is the highest old step seen plus
        the steps of the longest line gap seen, plus one stride.
        """
        rnd = self.round
        kill = rnd.kill_time
        old_ckpts = [
            c.step for c in self.checkpoints if kill is None or c.time <= kill or c.after_kill
        ]
        highest = max(
            rnd.post_max, rnd.pre[0] if rnd.pre else -1, rnd.pre_ckpt, max(old_ckpts, default=-1)
        )
        if highest < 0:
            return None
        rate = self.rate()
        points = list(rnd.recent)
        gaps = [t1 - t0 for (_, t0), (_, t1) in itertools.pairwise(points)]
        stride = self.contract().stride or 1
        if rate is None or not gaps:
            return highest + stride
        return highest + math.ceil(rate * max(gaps)) + stride

    def stall_limit(self) -> float:
        """How long without an advancing progress line proves a stall after the resume:
        three times the longest gap between the job's advancing lines before the kill,
        and at least 5 s."""
        return max(5.0, 3.0 * self.advance_gap)

    def save_seconds(self) -> float | None:
        """The median time from checkpoint_started to checkpoint_completed seen so far."""
        spans = [
            s.completed - s.started
            for s in self.saves.values()
            if s.completed is not None and s.completed >= s.started
        ]
        return statistics.median(spans) if spans else None

    def interval(self, since: float | None = None) -> tuple[float, float] | None:
        """(seconds, steps) between consecutive checkpoints of one worker (medians).

        Only checkpoints of the same worker's lineage are paired (its own and those its
        forked writers completed), so the time a kill and its recovery took never counts
        as a checkpoint interval, and a job whose every checkpoint comes from a new
        writer process still has one. ``None`` until two.
        """
        by_inc: dict[str, list[tuple[float, int]]] = {}
        for c in self.checkpoints:
            if since is None or c.time > since:
                by_inc.setdefault(c.lineage or c.inc, []).append((c.time, c.step))
        gaps = [
            (t1 - t0, s1 - s0)
            for done in by_inc.values()
            for (t0, s0), (t1, s1) in itertools.pairwise(sorted(done))
            if t1 > t0 and s1 > s0
        ]
        if not gaps:
            return None
        return (statistics.median(g[0] for g in gaps), statistics.median(g[1] for g in gaps))

    # ------------------------------------------------------------------ the checks
