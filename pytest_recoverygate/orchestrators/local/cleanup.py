"""Cleanup's end of a launched local job: SIGTERM to the agent, SIGKILL to every process
that carries the drill's marker until none is left, the adopted ones reaped, the
survivors named."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING

import psutil

from pytest_recoverygate.orchestrators.local.launch import DRILL_MARKER
from pytest_recoverygate.orchestrators.local.processes import (
    Identity,
    is_running,
    leftovers,
    process_table,
    signal_exactly,
    start_time,
)

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.local.launch import LocalJob
    from pytest_recoverygate.orchestrators.local.scan import JobScan

__all__ = [
    "KILL_ROUND_INTERVAL",
    "LEFTOVER_GRACE",
    "REAP_TIMEOUT",
    "TERM_GRACE",
    "end_processes",
    "marked_processes",
    "reap",
]

TERM_GRACE = 5.0  # seconds the agent gets to stop its workers after SIGTERM
REAP_TIMEOUT = 5.0  # seconds to wait for SIGKILLed processes to disappear
LEFTOVER_GRACE = 1.0  # seconds a process found at the end may take to finish exiting
KILL_ROUND_INTERVAL = 0.02  # seconds between cleanup's looks for marked processes


def end_processes(job: LocalJob, scan: JobScan) -> list[str]:
    """SIGTERM the agent, then SIGKILL every marked process until none is left.

    Returns a description (pid and command line) of every process of the job still
    alive at the deadline: marked ones that would not die, and processes seen in the
    job's tree (``scan``) that do not carry the marker (never signalled, so named instead).
    """
    drill_id = job.drill_id
    if drill_id is None:
        return []  # nothing was launched
    popen = job.popen
    if popen is not None and popen.poll() is None and job.agent is not None:
        agent = job.agent.process()
        if agent is not None:
            with contextlib.suppress(psutil.Error):
                agent.send_signal(signal.SIGTERM)  # torchrun forwards it to the workers
                # A stopped agent (^Z, a debugger) acts on it only once continued.
                agent.send_signal(signal.SIGCONT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=TERM_GRACE)
    with contextlib.suppress(Exception):
        scan.scan()  # remember anything that appeared at the last moment
    found: set[Identity] = set()  # every process found carrying the marker
    deadline = time.monotonic() + REAP_TIMEOUT
    while True:
        # Each round: every marked process alive now, wherever it was re-parented.
        # A process that forks while being killed leaves its child to the next round.
        marked = marked_processes(scan.seen(), drill_id, found)
        for identity in marked:
            signal_exactly(identity, signal.SIGKILL)
        reap(popen, scan.seen(), found)
        if not marked or time.monotonic() >= deadline:
            break
        time.sleep(KILL_ROUND_INTERVAL)
    # A SIGKILLed process is a zombie only once the kernel has torn it down, which a
    # loaded machine takes its time over: reap the adopted ones until none is left.
    reap_until = max(deadline, time.monotonic() + 1.0)
    while reap(popen, scan.seen(), found) and time.monotonic() < reap_until:
        time.sleep(KILL_ROUND_INTERVAL)
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=max(0.0, deadline - time.monotonic()))
    survivors = {i.pid: i for i in marked_processes(scan.seen(), drill_id, found)}
    seen = scan.seen()
    unmarked = {i.pid: i for i in seen if i.pid not in survivors and is_running(i)}
    quiet = f"; not signalled: it does not carry the drill's {DRILL_MARKER}"
    # A process that exits while cleanup looks at it is gone, not left over.
    return leftovers(
        [(i, "") for i in survivors.values()] + [(i, quiet) for i in unmarked.values()],
        grace=LEFTOVER_GRACE,
    )


def marked_processes(seen: list[Identity], drill_id: str, found: set[Identity]) -> list[Identity]:
    """Every live process that carries the marker ``drill_id``, among its possible places
    (each also added to ``found``).

    Where to look: the descendants of this process (a child subreaper: the job's
    orphans re-parent here), and every process ``seen`` in the job's tree with its
    descendants (where there is no subreaper, orphans re-parent to init). One pass
    over the process table; a process that vanishes meanwhile is simply skipped.
    """
    table, children = process_table()
    me = os.getpid()
    pending = list(children.get(me, ()))
    pending += [i.pid for i in seen if i.pid in table and i.same_start(table[i.pid].create_time)]
    visited: set[int] = set()
    marked: list[Identity] = []
    while pending:
        pid = pending.pop()
        if pid in visited or pid == me or pid not in table:
            continue
        visited.add(pid)
        pending.extend(children.get(pid, ()))
        proc = table[pid]
        if proc.zombie:
            continue
        environ = proc.environ()
        if environ is None:
            continue  # gone, or not ours to read: never signalled
        if environ.get(DRILL_MARKER) != drill_id:
            continue
        identity = Identity(pid, proc.create_time)
        found.add(identity)
        marked.append(identity)
    return marked


def reap(popen: subprocess.Popen[bytes] | None, seen: list[Identity], marked: set[Identity]) -> int:
    """Collect the exit status of the job's dead processes this process adopted; how
    many of the job's ``marked`` processes this process adopted are not reaped yet.

    Only a zombie that is this process's child *and* one of the job's instances (pid
    and start time: ``seen`` or ``marked``) is reaped: never another code's child. The
    agent is left to its ``popen``, which would otherwise take a vanished child for one
    that exited with 0.
    """
    if popen is not None:
        popen.poll()
    agent = popen.pid if popen is not None else None
    me = os.getpid()
    known = {*seen, *marked}
    pending = 0
    for identity in known:
        if identity.pid == agent:
            continue
        with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
            proc = psutil.Process(identity.pid)
            same = identity.same_start(start_time(identity.pid))
            if not same or proc.ppid() != me:
                continue
            if proc.status() == psutil.STATUS_ZOMBIE:
                reaped, _ = os.waitpid(identity.pid, os.WNOHANG)
                pending += reaped == 0
            elif identity in marked:  # SIGKILLed, not torn down yet
                pending += 1
    return pending
