"""The Ray backend's signals to one worker, on real processes of this machine (no Ray).

We test these aspects of :func:`helper.signal_here` (the body of the kill task on a
worker's node) and :class:`signals.WorkerSignals` (what the drill owes the job):

- a signal reaches exactly the process of that pid *and* start time: a pid whose start
  ticks differ is not touched;
- issue 41 (a forged Train state): whatever pid the state names, only a child of the
  node's raylet titled ``ray::RayTrainWorker…`` (with the drill's marker, in a cluster
  the drill started) is signalled; a ``sleep`` named with its own true start ticks, a
  worker-titled process the raylet did not start, a look-alike title and a worker
  without the marker are refused, and never signalled;
- the answer carries the ticks seen, the identity a later signal uses;
- a HangWorker stop is remembered before it is sent, so ``continue_all`` continues it
  even when the answer was lost, and names what it could not continue;
- a Preempt's SIGKILL reaches the instance that ignored SIGTERM after the grace period,
  and is not sent when the drill ends first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pytest_recoverygate.errors import BackendError
from pytest_recoverygate.orchestrators.ray.helper import WORKER_TITLE, process_ticks, signal_here
from pytest_recoverygate.orchestrators.ray.signals import Target, WorkerSignals
from tests.patience import PROCESS, PROMPT, eventually, stays, within

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
#: This test process plays the node's raylet: the parent of every worker it starts.
RAYLET = os.getpid()


def as_worker(command: list[str], title: str = WORKER_TITLE) -> subprocess.Popen[bytes]:
    """``command`` as a child of this process, titled as Ray titles a Train worker."""
    return subprocess.Popen(["bash", "-c", f'exec -a "{title}" "$@"', "bash", *command])


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    proc = as_worker([sys.executable, "-c", IGNORES_TERM])
    eventually(lambda: ignores_sigterm(proc.pid), "the victim ignoring SIGTERM", PROMPT)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=within(PROMPT))


def state(proc: subprocess.Popen[bytes]) -> str:
    return str(psutil.Process(proc.pid).status())


def ignores_sigterm(pid: int) -> bool:
    """The kernel's own record (``SigIgn`` in /proc/PID/status): SIGTERM is ignored."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def target_of(proc: subprocess.Popen[bytes], ticks: str | None = None) -> Target:
    return Target("node-1", proc.pid, ticks or process_ticks(proc.pid) or "-", local=False)


def here(target: Target, sig: str) -> dict[str, Any]:
    """The node's task, run here: this process is the node's raylet."""
    return signal_here(target.pid, target.ticks, sig, raylet=RAYLET, marker=target.marker)


def test_a_signal_reaches_that_pid_and_start_time_and_says_its_ticks(
    victim: subprocess.Popen[bytes],
) -> None:
    ticks = process_ticks(victim.pid)

    answer = signal_here(victim.pid, str(ticks), "STOP", raylet=RAYLET)

    assert answer["outcome"] == "killed"
    assert answer["ticks"] == ticks
    eventually(lambda: state(victim) == psutil.STATUS_STOPPED, "the victim stopped", PROMPT)
    assert signal_here(victim.pid, str(ticks), "CONT", raylet=RAYLET)["outcome"] == "killed"
    eventually(lambda: state(victim) != psutil.STATUS_STOPPED, "the victim continued", PROMPT)


def test_another_process_on_that_pid_is_not_touched(victim: subprocess.Popen[bytes]) -> None:
    answer = signal_here(victim.pid, "1", "KILL", raylet=RAYLET)  # another start tick: not it

    assert answer["outcome"] == "already_gone"
    assert "another process now" in answer["detail"]
    assert victim.poll() is None


def test_without_ticks_a_train_worker_of_the_raylet_is_still_signalled(
    victim: subprocess.Popen[bytes],
) -> None:
    answer = signal_here(victim.pid, "-", "STOP", raylet=RAYLET)

    assert answer["outcome"] == "killed", answer
    assert answer["ticks"] == process_ticks(victim.pid)
    eventually(lambda: state(victim) == psutil.STATUS_STOPPED, "the victim stopped", PROMPT)
    assert (
        signal_here(victim.pid, str(answer["ticks"]), "CONT", raylet=RAYLET)["outcome"] == "killed"
    )


def test_a_pid_that_is_gone_is_said_so() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=within(PROCESS))

    assert signal_here(proc.pid, "-", "KILL", raylet=RAYLET)["outcome"] == "already_gone"


def test_a_stop_whose_answer_was_lost_is_still_continued_at_cleanup(
    victim: subprocess.Popen[bytes],
) -> None:
    def lost(target: Target, sig: str) -> dict[str, Any]:
        answer = here(target, sig)  # it lands on the node...
        if sig == "STOP":
            raise BackendError("the kill server gave no answer within 90s")  # ...unanswered
        return answer

    signals = WorkerSignals(lost)
    with pytest.raises(BackendError):
        signals.stop(target_of(victim))
    eventually(lambda: state(victim) == psutil.STATUS_STOPPED, "the victim stopped", PROMPT)

    assert signals.continue_all() == []
    eventually(lambda: state(victim) != psutil.STATUS_STOPPED, "the victim continued", PROMPT)
    assert signals.continue_all() == []  # once: nothing is owed any more


def test_a_worker_that_cannot_be_continued_is_named_with_the_command(
    victim: subprocess.Popen[bytes],
) -> None:
    def cluster(target: Target, sig: str) -> dict[str, Any]:
        if sig == "CONT":
            raise BackendError("no node answers")
        return here(target, sig)

    signals = WorkerSignals(cluster)
    assert signals.stop(target_of(victim))["outcome"] == "killed"

    stuck = signals.continue_all()

    assert len(stuck) == 1
    assert f"kill -CONT {victim.pid}" in stuck[0]
    assert "no node answers" in stuck[0]
    victim.send_signal(signal.SIGCONT)


def test_a_stop_that_never_landed_is_not_owed(victim: subprocess.Popen[bytes]) -> None:
    signals = WorkerSignals(here)

    answer = signals.stop(target_of(victim, ticks="1"))  # another process: not touched

    assert answer["outcome"] == "already_gone"
    sent: list[str] = []
    signals._send = lambda t, sig: sent.append(sig) or {}  # type: ignore[func-returns-value]
    assert signals.continue_all() == []
    assert sent == []


def test_preempt_sigkills_the_instance_that_ignored_sigterm_after_the_grace_period(
    victim: subprocess.Popen[bytes],
) -> None:
    signals = WorkerSignals(here)
    target = target_of(victim)
    assert signals.send(target, "TERM")["outcome"] == "killed"

    grace, started = 0.5, time.monotonic()
    signals.escalate_later(target, grace)

    assert victim.wait(timeout=within(PROMPT)) == -signal.SIGKILL
    assert time.monotonic() - started >= grace  # not before the grace period ended
    signals.close()
    assert signals.escalations == [f"SIGKILL sent to pid {victim.pid} on node node-1 after 0.5s"]


def test_no_sigkill_when_the_drill_ends_within_the_grace_period(
    victim: subprocess.Popen[bytes],
) -> None:
    signals = WorkerSignals(here)
    signals.escalate_later(target_of(victim), 30.0)

    signals.close()

    assert victim.poll() is None
    assert signals.escalations == ["SIGKILL not sent: the drill ended within the grace period"]


# ---------------------------------------------------------------------------- issue 41


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """Any process of the machine that a forged Train state could name."""
    proc = subprocess.Popen(["sleep", "60"])
    comm = Path(f"/proc/{proc.pid}/comm")
    eventually(lambda: comm.read_text().strip() == "sleep", "the sleep", PROMPT)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=within(PROMPT))


@pytest.mark.parametrize("sig", ["KILL", "TERM", "STOP", "CONT"])
def test_a_sleep_named_with_its_own_start_ticks_is_never_signalled(
    sleeper: subprocess.Popen[bytes], sig: str
) -> None:
    """The forged state of issue 41: a ``sleep`` named as rank 1's pid, its start ticks
    read from the sleep itself (the identity check the drill used to make); it was
    SIGKILLed "by the drill"."""
    ticks = process_ticks(sleeper.pid)
    assert ticks is not None

    for given in (ticks, "-"):
        answer = signal_here(sleeper.pid, given, sig, raylet=RAYLET)
        assert answer["outcome"] == "refused", answer
        assert "no Train worker" in answer["detail"]

    untouched = "the sleep runs, not stopped"
    stays(lambda: sleeper.poll() is None and state(sleeper) != psutil.STATUS_STOPPED, untouched)


def test_a_process_the_raylet_did_not_start_is_refused_whatever_its_title() -> None:
    """A job may title any process ``ray::RayTrainWorker`` (another tenant's worker looks
    the same); only the node's raylet's own children are Ray worker processes."""
    code = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(60)"
    worker_title = ["bash", "-c", f'exec -a "{WORKER_TITLE}" sleep 60']
    parent = subprocess.Popen([sys.executable, "-c", code, *worker_title])
    try:
        eventually(lambda: psutil.Process(parent.pid).children(), "the child", PROMPT)
        [grandchild] = psutil.Process(parent.pid).children()
        eventually(lambda: grandchild.cmdline()[:1] == [WORKER_TITLE], "the title", PROMPT)
        ticks = process_ticks(grandchild.pid)
        assert ticks is not None

        answer = signal_here(grandchild.pid, ticks, "KILL", raylet=RAYLET)

        assert answer["outcome"] == "refused", answer
        assert f"its parent is pid {parent.pid}, not the node's raylet" in answer["detail"]
        assert grandchild.is_running()
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait(timeout=within(PROMPT))


def test_a_look_alike_title_is_refused() -> None:
    proc = as_worker(["sleep", "60"], title="ray::RayTrainWorkerX")
    try:
        title = ["ray::RayTrainWorkerX"]
        eventually(lambda: psutil.Process(proc.pid).cmdline()[:1] == title, "the title", PROMPT)

        answer = signal_here(proc.pid, "-", "KILL", raylet=RAYLET)

        assert answer["outcome"] == "refused", answer
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=within(PROMPT))


def test_in_a_cluster_the_drill_started_a_worker_without_its_marker_is_refused() -> None:
    """Every process of a cluster the drill started inherits the drill's marker; a worker
    of another cluster on the same machine does not carry it."""
    marker = ("RECOVERYGATE_DRILL_ID", "0123456789abcdef")
    plain = as_worker(["sleep", "60"])
    marked = subprocess.Popen(
        ["bash", "-c", f'exec -a "{WORKER_TITLE}" sleep 60'],
        env={**os.environ, marker[0]: marker[1]},
    )
    try:
        eventually(
            lambda: psutil.Process(plain.pid).cmdline()[:1] == [WORKER_TITLE], "a title", PROMPT
        )
        eventually(
            lambda: psutil.Process(marked.pid).cmdline()[:1] == [WORKER_TITLE], "a title", PROMPT
        )

        refused = signal_here(plain.pid, "-", "KILL", raylet=RAYLET, marker=marker)
        signalled = signal_here(marked.pid, "-", "KILL", raylet=RAYLET, marker=marker)

        assert refused["outcome"] == "refused", refused
        assert "does not carry this drill's RECOVERYGATE_DRILL_ID" in refused["detail"]
        assert plain.poll() is None
        assert signalled["outcome"] == "killed", signalled
        assert marked.wait(timeout=within(PROMPT)) == -signal.SIGKILL
    finally:
        for proc in (plain, marked):
            proc.kill()
            proc.wait(timeout=within(PROMPT))
