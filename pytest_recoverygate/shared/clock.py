"""The drill's clock: real for real backends, simulated for the fake one (the
:class:`Clock` seam every backend and the shared machinery wait on).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "RealClock", "SimulatedClock"]


class Clock(Protocol):
    """The drill's notion of time: real for real backends, simulated for the fake one."""

    def now(self) -> float:
        """POSIX seconds."""
        ...

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds, or less once :meth:`wakeup` is called."""
        ...

    def wakeup(self) -> None:
        """Cut the current or next :meth:`wait` short (thread-safe)."""
        ...


class RealClock:
    """Wall-clock time; ``wait`` returns early when a backend thread calls ``wakeup``."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def now(self) -> float:
        return time.time()

    def wait(self, timeout: float) -> None:
        if timeout > 0:
            self._event.wait(timeout)
        self._event.clear()

    def wakeup(self) -> None:
        self._event.set()


class SimulatedClock:
    """A clock that only moves when waited on: a drill over minutes runs in milliseconds."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def wait(self, timeout: float) -> None:
        self._now += max(timeout, 0.0)

    def wakeup(self) -> None:
        """Nothing to do: simulated waits never block."""

    def advance(self, seconds: float) -> None:
        self._now += seconds
