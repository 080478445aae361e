"""One drill per job at a time: an exclusive lock named after the backend and the job.

Why: two drills against the same job (a CI retry racing a developer, two terminals)
would each kill "exactly one" worker -- two in all, and each would read the other's kill
as its own recovery. The runner takes this lock right after discovery, before the
confirmation prompt and long before the kill, so the second drill ends in ERROR having
touched nothing.

How: ``fcntl.flock`` on ``recoverygate-<sha256 of the key>.lock`` in
``$RECOVERYGATE_LOCK_DIR``, else ``$XDG_RUNTIME_DIR``, else the temp dir. The kernel
drops a flock when its holder dies (even by SIGKILL), so a crashed drill never leaves a
stale lock; the file only carries the holder's pid and config path for the message.
The file is unlinked on release; a waiter that locked an unlinked inode notices (the
inode no longer matches the path) and tries again, so two holders can never coexist.
The lock covers drills on one machine (the usual case: one CI runner or one login
node); drills started from different machines against one cluster are not seen.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pytest_recoverygate.engine.model import Worker, Workload
from pytest_recoverygate.errors import DiscoveryError

__all__ = ["DrillLock", "LockScope", "job_lock", "job_scope", "lock_dir", "lock_path"]

_ATTEMPTS = 5  # re-tries after locking a file another holder unlinked meanwhile


def lock_dir() -> Path:
    """Where lock files live: $RECOVERYGATE_LOCK_DIR, $XDG_RUNTIME_DIR, or the temp dir."""
    for name in ("RECOVERYGATE_LOCK_DIR", "XDG_RUNTIME_DIR"):
        value = os.environ.get(name)
        if value and os.path.isdir(value) and os.access(value, os.W_OK | os.X_OK):
            return Path(value)
    return Path(tempfile.gettempdir())


def lock_path(key: str, directory: Path | None = None) -> Path:
    """The lock file of ``key`` (a hash: job names may hold any character)."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return (directory or lock_dir()) / f"recoverygate-{digest}.lock"


@dataclass(frozen=True, slots=True)
class LockScope:
    """What "one drill at a time" covers: one job, within a namespace where a backend has
    them (a Kubernetes namespace). Each backend says what it is for the job it found
    (:attr:`~pytest_recoverygate.registry.seams.Backend.lock_scope`)."""

    job: str
    namespace: str = ""


def job_scope(workload: Workload, target: Worker) -> LockScope:
    """The default scope: the job discovery found, by the name the backend gave it."""
    return LockScope(workload.job)


def job_lock(backend: str, scope: LockScope | None, config_path: object) -> DrillLock:
    """The lock of the job a drill found: backend name + namespace (if any) + job.

    ``scope`` None is a job no other drill can reach (the fake backend's lives inside one
    orchestrator object): its lock is a no-op, so such drills may run side by side.
    """
    if scope is None:
        return DrillLock("", job="", config_path=str(config_path))
    key = "\0".join((backend, scope.namespace, scope.job))
    job = f"{scope.namespace}/{scope.job}" if scope.namespace else scope.job
    return DrillLock(key, job=job, config_path=str(config_path))


class DrillLock:
    """An exclusive, non-blocking lock on one job; :meth:`release` may be called twice.

    An empty ``key`` makes a lock that is never contended (a job private to this process).
    """

    def __init__(
        self, key: str, *, job: str, config_path: str, directory: Path | None = None
    ) -> None:
        self.key = key
        self.job = job
        self.config_path = config_path
        self.path = lock_path(key, directory)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise DiscoveryError naming the live drill that holds it."""
        if self._fd is not None or not self.key:
            return
        for _ in range(_ATTEMPTS):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd)
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise DiscoveryError(self._busy_message(holder)) from None
            if not self._same_file(fd):  # the previous holder unlinked it meanwhile
                os.close(fd)
                continue
            self._fd = fd
            self._write_holder(fd)
            return
        raise DiscoveryError(  # pragma: no cover - needs five lost races in a row
            f"could not take the drill lock {self.path} for {self.job}; try again"
        )

    def release(self) -> None:
        """Unlink the file (while still holding it) and drop the lock. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            if self._same_file(fd):
                os.unlink(self.path)
        os.close(fd)  # closing the last descriptor releases the flock

    # ------------------------------------------------------------------ internals

    def _open(self) -> int:
        flags = os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        try:
            return os.open(self.path, flags | os.O_RDWR, 0o644)
        except PermissionError:  # another user's lock file: flock works read-only too
            return os.open(self.path, flags | os.O_RDONLY)

    def _same_file(self, fd: int) -> bool:
        try:
            mine, now = os.fstat(fd), os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)

    def _write_holder(self, fd: int) -> None:
        data = json.dumps(
            {"pid": os.getpid(), "config": self.config_path, "job": self.job}
        ).encode()
        with contextlib.suppress(OSError):  # a read-only descriptor: the message is vaguer
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)

    def _busy_message(self, holder: dict[str, object]) -> str:
        pid = holder.get("pid", "unknown")
        config = holder.get("config", "unknown")
        return (
            f"another drill (pid {pid}, config {config}) is already running against "
            f"{self.job}; wait for it or stop it (lock file {self.path})"
        )


def _read_holder(fd: int) -> dict[str, object]:
    try:
        data = os.pread(fd, 4096, 0)
        holder = json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}
