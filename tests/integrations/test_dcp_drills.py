"""Real drills on a DDP job that saves with torch.distributed.checkpoint through the wrapper.

The job is tests/integrations/dcp_job.py (torchrun, 2 gloo ranks, a save every 10 steps
with ``recoverygate.integrations.dcp``, resumed with ``dcp.load`` from the newest folder
holding ``.metadata``). About 10 s per drill. We test these aspects, for ``dcp.save``
and for ``dcp.async_save`` (on its own gloo group):
- the drill PASSes, resumed from the trigger checkpoint with the saved state (the loaded
  digest equals the saved one);
- held to the files' own modification times (the ground truth, written by DCP, not by
  us): every ``checkpoint_started`` line precedes every file of its folder, and every
  ``checkpoint_completed`` line follows the folder's ``.metadata``, which DCP's
  coordinator writes last, once every rank's writes are in.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.integrations._drill import DCP_JOB, Drill, run_drill

# Skipped without torch, which is looked up, not imported: every pytest process collects
# this module (the quick lane's workers too), and only the drills' jobs use it.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.local,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
]

COARSE_CLOCK = 0.02  # file times come from the kernel's coarse clock, up to a tick behind


def assert_lines_match_the_files(drill: Drill, ckpt: Path) -> None:
    first = drill.incarnations()[0]
    completed = [e for e in drill.events("checkpoint_completed") if e["inc"] == first]
    assert completed, drill.explain()
    for event in completed:
        folder = ckpt / f"step-{event['step']:08d}"
        if not folder.exists():
            continue  # rotated away? the job keeps every folder, so this never happens
        metadata = (folder / ".metadata").stat().st_mtime
        assert event["time"] >= metadata - COARSE_CLOCK, (event, metadata)
    for event in drill.events("checkpoint_started"):
        if event["inc"] != first:
            continue
        folder = ckpt / f"step-{event['step']:08d}"
        if not folder.exists():
            continue  # the save the kill interrupted
        earliest = min(os.stat(folder / name).st_mtime for name in os.listdir(folder))
        assert event["time"] <= earliest + COARSE_CLOCK, (event, earliest)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_dcp_job_passes_and_its_lines_follow_the_files(tmp_path: Path, mode: str) -> None:
    ckpt = tmp_path / "ckpt"
    drill = run_drill(tmp_path, DCP_JOB, [f"--ckpt-dir={ckpt}", f"--mode={mode}"])
    assert drill.verdict == "PASS", drill.explain()
    assert drill.report["resumeStep"] == drill.report["expectedResumeStep"] == 20
    first = drill.incarnations()[0]
    saved = [
        e for e in drill.events("checkpoint_completed") if e["inc"] == first and e["step"] == 20
    ]
    loaded = [e for e in drill.events("checkpoint_loaded") if e["inc"] != first]
    assert saved and loaded and loaded[0]["step"] == 20, drill.explain()
    assert loaded[0]["digest"] == saved[0]["digest"], drill.explain()
    assert_lines_match_the_files(drill, ckpt)
