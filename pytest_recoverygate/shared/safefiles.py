"""Writing and reading inside a folder that a job may have planted links in.

A report folder can sit where the job writes (its working folder, a shared ``/tmp``), and
the drill may run as root. A symbolic link planted at ``timeline.png`` or ``output/``
would make a path-based write (or ``chmod``) land on the link's target: ``/etc/passwd``
overwritten, ``/etc/shadow`` made readable. So everything below the folder the user named
goes through a descriptor of that folder, one name at a time, never following a link:

- a folder: ``mkdir`` (mode :data:`FOLDER_MODE`) then ``open(O_DIRECTORY|O_NOFOLLOW)``; a
  link found at its name is removed (the link, never its target) and a real folder made;
- a file: written to a fresh temporary name (``O_CREAT|O_EXCL|O_NOFOLLOW``, mode
  :data:`FILE_MODE`, ``fchmod`` against the umask) and renamed over the name, which
  replaces a planted link and leaves its target untouched;
- a read: ``O_NOFOLLOW|O_NONBLOCK``, a regular file only, and as root one that root owns
  with one link (a hard link to ``/etc/shadow`` is not read into a report).

The folder the user named is taken as given (its path may pass through links the user
made); Linux's ``fs.protected_symlinks`` covers a link planted by someone else in a
sticky world-writable folder such as ``/tmp``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = ["FILE_MODE", "FOLDER_MODE", "UnsafeFile", "open_folder", "read_safely", "write_safely"]

#: Report files are the drill user's alone: the job's output they keep may hold secrets.
FILE_MODE = 0o600
#: Report folders likewise.
FOLDER_MODE = 0o700
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFile(OSError):
    """A file or folder under a report folder that will not be read or written (why)."""


def _open_below(parent: int, name: str, *, create: bool, mode: int) -> int:
    """``name`` in the folder ``parent`` as a folder descriptor, never through a link."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=parent)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not (create and stat.S_ISLNK(st.st_mode)):
            raise UnsafeFile(errno.ENOTDIR, f"{name} is not a folder") from None
    os.unlink(name, dir_fd=parent)  # the planted link itself, not what it points to
    os.mkdir(name, mode, dir_fd=parent)
    return os.open(name, _DIR_FLAGS, dir_fd=parent)


@contextlib.contextmanager
def open_folder(
    root: Path, relative: Path | str = ".", *, create: bool = True, mode: int = FOLDER_MODE
) -> Iterator[int]:
    """A descriptor of ``root/relative``: ``root`` as given (made with ``mode`` when
    missing), each part of ``relative`` opened without following a link (made when
    missing, a planted link replaced by a folder, with ``create``)."""
    if create and not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            root.mkdir(mode)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in Path(relative).parts:
            if part in (".", ""):
                continue
            if part == ".." or "/" in part:
                raise UnsafeFile(errno.EINVAL, f"{relative}: not a path inside {root}")
            inner = _open_below(fd, part, create=create, mode=mode)
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def write_safely(
    root: Path, relative: Path | str, data: str | bytes, *, mode: int = FILE_MODE
) -> Path:
    """Write ``data`` to ``root/relative`` atomically, with ``mode``, through no link.

    The folders on the way are made (:data:`FOLDER_MODE`) as :func:`open_folder` does.
    A link at the file's name is replaced, its target untouched. Returns the path.
    """
    relative = Path(relative)
    # A lone surrogate (a job's "\ud800" through JSON) is written as that escape.
    payload = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data
    with open_folder(root, relative.parent) as folder:
        tmp = f".{relative.name}.{secrets.token_hex(6)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, mode, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), mode)  # the umask may have taken bits away
                handle.write(payload)
            os.replace(tmp, relative.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
    return root / relative


def read_safely(root: Path, relative: Path | str, *, limit: int | None = None) -> bytes:
    """The bytes of ``root/relative`` (at most ``limit``), read through no link.

    Raise :class:`UnsafeFile` for a link, a FIFO or another non-regular file, and, when
    running as root, for a file root does not own or that has other hard links.
    """
    relative = Path(relative)
    with open_folder(root, relative.parent, create=False) as folder:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        try:
            fd = os.open(relative.name, flags, dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeFile(exc.errno, f"{relative} is a symbolic link") from None
            raise
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(errno.EINVAL, f"{relative} is not a regular file")
        if os.geteuid() == 0 and (st.st_uid != 0 or st.st_nlink != 1):
            raise UnsafeFile(
                errno.EPERM, f"{relative} is another user's file or a hard link (read as root)"
            )
        return handle.read() if limit is None else handle.read(limit)
