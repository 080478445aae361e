"""Real drills on an HF Trainer job: torchrun, 2 gloo ranks on CPU, a SIGKILL of rank 1.

The job is examples/transformers/train.py (a 1-layer GPT-2 built from a config, random
tokens, gradient accumulation 2, a save every 10 optimizer steps). Each drill costs
15-25 s on two cores, most of it importing transformers twice per rank. We test these
aspects:
- with ``RecoveryGateCallback`` in the script the drill PASSes: resumed from the
  checkpoint of the trigger, and the job's own lines show the loaded state digest equal
  to the digest saved at that step (the callback's digests are the resume's proof);
- with no callback at all and ``RECOVERYGATE_AUTO=1`` in ``workload.env`` (an unmodified
  HF script resuming with ``get_last_checkpoint``) the drill PASSes the same way;
- broken twins FAIL as restarted from scratch: a per-process output folder, and a job
  that never resumes.
The torn-checkpoint drills are in test_torn_checkpoint_drills.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations._drill import HF_TRAIN, Drill, run_drill

pytest.importorskip("transformers")
pytestmark = [pytest.mark.e2e, pytest.mark.local]

ARGS = ["--output-dir={tmpdir}/out", "--save-steps=10", "--step-time=0.05"]


def assert_resumed_with_the_saved_state(drill: Drill, step: int) -> None:
    """The replacement's checkpoint_loaded carries the digest saved at ``step``."""
    first = drill.incarnations()[0]
    saved = [
        e for e in drill.events("checkpoint_completed") if e["inc"] == first and e["step"] == step
    ]
    loaded = [e for e in drill.events("checkpoint_loaded") if e["inc"] != first]
    assert saved and loaded, drill.explain()
    assert loaded[0]["step"] == step
    assert set(loaded[0]["parts"]) == {"model", "optimizer", "scheduler"}
    assert loaded[0]["parts"] == saved[0]["parts"], drill.explain()
    assert loaded[0]["digest"] == saved[0]["digest"]


def test_a_trainer_with_the_callback_passes_and_resumes_the_saved_state(
    tmp_path: Path,
) -> None:
    drill = run_drill(tmp_path, HF_TRAIN, ARGS)
    assert drill.verdict == "PASS", drill.explain()
    assert drill.report["resumeStep"] == drill.report["expectedResumeStep"] == 20
    assert drill.report["lostSteps"] <= 10
    assert drill.report["reasons"] == []
    assert_resumed_with_the_saved_state(drill, 20)
    # One progress line per optimizer step: never twice the same step (accumulation 2).
    first = drill.incarnations()[0]
    steps = [e["step"] for e in drill.events("progress") if e["inc"] == first]
    assert steps[:2] == [1, 2]
    assert len(steps) == len(set(steps))


def test_an_unmodified_trainer_with_recoverygate_auto_passes(tmp_path: Path) -> None:
    drill = run_drill(
        tmp_path, HF_TRAIN, [*ARGS, "--no-callback", "--resume=hf"], env={"RECOVERYGATE_AUTO": "1"}
    )
    assert drill.verdict == "PASS", drill.explain()
    assert drill.report["resumeStep"] == 20
    assert_resumed_with_the_saved_state(drill, 20)


def test_a_per_process_output_dir_fails_as_a_restart_from_scratch(tmp_path: Path) -> None:
    args = ["--output-dir={tmpdir}/out-{pid}", "--save-steps=10", "--step-time=0.05"]
    drill = run_drill(tmp_path, HF_TRAIN, args)
    assert drill.verdict == "FAIL", drill.explain()
    assert drill.report["reasons"][0] == "RESTARTED_FROM_SCRATCH", drill.explain()
    assert drill.report["resumeStep"] == 0
    assert "resumed from step 0, expected step 20" in drill.report["summary"]


def test_a_trainer_that_never_resumes_fails_as_a_restart_from_scratch(tmp_path: Path) -> None:
    drill = run_drill(
        tmp_path,
        HF_TRAIN,
        [*ARGS, "--resume=none", "--no-callback"],
        env={"RECOVERYGATE_AUTO": "1"},
    )
    assert drill.verdict == "FAIL", drill.explain()
    assert drill.report["reasons"][0] == "RESTARTED_FROM_SCRATCH", drill.explain()
