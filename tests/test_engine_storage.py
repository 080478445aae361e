"""StorageFault in the engine, driven directly (no backend, no clock, no mount).

We test these aspects:
- the fault is armed at the trigger checkpoint (one action, nothing killed) and FAULTED
  watches the job: the storage layer's events (failed, held operations; files written,
  removed) and the job's own lines;
- a failed save counted is FAIL ``SAVE_FAILURE_SWALLOWED`` as soon as it is proven: its
  ``checkpoint_completed``, a small file moved to name its step (read back by the audit),
  or training on in silence;
- the job that says the save failed (``checkpoint_failed``) and trains on once the fault is
  lifted passes; the one that stops after the lift fails;
- removing the last durable checkpoint before a newer one is durable is FAIL
  ``LAST_GOOD_CHECKPOINT_DELETED``; retention after a durable save is fine;
- a stall nothing escapes fails at ``maxStall``; a stall the job fails out of becomes a
  recovery, judged from the newest durable checkpoint; a stall shorter than ``maxStall``
  passes;
- a fault nothing met is inconclusive, never a PASS;
- a layer mounted after discovery, over a job already saving (the Slurm backend): a
  checkpoint saved before the mount triggers nothing, the first one the layer saw does;
- a file the layer reports after the job's completed line is still that checkpoint's;
- a job that fails loudly is a recovery whose expected resume step is the newest durable
  checkpoint (never the save the fault hit), and ``during: load`` is a kill whose
  replacement reads through the fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_recoverygate.engine.machine import (
    DrillEngine,
    DrillResult,
    FailureReason,
    Finish,
    KillTarget,
    Phase,
    RestoreTarget,
    Verdict,
)
from pytest_recoverygate.engine.model import (
    GroupEventKind,
    KillOutcome,
    KillResult,
    StorageEvent,
    StorageEventKind,
    TrainingEventKind,
)
from pytest_recoverygate.engine.spec import DrillSpec
from pytest_recoverygate.engine.storage import StorageSpec, names_step
from tests.engine_events import ST, T0, C, F, L, P, S, ev, group_ev

SK = StorageEventKind
R = FailureReason


def spec(mode: str = "enospc", **storage: object) -> DrillSpec:
    during = str(storage.pop("during", "save"))
    extra = {k: storage.pop(k) for k in ("max_stall", "max_recovery_time") if k in storage}
    return DrillSpec(
        max_recovery_time=float(extra.get("max_recovery_time", 30.0)),  # type: ignore[arg-type]
        after_checkpoint=20,
        fault="StorageFault",
        storage=StorageSpec(mode=mode, during=during, path="/ckpt", **storage),  # type: ignore[arg-type]
        max_stall=extra.get("max_stall"),  # type: ignore[arg-type]
        checkpoint_timeout=60.0,
    )


@dataclass
class Drill:
    """One scripted drill: feed inputs in time order, answer the engine's actions."""

    engine: DrillEngine
    actions: list[object] = field(default_factory=list)
    result: DrillResult | None = None

    @classmethod
    def start(cls, s: DrillSpec) -> Drill:
        engine = DrillEngine(s, T0)
        engine.discovered(T0, "job", ranks=(0, 1))
        return cls(engine)

    def _answer(self, actions: list[object], t: float) -> None:
        for action in actions:
            self.actions.append(action)
            if isinstance(action, Finish):
                self.result = action.result
            elif isinstance(action, KillTarget):
                result = KillResult(KillOutcome.KILLED, T0 + t, f"{action.fault}")
                self._answer(list(self.engine.on_kill_result(result)), t)
            elif isinstance(action, RestoreTarget):
                result = KillResult(KillOutcome.KILLED, T0 + t, "lifted")
                self._answer(list(self.engine.on_restore_result(result)), t)

    def line(self, kind: TrainingEventKind, t: float, inc: str, step: int | None = None,
             **kw: object) -> Drill:  # fmt: skip
        event = ev(kind, t, inc, step, **kw)  # type: ignore[arg-type]
        self._answer(list(self.engine.on_training_event(event)), t)
        return self

    def train(self, inc: str, t0: float, steps: range, *, every: int = 10, dt: float = 0.1,
              ckpt: bool = True) -> float:  # fmt: skip
        """Progress for ``steps`` (and a checkpoint every ``every``); the time after."""
        t = t0
        for step in steps:
            self.line(P, t, inc, step)
            if ckpt and step % every == 0:
                self.line(ST, t, inc, step)
                self.storage(SK.WROTE, t + 0.01, f"step-{step}.pt", size=1000, first=t)
                self.line(C, t + 0.02, inc, step)
            t += dt
        return t

    def storage(self, kind: StorageEventKind, t: float, path: str = "", **kw: object) -> Drill:
        event = StorageEvent(kind, T0 + t, path, **kw)  # type: ignore[arg-type]
        self._answer(list(self.engine.on_storage_event(event)), t)
        return self

    def group(self, kind: GroupEventKind, t: float) -> Drill:
        self._answer(list(self.engine.on_group_event(group_ev(kind, t))), t)
        return self

    def tick(self, t: float) -> Drill:
        self._answer(list(self.engine.tick(T0 + t)), t)
        return self

    def until(self, t_end: float, step: float = 0.5, t: float = 0.0) -> Drill:
        while t <= t_end and self.result is None:
            self.tick(t)
            t += step
        return self

    def checks(self) -> dict[str, object]:
        assert self.result is not None
        return {c.name: c for c in self.result.checks}


def armed(d: Drill) -> float:
    """Train to checkpoint 20 (the trigger): the fault is armed there."""
    d.line(S, 0.0, "a")
    t = d.train("a", 0.1, range(1, 21))
    assert any(isinstance(a, KillTarget) and a.fault == "StorageFault" for a in d.actions)
    assert d.engine.phase is Phase.FAULTED
    return t


def test_the_fault_is_armed_at_the_trigger_and_nothing_is_killed() -> None:
    d = Drill.start(spec())
    armed(d)
    kills = [a for a in d.actions if isinstance(a, KillTarget)]
    assert [k.fault for k in kills] == ["StorageFault"]
    assert d.engine.storage_record is not None
    assert d.engine.storage_record.durable == 20


def test_a_checkpoint_saved_before_the_layer_was_mounted_is_no_trigger() -> None:
    d = Drill.start(spec())
    d.line(S, 0.0, "a")
    d.line(P, 0.1, "a", 19)
    d.line(ST, 0.2, "a", 20)  # its save started before the mount, completed after it
    d.engine.storage_mounted(T0 + 0.25)
    d.line(C, 0.3, "a", 20)
    assert not any(isinstance(a, KillTarget) for a in d.actions)
    assert d.engine.phase is Phase.WAITING_FOR_CHECKPOINT
    notes = [e.detail for e in d.engine.timeline_entries() if e.kind == "note"]
    assert any("checkpoint 20 was saved before the storage layer was mounted" in n for n in notes)
    d.train("a", 0.4, range(21, 31))  # the layer sees checkpoint 30 written: the trigger
    kills = [a for a in d.actions if isinstance(a, KillTarget)]
    assert [k.checkpoint_step for k in kills] == [30]
    assert d.engine.storage_record is not None
    assert d.engine.storage_record.durable == 30
    assert d.engine.storage_record.made_of[30] == ["step-30.pt"]


def test_a_write_the_layer_reports_after_the_completed_line_is_still_the_checkpoints() -> None:
    """The job's line and the layer's event come by two roads: a file written inside a
    save's window belongs to that checkpoint whichever arrives first (Ray's controller
    writes its checkpoint index, then the worker's line says the checkpoint completed)."""
    d = Drill.start(spec())
    d.line(S, 0.0, "a")
    d.line(ST, 0.1, "a", 10)
    d.storage(SK.WROTE, 0.15, "step-10/state.pt", size=1000, first=0.12)
    d.line(C, 0.3, "a", 10)
    d.storage(SK.WROTE, 0.2, "index.json", size=900, first=0.19)  # reported late
    d.storage(SK.WROTE, 0.5, "other.json", size=900, first=0.5)  # after the save: not its
    record = d.engine.storage_record
    assert record is not None
    assert record.made_of[10] == ["index.json", "step-10/state.pt"]


def test_a_failed_save_reported_complete_fails_at_once() -> None:
    d = Drill.start(spec())
    t = armed(d)
    t = d.train("a", t, range(21, 30), ckpt=False)
    d.line(ST, t, "a", 30)
    d.storage(SK.FAILED, t + 0.01, "step-30.pt", op="write", error="ENOSPC")
    d.line(C, t + 0.05, "a", 30)  # the writer thread swallowed the OSError
    assert d.result is not None
    assert d.result.verdict is Verdict.FAIL
    check = d.checks()["failed_save_not_counted"]
    assert check.reason is R.SAVE_FAILURE_SWALLOWED  # type: ignore[attr-defined]
    assert "checkpoint_completed(30)" in check.message  # type: ignore[attr-defined]
    details = d.result.recoveries[0].fault_details["storage"]
    assert details["saveHit"] == 30
    assert details["firstOperation"]["error"] == "ENOSPC"


def test_a_job_that_says_the_save_failed_and_trains_on_passes() -> None:
    d = Drill.start(spec())
    t = armed(d)
    t = d.train("a", t, range(21, 30), ckpt=False)
    d.line(ST, t, "a", 30)
    d.storage(SK.FAILED, t + 0.01, "step-30.pt", op="write", error="ENOSPC")
    d.line(F, t + 0.02, "a", 30, error="OSError: [Errno 28] No space left on device")
    lifts = [a for a in d.actions if isinstance(a, RestoreTarget)]
    assert lifts, "the fault is lifted once the job said the save failed"
    t = d.train("a", t + 0.1, range(31, 200), ckpt=False)
    assert d.result is not None, "the sustain window after the lift decides"
    assert d.result.verdict is Verdict.PASS, d.result.summary
    assert d.checks()["failed_save_not_counted"].passed is True  # type: ignore[attr-defined]
    assert d.checks()["trained_after_lift"].passed is True  # type: ignore[attr-defined]


def test_a_job_that_stops_after_the_lift_fails() -> None:
    d = Drill.start(spec(max_stall=5.0))
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.FAILED, t + 0.01, "step-30.pt", op="write", error="ENOSPC")
    d.line(F, t + 0.02, "a", 30)
    d.line(P, t + 0.1, "a", 31)
    d.until(t + 20, t=t + 0.2)
    assert d.result is not None
    assert d.result.verdict is Verdict.FAIL
    assert d.checks()["trained_after_lift"].reason is R.STOPPED_PROGRESSING  # type: ignore[attr-defined]


def test_a_failed_save_passed_over_in_silence_fails() -> None:
    d = Drill.start(spec())
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.FAILED, t + 0.01, "step-30.pt", op="write", error="EIO")
    t = d.train("a", t + 0.1, range(31, 400), ckpt=False)  # no word on the save
    assert d.result is not None
    assert d.result.verdict is Verdict.FAIL
    check = d.checks()["failed_save_not_counted"]
    assert check.reason is R.SAVE_FAILURE_SWALLOWED  # type: ignore[attr-defined]
    assert "neither failed nor said so" in check.message  # type: ignore[attr-defined]


def test_a_pointer_moved_to_the_failed_save_fails() -> None:
    d = Drill.start(spec(mode="eio"))
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.WROTE, t + 0.005, "latest", size=16, first=t)
    d.storage(SK.FAILED, t + 0.01, "step-30.pt", op="write", error="EIO")
    d.line(F, t + 0.02, "a", 30)  # it says so, but `latest` already names the save
    plan = dict(d.engine.storage_record.audit_plan())  # type: ignore[union-attr]
    assert plan["latest"] is None  # read back for its text
    d.storage(SK.AUDIT, t + 0.03, "latest", detail="ok", size=16, content="step-30.pt\n")
    t = d.train("a", t + 0.1, range(31, 200), ckpt=False)
    assert d.result is not None
    assert d.result.verdict is Verdict.FAIL
    check = d.checks()["failed_save_not_counted"]
    assert "latest was moved to name it" in check.message  # type: ignore[attr-defined]


def test_removing_the_last_durable_checkpoint_before_the_new_one_fails() -> None:
    d = Drill.start(spec(mode="eio"))
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.REMOVED, t + 0.005, "step-20.pt")  # keep-last-1 retention, first
    d.storage(SK.FAILED, t + 0.01, "step-30.pt", op="write", error="EIO")
    assert d.result is not None
    assert d.result.verdict is Verdict.FAIL
    check = d.checks()["last_good_checkpoint_kept"]
    assert check.reason is R.LAST_GOOD_CHECKPOINT_DELETED  # type: ignore[attr-defined]
    assert "step-20.pt" in check.message  # type: ignore[attr-defined]


def test_an_index_every_save_rewrites_lost_leaves_no_checkpoint_sure() -> None:
    """Ray's checkpoint_manager_snapshot.json: one file rewritten at every save, truncated
    by the rewrite the fault failed; the older checkpoints' own files are whole, but the
    index they are found by is gone, so none is named as left."""
    d = Drill.start(spec())
    d.line(S, 0.0, "a")
    t = 0.1
    for step in (10, 20):
        d.line(P, t, "a", step)
        d.line(ST, t, "a", step)
        d.storage(SK.WROTE, t + 0.01, f"step-{step}/state.pt", size=1000, first=t)
        d.storage(SK.WROTE, t + 0.015, "index.json", size=900, first=t + 0.012)
        d.line(C, t + 0.02, "a", step)
        t += 1.0
    assert d.engine.phase is Phase.FAULTED
    d.line(ST, t, "a", 30)
    d.storage(SK.FAILED, t + 0.01, "step-30", op="mkdir", error="ENOSPC")
    d.storage(SK.TRUNCATED, t + 0.02, "index.json")
    assert d.result is not None and d.result.verdict is Verdict.FAIL
    check = d.checks()["last_good_checkpoint_kept"]
    assert check.reason is R.LAST_GOOD_CHECKPOINT_DELETED  # type: ignore[attr-defined]
    message = check.message  # type: ignore[attr-defined]
    assert "index.json was part of checkpoints 10, 20 alike" in message, message
    assert "only checkpoint 10" not in message


def test_retention_after_a_durable_save_passes() -> None:
    d = Drill.start(spec(mode="latency", latency=0.5))
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.DELAYED, t + 0.01, "step-30.pt", op="write")
    d.storage(SK.WROTE, t + 0.6, "step-30.pt", size=1000, first=t)
    d.line(C, t + 0.7, "a", 30)
    d.storage(SK.REMOVED, t + 0.8, "step-20.pt")  # after 30 was durable
    assert d.engine.storage_record.deleted is None  # type: ignore[union-attr]


def test_a_file_rewritten_in_place_once_the_fault_is_lifted_is_no_loss() -> None:
    """Ray's controller rewrites its checkpoint index in place (truncate, then write) at
    every registration: once the storage is healthy again that is no lost checkpoint."""
    d = Drill.start(spec(mode="eio"))
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.FAILED, t + 0.01, "step-30.pt", op="write", error="EIO")
    d.line(F, t + 0.02, "a", 30)  # said so: the fault is lifted
    record = d.engine.storage_record
    assert record is not None and record.lifted_at is not None
    assert "step-20.pt" in record.made_of[20]
    d.storage(SK.TRUNCATED, t + 0.5, "step-20.pt")  # healthy again: rewritten in place
    assert record.deleted is None


def test_a_stall_nothing_escapes_fails_at_max_stall() -> None:
    d = Drill.start(spec(mode="stall", max_stall=10.0))
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.STALLED, t + 0.01, "step-30.pt", op="write")
    d.until(t + 9.0, t=t + 0.1)
    assert d.result is None, "not before maxStall"
    d.until(t + 12.0, t=t + 9.0)
    assert d.result is not None
    assert d.result.verdict is Verdict.FAIL
    check = d.checks()["storage_stall_handled"]
    assert check.reason is R.STALLED_ON_STORAGE
    assert d.result.finished_at is not None
    assert d.result.finished_at - (T0 + t) < 11.0, "decided when proven"


def test_a_stall_the_job_fails_out_of_is_a_recovery() -> None:
    d = Drill.start(spec(mode="stall", max_stall=30.0))
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.STALLED, t + 0.01, "step-30.pt", op="write")
    d.group(GroupEventKind.WORKER_GONE, t + 5.0)  # a barrier with a timeout fails rank 1
    assert d.engine.phase is Phase.RECOVERING
    assert any(isinstance(a, RestoreTarget) for a in d.actions), "lifted once it failed"
    d.line(S, t + 6.0, "b")
    d.line(L, t + 7.0, "b", 20)
    d.train("b", t + 7.1, range(21, 200), ckpt=False)
    assert d.result is not None
    assert d.result.verdict is Verdict.PASS, d.result.summary
    assert d.result.resume_step == 20
    assert d.checks()["storage_stall_handled"].passed is True  # type: ignore[attr-defined]


def test_a_stall_shorter_than_max_stall_passes() -> None:
    d = Drill.start(spec(mode="stall", max_stall=10.0, duration=3.0))
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.STALLED, t + 0.01, "step-30.pt", op="write")
    d.until(t + 3.5, t=t + 0.1)
    assert d.engine.storage_record.lifted_at is not None  # type: ignore[union-attr]
    d.storage(SK.WROTE, t + 3.6, "step-30.pt", size=1000, first=t)
    d.line(C, t + 3.7, "a", 30)  # the held save completes once the storage is back
    d.train("a", t + 3.8, range(31, 200), ckpt=False)
    assert d.result is not None
    assert d.result.verdict is Verdict.PASS, d.result.summary


def test_a_fault_nothing_met_is_inconclusive() -> None:
    d = Drill.start(spec())
    t = armed(d)
    d.train("a", t, range(21, 600), ckpt=False)  # it saves nowhere the fault covers
    d.until(T0 + 200, t=t + 60)
    assert d.result is not None
    assert d.result.verdict is Verdict.ERROR
    assert "met nothing" in d.checks()["fault_hit"].message  # type: ignore[attr-defined]


def test_a_job_that_fails_loudly_is_a_recovery_from_the_last_durable_checkpoint() -> None:
    d = Drill.start(spec())
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.FAILED, t + 0.01, "step-30.pt", op="write", error="ENOSPC")
    d.group(GroupEventKind.WORKER_GONE, t + 0.5)
    d.line(S, t + 2.0, "b")
    d.line(L, t + 3.0, "b", 20)
    d.train("b", t + 3.1, range(21, 200), ckpt=False)
    assert d.result is not None
    assert d.result.verdict is Verdict.PASS, d.result.summary
    assert d.result.expected_resume_step == 20
    assert d.checks()["failed_save_not_counted"].passed is True  # type: ignore[attr-defined]


def test_a_restart_seen_only_in_its_start_lines_is_a_recovery_whatever_parent_they_name() -> None:
    # The job says the save failed (the fault is lifted), its launcher restarts it and no
    # backend saw a worker go: the replacement's start line is the only sign. A launcher,
    # or the drill's own environment, that loaded the reporter makes every worker name it
    # as parent (RECOVERYGATE_PARENT_INC): a parent nobody reported proves no child, so
    # the replacement that replays 21..40 is judged a recovery (CI's Slurm drill passed
    # "trained 19 steps after the lift" over a replay before this).
    for parent in (None, "launcher0000000"):
        d = Drill.start(spec())
        d.line(S, 0.0, "a", parent=parent)
        t = d.train("a", 0.1, range(1, 21))
        d.line(ST, t, "a", 30)
        d.storage(SK.FAILED, t + 0.01, "step-30.pt", op="write", error="ENOSPC")
        d.line(F, t + 0.02, "a", 30)
        d.line(S, t + 2.0, "b", parent=parent)
        d.line(L, t + 3.0, "b", 20)
        d.train("b", t + 3.1, range(21, 200), ckpt=False)
        assert d.result is not None and d.result.verdict is Verdict.PASS, d.result
        assert d.result.resume_step == d.result.expected_resume_step == 20, (parent, d.result)


def test_a_child_of_the_faulted_worker_is_no_restart() -> None:
    d = Drill.start(spec())
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.FAILED, t + 0.01, "step-30.pt", op="write", error="ENOSPC")
    d.line(F, t + 0.02, "a", 30)
    d.line(S, t + 0.5, "child", parent="a")  # a data-loader or writer process it started
    d.train("a", t + 0.6, range(31, 200), ckpt=False)
    assert d.result is not None and d.result.verdict is Verdict.PASS, d.result
    assert "trained_after_lift" in d.checks() and d.result.resume_step is None


def test_a_replacement_that_loads_the_swallowed_save_does_not_pass() -> None:
    d = Drill.start(spec(kill_after=True))
    t = armed(d)
    d.line(ST, t, "a", 30)
    d.storage(SK.FAILED, t + 0.01, "step-30.pt", op="write", error="ENOSPC")
    d.line(C, t + 0.05, "a", 30)
    kills = [a for a in d.actions if isinstance(a, KillTarget) and a.fault == "KillWorker"]
    assert kills, "killAfter: the target is killed once the faulted save ended"
    d.line(S, t + 2.0, "b")
    d.line(L, t + 3.0, "b", 30)
    d.train("b", t + 3.1, range(31, 200), ckpt=False)
    assert d.result is not None
    assert d.result.verdict is Verdict.FAIL
    assert d.result.expected_resume_step == 20
    reasons = {c.reason for c in d.result.checks if c.passed is False}
    assert R.SAVE_FAILURE_SWALLOWED in reasons


def test_during_load_the_replacement_reads_through_the_fault() -> None:
    d = Drill.start(spec(mode="latency", latency=1.0, during="load", max_recovery_time=5.0))
    d.line(S, 0.0, "a")
    t = d.train("a", 0.1, range(1, 21))
    kills = [a for a in d.actions if isinstance(a, KillTarget)]
    assert [k.fault for k in kills] == ["StorageFault"]
    assert d.engine.phase is Phase.RECOVERING
    d.line(S, t + 1.0, "b")
    d.storage(SK.DELAYED, t + 1.5, "step-20.pt", op="read")
    d.line(L, t + 7.0, "b", 20)
    d.train("b", t + 7.1, range(21, 200), ckpt=False)
    assert d.result is not None
    assert d.result.verdict is Verdict.FAIL
    assert d.checks()["recovery_time"].reason is R.TOO_SLOW  # type: ignore[attr-defined]
    assert d.checks()["fault_hit"].passed is True  # type: ignore[attr-defined]


def test_a_pointer_names_a_step_as_a_run_of_digits_in_one_short_line() -> None:
    assert names_step("step-00000060.pt", 60)
    assert names_step("60\n", 60)
    assert names_step("global_step60", 60)
    assert not names_step("step-00000061.pt", 60)
    assert not names_step("a\nb 60", 60)
    assert not names_step("x" * 300 + "60", 60)
