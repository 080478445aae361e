"""Torn-checkpoint drills: ``KillDuringCheckpoint`` kills the saving rank mid-save.

The engine kills the rank that reports the save after its ``checkpoint_started`` and
before its ``checkpoint_completed``; the newest checkpoint folder or file is then
partial, and the latest *complete* checkpoint is the one before it. The HF saves of step
20 park between the weights and the optimizer at the suite's barrier (tests/patience.py
``Hold``) until the kill has landed: no time window to hit (the drill's own aim, half the
measured save, is tested on a save of 3 s by tests/local/test_local_faults.py). We test
these aspects on the real frameworks (torchrun, 2 gloo ranks, CPU):
- an HF Trainer resuming from ``last_complete_checkpoint(output_dir)`` skips the torn
  ``checkpoint-N`` folder and PASSes, resumed from the checkpoint before it;
- its twin resuming from ``get_last_checkpoint`` (the newest folder, torn or not) is never
  a PASS: it crash-loops on the partial folder (FAIL), or loads the save the kill cut,
  which the drill calls inconclusive (a torn folder and a complete one reported late print
  the same lines);
- a Lightning fit resuming from ``ckpt_path="last"`` is never a false FAIL: the callback
  reports a save complete at the next hook, so a kill that lands after the write but
  before that hook finds a complete ``last.ckpt``: PASS when the kill tore the save,
  inconclusive (naming the fix) when it landed in that window.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations._drill import HF_TRAIN, LIGHTNING_TRAIN, Drill, run_drill
from tests.patience import Hold

pytestmark = [pytest.mark.e2e, pytest.mark.local]

# Lightning's save has no barrier to park at here (its writes are Lightning's own): the
# drill aims as it would for a user, and the test takes either outcome it can give.


def test_an_hf_trainer_resuming_from_the_last_complete_checkpoint_passes(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    with Hold(tmp_path, "save", 20) as hold:
        drill = run_drill(
            tmp_path,
            HF_TRAIN,
            ["--output-dir={tmpdir}/out", "--save-steps=10", "--step-time=0.05"],
            fault="KillDuringCheckpoint",
            target_rank=None,
            env=hold.env,
        )
    assert hold.killed, drill.explain()
    assert drill.verdict == "PASS", drill.explain()
    torn = torn_step(drill)
    assert drill.report["resumeStep"] == drill.report["expectedResumeStep"] == torn - 10


def test_an_hf_trainer_resuming_from_get_last_checkpoint_fails(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    with Hold(tmp_path, "save", 20) as hold:
        drill = run_drill(
            tmp_path,
            HF_TRAIN,
            ["--output-dir={tmpdir}/out", "--save-steps=10", "--step-time=0.05", "--resume=hf"],
            fault="KillDuringCheckpoint",
            target_rank=None,
            env=hold.env,
        )
    assert hold.killed, drill.explain()
    torn = torn_step(drill)
    assert drill.verdict != "PASS", drill.explain()
    if drill.verdict == "ERROR":
        assert drill.report["inconclusive"], drill.explain()
        assert drill.report["resumeStep"] == torn, drill.explain()


def test_a_lightning_fit_resuming_from_last_passes(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    drill = run_drill(
        tmp_path,
        LIGHTNING_TRAIN,
        ["--ckpt-dir={tmpdir}/ckpt", "--save-steps=10", "--step-time=0.02"],
        fault="KillDuringCheckpoint",
        target_rank=None,
    )
    torn = torn_step(drill)
    assert drill.verdict in ("PASS", "ERROR"), drill.explain()
    if drill.verdict == "PASS":
        assert drill.report["resumeStep"] == drill.report["expectedResumeStep"] == torn - 10
    else:  # loaded the complete last.ckpt its late report left looking cut
        assert drill.report["inconclusive"], drill.explain()
        assert drill.report["resumeStep"] == torn, drill.explain()
        assert "as soon as the checkpoint is durable" in drill.report["summary"]


def torn_step(drill: Drill) -> int:
    """The save the kill cut (the drill aims at the next save when one completes first)."""
    [recovery] = drill.report["recoveries"]
    details = recovery["faultDetails"]
    assert "tornStep" in details, f"the kill cut no save: {details}" + drill.explain()
    return int(details["tornStep"])
