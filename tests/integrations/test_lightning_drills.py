"""Real drills on a Lightning job: torchrun, 2 gloo ranks (DDPStrategy) on CPU, a SIGKILL.

The job is examples/lightning/train.py (a small MLP, Adam with a per-step StepLR,
``accumulate_grad_batches=2``, ``ModelCheckpoint(every_n_train_steps=10, save_last=True)``,
resumed with ``ckpt_path="last"``). Each drill costs 15-25 s on two cores. We test these
aspects:
- with ``RecoveryGateCallback`` the drill PASSes, resumed from the trigger checkpoint
  with the saved state (the loaded digest equals the saved one, part by part);
- with no callback and ``RECOVERYGATE_AUTO=1`` the same unmodified script PASSes;
- the same script on ``import pytorch_lightning`` (the other package name, its own
  class tree) with ``RECOVERYGATE_AUTO=lightning``: the hook patches the Trainer of the
  package the script imported, with the callback of that class tree;
- broken twins FAIL as restarted from scratch: per-process checkpoint storage, and a fit
  that never passes ``ckpt_path``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.integrations._drill import LIGHTNING_TRAIN, Drill, run_drill

# Skipped without lightning, which is looked up, not imported: every pytest process
# collects this module (the quick lane's workers too), and only the drills' jobs use it.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.local,
    pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="needs lightning"),
]

ARGS = ["--ckpt-dir={tmpdir}/ckpt", "--save-steps=10", "--step-time=0.02"]


def assert_resumed_with_the_saved_state(drill: Drill, step: int) -> None:
    first = drill.incarnations()[0]
    saved = [
        e for e in drill.events("checkpoint_completed") if e["inc"] == first and e["step"] == step
    ]
    loaded = [e for e in drill.events("checkpoint_loaded") if e["inc"] != first]
    assert saved and loaded, drill.explain()
    assert loaded[0]["step"] == step
    assert set(loaded[0]["parts"]) == {"model", "optimizer", "scheduler"}
    assert loaded[0]["parts"] == saved[0]["parts"], drill.explain()


def test_a_lightning_fit_with_the_callback_passes_and_resumes_the_saved_state(
    tmp_path: Path,
) -> None:
    drill = run_drill(tmp_path, LIGHTNING_TRAIN, ARGS)
    assert drill.verdict == "PASS", drill.explain()
    assert drill.report["resumeStep"] == drill.report["expectedResumeStep"] == 20
    assert drill.report["reasons"] == []
    assert_resumed_with_the_saved_state(drill, 20)
    first = drill.incarnations()[0]
    steps = [e["step"] for e in drill.events("progress") if e["inc"] == first]
    assert steps[:2] == [1, 2]  # optimizer steps, not the 2 micro-batches of each
    assert len(steps) == len(set(steps))


def test_an_unmodified_lightning_script_with_recoverygate_auto_passes(tmp_path: Path) -> None:
    drill = run_drill(
        tmp_path, LIGHTNING_TRAIN, [*ARGS, "--no-callback"], env={"RECOVERYGATE_AUTO": "1"}
    )
    assert drill.verdict == "PASS", drill.explain()
    assert drill.report["resumeStep"] == 20
    assert_resumed_with_the_saved_state(drill, 20)


def test_the_pytorch_lightning_package_with_recoverygate_auto_passes(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    drill = run_drill(
        tmp_path,
        LIGHTNING_TRAIN,
        [*ARGS, "--no-callback", "--package=pytorch_lightning"],
        env={"RECOVERYGATE_AUTO": "lightning"},
    )
    assert drill.verdict == "PASS", drill.explain()
    assert_resumed_with_the_saved_state(drill, 20)


def test_per_process_checkpoint_storage_fails_as_a_restart_from_scratch(tmp_path: Path) -> None:
    args = ["--ckpt-dir={tmpdir}/ckpt-{pid}", "--save-steps=10", "--step-time=0.02"]
    drill = run_drill(tmp_path, LIGHTNING_TRAIN, args)
    assert drill.verdict == "FAIL", drill.explain()
    assert drill.report["reasons"][0] == "RESTARTED_FROM_SCRATCH", drill.explain()
    assert "resumed from step 0, expected step 20" in drill.report["summary"]


def test_a_fit_that_never_resumes_fails_as_a_restart_from_scratch(tmp_path: Path) -> None:
    drill = run_drill(tmp_path, LIGHTNING_TRAIN, [*ARGS, "--resume=none"])
    assert drill.verdict == "FAIL", drill.explain()
    assert drill.report["reasons"][0] == "RESTARTED_FROM_SCRATCH", drill.explain()
