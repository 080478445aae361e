"""How long the tests wait: one slack factor, one wait, and the named budgets.

Every wall-clock wait of the suite is written here, once. A test never sleeps to let the
world move on and never carries a number of seconds of its own: it waits for the thing it
needs with :func:`eventually` (a predicate, what it waits for, and one of the budgets
below), asks for a deadline with :func:`deadline` or :func:`within`, and checks that
nothing happens with :func:`stays`. ``tests/test_patience.py`` holds the module to that
and scans the suite for a literal timeout anywhere else.

The budgets are what an unloaded machine needs, with room; :func:`slack` stretches them
on a machine that is busy with other work (CI runs the drills in two lanes on two cores,
and other people's jobs share a developer's machine)::

    slack = RECOVERYGATE_TEST_SLACK if set, else
            min(max(1, load average over the last minute / usable cores), MAX_SLACK)

A wait's budget is its timeout times the largest slack seen while it waits: a load that
rises in the middle of a wait lengthens it, one that falls never shortens it. A wait that
runs out fails with what it waited for, the budget and the slack, so a timeout under load
reads differently from one on an idle machine.

A kill a drill aims into a save (or a load) waits on a barrier the job parks at, not on a
time window: :class:`Hold` writes the file the example jobs' ``RG_TEST_HOLD`` names, the
job's save of that step parks after its first write while the file exists, and the hold
lets it go once the parked process is gone (the kill landed in the save, whatever the
load). One real drill per fault keeps a save of at least 3 s and no hold, so the tool's own
aim (half the measured save) is still tested.

The budgets (seconds, before the slack):

=============  ======  =================================================================
``PROMPT``        10   this process, a thread of it, or a server it started answers (an
                       event over a pipe, a fake server's request, a thread ends)
``PROCESS``       30   a process the test started starts, answers a signal or ends
``JOB``          120   a real job (torchrun, a Slurm step, a pod's job) is up or ends
``CLUSTER``      300   a Ray, Slurm or Kubernetes cluster comes up or goes down, or a job
                       on one is discovered
``DRILL``        600   a whole real drill, as ``recoverygate run`` runs it
=============  ======  =================================================================

``SETTLE`` (0.2 s) is how long :func:`stays` watches for something that must not happen
here (a signal that must not arrive, a file that must not appear), ``QUIET`` (1 s) how
long for something a daemon or another process tree might still do late (Slurm acting on
a command that hung, a cluster script's kill); ``POLL`` (0.05 s) is how often
:func:`eventually` asks.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TypeVar

__all__ = [
    "CLUSTER",
    "DRILL",
    "HOLD_ENV",
    "JOB",
    "MAX_SLACK",
    "POLL",
    "PROCESS",
    "PROMPT",
    "QUIET",
    "SETTLE",
    "SLACK_ENV",
    "Hold",
    "Timeout",
    "deadline",
    "describe",
    "eventually",
    "gather",
    "slack",
    "stays",
    "within",
]

T = TypeVar("T")

#: Overrides the slack factor (a number ≥ 1, or 1 for none): ``RECOVERYGATE_TEST_SLACK=3``.
SLACK_ENV = "RECOVERYGATE_TEST_SLACK"
#: The most the load stretches a budget by: past it a test is better failed than waited on.
MAX_SLACK = 5.0

#: The variable that names the hold file to the example jobs (examples/local/train.py,
#: examples/transformers/train.py).
HOLD_ENV = "RG_TEST_HOLD"

PROMPT = 10.0
PROCESS = 30.0
JOB = 120.0
CLUSTER = 300.0
DRILL = 600.0
SETTLE = 0.2
QUIET = 1.0
POLL = 0.05


class Timeout(AssertionError):
    """A wait ran out: what was waited for, the budget, the slack (and what was seen)."""


def _cores() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # not Linux
        return max(os.cpu_count() or 1, 1)


def slack() -> float:
    """The factor every budget is stretched by now (≥ 1; see the module docstring).

    ``RECOVERYGATE_TEST_SLACK`` wins when set; a value that is not a number ≥ 1 is an
    error, not a silent 1.
    """
    given = os.environ.get(SLACK_ENV, "").strip()
    if given:
        try:
            value = float(given)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 1.0):
            raise ValueError(f"{SLACK_ENV}={given!r}: expected a number >= 1 (1: no slack)")
        return value
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return min(max(1.0, load / _cores()), MAX_SLACK)


def describe() -> str:
    """Where the slack comes from now, for the run's header."""
    if os.environ.get(SLACK_ENV, "").strip():
        return f"slack {slack():g} ({SLACK_ENV})"
    try:
        load = f"load {os.getloadavg()[0]:.2f} on {_cores()} core(s)"
    except OSError:
        load = "no load average"
    return f"slack {slack():.2f} now ({load}; {SLACK_ENV} sets it)"


def within(seconds: float) -> float:
    """``seconds`` stretched by the slack now: a budget to pass as a ``timeout=``."""
    return seconds * slack()


def deadline(seconds: float) -> float:
    """An epoch deadline ``seconds`` (stretched) from now, as ``discover(deadline)`` takes."""
    return time.time() + within(seconds)


def eventually(
    predicate: Callable[[], T | None],
    what: str,
    timeout: float = PROCESS,
    *,
    seen: Callable[[], object] | None = None,
    interval: float = POLL,
    now: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> T:
    """Ask ``predicate`` every ``interval`` until it returns something truthy; return that.

    Fails with :class:`Timeout` ("no {what} within …") once ``timeout`` times the largest
    slack seen has passed, with ``seen()`` (what the test saw so far: events, output) when
    given. ``now`` and ``pause`` are the clock (a simulated one for the fake backend). The
    predicate is asked once more at the deadline, so a wait never fails on a thing that
    arrived while it paused.
    """
    started = now()
    stretch = slack()
    while True:
        found = predicate()
        if found:
            return found
        stretch = max(stretch, slack())
        if now() - started >= timeout * stretch:
            found = predicate()
            if found:
                return found
            budget = f"{timeout:g} s x slack {stretch:.2f} = {timeout * stretch:.1f} s"
            detail = f"; seen: {seen()}" if seen is not None else ""
            raise Timeout(f"no {what} within {budget}{detail}")
        pause(interval)


def gather(
    poll: Callable[[], Iterable[T]],
    until: Callable[[list[T]], bool],
    what: str,
    timeout: float = PROCESS,
    *,
    seen: Callable[[list[T]], object] | None = None,
) -> list[T]:
    """Collect what ``poll`` returns (events, lines) until ``until(collected)`` holds, with
    :func:`eventually`'s budget; the collection. A timeout says what was collected (or
    ``seen(collected)``: the kinds of the events, the job's output)."""
    collected: list[T] = []

    def done() -> bool:
        collected.extend(poll())
        return until(collected)

    shown = (lambda: seen(collected)) if seen is not None else (lambda: collected)
    eventually(done, what, timeout, seen=shown)
    return collected


def stays(
    predicate: Callable[[], object],
    what: str,
    during: float = SETTLE,
    *,
    interval: float = POLL / 5,
) -> None:
    """Assert ``predicate`` holds every time it is asked for ``during`` seconds: a signal
    that must not arrive, a process that must stay alive. The window is not stretched by
    the slack: it is the check's reach, not a wait a busy machine can run out of (a late
    act it misses fails no test; a longer window on every loaded run would cost the suite
    minutes)."""
    until = time.monotonic() + during
    while True:
        if not predicate():
            raise AssertionError(f"{what}: no longer so")
        if time.monotonic() >= until:
            return
        time.sleep(interval)


class Hold:
    """The barrier a kill aimed into a save waits on (the jobs' ``RG_TEST_HOLD``).

    ``Hold(folder, "save", 60)`` writes ``folder/hold`` reading ``save 60``: the job's save
    of step 60 (or later) parks after its first write while the file exists, and writes
    ``hold.parked.<pid>``. Give the job :attr:`env`. As a context manager it lets the
    parked save go by itself once a parked process is gone (the drill's kill landed in
    it): :attr:`killed` are those processes. A test that kills by hand uses :meth:`arm`,
    :meth:`wait_parked` and :meth:`release` (in a ``finally``).
    """

    def __init__(self, folder: Path, what: str, step: int) -> None:
        self.path = folder / "hold"
        self.what, self.step = what, step
        self.killed: list[int] = []
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    @property
    def env(self) -> dict[str, str]:
        return {HOLD_ENV: str(self.path)}

    def parked(self) -> list[int]:
        """The processes parked at the hold (alive or not), by pid."""
        return sorted(
            int(p.name.rpartition(".")[2]) for p in self.path.parent.glob("hold.parked.*")
        )

    def wait_parked(self, timeout: float | None = None) -> list[int]:
        """The parked processes, once there is one (within ``timeout``, or ``DRILL``)."""
        budget = DRILL if timeout is None else timeout
        return eventually(self.parked, f"a {self.what} of step {self.step} parked", budget)

    def arm(self) -> Hold:
        """Write the hold file: from now on the save (or load) it names parks."""
        self.path.write_text(f"{self.what} {self.step}\n")
        return self

    def release(self) -> None:
        self.path.unlink(missing_ok=True)

    def _release_after_kill(self) -> None:
        try:
            parked = self.wait_parked()

            def killed() -> list[int]:
                return [pid for pid in self.parked() if _gone(pid)]

            self.killed = eventually(killed, f"the kill of a process parked in {parked}", DRILL)
        except BaseException as exc:  # handed to the test at __exit__
            self._failed = exc
        finally:
            self.release()

    def __enter__(self) -> Hold:
        self.arm()
        self._thread = threading.Thread(target=self._release_after_kill, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
        if self._thread is not None:
            self._thread.join(within(PROMPT))
        if kind is None and self._failed is not None:
            raise self._failed


def _gone(pid: int) -> bool:
    """No process ``pid``, or only its zombie."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return True
