"""The drill state machine: pure, no I/O, no clock of its own.

Training events, group events, kill results and clock ticks go in; actions come out
(:class:`KillTarget` once per injected failure, then :class:`Finish` with the
:class:`~pytest_recoverygate.engine.verdict.DrillResult`). Every backend drives the same engine
through the runner, and the tests drive it directly. What the evidence *proves* is
:mod:`pytest_recoverygate.engine.ledger`; this module decides *when*: which checkpoint
triggers a kill, when the kill lands (``delay``), what each fault adds, when a recovery
is judged, whether another kill follows (``count``).

Phases (the table :data:`TRANSITIONS` is the only source of truth; :meth:`DrillEngine._move`
is the only function that changes the phase, and an illegal move raises)::

    DISCOVERING --discovered--> WAITING_FOR_CHECKPOINT --trigger (+ delay)--> KILLING
                                     ^                                          | killed
                                     | count: the next kill                     v
                                     +--------------- (a recovery passed) -- RECOVERING
                                     |                                          | a replacement
                                     |                                          | loaded or trained
                                     +------------------------------------- VERIFYING
    every phase --> DONE (a verdict, an error, an interrupt)

Faults: ``KillWorker`` (and SLURM's ``KillStep``/``Requeue``, which the backend carries
out differently) kill at the trigger checkpoint plus ``delay``; ``KillDuringCheckpoint``
kills while the save of the trigger checkpoint is in flight (``checkpoint_started`` seen,
``checkpoint_completed`` not yet); ``Preempt`` is a graceful termination (the backend
sends SIGTERM, then SIGKILL after ``gracePeriod``), and a checkpoint completed in the
grace period counts as the latest; ``HangWorker`` stops the target, and the time until the
job notices (a rank fails, the group is torn down) is checked against
``maxDetectionTime``. ``count: N`` kills again after each verified recovery, at the first
checkpoint completed after it; ``count: untilBudgetExhausted`` (``count=None``) keeps
going until the job gives up, which it must do loudly, after ``restartBudget`` kills.

Node faults: ``KillNode`` is one kill of every instance of a node (the runner resolves
``KillTarget.node`` to the backend's node); the replacement group is judged as any
other (every new worker). ``PartitionNode`` cuts the node's link: like HangWorker, its
recovery counts from the cut and its detection (the first worker of the group gone, or
its collective error) is checked against ``maxDetectionTime``; the engine asks for the
link back (:class:`RestoreTarget`) after ``duration``, or without one as soon as the job
noticed or ``maxDetectionTime`` passed. Decided when proven: a HangWorker or
PartitionNode nobody noticed FAILs as soon as ``maxDetectionTime + recoveryGrace``
passed, not at the recovery deadline.
"""

from __future__ import annotations

import math
from typing import Any

from pytest_recoverygate.engine import model
from pytest_recoverygate.engine.caps import MAX_INCARNATIONS
from pytest_recoverygate.engine.records import Inc
from pytest_recoverygate.engine.recovery import KillRecord, Window, hung, judge, replay_diverged
from pytest_recoverygate.engine.rules import wording
from pytest_recoverygate.engine.spec import (
    FAULTS,
    MAX_KILLS,
    Delay,
    DrillSpec,
    Sustain,
)
from pytest_recoverygate.engine.state import (
    TRANSITIONS,
    Action,
    Finish,
    IllegalTransition,
    KillTarget,
    Phase,
    RestoreTarget,
    _Armed,
)
from pytest_recoverygate.engine.sticky import StickyPhase
from pytest_recoverygate.engine.verdict import (
    BREAKDOWN_PHASES,
    EXIT_CODES,
    Check,
    DrillResult,
    FailureReason,
    IncarnationInfo,
    Recovery,
    StepContract,
    Verdict,
    format_seconds,
)

__all__ = [
    "BREAKDOWN_PHASES",
    "EXIT_CODES",
    "FAULTS",
    "MAX_KILLS",
    "TRANSITIONS",
    "Check",
    "Delay",
    "DrillEngine",
    "DrillResult",
    "DrillSpec",
    "FailureReason",
    "Finish",
    "IllegalTransition",
    "IncarnationInfo",
    "KillTarget",
    "Phase",
    "Recovery",
    "RestoreTarget",
    "StepContract",
    "Sustain",
    "Verdict",
    "format_seconds",
]

R = FailureReason


#: What the other ranks' lines are read for: who they are, what they saved and loaded.
_RANK_KINDS = frozenset(
    {
        model.TrainingEventKind.START,
        model.TrainingEventKind.CHECKPOINT_STARTED,
        model.TrainingEventKind.CHECKPOINT_COMPLETED,
        model.TrainingEventKind.CHECKPOINT_LOADED,
        model.TrainingEventKind.CHECKPOINT_LOAD_STARTED,
        model.TrainingEventKind.POISONED,
    }
)


def _quiet(*args: Any, **kwargs: Any) -> None:
    """A timeline note that goes nowhere (a provisional judgement)."""


class DrillEngine(StickyPhase):
    """One drill's state machine. Feed it; it tells you what to do (its state, deadlines
    and result: :class:`~pytest_recoverygate.engine.state.DrillState`; a StorageFault's
    own phase: :class:`~pytest_recoverygate.engine.faulted.FaultedPhase`; the second kill
    of a KillDuringRecovery: :class:`~pytest_recoverygate.engine.reentry.ReentryPhase`; a
    StickyFault's: :class:`~pytest_recoverygate.engine.sticky.StickyPhase`)."""

    # ------------------------------------------------------------------ inputs

    def discovered(
        self,
        now: float,
        detail: str,
        *,
        restart_budget: int | None = None,
        ranks: tuple[int, ...] = (),
        not_before: float | None = None,
        world_size: int | None = None,
    ) -> None:
        """The runner found the workload: start waiting for the trigger checkpoint.

        ``restart_budget`` is the job's own restart budget as the backend reads it (for
        example torchrun's ``--max-restarts``), or ``None`` when it cannot be read;
        ``world_size`` the number of workers found (node faults report it before/after).
        ``ranks``: the workers' ranks. ``not_before``: when the job started (the drill's
        launch of it): lines stamped earlier are not of this run (a replayed old log) and
        are counted, never used.
        """
        self.known_budget = restart_budget
        self._world_size = world_size
        self.ranks = tuple(sorted(set(ranks)))
        self.not_before = not_before
        self.note(now, "discovered", detail)
        self._move(Phase.WAITING_FOR_CHECKPOINT)

    def on_training_event(self, event: model.TrainingEvent) -> list[Action]:
        if self.phase is Phase.DONE:
            return []
        loud = self._storage_new_start(event)  # StorageFault: a restart ends FAULTED first
        ev = self.ledger
        if event.incarnation in ev.ignored_incs or (
            self.not_before is not None
            and event.timestamp < self.not_before
            and event.incarnation not in ev.incs
            and event.incarnation not in ev.others
        ):
            # Not of this run: stamped before the job started (an earlier run's log
            # printed at start-up). No trigger, no checkpoint, no "last step before the kill".
            ev.ignored_lines += 1
            if len(ev.ignored_incs) < MAX_INCARNATIONS:
                ev.ignored_incs.add(event.incarnation)
            return []
        if ev.rankless.ignore(event):
            return []  # issue 41: a rank-less process while ranked ones report (a Ray driver)
        rank = self.spec.reporting_rank
        other = rank is not None and event.rank is not None and event.rank != rank
        if other and event.kind not in _RANK_KINDS:
            return []
        if ev.over_cap(event, other=other):
            return []  # a job's lines past the ledger's bounds: counted, not evidence
        if other:
            ev.other_rank(event)
            return self._reentry_line(None, event) + self._sticky_line(event)
        if self._live is not None:
            return self._on_live_event(event)
        kill = self.kill_time if ev.open else None
        if (
            event.incarnation not in ev.incs
            and kill is not None
            and event.kind is model.TrainingEventKind.START
            and event.timestamp <= kill
        ):
            # A start line carries the process's start time, read at a coarse tick: a
            # replacement restarted within a tick of the kill can look older than the kill.
            # Its first line that is not a start line decides which incarnation it is.
            if len(self._pending_starts) >= MAX_INCARNATIONS:
                ev.capped_lines += 1
                return []
            self._pending_starts[event.incarnation] = event
            return []
        inc = ev.incarnation(event)
        pending = self._pending_starts.pop(event.incarnation, None)
        actions: list[Action] = list(loud)
        if pending is not None:
            actions += self._on_event(inc, pending)
        actions += self._on_event(inc, event)
        if self._storage is not None:
            actions += self._storage_training(event)
        if not actions:
            actions += self._reentry_line(inc, event) + self._sticky_line(event)
        return actions

    def on_group_event(self, event: model.GroupEvent) -> list[Action]:
        if self.phase is Phase.DONE:
            return []
        self.note(event.timestamp, f"group:{event.kind.value}", event.detail)
        faulted = self._storage_group(event)
        if faulted is None:
            faulted = self._sticky_group(event)
        if faulted is not None:
            return faulted
        ended = event.kind in (model.GroupEventKind.JOB_FAILED, model.GroupEventKind.JOB_SUCCEEDED)
        kill = self._kill
        if kill is None or not self.ledger.open:
            if ended:
                return self._ended_between_kills(event)
            return []
        kill.group_seen.setdefault(event.kind, event.timestamp)
        if event.world_size is not None and self.spec.on_node:
            kill.details["worldSizeAfter"] = event.world_size  # the newest group's size
        if kill.detected is None and event.kind in (
            model.GroupEventKind.WORKER_GONE,
            model.GroupEventKind.RESTARTING,
            model.GroupEventKind.JOB_FAILED,
        ):
            kill.detected = event.timestamp
        if event.kind is model.GroupEventKind.RESTARTING:
            if event.restart_count is not None:
                kill.group_restarts = max(kill.group_restarts, event.restart_count)
            else:
                kill.group_restarts += 1
        second = self._reentry_group(event)
        if second:
            return second
        if self._sticky_loops(kill):  # StickyFault: a crash loop on the damaged checkpoint
            return self._judge(event.timestamp)
        if ended:
            kill.job_ended = (
                event.timestamp,
                event.detail,
                event.kind is model.GroupEventKind.JOB_SUCCEEDED,
            )
            return self._judge(event.timestamp)
        return []

    def on_kill_result(self, result: model.KillResult) -> list[Action]:
        if self.phase is not Phase.KILLING:
            return []
        after = self._storage_kill_result(result)  # StorageFault's killAfter
        if after is None:
            after = self._reentry_kill_result(result)  # KillDuringRecovery's second kill
        if after is None:
            after = self._sticky_armed(result)  # StickyFault's poison
        if after is not None:
            return after
        armed = self._armed
        self._armed = None
        if result.outcome is model.KillOutcome.KILLED and self._storage is not None:
            self._storage.armed_now(result.timestamp)
            self.note(result.timestamp, "storage", result.detail or "the storage fault is armed")
            if self._storage.spec.during == "save":
                self._move(Phase.FAULTED)
                return []
        if result.outcome is model.KillOutcome.KILLED:
            assert armed is not None
            index = len(self._recoveries) + 1
            self._kill = KillRecord(
                index, armed.step, armed.trigger_time, result.timestamp, armed.rank
            )
            self._kill.position = self._position(armed.trigger_time, result.timestamp)
            self._fault_details_at_kill(self._kill, armed)
            if self.spec.on_node and self._world_size is not None:
                self._kill.details["worldSizeBefore"] = self._world_size
            self._kill.storage = self._storage  # StorageFault, during: load
            self.ledger.killed(result.timestamp)
            if self._live is not None:
                self._live.killed(result.timestamp)
            self._move(Phase.RECOVERING)
            self.note(result.timestamp, "kill", result.detail, index=index)
            if self.spec.fault == "PartitionNode":
                self._restore_pending = True
                limit = self.spec.partition_duration or self.spec.max_detection_time
                self._restore_at = None if limit is None else result.timestamp + limit
            return []
        if result.outcome is model.KillOutcome.DRY_RUN:
            self.note(result.timestamp, "kill:dry-run", result.detail)
            check = Check(
                "kill_allowed",
                True,
                "the kill is allowed",
                result.detail or "allowed",
                "dry run: the trigger checkpoint was reached and the kill would be allowed",
            )
            at_rest = self.spec.fault in ("StorageFault", "StickyFault") and result.detail
            what = f"{result.detail}; nothing was touched" if at_rest else ""
            return self._finish(
                result.timestamp,
                Verdict.DRY_RUN,
                f"dry run: reached checkpoint step {self.trigger_step}; "
                + (what or "the kill would be allowed; nothing was killed"),
                (check,),
            )
        what = (
            "the target instance was already gone; nothing was killed"
            if result.outcome is model.KillOutcome.ALREADY_GONE
            else "the kill could not be confirmed"
        )
        self.note(result.timestamp, f"kill:{result.outcome.value}", result.detail)
        detail = f": {result.detail}" if result.detail else ""
        return self._finish_error(result.timestamp, f"{what}{detail}")

    def on_restore_result(self, result: model.KillResult) -> list[Action]:
        """The fault on the target ended (the link is back): note when, for the report."""
        kill = self._kill
        if kill is None:
            self.note(result.timestamp, f"restore:{result.outcome.value}", result.detail)
            return []
        self.note(result.timestamp, f"restore:{result.outcome.value}", result.detail)
        if result.outcome is model.KillOutcome.KILLED and self.spec.fault == "PartitionNode":
            kill.details["partitionSeconds"] = round(result.timestamp - kill.time, 6)
        return []

    def _restore_due(self, now: float) -> RestoreTarget | None:
        kill = self._kill
        if not self._restore_pending or kill is None or self.phase is Phase.DONE:
            return None
        spec = self.spec
        if spec.partition_duration is not None:
            if now < kill.time + spec.partition_duration:
                return None
            why = f"the partition's duration ({format_seconds(spec.partition_duration)}) passed"
        elif kill.detected is not None:
            why = f"the job noticed the cut after {format_seconds(kill.detected - kill.time)}"
        elif self._restore_at is not None and now >= self._restore_at:
            why = "maxDetectionTime passed and the job noticed nothing"
        else:
            return None
        self._restore_pending = False
        return RestoreTarget(kill.index, why)

    def tick(self, now: float) -> list[Action]:
        restore = self._restore_due(now)
        if restore is not None:
            return [restore]
        faulted = self._faulted_tick(now)  # StorageFault: FAULTED's own deadlines
        if faulted is None:
            faulted = self._sticky_tick(now)  # StickyFault's
        if faulted is not None:
            return faulted
        lift = self._load_lift(now) or self._reentry_retry(now)
        if lift:
            return lift
        armed = self._armed
        if (
            self.phase is Phase.WAITING_FOR_CHECKPOINT
            and armed is not None
            and (now >= armed.fire_at)
        ):
            return self._fire(now)
        if self._live is not None and self.phase is Phase.RECOVERING:
            return self._live_decide(now, final=now >= self._live_final_deadline())
        deadline = self.deadline
        if deadline is None or now < deadline:
            return []
        if self.phase is Phase.WAITING_FOR_CHECKPOINT:
            last = self.ledger.checkpoints[-1].step if self.ledger.checkpoints else None
            seen = (
                f"the last checkpoint seen was step {last}"
                if last is not None
                else ("no checkpoint was seen at all")
            )
            why = ""
            if (
                last is not None
                and self._skipped_triggers
                and self.spec.delay.kind in ("fraction", "before_next", "spread")
            ):
                why = (
                    f": the trigger checkpoint was reached, but delay "
                    f"{self.spec.delay.describe()} needs the checkpoint interval, and no two "
                    "checkpoints of one worker's lineage were seen to measure it"
                )
            if self.spec.after_step is not None:  # afterStep: say the step, not a checkpoint
                step = self._live.max_step() if self._live is not None else self.current_step
                seen = f"the last step seen was {step}" if step is not None else "no step seen"
            waited = self._replay_wait_note()
            if waited is not None:  # issue 33: armed at the checkpoint, waiting for a step
                return self._finish_error(
                    now,
                    f"timed out after {format_seconds(self.spec.checkpoint_timeout)}: {waited} "
                    "(timeouts.checkpoint); lower expectations.replaySteps, give "
                    "injectFailure a delay, or check that the job still trains",
                )
            return self._finish_error(
                now,
                f"timed out after {format_seconds(self.spec.checkpoint_timeout)} waiting for "
                f"{self.waiting_for}; {seen}{why} (timeouts.checkpoint)",
            )
        return self._judge(now)

    def abort(self, now: float, verdict: Verdict, message: str) -> DrillResult:
        """End the drill from outside (errors, interrupts) with what is known so far."""
        if self.result is not None:
            return self.result
        self.note(now, verdict.value.lower(), message)
        self.result = self._result(now, verdict, message, ())
        self._move(Phase.DONE)
        return self.result

    # ------------------------------------------------------------------ events

    def _on_event(self, inc: Inc, event: model.TrainingEvent) -> list[Action]:
        ev = self.ledger
        kind = event.kind
        if event.restart_count is not None:
            inc.restart = event.restart_count
        if kind is model.TrainingEventKind.START:
            ev.start(inc, event)
            child = ev.is_child(inc)
            new = ev.is_new(inc)
            self.note(
                event.timestamp,
                "start",
                (
                    f"child process {inc.id} of {inc.parent} (not a worker)"
                    if child
                    else f"{'new incarnation' if new else 'incarnation'} {inc.id}"
                ),
                pid=event.pid,
            )
            if new:
                self._detected(event.timestamp)
            return []
        if ev.is_child(inc):
            return self._on_child_event(inc, event)
        new = ev.is_new(inc)
        if inc.first_line is None:
            inc.first_line = event.timestamp
            if new:
                self._detected(event.timestamp)
        step = event.step
        if step is None:
            return []
        if kind is model.TrainingEventKind.PROGRESS:
            ev.progress(inc, step, event.timestamp, new=new, point=event)
            armed = self._armed
            if (  # issue 33: replaySteps, the kill waits for a step (state._replay_wait)
                not new
                and armed is not None
                and armed.fire_step is not None
                and step >= armed.fire_step
                and self.phase is Phase.WAITING_FOR_CHECKPOINT
            ):
                return self._fire(event.timestamp)
            if not new and self.spec.after_step is not None:
                return self._step_trigger(step, event.timestamp)
            return self._on_new_progress(inc, step, event.timestamp) if new else []
        if kind is model.TrainingEventKind.CHECKPOINT_COMPLETED:
            return self._on_checkpoint(inc, event, new=new)
        if kind is model.TrainingEventKind.CHECKPOINT_STARTED:
            save = ev.save_started(inc, event)
            self.note(event.timestamp, "checkpoint_started", f"step {step}", step=step)
            if not new and self.spec.fault == "KillDuringCheckpoint":
                return self._consider_trigger(step, event.timestamp, save_rank=save.rank)
            return []
        if kind is model.TrainingEventKind.CHECKPOINT_LOADED:
            ev.loaded(inc, event)
            where = "replacement " if new else ""
            self.note(event.timestamp, "checkpoint_loaded", f"{where}step {step}", step=step)
            if new and self.phase is Phase.RECOVERING:
                self._move(Phase.VERIFYING)  # it resumed: now it must train past the step
        return []

    def _on_child_event(self, inc: Inc, event: model.TrainingEvent) -> list[Action]:
        """A line of a worker's child: only its checkpoints count, as its worker's.

        A forked writer that saves and reports each checkpoint belongs to the lineage of
        the worker it was forked from; a warm-up or evaluation subprocess's progress and
        loads are none of the job's training.
        """
        if event.step is None:
            return []
        root = self.ledger.root(inc)
        new = self.ledger.is_new(root)
        if event.kind is model.TrainingEventKind.CHECKPOINT_COMPLETED:
            return self._on_checkpoint(inc, event, new=new)
        if event.kind is model.TrainingEventKind.CHECKPOINT_STARTED:
            save = self.ledger.save_started(inc, event)
            self.note(event.timestamp, "checkpoint_started", f"step {event.step}", step=event.step)
            if not new and self.spec.fault == "KillDuringCheckpoint":
                return self._consider_trigger(event.step, event.timestamp, save_rank=save.rank)
        return []

    def _on_checkpoint(self, inc: Inc, event: model.TrainingEvent, *, new: bool) -> list[Action]:
        assert event.step is not None
        step, at = event.step, event.timestamp
        ckpt = self.ledger.checkpoint(inc, event, new=new)
        detail = (
            f"replacement checkpoint step {step}"
            if new
            else f"step {step}" + (" (completed after the kill)" if ckpt.after_kill else "")
        )
        self.note(at, "checkpoint", detail, step=step)
        kill = self._kill
        if (
            kill is not None
            and self.ledger.open
            and not new
            and ckpt.after_kill
            and (self.spec.fault == "Preempt" and at <= kill.time + self.spec.grace_period)
        ):
            save = self.ledger.saves.get(step)
            in_flight = save is not None and save.started <= kill.time < (save.completed or at)
            if save is not None and in_flight:
                # In flight at the SIGTERM (a late completion line: Ray registers a
                # checkpoint 1-2 s after its report): not a save the SIGTERM caused.
                self.note(
                    at,
                    "note",
                    f"checkpoint {step} completed after SIGTERM, but its save began "
                    f"{format_seconds(kill.time - save.started)} before it: not saved on preempt",
                )
            else:
                # The newest: an earlier one may be a periodic save begun before the
                # SIGTERM reached the job (tests/data/ci-k8s-preempt).
                kill.details["savedStep"] = step
                kill.details["savedAfterSeconds"] = round(at - kill.time, 6)
        if (
            kill is not None
            and not new
            and kill.details.get("tornStep") == step
            and at <= kill.time
        ):
            # The save completed before the kill landed (its line arrived after the kill
            # was sent): nothing was torn, so the report must not say it was.
            kill.details.pop("tornStep")
            into = kill.details.pop("intoSaveSeconds", None)
            kill.details["completedBeforeKillSeconds"] = round(kill.time - at, 6)
            self.note(
                at,
                "note",
                f"the save of checkpoint {step} completed {format_seconds(kill.time - at)} "
                "before the kill landed: nothing was torn; the kill is judged as one right "
                "after that checkpoint"
                + (f" (it was aimed {format_seconds(into)} into the save)" if into else ""),
            )
        armed = self._armed
        if armed is not None and not new:
            # Aimed again only while the kill waits: once sent (KILLING), it stays armed.
            waiting = self.phase is Phase.WAITING_FOR_CHECKPOINT
            if waiting and armed.save_started is not None and step == armed.step:
                # The save finished before the kill landed: aim at the next one, earlier.
                self._armed = None
                self._torn_retry = True
                self.note(
                    at,
                    "note",
                    f"the save of checkpoint {step} completed "
                    f"{format_seconds(at - armed.trigger_time)} after it started, before "
                    "the kill landed; aiming at the next save, a quarter into it",
                )
                return []
            if armed.save_started is None and step > armed.step:
                self._checkpoint_beat_the_kill(step, at, reaim=waiting)
        if new or self.spec.fault == "KillDuringCheckpoint":
            return []
        return self._consider_trigger(step, at, save_rank=None)

    def _on_new_progress(self, inc: Inc, step: int, at: float) -> list[Action]:
        kill = self._kill
        assert kill is not None
        first = inc.first
        if (
            inc.loaded is None
            and first is not None
            and inc.advanced == first
            and (first[0] == 0 or any(c.step == first[0] for c in self.ledger.checkpoints))
        ):
            # Nothing loaded yet, and every line says 0 steps, or a checkpoint's step: no
            # step of it so far, or the state it is loading (a metrics thread ticking while
            # the checkpoint loads, a counter restored before the weights). Its next line
            # or its load says which.
            return []
        if inc.first == (step, at):
            self.note(at, "progress", f"replacement's first step {step}", step=step)
        if kill.judged is not inc:
            # The replacement that trains is the one judged: a newer one that reports
            # progress takes over from one that loaded and died (or stopped).
            kill.judged, kill.resume, kill.window = inc, None, None
        if kill.resume is None:
            resume = self.ledger.resume_of(inc, final=False)
            if resume is None:
                if self.phase is Phase.RECOVERING:
                    self._move(Phase.VERIFYING)
                return self._sustain(inc, step, at)  # it trains: hold it while we learn more
            kill.resume = resume
            self.note(at, "resume", wording.resumed(inc, resume), step=resume.step)
            if self.phase is Phase.RECOVERING:
                self._move(Phase.VERIFYING)
        if kill.window is None:
            resume = kill.resume
            if inc.first_trained(resume) is None:
                return []  # a line of the state it holds: its first step is still to come
            # Decided when proven: a failure needs no sustain window.
            provisional = judge(
                self.ledger,
                self.spec,
                kill,
                inc,
                now=at,
                note=_quiet,
                ranks=self.ranks,
                final=False,
            )
            # ... unless it may be a child whose worker has not reported yet (its start
            # line names a parent the drill has not heard from): then the window decides.
            unknown_parent = (
                inc.parent is not None
                and not self.ledger.is_child(inc)
                and not self.ledger.names_launcher(inc)
            )
            if provisional.verdict is Verdict.FAIL and not unknown_parent:
                return self._judge(at)
        elif replay_diverged(self.ledger, self.spec, kill, inc, step):
            return self._judge(at)  # issue 41: a divergence is proven at its step
        return self._sustain(inc, step, at)

    def _sustain(self, inc: Inc, step: int, at: float) -> list[Action]:
        """Hold the recovery for the sustain window: steps must keep advancing."""
        kill = self._kill
        assert kill is not None
        resume = kill.resume
        window = kill.window
        if window is None:
            if resume is not None:
                past = inc.first_trained(resume)
            elif inc.loaded is not None:
                past = inc.first_past(inc.loaded)
            else:
                past = inc.first
            past = self._bad_node_start(past, step, at)  # StickyFault: once it is out
            if past is None:
                return []
            stall = self.spec.max_stall or self.ledger.stall_limit()
            window = kill.window = Window(past, past, stall)
            self.note(
                past[1],
                "note",
                f"sustain window opened at step {past[0]}: holding the recovery for "
                f"{self.spec.sustain.describe()} of training (a stall is "
                f"{format_seconds(window.stall_limit)} without an advancing step)",
            )
        if inc.backwards is not None:
            return self._judge(at)  # its counter went back: proven, no window needed
        if step > window.last[0]:
            window.last = (step, at)
            window.lines += 1
        resume_step = resume.step if resume is not None else window.start[0] - 1
        if window.held(self.spec.sustain, resume_step) and not self._bad_node_holds():
            return self._judge(at)
        return []

    def _detected(self, at: float) -> None:
        kill = self._kill
        if kill is not None and kill.detected is None:
            kill.detected = at

    # ------------------------------------------------------------------ triggers

    def _consider_trigger(self, step: int, at: float, *, save_rank: int | None) -> list[Action]:
        if self.phase is not Phase.WAITING_FOR_CHECKPOINT or self._armed is not None:
            return []
        if self.spec.after_step is not None:
            return []  # the trigger is a step (afterStep), not a checkpoint
        if self._next_after is not None:
            if at <= self._next_after:
                return []
        elif self.spec.after_checkpoint is None:
            if at < self.started_at:
                return []
        elif step < self.spec.after_checkpoint:
            return []
        if self._storage_too_early(step, at):
            return []
        refusal = self.ledger.indistinguishable(step) if not self._recoveries else None
        if refusal is not None:
            if step not in self._skipped_triggers:
                self._skipped_triggers.add(step)
                self.note(at, "note", wording.indistinct(refusal))
            return []
        torn = self.spec.fault == "KillDuringCheckpoint"
        if self.spec.state_digest_matches and not torn:
            ckpt = self.ledger.checkpoints[-1]
            if ckpt.step == step and ckpt.digest is None:
                return self._finish_error(
                    at,
                    (
                        f"expectations.stateDigestMatches is set but checkpoint {step} carried no "
                        "digest, so the loaded state could never be compared: pass "
                        "digest=reporter.state_digest(model, optimizer, scheduler) to "
                        "checkpoint_completed (and to checkpoint_loaded); nothing was killed"
                    ),
                )
        timing = self._fire_time(step, at)
        if timing is None:
            return []  # the interval is not known yet: wait for another checkpoint
        fire_at, why = timing
        rank = self.spec.target_rank
        if torn and rank is None:
            rank = save_rank
        elif (
            torn
            and save_rank is not None
            and rank != save_rank
            and rank not in self.ledger.started_ranks  # it reports saves of its own
            and not self._recoveries
        ):
            self.note(
                at,
                "note",
                f"rank {rank} does not report the save (rank {save_rank} "
                "does): killing it can tear the checkpoint only if it writes part of it",
            )
        self._armed = _Armed(fire_at, step, at, rank, why, save_started=at if torn else None)
        if fire_at == math.inf:  # issue 33: replaySteps, lands at a step (state._replay_wait)
            self._armed.fire_step = self._replay_wait(step)
        self._slipped.clear()
        self.trigger_step = step
        self.note(at, "trigger", why, step=step)
        if fire_at <= at:
            return self._fire(at)
        return []

    # ------------------------------------------------------------------ judging

    def _candidate(self) -> Inc | None:
        """The replacement to judge when none decided: the one that trained last, else newest."""
        ev = self.ledger
        new = [inc for inc in ev.order if ev.is_new(inc)]
        trained = [inc for inc in new if inc.last is not None]
        if trained:
            return max(trained, key=lambda i: i.last[1] if i.last is not None else 0.0)
        return new[-1] if new else None

    def _judge(self, now: float, *, final: bool = True) -> list[Action]:
        """Judge the kill under judgement; then the next kill, or the drill's verdict.
        ``final``: the drill's last word on it (False: a failure proven early, the other
        checks left undecided rather than failed for want of time)."""
        kill = self._kill
        assert kill is not None
        if self._live is not None:
            return self._live_decide(now, final=True)
        if self.spec.on_node:
            self._world_sizes(kill)
        budget_mode = self.spec.count is None
        if kill.judged is not None and self.ledger.is_child(kill.judged):
            # Its parent reported after it: a worker's child, never the replacement.
            kill.judged, kill.resume, kill.window = None, None, None
        inc = kill.judged or self._candidate()
        if budget_mode and inc is None and kill.job_ended is not None and not kill.job_ended[2]:
            self._gave_up = (kill.index, kill.job_ended[0], kill.job_ended[1])
            return self._finish_overall(now)
        if budget_mode and inc is None and kill.job_ended is None:
            recovery = hung(self.ledger, self.spec, kill, now)
            self._recoveries.append(recovery)
            return self._finish_overall(now)
        recovery = judge(
            self.ledger,
            self.spec,
            kill,
            inc,
            now=now,
            note=self.note,
            ranks=self.ranks,
            final=final,
        )
        if recovery.verdict is Verdict.PASS:
            missed = self._reentry_missed(now)  # KillDuringRecovery: its phase never came
            if missed is not None:
                return missed
        self._recoveries.append(recovery)
        more = recovery.verdict is Verdict.PASS and (
            self.spec.count is None or len(self._recoveries) < self.spec.count
        )
        if budget_mode and recovery.verdict is Verdict.PASS:
            budget = self.spec.restart_budget
            if budget is not None and kill.index > budget:
                return self._finish_overall(now)  # it survived one kill too many
            if kill.index >= MAX_KILLS:
                return self._finish_overall(now)
        if more:
            self.ledger.closed(kill.judged)
            self._next_after = now
            self._waiting_since = now
            self._torn_retry = False
            self._reaims = 0
            self._move(Phase.WAITING_FOR_CHECKPOINT)
            self.note(
                now, "note", f"recovery {kill.index} verified; waiting for {self.waiting_for}"
            )
            return []
        return self._finish_overall(now)

    # ------------------------------------------------------------------ afterStep, live

    def _step_trigger(self, step: int, at: float) -> list[Action]:
        """``afterStep: N``: arm the kill once the job reported step N (no checkpoint)."""
        after = self.spec.after_step
        if self.phase is not Phase.WAITING_FOR_CHECKPOINT or self._armed is not None:
            return []
        if after is None or step < after or at < self.started_at:
            return []
        if self._next_after is not None and at <= self._next_after:
            return []
        delay = self.spec.delay
        offset = delay.value if delay.kind == "seconds" else 0.0
        why = f"step {step} reached (afterStep {after})"
        if offset > 0:
            why += f"; delay {delay.describe()}"
        self._armed = _Armed(at + offset, step, at, self.spec.target_rank, why)
        self.trigger_step = step
        self.note(at, "trigger", why, step=step)
        return self._fire(at) if offset <= 0 else []

    def _on_live_event(self, event: model.TrainingEvent) -> list[Action]:
        """recovery: live: every replica's lines go to the live record, not the ledger."""
        live = self._live
        assert live is not None
        received = event.received if event.received is not None else event.timestamp
        known = event.incarnation in live.procs
        if not known and len(live.procs) >= MAX_INCARNATIONS:
            self.ledger.capped_lines += 1  # past the bound on distinct incarnations
            return []
        notes = len(live.notes)
        live.on_event(event, received)
        for at, text in live.notes[notes:]:
            self.note(at, "heal", text)
        kind, step = event.kind, event.step
        if kind is model.TrainingEventKind.START and not known:
            self.note(
                event.timestamp,
                "start",
                f"replica {event.replica} incarnation {event.incarnation}",
                pid=event.pid,
                replica=event.replica,
            )
        if self.phase is Phase.WAITING_FOR_CHECKPOINT and step is not None:
            if not live.target_committed():
                # Killing a replica that has not joined yet tests nothing: wait for it.
                if kind is model.TrainingEventKind.PROGRESS and not self._live_waiting_noted:
                    self._live_waiting_noted = True
                    self.note(
                        event.timestamp,
                        "note",
                        f"the job reports steps; waiting for replica {live.target} to commit "
                        "one before the kill",
                    )
                return []
            if self.spec.after_step is not None and kind is model.TrainingEventKind.PROGRESS:
                return self._step_trigger(live.max_step() or step, event.timestamp)
            if (
                self.spec.after_step is None
                and kind is model.TrainingEventKind.CHECKPOINT_COMPLETED
            ):
                after = self.spec.after_checkpoint
                if (after is None and event.timestamp >= self.started_at) or (
                    after is not None and step >= after
                ):
                    self.note(event.timestamp, "checkpoint", f"step {step}", step=step)
                    return self._step_trigger_now(step, event.timestamp)
        if self.phase is Phase.RECOVERING and kind is model.TrainingEventKind.PROGRESS:
            return self._live_decide(received, final=False)
        return []

    def _step_trigger_now(self, step: int, at: float) -> list[Action]:
        why = f"checkpoint {step} completed"
        self._armed = _Armed(at, step, at, self.spec.target_rank, why)
        self.trigger_step = step
        self.note(at, "trigger", why, step=step)
        return self._fire(at)
