"""Model unit tests and recovery drills, side by side, the way a training repo keeps them.

The first tests are ordinary unit tests of train.py's checkpointing (fast, no torchrun).
The drills at the end start the real job under torchrun, SIGKILL rank 1 and check the
recovery (about 15 s each on a small machine). Run them all with::

    pytest examples/local/test_recovery.py

or only the unit tests with ``-m "not drill"``, or the drills without the kill with
``--dry-run``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from train import (
    FEATURES,
    batch,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    training_state,
)

from pytest_recoverygate import Verdict
from pytest_recoverygate.plugin import RecoveryDrill


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)


def test_a_checkpoint_restores_the_model_exactly(tmp_path: Path) -> None:
    model, opt, sched = make_model()
    save_checkpoint(tmp_path, 40, training_state(40, model, opt, sched), "atomic")

    fresh, fresh_opt, fresh_sched = make_model()
    assert load_checkpoint(tmp_path, "latest", fresh, fresh_opt, fresh_sched) == 40
    for saved, loaded in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(saved, loaded)


def test_resume_picks_the_latest_of_the_kept_checkpoints(tmp_path: Path) -> None:
    model, opt, sched = make_model()
    for step in (20, 40, 60, 80):
        save_checkpoint(tmp_path, step, training_state(step, model, opt, sched), "atomic")

    assert [step for step, _ in list_checkpoints(tmp_path)] == [40, 60, 80]
    assert load_checkpoint(tmp_path, "latest", *make_model()) == 80


def test_a_resumed_run_sees_the_same_batches_as_an_uninterrupted_one() -> None:
    x1, y1 = batch(123, rank=1)
    x2, y2 = batch(123, rank=1)
    assert torch.equal(x1, x2)
    assert torch.equal(y1, y2)
    assert not torch.equal(batch(123, rank=0)[0], x1)


@pytest.mark.drill(config="recovery-test.yaml")
def test_training_resumes_from_its_latest_checkpoint_after_a_worker_dies(
    recovery_drill: RecoveryDrill,
) -> None:
    result = recovery_drill.run(check=True)  # FAIL or ERROR fails the test with every reason

    if result.verdict is Verdict.DRY_RUN:
        return
    assert result.resume_step == result.expected_resume_step
    assert result.recovery_time_seconds is not None
    assert result.recovery_time_seconds < 60


@pytest.mark.drill(config="recovery-test-node-local.yaml")
def test_node_local_checkpoints_are_caught_as_a_restart_from_scratch(
    recovery_drill: RecoveryDrill,
) -> None:
    result = recovery_drill.run()  # the broken twin: this drill must FAIL

    if result.verdict is Verdict.DRY_RUN:
        return
    assert result.verdict is Verdict.FAIL
    assert result.resume_step == 0
    assert "restarted from scratch" in result.summary
