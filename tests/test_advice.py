"""Messages for jobs drilled from their own log lines say what fits them (issue 41, item 12).

We test these aspects:
- a job that printed nothing with a step is told which of its lines the drill reads (a
  preset's, or its patterns'), never to call the reporter, which it does not; a reporter
  job is still told which call to make;
- an inconclusive resume names the preset's load line, or the checkpointLoaded pattern;
  a replay without a loss asks for a loss group in the progress pattern;
- the diagnoses tell a preset job its trainer's own option (nanoGPT ``init_from``,
  torchtitan ``--checkpoint.*``, litgpt ``--resume``), never ``reporter.checkpoint_loaded``;
- a first start that failed loading a checkpoint *file* whose folder may well exist
  (nanoGPT's ``init_from='resume'`` before its first ``ckpt.pt``) is no longer said to
  lack its checkpoint folder (captured: tests/diagnosis/data/missing-checkpoint-file-load.log).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.config.schema import spec_from_config
from pytest_recoverygate.engine.advice import load_fix, loss_fix, resume_option, steps_fix
from pytest_recoverygate.engine.model import GroupEventKind
from pytest_recoverygate.engine.rules.replay import judge
from pytest_recoverygate.engine.spec import ReplaySpec
from pytest_recoverygate.engine.verdict import FailureReason, Verdict
from pytest_recoverygate.report.diagnosis import Clues, diagnose
from tests.engine_events import S, ev
from tests.test_engine_patterns import drive, engine_for
from tests.test_engine_third_pass import ended

DATA = Path(__file__).resolve().parent / "diagnosis" / "data"
PRESETS = ("nanogpt", "torchtitan", "megatron", "litgpt")


# ---------------------------------------------------------------------------- the engine


@pytest.mark.parametrize("evidence", [*PRESETS, "patterns"])
def test_a_log_line_job_with_no_step_line_is_told_which_lines_the_drill_reads(
    evidence: str,
) -> None:
    engine = engine_for(evidence=evidence)
    drive(engine, [ev(S, 0.0, "w0"), ev(S, 0.0, "w1", rank=1)])
    result = ended(engine, 30.0, GroupEventKind.JOB_SUCCEEDED, "exit 0")
    assert result.verdict is Verdict.ERROR, result.summary
    assert "printed no progress or checkpoint line with a step" in result.summary
    assert "reporter" not in result.summary.replace("with the reporter installed", "")
    assert "The drill reads the steps from" in result.summary
    if evidence == "nanogpt":
        assert "'iter N: loss …'" in result.summary


def test_a_reporter_job_is_still_told_to_call_the_reporter() -> None:
    assert steps_fix(None).startswith("Call the reporter with a step")
    assert load_fix(None) == "call reporter.checkpoint_loaded(step) after loading"


def test_a_load_is_asked_of_the_presets_line_or_the_pattern() -> None:
    assert "'Loading the checkpoint from …/step-N.'" in load_fix("torchtitan")
    assert "checkpointLoaded pattern" in load_fix("patterns")
    assert "reporter" not in load_fix("litgpt") + load_fix("patterns")


def test_a_replay_without_a_loss_asks_for_the_loss_group_of_a_log_line_job() -> None:
    old = {s: (None, None) for s in range(21, 26)}
    check, _ = judge(old, dict(old), ReplaySpec("exact"), resumed_from=20, evidence="patterns")
    assert check is not None and check.passed is None
    assert "(?P<loss>…) group in the progress pattern" in check.message
    assert "reporter.progress" not in check.message
    assert loss_fix(None).startswith("reporter.progress(step, loss=loss)")


def test_the_config_tells_the_engine_how_the_job_reports(tmp_path: Path) -> None:
    base = (
        "workload: {orchestrator: fake}\n"
        "injectFailure: {afterCheckpoint: step-20}\n"
        "expectations: {maxRecoveryTime: 60s}\n"
    )
    cases = {
        "": None,
        "evidence: {preset: litgpt}\n": "litgpt",
        "evidence: {patterns: {progress: 'it (?P<step>\\d+)'}}\n": "patterns",
    }
    for extra, evidence in cases.items():
        config = parse_config(base + extra, tmp_path / "t.yaml")
        assert spec_from_config(config).evidence == evidence, extra


# ---------------------------------------------------------------------------- diagnoses


def scratch(evidence: str | None, output: str = "") -> Clues:
    """FAIL restarted from scratch although checkpoint 100 was completed before the kill."""
    return Clues(
        output=output,
        verdict=Verdict.FAIL,
        reasons=(FailureReason.RESTARTED_FROM_SCRATCH,),
        killed=True,
        resume_step=0,
        expected_resume_step=100,
        checkpoints_before_kill=100,
        evidence=evidence,
    )


@pytest.mark.parametrize(
    ("evidence", "option"),
    [
        ("nanogpt", "init_from='resume'"),
        ("torchtitan", "--checkpoint.enable"),
        ("torchtitan", "--checkpoint.folder"),
        ("litgpt", "--resume auto"),
        ("megatron", "--load"),
    ],
)
def test_a_preset_job_restarted_from_scratch_is_told_its_trainers_own_option(
    evidence: str, option: str
) -> None:
    for output in ("", "[default0]:Initializing a new model from scratch\n"):
        (diagnosis,) = diagnose(scratch(evidence, output))
        assert diagnosis.signature == "checkpoints-not-shared"
        assert option in diagnosis.text
        assert "reporter.checkpoint_loaded" not in diagnosis.text


def test_a_reporter_job_restarted_from_scratch_is_still_told_to_report_the_load() -> None:
    (diagnosis,) = diagnose(scratch(None))
    assert "reporter.checkpoint_loaded(step)" in diagnosis.text
    assert resume_option(None) is None and resume_option("patterns") is None


def first_start(evidence: str | None = None) -> Clues:
    output = (DATA / "missing-checkpoint-file-load.log").read_text(encoding="utf-8")
    return Clues(output=output, verdict=Verdict.ERROR, evidence=evidence)


def test_a_missing_checkpoint_file_is_not_said_to_be_a_missing_folder() -> None:
    # The folder /tmp/wt41a/cap/out existed; ckpt.pt did not. It said "the checkpoint
    # folder did not exist yet" and told the job to os.makedirs it.
    (diagnosis,) = diagnose(first_start())
    assert diagnosis.signature == "missing-checkpoint-dir"
    assert "folder did not exist" not in diagnosis.text
    assert "os.makedirs" not in diagnosis.text
    assert "the checkpoint file it loads, '/tmp/wt41a/cap/out/ckpt.pt', did not exist" in (
        diagnosis.text
    )
    assert "No such file or directory: '/tmp/wt41a/cap/out/ckpt.pt'" in diagnosis.evidence


def test_nanogpt_failing_its_first_start_on_ckpt_pt_is_told_about_init_from() -> None:
    (diagnosis,) = diagnose(first_start("nanogpt"))
    assert "init_from='scratch'" in diagnosis.text
    assert "init_from='resume'" in diagnosis.text


def test_a_missing_folder_is_still_a_missing_folder() -> None:
    output = (DATA / "missing-checkpoint-dir-listdir.log").read_text(encoding="utf-8")
    (diagnosis,) = diagnose(Clues(output=output, verdict=Verdict.ERROR))
    assert "the checkpoint folder did not exist yet" in diagnosis.text
    assert "os.makedirs(folder, exist_ok=True)" in diagnosis.text
