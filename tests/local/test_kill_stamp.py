"""The local backend stamps a kill when it sends the signal (issue 41, item 7).

A drill's recovery time starts at ``KillResult.timestamp``: a stamp taken after the send
(after a wait for the victim to die, a scan, a retry) moves the start later and makes
every recovery look faster than it was. So the stamp must be the clock's last reading
before the signal leaves.

We test these aspects, on a real process (a ``sleep`` child, no torchrun) and the real
signal, with the clock's readings and the signal calls written to one log in the order
they happen: for each fault of one worker (SIGKILL, Preempt's SIGTERM, HangWorker's
SIGSTOP) the result's timestamp is the reading just before the signal, and no reading
lies between the two (a reading after the signal, or a wait before the stamp, fails).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pytest_recoverygate.engine.model import Fault, KillOutcome, Worker
from pytest_recoverygate.orchestrators.local import LocalOrchestrator
from pytest_recoverygate.orchestrators.local.processes import Identity
from pytest_recoverygate.shared.clock import RealClock
from pytest_recoverygate.shared.procs import JobLaunch

FAULTS = (
    Fault("KillWorker"),
    Fault("Preempt", grace_period=30.0),
    Fault("HangWorker"),
)


class LoggedClock(RealClock):
    """The real clock, every reading written to ``log`` as ``("now", value)``."""

    def __init__(self, log: list[tuple[str, Any]]) -> None:
        super().__init__()
        self._log = log

    def now(self) -> float:
        value = super().now()
        self._log.append(("now", value))
        return value


@pytest.fixture
def victims() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def logged_send(log: list[tuple[str, Any]], real: Callable[..., None]) -> Callable[..., None]:
    """``real`` (a signal call), its call written to ``log`` as ``("signal", signal)``."""

    def send(target: int, sig: int, *rest: Any) -> None:
        log.append(("signal", signal.Signals(sig).name))
        real(target, sig, *rest)

    return send


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.type)
def test_the_kill_is_stamped_with_the_last_reading_before_the_signal(
    fault: Fault,
    tmp_path: Path,
    victims: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[str, Any]] = []
    monkeypatch.setattr(signal, "pidfd_send_signal", logged_send(log, signal.pidfd_send_signal))
    monkeypatch.setattr(os, "kill", logged_send(log, os.kill))
    proc = subprocess.Popen(["sleep", "60"])
    victims.append(proc)
    identity = Identity.of(psutil.Process(proc.pid))
    worker = Worker(rank=1, name=f"sleep pid {proc.pid}", instance_id=identity.instance_id)
    orchestrator = LocalOrchestrator(JobLaunch(["true"], tmp_path), clock=LoggedClock(log))
    try:
        result = orchestrator.kill(worker, dry_run=False, fault=fault)
    finally:
        orchestrator.cleanup()

    assert result.outcome is KillOutcome.KILLED, result
    sent = next(i for i, (kind, _) in enumerate(log) if kind == "signal")
    readings_before = [value for kind, value in log[:sent] if kind == "now"]
    assert readings_before, f"no clock reading before the signal: {log}"
    assert result.timestamp == readings_before[-1], (
        f"{fault.type}: the kill was stamped {result.timestamp}, not at the last reading "
        f"before the signal ({readings_before[-1]}); log: {log}"
    )
