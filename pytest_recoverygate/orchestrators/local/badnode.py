"""StickyFault ``scope: node`` on the local backend: a node that stays bad (docs/faults.md).

The local backend's nodes are network namespaces the drill made (:mod:`.netns`).
:class:`BadNode` watches one of them from the moment the node goes bad until cleanup, and
hits every job process in it: the work running there at once, every process that starts
there later ``after`` seconds after it started (on the boot clock: a stepped wall clock
moves nothing). ``mode: kill`` sends SIGKILL, ``mode: hang`` SIGSTOP.

- **What it hits.** A process in the node's namespace (its ``/proc/PID/ns/net`` is the
  namespace's) whose environment carries the node's drill marker (``RECOVERYGATE_DRILL_ID``
  with the value of that node's launch) and a ``RANK``: a worker torchrun started there,
  or a child of one. The node's agent (torchrun: the part of the job that decides whether
  to place work on the node again) is never hit, nor any process without the marker, nor
  a process of another namespace. Each signal goes through a pidfd, opened first; the
  pinned process is checked (the same start time, still in the namespace) before it is
  signalled, so a recycled pid is never hit.
- **Placements.** A placement is one worker group the node's agent started there: its
  workers and their children, keyed by the agent's instance and
  ``TORCHELASTIC_RESTART_COUNT``. Each is reported once when seen
  (``BAD_NODE_PLACEMENT``, number 1 for the work running when the node went bad) and
  once when hit (``BAD_NODE_HIT``), through the node backend's group events.
- **Nothing left.** A stopped process is remembered before its SIGSTOP; :meth:`stop`
  (cleanup, on every way out) ends the watcher thread, then continues and SIGKILLs each
  stopped process that still runs. A drill that is itself SIGKILLed leaves them stopped in
  the namespace, where ``recoverygate sweep`` SIGKILLs every process of a dead drill.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_recoverygate.engine import model
from pytest_recoverygate.orchestrators.local.netns import NETNS_DIR
from pytest_recoverygate.orchestrators.local.processes import (
    Identity,
    ProcRow,
    is_running,
    pidfd_open,
    process_table,
    start_time,
)

__all__ = ["POLL_INTERVAL", "BadNode", "netns_key"]

POLL_INTERVAL = 0.05  # seconds between looks at the namespace
MAX_PLACEMENTS = 1000  # placements numbered; a job that rejoins more is judged long before
STOP_JOIN = 5.0  # seconds cleanup waits for the watcher thread

Emit = Callable[..., None]  # (kind, detail, **GroupEvent fields)


def netns_key(path: str) -> tuple[int, int] | None:
    """The namespace a ``/proc/PID/ns/net`` (or ``/run/netns/NAME``) names, or None."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


@dataclass(frozen=True, slots=True)
class _JobProc:
    """A job process in the bad node, as one look saw it."""

    identity: Identity
    rank: int | None
    key: tuple[str, str]  # (the agent's instance, TORCHELASTIC_RESTART_COUNT)


@dataclass
class _Placement:
    number: int
    first: _JobProc
    hit_reported: bool = False
    hit: set[Identity] = field(default_factory=set)


class BadNode:
    """One node that stays bad until :meth:`stop` (see the module docstring).

    ``marker`` is ``(name, value)`` of the node's drill marker, ``agent`` the node's agent
    (never hit), ``emit`` the node backend's group-event door.
    """

    def __init__(
        self,
        *,
        netns: str,
        hostname: str,
        marker: tuple[str, str],
        agent: Identity | None,
        mode: str,
        after: float,
        emit: Emit,
        now: Callable[[], float],
    ) -> None:
        self.netns = netns
        self.hostname = hostname
        self.mode = mode
        self.after = after
        self._marker = marker
        self._agent = agent
        self._emit = emit
        self._now = now
        self._key = netns_key(str(NETNS_DIR / netns))
        self._sig = signal.SIGSTOP if mode == "hang" else signal.SIGKILL
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._placements: dict[tuple[str, str], _Placement] = {}
        self._hit: set[Identity] = set()  # every process signalled
        self._stopped: set[Identity] = set()  # SIGSTOPped: continued and killed by stop()
        self._armed_early: set[Identity] = set()  # running when the node went bad: hit now
        self._environ: dict[Identity, dict[str, str] | None] = {}
        self.error: str | None = None

    @property
    def verb(self) -> str:
        return "SIGSTOP" if self.mode == "hang" else "SIGKILL"

    # ------------------------------------------------------------------ looking

    def look(self) -> list[_JobProc]:
        """The job processes in the node now (nothing is signalled)."""
        if self._key is None:
            return []
        table, _ = process_table()
        found: list[_JobProc] = []
        rows: dict[int, ProcRow] = {}
        for pid, row in table.items():
            if row.zombie or netns_key(f"/proc/{pid}/ns/net") != self._key:
                continue
            identity = Identity(pid, row.create_time)
            if identity == self._agent:
                continue
            environ = self._environ_of(row, identity)
            if environ is None or environ.get(self._marker[0]) != self._marker[1]:
                continue
            if "RANK" not in environ:
                continue
            rows[pid] = row
        for pid, row in rows.items():
            environ = self._environ.get(Identity(pid, row.create_time)) or {}
            root = row
            while root.ppid in rows:  # up to the worker its agent started
                root = rows[root.ppid]
            parent = table.get(root.ppid)
            agent = f"{parent.pid}@{parent.create_time:.3f}" if parent is not None else "?"
            rank = environ.get("RANK", "")
            found.append(
                _JobProc(
                    Identity(pid, row.create_time),
                    int(rank) if rank.isdigit() else None,
                    (agent, environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                )
            )
        return sorted(found, key=lambda p: p.identity.create_time)

    def _environ_of(self, row: ProcRow, identity: Identity) -> dict[str, str] | None:
        """The process's environment, read once it holds a RANK (a fresh fork holds its
        parent's until it execs: asked again next look)."""
        if identity in self._environ:
            return self._environ[identity]
        environ = row.environ()
        if environ is not None and "RANK" in environ:
            self._environ[identity] = environ
        return environ

    # ------------------------------------------------------------------ hitting

    def _signal(self, identity: Identity, sig: signal.Signals) -> bool:
        """``sig`` to that very process, pinned by a pidfd and checked (start time, still
        in the namespace) once pinned; False when it is gone or not the same."""
        pidfd = pidfd_open(identity.pid)
        if pidfd is None:
            return False
        try:
            if not identity.same_start(start_time(identity.pid)):
                return False
            if netns_key(f"/proc/{identity.pid}/ns/net") != self._key:
                return False
            if sig is signal.SIGSTOP:
                with self._lock:
                    self._stopped.add(identity)  # before the signal: stop() always sees it
            signal.pidfd_send_signal(pidfd, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False
        finally:
            os.close(pidfd)

    def _placement(self, proc: _JobProc) -> _Placement | None:
        placement = self._placements.get(proc.key)
        if placement is not None or len(self._placements) >= MAX_PLACEMENTS:
            return placement
        placement = _Placement(len(self._placements) + 1, proc)
        self._placements[proc.key] = placement
        age = proc.identity.age()
        self._emit(
            model.GroupEventKind.BAD_NODE_PLACEMENT,
            f"work placed on the bad node {self.hostname}: placement {placement.number}, "
            f"rank {proc.rank} pid {proc.identity.pid} (TORCHELASTIC_RESTART_COUNT="
            f"{proc.key[1]}), started {age:.1f}s ago",
            worker=self._worker(proc, placement.number),
            placement=placement.number,
        )
        return placement

    def _worker(self, proc: _JobProc, number: int) -> model.Worker:
        return model.Worker(
            rank=-1 if proc.rank is None else proc.rank,
            name=f"placement {number}: pid {proc.identity.pid}",
            instance_id=proc.identity.instance_id,
            node=self.hostname,
        )

    def _due(self, proc: _JobProc) -> bool:
        return proc.identity in self._armed_early or proc.identity.age() >= self.after

    def once(self) -> int:
        """One look: every new placement reported, every job process due hit; how many
        processes were hit."""
        hits = 0
        for proc in self.look():
            placement = self._placement(proc)
            if proc.identity in self._hit or not self._due(proc):
                continue
            at = self._now()
            if not self._signal(proc.identity, self._sig):
                continue
            self._hit.add(proc.identity)
            hits += 1
            if placement is None:
                continue
            placement.hit.add(proc.identity)
            if not placement.hit_reported:
                placement.hit_reported = True
                self._emit(
                    model.GroupEventKind.BAD_NODE_HIT,
                    f"{self.verb} sent to placement {placement.number} on the bad node "
                    f"{self.hostname} (rank {proc.rank} pid {proc.identity.pid}, "
                    f"{proc.identity.age():.1f}s after it started)",
                    placement=placement.number,
                    timestamp=at,
                )
        return hits

    # ------------------------------------------------------------------ life

    def start(self) -> tuple[float, int]:
        """The node goes bad: the job processes running in it now are hit at once, then a
        thread hits each one that starts later; (when, how many were hit now)."""
        self._armed_early = {proc.identity for proc in self.look()}
        at = self._now()
        hits = self.once()
        thread = threading.Thread(
            target=self._watch, name=f"recoverygate-badnode-{self.hostname}", daemon=True
        )
        self._thread = thread
        thread.start()
        return at, hits

    def _watch(self) -> None:
        while not self._stop.wait(POLL_INTERVAL):
            try:
                self.once()
            except Exception as exc:  # never stop silently: the node would no longer be bad
                self.error = f"the watcher of the bad node {self.hostname} failed: {exc!r}"
                self._emit(model.GroupEventKind.JOB_FAILED, self.error)
                return

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def stop(self) -> list[str]:
        """End the watcher, then continue and SIGKILL each process it stopped that still
        runs (idempotent); what could not be done."""
        self._stop.set()
        problems: list[str] = []
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_JOIN)
            if thread.is_alive():
                problems.append(f"the watcher of the bad node {self.hostname} did not stop")
        with self._lock:
            stopped, self._stopped = set(self._stopped), set()
        for identity in stopped:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(OSError):
                    self._signal(identity, sig)
            if is_running(identity) and _still_stopped(identity):
                problems.append(f"pid {identity.pid} in {self.netns} is still stopped")
        return problems


def _still_stopped(identity: Identity) -> bool:
    """The process is in the stopped state (``T``)."""
    try:
        with open(f"/proc/{identity.pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return False
    return bool(fields) and fields[0] in (b"T", b"t")
