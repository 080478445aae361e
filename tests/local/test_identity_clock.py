"""A process's identity survives a step of the wall clock.

A CI run left a whole drilled job behind, its hung worker stopped, with no word from
cleanup: ``/proc/stat``'s boot time had moved by a second (the wall clock stepped), and
psutil's ``create_time()`` — the boot time as read at that moment plus the start since
boot, cached per Process object — no longer agreed between two looks at one process, so
every identity check said "another process" and cleanup signalled nothing and reported
nothing. The identity is now the start since boot plus one reading of the boot time.

We test these aspects, with a real stopped child process and the step simulated where
psutil reads the boot time:
- after the step psutil's own answer has moved (the premise), the identity has not;
- the identity still matches, SIGCONT and SIGKILL reach that process, and the process
  table's start time agrees with the identity;
- a recycled pid (another start time) still never matches;
- an instance's age is read on the boot clock, not the stepped wall clock.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest
from psutil import _pslinux

from pytest_recoverygate.orchestrators.local.processes import (
    Identity,
    is_running,
    process_table,
    signal_exactly,
)
from tests.patience import PROMPT, within

pytestmark = [pytest.mark.slow]


@pytest.fixture
def stopped() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.send_signal(signal.SIGSTOP)
    yield child
    if child.poll() is None:
        child.send_signal(signal.SIGCONT)
        child.kill()
    child.wait(timeout=within(PROMPT))


def test_a_stepped_wall_clock_changes_no_identity_and_cleanup_still_reaches_the_process(
    stopped: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    identity = Identity.of(psutil.Process(stopped.pid))
    before = psutil.Process(stopped.pid).create_time()
    booted = _pslinux.boot_time()
    monkeypatch.setattr(_pslinux, "boot_time", lambda: booted + 1.0)  # the clock steps

    assert psutil.Process(stopped.pid).create_time() == pytest.approx(before + 1.0)  # premise
    assert is_running(identity)
    assert Identity.of(psutil.Process(stopped.pid)) == identity
    table, _ = process_table()
    assert identity.same_start(table[stopped.pid].create_time)
    assert signal_exactly(identity, signal.SIGCONT)
    assert signal_exactly(identity, signal.SIGKILL)
    assert stopped.wait(timeout=within(PROMPT)) == -signal.SIGKILL


def test_a_recycled_pid_still_never_matches(stopped: subprocess.Popen[bytes]) -> None:
    identity = Identity.of(psutil.Process(stopped.pid))
    other = Identity(identity.pid, identity.create_time - 0.01)  # one clock tick earlier
    assert not is_running(other)
    assert not signal_exactly(other, signal.SIGKILL)
    assert is_running(identity)


def test_an_instances_age_is_read_on_the_boot_clock_not_the_stepped_wall_clock(
    stopped: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The local backend caches a process's environment for good once it is older than
    # ENVIRON_RETRY_AGE without RANK: an age off by a clock step would take a worker still
    # between fork and exec for "not a worker" and never see its rank.
    identity = Identity.of(psutil.Process(stopped.pid))
    assert 0.0 <= identity.age() < 5.0  # started just now
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + 3600.0)  # the clock steps an hour
    assert 0.0 <= identity.age() < 5.0
