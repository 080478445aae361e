"""HangWorker on Ray: a stopped Train worker is never left stopped, whatever ends the drill.

We test these aspects with the real example job (examples/ray/train_ray.py on a cluster
its driver starts; HangWorker on rank 1 with Ray's default 30-minute collective timeout,
so nothing but the drill ends the hang), the drill ended during the hang by a real SIGINT
(exit 130, after cleanup) and by an exception the backend raises (exit 3):

- the worker the drill stopped was seen stopped (state T) by a watcher of this test, then
  seen sleeping again (S: the drill's SIGCONT, cleanup's first step, let it run and block
  on its collective) before it was ended with the cluster: a process SIGKILLed while
  stopped runs only to die (R or D for a moment, then Z), never S;
- no process of the drill's cluster is left, and its RAY_TMPDIR is removed.

Each row starts a Ray cluster (about a minute on 2 cores).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.engine.model import Fault, KillOutcome, KillResult, Worker
from pytest_recoverygate.errors import DrillInterrupted
from pytest_recoverygate.orchestrators import build_orchestrator
from pytest_recoverygate.orchestrators.ray.orchestrator import RayOrchestrator
from pytest_recoverygate.registry.seams import RealClock
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.patience import DRILL, JOB, PROMPT, eventually, within

pytest.importorskip("ray", reason='the ray backend needs pip install "recoverygate[ray]"')

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ray"
HANG_HOLD = 3.0  # seconds the worker stays stopped before the drill is ended


class StateWatch(threading.Thread):
    """Polls one pid's state every 5 ms until it is gone: was it stopped, then running?"""

    def __init__(self, pid: int) -> None:
        super().__init__(name="test-state-watch", daemon=True)
        self.pid = pid
        self.stopped_at: float | None = None
        self.running_after_stop = False
        self.gone = threading.Event()

    def run(self) -> None:
        until = time.monotonic() + within(DRILL)
        while time.monotonic() < until:
            try:
                with open(f"/proc/{self.pid}/stat", encoding="utf-8") as handle:
                    state = handle.read().rsplit(")", 1)[-1].split()[0]
            except OSError:
                break
            if state in ("T", "t") and self.stopped_at is None:
                self.stopped_at = time.monotonic()
            elif state == "S" and self.stopped_at is not None:
                # Back to waiting on something: continued. (A process SIGKILLed while
                # stopped runs only to die: R or D for a moment, then Z, never S.)
                self.running_after_stop = True
            elif state in ("Z", "X"):
                break
            time.sleep(0.005)  # not a wait: the watch's sampling rate
        self.gone.set()


class EndsDuringTheHang:
    """The real RayOrchestrator; once the target has been stopped for HANG_HOLD seconds,
    the next look at the group ends the drill (``way``: a real SIGINT, or an exception)."""

    def __init__(self, real: RayOrchestrator, way: str) -> None:
        self.real, self.way = real, way
        self.name = real.name
        self.watch: StateWatch | None = None
        self.struck = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def kill(self, worker: Worker, *, dry_run: bool, fault: Fault = Fault()) -> KillResult:
        pid = int(worker.instance_id.partition(":")[2].partition("@")[0])
        self.watch = StateWatch(pid)
        self.watch.start()
        result = self.real.kill(worker, dry_run=dry_run, fault=fault)
        assert result.outcome is KillOutcome.KILLED, result
        return result

    def watch_group(self) -> list[Any]:
        stopped_at = self.watch.stopped_at if self.watch is not None else None
        if stopped_at is not None and not self.struck and time.monotonic() - stopped_at > HANG_HOLD:
            self.struck = True
            if self.way == "sigint":
                os.kill(os.getpid(), signal.SIGINT)
                eventually(lambda: False, "SIGINT's handler interrupting the drill", PROMPT)
            raise RuntimeError("injected failure while the worker is stopped")
        return self.real.watch_group()


@pytest.mark.parametrize(("way", "code"), [("sigint", 130), ("exception", 3)])
def test_a_hang_drill_ended_during_the_hang_continues_the_worker_first(
    tmp_path: Path, way: str, code: int
) -> None:
    config_data = yaml.safe_load((EXAMPLES / "recovery-test-hang-default-timeout.yaml").read_text())
    config_data["workload"]["workdir"] = str(EXAMPLES)
    mark = uuid.uuid4().hex  # the drill's cluster inherits the job's environment
    config_data["workload"]["env"] = {**config_data["workload"].get("env", {}), "RG_E2E_MARK": mark}
    path = tmp_path / "drill.yaml"
    path.write_text(yaml.safe_dump(config_data))
    config = load_config(path)
    real = build_orchestrator(config, RealClock())
    assert isinstance(real, RayOrchestrator)
    backend = EndsDuringTheHang(real, way)

    try:
        outcome = run_drill(config, RunOptions(poll_interval=0.05), orchestrator=backend).exit_code
    except DrillInterrupted:
        outcome = 130

    assert backend.struck, "the drill never got to stop the worker"
    assert outcome == code
    watch = backend.watch
    assert watch is not None
    assert watch.gone.wait(within(JOB)), f"pid {watch.pid} is still there after the drill"
    assert watch.stopped_at is not None, "the worker was never seen stopped"
    assert watch.running_after_stop, "the worker went from stopped to gone: never continued"
    leftovers = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get("RG_E2E_MARK") == mark:
                leftovers.append(p.pid)
    assert leftovers == [], f"processes of the drill's cluster left running: {leftovers}"
