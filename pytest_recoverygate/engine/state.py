"""The drill state machine's state: its phases and actions, the record it keeps, its
deadlines and status line, when an armed kill lands (each fault's and ``delay``'s
timing) and the result it reports; pure, like the rest of the engine.

:class:`DrillState` is the base of :class:`~pytest_recoverygate.engine.machine.DrillEngine`,
which adds how the drill reacts to events, kill results and ticks.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Any

from pytest_recoverygate.engine.advice import steps_fix
from pytest_recoverygate.engine.caps import MAX_CHECKPOINTS, MAX_INCARNATIONS
from pytest_recoverygate.engine.ledger import Ledger
from pytest_recoverygate.engine.live import LiveJudge
from pytest_recoverygate.engine.model import (
    GroupEvent,
    GroupEventKind,
    LiveRecovery,
    TimelineEntry,
    TrainingEvent,
)
from pytest_recoverygate.engine.recovery import (
    KillRecord,
    breakdown,
    overall,
    restarts,
)
from pytest_recoverygate.engine.rules import wording
from pytest_recoverygate.engine.spec import (
    DETECTED_FAULTS,
    DrillSpec,
)
from pytest_recoverygate.engine.storage import StorageRecord
from pytest_recoverygate.engine.verdict import (
    Check,
    DrillResult,
    Recovery,
    StepContract,
    Verdict,
    format_seconds,
)

__all__ = [
    "MAX_REAIMS",
    "TRANSITIONS",
    "Action",
    "DrillState",
    "Finish",
    "IllegalTransition",
    "KillTarget",
    "Phase",
    "RestoreTarget",
]


class Phase(enum.Enum):
    """Where the drill is; see the module docstring and :data:`TRANSITIONS`."""

    DISCOVERING = "discovering"
    WAITING_FOR_CHECKPOINT = "waiting for checkpoint"
    KILLING = "killing"
    FAULTED = "faulted"  # StorageFault armed, StickyFault poisoned: nothing was killed
    RECOVERING = "recovering"
    VERIFYING = "verifying"
    DONE = "done"


#: Every legal phase change. Anything else is a bug and raises :class:`IllegalTransition`.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.DISCOVERING: frozenset({Phase.WAITING_FOR_CHECKPOINT, Phase.DONE}),
    Phase.WAITING_FOR_CHECKPOINT: frozenset({Phase.KILLING, Phase.DONE}),
    Phase.KILLING: frozenset({Phase.RECOVERING, Phase.FAULTED, Phase.DONE}),
    # StorageFault (engine.faulted): the storage is faulty and nothing was killed; the job
    # failing loudly (or killAfter's kill) makes it a recovery
    Phase.FAULTED: frozenset({Phase.RECOVERING, Phase.KILLING, Phase.DONE}),
    # KillDuringRecovery (engine.reentry): the second kill lands inside the first recovery
    Phase.RECOVERING: frozenset(
        {Phase.VERIFYING, Phase.WAITING_FOR_CHECKPOINT, Phase.KILLING, Phase.DONE}
    ),
    Phase.VERIFYING: frozenset({Phase.WAITING_FOR_CHECKPOINT, Phase.KILLING, Phase.DONE}),
    Phase.DONE: frozenset(),
}


#: How many times a ``beforeNextCheckpoint`` kill is aimed again when the save it was to
#: precede completes first (each time from that checkpoint, with twice the margin); after
#: that it lands where it was aimed, and the report names the checkpoints it missed.
MAX_REAIMS = 3


class IllegalTransition(RuntimeError):
    """The engine was asked to move between two phases the table does not connect."""


@dataclass(frozen=True, slots=True)
class KillTarget:
    """Action: inject the failure into the target instance now (exactly once per kill).

    ``rank`` is the rank to hit (the runner finds its current instance); ``fault`` and
    ``grace_period`` say how (a Preempt is SIGTERM, then SIGKILL after the grace period).
    """

    checkpoint_step: int
    index: int = 1
    fault: str = "KillWorker"
    rank: int | None = None
    grace_period: float = 30.0
    node: int | None = None  # node faults: the node index (None: the node of ``rank``)


@dataclass(frozen=True, slots=True)
class RestoreTarget:
    """Action: end the fault on the target now (a PartitionNode's link back up), once.

    ``why`` says what made it due: its ``duration`` passed, the job noticed, or
    ``maxDetectionTime`` passed with nothing noticed.
    """

    index: int
    why: str


@dataclass(frozen=True, slots=True)
class Finish:
    """Action: the drill is over."""

    result: DrillResult


Action = KillTarget | RestoreTarget | Finish


@dataclass(slots=True)
class _Armed:
    """A kill decided but not yet due (its delay runs)."""

    fire_at: float
    step: int
    trigger_time: float
    rank: int | None
    why: str
    save_started: float | None = None  # KillDuringCheckpoint: the save it aims into
    fire_step: int | None = None  # issue 33 (replaySteps): lands once this step is reported


class DrillState:
    """What one drill knows and reports: its phase, the record it keeps, when it must be
    looked at again, when an armed kill lands, and its result. :class:`DrillEngine` is
    this plus how it reacts (pytest_recoverygate.engine.machine)."""

    # ------------------------------------------------------------------ phase

    def __init__(self, spec: DrillSpec, started_at: float) -> None:
        self.spec = spec
        self.phase = Phase.DISCOVERING
        self.started_at = started_at
        self.ledger = Ledger()
        self._timeline: list[TimelineEntry] = []
        self._pending_starts: dict[str, TrainingEvent] = {}
        self._skipped_triggers: set[int] = set()
        self._waiting_since = started_at
        self._next_after: float | None = None  # later kills: checkpoints after this time
        self._armed: _Armed | None = None
        self._slipped: list[int] = []  # checkpoints completed while the armed kill waited
        self._torn_retry = False
        self._reaims = 0  # beforeNextCheckpoint kills aimed again after the save beat them
        self._kill: KillRecord | None = None
        self._recoveries: list[Recovery] = []
        self._gave_up: tuple[int, float, str] | None = None  # (kill index, time, detail)
        self.known_budget: int | None = None
        self.trigger_step: int | None = None
        self.result: DrillResult | None = None
        self.ranks: tuple[int, ...] = ()
        self.not_before: float | None = None
        self._world_size: int | None = None  # the workers found at discovery
        self._restore_at: float | None = None  # PartitionNode: the link back at the latest
        self._restore_pending = False
        # recovery: live (issue 23): its own record and judgement, pytest_recoverygate.engine.live
        self._live = LiveJudge(spec) if spec.recovery == "live" else None
        self._live_result: LiveRecovery | None = None
        self._live_waiting_noted = False
        # StorageFault (issue 40): the record of the fault on the checkpoint folder
        self._storage = StorageRecord(spec.storage) if spec.storage is not None else None

    def _move(self, to: Phase) -> None:
        """The one place the phase changes."""
        if to is self.phase:
            return
        if to not in TRANSITIONS[self.phase]:
            raise IllegalTransition(f"{self.phase.name} -> {to.name} is not a drill transition")
        self.phase = to

    # ------------------------------------------------------------------ inputs, deadlines

    @property
    def kill_time(self) -> float | None:
        return self._kill.time if self._kill is not None else None

    def _replay_wait_note(self) -> str | None:
        """issue 33: while the kill is armed at the trigger checkpoint and waits for the
        ``replaySteps`` step, what it waits for and the last step seen; None otherwise."""
        armed = self._armed
        if armed is None or armed.fire_step is None:
            return None
        step = self.current_step
        seen = f"the last step seen was {step}" if step is not None else "no step was seen since"
        return (
            f"the trigger checkpoint (step {armed.step}) was reached and the kill waits for step "
            f"{armed.fire_step} (expectations.replaySteps: {self.spec.replay_steps}); {seen}"
        )

    @property
    def current_step(self) -> int | None:
        return self.ledger.current_step

    @property
    def resume_step(self) -> int | None:
        kill = self._kill
        return kill.resume.step if kill is not None and kill.resume is not None else None

    @property
    def deadline(self) -> float | None:
        """When :meth:`tick` must be called at the latest (drill clock)."""
        if self.phase is Phase.WAITING_FOR_CHECKPOINT:
            armed = self._armed
            if armed is not None and armed.fire_at < math.inf:
                # The trigger was reached: the kill lands then, whatever timeouts.checkpoint
                # (a delay, or a re-aimed beforeNextCheckpoint kill, may pass it).
                return armed.fire_at
            return self._waiting_since + self.spec.checkpoint_timeout
        if self.phase in (Phase.RECOVERING, Phase.VERIFYING) and self._kill is not None:
            kill = self._kill
            window = kill.window
            if window is not None:
                end = window.last[1] + window.stall_limit  # a stall is proven then
                # ... and never later than the window could have been held after the
                # recovery deadline (processes taking turns must not keep it open)
                cap = (
                    kill.time
                    + self.spec.effective_recovery_timeout
                    + self.spec.sustain.seconds
                    + window.stall_limit
                )
                end = min(end, cap)
            else:
                end = kill.time + self.spec.effective_recovery_timeout
            if self._restore_pending and self._restore_at is not None:
                end = min(end, self._restore_at)
            noticed_by = self._detection_deadline() if window is None else None
            if noticed_by is not None:
                end = min(end, noticed_by)
            if self._live is not None:
                final = kill.time + self.spec.effective_recovery_timeout
                return min(end, self._live_next_look(final))
            return end
        return None

    def _detection_deadline(self) -> float | None:
        """Decided when proven: when a stop or a cut nobody noticed is a FAIL."""
        kill, spec = self._kill, self.spec
        if (
            kill is None
            or spec.fault not in DETECTED_FAULTS
            or spec.max_detection_time is None
            or kill.detected is not None
        ):
            return None
        return kill.time + spec.max_detection_time + spec.recovery_grace

    @property
    def waiting_for(self) -> str:
        """A short description of the trigger the drill waits for."""
        what = "the save of" if self.spec.fault == "KillDuringCheckpoint" else ""
        if self.spec.after_step is not None:
            return f"step {self.spec.after_step}"
        if self._recoveries:
            return f"{what} the next checkpoint after recovery {len(self._recoveries)}".strip()
        if self.spec.after_checkpoint is None:
            return f"{what} the next checkpoint".strip()
        return f"{what} checkpoint >= step {self.spec.after_checkpoint}".strip()

    def note(self, at: float, kind: str, detail: str = "", **data: Any) -> None:
        """Add a line to the drill's one timeline (the runner's notes go here too)."""
        self._timeline.append(TimelineEntry(at, kind, detail, dict(data)))

    def timeline_entries(self) -> list[TimelineEntry]:
        """Every timeline entry so far, in the order noted."""
        return list(self._timeline)

    def status(self, now: float) -> str:
        """What the drill is doing right now, in one sentence for a live display."""
        ev = self.ledger
        if self.phase is Phase.DISCOVERING:
            return "discovering the workload"
        if self.phase is Phase.WAITING_FOR_CHECKPOINT:
            armed = self._armed
            if armed is not None and armed.fire_step is not None:  # issue 33: replaySteps
                return f"{armed.why}; the kill lands at step {armed.fire_step}"
            if armed is not None:
                return (
                    f"{armed.why}; the kill lands in "
                    f"{format_seconds(max(armed.fire_at - now, 0.0))}"
                )
            last = ev.checkpoints[-1].step if ev.checkpoints else None
            seen = f"; last checkpoint step {last}" if last is not None else ""
            return f"waiting for {self.waiting_for}{seen}"
        if self.phase is Phase.KILLING:
            return "killing the target"
        if self.phase in (Phase.RECOVERING, Phase.VERIFYING):
            kill = self._kill
            new = [inc for inc in ev.order if ev.is_new(inc)]
            if not new:
                group = kill.group_seen if kill is not None else {}
                latest = max(group.items(), key=lambda kv: kv[1], default=None)
                what = f"; the backend reports {latest[0].value}" if latest else ""
                return f"killed; waiting for a replacement to report{what}"
            inc = new[-1]
            window = kill.window if kill is not None else None
            if window is not None:
                trained = window.last[0] - window.start[0]
                held = max(window.last[1] - window.start[1], 0.0)
                return (
                    f"the replacement trains: {trained} step(s) over {held:.1f}s since its "
                    f"step {window.start[0]}; holding the recovery for "
                    f"{self.spec.sustain.describe()} of training"
                )
            if inc.first is not None:
                return (
                    f"the replacement's first step was {inc.first[0]}; waiting for its next "
                    "progress line to learn the progress stride"
                )
            if inc.loaded is not None and inc.loaded_at is not None:
                return (
                    f"replacement loaded checkpoint {inc.loaded} "
                    f"{max(now - inc.loaded_at, 0.0):.1f}s ago; no training step yet"
                )
            since = inc.start_time if inc.start_time is not None else inc.first_seen
            return (
                f"replacement process started {max(now - since, 0.0):.1f}s ago; "
                "no training step yet"
            )
        return str(self.phase.value)

    # ------------------------------------------------------------------ when a kill lands

    def _fire_time(self, step: int, at: float) -> tuple[float, str] | None:
        """When the kill triggered by checkpoint ``step`` (seen at ``at``) lands, and why."""
        spec, ev = self.spec, self.ledger
        delay = spec.delay
        if spec.fault == "KillDuringCheckpoint":
            save = ev.save_seconds()
            if self._torn_retry:
                # Half was too late (the start line was read late, or the save sped up):
                # aim earlier, but still inside the save, past its first writes.
                offset = 0.25 * (save or 0.0)
                how = (
                    f"a quarter of the {format_seconds(save or 0.0)} saves take in (the last "
                    "save completed before a later kill)"
                )
            elif save is None and not delay.explicit:
                offset, how = 0.0, "at once (no save time measured yet)"
            elif delay.kind == "seconds" and delay.explicit:
                offset, how = delay.value, f"{format_seconds(delay.value)} into it"
            else:
                fraction = delay.value if delay.kind == "fraction" else 0.5
                offset = fraction * (save or 0.0)
                how = f"{fraction:.0%} of the {format_seconds(save or 0.0)} saves take"
            return at + offset, f"the save of checkpoint {step} started; killing {how}"
        if delay.kind == "seconds":
            if delay.value <= 0 and not delay.explicit and self._replay_wait(step) is not None:
                # issue 33: wait for replaySteps steps past the trigger (see _replay_wait)
                return math.inf, (
                    f"checkpoint {step} completed; waiting for step "
                    f"{self._replay_wait(step)} (replaySteps: {spec.replay_steps}) so the "
                    "replacement redoes steps the killed run reported"
                )
            if delay.value <= 0:
                return at, f"checkpoint {step} completed"
            return at + delay.value, f"checkpoint {step} completed; delay {delay.describe()}"
        since = self._next_after
        interval = ev.interval(since) or (ev.interval() if since is not None else None)
        if interval is None:
            if step not in self._skipped_triggers:
                self._skipped_triggers.add(step)
                self.note(
                    at,
                    "note",
                    f"delay {delay.describe()} needs the checkpoint interval: "
                    f"waiting for another checkpoint after step {step} to measure it",
                )
            return None
        seconds, steps = interval
        if delay.kind == "fraction":
            return at + delay.value * seconds, (
                f"checkpoint {step} completed; the kill lands {delay.value:.0%} into the "
                f"{format_seconds(seconds)} checkpoint interval"
            )
        if delay.kind == "spread":
            total = spec.count or 1
            index = len(self._recoveries)
            fraction = index / total
            return at + fraction * seconds, (
                f"checkpoint {step} completed; kill {index + 1} of {total} lands at "
                f"{fraction:.0%} of the {format_seconds(seconds)} checkpoint interval"
            )
        save = ev.save_seconds() or 0.0
        rate = ev.rate()
        step_time = 1.0 / rate if rate else 0.0
        margin = max(0.1 * seconds, 2 * step_time)
        # aimed again (MAX_REAIMS): twice the margin each time, up to half the time the job
        # trains between saves (half the interval would be all of it when saves are slow)
        margin = max(margin, min(margin * 2**self._reaims, 0.5 * (seconds - save)))
        offset = max(seconds - save - margin, 0.0)
        return at + offset, (
            f"checkpoint {step} completed; the kill lands {format_seconds(offset)} later, "
            f"just before the next save is due (interval {format_seconds(seconds)}, "
            f"{steps:g} steps)"
        )

    def _replay_wait(self, step: int) -> int | None:
        """issue 33: with replay exact or a tolerance and no delay, the step the kill waits
        for (``replaySteps`` past the trigger checkpoint ``step``), so that a default drill
        has replayed steps to compare; None when it does not wait."""
        spec = self.spec
        if not spec.replay.judges or spec.replay_steps <= 0 or spec.delay.explicit:
            return None
        if spec.fault == "KillDuringCheckpoint" or spec.after_step is not None:
            return None
        return step + spec.replay_steps

    def _fire(self, now: float) -> list[Action]:
        armed = self._armed
        assert armed is not None
        self._move(Phase.KILLING)
        return [
            KillTarget(
                armed.step,
                len(self._recoveries) + 1,
                self.spec.fault,
                armed.rank,
                self.spec.grace_period,
                self.spec.target_node,
            )
        ]

    def _checkpoint_beat_the_kill(self, step: int, at: float, *, reaim: bool) -> None:
        """Checkpoint ``step`` completed while the kill armed by an earlier one waited
        (``reaim``: it has not been sent yet)."""
        if reaim and self.spec.delay.kind == "before_next" and self._reaims < MAX_REAIMS:
            # The kill aimed just before this save was late (the drill or its reading of the
            # job lagged, or the job sped up): killing now would be the best case, not the
            # worst. Aim again from this checkpoint (the caller's trigger), a wider margin.
            self._armed = None
            self._reaims += 1
            self.note(
                at,
                "note",
                f"checkpoint {step} completed before the kill aimed just before it had "
                f"landed; aiming again (re-aim {self._reaims} of {MAX_REAIMS}), before the "
                f"save after checkpoint {step}, with a wider margin",
            )
            return
        self.note(
            at,
            "note",
            f"checkpoint {step} completed before the delayed kill "
            "landed: the kill is not before the next checkpoint",
        )
        self._slipped.append(step)

    def _position(self, trigger_time: float, kill_time: float) -> float | None:
        """Where in the checkpoint interval the kill landed (0 right after a checkpoint)."""
        interval = self.ledger.interval()
        if interval is None or interval[0] <= 0:
            return None
        return round(min(max((kill_time - trigger_time) / interval[0], 0.0), 1.0), 4)

    def _world_sizes(self, kill: KillRecord) -> None:
        """Node faults: the world size before and after from the job's start lines (the
        group at the kill, the group that came back), else from the backend; and which."""
        for key, born in (("worldSizeBefore", kill.index - 1), ("worldSizeAfter", kill.index)):
            lines = self.ledger.world_size(born)
            if lines is not None:
                kill.details[key] = lines
            if key in kill.details:
                kill.details[f"{key}From"] = "startLines" if lines is not None else "backend"

    def _fault_details_at_kill(self, kill: KillRecord, armed: _Armed) -> None:
        kill.slipped = list(self._slipped)
        if kill.slipped:
            kill.details["checkpointsBeforeKill"] = list(kill.slipped)
        if self._reaims:
            kill.details["reaims"] = self._reaims
        if armed.save_started is not None:
            kill.details["tornStep"] = armed.step
            kill.details["intoSaveSeconds"] = round(kill.time - armed.save_started, 6)
            kill.details["saveSeconds"] = self.ledger.save_seconds()
        if self.spec.delay.kind in ("fraction", "before_next", "spread") or (
            self.spec.delay.value > 0
        ):
            kill.details["delay"] = self.spec.delay.describe()

    # ------------------------------------------------------------------ output

    def _ended_between_kills(self, event: GroupEvent) -> list[Action]:
        how = "failed" if event.kind is GroupEventKind.JOB_FAILED else "finished"
        step = f" at step {self.current_step}" if self.current_step is not None else ""
        detail = f": {event.detail}" if event.detail else ""
        if not self._recoveries:
            fix = (
                ""
                if event.kind is GroupEventKind.JOB_FAILED
                else "; lengthen the run or pick an earlier injectFailure.afterCheckpoint"
            )
            if self.current_step is None and not self.ledger.checkpoints:
                # Nothing with a step was ever printed: no run is too short for that.
                fix = (
                    ": it printed no progress or checkpoint line with a step, so the drill "
                    f"had nothing to trigger on. {steps_fix(self.spec.evidence)}"
                )
            waited = self._replay_wait_note()
            armed = self._armed
            if waited is not None:  # issue 33: it ended between the checkpoint and the step
                detail += f" ({waited})"
                fix = "; lower expectations.replaySteps or lengthen the run" if fix else fix
            elif armed is not None and fix:  # the trigger was reached: the delay was too long
                detail += (
                    f" (checkpoint {armed.step} triggered the kill, due "
                    f"{format_seconds(max(armed.fire_at - event.timestamp, 0.0))} later)"
                )
                fix = "; shorten injectFailure.delay or lengthen the run"
            return self._finish_error(
                event.timestamp,
                f"the job {how}{step} before the drill could kill anything{detail}{fix}",
            )
        done = len(self._recoveries)
        return self._finish_overall(
            event.timestamp,
            error=(
                f"the job {how}{step} after {done} verified recover{'y' if done == 1 else 'ies'}, "
                f"before the next kill{detail}; lengthen the run"
            ),
        )

    def _finish_overall(self, now: float, *, error: str | None = None) -> list[Action]:
        if error is not None:
            return self._finish(now, Verdict.ERROR, error)
        verdict, summary, checks, headline = overall(
            self.spec, self._recoveries, self._gave_up, self.known_budget
        )
        return self._finish(now, verdict, summary, checks, headline=headline)

    def _finish_error(self, now: float, message: str) -> list[Action]:
        return self._finish(now, Verdict.ERROR, message)

    def _finish(
        self,
        now: float,
        verdict: Verdict,
        summary: str,
        checks: tuple[Check, ...] = (),
        *,
        headline: Recovery | None = None,
    ) -> list[Action]:
        self.note(now, "verdict", f"{verdict.value}: {summary}")
        self.result = self._result(now, verdict, summary, checks, headline=headline)
        self._move(Phase.DONE)
        return [Finish(self.result)]

    def _notes(self, contract: StepContract) -> tuple[str, ...]:
        notes: list[str] = []
        if contract.resumed_from is not None:
            notes.append(
                f"the job resumed from step {contract.resumed_from} when the drill "
                "started (a checkpoint left by an earlier run)"
            )
        ignored = self.ledger.ignored_lines
        if ignored:
            notes.append(
                f"{ignored} reporter line(s) of {len(self.ledger.ignored_incs)} process(es) were "
                "stamped before the job started (an earlier run's log printed at start-up?) "
                "and were ignored: they are not evidence of this run"
            )
        rankless = self.ledger.rankless
        if rankless.lines:
            notes.append(
                f"{rankless.lines} reporter line(s) of {len(rankless.incs)} process(es) "
                "without a rank were ignored while processes with a rank reported (a Ray "
                "driver or a launcher relaying its workers' lines): they stand for no rank"
            )
        capped = self.ledger.capped_lines
        if capped:
            notes.append(
                f"{capped} reporter line(s) were ignored past the drill's bounds on what job "
                f"lines may make it hold ({MAX_INCARNATIONS} distinct incarnations, "
                f"{MAX_CHECKPOINTS} checkpoint lines of each kind): they are not evidence "
                "of this run"
            )
        notes += [
            e.detail
            for e in self._timeline
            if e.kind == "note" and not e.detail.startswith("recovery ")
        ]
        return tuple(dict.fromkeys(notes))

    def _result(
        self,
        now: float,
        verdict: Verdict,
        summary: str,
        checks: tuple[Check, ...],
        *,
        headline: Recovery | None = None,
    ) -> DrillResult:
        ev = self.ledger
        contract = ev.contract()
        if headline is None and self._recoveries:
            headline = self._recoveries[-1]
        h = headline
        kill = self._kill
        expected = h.expected_resume_step if h is not None else None
        if h is None and kill is not None:
            expected = ev.expected(None, self.spec.expected_resume_step)[0]
        saves = tuple((s.step, s.started, s.completed) for s in ev.saves.values())
        return DrillResult(
            verdict=verdict,
            summary=summary,
            checks=checks,
            resume_step=h.resume_step if h else None,
            expected_resume_step=expected,
            loaded_step=h.loaded_step if h else None,
            last_step_before_kill=(
                h.last_step_before_kill if h else ev.last_before_kill()[0] if kill else None
            ),
            last_step_before_kill_upper_bound=h.last_step_before_kill_upper_bound if h else None,
            lost_steps=h.lost_steps if h else None,
            lost_steps_upper_bound=h.lost_steps_upper_bound if h else None,
            recovery_time_seconds=h.recovery_time_seconds if h else None,
            restarts=(h.restarts if h else restarts(self.ledger, kill) if kill else None),
            trigger_checkpoint=h.trigger_checkpoint if h else self.trigger_step,
            kill_time=h.kill_time if h else self.kill_time,
            judged_incarnation=h.judged_incarnation if h else None,
            step_contract=wording.contract(contract) if contract.first_step is not None else None,
            recoveries=tuple(self._recoveries),
            notes=self._notes(contract),
            incarnations=tuple(inc.info() for inc in ev.order),
            checkpoints=tuple((c.step, c.time, c.inc) for c in ev.checkpoints),
            saves=saves,
            breakdown=h.breakdown if h else ({} if kill is None else breakdown(self.spec, kill)),
            timeline=tuple(sorted(self._timeline, key=lambda e: e.timestamp)),
            started_at=self.started_at,
            finished_at=now,
            ignored_lines=(
                self.ledger.ignored_lines + self.ledger.capped_lines + self.ledger.rankless.lines
            ),
            live=self._live_result,
        )

    # ------------------------------------------------------------------ live

    def _live_final_deadline(self) -> float:
        kill = self._kill
        assert kill is not None
        return kill.time + self.spec.effective_recovery_timeout

    def _live_next_look(self, final: float) -> float:
        """When a live FAIL may become provable without any new line (a stall, no rejoin)."""
        live, kill = self._live, self._kill
        assert live is not None
        assert kill is not None
        looks = [final, kill.time + live.rejoin_limit]
        limit = self.spec.max_survivor_stall
        if limit is not None:
            last = [
                c[0]
                for p in live.procs.values()
                if p.replica != live.target and p.commits
                for c in p.commits[-1:]
            ]
            if last:
                looks.append(max(min(last), kill.time) + limit + 0.001)
        return min(looks)

    def _live_decide(self, now: float, *, final: bool) -> list[Action]:
        live = self._live
        assert live is not None
        judgement = live.decide(now, final=final)
        if judgement is None:
            return []
        self._live_result = judgement.figures
        figures = judgement.figures
        self.note(
            now,
            "rejoin",
            f"replica {figures.target_replica}: rejoin "
            f"{figures.rejoin_time_seconds}s, source {figures.rejoin_source}, step "
            f"{figures.rejoin_step}; survivors' stall {figures.survivor_stall_seconds}s",
        )
        self._finish(now, judgement.verdict, judgement.summary, judgement.checks)
        assert self.result is not None
        # the live breakdown: the replica's restart -> its heal -> its first committed step
        self.result = replace(self.result, breakdown=dict(figures.phases))
        return [Finish(self.result)]
