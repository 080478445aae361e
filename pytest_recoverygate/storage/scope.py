"""What a StorageFault may cover, as the job shows it: the folders its own words name, and
whether a process of the job sees the mounts the drill makes on this machine.

- :func:`named_folders`: every existing folder a word of the job's command, environment
  or script names (a path, or the value of ``--opt=path``), relative to its working
  folder. The local and Ray backends read their config's words at config time; the
  Slurm backend reads the running job's (its batch script, its target process) at
  discovery.
- :func:`mount_problem`: why a process of the job (pid and start time, as the backend
  discovered it) would not see a mount made here: it is no process of this machine (no
  such pid, or another start time: the job runs on another node), or it runs in a mount
  namespace of its own (a slurmd started in one, a container), where a mount made in the
  drill's namespace does not show.
- :func:`process_words`: the command line and working folder of such a process, read
  bounded, for :func:`named_folders`.

Everything here reads ``/proc`` and stats paths; it never follows what it reads into a
write, and bounds what it reads: a job's words are hostile input (docs/reliability.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["MAX_WORDS", "mount_problem", "named_folders", "process_words", "start_ticks"]

#: Words of a job looked at, at most (a script of a million words is read that far).
MAX_WORDS = 4096
_MAX_WORD = 4096  # characters of one word; longer ones name no folder we look at
_MAX_CMDLINE = 1 << 16


def named_folders(words: Iterable[tuple[Path, str]]) -> list[Path]:
    """The existing folders that ``(working folder, word)`` pairs name, resolved, in order,
    once each: the word itself, or the value of an option (``--ckpt-dir=./ckpt``)."""
    found: dict[Path, None] = {}
    for count, (where, word) in enumerate(words):
        if count >= MAX_WORDS:
            break
        value = word.partition("=")[2] if word.startswith("-") else word
        value = value.strip("'\"")
        if not value or len(value) > _MAX_WORD or "{" in value or "$" in value or "\x00" in value:
            continue
        try:
            path = Path(value).expanduser()
            path = Path(os.path.realpath(path if path.is_absolute() else where / path))
            if path.is_dir():
                found[path] = None
        except (OSError, ValueError, RuntimeError):
            continue
    return list(found)


def start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat``
    field 22), or None when there is no such process here."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read(4096)
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def mount_problem(pid: int, start: int | None, what: str) -> str | None:
    """Why ``what`` (pid ``pid``, started at ``start`` ticks) would not see a mount the
    drill makes here, or None when it would: it is this very process of this machine and
    shares the drill's mount namespace."""
    here = start_ticks(pid)
    if here is None or (start is not None and here != start):
        seen = "no such process" if here is None else f"pid {pid} here started at {here}"
        return (
            f"{what} is not a process of this machine ({seen}): it runs on another node, "
            "and a storage layer mounted here does not cover the folder as that node sees it"
        )
    try:
        theirs = os.stat(f"/proc/{pid}/ns/mnt").st_ino
        mine = os.stat("/proc/self/ns/mnt").st_ino
    except OSError as exc:
        return f"the mount namespace of {what} cannot be read ({exc.strerror})"
    if theirs != mine:
        return (
            f"{what} runs in a mount namespace of its own (mnt:[{theirs}], the drill's is "
            f"mnt:[{mine}]: a slurmd or a container started in one), where a storage layer "
            "mounted by the drill does not show"
        )
    if start_ticks(pid) != here:  # it ended while we looked: what we read was another's
        return f"{what} ended while its mount namespace was read"
    return None


def process_words(pid: int) -> list[tuple[Path, str]]:
    """``(its working folder, word)`` for each word of process ``pid``'s command line, and
    its working folder itself; empty when it cannot be read."""
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read(_MAX_CMDLINE)
    except OSError:
        return []
    words = [w.decode("utf-8", "replace") for w in raw.split(b"\x00") if w]
    return [(cwd, str(cwd)), *((cwd, w) for w in words[:MAX_WORDS])]
