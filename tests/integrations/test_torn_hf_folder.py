"""An HF save torn by a real SIGKILL, without the drill: what the restart finds and does.

The drill's own torn-checkpoint fault is tested in test_torn_checkpoint_drills.py; this
module tears a save by hand, so that the resume-side helpers are proven on a real torn
folder whatever the drill side can do. The test starts examples/transformers/train.py
under torchrun (2 ranks, ``--max-restarts=1``, ``RECOVERYGATE_RANKS=all``), with the save
of step 20 parked between the weights and the optimizer at the suite's barrier
(tests/patience.py ``Hold``: the ``checkpoint-20`` folder is torn for as long as it takes,
however loaded the machine), SIGKILLs rank 0 there, releases the hold and lets torchrun
restart the group. We test these
aspects:
- no rank reported checkpoint 20 completed (rank 1 waits at the callback's barrier for a
  rank that died), and the torn folder carries no marker;
- resuming from ``last_complete_checkpoint`` skips the torn folder: the restart loads
  step 10 and trains to the end;
- resuming from ``get_last_checkpoint`` picks the torn folder and the restart fails
  without training a step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
from recoverygate.integrations._common import MARKER_NAME

from tests.integrations._drill import HF_TRAIN, SENTINEL, TORCHRUN
from tests.patience import CLUSTER, JOB, PROMPT, Hold, eventually, within

pytest.importorskip("transformers")
pytestmark = [pytest.mark.e2e, pytest.mark.local]


def tear_the_save_of_step_20(
    tmp_path: Path, resume: str
) -> tuple[list[dict[str, Any]], int, str, bool]:
    import json

    out = tmp_path / "out"
    hold = Hold(tmp_path, "save", 20).arm()
    env = {
        **os.environ,
        **hold.env,
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "HF_HUB_OFFLINE": "1",
        "RECOVERYGATE_PROGRESS_INTERVAL": "0",
        "RECOVERYGATE_RANKS": "all",
    }
    env.pop("RECOVERYGATE_AUTO", None)
    proc = subprocess.Popen(
        [
            str(TORCHRUN),
            "--standalone",
            "--nproc-per-node=2",
            "--max-restarts=1",
            str(HF_TRAIN),
            f"--output-dir={out}",
            "--save-steps=10",
            "--step-time=0.05",
            "--max-steps=24",
            f"--resume={resume}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdout is not None
    events: list[dict[str, Any]] = []
    text: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            text.append(line)
            at = line.find(SENTINEL)
            if at >= 0:
                event = json.loads(line[at + len(SENTINEL) :])
                events.append(event)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:

        def rank0_parked() -> list[psutil.Process]:
            found = []
            for pid in hold.parked():
                with contextlib.suppress(psutil.Error):
                    if (child := psutil.Process(pid)).environ().get("RANK") == "0":
                        found.append(child)
            return found

        def gone(process: psutil.Process) -> bool:
            try:
                return process.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        (rank0,) = eventually(rank0_parked, "rank 0 parked in the save of 20", JOB)
        folder = out / "checkpoint-20"
        assert folder.exists(), "the weights are written before the hold"
        rank0.send_signal(signal.SIGKILL)
        eventually(lambda: gone(rank0), "rank 0 gone")
        unmarked = folder.exists() and not (folder / MARKER_NAME).exists()
        hold.release()
        try:
            proc.wait(timeout=within(CLUSTER))
        except subprocess.TimeoutExpired:
            raise AssertionError(
                "torchrun did not end within its budget after the kill; its last lines:\n"
                + "".join(text[-60:])
            ) from None
    finally:
        hold.release()
        if proc.poll() is None:
            # torchrun starts each worker in a session of its own: its group is not enough
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        child.kill()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(within(PROMPT))
        proc.stdout.close()  # on every way out: a failed wait must not leak the pipe too
    return events, proc.returncode, "".join(text), unmarked


def incarnation_events(events: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """The events of the ``index``-th rank-0 incarnation."""
    incs: list[str] = []
    for e in events:
        if e.get("rank") == 0 and e["inc"] not in incs:
            incs.append(e["inc"])
    return [e for e in events if e["inc"] == incs[index]] if index < len(incs) else []


def test_a_torn_folder_is_skipped_by_last_complete_checkpoint(tmp_path: Path) -> None:
    events, code, output, unmarked = tear_the_save_of_step_20(tmp_path, "complete")
    completed_20 = [
        e
        for e in incarnation_events(events, 1)
        if e["event"] == "checkpoint_completed" and e["step"] == 20
    ]
    before = incarnation_events(events, 0)
    assert not [e for e in before if e["event"] == "checkpoint_completed" and e["step"] == 20]
    assert unmarked, "the kill found checkpoint-20 already complete: no torn folder"
    # rank 1 reached on_save but waited at the barrier: it never reported step 20 either
    rank1_first = [e for e in events if e.get("rank") == 1][:1]
    assert rank1_first
    rank1 = [e for e in events if e["inc"] == rank1_first[0]["inc"]]
    rank1_completed = [e["step"] for e in rank1 if e["event"] == "checkpoint_completed"]
    assert rank1_completed == [10]  # selected by RECOVERYGATE_RANKS, it reports; not 20
    after = incarnation_events(events, 1)
    loaded = [e["step"] for e in after if e["event"] == "checkpoint_loaded"]
    assert loaded == [10], output[-3000:]
    assert next(e["step"] for e in after if e["event"] == "progress") == 11
    assert code == 0, output[-3000:]
    assert completed_20, "the restart saved step 20 again"


def test_a_torn_folder_breaks_a_resume_from_get_last_checkpoint(tmp_path: Path) -> None:
    events, code, output, unmarked = tear_the_save_of_step_20(tmp_path, "hf")
    assert unmarked, "the kill found checkpoint-20 already complete: no torn folder"
    after = incarnation_events(events, 1)
    assert [e for e in after if e["event"] == "progress"] == [], output[-3000:]
    assert code != 0
    assert "checkpoint-20" in output
