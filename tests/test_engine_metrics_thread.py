"""A metrics thread's first tick against the training loop's first step (issue 41, item 7).

A job whose metrics thread reports the completed count every 0.1 s, and once as it
starts, was FAILed ``STEPS_REPLAYED`` ("resumed from 36", 4 steps lost) on a loaded
machine, though by its own records it loaded 40 and lost none. Two threads of one process
race there: the thread's first tick and the loop's first step. In the first run the tick
came after step 1 (lines 1, 5, 9, …: every 4 steps, the first line after a step); in the
replacement it came before step 41 (40, the state it holds, then 44, 48). Read with the
first run's order, the replacement's 40 was step 40 done again, and the stride of 4 put
the resume at 36. The lines alone cannot tell that job from a loop that logs the first
step of each process and then every 4th (``enumerate``'s index) and redoes the step it
loaded; which thread printed each line can (wire's ``thread`` field).

We test these aspects, each fed to the engine as the fake backend does:
- the issue's lines, each with its thread: PASS, resume 40, lost 0 (before: FAIL,
  "resumed from 36");
- the same job when its first run's lines read as "the first step, then every 5th" (1,
  5, 10, …): PASS (before the thread numbers: FAIL; with them, before this: inconclusive,
  "its first step was 44, more than one progress stride later");
- the same job without ``checkpoint_loaded``: inconclusive, naming
  ``checkpoint_loaded``, never a FAIL (before: FAIL ``STEPS_REPLAYED``, "resumed from step
  36 … steps 37–40 were done again", its first line 40 read as a line after step 40);
- the same lines from one thread (the ``enumerate`` loop redoing step 40): still FAIL
  ``STEPS_REPLAYED``;
- a loop that reports every step while a saver thread reports its checkpoints, redoing
  the step it loaded: still FAIL ``STEPS_REPLAYED`` (its progress comes from the thread
  that loaded);
- a metrics thread whose first tick came before the first step (0, 4, 8, …): PASS, as
  before;
- a metrics thread whose first run's first step was slow (0, then 1, 5, 9, …): PASS
  (before: inconclusive, its 0 then 1 read as ``progress(epoch)``, a broken contract); the
  same lines from one thread still break the contract.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pytest_recoverygate.engine.machine import DrillEngine, DrillResult, Verdict
from pytest_recoverygate.engine.model import TrainingEvent
from pytest_recoverygate.engine.verdict import FailureReason
from pytest_recoverygate.transcript.read import Transcript, read_transcript
from pytest_recoverygate.transcript.rejudge import replay
from tests.engine_events import C, L, P, S, ev
from tests.test_engine_patterns import drive, engine_for, result_of

R = FailureReason

STEP = 0.025  # seconds per step: the loop on a loaded machine, 4 steps per tick
TICK = 0.1  # the metrics thread's interval
KILL = 40 * STEP + 0.002  # just after checkpoint 40


def first_run(
    first_tick: int, *, ticker: int | None, saver: int | None, every: int = 4
) -> list[TrainingEvent]:
    """The first incarnation: progress lines ``first_tick``, ``first_tick + every``, … one
    per tick (thread ``ticker``), checkpoints 20 and 40 (thread ``saver``), to step 42."""
    events = [ev(S, 0.0, "old")]
    step, t = first_tick, first_tick * STEP + 0.005
    while step <= 42:
        events.append(ev(P, t, "old", step, thread=ticker))
        step, t = step + every, t + TICK
    events += [ev(C, s * STEP + 0.001, "old", s, thread=saver) for s in (20, 40)]
    return sorted(events, key=lambda e: e.timestamp)


def replacement(
    *, loaded: bool, ticker: int | None, loader: int | None, first: int = 40
) -> list[TrainingEvent]:
    """The replacement: started 0.5 s after the kill, ``checkpoint_loaded(40)`` (thread
    ``loader``) unless not ``loaded``, then lines ``first``, ``first + 4``, … one per tick
    (thread ``ticker``), its checkpoint 60 by the loader."""
    start = KILL + 0.5
    events = [ev(S, start, "new")]
    if loaded:
        events.append(ev(L, start + 0.1, "new", 40, thread=loader))
    t = start + 0.1005
    for step in range(first, 81, 4):
        events.append(ev(P, t, "new", step, thread=ticker))
        t += TICK
    events.append(ev(C, start + 0.1 + 20 * STEP + 0.001, "new", 60, thread=loader))
    return sorted(events, key=lambda e: e.timestamp)


def judged(
    old: list[TrainingEvent], new: list[TrainingEvent], kill_at: float = KILL
) -> DrillResult:
    engine: DrillEngine = engine_for(after_checkpoint=40, max_recovery_time=30.0)
    drive(engine, old, kill_at=kill_at)
    assert engine.kill_time is not None, "the drill never killed"
    return result_of(engine, new)


# The threads as the reporter numbers them: the first thread that prints is 0 (no field).
# First run: the metrics thread ticks first (0), the loop saves (1). Replacement: the loop
# reports its load first (0), the metrics thread ticks (1).


def test_a_metrics_thread_that_ticked_after_the_first_step_in_the_first_run_passes() -> None:
    old = first_run(1, ticker=None, saver=1)  # 1, 5, 9, …: the tick came after step 1
    result = judged(old, replacement(loaded=True, ticker=1, loader=None))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 40
    assert result.lost_steps == 0
    contract = result.step_contract
    assert contract is not None and contract.metrics_thread, contract


def test_a_metrics_thread_that_looked_like_the_first_step_then_every_fifth_passes() -> None:
    # 1, 5, 10, 15, …: read as the logging idiom "the first step after a start, then every
    # 5th", which would put a correct first step right after the load (41); its samples
    # after the load (40, the state it holds, then 44) bound no step.
    old = [e for e in first_run(0, ticker=None, saver=1, every=5) if e.step != 0]
    old.insert(1, ev(P, 1 * STEP + 0.005, "old", 1))
    result = judged(old, replacement(loaded=True, ticker=1, loader=None))
    assert result.step_contract is not None and result.step_contract.first_special
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 40


def test_the_same_job_without_checkpoint_loaded_is_inconclusive_never_failed() -> None:
    old = first_run(1, ticker=None, saver=1)
    # Its first printer is the metrics thread now (40, 44, …); its loop saves 60 later.
    result = judged(old, replacement(loaded=False, ticker=None, loader=1))
    assert result.verdict is Verdict.ERROR and result.inconclusive, result.summary
    assert "checkpoint_loaded" in result.summary


def test_the_same_lines_from_one_thread_are_a_loop_that_redid_the_loaded_step() -> None:
    # for i, batch in enumerate(loader): … if i % 4 == 0: progress(step): the first step
    # of each process, then every 4th. A resume off by one redoes step 40 and logs it.
    old = first_run(1, ticker=None, saver=None)
    result = judged(old, replacement(loaded=True, ticker=None, loader=None))
    assert result.verdict is Verdict.FAIL, result.summary
    assert R.STEPS_REPLAYED in result.reasons


def test_a_loop_whose_saver_thread_reports_checkpoints_still_fails_a_redone_step() -> None:
    # Every step reported by the loop (thread 0); the saves reported by a saver thread (1).
    old = first_run(1, ticker=None, saver=1, every=1)
    new = [ev(S, KILL + 0.5, "new"), ev(L, KILL + 0.6, "new", 40)]
    new += [ev(P, KILL + 0.6 + (i + 1) * STEP, "new", 40 + i) for i in range(30)]
    result = judged(old, new)
    assert result.verdict is Verdict.FAIL, result.summary
    assert R.STEPS_REPLAYED in result.reasons
    assert result.step_contract is not None and result.step_contract.metrics_thread


def test_a_metrics_thread_that_ticked_before_the_first_step_passes_as_before() -> None:
    old = [ev(P, 0.001, "old", 0), *first_run(4, ticker=None, saver=1)]  # 0, 4, 8, …
    result = judged(
        sorted(old, key=lambda e: e.timestamp), replacement(loaded=True, ticker=1, loader=None)
    )
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 40


def slow_first_step(*, ticker: int | None, saver: int | None) -> list[TrainingEvent]:
    """A first run whose first step took 0.1 s (then 0.025 s each): 0, 1, 5, 9, … one line
    per tick (thread ``ticker``), checkpoints 20 and 40 (thread ``saver``)."""

    def done_at(step: int) -> float:
        return 0.1 + (step - 1) * STEP

    events = [ev(S, 0.0, "old"), ev(P, 0.001, "old", 0, thread=ticker)]
    events += [ev(P, done_at(s) + 0.001, "old", s, thread=ticker) for s in range(1, 43, 4)]
    events += [ev(C, done_at(s) + 0.002, "old", s, thread=saver) for s in (20, 40)]
    return sorted(events, key=lambda e: e.timestamp)


def test_a_metrics_thread_around_a_slow_first_step_breaks_no_contract() -> None:
    result = judged(
        slow_first_step(ticker=None, saver=1),
        replacement(loaded=True, ticker=1, loader=None),
        kill_at=0.1 + 39 * STEP + 0.003,
    )
    assert result.verdict is Verdict.PASS, result.summary
    assert result.step_contract is not None and result.step_contract.problem is None
    assert result.resume_step == 40


def test_0_then_1_from_one_thread_is_still_progress_of_the_epoch_index() -> None:
    result = judged(
        slow_first_step(ticker=None, saver=None),
        replacement(loaded=True, ticker=None, loader=None, first=41),
        kill_at=0.1 + 39 * STEP + 0.003,
    )
    assert result.step_contract is not None and result.step_contract.problem is not None
    assert "reported as 0" in result.step_contract.problem
    assert result.verdict is Verdict.ERROR and result.inconclusive, result.summary


# ------------------------------------------- the failing drill the stress loop kept (issue 41)

KEPT = Path(__file__).resolve().parent / "data" / "issue41-metrics-thread"


def with_threads(transcript: Transcript) -> Transcript:
    """The kept drill's lines with the thread numbers the reporter now writes: in each
    process the kind of line it printed first (progress, or a checkpoint line) is thread
    0's, the other kind thread 1's (its metrics thread ticks, its loop saves and loads)."""
    first: dict[str, bool] = {}  # incarnation -> whether its first line was progress
    calls = []
    for call in transcript.calls:
        event = call.args.get("event") if call.name == "on_training_event" else None
        if event is None or event.kind is S:
            calls.append(call)
            continue
        progress = event.kind is P
        first.setdefault(event.incarnation, progress)
        numbered = dataclasses.replace(
            event, thread=0 if progress == first[event.incarnation] else 1
        )
        calls.append(dataclasses.replace(call, args={**call.args, "event": numbered}))
    return dataclasses.replace(transcript, calls=tuple(calls))


def test_the_kept_failing_drill_reproduces_on_rejudge_and_its_threads_undo_the_fail() -> None:
    # A real drill of tests/truth/job.py --progress-style=thread --late-first-tick on main
    # (stress loop, 4 FAILs in 40 runs): the first run printed 1, 6, 11, … 41 (every 5
    # steps, its first line after step 1); the replacement loaded 40 and its thread
    # printed 40 before any step (its records: loaded 40, 0 steps when the drill ended it).
    transcript = read_transcript(KEPT / "transcript.jsonl")
    result, diverged = replay(transcript)
    assert diverged == ()  # an engine's reading, not timing: it reproduces
    assert result.verdict is Verdict.FAIL and result.resume_step == 35, result.summary
    assert R.STEPS_REPLAYED in result.reasons
    # Its old reporter wrote no thread field; with the numbers the reporter writes now, the
    # engine no longer decides at that line (the drill ended the job there, so the
    # transcript holds nothing after it).
    again, diverged = replay(with_threads(transcript))
    assert again.verdict is not Verdict.FAIL, again.summary
    [line] = diverged  # the held tick, where the old engine finished
    assert ": recorded finish FAIL" in line and line.endswith("replayed nothing"), line
    assert again.step_contract is not None and again.step_contract.metrics_thread
