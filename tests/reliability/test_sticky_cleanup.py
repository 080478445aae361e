"""StickyFault scope step on every way out: the poison never outlives its drill.

We test these aspects, each with a real torchrun job (examples/local/faults/train.py)
whose rank 1 is poisoned at a step it will not reach while the test acts, so the drill
sits with its poison armed:
- the drill process gets SIGINT: it exits 130 after cleanup, and the poison file, its
  record and every process of the job are gone;
- the backend raises while the poison is armed: the drill ends in ERROR, and the same is
  gone;
- the drill process is SIGKILLed: the poison and its record stay (nothing ran its
  cleanup); ``recoverygate sweep`` removes both (the job the drill launched stays, as
  for any SIGKILLed single-node drill: docs/local.md; the test ends it).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from pytest_recoverygate import orchestrators
from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.engine.machine import Phase
from pytest_recoverygate.engine.model import GroupEvent
from pytest_recoverygate.runner import RunOptions, Status, run_drill
from pytest_recoverygate.storage.poison import ENV
from tests.patience import JOB, eventually, within
from tests.reliability.conftest import Figures

pytestmark = [pytest.mark.local, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FAULTS = ROOT / "examples" / "local" / "faults"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def poisoned_config(tmp_path: Path) -> tuple[Path, str]:
    """examples/local/faults/crash-loop-unbounded.yaml in ``tmp_path``, the poison at a
    step the job does not reach while the test acts: (the config, the job's marker)."""
    doc = yaml.safe_load((FAULTS / "crash-loop-unbounded.yaml").read_text())
    command = doc["workload"]["command"]
    command[0] = str(TORCHRUN)
    command[:] = [str(FAULTS.parent / "train.py") if c == "../train.py" else c for c in command]
    mark = uuid.uuid4().hex
    doc["workload"].update(workdir=str(tmp_path))
    doc["workload"]["env"]["RG_E2E_MARK"] = mark
    doc["injectFailure"]["atStep"] = 1_000_000
    path = tmp_path / "drill.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path, mark


def the_poison(mark: str) -> Path | None:
    """The poison file this drill's job was handed (its environment names it)."""
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if env.get("RG_E2E_MARK") == mark and ENV in env:
                return Path(env[ENV].split(":", 2)[2])
    return None


def armed(mark: str, found: list[Path]) -> bool:
    poison = the_poison(mark)
    if poison is not None and poison not in found:
        found.append(poison)
    return bool(found) and found[0].exists()


def leftovers(poison: Path, mark: str, *, job: bool = True) -> list[str]:
    """What is left of this drill: its poison file and record (and, with ``job``, a
    process of its job); each process found is killed, so a leak fails one row only."""
    found = [str(p) for p in (poison, poison.with_suffix(".lock")) if p.exists()]
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if job and proc.environ().get("RG_E2E_MARK") == mark:
                found.append(f"job {proc.pid} {' '.join(proc.info['cmdline'] or [])[:100]}")
                proc.kill()
    return found


def cli(config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(config), "--yes", "-q"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_drill_interrupted_with_its_poison_armed_removes_it(
    tmp_path: Path, figures: Figures
) -> None:
    config, mark = poisoned_config(tmp_path)
    proc = cli(config)
    found: list[Path] = []
    try:
        eventually(lambda: armed(mark, found), "the poison to be armed", JOB)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=within(JOB))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = leftovers(found[0], mark)
    figures.add("sticky_cleanup_rows")
    figures.add("sticky_leftovers", len(left))
    assert proc.returncode == 130, output[-3000:]
    assert not left, left


class Raising:
    """The real local backend, raising from ``watch_group`` once the poison is armed."""

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
            raise RuntimeError("injected failure while the poison is armed")
        events: list[GroupEvent] = self.real.watch_group()
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_an_exception_with_the_poison_armed_still_removes_it(
    tmp_path: Path, figures: Figures, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, mark = poisoned_config(tmp_path)
    config = load_config(path)
    backends: list[Raising] = []
    found: list[Path] = []

    def build(*args: Any, **kwargs: Any) -> Any:  # the drill's own, with its poison's env
        backends.append(Raising(real_build(*args, **kwargs)))
        return backends[-1]

    def observe(status: Status) -> None:
        backends[0].observe(status)
        armed(mark, found)

    real_build = orchestrators.build_orchestrator
    monkeypatch.setattr(orchestrators, "build_orchestrator", build)
    result = run_drill(config, RunOptions(confirmed=True, observer=observe, handle_signals=False))
    figures.add("sticky_cleanup_rows")
    assert backends and backends[0].raised, f"never armed: {result.verdict.value}: {result.summary}"
    assert result.exit_code == 3, result.summary
    assert "injected failure" in result.summary
    assert found, "the job was never handed its poison"
    left = leftovers(found[0], mark)
    figures.add("sticky_leftovers", len(left))
    assert not left, left


def test_a_sigkilled_drills_poison_is_removed_by_the_sweep(
    tmp_path: Path, figures: Figures
) -> None:
    config, mark = poisoned_config(tmp_path)
    proc = cli(config)
    found: list[Path] = []
    try:
        eventually(lambda: armed(mark, found), "the poison to be armed", JOB)
    finally:
        proc.kill()
        proc.communicate()
    poison = found[0]
    assert poison.exists(), "a SIGKILLed drill runs no cleanup: its poison is still armed"
    for job_proc in psutil.process_iter():  # the job a SIGKILLed drill launched stays
        with contextlib.suppress(psutil.Error):
            if job_proc.environ().get("RG_E2E_MARK") == mark:
                job_proc.kill()
    sweep = subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", "sweep"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    left = leftovers(poison, mark, job=False)
    figures.add("sticky_cleanup_rows")
    figures.add("sticky_leftovers", len(left))
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert f"poison {poison.name.split('-')[-1].split('.')[0]}" in sweep.stdout
    assert not left, (left, sweep.stdout)
