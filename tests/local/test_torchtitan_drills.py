"""Real drills of torchtitan's own trainer, read from the lines it prints.

examples/local/torchtitan/ runs ``python -m torchtitan.train`` (torchtitan 0.3.0, the
llama3 debug model) under torchrun on CPU through titan_cpu.py, which changes only what
stops torchtitan on a CPU-only machine (its docstring says what). The job never calls the
reporter: the drill reads torchtitan's log lines through ``evidence: {preset:
torchtitan}``, SIGKILLs the worker a few steps after the save of step 10, and compares the
replayed steps (``replay: exact``). Each verdict is held to what the job itself wrote: the
losses it printed (the killed run's, then the replacement's, whose steps start over) and
its checkpoint folders. We test these aspects:

- the job as torchtitan ships it PASSes: it loads step-10, resumes at step 11 and prints,
  at every step it redoes, the loss the killed run printed;
- its twin with ``--checkpoint.exclude_from_loading=dataloader`` resumes at the same step
  but FAILs ``REPLAY_DIVERGED`` at the first step its own lines show a different loss;
- nothing is left behind.

Needs .venv-torchtitan (``scripts/setup --with-trainers``, which ``scripts/test`` runs).
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

EXAMPLE = ROOT / "examples" / "local" / "torchtitan"
VENV = require_venv("torchtitan")
STEP_LOSS = r"step:\s+(\d+)\s+loss:\s+(\S+)"


def test_torchtitan_as_it_ships_resumes_and_replays_its_losses(tmp_path: Path) -> None:
    run = run_example(EXAMPLE, "recovery-test.yaml", VENV, tmp_path)
    report = run.report
    assert run.code == 0, (report.get("summary"), run.output[-3000:])
    assert report["resumeStep"] == report["expectedResumeStep"] == 10
    assert report["loadedStep"] == 10  # "Loading the checkpoint from …/step-10."
    assert (tmp_path / "titan" / "out" / "checkpoint" / "step-10").is_dir()  # the job's save
    killed, replacement = printed_losses(run.job_output, STEP_LOSS)
    assert min(replacement) == 11
    replay = report["replay"]
    assert replay["mode"] == "exact"
    assert replay["stepsCompared"] >= 1, replay  # the steps between the save and the kill
    assert replay["firstDivergentStep"] is None
    assert check_against_printed(report, killed, replacement) is None


def test_its_twin_that_leaves_the_data_loader_out_fails_replay_diverged(tmp_path: Path) -> None:
    run = run_example(EXAMPLE, "recovery-test-forget-data.yaml", VENV, tmp_path)
    report = run.report
    assert run.code == 1, (report.get("summary"), run.output[-3000:])
    assert report["reasons"] == ["REPLAY_DIVERGED"], report["summary"]
    assert report["resumeStep"] == 10  # the step number shows nothing wrong
    killed, replacement = printed_losses(run.job_output, STEP_LOSS)
    assert min(replacement) == 11
    first = report["replay"]["firstDivergentStep"]
    assert first is not None
    assert first == check_against_printed(report, killed, replacement)
    assert f"replay diverged at step {first}" in report["summary"]
