"""The drill's side of the storage layer: mount it over the job's checkpoint folder, arm
and lift the fault, hand its events to the engine, read files back (the audit), unmount.

:class:`StorageLayer` starts ``python -m pytest_recoverygate.storage.fs`` over exactly the
folder it is given (a descriptor of the folder, opened before the mount covers it, is
the layer's only way to the job's files), talks to it over two pipes
(:mod:`~pytest_recoverygate.storage.wire`), and on :meth:`StorageLayer.close` lifts the
fault, asks the layer to unmount and to exit, and checks that no mount of its own is left
at the folder. The layer itself unmounts when its command pipe closes, so a drill that
dies however it dies takes its fault and its mount with it; if both are killed at once,
the owner record this module keeps in the drill lock folder (``flock``-held while the
drill runs) lets ``recoverygate sweep`` (:func:`sweep`) unmount what is left.

Refused, before anything is mounted (:func:`folder_problem`): a path that is not an
existing folder, ``/`` or a system folder, and a folder a storage layer already covers.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_recoverygate.engine.model import StorageEvent, StorageEventKind
from pytest_recoverygate.errors import BackendError
from pytest_recoverygate.shared.lock import lock_dir, same_file
from pytest_recoverygate.storage.wire import MAX_LINE, MODES, command, parse_event

__all__ = [
    "FSTYPE",
    "RECORD_PREFIX",
    "StorageLayer",
    "StorageSweep",
    "folder_problem",
    "our_mounts",
    "sweep",
]

#: The file system type the layer's mounts show in /proc/self/mountinfo.
FSTYPE = "fuse.recoverygate"
RECORD_PREFIX = "recoverygate-storage-"
READY_TIMEOUT = 15.0  # seconds for the layer to mount
ANSWER_TIMEOUT = 10.0  # seconds for the layer to answer arm/lift
EXIT_TIMEOUT = 5.0  # seconds for the layer to unmount and exit (again after the copies)
COPY_ROUNDS = 5  # rounds of unmounting copies of the mount in other namespaces, at most
COPY_WAIT = 2.0  # seconds for the layer to exit after a round that unmounted some
AUDIT_BUDGET = 1 << 30  # bytes the audit reads back in all; past it, sizes only
_ID = re.compile(r"[0-9a-f]{16}")
_RECORD_BYTES = 4096
#: Folders a fault must never cover (nor anything below the first group).
_SYSTEM_TREES = (
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/run",
    "/var/lib",
    "/var/run",
    "/snap",
)
_SYSTEM_ROOTS = (
    "/",
    "/home",
    "/root",
    "/tmp",
    "/var",
    "/var/tmp",
    "/opt",
    "/srv",
    "/mnt",
    "/media",
    "/work",
)
_KINDS = {
    "failed": StorageEventKind.FAILED,
    "stalled": StorageEventKind.STALLED,
    "delayed": StorageEventKind.DELAYED,
    "wrote": StorageEventKind.WROTE,
    "renamed": StorageEventKind.RENAMED,
    "removed": StorageEventKind.REMOVED,
    "truncated": StorageEventKind.TRUNCATED,
}


def folder_problem(path: str | Path) -> str | None:
    """Why a StorageFault may not cover ``path``, or None: it must be an existing folder
    (links resolved), not ``/``, a system folder or one of the shared roots, and not
    already covered by a storage layer."""
    text = str(path)
    if not os.path.isabs(text):
        return f"{text} is not an absolute path"
    try:
        real = os.path.realpath(text, strict=True)
    except OSError as exc:
        return f"{text} does not exist ({exc.strerror})"
    if not os.path.isdir(real):
        return f"{text} is not a folder"
    if real in _SYSTEM_ROOTS or any(
        real == tree or real.startswith(tree + "/") for tree in _SYSTEM_TREES
    ):
        return f"{text} is {'/' if real == '/' else 'a system folder'} ({real})"
    if any(target == real for target, _ in our_mounts()):
        return f"{text} is already covered by a storage layer (another drill's?)"
    return None


def our_mounts() -> list[tuple[str, str]]:
    """(mount point, source) of every storage-layer mount in this mount namespace."""
    out = []
    with (
        contextlib.suppress(OSError),
        open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle,
    ):
        for line in handle:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) > 4 and len(tail) > 1 and tail[0] == FSTYPE:
                out.append((_unescape(fields[4]), tail[1]))
    return out


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


@dataclass
class _Record:
    """This drill's owner record of its layer (``flock``-held while it runs)."""

    path: Path
    fd: int

    def write(self, data: dict[str, Any]) -> None:
        text = json.dumps(data).encode()[:_RECORD_BYTES]
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text, 0)

    def release(self, *, done: bool) -> None:
        if self.fd < 0:
            return
        if done:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self.fd)
        self.fd = -1


def _claim(layer_id: str) -> _Record:
    where = lock_dir()
    path = where / f"{RECORD_PREFIX}{layer_id}.json"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise BackendError(
            f"the storage layer's owner record {path} could not be made: {exc}"
        ) from None
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return _Record(path, fd)


class StorageLayer:
    """One storage layer over one checkpoint folder, for one drill (see the module).

    ``wakeup`` is called when an event arrives (the runner's, to react at once).
    """

    def __init__(self, folder: str | Path, *, wakeup: Callable[[], None] | None = None) -> None:
        self.folder = os.path.realpath(str(folder))
        self.id = secrets.token_hex(8)
        self.fsname = f"recoverygate-{self.id}"
        self._wakeup = wakeup
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd = -1
        self._record: _Record | None = None
        self._events: list[StorageEvent] = []
        self._answers: list[dict[str, Any]] = []
        self._lock = threading.Condition()
        self._reader: threading.Thread | None = None
        self._stderr_reader: threading.Thread | None = None
        self._stderr = b""
        self.mounted = False
        self.armed = False
        #: What :meth:`close` did beyond the plan and undid (copies of the mount that other
        #: tools' mount namespaces took): for the drill's timeline, not failures.
        self.notes: list[str] = []

    # ------------------------------------------------------------------ mount

    def mount(self) -> None:
        """Mount the layer over the folder; raises BackendError when it cannot be."""
        problem = folder_problem(self.folder)
        if problem is not None:
            raise BackendError(f"the storage fault cannot cover {self.folder}: {problem}")
        self._record = _claim(self.id)
        root = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        read, write = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pytest_recoverygate.storage.fs",
                    self.folder,
                    "--root-fd",
                    str(root),
                    "--events-fd",
                    str(write),
                    "--fsname",
                    self.fsname,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(root, write),
                start_new_session=True,
                cwd="/",
            )
        finally:
            os.close(root)
            os.close(write)
        with contextlib.suppress(OSError):
            self._pidfd = os.pidfd_open(self._proc.pid)
        info = os.stat(self.folder)
        self._record.write(
            {
                "layer": self.id,
                "folder": self.folder,
                "fsname": self.fsname,
                "pid": self._proc.pid,
                "start": _start_ticks(self._proc.pid),
                "drill": os.getpid(),
                "folderId": [info.st_dev, info.st_ino],
            }
        )
        self._reader = threading.Thread(
            target=self._read, args=(os.fdopen(read, "rb"),), name="storage-layer", daemon=True
        )
        self._reader.start()
        self._stderr_reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_reader.start()
        answer = self._await(("ready", "exit"), READY_TIMEOUT)
        if answer is None or answer["ev"] != "ready":
            why = (answer or {}).get("error") or self._stderr_text() or "no answer"
            self.close()
            raise BackendError(f"the storage layer could not mount {self.folder}: {why}")
        self.mounted = True

    def _read(self, stream: Any) -> None:
        with stream:
            self._read_lines(stream)
        with self._lock:
            self._answers.append({"ev": "exit", "t": time.time(), "error": "the layer ended"})
            self._lock.notify_all()

    def _read_lines(self, stream: Any) -> None:
        for line in stream:
            event = parse_event(line[:MAX_LINE].rstrip(b"\n"))
            if event is None:
                continue
            kind = _KINDS.get(event["ev"])
            with self._lock:
                if kind is None:
                    self._answers.append(event)
                else:
                    self._events.append(_storage_event(kind, event))
                self._lock.notify_all()
            if self._wakeup is not None:
                self._wakeup()

    def _drain_stderr(self) -> None:
        proc = self._proc
        if proc is None or proc.stderr is None:
            return
        with proc.stderr as stream:
            for chunk in iter(lambda: os.read(stream.fileno(), 4096), b""):
                self._stderr = (self._stderr + chunk)[-4096:]

    def _stderr_text(self) -> str:
        lines = [
            line
            for line in self._stderr.decode("utf-8", "replace").splitlines()
            if line.strip() and "max threads" not in line
        ]
        return lines[-1][:300] if lines else ""

    def _await(self, kinds: tuple[str, ...], timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for i, answer in enumerate(self._answers):
                    if answer["ev"] in kinds:
                        return self._answers.pop(i)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)

    def _send(self, line: bytes) -> bool:
        proc = self._proc
        if proc is None or proc.stdin is None:
            return False
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
        except (OSError, ValueError):
            return False
        return True

    # ------------------------------------------------------------------ the fault

    def arm(self, mode: str, during: str, latency: float | None = None, free: int = 0) -> float:
        """Arm the fault; the time it took effect. Raises BackendError when it did not."""
        if mode not in MODES:
            raise BackendError(f"unknown storage fault mode {mode!r}")
        if not self.mounted or not self._send(
            command("arm", mode=mode, during=during, latency=latency or 0.0, free=free)
        ):
            raise BackendError(f"the storage layer over {self.folder} is not running")
        answer = self._await(("armed", "exit"), ANSWER_TIMEOUT)
        if answer is None or answer["ev"] != "armed":
            why = (answer or {}).get("error") or "no answer"
            raise BackendError(f"the {mode} fault could not be armed on {self.folder}: {why}")
        self.armed = True
        return float(answer["t"])

    def lift(self) -> float | None:
        """Lift the fault (idempotent); the time it was lifted, None when nothing was armed
        or the layer did not answer (cleanup unmounts it anyway)."""
        if not self.armed:
            return None
        self.armed = False
        if not self._send(command("lift")):
            return None
        answer = self._await(("lifted", "exit"), ANSWER_TIMEOUT)
        return float(answer["t"]) if answer is not None and answer["ev"] == "lifted" else None

    def events(self) -> list[StorageEvent]:
        """The layer's events since the last call, oldest first. Never blocks."""
        with self._lock:
            out, self._events = self._events, []
        return out

    # ------------------------------------------------------------------ the audit

    def audit(self, plan: Iterable[tuple[str, int | None]]) -> list[StorageEvent]:
        """Read back each ``(file, size it had)`` of ``plan`` below the folder, never
        through a link; a size of None is a small file read for its text."""
        out: list[StorageEvent] = []
        budget = AUDIT_BUDGET
        try:
            root = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            return [
                StorageEvent(
                    StorageEventKind.AUDIT,
                    time.time(),
                    ".",
                    detail="unreadable",
                    error=exc.strerror or str(exc),
                )
            ]
        try:
            for name, size in plan:
                event, used = _read_back(root, name, size, budget)
                budget -= used
                out.append(event)
        finally:
            os.close(root)
        return out

    # ------------------------------------------------------------------ cleanup

    def close(self) -> str | None:
        """Lift, unmount, end the layer; what could not be done, or None (what it undid
        on the way is in :attr:`notes`). Idempotent."""
        proc = self._proc
        if proc is None:
            if self._record is not None:
                self._record.release(done=True)
                self._record = None
            return None
        self._proc = None
        problems: list[str] = []
        with contextlib.suppress(Exception):
            self.lift()
        self._send(command("exit"))
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            # A mount namespace made while the layer was mounted (another tool's unshare,
            # with private propagation) holds a copy of it: the layer serves it until that
            # copy goes. Unmount the copies of this layer's own mount there, then wait again.
            # Unmounted there, it is no failure of the cleanup: a note (the runner's
            # timeline); what is still left is a problem below. A container runtime
            # clones new namespaces from one that holds a copy (measured: containerd
            # starting pods beside a drill), so a copy can appear after a round: again.
            copies: list[str] = []
            for _ in range(COPY_ROUNDS):
                found = _unmount_copies(self.fsname)
                copies += [c for c in found if c not in copies]
                try:
                    proc.wait(EXIT_TIMEOUT if not found else COPY_WAIT)
                    break
                except subprocess.TimeoutExpired:
                    if not found:
                        break
            if copies:
                self.notes.append(
                    f"the storage layer's mount was copied into {len(copies)} other mount "
                    f"namespace(s) made while it was mounted ({', '.join(copies[:3])}); "
                    "unmounted there"
                )
        if proc.poll() is None:
            mounted = [t for t, source in our_mounts() if source == self.fsname]
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGUSR1)  # its threads' stacks, on its stderr
                time.sleep(0.5)
            stacks = " | ".join(
                line.strip()
                for line in self._stderr.decode("utf-8", "replace").splitlines()[-12:]
                if line.strip()
            )
            problems.append(
                f"the storage layer (pid {proc.pid}) did not exit in {EXIT_TIMEOUT:g}s "
                f"(still mounted: {', '.join(mounted) or 'nothing'}); killed"
                + (f"; its threads: {stacks[:1500]}" if stacks else "")
            )
            self._unmount_ours()
            self._kill(proc)
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        for thread in (self._reader, self._stderr_reader):
            if thread is not None:
                thread.join(EXIT_TIMEOUT)  # each closes its pipe once the layer is gone
        left = [target for target, source in our_mounts() if source == self.fsname]
        if left:
            self._unmount_ours()
            left = [target for target, source in our_mounts() if source == self.fsname]
        if left:
            problems.append(f"still mounted: {', '.join(left)}")
        if self._record is not None:
            self._record.release(done=not left)
            self._record = None
        self.mounted = False
        return "; ".join(problems) or None

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(EXIT_TIMEOUT)

    def _unmount_ours(self) -> None:
        """Detach every mount of this layer at the folder (its read-only bind too)."""
        for _ in range(4):
            mine = [t for t, source in our_mounts() if source == self.fsname and t == self.folder]
            if not mine:
                return
            _umount(self.folder, lazy=True)


def _unmount_copies(fsname: str) -> list[str]:
    """Lazily unmount this layer's mount (``fsname``) in every other mount namespace that
    holds a copy of it; the namespaces, as ``pid N (comm)``. Only a mount whose source is
    this layer's own name is touched."""
    mine = os.stat("/proc/self/ns/mnt").st_ino
    seen: set[int] = {mine}
    done: list[str] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(entry / "ns" / "mnt").st_ino
            if ns in seen:
                continue
            seen.add(ns)
            targets = [
                _unescape(left.split()[4])
                for left, _, right in (
                    line.partition(" - ") for line in (entry / "mountinfo").read_text().splitlines()
                )
                if right.split()[:2] == [FSTYPE, fsname]
            ]
            comm = (entry / "comm").read_text().strip()[:32]
        except (OSError, IndexError):
            continue
        for target in targets:
            subprocess.run(
                ["/usr/bin/nsenter", f"--mount=/proc/{entry.name}/ns/mnt", "--",
                 "/usr/bin/umount", "-l", target],
                capture_output=True,
                check=False,
                timeout=10,
            )  # fmt: skip
        if targets:
            done.append(f"pid {entry.name} ({comm})")
    return done


def _umount(target: str, *, lazy: bool) -> bool:
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return bool(libc.umount2(target.encode(), 2 if lazy else 0) == 0)


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _storage_event(kind: StorageEventKind, event: dict[str, Any]) -> StorageEvent:
    def text(key: str, limit: int = 1024) -> str:
        value = event.get(key)
        return value[:limit] if isinstance(value, str) else ""

    def number(key: str) -> int | None:
        value = event.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    first = event.get("first")
    detail = (
        "replaced" if event.get("replaced") is True else ("folder" if event.get("folder") else "")
    )
    link = text("link", 512)
    return StorageEvent(
        kind,
        float(event["t"]),
        path=text("path"),
        op=text("op", 32),
        error=text("errno", 32),
        pid=number("pid"),
        size=number("size"),
        first=float(first)
        if isinstance(first, (int, float)) and not isinstance(first, bool)
        else None,
        to=text("to"),
        detail=detail,
        content=link,
    )


def _read_back(root: int, name: str, size: int | None, budget: int) -> tuple[StorageEvent, int]:
    """One file of the audit: (its AUDIT event, bytes read)."""
    now = time.time()

    def result(
        detail: str, error: str = "", found: int | None = None, content: str = ""
    ) -> StorageEvent:
        return StorageEvent(
            StorageEventKind.AUDIT,
            now,
            name,
            detail=detail,
            error=error,
            size=found,
            content=content,
        )

    parts = [p for p in name.split("/") if p and p not in (".", "..")]
    if not parts:
        return result("refused", "not a file name"), 0
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=root)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(parts[-1], dir_fd=fd)
            return result("ok", found=0, content=target[:512]), 0
        if not stat.S_ISREG(st.st_mode):
            return result("refused", "not a regular file"), 0
        file = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except FileNotFoundError:
        os.close(fd)
        return result("missing"), 0
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return result("missing"), 0
        return result("unreadable", exc.strerror or str(exc)), 0
    os.close(fd)
    used = 0
    try:
        if size is None:
            data = os.read(file, 4096)
            text = data.decode("utf-8", "replace") if len(data) <= 256 else ""
            return result("ok", found=st.st_size, content=text), len(data)
        if st.st_size < size:
            return result("short", f"{st.st_size} of {size} bytes", found=st.st_size), 0
        while used < st.st_size and used < budget:
            chunk = os.read(file, 1 << 20)
            if not chunk:
                break
            used += len(chunk)
        if used < st.st_size and used < budget:
            return result("short", f"read {used} of {st.st_size} bytes", found=used), used
        return result("ok", found=st.st_size), used
    except OSError as exc:
        return result("unreadable", exc.strerror or str(exc), found=st.st_size), used
    finally:
        os.close(file)


# ---------------------------------------------------------------------- sweep


@dataclass
class StorageSweep:
    """What one sweep of storage layers found and did."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def sweep(*, dry_run: bool = False, directory: Path | None = None) -> StorageSweep:
    """Unmount what each storage layer of a drill that no longer runs left (its record
    is not locked), and end its layer process if it still runs; with ``dry_run``, only say
    what. Records locked by a running drill, and mounts no record names, are left alone."""
    report = StorageSweep()
    folder = directory or lock_dir()
    named: set[str] = set()
    for path in sorted(folder.glob(f"{RECORD_PREFIX}*.json")):
        layer_id = path.name[len(RECORD_PREFIX) : -len(".json")]
        if not _ID.fullmatch(layer_id):
            report.lines.append(f"{path}: not a record a drill writes; left alone")
            continue
        named.add(f"recoverygate-{layer_id}")
        _sweep_one(path, layer_id, report, dry_run=dry_run)
    for target, source in our_mounts():
        if source not in named:
            report.lines.append(
                f"storage layer mount {target} ({source}): no record in {folder} names it; "
                "left alone"
            )
    return report


def _sweep_one(path: Path, layer_id: str, report: StorageSweep, *, dry_run: bool) -> None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        report.lines.append(f"{path}: cannot be opened ({exc.strerror}); left alone")
        return
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1:
            report.lines.append(f"{path}: not a plain file of this user; left alone")
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report.lines.append(f"storage layer {layer_id}: its drill is running; left alone")
            return
        if not same_file(fd, path):
            return
        try:
            data = json.loads(os.pread(fd, _RECORD_BYTES, 0).decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            data = None
        fsname = f"recoverygate-{layer_id}"
        if not isinstance(data, dict) or data.get("fsname") != fsname:
            report.lines.append(f"{path}: not what a drill writes; left alone")
            return
        mounts = [t for t, source in our_mounts() if source == fsname]
        head = f"storage layer {layer_id} (its drill no longer runs)"
        if dry_run:
            report.lines.append(f"{head}: would unmount {', '.join(mounts) or 'nothing'}")
            return
        for target in mounts:
            for _ in range(4):
                if not any(t == target and s == fsname for t, s in our_mounts()):
                    break
                _umount(target, lazy=True)
        _end_layer(data)
        left = [t for t, source in our_mounts() if source == fsname]
        if left:
            report.problems.append(f"{head}: still mounted: {', '.join(left)}")
            return
        report.lines.append(f"{head}: unmounted {', '.join(mounts) or 'nothing (already gone)'}")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    finally:
        os.close(fd)


def _end_layer(data: dict[str, Any]) -> None:
    """SIGKILL the record's layer process, only if that pid is still the very process the
    record names (its start time) and runs our module."""
    pid, start = data.get("pid"), data.get("start")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or not isinstance(start, int):
        return
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if _start_ticks(pid) != start:
            return
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if b"pytest_recoverygate.storage.fs" not in handle.read():
                return
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        return
    finally:
        os.close(pidfd)
