"""StickyFault ``scope: step``: the poison a drill arms, a file whose existence kills.

The drill hands the job ``RECOVERYGATE_POISON=RANK:STEP:FILE`` in its environment; the
reporter (its own code, :mod:`recoverygate.reporter`) ends the process of rank RANK that
reports step STEP while FILE exists. :class:`Poison` owns FILE: :meth:`Poison.arm` creates
it at the trigger, :meth:`Poison.close` removes it (every exit path of the drill), so the
poison never outlives the drill that armed it.

FILE sits in the drill lock folder (a 0700 folder of the drill's user, which the job's
processes, run as that user, can see) next to a record the drill holds ``flock``-ed
while it runs: a drill SIGKILLed with its poison armed leaves both behind, and
``recoverygate sweep`` (:func:`sweep`) removes every poison whose record no drill holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from pytest_recoverygate.shared.lock import lock_dir

__all__ = ["ENV", "POISON_PREFIX", "Poison", "PoisonSweep", "sweep"]

#: The job's environment variable the reporter reads.
ENV = "RECOVERYGATE_POISON"
POISON_PREFIX = "recoverygate-poison-"
_ID = re.compile(r"[0-9a-f]{16}")


class Poison:
    """One drill's poison: ``rank`` dies at ``step`` while armed."""

    def __init__(self, rank: int, step: int, *, directory: Path | None = None) -> None:
        self.rank, self.step = rank, step
        folder = directory or lock_dir()
        self.id = secrets.token_hex(8)
        self.record = folder / f"{POISON_PREFIX}{self.id}.lock"
        self.file = folder / f"{POISON_PREFIX}{self.id}.armed"
        self._fd: int | None = os.open(
            self.record, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.armed_at: float | None = None

    @property
    def environment(self) -> dict[str, str]:
        """What the job's environment gets (the reporter reads it)."""
        return {ENV: f"{self.rank}:{self.step}:{self.file}"}

    def arm(self) -> float:
        """Create the file: from now on the rank dies at the step. Returns the time."""
        fd = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        self.armed_at = time.time()
        return self.armed_at

    def disarm(self) -> bool:
        """Remove the file (no incarnation dies at the step from now on); True if it was."""
        try:
            self.file.unlink()
        except FileNotFoundError:
            return False
        return True

    def close(self) -> str | None:
        """Disarm and drop the record; the problem, if the file is somehow still there."""
        self.disarm()
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                self.record.unlink()
            os.close(self._fd)
            self._fd = None
        if self.file.exists():
            return f"the poison file {self.file} could not be removed"
        return None


@dataclass
class PoisonSweep:
    """What one sweep of poisons found and did."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def sweep(*, dry_run: bool = False, directory: Path | None = None) -> PoisonSweep:
    """Remove each poison (and its record) of a drill that no longer runs: a record no
    one holds, or a poison file with no record; a poison of a running drill is left."""
    report = PoisonSweep()
    folder = directory or lock_dir()
    for path in sorted(folder.glob(f"{POISON_PREFIX}*")):
        poison_id, dot, kind = path.name[len(POISON_PREFIX) :].partition(".")
        if not (_ID.fullmatch(poison_id) and dot and kind in ("lock", "armed")):
            report.lines.append(f"{path}: not a file a drill writes; left alone")
            continue
        if kind == "armed" and (folder / f"{POISON_PREFIX}{poison_id}.lock").exists():
            continue  # judged with its record
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            report.lines.append(f"{path}: not a plain file of this user; left alone")
            continue
        if kind == "lock" and _held(path):
            report.lines.append(f"poison {poison_id}: its drill is running; left alone")
            continue
        armed = folder / f"{POISON_PREFIX}{poison_id}.armed"
        what = "an armed poison" if armed.exists() else "a disarmed poison's record"
        head = f"poison {poison_id} (its drill no longer runs)"
        if dry_run:
            report.lines.append(f"{head}: would remove {what}")
            continue
        for leftover in (armed, folder / f"{POISON_PREFIX}{poison_id}.lock"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        if armed.exists():
            report.problems.append(f"poison {poison_id}: {armed} could not be removed")
        else:
            report.lines.append(f"{head}: removed {what}")
    return report


def _held(path: Path) -> bool:
    """True when a running drill holds the record's lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return True  # cannot tell: leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
