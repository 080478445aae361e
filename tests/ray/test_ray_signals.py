"""The Ray backend's signals to one worker, on real processes of this machine (no Ray).

We test these aspects of :func:`helper.signal_here` (the body of the kill task on a
worker's node) and :class:`signals.WorkerSignals` (what the drill owes the job):

- a signal reaches exactly the process of that pid *and* start time: a pid whose start
  ticks differ, or (ticks unknown) that is no Ray worker, is not touched;
- the answer carries the ticks seen, the identity a later signal uses;
- a HangWorker stop is remembered before it is sent, so ``continue_all`` continues it
  even when the answer was lost, and names what it could not continue;
- a Preempt's SIGKILL reaches the instance that ignored SIGTERM after the grace period,
  and is not sent when the drill ends first.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from pytest_recoverygate.errors import BackendError
from pytest_recoverygate.orchestrators.ray.helper import process_ticks, signal_here
from pytest_recoverygate.orchestrators.ray.signals import Target, WorkerSignals

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", IGNORES_TERM])
    time.sleep(0.2)  # its handler is in place
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def state(proc: subprocess.Popen[bytes]) -> str:
    return str(psutil.Process(proc.pid).status())


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def target_of(proc: subprocess.Popen[bytes], ticks: str | None = None) -> Target:
    return Target("node-1", proc.pid, ticks or process_ticks(proc.pid) or "-", local=False)


def test_a_signal_reaches_that_pid_and_start_time_and_says_its_ticks(
    victim: subprocess.Popen[bytes],
) -> None:
    ticks = process_ticks(victim.pid)

    answer = signal_here(victim.pid, str(ticks), "STOP")

    assert answer["outcome"] == "killed"
    assert answer["ticks"] == ticks
    assert wait_for(lambda: state(victim) == psutil.STATUS_STOPPED)
    assert signal_here(victim.pid, str(ticks), "CONT")["outcome"] == "killed"
    assert wait_for(lambda: state(victim) != psutil.STATUS_STOPPED)


def test_another_process_on_that_pid_is_not_touched(victim: subprocess.Popen[bytes]) -> None:
    answer = signal_here(victim.pid, "1", "KILL")  # started at another tick: not it

    assert answer["outcome"] == "already_gone"
    assert "another process now" in answer["detail"]
    assert victim.poll() is None


def test_without_ticks_only_a_ray_worker_is_signalled(victim: subprocess.Popen[bytes]) -> None:
    answer = signal_here(victim.pid, "-", "KILL")

    assert answer["outcome"] == "already_gone"
    assert "no Ray worker" in answer["detail"]
    assert victim.poll() is None


def test_a_pid_that_is_gone_is_said_so() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)

    assert signal_here(proc.pid, "-", "KILL")["outcome"] == "already_gone"


def test_a_stop_whose_answer_was_lost_is_still_continued_at_cleanup(
    victim: subprocess.Popen[bytes],
) -> None:
    def lost(target: Target, sig: str) -> dict[str, Any]:
        answer = signal_here(target.pid, target.ticks, sig)  # it lands on the node...
        if sig == "STOP":
            raise BackendError("the kill server gave no answer within 90s")  # ...unanswered
        return answer

    signals = WorkerSignals(lost)
    with pytest.raises(BackendError):
        signals.stop(target_of(victim))
    assert wait_for(lambda: state(victim) == psutil.STATUS_STOPPED)

    assert signals.continue_all() == []
    assert wait_for(lambda: state(victim) != psutil.STATUS_STOPPED)
    assert signals.continue_all() == []  # once: nothing is owed any more


def test_a_worker_that_cannot_be_continued_is_named_with_the_command(
    victim: subprocess.Popen[bytes],
) -> None:
    def cluster(target: Target, sig: str) -> dict[str, Any]:
        if sig == "CONT":
            raise BackendError("no node answers")
        return signal_here(target.pid, target.ticks, sig)

    signals = WorkerSignals(cluster)
    assert signals.stop(target_of(victim))["outcome"] == "killed"

    stuck = signals.continue_all()

    assert len(stuck) == 1
    assert f"kill -CONT {victim.pid}" in stuck[0]
    assert "no node answers" in stuck[0]
    victim.send_signal(signal.SIGCONT)


def test_a_stop_that_never_landed_is_not_owed(victim: subprocess.Popen[bytes]) -> None:
    signals = WorkerSignals(lambda t, sig: signal_here(t.pid, t.ticks, sig))

    answer = signals.stop(target_of(victim, ticks="1"))  # another process: not touched

    assert answer["outcome"] == "already_gone"
    sent: list[str] = []
    signals._send = lambda t, sig: sent.append(sig) or {}  # type: ignore[func-returns-value]
    assert signals.continue_all() == []
    assert sent == []


def test_preempt_sigkills_the_instance_that_ignored_sigterm_after_the_grace_period(
    victim: subprocess.Popen[bytes],
) -> None:
    signals = WorkerSignals(lambda t, sig: signal_here(t.pid, t.ticks, sig))
    target = target_of(victim)
    assert signals.send(target, "TERM")["outcome"] == "killed"

    signals.escalate_later(target, 0.5)

    time.sleep(0.2)
    assert victim.poll() is None  # still in its grace period
    assert victim.wait(timeout=10) == -signal.SIGKILL
    signals.close()
    assert signals.escalations == [f"SIGKILL sent to pid {victim.pid} on node node-1 after 0.5s"]


def test_no_sigkill_when_the_drill_ends_within_the_grace_period(
    victim: subprocess.Popen[bytes],
) -> None:
    signals = WorkerSignals(lambda t, sig: signal_here(t.pid, t.ticks, sig))
    signals.escalate_later(target_of(victim), 30.0)

    signals.close()

    assert victim.poll() is None
    assert signals.escalations == ["SIGKILL not sent: the drill ended within the grace period"]
