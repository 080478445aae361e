"""Cleanup's last look at the job: a process that exits while cleanup looks at it is gone.

We test these aspects, with real processes (no torchrun, a few short Python children):
- a process that ends during the final look — a zombie by then, its command line empty
  or unreadable — is not reported left over (was: "pid N (?; not signalled …)", "pid N
  (command line unreadable …)", turning a PASS into ERROR);
- a process gone before the look, reaped, is not reported;
- a process still alive after the look is reported with its command line and its note.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from pytest_recoverygate.orchestrators.local.processes import Identity, is_running, leftovers
from tests.patience import PROMPT, within

pytestmark = [pytest.mark.slow]


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:  # leave nothing behind
        if child.poll() is None:
            child.kill()
        child.wait(timeout=within(PROMPT))


def start(children: list[subprocess.Popen[bytes]], code: str) -> Identity:
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
    children.append(child)
    return Identity.of(psutil.Process(child.pid))


def test_a_process_that_exits_during_the_look_is_gone_not_left_over(
    children: list[subprocess.Popen[bytes]],
) -> None:
    identity = start(children, "import time; time.sleep(0.3)")
    assert is_running(identity)  # alive when cleanup found it
    started = time.monotonic()
    grace = 5.0
    found = leftovers([(identity, "; not signalled")], grace=grace)
    assert found == []
    assert time.monotonic() - started < grace  # it stopped looking once the process was gone
    # Not reaped by us yet: a zombie, which holds nothing.
    assert psutil.Process(identity.pid).status() == psutil.STATUS_ZOMBIE


def test_a_process_reaped_before_the_look_is_not_reported(
    children: list[subprocess.Popen[bytes]],
) -> None:
    identity = start(children, "pass")
    children[-1].wait(timeout=within(PROMPT))
    assert leftovers([(identity, "")], grace=0.2) == []


def test_a_process_still_alive_after_the_look_is_reported_with_its_command_line(
    children: list[subprocess.Popen[bytes]],
) -> None:
    identity = start(children, "import time; time.sleep(60)")
    gone = start(children, "import time; time.sleep(0.1)")
    found = leftovers([(identity, "; not signalled"), (gone, "")], grace=1.0)
    assert len(found) == 1
    assert found[0].startswith(f"pid {identity.pid} (")
    assert "time.sleep(60)" in found[0] and found[0].endswith("; not signalled)")
