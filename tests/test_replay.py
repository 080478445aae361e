"""Replay equivalence (``expectations.replay``): the killed run is the golden reference.

We test these aspects:

- the rule itself (:func:`pytest_recoverygate.engine.rules.replay.judge`): exact equality, the
  tolerance |new - old| <= atol + rtol * |old| at its boundary, ``maxDivergentSteps``,
  a differing ``data`` fingerprint diverging whatever the loss, NaN, ``report`` never
  a check, nothing to compare saying why;
- whole drills through the fake backend on a simulated clock (``fake.replay``), in
  milliseconds: exact PASS, tolerance PASS and FAIL, the allowance, a data mismatch,
  nothing to compare (inconclusive, with the fix), ``report`` never changing the verdict,
  every recovery of ``count: N`` compared on its own, ``replaySteps`` delaying the kill
  (and a ``delay`` overriding it);
- the report: ``replay`` at the top and per recovery, the ``replay_matches`` check; the
  page and the terminal show the compared steps side by side, the timeline picture marks
  the first divergent step.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from recoverygate import reporter
from recoverygate.evidence import Matcher, Spec, _Emitter
from recoverygate.wire import parse_text, printed_decimals

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.machine import DrillEngine, Finish, KillTarget
from pytest_recoverygate.engine.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEvent,
)
from pytest_recoverygate.engine.rules.replay import WHAT_TO_CHECK, judge
from pytest_recoverygate.engine.spec import ReplaySpec, Sustain
from pytest_recoverygate.engine.verdict import Check, DrillResult, FailureReason, Verdict
from pytest_recoverygate.orchestrators import build_orchestrator
from pytest_recoverygate.orchestrators.base import SimulatedClock
from pytest_recoverygate.report.html import render_report
from pytest_recoverygate.report.terminal import replay_lines
from pytest_recoverygate.report.timeline import build_figure
from pytest_recoverygate.runner import RunOptions, run_drill
from pytest_recoverygate.shared.events import to_training_event
from tests.engine_events import T0, C, L, P, S, ev
from tests.test_engine_patterns import drive, engine_for, result_of

EXACT = ReplaySpec("exact")

# ---------------------------------------------------------------------------- the rule


def run(**losses: float | None) -> dict[int, tuple[float | None, str | None]]:
    return {int(key.removeprefix("s")): (value, None) for key, value in losses.items()}


def test_exact_passes_equal_losses_and_names_the_steps() -> None:
    check, figures = judge(run(s20=1.0, s21=0.5, s22=0.25), run(s21=0.5, s22=0.25), EXACT)
    assert check is not None
    assert check.passed is True
    assert "2 steps" in check.message
    assert "steps 21-22" in check.message
    assert figures is not None
    assert (figures.steps_compared, figures.first_divergent_step) == (2, None)
    assert figures.max_abs_diff == 0.0


def test_exact_fails_at_the_first_differing_step_with_both_values() -> None:
    old = run(s21=0.5, s22=0.25, s23=0.125)
    new = run(s21=0.5, s22=0.25 + 2**-40, s23=0.2)
    check, figures = judge(old, new, EXACT)
    assert check is not None
    assert check.passed is False
    assert check.reason is FailureReason.REPLAY_DIVERGED
    assert "replay diverged at step 22" in check.message
    assert repr(0.25) in check.message
    assert repr(0.25 + 2**-40) in check.message
    assert WHAT_TO_CHECK in check.message
    assert figures is not None
    assert figures.divergent_steps == 2
    assert figures.max_abs_diff == pytest.approx(0.075)


def test_the_tolerance_holds_at_its_boundary_and_fails_just_past_it() -> None:
    spec = ReplaySpec("tolerance", rtol=0.5, atol=0.25)
    at_limit = judge(run(s1=1.0), run(s1=1.75), spec)[0]  # 0.75 = 0.25 + 0.5 * 1.0
    past = judge(run(s1=1.0), run(s1=1.75 + 2**-40), spec)[0]
    assert at_limit is not None
    assert at_limit.passed is True
    assert past is not None
    assert past.passed is False


def test_max_divergent_steps_is_an_allowance_of_steps() -> None:
    old = run(s1=1.0, s2=1.0, s3=1.0, s4=1.0)
    new = run(s1=2.0, s2=2.0, s3=1.0, s4=1.0)
    allowed = judge(old, new, ReplaySpec("tolerance", max_divergent_steps=2))
    one = judge(old, new, ReplaySpec("tolerance", max_divergent_steps=1))
    assert allowed[0] is not None
    assert allowed[0].passed is True
    assert allowed[1] is not None
    assert allowed[1].first_divergent_step is None
    assert one[0] is not None
    assert one[0].passed is False
    assert one[1] is not None
    assert one[1].first_divergent_step == 2  # the first step beyond the allowance of 1
    assert one[1].divergent_steps == 2


def test_a_differing_batch_diverges_even_with_the_same_loss() -> None:
    old = {21: (0.5, "b21"), 22: (0.25, "b22")}
    new = {21: (0.5, "b1"), 22: (0.25, "b22")}
    check, figures = judge(old, new, EXACT)
    assert check is not None
    assert check.passed is False
    assert "its data differs" in check.message
    assert "data loader" in check.message
    assert figures is not None
    assert figures.data_matched is False


def test_only_steps_past_the_resume_are_replayed_steps() -> None:
    old = run(s20=9.0, s21=0.5, s22=0.25)
    new = run(s20=1.0, s21=0.5, s22=0.25)  # a line at the loaded step: the state it holds
    check, figures = judge(old, new, EXACT, resumed_from=20)
    assert check is not None
    assert check.passed is True
    assert figures is not None
    assert [row[0] for row in figures.steps] == [21, 22]


def test_nan_matches_nan_only() -> None:
    both = judge(run(s1=math.nan, s2=0.5), run(s1=math.nan, s2=0.5), EXACT)[0]
    one = judge(run(s1=1.0), run(s1=math.nan), ReplaySpec("tolerance", rtol=1.0))[0]
    assert both is not None
    assert both.passed is True
    assert one is not None
    assert one.passed is False


def test_report_mode_gives_figures_and_never_a_check() -> None:
    check, figures = judge(run(s1=1.0), run(s1=3.0), ReplaySpec())
    assert check is None
    assert figures is not None
    assert figures.first_divergent_step == 1
    assert judge({}, {}, ReplaySpec()) == (None, None)


@pytest.mark.parametrize(
    ("old", "new", "resumed", "says"),
    [
        ({}, {}, 20, "the job reports no loss"),
        (run(s21=1.0), {21: (None, "b21")}, 20, "the replacement reported no loss"),
        (run(s19=1.0, s20=1.0), run(s21=1.0), 20, "the kill came before any replayed step"),
        (run(s21=1.0), run(s40=1.0), 20, "it did not redo the steps 21-21"),
        (run(s21=1.0, s23=1.0), run(s22=1.0, s24=1.0), 20, "RECOVERYGATE_REPLAY_WINDOW"),
    ],
)
def test_nothing_to_compare_is_inconclusive_and_says_why(
    old: dict[int, tuple[float | None, str | None]],
    new: dict[int, tuple[float | None, str | None]],
    resumed: int,
    says: str,
) -> None:
    check, figures = judge(old, new, EXACT, resumed_from=resumed)
    assert check is not None
    assert check.passed is None
    assert check.reason is FailureReason.INCONCLUSIVE
    assert check.message.startswith("inconclusive: nothing to compare for replay")
    assert says in check.message
    assert figures is not None
    assert figures.steps_compared == 0


# ---------------------------------------------------------------------------- drills

BASE = """\
workload:
  orchestrator: fake
  fake: {{workers: 2, checkpointEvery: 20, restartDelay: 1s{fake}}}
injectFailure:
  type: KillWorker
  afterCheckpoint: step-20
{failure}expectations:
  maxRecoveryTime: 2m
{expect}safety:
  requireConfirm: false
"""


def drill(
    tmp_path: Path, *, fake: str = "", failure: str = "", expect: str = "", speed: float = 50
) -> tuple[int, dict[str, Any]]:
    fake = f", stepsPerSecond: {speed}{fake}"
    text = BASE.format(fake=fake, failure=failure, expect=expect)
    config = parse_config(text, tmp_path / "drill.yaml")
    clock = SimulatedClock()
    report = tmp_path / "report.json"
    result = run_drill(
        config,
        RunOptions(report_path=report, handle_signals=False, confirmed=True),
        clock=clock,
        orchestrator=build_orchestrator(config, clock),
    )
    return result.exit_code, json.loads(report.read_text())


def replay_check(report: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in report["checks"] if c["name"] == "replay_matches"), None)


def test_a_job_that_replays_exactly_passes_exact(tmp_path: Path) -> None:
    code, report = drill(tmp_path, fake=", replay: exact", expect="  replay: exact\n")
    assert code == 0, report["summary"]
    replay = report["replay"]
    assert replay["mode"] == "exact"
    assert replay["stepsCompared"] >= 5  # replaySteps: the kill waited for them
    assert replay["firstDivergentStep"] is None
    assert replay["maxAbsDiff"] == 0.0
    assert replay["dataMatched"] is True
    assert replay["steps"][0]["step"] == report["resumeStep"] + 1
    assert all(row["killed"] == row["replacement"] for row in replay["steps"])
    check = replay_check(report)
    assert check is not None
    assert check["passed"] is True
    assert report["recoveries"][0]["replay"] == replay


def test_replay_steps_delays_the_kill_past_the_trigger_checkpoint(tmp_path: Path) -> None:
    _, waited = drill(
        tmp_path, fake=", replay: exact", expect="  replay: exact\n  replaySteps: 8\n"
    )
    assert waited["triggerCheckpoint"] == 20
    assert waited["lastStepBeforeKill"] >= 28
    assert waited["replay"]["stepsCompared"] >= 8
    (tmp_path / "d").mkdir()
    _, delayed = drill(
        tmp_path / "d",
        fake=", replay: exact",
        failure="  delay: 0.1s\n",
        expect="  replay: exact\n  replaySteps: 8\n",
    )
    assert delayed["lastStepBeforeKill"] < 28  # a delay decides when the kill lands


def test_a_noisy_replay_passes_within_the_tolerance(tmp_path: Path) -> None:
    code, report = drill(
        tmp_path, fake=", replay: noise, replayNoise: 1e-6", expect="  replay: {rtol: 1e-4}\n"
    )
    assert code == 0, report["summary"]
    replay = report["replay"]
    assert replay["mode"] == "tolerance"
    assert 0 < replay["maxRelDiff"] <= 1e-4
    assert replay["firstDivergentStep"] is None


def test_a_replay_off_by_more_than_the_tolerance_fails(tmp_path: Path) -> None:
    code, report = drill(
        tmp_path, fake=", replay: noise, replayNoise: 1e-2", expect="  replay: {rtol: 1e-4}\n"
    )
    assert code == 1
    assert report["reasons"] == ["REPLAY_DIVERGED"]
    assert report["replay"]["firstDivergentStep"] == report["resumeStep"] + 1
    check = replay_check(report)
    assert check is not None
    assert f"replay diverged at step {report['resumeStep'] + 1}" in check["message"]


@pytest.mark.parametrize(("allowed", "code"), [(2, 0), (1, 1)])
def test_max_divergent_steps_allows_that_many_steps(
    tmp_path: Path, allowed: int, code: int
) -> None:
    got, report = drill(
        tmp_path,
        fake=", replay: spike, replaySpikes: 2",
        expect=f"  replay: {{rtol: 1e-9, maxDivergentSteps: {allowed}}}\n",
    )
    assert got == code, report["summary"]
    assert report["replay"]["divergentSteps"] == 2
    rows = report["replay"]["steps"]
    diverged = [row["step"] for row in rows if row["killed"] != row["replacement"]]
    assert len(diverged) == 2
    expected_first = None if code == 0 else diverged[allowed]  # the first beyond the allowance
    assert report["replay"]["firstDivergentStep"] == expected_first


def test_a_data_position_not_restored_fails_naming_the_data(tmp_path: Path) -> None:
    code, report = drill(tmp_path, fake=", replay: data", expect="  replay: exact\n")
    assert code == 1
    assert report["replay"]["dataMatched"] is False
    check = replay_check(report)
    assert check is not None
    assert check["reason"] == "REPLAY_DIVERGED"
    assert "its data differs" in check["message"]


def test_a_job_without_losses_is_inconclusive_under_exact(tmp_path: Path) -> None:
    code, report = drill(tmp_path, expect="  replay: exact\n")
    assert code == 3
    assert report["verdict"] == "ERROR"
    assert "inconclusive: nothing to compare for replay" in report["summary"]
    assert "loss=" in report["summary"]


def test_a_kill_before_any_replayed_step_is_inconclusive(tmp_path: Path) -> None:
    code, report = drill(
        tmp_path,
        fake=", replay: exact",
        expect="  replay: exact\n  replaySteps: 0\n",
        speed=0.5,  # the kill lands before step 21 is done
    )
    assert code == 3, report["summary"]
    assert "the kill came before any replayed step" in report["summary"]
    assert "delay" in report["summary"]


def test_report_mode_never_changes_the_verdict(tmp_path: Path) -> None:
    code, report = drill(tmp_path, fake=", replay: data")
    assert code == 0, report["summary"]
    assert replay_check(report) is None
    assert report["replay"]["mode"] == "report"
    assert report["replay"]["firstDivergentStep"] == report["resumeStep"] + 1
    assert report["lastStepBeforeKill"] < 25  # report mode does not wait (replaySteps)


def test_each_recovery_of_count_n_is_compared_on_its_own(tmp_path: Path) -> None:
    code, report = drill(
        tmp_path, fake=", replay: exact", failure="  count: 3\n", expect="  replay: exact\n"
    )
    assert code == 0, report["summary"]
    recoveries = report["recoveries"]
    assert len(recoveries) == 3
    resumed = [r["replay"]["resumedFrom"] for r in recoveries]
    assert resumed == sorted(set(resumed))  # three distinct resumes, three comparisons
    for recovery in recoveries:
        replay = recovery["replay"]
        assert replay["stepsCompared"] >= 5
        assert replay["steps"][0]["step"] == recovery["resumeStep"] + 1
        assert replay["firstDivergentStep"] is None


# ---------------------------------------------------------------------------- the report


def test_the_page_the_terminal_and_the_picture_show_the_compared_steps(tmp_path: Path) -> None:
    text = BASE.format(
        fake=", stepsPerSecond: 50, replay: data", failure="", expect="  replay: exact\n"
    )
    config = parse_config(text, tmp_path / "drill.yaml")
    clock = SimulatedClock()
    folder = tmp_path / "report"
    result = run_drill(
        config,
        RunOptions(report_dir=folder, handle_signals=False, confirmed=True),
        clock=clock,
        orchestrator=build_orchestrator(config, clock),
    )
    doc = json.loads((folder / "report.json").read_text())
    first = doc["replay"]["firstDivergentStep"]
    page = (folder / "report.html").read_text()
    assert "<h2>Replay</h2>" in page
    assert "first divergent" in page
    assert repr(doc["replay"]["steps"][0]["killed"]) in page
    lines = replay_lines(result)
    assert lines[0].startswith("replayed steps (exact)")
    assert any(line.split()[0] == str(first) and "data differs" in line for line in lines[1:])
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = build_figure(doc)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    plt.close(fig)
    assert f"replay diverged at step {first}" in labels


# ---------------------------------------------------------------------------- engine scenarios
# (fool6: a reviewer's attacks on the rule; each scenario is a whole drill through the
# engine, the events as the wire delivers them)


def job(
    inc: str,
    t0: float,
    steps: list[int],
    loss: Callable[[int], float] | None,
    *,
    loaded: int | None = None,
    rank: int = 0,
    every: float = 0.1,
    data: Callable[[int], str] | None = None,
    lines: int = 1,
    checkpoints: bool = True,
) -> list[TrainingEvent]:
    """A run's events: ``lines`` progress lines per step (loss of line k: loss(step) + k)."""
    events = [ev(S, t0, inc, rank=rank)]
    t = t0 + 0.05
    if loaded is not None:
        events.append(ev(L, t, inc, loaded, rank=rank))
    for step in steps:
        for k in range(lines):
            t += every / lines
            extra: dict[str, Any] = {}
            if loss is not None:
                extra["loss"] = loss(step) + k
            if data is not None:
                extra["data"] = data(step)
            events.append(ev(P, t, inc, step, rank=rank, **extra))
        if checkpoints and step % 10 == 0:
            events.append(ev(C, t + 0.001, inc, step, rank=rank))
    return events


def good(step: int) -> float:
    return 1.0 / (step + 3)


def kill_when_asked(engine: DrillEngine, events: list[TrainingEvent]) -> None:
    """Feed ``events`` until the engine asks for the kill; it lands at once."""
    for event in events:
        for action in engine.on_training_event(event):
            if isinstance(action, KillTarget):
                engine.on_kill_result(KillResult(KillOutcome.KILLED, event.timestamp + 0.001))
                return
    raise AssertionError("the engine never asked for the kill")


def check_of(result: DrillResult) -> Check:
    found = next((c for c in result.checks if c.name == "replay_matches"), None)
    assert found is not None, result.summary
    return found


def both_ranks(
    name: str, t0: float, rank1: Callable[[int], float], **kw: Any
) -> list[TrainingEvent]:
    steps = list(range(21, 40)) if "loaded" in kw else list(range(1, 31))
    events = job(f"{name}0", t0, steps, good, rank=0, **kw) + job(
        f"{name}1", t0, steps, rank1, rank=1, every=0.1001, checkpoints=False, **kw
    )
    return sorted(events, key=lambda e: e.timestamp)


def ended(engine: DrillEngine, events: list[TrainingEvent]) -> DrillResult:
    finishes = drive(engine, events)
    end = GroupEvent(GroupEventKind.JOB_SUCCEEDED, events[-1].timestamp + 0.5, "exit 0")
    finishes += [a for a in engine.on_group_event(end) if isinstance(a, Finish)]
    assert len(finishes) == 1, finishes
    return finishes[0].result


def test_with_every_rank_reporting_each_is_compared_with_its_own_killed_run() -> None:
    """reportingRank: all; each rank's local loss differs (rank 1's is 0.25 higher). The
    reference is the judged replacement's own rank, never the rank whose last line was
    newest; and a rank that diverged is not hidden by one that matched."""
    rank1 = lambda step: good(step) + 0.25  # noqa: E731
    engine = engine_for(replay=EXACT, reporting_rank=None)
    kill_when_asked(engine, both_ranks("old", 0.0, rank1))
    same = check_of(ended(engine, both_ranks("new", 5.0, rank1, loaded=20)))
    assert same.passed is True, same.message
    engine = engine_for(replay=EXACT, reporting_rank=None)
    kill_when_asked(engine, both_ranks("old", 0.0, rank1))
    result = ended(engine, both_ranks("new", 5.0, lambda s: rank1(s) + 1e-3, loaded=20))
    check = check_of(result)
    assert check.passed is False, check.message
    assert "replay diverged at step 21" in check.message
    # rank 1's own killed run is the reference (rank 0's loss at 21 is good(21))
    assert f"the killed run's loss was {good(21) + 0.25!r}" in check.message
    assert result.verdict is Verdict.FAIL


def test_a_step_reported_once_per_micro_batch_is_compared_line_by_line() -> None:
    """4 lines per step (one per micro-batch), equal in both runs; the kill lands after the
    first line of step 25 (the killed run's last step is cut): PASS over the full steps."""
    engine = engine_for(replay=EXACT)
    kill_when_asked(engine, job("old", 0.0, list(range(1, 40)), good, lines=4))
    result = result_of(engine, job("new", 5.0, list(range(21, 40)), good, loaded=20, lines=4))
    check = check_of(result)
    assert check.passed is True, check.message
    assert result.verdict is Verdict.PASS
    assert result.replay is not None
    assert result.replay["linesPerStep"] == 4
    assert result.replay["stepsSkipped"] >= 1  # step 25: 1 line before the kill, not 4
    assert 25 not in [row["step"] for row in result.replay["steps"]]


def test_a_divergent_micro_batch_line_fails_even_when_the_steps_last_line_matches() -> None:
    engine = engine_for(replay=EXACT)
    kill_when_asked(engine, job("old", 0.0, list(range(1, 40)), good, lines=4))
    new = job("new", 5.0, list(range(21, 40)), good, loaded=20, lines=4)
    i = next(k for k, e in enumerate(new) if e.kind is P and e.step == 22)
    new[i] = replace(new[i], loss=(new[i].loss or 0.0) + 1e-9)  # the first of 4 lines only
    check = check_of(result_of(engine, new))
    assert check.passed is False
    assert "replay diverged at step 22" in check.message


def test_a_step_the_replacement_reported_twice_never_passes() -> None:
    """The replacement printed step 22 diverged, then again with the killed run's value:
    not a PASS (the newest value does not overwrite the evidence)."""
    engine = engine_for(replay=EXACT)
    kill_when_asked(engine, job("old", 0.0, list(range(1, 31)), good))
    new = job("new", 5.0, list(range(21, 40)), good, loaded=20, checkpoints=False)
    i = next(k for k, e in enumerate(new) if e.kind is P and e.step == 22)
    new.insert(i, replace(new[i], timestamp=new[i].timestamp - 0.01, loss=good(22) + 0.5))
    check = check_of(result_of(engine, new))
    assert check.passed is not True, check.message
    assert "different number of times" in check.message


def test_the_first_divergent_step_is_the_first_beyond_the_allowance() -> None:
    spec = ReplaySpec("tolerance", rtol=1e-9, max_divergent_steps=2)
    old = {s: (good(s), None) for s in range(21, 31)}
    new = {s: ((good(s) * 2 if s in (22, 25, 27) else good(s)), None) for s in range(21, 31)}
    check, figures = judge(old, new, spec, resumed_from=20)
    assert figures is not None and check is not None
    assert figures.first_divergent_step == 27
    assert figures.divergent_steps == 3
    assert check.message.startswith("replay diverged at step 27")


def test_exact_compares_bits_minus_zero_is_not_zero() -> None:
    check, figures = judge(run(s21=0.0, s22=0.5), run(s21=-0.0, s22=0.5), EXACT, resumed_from=20)
    assert check is not None and check.passed is False
    assert figures is not None and figures.first_divergent_step == 21
    tolerant = judge(run(s21=0.0), run(s21=-0.0), ReplaySpec("tolerance", atol=0.0))[0]
    assert tolerant is not None and tolerant.passed is True


def test_only_nan_losses_compared_prove_nothing() -> None:
    nan = math.nan
    check, _ = judge(run(s21=nan, s22=nan), run(s21=nan, s22=nan), EXACT, resumed_from=20)
    assert check is not None
    assert check.passed is None
    assert check.reason is FailureReason.INCONCLUSIVE
    assert "NaN or infinite" in check.message


def test_data_only_fingerprints_fail_when_they_differ_and_prove_no_loss_when_equal() -> None:
    old = {21: (None, "b21"), 22: (None, "b22")}
    check, figures = judge(old, {21: (None, "b1"), 22: (None, "b2")}, EXACT, resumed_from=20)
    assert check is not None and check.passed is False
    assert check.reason is FailureReason.REPLAY_DIVERGED
    assert "its data differs" in check.message
    assert figures is not None and figures.data_matched is False
    same = judge(old, dict(old), EXACT, resumed_from=20)[0]
    assert same is not None and same.passed is None
    assert "no loss was compared" in same.message


def test_a_replacement_that_skipped_the_replayed_steps_is_told_so() -> None:
    engine = engine_for(replay=EXACT)
    kill_when_asked(engine, job("old", 0.0, list(range(1, 31)), good))
    result = result_of(engine, job("new", 5.0, list(range(27, 45)), good, loaded=20))
    check = check_of(result)
    assert check.passed is None
    assert "its first reported step was 27" in check.message
    assert "RECOVERYGATE_REPLAY_WINDOW" not in check.message


def test_the_terminal_marks_data_only_where_both_runs_fingerprinted() -> None:
    engine = engine_for(replay=EXACT)
    kill_when_asked(engine, job("old", 0.0, list(range(1, 31)), good, data=lambda s: f"b{s}"))
    result = result_of(engine, job("new", 5.0, list(range(21, 40)), good, loaded=20))
    assert result.verdict is Verdict.PASS, result.summary
    lines = replay_lines(result)
    assert len(lines) > 1
    assert not any("differs" in line for line in lines), lines


def test_a_replay_steps_step_that_never_comes_is_named() -> None:
    """Training stops 2 steps past the trigger checkpoint 20; replaySteps 5 waits for 25."""
    engine = engine_for(replay=EXACT)
    events = job("old", 0.0, list(range(1, 23)), good)
    assert drive(engine, events) == []
    [timeout] = [a for a in engine.tick(T0 + 10_000.0) if isinstance(a, Finish)]
    assert timeout.result.verdict is Verdict.ERROR
    assert "the kill waits for step 25 (expectations.replaySteps: 5)" in timeout.result.summary
    assert "the last step seen was 22" in timeout.result.summary
    engine = engine_for(replay=EXACT)
    drive(engine, events)
    end = GroupEvent(GroupEventKind.JOB_SUCCEEDED, events[-1].timestamp + 0.5, "exit 0")
    [at_once] = [a for a in engine.on_group_event(end) if isinstance(a, Finish)]
    summary = at_once.result.summary
    assert "before the drill could kill anything" in summary
    assert "waits for step 25" in summary and "lower expectations.replaySteps" in summary


# ---------------------------------------------------------------------------- issue 41


def finish_step(engine: DrillEngine, events: list[TrainingEvent]) -> tuple[int | None, Finish]:
    """Feed ``events`` until the engine finishes: the step of the line that ended it."""
    for event in events:
        for action in engine.on_training_event(event):
            if isinstance(action, Finish):
                return event.step, action
    [action] = [a for a in engine.tick(T0 + 10_000.0) if isinstance(a, Finish)]
    return None, action


def test_a_divergence_after_the_first_replayed_step_ends_the_drill_once_that_step_is_done() -> None:
    """docs/replay.md: decided when proven. Step 21 matches, step 23 diverges: the drill
    ends once step 23's lines are all in (at step 24's line), not after the sustain
    window (it held 20 more lines: step 41)."""
    engine = engine_for(replay=EXACT, sustain=Sustain(lines=20, seconds=0.0))
    kill_when_asked(engine, job("old", 0.0, list(range(1, 31)), good))
    new = job(
        "new", 5.0, list(range(21, 60)), lambda s: good(s) + (0.5 if s >= 23 else 0.0), loaded=20
    )
    step, finish = finish_step(engine, new)
    assert step == 24, finish.result.summary
    assert finish.result.verdict is Verdict.FAIL
    assert "replay diverged at step 23" in finish.result.summary


def test_a_tolerance_ends_the_drill_at_the_first_step_beyond_the_allowance() -> None:
    spec = ReplaySpec("tolerance", rtol=1e-9, max_divergent_steps=1)
    engine = engine_for(replay=spec, sustain=Sustain(lines=20, seconds=0.0))
    kill_when_asked(engine, job("old", 0.0, list(range(1, 31)), good))
    spikes = {22: 0.5, 25: 0.5}
    new = job("new", 5.0, list(range(21, 60)), lambda s: good(s) + spikes.get(s, 0.0), loaded=20)
    step, finish = finish_step(engine, new)
    assert step == 26, finish.result.summary
    assert finish.result.verdict is Verdict.FAIL
    assert "replay diverged at step 25" in finish.result.summary


def test_within_the_tolerance_only_the_rows_outside_it_are_marked() -> None:
    """Every compared row was marked "<- differs" under a tolerance (issue 41)."""
    spec = ReplaySpec("tolerance", rtol=1e-6, max_divergent_steps=1)
    engine = engine_for(replay=spec)
    kill_when_asked(engine, job("old", 0.0, list(range(1, 31)), good))
    noisy = {s: good(s) * (1 + 1e-9) for s in range(21, 60)}
    noisy[24] = good(24) + 0.5  # the one outside it (allowed)
    result = result_of(engine, job("new", 5.0, list(range(21, 60)), noisy.__getitem__, loaded=20))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.replay is not None
    assert [row["matches"] for row in result.replay["steps"]] == [
        row["step"] != 24 for row in result.replay["steps"]
    ]
    marked = [line for line in replay_lines(result) if "differs" in line]
    assert len(marked) == 1 and marked[0].split()[0] == "24", marked
    assert "outside the tolerance" in marked[0]
    page = render_report({"verdict": "PASS", "recoveries": [{"index": 1, "replay": result.replay}]})
    table = page.split("<h2>Replay</h2>")[1]
    assert table.count("outside the tolerance") == 1
    assert "differs" not in table


# ---------------------------------------------------------------------------- printed losses
# issue 41: a loss read from a job's line carries the precision it was printed with


def printed_run(inc: str, lines: list[str], start: float) -> list[TrainingEvent]:
    """``lines`` through the evidence hook's matcher and the reporter, as a job's process
    turns them into RECOVERYGATE/v1 lines, read back as the drill reads them."""
    out = io.StringIO()
    clock = [T0 + start]
    reporter.configure(stream=out, clock=lambda: clock[0], replay_window=1000)
    try:
        emitter = _Emitter(Matcher(Spec(PRINTED)))
        for line in lines:
            clock[0] += 0.1
            emitter.line(line)
    finally:
        reporter.configure()
    records, malformed = parse_text(out.getvalue())
    assert malformed == 0
    return [replace(to_training_event(r, None), incarnation=inc, rank=0) for r in records]


PRINTED: dict[str, Any] = {
    "patterns": {
        "progress": r"^step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
        "checkpointCompleted": r"^saved step (?P<step>\d+)",
    }
}


def printed_lines(first: int, last: int, loss: Callable[[int], float]) -> list[str]:
    """A job that prints its loss with 4 decimals (``f"{loss:.4f}"``) and saves every 10."""
    out = []
    for step in range(first, last + 1):
        out.append(f"step {step} loss {loss(step):.4f}")
        if step % 10 == 0:
            out.append(f"saved step {step}")
    return out


def test_a_printed_loss_carries_its_decimals_to_the_drill() -> None:
    (event,) = [e for e in printed_run("a", ["step 1 loss 2.3456"], 0.0) if e.kind is P]
    assert (event.step, event.loss, event.loss_decimals) == (1, 2.3456, 4)


@pytest.mark.parametrize(
    ("text", "decimals"),
    [("2.3456", 4), ("6.543210E+00", 6), ("3", 0), ("+1.50", 2), ("1e-3", 0), ("nan", None)],
)
def test_the_decimals_a_number_was_printed_with(text: str, decimals: int | None) -> None:
    assert printed_decimals(text) == decimals


def test_exact_on_printed_losses_says_equal_to_the_printed_decimals_not_bit_for_bit() -> None:
    """The killed run's loss 2.345612 and the replacement's 2.345648 both print 2.3456:
    it PASSed "bit for bit" (issue 41). Equal to the 4 printed decimals is what it shows."""
    engine = engine_for(replay=EXACT)
    killed = printed_run("old", printed_lines(1, 30, lambda s: 2.345612 + s), 0.0)
    kill_when_asked(engine, killed)
    replacement = printed_lines(21, 40, lambda s: 2.345648 + s)
    result = result_of(engine, printed_run("new", replacement, 10.0))
    check = check_of(result)
    assert check.passed is True, check.message
    assert "bit for bit" not in check.message
    assert "equal to the 4 printed decimals" in check.message
    assert "a difference below that precision cannot be seen" in check.message
    assert result.replay is not None and result.replay["lossDecimals"] == 4


def test_a_difference_the_printed_decimals_show_still_diverges() -> None:
    engine = engine_for(replay=EXACT)
    kill_when_asked(engine, printed_run("old", printed_lines(1, 30, lambda s: 2.3456 + s), 0.0))
    replacement = printed_lines(21, 40, lambda s: 2.3457 + s)
    check = check_of(result_of(engine, printed_run("new", replacement, 10.0)))
    assert check.passed is False
    assert "replay diverged at step 21: the killed run's loss was 23.3456" in check.message
