"""The truth corpus: real drills whose verdicts are held to the job's own ground truth.

Every test launches ``tests/truth/job.py`` (torch-free, standard library + the reporter)
under real torchrun (2 ranks, ``--standalone``), runs ``recoverygate run`` on it with the
local backend (a real SIGKILL of rank 1), then computes what really happened from the
records the job wrote itself (``tests/truth/truth.py``) and holds the drill's verdict,
reasons, resume step, lost steps and recovery time to it. The tool never writes the
truth. Each drill takes a few seconds; see tests/truth/README.md for the measured times
and for how the old engine fares.

We test these aspects:
- a correct resume PASSes with every figure matching the truth: resume step, lost steps
  between the drill's proven lower and upper bounds, recovery time within 50 ms,
  restarts, the judged incarnation — with and without ``checkpoint_loaded``;
- a replacement that loads and dies, followed by one that starts from scratch, FAILs as
  restarted from scratch, judged on the one that trained;
- a replacement that loads a checkpoint but counts from step 1 again FAILs as replayed;
- sparse progress (every 20th step, as often as the checkpoints): a correct resume PASSes with the right resume step,
  a job that never loads FAILs as restarted from scratch;
- zero-based labels (``progress(epoch)``): a correct resume is inconclusive (ERROR) with
  the fix named, never PASS or FAIL; the same job restarting from scratch still FAILs;
- an off-by-one epoch resume (redoes one step) FAILs as replayed, with the resume step and
  lost steps of the truth;
- asynchronous checkpoints that become durable M steps late: lost steps bounded around
  the truth, FAIL when the limit is below the lag, PASS when it is well above;
- a job that finishes right after resuming is inconclusive (ERROR), not judged;
- a survivor that keeps printing after the kill does not inflate the lost steps;
- a checkpoint at step 1 (``afterCheckpoint: next``): a restart from scratch FAILs, a
  correct resume PASSes;
- a survivor that writes an emergency checkpoint after the kill: printed, the replacement
  resumes from it and the drill PASSes with that resume step; silent (never reported
  complete), the drill names the same resume step but is inconclusive: a checkpoint
  nobody reported complete may as well be torn;
- the real example ``examples/local/train.py`` (torch DDP) PASSes held to its own records;
- replay (``--loss``): a resume that restores the model's state PASSes ``replay: exact``,
  every compared step one both runs did; one that loses it FAILs ``REPLAY_DIVERGED`` at
  the first step where the job's own loss records differ;
- a metrics thread whose first run ticked after its first step and whose replacement
  ticked the loaded step before its first (``--late-first-tick``, issue 41, item 7): PASS
  with ``checkpoint_loaded``, inconclusive without it, never a FAIL.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.durations import parse_duration
from tests.cli_drill import run_cli_drill
from tests.patience import DRILL, within
from tests.truth.scenarios import TRUTH_BASE, Drill, Run, scenario
from tests.truth.truth import Process

# Live, each drill needs torchrun (it comes with torch; job.py itself needs no torch):
# the scenarios import it then (scenario's ``needs``), so that the quick lane can judge
# their recordings without it.
pytestmark = [pytest.mark.e2e, pytest.mark.local]

HERE = Path(__file__).resolve().parent
JOB = HERE / "job.py"
MAX_RECOVERY = "60s"  # every drill's maxRecoveryTime, unless it sets its own
TRAIN = HERE.parents[1] / "examples" / "local" / "train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
RECOVERY_TIME_TOLERANCE = 0.05
REPORTING_RANK = 0


def left_behind(mark: str) -> list[str]:
    """The processes of the drill whose job carried ``mark`` (RG_E2E_MARK) still alive
    (``pid cmdline``), each then killed: the local backend must have cleaned up, and one
    leak fails its own drill, whatever another lane's drills run meanwhile."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"RG_E2E_MARK={mark}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            os.kill(int(entry.name), 9)
        except OSError:
            continue
        found.append(f"{entry.name} {cmdline}")
    return found


def run_drill(
    tmp_path: Path,
    job_args: list[str] | None = None,
    *,
    after: str = "step-20",
    max_lost: int | None = None,
    max_restarts: int = 3,
    env: dict[str, str] | None = None,
    script: Path = JOB,
    expect: dict[str, Any] | None = None,
    inject: dict[str, Any] | None = None,
    launcher: list[str] | None = None,
) -> Drill:
    """Write a recovery-test.yaml, run `recoverygate run` on it; the job writes its truth
    into ``tmp_path`` (the :class:`Drill` reads it from there).

    ``launcher``: more torchrun options (before the script)."""
    base = tmp_path / TRUTH_BASE
    mark = uuid.uuid4().hex
    command = [
        str(TORCHRUN),
        "--standalone",
        "--nproc-per-node=2",
        f"--max-restarts={max_restarts}",
        *(launcher or []),
        str(script),
        f"--ckpt-dir={tmp_path / 'ckpt'}",
        *(job_args or []),
    ]
    # run_cli_drill holds a 1 s sustain window (DRILL_SUSTAIN): every job trains on until
    # it is ended or proves its stall within it.
    expectations: dict[str, Any] = {
        "resumeFromCheckpoint": "latest",
        "maxRecoveryTime": MAX_RECOVERY,
    }
    if max_lost is not None:
        expectations["maxLostSteps"] = max_lost
    expectations.update(expect or {})
    config = {
        "name": tmp_path.name,
        "workload": {
            "orchestrator": "local",
            "command": command,
            "workdir": str(script.parent),
            "env": {
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "RECOVERYGATE_GROUND_TRUTH": str(base),
                "RG_E2E_MARK": mark,
                **(env or {}),
            },
        },
        "injectFailure": {
            "type": "KillWorker",
            "afterCheckpoint": after,
            "targetRank": 1,
            **(inject or {}),
        },
        "expectations": expectations,
        "safety": {"requireConfirm": False},
        "timeouts": {"discovery": "60s", "checkpoint": "60s", "recovery": "90s"},
    }
    run = run_cli_drill(config, tmp_path / "recovery-test.yaml", timeout=within(DRILL))
    report, output, wall = run.report, run.output, run.wall
    left = left_behind(mark)
    assert not left, "job processes left behind:\n" + "\n".join(left)
    assert report.get("killTime") is not None, f"the drill never killed:\n{output}"
    drill = Drill(report, run.code, output, wall, tmp_path)
    log = os.environ.get("TRUTH_CORPUS_LOG")
    if log:  # one line per drill, for the README's before/after table
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        row = {
            "test": test,
            "wall": round(wall, 2),
            "verdict": report.get("verdict"),
            "summary": report.get("summary"),
            "reasons": reasons(report),
            "resumeStep": report.get("resumeStep"),
            "lostSteps": report.get("lostSteps"),
            "lostStepsUpperBound": report.get("lostStepsUpperBound"),
            "recoveryTimeSeconds": report.get("recoveryTimeSeconds"),
            "truth": drill.truth.describe(),
        }
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
    return drill


def job(*args: str, **options: Any) -> Run:
    """The drill of a scenario: :func:`run_drill` with these switches of the job (and of
    ``run_drill``)."""
    return functools.partial(run_drill, job_args=list(args), **options)


# ---------------------------------------------------------------- report, new keys first


def reasons(report: dict[str, Any]) -> list[str]:
    """``reasons`` (new engine), else the reasons of the failed checks (old engine)."""
    if "reasons" in report:
        return list(report["reasons"])
    return [c["reason"] for c in report.get("checks", []) if not c["passed"] and c["reason"]]


def inconclusive(report: dict[str, Any]) -> bool:
    if "inconclusive" in report:
        return bool(report["inconclusive"])
    return "INCONCLUSIVE" in reasons(report)


def loaded_step(report: dict[str, Any]) -> int | None:
    """``loadedStep``, else the first checkpoint_loaded of the timeline after the kill."""
    if "loadedStep" in report:
        value = report["loadedStep"]
    else:
        kill = report["killTime"]
        loads = [
            e
            for e in report.get("timeline", [])
            if e["kind"] == "checkpoint_loaded" and e["time"] > kill
        ]
        value = loads[0].get("step") if loads else None
    return None if value is None else int(value)


def judged_pid(report: dict[str, Any], processes: list[Process]) -> int | None:
    """The pid of the incarnation the drill judged.

    New engine: ``judgedIncarnation`` looked up in ``incarnations``. Old engine: the first
    new incarnation (its timeline's "new incarnation" start) that reported progress,
    matched to a rank-0 process of the truth by its progress points (same step label, time
    within 10 ms of the job's own record).
    """
    incarnations = {i["inc"]: i for i in report.get("incarnations", [])}
    inc = report.get("judgedIncarnation")
    if inc is None:
        new = {
            e["detail"].split()[-1]
            for e in report.get("timeline", [])
            if e["kind"] == "start" and e["detail"].startswith("new incarnation ")
        }
        after = [p for p in report.get("progress", []) if p["inc"] in new]
        if not after:
            return None
        inc = after[0]["inc"]
    if inc in incarnations and incarnations[inc].get("pid") is not None:
        return int(incarnations[inc]["pid"])
    points = [p for p in report.get("progress", []) if p["inc"] == inc]
    for proc in (p for p in processes if p.rank == REPORTING_RANK):
        steps = [(r.label if r.label is not None else r.step, r.t) for r in proc.steps]
        if any(
            label == p["step"] and abs(t - p["time"]) < 0.01 for p in points for label, t in steps
        ):
            return proc.pid
    return None


# ---------------------------------------------------------------- shared assertions


def assert_figures_match_truth(drill: Drill) -> None:
    """resumeStep, lost-step bounds and recovery time against the truth."""
    r, truth, why = drill.report, drill.truth, drill.explain()
    assert truth.judged is not None, f"nothing trained after the kill{why}"
    assert r["resumeStep"] == truth.resume_step, why
    assert truth.lost_steps is not None, why
    assert r["lostSteps"] is not None, why
    assert r["lostStepsUpperBound"] is not None, why
    assert r["lostSteps"] <= truth.lost_steps <= r["lostStepsUpperBound"], why
    assert truth.recovery_time is not None, why
    assert r["recoveryTimeSeconds"] is not None, why
    assert abs(r["recoveryTimeSeconds"] - truth.recovery_time) < RECOVERY_TIME_TOLERANCE, why


def assert_passes_held_to_truth(drill: Drill) -> None:
    why = drill.explain()
    assert drill.report["verdict"] == "PASS", why
    assert drill.returncode == 0, why
    assert drill.truth.replayed_steps == 0, why
    assert not drill.truth.from_scratch, why
    assert_figures_match_truth(drill)
    assert drill.report["restarts"] == drill.truth.restarts, why
    assert judged_pid(drill.report, drill.processes) == drill.truth.judged.pid, why  # type: ignore[union-attr]


def assert_fails_for(drill: Drill, reason: str) -> None:
    why = drill.explain()
    assert drill.report["verdict"] == "FAIL", why
    assert drill.returncode == 1, why
    assert reason in reasons(drill.report), why
    assert not inconclusive(drill.report), why


def assert_inconclusive(drill: Drill) -> None:
    why = drill.explain()
    assert drill.report["verdict"] == "ERROR", why
    assert drill.returncode == 3, why
    assert inconclusive(drill.report) is True, why


def assert_no_checkpoint_after_the_kill(drill: Drill) -> None:
    """Precondition of scenarios whose expectation assumes the survivor saved nothing."""
    assert drill.truth.checkpoints_after_kill == (), (
        "scenario precondition: the survivor checkpointed after the kill, so this run "
        f"does not test what it claims{drill.explain()}"
    )


# ---------------------------------------------------------------- correct jobs


@scenario(
    job(),
    live="a correct resume",
    why_live=(
        "the PASS every user wants, every figure held to the truth: the recovery time as the "
        "drill measured it on real processes"
    ),
)
def test_a_correct_resume_passes_and_every_figure_matches_the_truth(drill: Drill) -> None:
    why = drill.explain()
    assert_no_checkpoint_after_the_kill(drill)
    assert drill.truth.resume_step == drill.truth.loaded_step == 20, why
    assert drill.report["expectedResumeStep"] == drill.truth.checkpoints_before_kill[-1], why
    assert_passes_held_to_truth(drill)
    assert loaded_step(drill.report) == 20, why


@scenario(job("--loaded=no"))
def test_a_correct_resume_without_checkpoint_loaded_passes_from_progress_alone(
    drill: Drill,
) -> None:
    assert_no_checkpoint_after_the_kill(drill)
    assert drill.truth.resume_step == 20, drill.explain()
    assert_passes_held_to_truth(drill)


@scenario(
    job("--ckpt-every=20", "--step-time=0.02", script=TRAIN),
    live="the real torch example",
    why_live=(
        "torch, gloo and DDP as users run them: the survivor blocked in its allreduce, a "
        "restart that imports torch"
    ),
)
def test_the_real_torch_example_passes_held_to_its_own_records(drill: Drill) -> None:
    assert_no_checkpoint_after_the_kill(drill)
    assert drill.truth.resume_step == 20, drill.explain()
    assert_passes_held_to_truth(drill)


# ---------------------------------------------------------------- restarts from scratch


@scenario(
    job("--die-after-load=1"),
    live="from scratch",
    why_live=(
        "two restarts of real torchrun workers, one dying after its load: the group's changes"
        " as the local backend sees them, and the judged incarnation among three"
    ),
)
def test_a_replacement_that_loads_and_dies_then_one_from_scratch_fails_as_restarted_from_scratch(
    drill: Drill,
) -> None:
    truth, why = drill.truth, drill.explain()
    # The truth: restart 1 loaded step 20 and died before any step; restart 2 found the
    # folder quarantined and trained from step 1. The drill must judge restart 2.
    dead = truth.started_after_kill[0]
    assert dead.restart == 1 and dead.loaded is not None and dead.steps == (), why
    assert truth.judged is not None and truth.judged.restart == 2, why
    assert truth.from_scratch and truth.resume_step == 0, why
    assert_fails_for(drill, "RESTARTED_FROM_SCRATCH")
    assert drill.report["resumeStep"] == 0, why
    assert judged_pid(drill.report, drill.processes) == truth.judged.pid, why
    assert "judgedIncarnation" in drill.report, why


@scenario(job("--progress-every=20", "--resume=none"))
def test_sparse_progress_with_a_job_that_never_loads_fails_as_restarted_from_scratch(
    drill: Drill,
) -> None:
    # progress only every 20th step, checkpoints every 20: the first line of the restarted
    # job is step 20, itself the trigger checkpoint's step — yet it trained from step 1.
    assert drill.truth.from_scratch, drill.explain()
    assert_fails_for(drill, "RESTARTED_FROM_SCRATCH")
    assert drill.report["resumeStep"] == drill.truth.resume_step == 0, drill.explain()


@scenario(job("--zero-based", "--resume=none"))
def test_zero_based_labels_with_a_job_that_never_loads_still_fail_as_restarted_from_scratch(
    drill: Drill,
) -> None:
    assert drill.truth.from_scratch, drill.explain()
    assert_fails_for(drill, "RESTARTED_FROM_SCRATCH")
    assert drill.report["resumeStep"] == drill.truth.resume_step == 0, drill.explain()


@scenario(job("--first-ckpt-at-1", "--resume=none", after="next"))
def test_a_checkpoint_at_step_1_and_a_job_that_never_loads_fails_as_restarted_from_scratch(
    drill: Drill,
) -> None:
    # afterCheckpoint: next triggers on the checkpoint of step 1; the restarted job's first
    # step is 1 again, which equals that checkpoint — it is a fresh start, not a resume.
    why = drill.explain()
    assert drill.report["triggerCheckpoint"] == 1, why
    assert drill.truth.from_scratch, why
    assert_fails_for(drill, "RESTARTED_FROM_SCRATCH")
    assert drill.report["resumeStep"] == 0, why


@scenario(job("--first-ckpt-at-1", "--loaded=no", after="next"))
def test_a_checkpoint_at_step_1_and_a_correct_resume_passes(drill: Drill) -> None:
    why = drill.explain()
    assert drill.report["triggerCheckpoint"] == 1, why
    assert_no_checkpoint_after_the_kill(drill)
    assert drill.truth.resume_step == 1, why
    assert_passes_held_to_truth(drill)


# ---------------------------------------------------------------- replayed steps


@scenario(job("--reset-counter"))
def test_a_job_that_loads_but_counts_from_step_1_again_fails_as_steps_replayed(
    drill: Drill,
) -> None:
    truth, why = drill.truth, drill.explain()
    assert truth.loaded_step == 20 and truth.first_step == 1, why
    assert truth.replayed_steps == 20, why
    assert_fails_for(drill, "STEPS_REPLAYED")
    assert loaded_step(drill.report) == 20, why


@scenario(job("--off-by-one", "--ckpt-every=2", "--step-time=0.15", after="step-8"))
def test_an_off_by_one_epoch_resume_fails_as_steps_replayed_with_the_true_resume_step(
    drill: Drill,
) -> None:
    # Checkpoints every 2 epochs, so the true resume step (checkpoint - 1) is no
    # checkpoint; 0.15 s epochs keep the survivor from saving again before it is torn down.
    truth, why = drill.truth, drill.explain()
    assert_no_checkpoint_after_the_kill(drill)
    assert truth.loaded_step == 8 and truth.resume_step == 7, why
    assert truth.replayed_steps == 1, why
    assert truth.lost_steps is not None and truth.lost_steps >= 1, why  # the redone step
    assert_fails_for(drill, "STEPS_REPLAYED")
    assert drill.report["resumeStep"] == truth.resume_step, why
    # It reported checkpoint_loaded(8) and redid step 8: the off-by-one is named (issue 31).
    assert "off by one" in drill.report["summary"], why
    r = drill.report
    assert r["lostSteps"] is not None and r["lostStepsUpperBound"] is not None, why
    assert r["lostSteps"] <= truth.lost_steps <= r["lostStepsUpperBound"], why


# ---------------------------------------------------------------- sparse and mislabelled progress


@scenario(job("--progress-every=20", "--loaded=no", after="step-40"))
def test_sparse_progress_with_a_correct_resume_passes_with_the_right_resume_step(
    drill: Drill,
) -> None:
    # Triggered on the second checkpoint, so that two progress lines precede the kill.
    assert_no_checkpoint_after_the_kill(drill)
    assert drill.truth.resume_step == 40, drill.explain()
    assert_passes_held_to_truth(drill)


@scenario(job("--zero-based", after="step-19"))
def test_zero_based_labels_with_a_correct_resume_are_inconclusive_and_name_the_fix(
    drill: Drill,
) -> None:
    why = drill.explain()
    # The job resumed correctly (in steps completed); only its labels are off by one.
    assert drill.truth.resume_step == drill.truth.loaded_step == 20, why
    assert_inconclusive(drill)
    assert "progress(epoch + 1)" in drill.report["summary"], why


# ---------------------------------------------------------------- lost steps


@scenario(
    job("--async-lag=10", max_lost=4),
    live="async lag",
    why_live=(
        "a checkpoint durable 10 steps late, the kill right after it: the lost-step bounds "
        "from real, rate-limited progress"
    ),
)
def test_async_checkpoints_later_than_the_lost_step_limit_fail_as_lost_too_many_steps(
    drill: Drill,
) -> None:
    # The checkpoint of step 20 becomes durable at step 30: about 10 steps are lost.
    truth, why = drill.truth, drill.explain()
    assert_no_checkpoint_after_the_kill(drill)
    assert truth.resume_step == 20 and truth.lost_steps is not None and truth.lost_steps >= 10, why
    assert_fails_for(drill, "LOST_TOO_MANY_STEPS")
    assert drill.report["resumeStep"] == truth.resume_step, why
    r = drill.report
    assert r["lostSteps"] <= truth.lost_steps <= r["lostStepsUpperBound"], why
    assert r["lostSteps"] > 4, why


@scenario(job("--async-lag=10", max_lost=40))
def test_async_checkpoints_within_a_generous_lost_step_limit_pass(drill: Drill) -> None:
    truth, why = drill.truth, drill.explain()
    assert_no_checkpoint_after_the_kill(drill)
    assert truth.lost_steps is not None and truth.lost_steps >= 10, why
    assert_passes_held_to_truth(drill)
    assert drill.report["lostStepsUpperBound"] < 40, why


@scenario(
    job(
        "--step-time=0.04",
        "--ckpt-every=20",
        "--term-grace=0.4",
        max_lost=3,
        env={"RECOVERYGATE_PROGRESS_INTERVAL": "0"},
    ),
    live="survivor lines",
    why_live=(
        "torchrun's SIGTERM and the survivor's drain: lines after the kill only real "
        "processes print"
    ),
)
def test_a_survivor_printing_after_the_kill_does_not_inflate_the_lost_steps(drill: Drill) -> None:
    # Rank 0 drains for 0.4 s after torchrun's SIGTERM, printing every step
    # (RECOVERYGATE_PROGRESS_INTERVAL=0); the limit is the true loss + 2 at most.
    truth, why = drill.truth, drill.explain()
    assert_no_checkpoint_after_the_kill(drill)
    assert truth.survivor_reported_after_kill >= 5, why
    assert truth.lost_steps is not None and truth.lost_steps + 2 <= 3, why
    assert_passes_held_to_truth(drill)
    # Every step printed: the bound is tight (a step or two), not exact (README).
    assert drill.report["lostStepsUpperBound"] - drill.report["lostSteps"] <= 2, why


# ---------------------------------------------------------------- checkpoints after the kill


def assert_the_survivor_checkpoint_is_resumed_from(drill: Drill, *, printed: bool) -> None:
    """The survivor saved one checkpoint after the kill (printed or not), past step 20,
    and the replacement loaded and resumed from it, as the drill says."""
    truth, why = drill.truth, drill.explain()
    survivor = [c for c in truth.checkpoints_after_kill if c.extra.get("kind") == "survivor"]
    assert len(survivor) == 1 and survivor[0].reported is printed, why
    assert survivor[0].step > 20, why
    assert truth.loaded_step == truth.resume_step == survivor[0].step, why
    assert drill.report["resumeStep"] == survivor[0].step, why


@scenario(job("--survivor-ckpt=printed"))
def test_a_printed_survivor_checkpoint_after_the_kill_is_the_one_the_replacement_resumes_from(
    drill: Drill,
) -> None:
    assert_the_survivor_checkpoint_is_resumed_from(drill, printed=True)
    assert_passes_held_to_truth(drill)


@scenario(job("--survivor-ckpt=silent"))
def test_a_silent_survivor_checkpoint_after_the_kill_is_resumed_from_but_inconclusive(
    drill: Drill,
) -> None:
    assert_the_survivor_checkpoint_is_resumed_from(drill, printed=False)
    # never reported complete: complete or torn, the lines cannot tell (no PASS)
    why = drill.explain()
    assert drill.report["verdict"] == "ERROR" and drill.report["inconclusive"], why
    assert "never saw completed" in drill.report["summary"], why


# ---------------------------------------------------------------- jobs that end


@scenario(job("--steps=20", "--final-phase=1.0"))
def test_a_job_that_finishes_right_after_resuming_is_inconclusive(drill: Drill) -> None:
    # 20 steps, a final checkpoint at 20, then 1 s of "evaluation": the drill kills
    # rank 1 during the evaluation; the restarted job loads step 20, has nothing left
    # to train, evaluates again and exits 0.
    truth, why = drill.truth, drill.explain()
    assert truth.judged is None, why
    replacement = truth.started_after_kill[0]
    assert replacement.loaded is not None and replacement.loaded.step == 20, why
    assert replacement.exit is not None and replacement.exit.extra.get("code") == 0, why
    assert_inconclusive(drill)
    assert re.search(r"(finish|ended|exit)\w* right after resum", drill.report["summary"]), why


# ---------------------------------------------------------------- everyday patterns (second pass)
# Each pattern fooled the first engine (a false FAIL or a false PASS); see the README table.


@scenario(job("--progress-style=first-then-every", "--progress-every=10", "--loaded=no"))
def test_the_first_step_then_every_tenth_logging_idiom_passes_a_correct_resume(
    drill: Drill,
) -> None:
    assert_no_checkpoint_after_the_kill(drill)
    assert drill.truth.resume_step == 20, drill.explain()
    assert_passes_held_to_truth(drill)
    assert drill.report["stepContract"]["grid"].startswith("the first step after a start")


@scenario(job("--progress-style=first-then-every", "--progress-every=10", "--resume=none"))
def test_the_first_step_then_every_tenth_logging_idiom_fails_a_restart_from_scratch(
    drill: Drill,
) -> None:
    assert drill.truth.from_scratch, drill.explain()
    assert_fails_for(drill, "RESTARTED_FROM_SCRATCH")


@scenario(job("--progress-style=thread"))
def test_a_metrics_thread_ticking_at_the_loaded_step_is_no_replay_and_passes(drill: Drill) -> None:
    assert_no_checkpoint_after_the_kill(drill)
    assert drill.truth.resume_step == drill.truth.loaded_step == 20, drill.explain()
    assert_passes_held_to_truth(drill)


@scenario(job("--progress-style=thread", "--loaded=no"))
def test_a_metrics_thread_without_checkpoint_loaded_is_inconclusive_and_names_the_fix(
    drill: Drill,
) -> None:
    assert drill.truth.resume_step == 20, drill.explain()
    assert_inconclusive(drill)
    assert "checkpoint_loaded" in drill.report["summary"], drill.explain()


@scenario(job("--progress-style=thread", "--resume=none"))
def test_a_metrics_thread_that_restarted_from_scratch_fails_whatever_the_grid(drill: Drill) -> None:
    # Its start tick (0 completed) proves it at once: the drill may end the job before
    # the replacement's first step, so the truth is what it loaded: nothing.
    assert drill.truth.started_after_kill, drill.explain()
    assert all(p.loaded is None for p in drill.truth.started_after_kill), drill.explain()
    assert_fails_for(drill, "RESTARTED_FROM_SCRATCH")


@scenario(job("--progress-style=thread", "--thread-before-load=1.0"))
def test_a_metrics_thread_ticking_zero_while_a_slow_checkpoint_loads_is_no_restart(
    drill: Drill,
) -> None:
    # The thread starts before the resume and ticks 0 (steps completed) during the 1 s
    # load; the replacement then reports checkpoint_loaded(20) and trains on from it.
    assert_no_checkpoint_after_the_kill(drill)
    assert drill.truth.resume_step == drill.truth.loaded_step == 20, drill.explain()
    assert_passes_held_to_truth(drill)


def assert_first_tick(process: Process, *, after_a_step: bool, drill: Drill) -> None:
    """Precondition: the process's first metrics-thread tick (``report`` record) came after
    its first step (or before it), by its own records (their order in its file, which both
    threads write)."""
    events = [r.event for r in process.records]
    tick = process.records[events.index("report")]
    came_after = "step" in events and events.index("step") < events.index("report")
    assert came_after == after_a_step, (
        f"scenario precondition: pid {process.pid}'s first tick ({tick.step}) came "
        f"{'after' if came_after else 'before'} its first step, so this run does not test "
        f"what it claims{drill.explain()}"
    )


def metrics_thread_race(tmp_path: Path, job_args: list[str]) -> Drill:
    """Issue 41, item 7: the first run's metrics thread ticks after its first step (1, 6,
    11, ...), the replacement's before it (40, the state it holds, then 45, ...). A live
    drill of the lanes, not a scenario: its precondition reads the order of each process's
    records, which a recording's compacted truth does not keep."""
    pytest.importorskip("torch")
    drill = run_drill(
        tmp_path, ["--progress-style=thread", "--late-first-tick", *job_args], after="step-40"
    )
    assert_no_checkpoint_after_the_kill(drill)
    first_run = next(p for p in drill.processes if p.rank == REPORTING_RANK and p.restart == 0)
    assert_first_tick(first_run, after_a_step=True, drill=drill)
    assert drill.truth.judged is not None, drill.explain()
    assert_first_tick(drill.truth.judged, after_a_step=False, drill=drill)
    assert drill.truth.resume_step == 40, drill.explain()
    assert drill.report["stepContract"]["metricsThread"] is True, drill.explain()
    return drill


def test_a_metrics_thread_whose_first_run_ticked_after_its_first_step_is_no_replay(
    tmp_path: Path,
) -> None:
    drill = metrics_thread_race(tmp_path, [])
    assert drill.truth.loaded_step == 40, drill.explain()
    assert_passes_held_to_truth(drill)


def test_the_same_race_without_checkpoint_loaded_is_inconclusive_never_failed(
    tmp_path: Path,
) -> None:
    drill = metrics_thread_race(tmp_path, ["--loaded=no"])
    assert_inconclusive(drill)
    assert "checkpoint_loaded" in drill.report["summary"], drill.explain()


@scenario(job("--eval-after-kill", "--resume=none", "--term-grace=0.5"))
def test_an_evaluation_subprocess_the_survivor_starts_is_not_the_replacement(drill: Drill) -> None:
    # The survivor starts an evaluation that inherits RANK=0, loads checkpoint 20 and
    # reports evaluation steps; the real replacement restarted from scratch.
    # The survivor drains 0.5 s after torchrun's SIGTERM, long enough to start it.
    truth, why = drill.truth, drill.explain()
    assert truth.from_scratch, why
    assert_fails_for(drill, "RESTARTED_FROM_SCRATCH")
    assert judged_pid(drill.report, drill.processes) == truth.judged.pid, why  # type: ignore[union-attr]
    assert any(i["child"] for i in drill.report["incarnations"]), why


@scenario(job("--warmup-subprocess"))
def test_a_warm_up_subprocess_of_every_worker_is_not_the_replacement(drill: Drill) -> None:
    assert_no_checkpoint_after_the_kill(drill)
    assert drill.truth.resume_step == 20, drill.explain()
    assert_passes_held_to_truth(drill)


def an_earlier_runs_log(started: float) -> list[str]:
    """An earlier run's log lines, from ``started``: checkpoints up to 980 and a process
    that restarted from scratch in it."""
    from recoverygate import wire

    lines = [wire.format_start(started, "0123456789abcdef", pid=1, host="old", rank=0)]
    for step in range(1, 1000):
        at = started + step / 100
        lines.append(wire.format_step("progress", at, "0123456789abcdef", step, 0))
        if step % 20 == 0:
            lines.append(wire.format_step("checkpoint_completed", at, "0123456789abcdef", step, 0))
    return lines


def run_with_an_earlier_runs_log(tmp_path: Path) -> Drill:
    """The job printing an earlier run's log, an hour old, at start-up."""
    log = tmp_path / "old-run.log"
    log.write_text("".join(an_earlier_runs_log(time.time() - 3600)))
    return run_drill(tmp_path, [f"--replay-log={log}"])


@scenario(run_with_an_earlier_runs_log)
def test_an_earlier_runs_log_printed_at_start_up_does_not_move_the_verdict(drill: Drill) -> None:
    # Printed at start-up, an earlier run's log must trigger nothing and count for nothing.
    why = drill.explain()
    assert_no_checkpoint_after_the_kill(drill)
    assert drill.report["triggerCheckpoint"] == 20, why
    assert drill.report["ignoredLines"] == len(an_earlier_runs_log(0.0)), why
    assert any("were ignored" in note for note in drill.report["notes"]), why
    assert_passes_held_to_truth(drill)


def shard_loads(drill: Drill) -> dict[int, tuple[int, bool]]:
    """Each rank's shard load after the kill, from the job's records: rank -> (step, fresh)."""
    kill = drill.truth.kill_time
    loads: dict[int, tuple[int, bool]] = {}
    for proc in drill.processes:
        for r in proc.records:
            if r.event == "loaded_shard" and r.t > kill:
                loads[proc.rank] = (r.step, bool(r.extra.get("fresh")))
    return loads


@scenario(
    job("--sharded", "--digest", expect={"stateDigestMatches": True}, inject={"delay": "100ms"})
)
def test_sharded_state_every_rank_loading_its_shard_of_the_latest_checkpoint_passes(
    drill: Drill,
) -> None:
    # 100 ms after the trigger: rank 1 has saved (and reported) its own shard of 20 too.
    assert shard_loads(drill) == {0: (20, False), 1: (20, False)}, drill.explain()
    assert_passes_held_to_truth(drill)
    ranks = drill.report["ranks"]
    assert [r["rank"] for r in ranks] == [1] and ranks[0]["status"] == "ok", drill.explain()
    assert_rank_check_says_its_entries(drill)


def assert_rank_check_says_its_entries(drill: Drill) -> None:
    """all_ranks_resumed's message names the step each checked rank loaded, per its entries
    and the job's own records of each rank's load (issue 31)."""
    why = drill.explain()
    [check] = [c for c in drill.report["checks"] if c["name"] == "all_ranks_resumed"]
    loads = shard_loads(drill)
    for entry in check["observed"]:
        if entry["status"] == "ok":
            assert entry["loaded"] == loads[entry["rank"]][0], why
            assert f"rank(s) {entry['rank']} loaded step {entry['loaded']}" in check["message"], why


@scenario(job("--sharded", "--shard-older=1", after="step-60"))
def test_sharded_state_a_rank_resuming_from_an_older_shard_fails_with_the_rank_named(
    drill: Drill,
) -> None:
    loads, why = shard_loads(drill), drill.explain()
    assert loads[1] == (40, False) and loads[0][0] == 60, why
    assert_fails_for(drill, "RESUMED_FROM_OLDER_CHECKPOINT")
    assert "rank 1 loaded step 40, expected step 60" in drill.report["summary"], why


@scenario(
    job(
        "--sharded",
        "--digest",
        "--lose-shard=1",
        expect={"stateDigestMatches": True},
        inject={"delay": "100ms"},
    )
)
def test_sharded_state_a_lost_shard_reinitialised_silently_fails_on_its_digest(
    drill: Drill,
) -> None:
    loads, why = shard_loads(drill), drill.explain()
    assert loads[1] == (20, True), why  # it reported step 20, holding a fresh shard
    assert_fails_for(drill, "STATE_DIFFERS")
    assert "rank 1 loaded checkpoint 20 but its state differs" in drill.report["summary"], why


@scenario(job("--stall-after-resume=1"))
def test_a_job_that_stalls_after_one_step_of_the_resume_fails_as_soon_as_it_is_proven(
    drill: Drill,
) -> None:
    why = drill.explain()
    assert_fails_for(drill, "STOPPED_PROGRESSING")
    # Decided at the stall limit, before "never came back" (kill + maxRecoveryTime + grace).
    limit = parse_duration(MAX_RECOVERY)
    assert drill.report["finishedAt"] - drill.report["killTime"] < limit, why
    stalled = [r for p in drill.processes if p.rank == 0 for r in p.records if r.event == "stall"]
    assert stalled and stalled[0].step == drill.truth.resume_step + 1, why  # type: ignore[operator]


@scenario(job("--fork-writer", "--loaded=yes", inject={"delay": "50%"}))
def test_checkpoints_written_by_forked_writers_still_time_a_delayed_kill(drill: Drill) -> None:
    why = drill.explain()
    assert drill.report["killTime"] is not None, why
    assert_passes_held_to_truth(drill)
    delay = drill.report["recoveries"][0]["delaySeconds"]
    assert delay is not None and delay > 0.05, why  # half of a 0.4 s checkpoint interval


# ---------------------------------------------------------------- replay (issue 33)


def replay_truth(drill: Drill) -> tuple[list[int], int | None]:
    """From the job's own records: the steps both rank-0 runs did with a loss (the killed
    process's, up to the kill, and the judged replacement's), and the first that differs."""
    kill = float(drill.report["killTime"])
    judged = drill.truth.judged
    assert judged is not None, drill.explain()
    old = [p for p in drill.processes if p.rank == REPORTING_RANK and p.started <= kill]
    killed = {r.step: r.extra["loss"] for p in old for r in p.steps if "loss" in r.extra}
    redone = {r.step: r.extra["loss"] for r in judged.steps if "loss" in r.extra}
    common = sorted(set(killed) & set(redone))
    return common, next((s for s in common if killed[s] != redone[s]), None)


@scenario(
    job("--loss=kept", expect={"replay": "exact"}),
    live="a replay or reset",
    why_live=(
        "the kill waits for the steps past the checkpoint that the reporter prints "
        "unthrottled: the reporter's lines around a checkpoint, live"
    ),
)
def test_a_resume_that_restores_the_state_replays_its_losses_exactly(drill: Drill) -> None:
    assert drill.report["verdict"] == "PASS", drill.explain()
    replay = drill.report["replay"]
    common, first = replay_truth(drill)
    assert first is None
    compared = [row["step"] for row in replay["steps"]]
    assert compared, drill.explain()
    assert set(compared) <= set(common)  # every compared step, both runs did it
    assert len(compared) >= 5  # replaySteps: the kill waited for 5 steps past step 20
    assert replay["firstDivergentStep"] is None


@scenario(job("--loss=lost", expect={"replay": "exact"}))
def test_a_resume_that_loses_the_state_fails_at_the_truth_s_first_divergent_step(
    drill: Drill,
) -> None:
    assert reasons(drill.report) == ["REPLAY_DIVERGED"], drill.explain()
    _, first = replay_truth(drill)
    assert first is not None
    assert drill.report["replay"]["firstDivergentStep"] == first, drill.explain()
