"""StickyFault ``scope: checkpoint``: a checkpoint rotten at rest, written over in place.

Which files: those under the job's checkpoint folder (``path``) whose last write lies in
the save's window, from its ``checkpoint_started`` (else the previous checkpoint's
``checkpoint_completed``) to its ``checkpoint_completed``, as the job's own clock stamped
them (the reporter's lines and the kernel's file times are the same host clock; a file
time lags its write by at most a clock tick, :data:`SLACK`). A rename keeps a file's
time, so a save that writes a temporary name and renames it is found under its final
name. Nothing outside ``path`` is looked at or touched: the walk opens each folder below
the one before it with ``O_NOFOLLOW`` (a link is never followed, a file with more than
one link is never written), at most :data:`MAX_FILES` entries and :data:`MAX_DEPTH`
levels.

How (``damage``): ``truncate`` cuts the file to half its size (a torn write, metaseq#53's
short shards); ``zero`` writes zeros over 4 KiB in its middle (a lost block); ``flip``
inverts one byte in its middle (silent corruption: ``torch.load`` reads such a file
without complaint). The file keeps its name, owner and mode.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DAMAGES", "MAX_DEPTH", "MAX_FILES", "SLACK", "Damaged", "damage", "files_written"]

DAMAGES = ("truncate", "zero", "flip")
MAX_FILES = 4096
MAX_DEPTH = 8
#: Seconds a file's time may lag the write that set it (a coarse clock tick or two).
SLACK = 0.02
BLOCK = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Damaged:
    """One file written over: its name under the folder, its size before, what was done."""

    name: str
    size: int
    how: str

    def describe(self) -> str:
        return f"{self.name} ({self.size} bytes): {self.how}"


def files_written(folder: str | Path, start: float, end: float) -> list[tuple[str, int]]:
    """(name under ``folder``, size) of each plain file last written in ``[start, end]``."""
    found = []
    for name, info in _walk(folder):
        mtime = info.st_mtime_ns / 1e9
        if start - SLACK <= mtime <= end + SLACK:
            found.append((name, info.st_size))
    return sorted(found)


def damage(folder: str | Path, names: list[str], how: str) -> list[Damaged]:
    """Write over each named file under ``folder`` (see the module docstring); a file
    that is gone, a link, or not a plain file of a single name is left alone."""
    if how not in DAMAGES:
        raise ValueError(f"unknown damage {how!r}")
    done = []
    root = os.open(folder, _DIR_FLAGS)
    try:
        for name in names:
            result = _damage_one(root, name, how)
            if result is not None:
                done.append(result)
    finally:
        os.close(root)
    return done


def _damage_one(root: int, name: str, how: str) -> Damaged | None:
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    fds: list[int] = []
    try:
        at = root
        for part in parts[:-1]:
            at = os.open(part, _DIR_FLAGS, dir_fd=at)
            fds.append(at)
        fd = os.open(parts[-1], os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
    except OSError:
        for opened in fds:
            os.close(opened)
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            return None
        size = info.st_size
        if how == "truncate":
            os.ftruncate(fd, size // 2)
            what = f"truncated to {size // 2} bytes"
        elif how == "zero":
            start = max(size // 2 - BLOCK // 2, 0)
            length = min(BLOCK, size)
            os.pwrite(fd, bytes(length), start)
            what = f"{length} bytes zeroed at offset {start}"
        else:
            where = size // 2
            byte = os.pread(fd, 1, where)
            if not byte:
                return None
            os.pwrite(fd, bytes([byte[0] ^ 0xFF]), where)
            what = f"the byte at offset {where} inverted"
        os.fsync(fd)
        return Damaged(name, size, what)
    finally:
        os.close(fd)
        for opened in fds:
            os.close(opened)


def _walk(folder: str | Path) -> Iterator[tuple[str, os.stat_result]]:
    """(name under ``folder``, stat) of the plain single-link files below it (bounded)."""
    seen = 0
    stack: list[tuple[int, str, int]] = [(os.open(folder, _DIR_FLAGS), "", 0)]
    try:
        while stack:
            fd, prefix, depth = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    names = sorted(entry.name for entry in entries)
                for name in names:
                    seen += 1
                    if seen > MAX_FILES:
                        return
                    try:
                        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        if stat.S_ISDIR(info.st_mode) and depth + 1 < MAX_DEPTH:
                            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                            stack.append((sub, f"{prefix}{name}/", depth + 1))
                        elif stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                            yield f"{prefix}{name}", info
                    except OSError:
                        continue
            finally:
                os.close(fd)
    finally:
        for fd, _, _ in stack:
            os.close(fd)
