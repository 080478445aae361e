"""Which live processes are the local job, and which of them are torchrun workers: one pass
over the process table from the agent and every process seen in the job's tree before."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from pytest_recoverygate.engine import model
from pytest_recoverygate.orchestrators.local.processes import (
    Identity,
    ProcRow,
    Scan,
    WorkerProc,
    process_table,
)

__all__ = [
    "ENVIRON_RETRY_AGE",
    "POLL_INTERVAL",
    "JobScan",
    "complete_group",
    "newest_workers",
    "worker_of",
]

POLL_INTERVAL = 0.05  # seconds between psutil scans while a recovery is under way
ENVIRON_RETRY_AGE = 2.0  # a process older than this without RANK is not a worker


class JobScan:
    """Scans of the tree of ``agent()`` (None: nothing to scan yet), remembering every
    process seen there: the roots of later scans (orphans of a dead agent) and of cleanup."""

    def __init__(self, agent: Callable[[], Identity | None]) -> None:
        self._agent = agent
        self._lock = threading.Lock()
        self._seen: dict[int, Identity] = {}
        self._environ_cache: dict[Identity, dict[str, str] | None] = {}

    def remember(self, identity: Identity) -> None:
        with self._lock:
            self._seen[identity.pid] = identity

    def seen(self) -> list[Identity]:
        """Every process seen in the job's tree, the newest instance of each pid."""
        with self._lock:
            return list(self._seen.values())

    def _environ(self, proc: ProcRow, identity: Identity) -> dict[str, str] | None:
        """The process's environment, cached once it shows RANK (or once it is old enough)."""
        if identity in self._environ_cache:
            return self._environ_cache[identity]
        environ = proc.environ()
        if environ is None:
            return None
        if "RANK" in environ or identity.age() > ENVIRON_RETRY_AGE:
            self._environ_cache[identity] = environ
        return environ

    def scan(self) -> Scan:
        """Every live descendant of the agent, and which of them are torchrun workers.

        One pass over the process table (``/proc/<pid>/stat`` read for each) per scan:
        ``Process.children()`` would walk the whole table once per root.
        """
        agent = self._agent()
        if agent is None:
            return Scan((), ())
        table, children = process_table()
        # Roots: the agent, and (for orphans of a dead agent) every process seen before.
        known = [agent, *self.seen()]
        pending = [
            i.pid for i in known if i.pid in table and i.same_start(table[i.pid].create_time)
        ]
        procs: dict[int, ProcRow] = {}
        while pending:
            pid = pending.pop()
            if pid in procs or pid not in table:
                continue
            procs[pid] = table[pid]
            pending.extend(children.get(pid, ()))
        workers: list[WorkerProc] = []
        identities: list[Identity] = []
        for proc in procs.values():
            if proc.zombie:
                continue
            identity = Identity(proc.pid, proc.create_time)
            parent_pid = proc.ppid
            identities.append(identity)
            if identity == agent:
                continue
            environ = self._environ(proc, identity)
            if not environ or "RANK" not in environ:
                continue
            parent = procs.get(parent_pid)
            if parent is not None and parent.pid != agent.pid:
                parent_identity = Identity(parent.pid, parent.create_time)
                parent_env = self._environ(parent, parent_identity)
                if parent_env and "RANK" in parent_env:
                    continue  # a worker's own subprocess (e.g. a DataLoader worker)
            with contextlib.suppress(ValueError):
                workers.append(
                    WorkerProc(
                        identity=identity,
                        rank=int(environ["RANK"]),
                        local_world_size=int(environ.get("LOCAL_WORLD_SIZE", "1")),
                        restart_count=int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                    )
                )
        for identity in identities:
            self.remember(identity)
        return Scan(tuple(workers), tuple(identities))


def complete_group(scan: Scan) -> dict[int, WorkerProc] | None:
    """The newest restart generation's workers by rank, if all local ranks are up."""
    if not scan.workers:
        return None
    newest = max(w.restart_count for w in scan.workers)
    group = {w.rank: w for w in scan.workers if w.restart_count == newest}
    size = max(w.local_world_size for w in group.values())
    return group if len(group) >= size else None


def newest_workers(scan: Scan) -> list[WorkerProc]:
    """The workers of the newest restart generation the scan saw, in the scan's order."""
    newest = max((w.restart_count for w in scan.workers), default=None)
    return [w for w in scan.workers if w.restart_count == newest]


def worker_of(proc: WorkerProc) -> model.Worker:
    """A worker process as the drill names it: its rank, pid and instance, this host."""
    return model.Worker(
        rank=proc.rank,
        name=f"rank {proc.rank} pid {proc.identity.pid}",
        instance_id=proc.identity.instance_id,
        node=socket.gethostname(),
    )
