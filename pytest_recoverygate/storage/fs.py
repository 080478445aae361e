"""The storage layer: a FUSE passthrough over one folder that fails, holds or delays the
file operations a fault names, on the drill's command. A process of its own::

    python -m pytest_recoverygate.storage.fs FOLDER --root-fd N --events-fd M --fsname NAME

It is mounted over ``FOLDER`` itself, so the job keeps every file it had there (``N`` is a
descriptor of the folder opened before the mount covered it, and every operation is
done below that descriptor, one name at a time, never following a link: a job that plants
``ckpt -> /etc`` cannot make this root process write to ``/etc``). Healthy, it passes
every operation through and reports the files the job writes, renames and removes (the
drill's audit of which files a checkpoint is made of). Armed, it acts on the operations
:func:`~pytest_recoverygate.storage.wire.ops_hit` names:

- ``enospc``: a full file system, as ext4 behaves when full and another writer keeps it
  full: no free block (``free`` bytes, 0 by default; what the job frees by removing or
  truncating files is taken at once); a write that does not fit writes what fits (a short
  write) and the next one fails ENOSPC; fallocate and mkdir need blocks; creating an
  empty file, renaming, removing and truncating work; ``statfs`` shows no free block.
  ``tests/storage/test_storage_layer.py`` holds the same operations against a real full
  ext4 to this model.
- ``eio``: the operations fail with EIO.
- ``readonly``: the kernel's own: the layer does every operation below a read-only clone
  of the folder (``open_tree`` + ``mount_setattr(MOUNT_ATTR_RDONLY)``: a bind mount no
  namespace shows, freed with its descriptor), so each write meets the VFS's own EROFS,
  and the layer sees and reports it (a read-only mount *over* the folder would refuse
  them before the layer saw them); dropped when lifted.
- ``stall``: every operation waits, neither failing nor progressing, until lifted (a stuck
  network file system); a caller blocked here dies only of SIGKILL or of a signal it does
  not handle (as on a hard NFS mount).
- ``latency``: each of the operations waits ``latency`` seconds first.

End of the command pipe (the drill is gone, however it died) lifts the fault, unmounts
the folder and ends this process: nothing outlives the drill but a lazy unmount whose
last open file the job still holds.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import errno
import faulthandler
import functools
import json
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import mfusepy

from pytest_recoverygate.storage.wire import MAX_EVENTS, MAX_LINE, MODES, ops_hit

__all__ = ["BLOCK", "Layer", "main"]

#: The block size of the modelled file system (ext4's default).
BLOCK = 4096
#: Seconds between looks, while an operation is held, at whether its caller was signalled.
STALL_POLL = 0.05
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MS_SHARED = 1 << 20
_OPEN_TREE_CLONE, _AT_EMPTY_PATH, _MOUNT_ATTR_RDONLY = 1, 0x1000, 0x1
_SYS_OPEN_TREE, _SYS_MOUNT_SETATTR = 428, 442  # the same number on every architecture
_MNT_DETACH = 2
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_Op = TypeVar("_Op", bound=Callable[..., Any])


def _blocks(size: int) -> int:
    return -(-size // BLOCK)


@dataclass(slots=True)
class _Handle:
    """An open file: where it is, and what the job wrote through it."""

    path: str
    fd: int
    written: int = 0  # bytes written through this handle
    first_write: float | None = None


@dataclass(frozen=True, slots=True)
class _Fault:
    mode: str
    during: str
    latency: float
    free: int
    ops: frozenset[str]


class _Events:
    """The event pipe: one JSON line an event, at most MAX_EVENTS of each kind."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._sent: dict[str, int] = {}
        self.dropped = 0

    def send(self, ev: str, **fields: Any) -> None:
        with self._lock:
            count = self._sent.get(ev, 0)
            if count >= MAX_EVENTS and ev not in ("lifted", "exit", "armed", "ready"):
                self.dropped += 1
                return
            self._sent[ev] = count + 1
            line = json.dumps({"ev": ev, "t": round(time.time(), 6), **fields}) + "\n"
            with contextlib.suppress(OSError):  # the drill is gone: nothing to tell
                os.write(self._fd, line.encode()[:MAX_LINE])


def _refusals(op: str) -> Callable[[_Op], _Op]:
    """readonly: report each EROFS the kernel gave this operation (the VFS refuses it
    below the layer, so the layer sees the error, not the fault)."""

    def wrap(method: _Op) -> _Op:
        @functools.wraps(method)
        def run(self: Layer, path: str, *args: Any) -> Any:
            try:
                return method(self, path, *args)
            except OSError as exc:
                if exc.errno == errno.EROFS and self._ro_root is not None:
                    self._failed(op, path, errno.EROFS)
                raise

        return run  # type: ignore[return-value]

    return wrap


class Layer(mfusepy.Operations):  # type: ignore[misc]
    """The passthrough file system with its fault."""

    use_ns = True

    def __init__(self, root: int, mountpoint: str, events: _Events) -> None:
        self.root = root
        self.mountpoint = mountpoint
        self.events = events
        self._lock = threading.Lock()
        self._fault: _Fault | None = None
        self._released = threading.Event()
        self._released.set()
        self._free = 0
        self._handles: dict[int, _Handle] = {}
        self._next = 1
        self._ro_root: int | None = None  # readonly: a read-only clone of the folder
        self.failed = 0
        self.stalled = 0
        self.delayed = 0

    # ------------------------------------------------------------ the fault

    def arm(self, mode: str, during: str, latency: float, free: int) -> str | None:
        """Arm the fault; the reason when it cannot be."""
        if mode not in MODES:
            return f"unknown mode {mode!r}"
        with self._lock:
            self._fault = _Fault(mode, during, latency, max(free, 0), ops_hit(mode, during))
            self._free = max(free, 0)
            if mode == "stall":
                self._released.clear()
        if mode == "readonly":
            try:
                self._ro_root = _readonly_clone(self.root)
            except OSError as exc:
                self.lift()
                return f"a read-only clone of the folder: {exc.strerror or exc}"
        self.events.send("armed", mode=mode, during=during)
        return None

    def lift(self) -> None:
        with self._lock:
            was = self._fault
            self._fault = None
            self._released.set()
            ro, self._ro_root = self._ro_root, None
        if ro is not None:
            os.close(ro)
        if was is not None:
            self.events.send(
                "lifted", failed=self.failed, stalled=self.stalled, delayed=self.delayed
            )

    def _gate(self, op: str, path: str) -> _Fault | None:
        """Before an operation: hold it (stall), delay it (latency) or fail it (eio). The
        armed fault, for the operations that account for it (enospc)."""
        fault = self._fault
        if fault is None:
            return None
        if fault.mode == "stall":
            with self._lock:
                self.stalled += 1
                first = self.stalled == 1
            if first:
                self._note("stalled", op, path)
            # Held until lifted, but interruptible as a hard NFS mount is killable: a
            # signal to the caller (the kernel's FUSE_INTERRUPT) ends this wait with EINTR,
            # so SIGKILL kills it (without this the kernel waits for the answer in D state).
            while not self._released.wait(STALL_POLL):
                if _interrupted():
                    raise OSError(errno.EINTR, os.strerror(errno.EINTR))
            return None
        if op not in fault.ops:
            return fault
        if fault.mode == "latency":
            with self._lock:
                self.delayed += 1
                first = self.delayed == 1
            if first:
                self._note("delayed", op, path)
            time.sleep(fault.latency)
            return fault
        if fault.mode == "eio":
            self._fail(op, path, errno.EIO)
        return fault

    def _fail(self, op: str, path: str, code: int) -> None:
        self._failed(op, path, code)
        raise OSError(code, os.strerror(code))

    def _failed(self, op: str, path: str, code: int) -> None:
        with self._lock:
            self.failed += 1
        self._note("failed", op, path, errno=errno.errorcode.get(code, str(code)))

    def _note(self, ev: str, op: str, path: str, **fields: Any) -> None:
        self.events.send(ev, op=op, path=path.lstrip("/"), pid=_caller(), **fields)

    # ------------------------------------------------------------ paths

    @contextlib.contextmanager
    def _at(self, path: str) -> Iterator[tuple[int, str]]:
        """(descriptor of the parent folder, last name) of ``path``, walked from the root
        one name at a time without following a link; ``(root, ".")`` for the root."""
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise OSError(errno.EINVAL, "no . or .. here")
        if not parts:
            yield self._root(), "."
            return
        fd = os.open(".", _DIR, dir_fd=self._root())
        try:
            for name in parts[:-1]:
                nxt = os.open(name, _DIR, dir_fd=fd)
                os.close(fd)
                fd = nxt
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def _root(self) -> int:
        """The folder the operations are done below: its read-only clone while readonly
        is armed."""
        ro = self._ro_root
        return ro if ro is not None else self.root

    def _handle(self, fh: int) -> _Handle:
        handle = self._handles.get(fh)
        if handle is None:
            raise OSError(errno.EBADF, "unknown handle")
        return handle

    def _keep(self, path: str, fd: int) -> int:
        with self._lock:
            fh = self._next
            self._next += 1
            self._handles[fh] = _Handle(path, fd)
        return fh

    # ------------------------------------------------------------ reading

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        self._gate("getattr", path)
        if fh is not None and fh in self._handles:
            st = os.fstat(self._handles[fh].fd)
        else:
            with self._at(path) as (parent, name):
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        return _attrs(st)

    def readlink(self, path: str) -> str:
        self._gate("readlink", path)
        with self._at(path) as (parent, name):
            return os.readlink(name, dir_fd=parent)

    def opendir(self, path: str) -> int:
        self._gate("opendir", path)
        with self._at(path) as (parent, name):
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
        return self._keep(path, fd)

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        self._gate("readdir", path)
        handle = self._handle(fh)
        here = {"st_mode": stat.S_IFDIR}
        out = [(".", here, 0), ("..", here, 0)]
        with os.scandir(handle.fd) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                out.append((entry.name, {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0))
        return out

    def releasedir(self, path: str, fh: int) -> int:
        handle = self._handles.pop(fh, None)
        if handle is not None:
            os.close(handle.fd)
        return 0

    @_refusals("open")
    def open(self, path: str, flags: int) -> int:
        self._gate("open", path)
        with self._at(path) as (parent, name):
            before = 0
            if flags & os.O_TRUNC:
                with contextlib.suppress(OSError):
                    before = os.stat(name, dir_fd=parent, follow_symlinks=False).st_size
            fd = os.open(name, (flags & ~os.O_CREAT) | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        self._cut(path, before, 0)
        return self._keep(path, fd)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        handle = self._handle(fh)
        self._gate("read", handle.path)
        return os.pread(handle.fd, size, offset)

    def statfs(self, path: str) -> dict[str, int]:
        self._gate("statfs", path)
        sv = os.fstatvfs(self.root)
        out = {
            key: getattr(sv, key)
            for key in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_namemax",
            )
        }
        fault = self._fault
        if fault is not None and fault.mode == "enospc":
            free = self._free // max(sv.f_frsize, 1)
            out["f_bfree"] = out["f_bavail"] = free
        return out

    def access(self, path: str, amode: int) -> int:
        self._gate("access", path)
        with self._at(path) as (parent, name):
            if not os.access(name, amode, dir_fd=parent, follow_symlinks=False):
                raise OSError(errno.EACCES, "access")
        return 0

    # ------------------------------------------------------------ writing

    @_refusals("create")
    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        self._gate("create", path)
        with self._at(path) as (parent, name):
            fd = os.open(
                name,
                (flags | os.O_CREAT) | os.O_NOFOLLOW | os.O_CLOEXEC,
                mode & 0o7777,
                dir_fd=parent,
            )
        return self._keep(path, fd)

    @_refusals("write")
    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        handle = self._handle(fh)
        fault = self._gate("write", handle.path)
        if fault is not None and fault.mode == "enospc":
            data = self._fit(handle, data, offset)
        written = os.pwrite(handle.fd, data, offset)
        if handle.first_write is None:
            handle.first_write = time.time()
        handle.written += written
        return written

    def _fit(self, handle: _Handle, data: bytes, offset: int) -> bytes:
        """enospc: the part of a write the free blocks hold (a short write), or ENOSPC."""
        size = os.fstat(handle.fd).st_size
        with self._lock:
            have = _blocks(size) + self._free // BLOCK  # blocks this file may fill
            end = offset + len(data)
            need = _blocks(end) - _blocks(size)
            if need <= 0 or need * BLOCK <= self._free:
                self._free -= max(need, 0) * BLOCK
                return data
            room = have * BLOCK - offset
            if room > 0:
                self._free -= (_blocks(offset + room) - _blocks(size)) * BLOCK
                return data[:room]
        self._fail("write", handle.path, errno.ENOSPC)
        raise AssertionError  # unreachable: _fail raised

    def _cut(self, path: str, before: int, after: int) -> None:
        """A file's contents were cut from ``before`` bytes to ``after`` (its blocks go to
        the other writer under enospc: nothing is given back)."""
        if after < before:
            self.events.send("truncated", path=path.lstrip("/"), size=after, pid=_caller())

    @_refusals("truncate")
    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._gate("truncate", path)  # growing takes no block (a sparse file), shrinking frees
        if fh is not None and fh in self._handles:
            fd, close = self._handles[fh].fd, False
        else:
            with self._at(path) as (parent, name):
                fd, close = os.open(name, os.O_WRONLY | os.O_NOFOLLOW, dir_fd=parent), True
        try:
            before = os.fstat(fd).st_size
            os.ftruncate(fd, length)
            self._cut(path, before, length)
        finally:
            if close:
                os.close(fd)
        return 0

    @_refusals("fallocate")
    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        handle = self._handle(fh)
        fault = self._gate("fallocate", handle.path)
        if fault is not None and fault.mode == "enospc":
            current = os.fstat(handle.fd).st_size
            need = _blocks(offset + size) - _blocks(current)
            with self._lock:
                fits = need * BLOCK <= self._free
                if fits:
                    self._free -= max(need, 0) * BLOCK
            if not fits:
                self._fail("fallocate", handle.path, errno.ENOSPC)
        os.posix_fallocate(handle.fd, offset, size)
        return 0

    @_refusals("fsync")
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        handle = self._handle(fh)
        self._gate("fsync", handle.path)
        (os.fdatasync if datasync else os.fsync)(handle.fd)
        return 0

    @_refusals("fsyncdir")
    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        handle = self._handle(fh)
        self._gate("fsyncdir", handle.path)
        os.fsync(handle.fd)
        return 0

    def flush(self, path: str, fh: int) -> int:
        self._gate("flush", path)
        return 0

    def release(self, path: str, fh: int) -> int:
        handle = self._handles.pop(fh, None)
        if handle is None:
            return 0
        try:
            size = os.fstat(handle.fd).st_size
        except OSError:
            size = -1
        os.close(handle.fd)
        if handle.written:
            self.events.send(
                "wrote",
                path=handle.path.lstrip("/"),
                bytes=handle.written,
                size=size,
                first=round(handle.first_write or 0.0, 6),
                pid=_caller(),
            )
        return 0

    @_refusals("mkdir")
    def mkdir(self, path: str, mode: int) -> int:
        fault = self._gate("mkdir", path)
        if fault is not None and fault.mode == "enospc":
            with self._lock:
                fits = self._free >= BLOCK
                if fits:
                    self._free -= BLOCK
            if not fits:
                self._fail("mkdir", path, errno.ENOSPC)
        with self._at(path) as (parent, name):
            os.mkdir(name, mode & 0o7777, dir_fd=parent)
        return 0

    @_refusals("unlink")
    def unlink(self, path: str) -> int:
        self._gate("unlink", path)
        with self._at(path) as (parent, name):
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            os.unlink(name, dir_fd=parent)
        self.events.send(
            "removed", path=path.lstrip("/"), folder=stat.S_ISDIR(st.st_mode), pid=_caller()
        )
        return 0

    @_refusals("rmdir")
    def rmdir(self, path: str) -> int:
        self._gate("rmdir", path)
        with self._at(path) as (parent, name):
            os.rmdir(name, dir_fd=parent)
        self.events.send("removed", path=path.lstrip("/"), folder=True, pid=_caller())
        return 0

    @_refusals("rename")
    def rename(self, old: str, new: str) -> int:
        self._gate("rename", old)
        with self._at(old) as (src, a), self._at(new) as (dst, b):
            replaced: os.stat_result | None = None
            with contextlib.suppress(FileNotFoundError):
                replaced = os.stat(b, dir_fd=dst, follow_symlinks=False)
            os.rename(a, b, src_dir_fd=src, dst_dir_fd=dst)
        self.events.send(
            "renamed",
            path=old.lstrip("/"),
            to=new.lstrip("/"),
            replaced=replaced is not None,
            pid=_caller(),
        )
        return 0

    @_refusals("symlink")
    def symlink(self, target: str, source: str) -> int:
        self._gate("symlink", target)
        with self._at(target) as (parent, name):
            os.symlink(source, name, dir_fd=parent)
        self.events.send(
            "wrote",
            path=target.lstrip("/"),
            bytes=0,
            size=0,
            link=source[:512],
            first=round(time.time(), 6),
            pid=_caller(),
        )
        return 0

    @_refusals("link")
    def link(self, target: str, source: str) -> int:
        self._gate("link", target)
        with self._at(source) as (sp, sname), self._at(target) as (tp, tname):
            os.link(sname, tname, src_dir_fd=sp, dst_dir_fd=tp, follow_symlinks=False)
        return 0

    @_refusals("chmod")
    def chmod(self, path: str, mode: int) -> int:
        self._gate("chmod", path)
        with self._at(path) as (parent, name):
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=parent)
        try:
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                return 0  # a link has no mode of its own
            os.chmod(f"/proc/self/fd/{fd}", mode & 0o7777)
        finally:
            os.close(fd)
        return 0

    @_refusals("chown")
    def chown(self, path: str, uid: int, gid: int) -> int:
        self._gate("chown", path)
        with self._at(path) as (parent, name):
            os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
        return 0

    @_refusals("utimens")
    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._gate("utimens", path)
        with self._at(path) as (parent, name):
            if times is None:
                os.utime(name, dir_fd=parent, follow_symlinks=False)
            else:
                os.utime(name, ns=times, dir_fd=parent, follow_symlinks=False)
        return 0


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def _readonly_clone(root: int) -> int:
    """A descriptor of a read-only bind mount of the folder ``root``, attached nowhere
    (Linux 5.12+: open_tree and mount_setattr)."""
    fd = int(
        _LIBC.syscall(_SYS_OPEN_TREE, root, b"", _OPEN_TREE_CLONE | _AT_EMPTY_PATH | os.O_CLOEXEC)
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    attr = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
    if (
        _LIBC.syscall(
            _SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)
        )
        != 0
    ):
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, os.strerror(err))
    return fd


def _attrs(st: os.stat_result) -> dict[str, Any]:
    return {
        "st_mode": st.st_mode,
        "st_ino": st.st_ino,
        "st_nlink": st.st_nlink,
        "st_uid": st.st_uid,
        "st_gid": st.st_gid,
        "st_size": st.st_size,
        "st_blocks": st.st_blocks,
        "st_blksize": st.st_blksize,
        "st_atime": st.st_atime_ns,
        "st_mtime": st.st_mtime_ns,
        "st_ctime": st.st_ctime_ns,
        "st_rdev": st.st_rdev,
    }


_fuse_interrupted = mfusepy._libfuse.fuse_interrupted
_fuse_interrupted.restype = ctypes.c_int
_fuse_interrupted.argtypes = ()


def _interrupted() -> bool:
    """Whether the kernel interrupted the request this thread is answering."""
    try:
        return bool(_fuse_interrupted())
    except Exception:
        return False


def _caller() -> int:
    try:
        return int(mfusepy.fuse_get_context()[2])
    except Exception:
        return 0


def _unescape(text: str) -> str:
    return (
        text.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def _commands(layer: Layer, mountpoint: str) -> None:
    """Read the drill's commands until ``exit`` or the end of the pipe, then unmount."""
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline(MAX_LINE + 1)
        if not line:
            break
        try:
            cmd = json.loads(line)
        except ValueError:
            continue
        if not isinstance(cmd, dict):
            continue
        what = cmd.get("cmd")
        if what == "arm":
            problem = layer.arm(
                str(cmd.get("mode")),
                str(cmd.get("during", "save")),
                float(cmd.get("latency") or 0.0),
                int(cmd.get("free") or 0),
            )
            if problem is not None:
                layer.events.send("exit", error=problem, dropped=layer.events.dropped)
        elif what == "lift":
            layer.lift()
        elif what == "exit":
            break
    layer.lift()
    # Unmount: the FUSE loop ends when the kernel drops the connection. A folder still in
    # use (the job holds a file open in it) is detached lazily: gone from every path now,
    # served until its last file is closed.
    target = mountpoint.encode()
    if _LIBC.umount2(target, 0) != 0:
        _LIBC.umount2(target, _MNT_DETACH)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_recoverygate.storage.fs")
    parser.add_argument("mountpoint")
    parser.add_argument("--root-fd", type=int, required=True)
    parser.add_argument("--events-fd", type=int, required=True)
    parser.add_argument("--fsname", required=True)
    args = parser.parse_args(argv)
    # SIGUSR1: every thread's stack on stderr (the drill asks before it kills a layer that
    # did not exit, and keeps the answer for its message)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    events = _Events(args.events_fd)
    layer = Layer(args.root_fd, args.mountpoint, events)
    ready = threading.Thread(
        target=_wait_mounted, args=(args.mountpoint, args.fsname, events), daemon=True
    )
    ready.start()
    reader = threading.Thread(target=_commands, args=(layer, args.mountpoint), daemon=True)
    reader.start()
    try:
        mfusepy.FUSE(
            layer,
            args.mountpoint,
            foreground=True,
            nothreads=False,
            allow_other=True,
            default_permissions=True,
            fsname=args.fsname,
            subtype="recoverygate",
            hard_remove=True,
            use_ino=True,
            attr_timeout=0,
            entry_timeout=0,
            negative_timeout=0,
            max_threads=64,
        )
    except RuntimeError as exc:
        events.send("exit", error=f"the FUSE mount failed: {exc}", dropped=events.dropped)
        return 1
    events.send("exit", dropped=events.dropped, failed=layer.failed, stalled=layer.stalled)
    return 0


def _wait_mounted(mountpoint: str, fsname: str, events: _Events) -> None:
    """Say ``ready`` once this layer's mount is the folder's newest (at most 10 s)."""
    deadline = time.monotonic() + 10.0
    target = os.path.realpath(mountpoint)
    while time.monotonic() < deadline:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            rows = [line.split() for line in handle]
        mine = [r for r in rows if len(r) > 9 and _unescape(r[4]) == target and fsname in r[-2:]]
        if mine:
            # Shared: mount namespaces made from this one later (the local backend's
            # nodes, which copy it as slaves) see the read-only bind and the unmount too.
            _LIBC.mount(None, mountpoint.encode(), None, _MS_SHARED, None)
            events.send("ready", mount=int(mine[-1][0]))
            return
        time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main())
