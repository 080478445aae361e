"""Processes on this machine, by identity: what the local backend knows about pids.

A process *instance* is its pid and its start time (:class:`Identity`; :func:`start_time`
is the start since boot, which never changes, plus one reading of the boot time), so a
recycled pid never matches and a stepped wall clock changes no identity; a signal goes
through a pidfd that pins the instance it was opened on (:func:`signal_exactly`). One pass
over the process table per look (:func:`process_table`): ``Process.children()`` would walk
the whole table once per root. :class:`SubreaperGuard` makes this process a child
subreaper while a drill needs it, so the orphans of a killed torchrun agent re-parent
here, where cleanup can reach them.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from pytest_recoverygate.errors import DiscoveryError

__all__ = [
    "Identity",
    "ProcRow",
    "Scan",
    "SubreaperGuard",
    "WorkerProc",
    "describe_process",
    "is_running",
    "leftovers",
    "pidfd_open",
    "process_table",
    "resolve_executable",
    "signal_exactly",
    "start_time",
]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37

#: The boot time, read once. ``/proc/stat``'s btime is the wall clock minus the time since
#: boot: it moves whenever the wall clock is stepped (NTP, a VM's clock), by the step in
#: whole seconds. psutil's ``create_time()`` adds btime as read at that
#: moment and caches the sum per Process object (and ``process_iter`` caches the objects),
#: so two looks at one process could disagree and no identity matched: cleanup skipped
#: the very processes it had to end and took them for gone (a CI run left a whole job
#: behind, its hung worker stopped).
_BOOT = psutil.boot_time()
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/PID/stat`` after the command name, split: field 3 (the state) is at 0.
    None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat.rsplit(b")", 1)[-1].split()  # the name before it may hold anything


def _started(fields: list[bytes]) -> float | None:
    try:
        return _BOOT + int(fields[19]) / _CLOCK_TICKS
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since the epoch: its start in clock ticks
    since boot (``/proc/PID/stat`` field 22, fixed for the life of the process) plus the
    boot time this process read once. None when there is no such process."""
    fields = _stat_fields(pid)
    return None if fields is None else _started(fields)


@dataclass(frozen=True, slots=True)
class Identity:
    """A process instance: the pid and its start time, so a recycled pid never matches."""

    pid: int
    create_time: float

    @property
    def instance_id(self) -> str:
        return f"{self.pid}@{self.create_time:.3f}"

    @classmethod
    def parse(cls, instance_id: str) -> Identity | None:
        pid, _, created = instance_id.partition("@")
        try:
            return cls(int(pid), float(created))
        except ValueError:
            return None

    @classmethod
    def of(cls, proc: psutil.Process) -> Identity:
        started = start_time(proc.pid)
        if started is None:
            raise psutil.NoSuchProcess(proc.pid)
        return cls(proc.pid, started)

    def age(self) -> float:
        """Seconds since this instance started, on the boot clock (a stepped wall clock
        changes neither side: ``time.time()`` here would be off by the step)."""
        return time.clock_gettime(time.CLOCK_BOOTTIME) - (self.create_time - _BOOT)

    def same_start(self, started: float | None) -> bool:
        """True when ``started`` (:func:`start_time`) is this instance's start time."""
        return started is not None and f"{started:.3f}" == f"{self.create_time:.3f}"

    def matches(self, proc: psutil.Process) -> bool:
        """True when ``proc`` is this instance and is still alive (not a zombie)."""
        try:
            return (
                proc.pid == self.pid
                and self.same_start(start_time(proc.pid))
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return False

    def process(self) -> psutil.Process | None:
        """The live process with this identity, or None when it is gone or recycled."""
        try:
            proc = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return None
        return proc if self.matches(proc) else None


@dataclass(frozen=True, slots=True)
class WorkerProc:
    """A worker process as seen in one scan."""

    identity: Identity
    rank: int
    local_world_size: int
    restart_count: int


@dataclass(frozen=True, slots=True)
class Scan:
    """One look at the job's process tree."""

    workers: tuple[WorkerProc, ...]
    processes: tuple[Identity, ...]


class SubreaperGuard:
    """Makes this process a child subreaper (Linux) while at least one drill needs it.

    Orphaned workers of a killed agent are then re-parented to us instead of init, so
    cleanup can find, kill and reap them. The previous setting is restored afterwards.
    """

    _lock = threading.Lock()
    _users = 0
    _previous = 0

    @classmethod
    def _prctl(cls) -> Any:
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
        return getattr(libc, "prctl", None)

    @classmethod
    def acquire(cls) -> None:
        with cls._lock:
            prctl = cls._prctl()
            if prctl is None:
                return
            if cls._users == 0:
                value = ctypes.c_int(0)
                if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) == 0:
                    cls._previous = value.value
                prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            cls._users += 1

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            prctl = cls._prctl()
            if prctl is None or cls._users == 0:
                return
            cls._users -= 1
            if cls._users == 0 and not cls._previous:
                prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class ProcRow:
    """One process as one look at the process table saw it (its ``/proc/PID/stat``, read
    once): this look's own record, which nothing else in the process can change."""

    pid: int
    ppid: int
    create_time: float  # :func:`start_time`
    zombie: bool  # dead, its exit status not collected (state Z or X)

    def environ(self) -> dict[str, str] | None:
        """The process's environment now, or None when it is gone or not ours to read."""
        try:
            with open(f"/proc/{self.pid}/environ", "rb") as handle:
                data = handle.read()
        except OSError:
            return None
        environ: dict[str, str] = {}
        for entry in data.split(b"\0"):
            key, sep, value = entry.partition(b"=")
            if sep:
                environ[os.fsdecode(key)] = os.fsdecode(value)
        return environ


def process_table() -> tuple[dict[int, ProcRow], dict[int, list[int]]]:
    """One pass over the process table: processes by pid, and children by parent pid.

    Each row is read from ``/proc/PID/stat`` into a record of this call's own, never
    psutil's: ``process_iter`` caches its Process objects for the whole process and
    replaces their ``info`` on every walk, so a table a node's watcher had just taken lost
    its start times when another watcher (or any other code) walked the table meanwhile
    (a two-node drill failed with ``KeyError('create_time')``)."""
    table: dict[int, ProcRow] = {}
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table, children
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        fields = _stat_fields(pid)
        if fields is None:
            continue  # gone meanwhile
        started = _started(fields)
        try:
            ppid = int(fields[1])
        except (IndexError, ValueError):
            continue
        if started is None:
            continue
        table[pid] = ProcRow(pid, ppid, started, zombie=fields[0] in (b"Z", b"X"))
        children.setdefault(ppid, []).append(pid)
    return table, children


def signal_exactly(identity: Identity, sig: signal.Signals) -> bool:
    """Send ``sig`` to that very instance (pid and start time), never to a recycled pid.

    The pidfd pins the process the pid names when it is opened; the identity check after
    it confirms that this is our instance, so the signal cannot reach another process.
    """
    pidfd = pidfd_open(identity.pid)
    try:
        if identity.process() is None:
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(identity.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def describe_process(identity: Identity, note: str) -> str:
    """``pid N (command line)`` for an error message that names a leftover process."""
    try:
        command = shlex.join(psutil.Process(identity.pid).cmdline()) or "?"
    except psutil.Error:
        command = "command line unreadable"
    if len(command) > 200:
        command = command[:197] + "..."
    return f"pid {identity.pid} ({command}{note})"


def is_running(identity: Identity) -> bool:
    """The process with this identity still runs: a zombie (dead, its exit status not yet
    collected by a parent that is not ours) holds nothing and is not left running."""
    return identity.process() is not None


def leftovers(
    candidates: Sequence[tuple[Identity, str]], *, grace: float, interval: float = 0.05
) -> list[str]:
    """The descriptions (:func:`describe_process`, with each one's note) of the processes
    among ``candidates`` still running after up to ``grace`` seconds.

    A process that exits while cleanup looks at it — a zombie by now, gone, or one whose
    command line can no longer be read because it is exiting — is gone, not left over:
    only a process still alive after the wait and after its description was read is.
    """
    deadline = time.monotonic() + grace
    alive = [c for c in candidates if is_running(c[0])]
    while alive and time.monotonic() < deadline:
        time.sleep(interval)
        alive = [c for c in alive if is_running(c[0])]
    out = []
    for identity, note in alive:
        text = describe_process(identity, note)
        if is_running(identity):  # still there once its description was read
            out.append(text)
    return out


def pidfd_open(pid: int) -> int | None:
    """A pidfd pinning ``pid``'s current process, or None where pidfds are unavailable."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


def resolve_executable(program: str) -> str:
    """Find ``program`` on PATH, then next to this Python (a venv's torchrun when not activated)."""
    if os.sep in program:
        return program
    found = shutil.which(program) or shutil.which(program, path=str(Path(sys.executable).parent))
    if found is None:
        raise DiscoveryError(
            f"workload.command: {program!r} was not found on PATH nor next to {sys.executable}; "
            "install it (pip install torch) or give its full path"
        )
    return found
