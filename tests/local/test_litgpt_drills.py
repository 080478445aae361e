"""Real drills of litgpt's own pretraining, read from the lines it prints.

examples/local/litgpt/ runs ``litgpt pretrain`` (litgpt 0.5.13, unchanged; a small Llama
config, a tokenizer and text built locally by litgpt_assets.py) under torchrun on CPU. The
job never calls the reporter: the drill reads litgpt's lines through ``evidence: {preset:
litgpt}`` and SIGKILLs the worker once the save of step 20 is proven complete (the next
step line). Each verdict is held to what the job itself wrote: the losses it printed and
its checkpoint folders. We test these aspects:

- with ``--resume=auto`` the job PASSes: "Resuming training from …/step-00000020/…", steps
  from 21, and at every step it redoes the loss the killed run printed (``replay:
  exact``);
- with ``--resume=false`` (litgpt's default) the restarted job, which finds step 20 on disk,
  starts over at step 1: FAIL, restarted from scratch;
- nothing is left behind.

Needs .venv-litgpt (``scripts/setup --with-trainers``, which ``scripts/test`` runs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.local.shipped_trainers import (
    ROOT,
    check_against_printed,
    printed_losses,
    require_venv,
    run_example,
)

pytestmark = [pytest.mark.e2e, pytest.mark.local, pytest.mark.trainers]

EXAMPLE = ROOT / "examples" / "local" / "litgpt"
VENV = require_venv("litgpt")
STEP_LOSS = r"iter \d+ step (\d+) \| loss train: ([\d.]+)"


def test_litgpt_with_resume_auto_resumes_and_replays_its_losses(tmp_path: Path) -> None:
    run = run_example(EXAMPLE, "recovery-test.yaml", VENV, tmp_path)
    report = run.report
    assert run.code == 0, (report.get("summary"), run.output[-3000:])
    assert report["resumeStep"] == report["expectedResumeStep"] == 20
    assert report["loadedStep"] == 20  # "Resuming training from …/step-00000020/lit_model.pth"
    assert (tmp_path / "lit" / "out" / "step-00000020" / "lit_model.pth").is_file()
    assert "Resuming training from" in run.job_output
    killed, replacement = printed_losses(run.job_output, STEP_LOSS)
    assert min(replacement) == 21
    replay = report["replay"]
    assert replay["mode"] == "exact"
    assert replay["stepsCompared"] >= 1, replay  # the steps between the save and the kill
    assert replay["firstDivergentStep"] is None
    assert check_against_printed(report, killed, replacement) is None


def test_its_resume_false_twin_fails_restarted_from_scratch(tmp_path: Path) -> None:
    run = run_example(EXAMPLE, "recovery-test-no-resume.yaml", VENV, tmp_path)
    report = run.report
    assert run.code == 1, (report.get("summary"), run.output[-3000:])
    assert "RESTARTED_FROM_SCRATCH" in report["reasons"], report["summary"]
    assert report["expectedResumeStep"] == 20
    assert (tmp_path / "lit" / "out" / "step-00000020" / "lit_model.pth").is_file()
    killed, replacement = printed_losses(run.job_output, STEP_LOSS)
    assert max(killed) > 20 and min(replacement) == 1  # the job's own lines: from step 1
    assert "Resuming training from" not in run.job_output
    assert "restarted from scratch" in report["summary"]
