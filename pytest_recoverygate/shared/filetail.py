"""Following a file that another process writes: the one hardened file tail.

Two backends read the job's progress from a file: SLURM from the job's output file (on
NFS or Lustre, written from another node, truncated by a requeue, rotated by a user), and
the local backend from the file an attached torchrun agent's stdout is redirected to.
:class:`OutputTail` follows such a file from a byte offset in a thread and hands every
new byte on exactly once, in bounded memory, surviving truncation, rewriting and rotation
(see its docstring). inotify (Linux, through ctypes) wakes it early where it works; the
poll interval still bounds the wait, because inotify does not see writes from other
nodes on network file systems.

The file's path is the job's, and the drill may run with more rights than the job (root
for node faults, a Slurm operator): every open is :func:`open_job_file`, which never
follows a symbolic link at the last component (``O_NOFOLLOW``), never blocks on a FIFO
(``O_NONBLOCK``), reads only a regular file (``S_ISREG`` after the open), and, when the
drill's user is not the job's, only a file the job's user owns (a hard link to a file of
root's, or of another user's, is refused). Every reopen is checked again, so a file
swapped after the drill started is caught at the next poll; a refusal is said once, with
its reason, through ``on_notice`` (the backends put it on the drill's timeline).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from pytest_recoverygate.shared.clock import Clock

__all__ = ["MARKER_LINE_KEEP", "READ_CHUNK", "OutputTail", "RefusedFile", "open_job_file"]


#: Largest single read of the output file: a backlog or a giant line is handed on in
#: pieces of this size, never loaded whole.
READ_CHUNK = 1024 * 1024
#: Bytes of the current unfinished line kept for ``on_line`` (what it looks for -- SLURM's
#: failure markers -- is short and ends its line, so a long line's last bytes matter).
MARKER_LINE_KEEP = 4096


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class RefusedFile(OSError):
    """The job's file is there, but the drill will not read it (the reason is the text)."""


def _owner_problem(st: os.stat_result, owner: int | None) -> str | None:
    """Why a file of ``st.st_uid`` must not be read for a job of ``owner``, or None.

    Reading as the job's own user gives nothing the job could not read itself, so the
    owner is checked only when the drill's user differs: then the file must be the job
    user's. Unknown owner: as root, a file root owns is refused (what a job would want
    read through the drill is root's: ``/etc/shadow``, a munge key).
    """
    euid = os.geteuid()
    if owner is None:
        if euid == 0 and st.st_uid == 0:
            return (
                "it is owned by root, and the drill runs as root without knowing the job's "
                "user (a job's output file is its user's)"
            )
        return None
    if owner not in (euid, st.st_uid):
        return (
            f"it is owned by uid {st.st_uid}, not by the job's user (uid {owner}), and the "
            f"drill runs as uid {euid}: a link to another user's file"
        )
    return None


def open_job_file(path: str, owner: int | None = None) -> tuple[BinaryIO, os.stat_result]:
    """Open a file a job controls for reading, safely; raise :class:`RefusedFile` if not.

    ``O_NOFOLLOW`` (a symbolic link is refused), ``O_NONBLOCK`` (a FIFO does not block
    the open), then ``fstat`` of what was opened: a regular file only, owned by ``owner``
    when the drill runs as another user (see :func:`_owner_problem`). OSError other than
    a refusal (not there) propagates.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EMLINK and os.path.islink(path)):
            raise RefusedFile(exc.errno, "it is a symbolic link (not followed)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
            raise RefusedFile(errno.EINVAL, f"it is {kind}, not a regular file")
        problem = _owner_problem(st, owner)
        if problem is not None:
            raise RefusedFile(errno.EPERM, problem)
        return open(fd, "rb", closefd=True), st
    except BaseException:
        os.close(fd)
        raise


class _Inotify:
    """Wakes the tail when something in the output file's folder changes (Linux).

    Watching the folder, not the file, sees the file being created, replaced (rotation)
    and written with one watch. Events for other files are read and ignored. Built on
    libc through ctypes (imported lazily); :meth:`open` returns None where that fails,
    and the tail simply polls.
    """

    IN_MODIFY = 0x00000002
    IN_ATTRIB = 0x00000004
    IN_CLOSE_WRITE = 0x00000008
    IN_MOVED_FROM = 0x00000040
    IN_MOVED_TO = 0x00000080
    IN_CREATE = 0x00000100
    IN_DELETE = 0x00000200
    IN_Q_OVERFLOW = 0x00004000
    IN_NONBLOCK = 0o4000
    IN_CLOEXEC = 0o2000000
    MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
    MASK |= IN_DELETE
    _EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (+ name)

    def __init__(self, fd: int, name: bytes) -> None:
        self.fd = fd
        self._name = name

    @classmethod
    def open(cls, path: str) -> _Inotify | None:
        if not sys.platform.startswith("linux"):
            return None
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            init1 = libc.inotify_init1
            add_watch = libc.inotify_add_watch
        except (OSError, AttributeError):
            return None
        init1.argtypes = [ctypes.c_int]
        init1.restype = ctypes.c_int
        add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        add_watch.restype = ctypes.c_int
        fd = init1(cls.IN_NONBLOCK | cls.IN_CLOEXEC)
        if fd < 0:
            return None
        absolute = os.path.abspath(path)
        if add_watch(fd, os.fsencode(os.path.dirname(absolute)), cls.MASK) < 0:
            os.close(fd)
            return None
        return cls(fd, os.fsencode(os.path.basename(absolute)))

    def drain(self) -> bool:
        """Read every pending event; True if one concerns the file (or events were lost)."""
        relevant = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, InterruptedError):
                return relevant
            except OSError:
                return True
            if not data:
                return relevant
            pos = 0
            while pos + self._EVENT.size <= len(data):
                _wd, mask, _cookie, length = self._EVENT.unpack_from(data, pos)
                start = pos + self._EVENT.size
                name = data[start : start + length].rstrip(b"\0")
                if mask & self.IN_Q_OVERFLOW or name == self._name:
                    relevant = True
                pos = start + length

    def close(self) -> None:
        os.close(self.fd)


@dataclass(eq=False)
class OutputTail:
    """Follow a file from a byte offset and hand its bytes on in order, in a thread.

    Every byte is handed to ``sink(chunk, received)`` once, in reads of at most
    :data:`READ_CHUNK`: partial lines are the sink's business (a
    :class:`~pytest_recoverygate.shared.events.StreamEventSource` keeps them per stream in
    bounded memory), so a giant line never sits in memory whole. ``on_line``, when given,
    gets the file's lines (SLURM looks there for its own failure markers); of an
    unfinished line only the last :data:`MARKER_LINE_KEEP` bytes are kept between reads.
    :meth:`seek_end` before :meth:`start` skips what the file already holds.

    Starts over from byte 0 when the file shrinks, its inode changes, or the bytes it
    already read are no longer there (truncated and rewritten past the offset between
    two polls, as a requeue without ``--open-mode=append`` does): the last bytes before
    the offset are compared at every poll, and after :meth:`restart` (SLURM: ``Restarts``
    incremented) the first bytes too, once the file changes. ``on_start_over`` is called
    first, so the sink can drop the partial line of the old content. On a new inode
    (rotation by rename), the old file is read to its end before the new one is started.
    A requeued job that appends (``--open-mode=append``) keeps the offset, so no event
    is read twice.

    The file is opened again at every poll (NFS close-to-open consistency: a handle
    kept open may not see other nodes' writes). Between polls the thread sleeps at most
    ``interval``; inotify (Linux) wakes it early when the file's folder changes. On NFS
    and Lustre inotify does not see writes from other nodes, so it only ever shortens
    the wait: the interval still bounds it.
    """

    _TAIL_CHECK = 64
    _HEAD_CHECK = 4096

    path: str
    sink: Callable[[bytes, float], object]
    clock: Clock
    _: KW_ONLY
    interval: float = 0.2
    on_line: Callable[[bytes, float], None] | None = None
    on_start_over: Callable[[], None] | None = None
    use_inotify: bool = True
    name: str = "recoverygate-tail"
    #: The job's user (uid): a file someone else owns is refused when the drill runs as
    #: another user (see :func:`open_job_file`); None: unknown.
    owner: int | None = None
    #: Told once per refusal why the file is not read (a symlink, a FIFO, the owner), and
    #: when it is read again.
    on_notice: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self._offset = 0
        self._inode: tuple[int, int] | None = None
        self._handle: BinaryIO | None = None  # the file as last read (drained on rotation)
        self._line = b""  # the end of the unfinished line, for on_line
        self._last_bytes = b""
        self._head = b""
        self._restart_requested = False
        self._verify_since: tuple[int, int] | None = None  # (mtime_ns, size) at restart()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # a pipe that cuts the wait short on stop()
        self.restarts = 0
        #: Why the file is not read now (None: it is, or it is not there yet).
        self.refused: str | None = None
        #: Whether the thread waits on inotify (False: polling only), once it has started.
        self.inotify = False

    def start(self) -> None:
        if self._thread is None:
            self._wake = os.pipe()
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    def restart(self) -> None:
        """Read the file again from the start at the next poll if it was rewritten."""
        with self._lock:
            self._restart_requested = True

    def seek_end(self) -> None:
        """Start at the file's current end: what it holds now is history, not to be read.

        Called before :meth:`start` (attaching to a job that has been writing for a while).
        The bytes before the end are remembered as if read, so a later truncation or
        rewrite is still noticed and read from its start.
        """
        try:
            handle, st = self._open()
            with handle:
                self._inode = (st.st_dev, st.st_ino)
                self._offset = st.st_size
                self._head = os.pread(handle.fileno(), self._HEAD_CHECK, 0)
                start = max(st.st_size - self._TAIL_CHECK, 0)
                self._last_bytes = os.pread(handle.fileno(), st.st_size - start, start)
        except OSError:
            return  # not there yet: everything it will hold is new

    def stop(self) -> None:
        """End the thread and close the file; may be called twice."""
        self._stop.set()
        if self._wake is not None:
            with contextlib.suppress(OSError):
                os.write(self._wake[1], b"x")
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if thread is not None and thread.is_alive():
            return  # stuck in a sink: leave its descriptors to it
        if self._wake is not None:
            for fd in self._wake:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake = None
        self._close_handle()

    @property
    def offset(self) -> int:
        """Bytes of the current file handed on so far."""
        return self._offset

    def poll_once(self) -> int:
        """Read what is new; return the number of bytes handed on. Used by the thread."""
        try:
            handle, st = self._open()
        except RefusedFile:
            # What was read before the swap was checked: finish it, then read nothing
            # until a file that passes the checks is there again.
            handed = self._drain_old_file()
            self._close_handle()
            return handed
        except OSError:
            return 0  # not there (yet, or between a rename and its replacement)
        inode = (st.st_dev, st.st_ino)
        handed = 0
        if self._inode is not None and inode != self._inode:
            handed += self._drain_old_file()
            self._start_over()
        self._close_handle()
        self._handle, self._inode = handle, inode
        with self._lock:
            requested, self._restart_requested = self._restart_requested, False
        if requested:
            self._verify_since = (st.st_mtime_ns, st.st_size)
        head_changed = False
        if self._verify_since is not None and self._verify_since != (st.st_mtime_ns, st.st_size):
            self._verify_since = None
            head_changed = not self._matches(handle, 0, self._head)
        if (
            st.st_size < self._offset
            or head_changed
            or not self._matches(handle, self._offset - len(self._last_bytes), self._last_bytes)
        ):
            self._start_over()
        return handed + self._read(handle, st.st_size)

    def _open(self) -> tuple[BinaryIO, os.stat_result]:
        """The file, checked (:func:`open_job_file`); a refusal is said once, when new."""
        try:
            opened = open_job_file(self.path, self.owner)
        except RefusedFile as exc:
            if exc.strerror != self.refused:
                self.refused = exc.strerror
                if self.on_notice is not None:
                    self.on_notice(f"not reading the job's file {self.path}: {exc.strerror}")
            raise
        if self.refused is not None:
            self.refused = None
            if self.on_notice is not None:
                self.on_notice(f"reading the job's file {self.path} again: it passes the checks")
        return opened

    def _read(self, handle: BinaryIO, size: float) -> int:
        """Hand on the bytes from the offset to ``size`` (and whatever the last read finds)."""
        handed = 0
        while not self._stop.is_set():
            try:
                data = os.pread(handle.fileno(), READ_CHUNK, self._offset)
            except OSError:
                break
            if not data:
                break
            self._deliver(data)
            handed += len(data)
            del data  # before the next read: one chunk in memory at a time, not two
            if self._offset >= size:
                break  # a writer faster than this reader cannot keep one poll going forever
        return handed

    def _drain_old_file(self) -> int:
        """The file was replaced: read the old one to its end first (rename rotation)."""
        old = self._handle
        if old is None:
            return 0
        try:
            size = os.fstat(old.fileno()).st_size
        except OSError:
            return 0
        if size < self._offset or not self._matches(
            old, self._offset - len(self._last_bytes), self._last_bytes
        ):
            return 0  # truncated after it was rotated away (copytruncate): nothing to add
        return self._read(old, size)

    def _deliver(self, data: bytes) -> None:
        received = self.clock.now()
        self._offset += len(data)
        self._last_bytes = (self._last_bytes + data[-self._TAIL_CHECK :])[-self._TAIL_CHECK :]
        if len(self._head) < self._HEAD_CHECK:
            self._head += data[: self._HEAD_CHECK - len(self._head)]
        self.sink(data, received)
        if self.on_line is not None:
            self._lines(data, received)

    def _lines(self, data: bytes, received: float) -> None:
        assert self.on_line is not None
        lines = data.split(b"\n")
        rest = lines.pop()
        if lines:
            lines[0] = self._line + lines[0]
            self._line = b""
            for line in lines:
                self.on_line(line.rstrip(b"\r"), received)
        if len(rest) >= MARKER_LINE_KEEP:
            self._line = rest[-MARKER_LINE_KEEP:]
        else:
            self._line = (self._line + rest)[-MARKER_LINE_KEEP:]

    def _start_over(self) -> None:
        if self._inode is not None:
            self.restarts += 1
        if self.on_start_over is not None:
            self.on_start_over()
        self._offset = 0
        self._line = b""
        self._last_bytes = b""
        self._head = b""

    def _close_handle(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(OSError):
                self._handle.close()
            self._handle = None

    @staticmethod
    def _matches(handle: BinaryIO, offset: int, expected: bytes) -> bool:
        """Whether the file still holds ``expected`` at ``offset`` (what was read there)."""
        if not expected:
            return True
        try:
            return os.pread(handle.fileno(), len(expected), offset) == expected
        except OSError:
            return True

    def _loop(self) -> None:
        notify = _Inotify.open(self.path) if self.use_inotify else None
        self.inotify = notify is not None
        poller = select.poll()
        assert self._wake is not None
        poller.register(self._wake[0], select.POLLIN)
        if notify is not None:
            poller.register(notify.fd, select.POLLIN)
        try:
            while not self._stop.is_set():
                try:
                    if self.poll_once():
                        self.clock.wakeup()
                except OSError:  # a reader hiccup must not end the drill; retry next poll
                    pass
                self._wait(poller, notify)
        finally:
            if notify is not None:
                notify.close()

    def _wait(self, poller: select.poll, notify: _Inotify | None) -> None:
        """Sleep until the next poll: at most the interval, less when inotify sees a write."""
        deadline = time.monotonic() + self.interval
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready = {fd for fd, _ in poller.poll(max(int(left * 1000), 1))}
            if notify is None or notify.fd not in ready:
                continue  # the deadline passed, or stop() wrote to the wake pipe
            if notify.drain():
                return
