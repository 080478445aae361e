"""StorageFault in the state machine: the fault on the job's checkpoint folder is armed,
nothing is killed, and the drill watches what the job does (pure, like the rest).

Phases (the one table is :data:`~pytest_recoverygate.engine.state.TRANSITIONS`)::

    WAITING_FOR_CHECKPOINT --trigger--> KILLING --armed--> FAULTED
    FAULTED --the job failed loudly (a worker gone, a restart, a new incarnation)--> RECOVERING
    FAULTED --killAfter: the faulted save ended; the fault lifted--> KILLING --> RECOVERING
    FAULTED --proven (a failed save counted, a stall past maxStall), or the job trained on
              after the lift for the sustain window--> DONE

``during: save`` arms the fault at the trigger checkpoint and judges the first save after
it. ``during: load`` arms it and kills the target in one action (the runner arms, then
kills), so the replacement loads through the faulty storage: an ordinary recovery, with
the storage rules beside the kill rules. The fault is lifted (:class:`RestoreTarget`) at
``duration``; without one once the job failed, restarted, or dealt with the failed save
(said so, reported it, or trained on for the sustain window's seconds), and for a load
once the replacement trained past its resume step. Cleanup lifts it in any case.

What a recovery after the fault must resume from is the newest *durable* checkpoint: a
save the fault hit and the job counted anyway is not one (``Ledger.not_durable``).
"""

from __future__ import annotations

from pytest_recoverygate.engine import model
from pytest_recoverygate.engine.recovery import KillRecord, Window
from pytest_recoverygate.engine.rules import TABLE, run
from pytest_recoverygate.engine.rules.evidence import StorageEvidence
from pytest_recoverygate.engine.state import (
    Action,
    DrillState,
    KillTarget,
    Phase,
    RestoreTarget,
)
from pytest_recoverygate.engine.storage import StorageRecord, storage_details
from pytest_recoverygate.engine.verdict import Recovery, combine, format_seconds

__all__ = ["FaultedPhase"]

_LOUD = (
    model.GroupEventKind.WORKER_GONE,
    model.GroupEventKind.RESTARTING,
    model.GroupEventKind.REPLACEMENT_PENDING,
    model.GroupEventKind.REPLACEMENT_RUNNING,
    model.GroupEventKind.JOB_FAILED,
)


class FaultedPhase(DrillState):
    """The StorageFault part of the engine (:class:`~.machine.DrillEngine` is this plus
    the reactions every fault shares)."""

    _storage_window: Window | None = None
    _storage_kill_pending = False

    @property
    def storage_record(self) -> StorageRecord | None:
        """StorageFault's record (its audit plan once the fault is lifted); else None."""
        return self._storage

    @property
    def deadline(self) -> float | None:
        """:attr:`DrillState.deadline`, with FAULTED's own and a load fault's lift."""
        if self.phase is Phase.FAULTED:
            return self._faulted_deadline()
        base = DrillState.deadline.fget(self)  # type: ignore[attr-defined]
        record = self._storage
        if (
            record is not None
            and record.armed
            and record.armed_at is not None
            and record.spec.duration is not None
        ):
            lift = record.armed_at + record.spec.duration
            return lift if base is None else min(base, lift)
        return base  # type: ignore[no-any-return]

    def status(self, now: float) -> str:
        """:meth:`DrillState.status`, with FAULTED's own sentence."""
        record = self._storage
        if self.phase is not Phase.FAULTED or record is None:
            return super().status(now)
        spec, hit = record.spec, record.hit
        if record.lifted_at is not None:
            return (
                f"the {spec.mode} fault was lifted ({record.lift_why}); watching the job train on"
            )
        if hit is None:
            return f"the {spec.mode} fault is armed on {spec.path}; waiting for the next save"
        what = "held" if hit.error == "held" else f"failed ({hit.error})"
        return (
            f"the {spec.mode} fault {what} {hit.op} {hit.path or '.'}; watching what the job does"
        )

    # ------------------------------------------------------------------ inputs

    def storage_mounted(self, now: float) -> None:
        """The storage layer came up over the folder at ``now``. On a backend that mounts
        it after discovery, over a job already saving, a checkpoint completed before then
        triggers nothing: the layer saw none of its files (what it is made of, whether
        the job removes it), so the fault waits for the next one."""
        record = self._storage
        if record is not None and record.mounted_at is None:
            record.mounted_at = now

    def _storage_too_early(self, step: int, at: float) -> bool:
        """Checkpoint ``step``, completed at ``at``, was saved (started, or completed) before
        the layer was mounted."""
        record = self._storage
        if record is None or record.mounted_at is None:
            return False
        if min(at, record.started.get(step, at)) >= record.mounted_at:
            return False
        if step not in self._skipped_triggers:
            self._skipped_triggers.add(step)
            self.note(
                at,
                "note",
                f"checkpoint {step} was saved before the storage layer was mounted over "
                f"{record.spec.path} (it did not see its files written); the fault waits "
                "for the next checkpoint",
            )
        return True

    def on_storage_event(self, event: model.StorageEvent) -> list[Action]:
        """What the storage layer (or the drill's audit) saw."""
        record = self._storage
        if record is None or self.phase is Phase.DONE:
            return []
        record.on_storage(event)
        if (
            event.kind
            in (
                model.StorageEventKind.FAILED,
                model.StorageEventKind.STALLED,
                model.StorageEventKind.DELAYED,
            )
            and record.hit is not None
        ) and record.hit.hit == event.timestamp:
            what = {"failed": "failed", "stalled": "held", "delayed": "delayed"}
            self.note(
                event.timestamp,
                "storage",
                f"the fault {what[event.kind.value]} {event.op} {event.path or '.'}"
                + (f" ({event.error})" if event.error else ""),
            )
        self._not_durable()
        if self.phase is Phase.FAULTED:
            return self._faulted_decide(event.timestamp)
        return []

    def _storage_training(self, event: model.TrainingEvent) -> list[Action]:
        """A reporting-rank line while a StorageFault is armed or watched."""
        record = self._storage
        if record is None:
            return []
        record.on_training(event)
        self._not_durable()
        if self.phase is not Phase.FAULTED:
            return []
        if (
            event.kind is model.TrainingEventKind.PROGRESS
            and event.step is not None
            and record.lifted_at is not None
            and event.timestamp >= record.lifted_at
        ):
            self._storage_window_advance(event.step, event.timestamp)
        return self._faulted_decide(event.received or event.timestamp)

    def _storage_new_start(self, event: model.TrainingEvent) -> list[Action]:
        """FAULTED: a process of the reporting rank the drill never heard of started: the
        job restarted (it failed loudly). Becomes a recovery before its line is taken."""
        record = self._storage
        if (
            record is None
            or self.phase is not Phase.FAULTED
            or event.kind is not model.TrainingEventKind.START
            or event.incarnation in self.ledger.incs
            or self._child_of_known(event)
            or record.armed_at is None
            or event.timestamp <= record.armed_at
        ):
            return []
        return self._failed_loudly(
            event.timestamp - 1e-6, f"a new incarnation {event.incarnation} started"
        )

    def _child_of_known(self, event: model.TrainingEvent) -> bool:
        """Whether a start line is a child's of a process the drill heard from: it names
        that process's incarnation as its parent, or that process's pid as its parent pid.
        A parent nobody reported is no proof (the launcher, or whatever started the job,
        may have loaded the reporter: its children inherit its incarnation as theirs)."""
        ledger = self.ledger
        if event.parent is not None and (
            event.parent in ledger.incs or event.parent in ledger.others
        ):
            return True
        return event.ppid is not None and any(
            o.pid == event.ppid and o.host == event.host
            for o in (*ledger.incs.values(), *ledger.others.values())
        )

    def _storage_group(self, event: model.GroupEvent) -> list[Action] | None:
        """FAULTED: the backend saw the job fail (or finish); None when not in FAULTED."""
        if self.phase is not Phase.FAULTED or self._storage is None:
            return None
        if event.kind in _LOUD:
            detail = f": {event.detail}" if event.detail else ""
            return self._failed_loudly(event.timestamp, f"group: {event.kind.value}{detail}")
        if event.kind is model.GroupEventKind.JOB_SUCCEEDED:
            return self._storage_judge(event.timestamp, final=True)
        return []

    # ------------------------------------------------------------------ decisions

    def _not_durable(self) -> None:
        record = self._storage
        if record is not None:
            self.ledger.not_durable = {step for step, _, _ in record.swallowed}

    def _storage_stall_limit(self) -> float:
        return self.spec.stall_limit(self.ledger.rate())

    def _faulted_decide(self, now: float) -> list[Action]:
        """FAULTED, after any input: a failure proven, the fault to lift, killAfter's kill."""
        record = self._storage
        assert record is not None
        if self.phase is not Phase.FAULTED:
            return []
        # killAfter: what the job resumes from is the point; a failure proven before the
        # kill is judged with the recovery (the storage rules run beside the kill rules)
        judged = [] if record.spec.kill_after else self._storage_judge(now, final=False)
        if judged:
            return judged
        actions: list[Action] = []
        why = self._lift_why(now)
        if why is not None:
            actions.append(RestoreTarget(1, why))
            record.lifted(now, why)  # the runner lifts it now; its result notes the time
            self.note(now, "storage", f"lifting the fault: {why}")
        if (
            record.spec.kill_after
            and record.lifted_at is not None
            and not self._storage_kill_pending
        ):
            hit = record.hit
            if hit is not None and (hit.ended is not None or hit.error in ("held", "delayed")):
                self._storage_kill_pending = True
                self._move(Phase.KILLING)
                step = self.trigger_step if self.trigger_step is not None else 0
                actions.append(
                    KillTarget(step, 1, "KillWorker", self.spec.target_rank, self.spec.grace_period)
                )
        return actions

    def _lift_why(self, now: float) -> str | None:
        """Why the fault is due to be lifted now (FAULTED), or None."""
        record = self._storage
        assert record is not None
        if not record.armed or record.armed_at is None:
            return None
        spec = record.spec
        if spec.duration is not None:
            if now >= record.armed_at + spec.duration:
                return f"its duration ({format_seconds(spec.duration)}) passed"
            return None
        hit = record.hit
        if hit is None or hit.ended is None:
            return None
        at, how = hit.ended
        if how in ("reported failed", "retried and completed") or how.startswith("completed"):
            return f"the job {how.replace('reported failed', 'reported the save failed')}"
        if how == "reported complete":
            return "the job reported the failed save complete" if spec.kill_after else None
        if now >= at + self.spec.sustain.seconds:
            return f"{how} {format_seconds(now - at)} ago, without a word on the save"
        return None

    def _failed_loudly(self, at: float, shown_by: str) -> list[Action]:
        """FAULTED: the job failed loudly; what follows is a recovery (kill rules)."""
        record = self._storage
        assert record is not None
        record.job_failed = (at, shown_by)
        record.fact("failed loudly", at, shown_by)
        self.note(at, "storage", f"the job failed loudly: {shown_by}")
        actions: list[Action] = []
        if record.armed and record.spec.duration is None:
            why = "the job failed loudly"
            record.lifted(at, why)
            actions.append(RestoreTarget(1, why))
        self._start_recovery(at)
        return actions

    def _start_recovery(self, at: float) -> None:
        """A recovery from the StorageFault begins at ``at`` (the job's failure, or the
        drill's kill): the kill rules judge it, with the storage record beside them."""
        record = self._storage
        assert record is not None
        step = self.trigger_step if self.trigger_step is not None else 0
        kill = KillRecord(1, step, record.armed_at or at, at, self.spec.target_rank)
        kill.storage = record
        self._kill = kill
        self.ledger.killed(at)
        self._move(Phase.RECOVERING)

    def _storage_kill_result(self, result: model.KillResult) -> list[Action] | None:
        """killAfter's kill landed (or not); None when it was not killAfter's."""
        if not self._storage_kill_pending:
            return None
        self._storage_kill_pending = False
        if result.outcome is model.KillOutcome.KILLED:
            self.note(result.timestamp, "kill", result.detail or "killAfter: save")
            self._start_recovery(result.timestamp)
            return []
        detail = f": {result.detail}" if result.detail else ""
        return self._finish_error(result.timestamp, f"killAfter's kill did not land{detail}")

    def _storage_window_advance(self, step: int, at: float) -> None:
        window = self._storage_window
        if window is None:
            self._storage_window = Window((step, at), (step, at), self._storage_stall_limit())
            return
        if step > window.last[0]:
            window.last = (step, at)
            window.lines += 1

    def _storage_evidence(self, now: float, *, final: bool, restarted: bool) -> StorageEvidence:
        record = self._storage
        assert record is not None
        return StorageEvidence(
            self.spec,
            record,
            now,
            final,
            restarted,
            self._storage_stall_limit(),
            self._storage_window,
        )

    def _storage_judge(self, now: float, *, final: bool) -> list[Action]:
        """FAULTED, no restart: the storage rules; the drill's verdict once decided."""
        record = self._storage
        assert record is not None
        if self.phase is not Phase.FAULTED:
            return []
        ev = self._storage_evidence(now, final=final, restarted=False)
        checks = run(TABLE, "storage", ev)
        failed = [c for c in checks if c.passed is False]
        window_done = any(c.name == "trained_after_lift" and c.passed for c in checks)
        if not failed and not final and not window_done:
            return []
        if not failed and window_done and not final:
            ev = self._storage_evidence(now, final=True, restarted=False)
            checks = run(TABLE, "storage", ev)
            failed = [c for c in checks if c.passed is False]
        record.lifted(now, "the drill ended; its cleanup lifts it")  # if still armed
        verdict, summary = combine(checks)
        recovery = Recovery(
            index=1,
            fault=self.spec.fault,
            verdict=verdict,
            summary=summary,
            checks=tuple(checks),
            trigger_checkpoint=self.trigger_step,
            kill_time=record.armed_at,
            fault_details={"storage": storage_details(record)},
        )
        self._recoveries.append(recovery)
        self.note(now, "recovery", f"storage fault: {verdict.value}: {summary}")
        return self._finish_overall(now)

    def _faulted_tick(self, now: float) -> list[Action] | None:
        """FAULTED at a deadline; None when not in FAULTED."""
        record = self._storage
        if self.phase is not Phase.FAULTED or record is None:
            return None
        timed_out = (
            record.armed_at is not None and now >= record.armed_at + self.spec.checkpoint_timeout
        )
        if record.hit is None and timed_out:
            return self._storage_judge(now, final=True)
        return self._faulted_decide(now)

    def _faulted_deadline(self) -> float | None:
        """When FAULTED must be looked at again without any new input."""
        record = self._storage
        if record is None or record.armed_at is None:
            return None
        looks = [record.armed_at + self.spec.checkpoint_timeout]
        if record.armed and record.spec.duration is not None:
            looks.append(record.armed_at + record.spec.duration)
        hit = record.hit
        if record.armed and hit is not None and hit.ended is not None:
            looks.append(hit.ended[0] + self.spec.sustain.seconds)
        began = record.stall_began
        if began is not None:
            looks.append(began + self._storage_stall_limit())
        if record.lifted_at is not None:
            window = self._storage_window
            last = window.last[1] if window is not None else record.lifted_at
            looks.append(last + self._storage_stall_limit())
            if window is not None:
                looks.append(window.start[1] + self.spec.sustain.seconds)
        return min(looks)

    def _load_lift(self, now: float) -> list[Action]:
        """``during: load``: lift once the replacement trained past its resume, or at
        ``duration``."""
        record, kill = self._storage, self._kill
        if record is None or kill is None or not record.armed or record.armed_at is None:
            return []
        why = None
        if record.spec.duration is not None and now >= record.armed_at + record.spec.duration:
            why = f"its duration ({format_seconds(record.spec.duration)}) passed"
        elif record.spec.duration is None and kill.window is not None:
            why = "the replacement trained past its resume step"
        if why is None:
            return []
        record.lifted(now, why)
        self.note(now, "storage", f"lifting the fault: {why}")
        return [RestoreTarget(1, why)]
