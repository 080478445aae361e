"""Job patterns an adversarial review found fooling the verdict, driven through the engine.

We test these aspects (each a scripted job that records its own truth: what it loaded,
the first step it trained, whether it started from scratch):
1. a replacement whose lines say 0 steps completed, or the step it then loads, before it
   loads (a metrics thread started before a slow checkpoint load, a step counter restored
   before the weights) resumed from what it then loads: a correct resume passes with the
   loaded step, whether it reports checkpoint_loaded or not; a restart from scratch after
   such a line still fails as one at its first step, and a first line at a checkpoint's
   step with no load after it is still a replay;
2. per-rank shards: a rank that reported its own save of every earlier checkpoint but
   never of the newest (the kill cut its save or its report) leaves the newest one
   unproven, so a resume from the newest checkpoint every rank reported is no "older
   checkpoint" FAIL (and no PASS either); one older than that still fails, and a job
   whose other ranks report no saves keeps today's FAIL;
3. a launcher that imported the reporter (its workers' start lines name it as ``parent``)
   and never printed: a replacement naming the same parent as the group before the kill
   is a worker, so its restart from scratch is decided at its first step, not after the
   sustain window; a child naming a new, silent parent still waits;
4. ``progress(global_step)`` on every micro-batch (a hand-written Lightning callback with
   gradient accumulation) prints the count 0 on several lines at a fresh start: the fresh
   state held, no ``progress(epoch)``, so a correct resume passes and a restart from
   scratch fails; a single 0, then 1, is still the zero-based signature.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_recoverygate.engine.machine import DrillResult, FailureReason, Finish, Verdict
from pytest_recoverygate.engine.model import TrainingEvent
from pytest_recoverygate.engine.spec import Sustain
from tests.engine_events import T0, C, L, P, S, ev
from tests.test_engine_patterns import drive, engine_for, result_of, steps_run

R = FailureReason

KILL = 2.6  # seconds into the first incarnation: after checkpoint 20, before step 26


@dataclass
class Truth:
    """What the scripted replacement really did (never what the drill read)."""

    loaded: int | None  # the checkpoint it loaded, None: nothing
    first_trained: int  # its first completed step

    @property
    def resume_step(self) -> int:
        return self.first_trained - 1


@dataclass
class Job:
    """A job stepping every 0.1 s (progress every step), a checkpoint every 10 steps."""

    shard_ranks: tuple[int, ...] = ()  # other ranks that save and report their own shard
    events: list[TrainingEvent] = field(default_factory=list)

    def first_run(self, steps: int = 25) -> list[TrainingEvent]:
        out = [ev(S, 0.0, "old")] + [ev(S, 0.0, f"old{r}", rank=r) for r in self.shard_ranks]
        for step in range(1, steps + 1):
            t = step * 0.1
            out.append(ev(P, t, "old", step))
            if step % 10 == 0:
                out.append(ev(C, t + 0.01, "old", step))
                out += [ev(C, t + 0.02, f"old{r}", step, rank=r) for r in self.shard_ranks]
        return out

    def replacement(
        self,
        truth: Truth,
        *,
        zero_lines: int,
        report_load: bool = True,
        load_time: float = 0.8,
    ) -> list[TrainingEvent]:
        """Start at 3 s; a metrics thread ticks ``zero_lines`` times (0 steps done) while
        the checkpoint loads for ``load_time`` s; then it trains from its truth."""
        out = [ev(S, 3.0, "new")]
        out += [ev(P, 3.05 + 0.2 * i, "new", 0) for i in range(zero_lines)]
        t = 3.05 + load_time
        if truth.loaded is not None and report_load:
            out.append(ev(L, t, "new", truth.loaded))
        for i, step in enumerate(range(truth.first_trained, truth.first_trained + 12)):
            out.append(ev(P, t + 0.1 * (i + 1), "new", step))
        return out


def judged(job: Job, old: list[TrainingEvent], new: list[TrainingEvent]) -> DrillResult:
    engine = engine_for(ranks=(0, *job.shard_ranks))
    drive(engine, sorted(old, key=lambda e: e.timestamp), kill_at=KILL)
    return result_of(engine, new)


# ------------------------------------------------- 1. lines of 0 steps before the load


def test_a_metrics_thread_ticking_zero_while_the_checkpoint_loads_is_no_restart() -> None:
    job = Job()
    truth = Truth(loaded=20, first_trained=21)
    result = judged(job, job.first_run(), job.replacement(truth, zero_lines=3))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == truth.resume_step == truth.loaded
    assert result.recoveries[0].resume_basis == "checkpoint_loaded"
    # The recovery counts to its first step past the load, not to a line of 0 steps.
    recovery = result.recoveries[0].recovery_time_seconds
    first_step_at = 3.05 + 0.8 + 0.1
    assert recovery is not None and abs(recovery - (first_step_at - KILL)) < 1e-6


def test_a_zero_line_before_a_resume_reported_by_progress_alone_passes_inferred() -> None:
    job = Job()
    truth = Truth(loaded=20, first_trained=21)
    new = job.replacement(truth, zero_lines=2, report_load=False)
    result = judged(job, job.first_run(), new)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == truth.resume_step
    assert result.recoveries[0].resume_basis == "inferred"


def test_a_zero_line_then_a_restart_from_scratch_still_fails_as_one_at_its_first_step() -> None:
    job = Job()
    truth = Truth(loaded=None, first_trained=1)
    engine = engine_for()
    drive(engine, sorted(job.first_run(), key=lambda e: e.timestamp), kill_at=KILL)
    new = job.replacement(truth, zero_lines=2)
    upto = next(i for i, e in enumerate(new) if e.kind is P and e.step == truth.first_trained)
    finishes = drive(engine, new[: upto + 1])  # decided at its first step, not later
    assert len(finishes) == 1
    result = finishes[0].result
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.resume_step == truth.resume_step == 0
    assert result.reasons[0] is R.RESTARTED_FROM_SCRATCH


def test_a_zero_line_then_a_load_of_checkpoint_0_still_fails_as_a_restart_from_scratch() -> None:
    job = Job()
    truth = Truth(loaded=0, first_trained=1)
    result = judged(job, job.first_run(), job.replacement(truth, zero_lines=1))
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.RESTARTED_FROM_SCRATCH


def test_a_step_counter_restored_before_the_weights_load_is_no_replay() -> None:
    # HF-style: a metrics thread reads state.global_step: 0 at start, 20 once the trainer
    # state is restored, and checkpoint_loaded(20) comes after (on_train_begin).
    job = Job()
    truth = Truth(loaded=20, first_trained=21)
    new = [ev(S, 3.0, "new"), ev(P, 3.05, "new", 0), ev(P, 3.25, "new", 20)]
    new += [ev(P, 3.45, "new", 20), ev(L, 3.6, "new", truth.loaded)]
    new += [ev(P, 3.7 + 0.1 * i, "new", truth.first_trained + i) for i in range(12)]
    result = judged(job, job.first_run(), new)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == truth.resume_step
    assert result.recoveries[0].resume_basis == "checkpoint_loaded"


def test_a_first_line_at_a_checkpoint_step_without_a_load_is_still_a_replay() -> None:
    # Without checkpoint_loaded, a job whose lines come after steps and that reports 20
    # first redid step 20 (a resume off by one): its next line decides it.
    job = Job()
    new = [ev(S, 3.0, "new")] + [ev(P, 3.1 + 0.1 * i, "new", 20 + i) for i in range(12)]
    result = judged(job, job.first_run(), new)
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.STEPS_REPLAYED


def test_a_load_then_a_counter_back_at_zero_is_still_a_replay() -> None:
    job = Job()
    new = [ev(S, 3.0, "new"), ev(L, 3.1, "new", 20)]
    new += [ev(P, 3.2 + 0.1 * i, "new", i) for i in range(12)]  # 0, 1, 2: counted again
    result = judged(job, job.first_run(), new)
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.STEPS_REPLAYED


# ------------------------------------------------------------ 2. per-rank shards


def sharded_first_run(job: Job, *, cut_rank: int, cut_step: int = 30) -> list[TrainingEvent]:
    """The first run to step 31; rank ``cut_rank``'s shard of ``cut_step`` is still being
    written when the kill lands (its completion never reported)."""
    events = job.first_run(steps=31)
    return [e for e in events if not (e.kind is C and e.rank == cut_rank and e.step == cut_step)]


def test_a_resume_from_the_newest_checkpoint_every_rank_reported_is_no_older_checkpoint() -> None:
    job = Job(shard_ranks=(1,))
    old = sharded_first_run(job, cut_rank=1)
    kill_at = 3.15  # after rank 0 reported its shard of 30 (3.01), rank 1 never did
    engine = engine_for(ranks=(0, 1))
    drive(engine, sorted(old, key=lambda e: e.timestamp), kill_at=kill_at)
    truth = Truth(loaded=20, first_trained=21)  # the job loads what every rank holds
    new = [ev(S, 4.0, "new"), ev(S, 4.0, "new1", rank=1)]
    new += [ev(L, 4.3, "new", truth.loaded), ev(L, 4.3, "new1", truth.loaded, rank=1)]
    new += [ev(P, 4.4 + 0.1 * i, "new", truth.first_trained + i) for i in range(12)]
    result = result_of(engine, new)
    assert result.verdict is Verdict.ERROR, result.summary
    assert result.reasons[0] is R.INCONCLUSIVE
    assert "never by rank(s) 1" in result.summary and "checkpoint 30" in result.summary


def test_a_resume_older_than_every_rank_reported_still_fails() -> None:
    job = Job(shard_ranks=(1,))
    old = sharded_first_run(job, cut_rank=1)
    engine = engine_for(ranks=(0, 1))
    drive(engine, sorted(old, key=lambda e: e.timestamp), kill_at=3.15)
    truth = Truth(loaded=10, first_trained=11)  # 20 was complete on every rank
    new = [ev(S, 4.0, "new"), ev(S, 4.0, "new1", rank=1)]
    new += [ev(L, 4.3, "new", truth.loaded), ev(L, 4.3, "new1", truth.loaded, rank=1)]
    new += [ev(P, 4.4 + 0.1 * i, "new", truth.first_trained + i) for i in range(12)]
    result = result_of(engine, new)
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.RESUMED_FROM_OLDER_CHECKPOINT


def test_without_other_ranks_reporting_saves_an_older_resume_still_fails() -> None:
    job = Job()  # only rank 0 reports checkpoints: 30 is complete by the job's own word
    engine = engine_for(ranks=(0, 1))
    drive(engine, sorted(job.first_run(steps=31), key=lambda e: e.timestamp), kill_at=3.15)
    new = [ev(S, 4.0, "new"), ev(L, 4.3, "new", 20)]
    new += [ev(P, 4.4 + 0.1 * i, "new", 21 + i) for i in range(12)]
    result = result_of(engine, new)
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.RESUMED_FROM_OLDER_CHECKPOINT


# ------------------------------------------------- 3. a launcher that loaded the reporter


def launched_run(parent: str) -> list[TrainingEvent]:
    start = ev(S, 0.0, "old", pid=101, host="h", ppid=100, parent=parent)
    return [start, *steps_run("old", 0.0, list(range(1, 26)), start=False)]


def test_a_restart_from_scratch_under_a_silent_launcher_is_decided_at_its_first_step() -> None:
    engine = engine_for(sustain=Sustain(lines=3, seconds=10.0))
    drive(engine, launched_run("launcher"), kill_at=KILL)
    truth = Truth(loaded=None, first_trained=1)
    new = [ev(S, 3.0, "new", pid=201, host="h", ppid=100, parent="launcher")]
    new += [ev(P, 3.1 + 0.1 * i, "new", truth.first_trained + i) for i in range(150)]
    for n, event in enumerate(new):
        finishes = [a for a in engine.on_training_event(event) if isinstance(a, Finish)]
        if finishes:
            break
    assert finishes, "never decided"
    assert new[n].step == truth.first_trained  # at its first step, not 10 s later
    result = finishes[0].result
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.RESTARTED_FROM_SCRATCH


def test_a_process_naming_a_new_silent_parent_still_waits_for_its_window() -> None:
    engine = engine_for(sustain=Sustain(lines=3, seconds=10.0))
    drive(engine, launched_run("launcher"), kill_at=KILL)
    # Its parent (a replacement worker that has not printed yet) is no launcher.
    new = [ev(S, 3.0, "warm", pid=301, host="h", ppid=300, parent="new-worker")]
    new += [ev(P, 3.1 + 0.1 * i, "warm", 1 + i) for i in range(20)]
    assert not [a for e in new for a in engine.on_training_event(e) if isinstance(a, Finish)]


# ------------------------------------- 4. progress per micro-batch, gradient accumulation


ACCUMULATE = 4


def micro_batches(
    inc: str, t0: float, truth: Truth, optimizer_steps: int, *, report_load: bool = True
) -> list[TrainingEvent]:
    """progress(global_step) after every micro-batch; the optimizer steps every 4th."""
    out = [ev(S, t0, inc)]
    t = t0 + 0.05
    if truth.loaded is not None and report_load:
        out.append(ev(L, t, inc, truth.loaded))
    done = truth.first_trained - 1  # global_step when this process starts
    for batch in range(optimizer_steps * ACCUMULATE):
        t += 0.03
        if batch % ACCUMULATE == ACCUMULATE - 1:
            done += 1
            if done % 10 == 0:
                out.append(ev(C, t + 0.001, inc, done))
        out.append(ev(P, t, inc, done))
    return out


def accumulation_result(truth: Truth) -> DrillResult:
    old = micro_batches("old", 0.0, Truth(loaded=None, first_trained=1), 25)
    engine = engine_for()
    drive(engine, sorted(old, key=lambda e: e.timestamp), kill_at=old[-1].timestamp - 0.2 - T0)
    return result_of(engine, micro_batches("new", 4.0, truth, 12))


def test_progress_per_micro_batch_keeps_the_contract_and_a_correct_resume_passes() -> None:
    truth = Truth(loaded=20, first_trained=21)
    result = accumulation_result(truth)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == truth.resume_step
    assert result.step_contract is not None and result.step_contract.problem is None


def test_progress_per_micro_batch_and_a_restart_from_scratch_fails_as_one() -> None:
    truth = Truth(loaded=None, first_trained=1)
    result = accumulation_result(truth)
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is R.RESTARTED_FROM_SCRATCH


def test_a_single_zero_then_one_is_still_the_zero_based_signature() -> None:
    engine = engine_for(after_checkpoint=10)
    old = [ev(S, 0.0, "old")] + [ev(P, 0.1 * (i + 1), "old", i) for i in range(25)]
    old += [ev(C, 0.1 * (i + 1) + 0.01, "old", i) for i in (10, 20)]  # progress(epoch)
    drive(engine, sorted(old, key=lambda e: e.timestamp), kill_at=2.2)
    new = [ev(S, 3.0, "new"), ev(L, 3.05, "new", 20)]
    new += [ev(P, 3.1 + 0.1 * i, "new", 21 + i) for i in range(12)]
    result = result_of(engine, new)
    assert result.step_contract is not None and result.step_contract.problem is not None
    assert result.verdict is Verdict.ERROR, result.summary
