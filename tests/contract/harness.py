"""The Orchestrator contract suite's harness: one discovered job on one backend and eyes
on the world around it (:class:`Harness`), the threads an orchestrator started
(:class:`ThreadSpy`), and the fake backend's builder (the package's own backend has no
test folder of its own). Each other backend's builder is in its own test folder:
tests/local/contract_harness.py (torchrun, and two nodes in network namespaces),
tests/kubernetes/contract_harness.py, tests/slurm/contract_harness.py,
tests/ray/contract_harness.py; tests/contract/conftest.py says how the suite uses them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import psutil

from pytest_recoverygate.engine.model import Worker, Workload
from pytest_recoverygate.orchestrators.fake import FakeOrchestrator
from pytest_recoverygate.orchestrators.local.processes import start_time
from pytest_recoverygate.registry.seams import Clock, Orchestrator, SimulatedClock
from tests.patience import JOB, eventually

__all__ = [
    "Builder",
    "Harness",
    "ThreadSpy",
    "build_fake",
    "proc_environ",
    "proc_stat",
    "process_alive",
]

T = TypeVar("T")


# --------------------------------------------------------------------------- threads


class ThreadSpy:
    """Labels every thread started while installed with the label of its starter."""

    def __init__(self) -> None:
        self._labels: weakref.WeakKeyDictionary[threading.Thread, str] = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._original = threading.Thread.start

    def install(self) -> None:
        spy, original = self, self._original

        def start(thread: threading.Thread) -> None:
            label = spy.current_label()
            if label is not None:
                with spy._lock:
                    spy._labels[thread] = label
            original(thread)

        threading.Thread.start = start  # type: ignore[method-assign, assignment]

    def uninstall(self) -> None:
        threading.Thread.start = self._original  # type: ignore[method-assign]

    def current_label(self) -> str | None:
        own: str | None = getattr(self._local, "label", None)
        if own is not None:
            return own
        with self._lock:
            return self._labels.get(threading.current_thread())

    @contextlib.contextmanager
    def labelled(self, label: str) -> Iterator[None]:
        """Threads started by this thread (and by those threads) get ``label``."""
        previous = getattr(self._local, "label", None)
        self._local.label = label
        try:
            yield
        finally:
            self._local.label = previous

    def started(self, label: str) -> list[threading.Thread]:
        with self._lock:
            return [t for t, owner in list(self._labels.items()) if owner == label]

    def alive(self, label: str) -> list[threading.Thread]:
        return [t for t in self.started(label) if t.is_alive()]


# --------------------------------------------------------------------------- harness


@dataclass
class Harness:
    """One discovered job on one backend, and how a test checks the world around it.

    ``alive(worker)`` and ``current(rank)`` look at the world directly (processes, pods),
    never through the orchestrator; ``stale_id(worker)`` is a plausible instance id of an
    earlier instance of the same rank; ``pause`` lets the world move on (simulated time
    for the fake); ``patience`` bounds every wait, in clock seconds.
    """

    kind: str
    label: str
    orchestrator: Orchestrator
    clock: Clock
    workload: Workload
    alive: Callable[[Worker], bool]
    current: Callable[[int], Worker | None]
    stale_id: Callable[[Worker], str]
    pause: Callable[[float], None]
    patience: float
    exit_stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    cleaned: bool = False  # cleanup() ran: the next test gets a new job
    spoiled: bool = False  # a check killed a worker it must not have: the next test gets a new job

    @property
    def target(self) -> Worker:
        """Rank 1, the drill's default target."""
        worker = self.workload.by_rank(1)
        assert worker is not None, f"{self.kind}: no rank 1 in {self.workload}"
        return worker

    def stale(self, worker: Worker) -> Worker:
        """The same rank and name, but an instance that no longer exists."""
        return dataclasses.replace(worker, instance_id=self.stale_id(worker))

    def eventually(self, check: Callable[[], T | None], what: str) -> T:
        """:func:`tests.patience.eventually` on the harness's clock (simulated for the
        fake), for at most ``patience`` seconds (stretched by the slack)."""
        return eventually(
            check, f"{self.kind}: {what}", self.patience, now=self.clock.now, pause=self.pause
        )

    def close(self) -> None:
        self.exit_stack.close()


Builder = Callable[[str, str, Path], Harness]


# --------------------------------------------------------------------------- helpers


def process_alive(pid: int, created: str) -> bool:
    """The process ``pid`` started at ``created`` (the local backend's start time) still runs."""
    try:
        proc = psutil.Process(pid)
        started = start_time(pid)
        alive = started is not None and f"{started:.3f}" == created
        return alive and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: state, ppid, ... ([19] = start ticks since boot,
    the start time Slurm's probe reads)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def proc_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


# --------------------------------------------------------------------------- fake


def build_fake(purpose: str, label: str, tmp: Path, spy: ThreadSpy) -> Harness:
    clock = SimulatedClock()
    with spy.labelled(label):
        orchestrator = FakeOrchestrator(clock=clock, workers=4, nodes=2)  # two nodes
        conforming: Orchestrator = orchestrator  # the static check (mypy)
        workload = conforming.discover(clock.now() + 60)

    def live_ids() -> dict[int, Worker]:
        return {w.rank: w for w in orchestrator.discover(clock.now() + 60).workers}

    harness = Harness(
        kind="fake",
        label=label,
        orchestrator=orchestrator,
        clock=clock,
        workload=workload,
        alive=lambda w: w.instance_id in orchestrator.running(),
        current=lambda rank: live_ids().get(rank),
        stale_id=lambda w: f"fake-{w.rank}-999",
        pause=clock.wait,
        patience=JOB,
    )
    harness.exit_stack.callback(orchestrator.cleanup)
    return harness
