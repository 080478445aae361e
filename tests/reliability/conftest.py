"""The reliability suite's shared pieces: the figures it counts, and where they go.

Every test that proves a safety property adds what it did to :data:`FIGURES` (drills
run, faults injected, kills observed, leftovers found, fuzz cases tried, ...). With
``RECOVERYGATE_RELIABILITY_OUT=path.json`` the session writes them there when it ends
(under pytest-xdist each worker writes ``path.gwN.json``); ``scripts/reliability-figures
check FILE...`` then holds RELIABILITY.md to their sum.
Counting happens where the work happens, so a figure can only grow by doing the work.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
from collections import Counter
from pathlib import Path

import pytest


class Figures:
    """Thread-safe counters, written as JSON at the end of the session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.started = time.monotonic()

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self.counts[name] += amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self.counts.items()))


FIGURES = Figures()


@pytest.fixture(scope="session")
def figures() -> Figures:
    return FIGURES


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get("RECOVERYGATE_RELIABILITY_OUT")
    if not out:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None and getattr(session.config.option, "dist", "no") != "no":
        return  # the xdist controller ran no test: its workers write their own figures
    path = Path(out)
    if worker is not None:  # one file per worker: OUT.gw0.json, ... (the check sums them)
        path = path.with_name(f"{path.stem}.{worker}{path.suffix}")
    doc = {
        "figures": FIGURES.snapshot(),
        "seconds": round(time.monotonic() - FIGURES.started, 1),
        "exitstatus": int(exitstatus),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
