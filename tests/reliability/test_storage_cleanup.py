"""StorageFault on every way out: nothing of the fault is ever left behind.

We test these aspects, each with a real torchrun job (examples/local/storage/) held by a
stalled storage layer over its checkpoint folder, the hardest state to leave (the job's
rank 0 is blocked inside the layer, rank 1 behind it at a barrier):
- the drill process gets SIGINT or SIGTERM: it exits 130 after cleanup, and the mount,
  the layer's process, the owner record and every process of the job are gone;
- the backend raises while the fault holds: the drill ends in ERROR, and the same is gone;
- the drill process is SIGKILLed: its layer notices (its command pipe closes), lifts the
  fault and unmounts by itself; ``recoverygate sweep`` removes the record it left (the
  job the drill launched stays, as for any SIGKILLed single-node drill: docs/local.md).
The layer's own ways out (its process killed with the drill's; a running drill's layer
left alone by the sweep) are tests/storage/test_storage_layer.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.engine.machine import Phase
from pytest_recoverygate.engine.model import GroupEvent
from pytest_recoverygate.orchestrators import build_orchestrator
from pytest_recoverygate.registry.seams import RealClock
from pytest_recoverygate.runner import RunOptions, Status, run_drill
from pytest_recoverygate.shared.lock import lock_dir
from pytest_recoverygate.storage.layer import RECORD_PREFIX, our_mounts
from tests.patience import JOB, eventually, within
from tests.reliability.conftest import Figures

pytestmark = [
    pytest.mark.local,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a FUSE layer needs root"),
]

ROOT = Path(__file__).resolve().parents[2]
STORAGE = ROOT / "examples" / "local" / "storage"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def stalled_config(tmp_path: Path) -> tuple[Path, Path, str]:
    """examples/local/storage/stall-barrier.yaml in ``tmp_path``, with a maxStall no row
    waits for: (the config, the checkpoint folder, the job's marker)."""
    doc = yaml.safe_load((STORAGE / "stall-barrier.yaml").read_text())
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    command = doc["workload"]["command"]
    command[0] = str(TORCHRUN)
    command[:] = [str(STORAGE / c) if c == "train_storage.py" else c for c in command]
    command[:] = [f"--ckpt-dir={folder}" if c.startswith("--ckpt-dir=") else c for c in command]
    mark = uuid.uuid4().hex
    doc["workload"].update(workdir=str(tmp_path))
    doc["workload"]["env"].update(
        RECOVERYGATE_GROUND_TRUTH=str(tmp_path / "truth"), RG_E2E_MARK=mark
    )
    doc["injectFailure"]["path"] = str(folder)
    doc["expectations"]["maxStall"] = "10m"
    path = tmp_path / "drill.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path, folder, mark


def recorded(tmp_path: Path, rank: int, event: str, step: int) -> bool:
    """The job's own records: ``rank`` recorded ``event`` at ``step``."""
    for path in tmp_path.glob(f"truth.{rank}.*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["event"] == event and row["step"] == step:
                return True
    return False


def held(tmp_path: Path) -> bool:
    """The job's own records: rank 0 began the save of step 60, which the stall (armed at
    checkpoint 40) holds, and rank 1 trained step 60, its last before the barrier that
    waits for that save."""
    return recorded(tmp_path, 0, "save_started", 60) and recorded(tmp_path, 1, "step", 60)


def leftovers(folder: Path, mark: str, *, job: bool = True) -> list[str]:
    """What is left of this drill: its mount, layer, record (and, with ``job``, a process
    of its job); each process found is killed, so a leak fails one row only."""
    mine = str(folder.resolve())
    found = [f"mount {t} ({s})" for t, s in our_mounts() if t == mine]
    for record in lock_dir().glob(f"{RECORD_PREFIX}*.json"):
        try:
            if json.loads(record.read_text()).get("folder") == mine:
                found.append(f"record {record}")
        except (OSError, ValueError):
            continue
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if "pytest_recoverygate.storage.fs" in cmdline and mine in cmdline:
                found.append(f"layer {proc.pid}")
                proc.kill()
            elif job and proc.environ().get("RG_E2E_MARK") == mark:
                found.append(f"job {proc.pid} {proc.status()} {cmdline[:100]}")
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_drill_signalled_while_its_storage_stalls_leaves_nothing(
    tmp_path: Path, sig: signal.Signals, figures: Figures
) -> None:
    config, folder, mark = stalled_config(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(config), "--yes", "-q"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        eventually(lambda: held(tmp_path), "the save the stall holds", JOB)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=within(JOB))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = leftovers(folder, mark)
    figures.add("storage_cleanup_rows")
    figures.add("storage_leftovers", len(left))
    assert proc.returncode == 130, output[-3000:]
    assert not left, left


class Raising:
    """The real local backend, raising from ``watch_group`` once the fault holds."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.name = real.name
        self.phase = Phase.DISCOVERING
        self.raised = False

    def observe(self, status: Status) -> None:
        self.phase = status.phase

    def watch_group(self) -> list[GroupEvent]:
        if self.phase is Phase.FAULTED and not self.raised:
            self.raised = True
            raise RuntimeError("injected failure while the storage is faulted")
        events: list[GroupEvent] = self.real.watch_group()
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_an_exception_while_the_fault_holds_still_lifts_and_unmounts(
    tmp_path: Path, figures: Figures
) -> None:
    path, folder, mark = stalled_config(tmp_path)
    config = load_config(path)
    backend = Raising(build_orchestrator(config, RealClock()))
    result = run_drill(
        config,
        RunOptions(confirmed=True, observer=backend.observe, handle_signals=False),
        orchestrator=backend,
    )
    left = leftovers(folder, mark)
    figures.add("storage_cleanup_rows")
    figures.add("storage_leftovers", len(left))
    assert backend.raised, f"the fault never held ({result.verdict.value}: {result.summary})"
    assert result.exit_code == 3, result.summary
    assert "injected failure" in result.summary
    assert not left, left


def test_a_sigkilled_drills_layer_unmounts_by_itself_and_the_sweep_removes_its_record(
    tmp_path: Path, figures: Figures
) -> None:
    config, folder, mark = stalled_config(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(config), "--yes", "-q"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually(lambda: held(tmp_path), "the save the stall holds", JOB)
    finally:
        proc.kill()
        proc.wait()
    mine = str(folder.resolve())
    eventually(lambda: not any(t == mine for t, _ in our_mounts()), "the layer to unmount")
    # The job a SIGKILLed drill launched stays (docs/local.md): end it here. The layer
    # serves its detached mount until the job's last open file in it is closed, then ends.
    for job_proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if job_proc.environ().get("RG_E2E_MARK") == mark:
                job_proc.kill()

    def layer_gone() -> bool:
        return not any(
            "pytest_recoverygate.storage.fs" in " ".join(p.info["cmdline"] or [])
            and mine in " ".join(p.info["cmdline"] or [])
            for p in psutil.process_iter(["cmdline"])
        )

    eventually(layer_gone, "the layer to end with the job's last open file")
    sweep = subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", "sweep"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    left = leftovers(folder, mark, job=False)
    figures.add("storage_cleanup_rows")
    figures.add("storage_leftovers", len(left))
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert not left, (left, sweep.stdout)
