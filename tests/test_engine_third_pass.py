"""The verdict's third pass: false alarms a new user met, driven through the engine.

Each scenario is a scripted job whose truth is written next to it (what it loaded, the
first step it trained, how it ended), fed to the engine's public entry points
(``on_training_event``, ``on_group_event``, ``on_kill_result``, ``tick``) as the fake
backend does.

We test these aspects:
1. a short CI job that recovers and *ends successfully* inside the sustain window (exit 0,
   pod Succeeded, Slurm COMPLETED, Ray SUCCEEDED) after at least 3 progress lines past
   the resume has sustained its recovery: PASS, with a note that the run ended inside
   the window; fewer lines, or an unsuccessful end, keep the old judgement;
2. torchft: a replacement that reports its heal once the step's commit is decided (after
   ``should_commit``) prints its heal line after the survivor's line for the same step:
   the heal is judged by the quorum it joined (heal step S, first commit S + 1, no
   survivor commit past S + 1 before it), so it PASSes; a heal to an older step still
   FAILs;
3. the known open cases: a correct resume from 20 whose metrics thread prints 0, 20, 20,
   then 21 without checkpoint_loaded (also without the 0, and after a first run whose
   thread printed 0 at start), and a load line naming step 21 that was never reported
   saved followed by step 21: inconclusive, naming checkpoint_loaded as the fix; an
   off-by-one resume printing each step once, and a load of a reported checkpoint
   followed by that step again, still FAIL as replays;
4. a check that verified nothing (no other rank said what it loaded) is *not checked*,
   never passed, and its message says what its entries hold.
"""

from __future__ import annotations

import io

from pytest_recoverygate.engine.machine import DrillEngine, DrillResult, Finish, KillTarget, Verdict
from pytest_recoverygate.engine.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEvent,
    TrainingEventKind,
)
from pytest_recoverygate.engine.spec import DrillSpec, Sustain
from pytest_recoverygate.engine.verdict import Check, FailureReason
from pytest_recoverygate.report.files import result_to_dict
from pytest_recoverygate.report.html import render_report
from pytest_recoverygate.report.terminal import print_result
from tests.engine_events import T0, C, L, P, S, ev, line_at
from tests.test_engine_patterns import drive, engine_for, result_of

R = FailureReason

# ----------------------------------------------------- 1. a short job ends inside the window

STEP = 0.03  # seconds per step, as a small CI job
CKPT_EVERY = 20


def short_job(total: int, kill_after: int) -> tuple[DrillEngine, float]:
    """A 2-rank job of ``total`` steps (30 ms each), checkpoints every 20, killed just after
    checkpoint ``kill_after``; the default sustain window (3 lines and 10 s)."""
    engine = engine_for(after_checkpoint=kill_after, sustain=Sustain())
    old = [ev(S, 0.0, "old")]
    for step in range(1, kill_after + 3):
        old.append(ev(P, step * STEP, "old", step))
        if step % CKPT_EVERY == 0:
            old.append(ev(C, step * STEP + 0.001, "old", step))
    kill_at = kill_after * STEP + 0.002
    drive(engine, old, kill_at=kill_at)
    assert engine.kill_time == T0 + kill_at
    return engine, kill_at


def resumed(engine: DrillEngine, start: float, loaded: int, last: int) -> float:
    """The replacement: loads ``loaded``, trains ``loaded + 1`` .. ``last``; returns the
    time of its last step."""
    events = [ev(S, start, "new"), ev(L, start + 0.2, "new", loaded)]
    t = start + 0.2
    for step in range(loaded + 1, last + 1):
        t += STEP
        events.append(ev(P, t, "new", step))
    assert not [a for e in events for a in engine.on_training_event(e) if isinstance(a, Finish)]
    return t


def ended(engine: DrillEngine, at: float, kind: GroupEventKind, detail: str) -> DrillResult:
    [finish] = [
        a for a in engine.on_group_event(GroupEvent(kind, T0 + at, detail)) if isinstance(a, Finish)
    ]
    return finish.result


def test_a_short_job_that_recovers_and_exits_0_inside_the_sustain_window_passes() -> None:
    # The job: 300 steps, killed after checkpoint 40, resumed at 40, 260 more
    # steps, exit 0 about 8 s after the kill (inside the default 10 s window).
    engine, kill_at = short_job(300, kill_after=40)
    last = resumed(engine, kill_at + 0.3, loaded=40, last=300)
    assert last - kill_at < 10.0  # the truth: it ended inside the window
    result = ended(engine, last + 0.1, GroupEventKind.JOB_SUCCEEDED, "exit 0")
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 40
    assert "ended inside the sustain window" in result.summary
    sustained = result.recoveries[0].sustained
    assert sustained is not None and sustained["endedInsideWindow"] is True
    assert sustained["lastStep"] == 300
    progress = [c for c in result.checks if c.name == "progress_after_resume"]
    assert progress and progress[0].passed is True
    assert "ended inside the sustain window" in progress[0].message


def test_three_lines_past_the_resume_then_success_is_enough() -> None:
    engine, kill_at = short_job(300, kill_after=40)
    last = resumed(engine, kill_at + 0.3, loaded=40, last=43)  # 41, 42, 43
    result = ended(engine, last + 0.1, GroupEventKind.JOB_SUCCEEDED, "pod Succeeded")
    assert result.verdict is Verdict.PASS, result.summary
    assert result.recoveries[0].sustained is not None
    assert result.recoveries[0].sustained["endedInsideWindow"] is True


def test_fewer_than_three_lines_then_success_stays_inconclusive() -> None:
    engine, kill_at = short_job(300, kill_after=40)
    last = resumed(engine, kill_at + 0.3, loaded=40, last=42)  # 41, 42 only
    result = ended(engine, last + 0.1, GroupEventKind.JOB_SUCCEEDED, "exit 0")
    assert result.verdict is Verdict.ERROR and result.inconclusive, result.summary
    assert "finished inside the sustain window" in result.summary


def test_an_unsuccessful_end_inside_the_window_still_fails_as_stopped_progressing() -> None:
    engine, kill_at = short_job(300, kill_after=40)
    last = resumed(engine, kill_at + 0.3, loaded=40, last=120)
    result = ended(engine, last + 0.1, GroupEventKind.JOB_FAILED, "exit 1")
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons == (R.STOPPED_PROGRESSING,)


def test_a_short_job_resuming_from_an_older_checkpoint_still_fails() -> None:
    engine, kill_at = short_job(300, kill_after=40)
    start = kill_at + 0.3
    new = [ev(S, start, "new"), ev(L, start + 0.2, "new", 20)]  # an older checkpoint
    new += [ev(P, start + 0.2 + STEP * i, "new", 20 + i) for i in range(1, 40)]
    finishes = drive(engine, new)  # decided when proven, before the job ends
    end = GroupEvent(GroupEventKind.JOB_SUCCEEDED, T0 + start + 2.0, "exit 0")
    finishes += [a for a in engine.on_group_event(end) if isinstance(a, Finish)]
    result = finishes[0].result
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.RESUMED_FROM_OLDER_CHECKPOINT


# ------------------------------------------------------------ 2. torchft: the heal's quorum


def live_spec() -> DrillSpec:
    return DrillSpec(
        max_recovery_time=30.0,
        recovery="live",
        after_step=20,
        target_replica=1,
        target_rank=0,
        max_survivor_stall=5.0,
        max_rejoin_time=30.0,
        max_lost_steps=0,
    )


class LiveJob:
    """Two torchft replica groups written as lines; ``now`` moves as they print."""

    def __init__(self) -> None:
        self.engine = DrillEngine(live_spec(), T0)
        self.engine.discovered(T0, "two replica groups")
        self.now = T0
        self.actions: list[object] = []
        self.line(S, "a0", replica=0)
        self.line(S, "b0", replica=1)
        self.line(L, "b0", 0, source="peer", peer=0)  # torchft's initial sync

    def line(
        self,
        kind: TrainingEventKind,
        inc: str,
        step: int | None = None,
        *,
        replica: int | None = None,
        source: str | None = None,
        peer: int | None = None,
        after: float = 0.001,
    ) -> None:
        self.now += after
        event = line_at(kind, self.now, inc, step, replica=replica, source=source, peer=peer)
        self.actions += self.engine.on_training_event(event)

    def commit(self, steps: range, *incs: str, dt: float = 0.1) -> None:
        for step in steps:
            self.now += dt
            for inc in incs:
                self.line(P, inc, step)

    def kill(self) -> None:
        assert any(isinstance(a, KillTarget) for a in self.actions), self.actions
        self.actions += self.engine.on_kill_result(KillResult(KillOutcome.KILLED, self.now))

    @property
    def result(self) -> DrillResult:
        done = [a for a in self.actions if isinstance(a, Finish)]
        assert done, f"no verdict yet; phase {self.engine.phase}"
        return done[0].result


def test_a_heal_reported_after_the_commit_is_judged_by_the_quorum_it_joined() -> None:
    job = LiveJob()
    job.commit(range(1, 21), "a0", "b0")
    job.kill()
    job.commit(range(21, 667), "a0", dt=0.01)  # the survivor trains on alone
    job.line(S, "b1", replica=1, after=0.5)
    # Quorum 667: the replacement heals to 666 from replica 0; both commit 667. This
    # job reports its heal after should_commit, so the survivor's 667 line comes first.
    job.line(P, "a0", 667, after=0.1)
    job.line(L, "b1", 666, source="peer", peer=0)
    job.line(P, "b1", 667)
    job.commit(range(668, 672), "a0", "b1")
    result = job.result
    assert result.verdict is Verdict.PASS, result.summary
    assert result.live is not None and result.live.rejoin_step == 666
    checks = {c.name: c for c in result.checks}
    assert checks["heal_step"].passed is True, checks["heal_step"].message
    assert checks["lost_steps"].passed is True and checks["lost_steps"].observed == 0
    assert "quorum of step 667" in checks["heal_step"].message


def test_a_heal_reported_before_the_commit_still_passes() -> None:
    job = LiveJob()
    job.commit(range(1, 21), "a0", "b0")
    job.kill()
    job.commit(range(21, 30), "a0")
    job.line(S, "b1", replica=1, after=0.5)
    job.line(L, "b1", 29, source="peer", peer=0)
    job.commit(range(30, 34), "a0", "b1")
    result = job.result
    assert result.verdict is Verdict.PASS, result.summary


def test_a_heal_to_a_step_the_survivors_had_passed_still_fails() -> None:
    # The survivors committed 31 and 32 before the replacement's first commit (30): it
    # joined behind them, whatever the order of its own lines.
    job = LiveJob()
    job.commit(range(1, 21), "a0", "b0")
    job.kill()
    job.commit(range(21, 33), "a0")
    job.line(S, "b1", replica=1, after=0.5)
    job.line(L, "b1", 29, source="peer", peer=0)
    job.line(P, "b1", 30)
    job.commit(range(33, 36), "a0", "b1")
    result = job.result
    assert result.verdict is Verdict.FAIL, result.summary
    assert R.HEALED_TO_OLDER_STEP in result.reasons


# ----------------------------------------------------------------- 3. the known open cases

KILL = 2.55  # after checkpoint 20 (2.001 s), before step 26


def per_step_run(*, zero_at_start: bool) -> list[TrainingEvent]:
    """The first incarnation: a metrics thread in step with training (one line per
    step), which ticks 0 at start when ``zero_at_start``; checkpoints 10 and 20."""
    out = [ev(S, 0.0, "old")]
    if zero_at_start:
        out.append(ev(P, 0.01, "old", 0))
    out += [ev(P, s * 0.1, "old", s) for s in range(1, 26)]
    out += [ev(C, s * 0.1 + 0.001, "old", s) for s in (10, CKPT_EVERY)]
    return sorted(out, key=lambda e: e.timestamp)


def thread_resume(held_lines: list[int]) -> list[TrainingEvent]:
    """The truth: the replacement loads checkpoint 20 (never says so), its thread prints
    ``held_lines`` (0 before the load, 20 after it) before the first step, 21."""
    new = [ev(S, 3.0, "new")]
    new += [ev(P, 3.05 + 0.1 * i, "new", s) for i, s in enumerate(held_lines)]
    t = 3.05 + 0.1 * len(held_lines)
    new += [ev(P, t + 0.1 * i, "new", 21 + i) for i in range(12)]
    return new


def judged(
    old: list[TrainingEvent], new: list[TrainingEvent], expected: int | None = None
) -> DrillResult:
    engine = engine_for(expected_resume_step=expected)
    drive(engine, old, kill_at=KILL)
    return result_of(engine, new)


def assert_inconclusive_naming_checkpoint_loaded(result: DrillResult) -> None:
    assert result.verdict is Verdict.ERROR, result.summary
    assert result.inconclusive, result.summary
    assert "checkpoint_loaded" in result.summary, result.summary


def test_a_thread_printing_0_20_20_then_21_without_checkpoint_loaded_is_inconclusive() -> None:
    result = judged(per_step_run(zero_at_start=False), thread_resume([0, 20, 20]))
    assert_inconclusive_naming_checkpoint_loaded(result)
    assert "step 20 twice" in result.summary


def test_a_thread_printing_20_20_then_21_without_checkpoint_loaded_is_inconclusive() -> None:
    result = judged(per_step_run(zero_at_start=False), thread_resume([20, 20]))
    assert_inconclusive_naming_checkpoint_loaded(result)


def test_a_thread_printing_0_then_20_then_21_without_checkpoint_loaded_is_inconclusive() -> None:
    # The 0 before step 20 is a line that came after no step: the 20 may be one too.
    result = judged(per_step_run(zero_at_start=False), thread_resume([0, 20]))
    assert_inconclusive_naming_checkpoint_loaded(result)
    assert "0 before step 20" in result.summary


def test_a_thread_that_ticked_0_at_start_and_prints_0_20_20_then_21_is_inconclusive() -> None:
    # Its first run printed 0, 1, 2, ... (a tick at start): the lines alone read like
    # progress(epoch). Its replacement's 0 followed by 20 is no epoch of a fresh start.
    for held in ([0, 20, 20], [20, 20], [0, 20]):
        result = judged(per_step_run(zero_at_start=True), thread_resume(held))
        assert_inconclusive_naming_checkpoint_loaded(result)
        assert R.RESTARTED_FROM_SCRATCH not in result.reasons


def test_a_per_step_job_redoing_step_20_once_still_fails_as_a_replay() -> None:
    new = [ev(S, 3.0, "new")] + [ev(P, 3.1 + 0.1 * i, "new", 20 + i) for i in range(12)]
    result = judged(per_step_run(zero_at_start=False), new)
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.STEPS_REPLAYED


def test_a_zero_based_job_restarting_from_scratch_still_fails() -> None:
    new = [ev(S, 3.0, "new")] + [ev(P, 3.1 + 0.1 * i, "new", i) for i in range(12)]
    result = judged(per_step_run(zero_at_start=True), new)
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.RESTARTED_FROM_SCRATCH


def load_line_resume(loaded: int, first: int) -> list[TrainingEvent]:
    new = [ev(S, 3.0, "new"), ev(L, 3.05, "new", loaded)]
    return new + [ev(P, 3.1 + 0.1 * i, "new", first + i) for i in range(12)]


def test_a_load_line_naming_a_step_never_reported_saved_then_that_step_is_inconclusive() -> None:
    # The truth: it loaded checkpoint 20 and trained 21 first; its load line names the
    # next step (21), which no checkpoint_completed ever named.
    for expected in (None, 20):  # latest, and resumeFromCheckpoint: step-20
        result = judged(per_step_run(zero_at_start=False), load_line_resume(21, 21), expected)
        assert_inconclusive_naming_checkpoint_loaded(result)
        assert "never reported saved" in result.summary


def test_a_load_of_a_reported_checkpoint_then_that_step_again_still_fails_as_a_replay() -> None:
    result = judged(per_step_run(zero_at_start=False), load_line_resume(20, 20))
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.STEPS_REPLAYED
    # One step done again, the loaded one: the off-by-one is named with checkpoint_loaded too.
    assert "steps 20–20 were done again" in result.summary
    assert "off by one" in result.summary


def test_a_load_line_of_an_unreported_step_then_a_counter_reset_still_fails() -> None:
    result = judged(per_step_run(zero_at_start=False), load_line_resume(21, 1))
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.STEPS_REPLAYED


# ------------------------------------------------- 4. messages held to the fields they describe


def two_ranks(loads: dict[int, int | None], judged_load: int) -> DrillResult:
    """Ranks 0 (judged) and 1; checkpoints 10 and 20 by rank 0; after the kill rank 0 loads
    ``judged_load`` and rank 1 loads ``loads[1]`` (None: says nothing about its resume)."""
    engine = engine_for(ranks=(0, 1))
    old = [ev(S, 0.0, "old"), ev(S, 0.0, "old1", rank=1)]
    old += [ev(P, s * 0.1, "old", s) for s in range(1, 26)]
    old += [ev(C, s * 0.1 + 0.001, "old", s) for s in (10, 20)]
    drive(engine, sorted(old, key=lambda e: e.timestamp), kill_at=KILL)
    new = [ev(S, 3.0, "new"), ev(L, 3.05, "new", judged_load), ev(S, 3.0, "new1", rank=1)]
    if loads[1] is not None:
        new.append(ev(L, 3.06, "new1", loads[1], rank=1))
    new += [ev(P, 3.1 + 0.1 * i, "new", judged_load + 1 + i) for i in range(12)]
    return result_of(engine, sorted(new, key=lambda e: e.timestamp))


def ranks_check_of(result: DrillResult) -> Check:
    return next(c for c in result.checks if c.name == "all_ranks_resumed")


def test_all_ranks_resumed_names_the_step_each_rank_really_loaded() -> None:
    # The judged rank and rank 1 both loaded 10 (an older checkpoint): the resume FAILs;
    # the rank check must not say rank 1 loaded the expected 20.
    result = two_ranks({1: 10}, judged_load=10)
    assert result.verdict is Verdict.FAIL, result.summary
    check = ranks_check_of(result)
    assert check.passed is True and check.checked is True
    for state in check.observed:
        assert state["status"] == "ok"
        assert f"rank(s) {state['rank']} loaded step {state['loaded']}" in check.message
    assert "loaded step 20" not in check.message


def test_a_rank_check_that_verified_nothing_is_not_checked_everywhere_it_is_shown() -> None:
    result = two_ranks({1: None}, judged_load=20)
    assert result.verdict is Verdict.PASS, result.summary
    check = ranks_check_of(result)
    assert check.checked is False and check.status == "unchecked"
    assert check.message.startswith("not checked: rank(s) 1 reported no checkpoint_loaded")
    assert [s["status"] for s in check.observed] == ["unchecked"]
    # the terminal
    out = io.StringIO()
    print_result(result, out)
    assert "[--  ] all_ranks_resumed: not checked" in out.getvalue()
    assert "[ok  ] all_ranks_resumed" not in out.getvalue()
    # report.json: passed keeps its meaning for older readers; checked and status say it
    doc = result_to_dict(result)
    [entry] = [c for c in doc["checks"] if c["name"] == "all_ranks_resumed"]
    assert entry["checked"] is False and entry["status"] == "unchecked"
    assert entry["passed"] is True
    # the HTML report
    page = render_report(doc)
    assert '<span class="unchecked">not checked</span> <code>all_ranks_resumed</code>' in page or (
        '<code>all_ranks_resumed</code></td><td><span class="unchecked">not checked</span>' in page
    )


def test_a_rank_check_that_verified_one_rank_is_checked_and_says_which() -> None:
    result = two_ranks({1: 20}, judged_load=20)
    assert result.verdict is Verdict.PASS, result.summary
    check = ranks_check_of(result)
    assert check.checked is True and check.status == "passed"
    assert check.message == "rank(s) 1 loaded step 20"


def test_a_job_that_finished_without_any_line_with_a_step_is_told_to_give_one() -> None:
    # A Ray Train job whose report() carries no step: start lines only, then SUCCEEDED.
    engine = engine_for()
    drive(engine, [ev(S, 0.0, "w0"), ev(S, 0.0, "w1", rank=1)])
    result = ended(engine, 30.0, GroupEventKind.JOB_SUCCEEDED, "the Train run FINISHED")
    assert result.verdict is Verdict.ERROR, result.summary
    assert "printed no progress or checkpoint line with a step" in result.summary
    assert "step=N" in result.summary and "report() without a step" in result.summary
    assert "lengthen the run" not in result.summary


def test_a_job_that_printed_steps_and_finished_early_is_still_told_to_run_longer() -> None:
    engine = engine_for(after_checkpoint=1000)
    drive(engine, [ev(S, 0.0, "old"), *[ev(P, 0.1 * s, "old", s) for s in range(1, 30)]])
    result = ended(engine, 30.0, GroupEventKind.JOB_SUCCEEDED, "exit 0")
    assert "the job finished at step 29 before the drill could kill anything" in result.summary
    assert "lengthen the run" in result.summary
