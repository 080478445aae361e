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

The budgets (seconds, before the slack):

=============  ======  =================================================================
``PROMPT``        10   this process, a thread of it, or a server it started answers (an
                       event over a pipe, a fake server's request, a thread ends)
``PROCESS``       30   a process the test started starts, answers a signal or ends
``JOB``          120   a real job (torchrun, a Slurm step, a pod's job) is up or ends
``CLUSTER``      300   a Ray or Slurm cluster comes up, or a job on one is discovered
``DRILL``        600   a whole real drill, as ``recoverygate run`` runs it
=============  ======  =================================================================

``SETTLE`` (0.2 s) is how long :func:`stays` watches for something that must not happen
here (a signal that must not arrive, a file that must not appear), ``QUIET`` (1 s) how
long for something a daemon or another process tree might still do late (Slurm acting on
a command that hung, a cluster script's kill); ``POLL`` (0.05 s) is how often
:func:`eventually` asks.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = [
    "CLUSTER",
    "DRILL",
    "JOB",
    "MAX_SLACK",
    "POLL",
    "PROCESS",
    "PROMPT",
    "QUIET",
    "SETTLE",
    "SLACK_ENV",
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
    """Assert ``predicate`` holds every time it is asked for ``during`` (stretched): a
    signal that must not arrive, a process that must stay alive. A busy machine delivers
    late, so the window grows with the slack, as a wait does."""
    until = time.monotonic() + within(during)
    while True:
        if not predicate():
            raise AssertionError(f"{what}: no longer so")
        if time.monotonic() >= until:
            return
        time.sleep(interval)
