"""One drill per job at a time: an exclusive lock named after the backend and the job.

Why: two drills against the same job (a CI retry racing a developer, two terminals)
would each kill "exactly one" worker -- two in all, and each would read the other's kill
as its own recovery. The runner takes this lock right after discovery, before the
confirmation prompt and long before the kill, so the second drill ends in ERROR having
touched nothing.

How: ``fcntl.flock`` on ``recoverygate-<sha256 of the key>.lock`` in
``$RECOVERYGATE_LOCK_DIR``, else (as root) ``/run/recoverygate``, else
``$XDG_RUNTIME_DIR``, else ``recoverygate-<uid>`` in the temp dir: a folder only its user
can write, made 0700 and checked (a folder, not a link, the user's, no group/other bits),
never the shared temp dir itself, where another user could plant a hard link to
``/etc/passwd`` at the lock's name for root to truncate, or text for its message. The lock
file is opened without following a link and used only if it is a regular file of the
drill's user with one link (``S_ISREG``, owner, ``st_nlink == 1``). The kernel
drops a flock when its holder dies (even by SIGKILL), so a crashed drill never leaves a
stale lock; the file only carries the holder's pid and config path for the message.
The file is unlinked on release; a waiter that locked an unlinked inode notices (the
inode no longer matches the path) and tries again, so two holders can never coexist.
The lock covers drills on one machine by one user (the usual case: one CI runner or one
login node); drills started by another user, or from different machines against one
cluster, are not seen.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pytest_recoverygate.engine.model import Worker, Workload
from pytest_recoverygate.errors import DiscoveryError

__all__ = [
    "DrillLock",
    "LockScope",
    "job_lock",
    "job_scope",
    "lock_dir",
    "lock_path",
    "same_file",
]

_ATTEMPTS = 5  # re-tries after locking a file another holder unlinked meanwhile
ROOT_LOCK_DIR = Path("/run/recoverygate")  # root's: in a folder only root can write
_HOLDER_TEXT = 200  # characters of the holder's config path shown in the message


def lock_dir() -> Path:
    """Where lock files live: $RECOVERYGATE_LOCK_DIR, else ``/run/recoverygate`` as root,
    else $XDG_RUNTIME_DIR, else a private ``recoverygate-<uid>`` folder in the temp dir.

    $RECOVERYGATE_LOCK_DIR passes the same checks as the drill's own folders (made 0700
    if missing; a folder, not a link, of the drill's user, no group or other bits): a
    world-writable folder given there would let another user plant the lock file."""
    value = os.environ.get("RECOVERYGATE_LOCK_DIR")
    if value:
        return _private_folder(Path(value), "RECOVERYGATE_LOCK_DIR")
    uid = os.geteuid()
    if uid == 0 and ROOT_LOCK_DIR.parent.is_dir():
        return _private_folder(ROOT_LOCK_DIR)
    value = os.environ.get("XDG_RUNTIME_DIR")
    if uid != 0 and value and os.path.isdir(value) and os.access(value, os.W_OK | os.X_OK):
        return Path(value)
    return _private_folder(Path(tempfile.gettempdir()) / f"recoverygate-{uid}")


def _private_folder(path: Path, source: str = "") -> Path:
    """``path``, made 0700 if missing; refused unless it is a folder (not a link) of the
    drill's user that no one else can write or read."""
    where = f" (from {source})" if source else ""
    uid = os.geteuid()
    try:
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        st = os.lstat(path)
    except OSError as exc:
        raise DiscoveryError(
            f"the drill lock folder {path}{where} cannot be made or read: {exc.strerror or exc}; "
            "set RECOVERYGATE_LOCK_DIR to a folder only you can write"
        ) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise DiscoveryError(
            f"the drill lock folder {path}{where} is not a private folder of uid {uid} "
            f"(found {stat.filemode(st.st_mode)}, owner uid {st.st_uid}); make it one "
            f"(chmod 700, owned by uid {uid}, not a link), remove it, or set "
            "RECOVERYGATE_LOCK_DIR to a folder only you can write"
        )
    return path


def same_file(fd: int, path: Path) -> bool:
    """``path`` (not followed) still names the file open as ``fd``: no one unlinked or
    replaced it since it was opened (a lock taken on an unlinked inode locks nothing)."""
    try:
        mine, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)


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
            if not same_file(fd, self.path):  # the previous holder unlinked it meanwhile
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
            if same_file(fd, self.path):
                os.unlink(self.path)
        os.close(fd)  # closing the last descriptor releases the flock

    # ------------------------------------------------------------------ internals

    def _open(self) -> int:
        """The lock file, opened without following a link, checked before any write."""
        flags = os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise DiscoveryError(self._unsafe("it is a symbolic link")) from None
        st = os.fstat(fd)
        problem = (
            "it is not a regular file"
            if not stat.S_ISREG(st.st_mode)
            else f"it is owned by uid {st.st_uid}, not {os.geteuid()}"
            if st.st_uid != os.geteuid()
            else f"it has {st.st_nlink} hard links"
            if st.st_nlink != 1
            else None
        )
        if problem is not None:
            os.close(fd)
            raise DiscoveryError(self._unsafe(problem))
        return fd

    def _unsafe(self, why: str) -> str:
        return (
            f"the drill lock file {self.path} for {self.job} is not safe to use: {why}; "
            "nothing was written to it. Remove it (someone may have planted it), or set "
            "RECOVERYGATE_LOCK_DIR to a folder only you can write"
        )

    def _write_holder(self, fd: int) -> None:
        data = json.dumps(
            {"pid": os.getpid(), "config": self.config_path, "job": self.job}
        ).encode()
        with contextlib.suppress(OSError):  # a read-only descriptor: the message is vaguer
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)

    def _busy_message(self, holder: dict[str, object]) -> str:
        pid = holder.get("pid")
        pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else "unknown"
        config = _shown(holder.get("config", "unknown"))
        return (
            f"another drill (pid {pid}, config {config}) is already running against "
            f"{self.job}; wait for it or stop it (lock file {self.path})"
        )


def _shown(value: object) -> str:
    """The holder's text as the message shows it: printable, one line, bounded."""
    text = str(value)[:_HOLDER_TEXT]
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _read_holder(fd: int) -> dict[str, object]:
    try:
        data = os.pread(fd, 4096, 0)
        holder = json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}
