"""A Slurm job the drill submits itself (``workload.script``), cancelled at cleanup, and
the jobs of a dead drill, swept.

Why: a drill that attaches to a running job (``jobId``/``jobName``) cannot add anything
to its environment, and a StickyFault ``scope: step`` reaches the job only through it
(``RECOVERYGATE_POISON``, which the reporter reads as each process starts). So the drill
can submit the job itself, as the local backend launches its command:

- **submit**: ``sbatch --parsable --export=ALL --comment=MARK ARGS SCRIPT`` from
  ``workdir`` (the job's ``SLURM_SUBMIT_DIR``), its environment the drill's (``SLURM_*``
  and ``SBATCH_*`` dropped, as for every client command) with ``workload.env`` and the
  drill's own additions on top. sbatch is sent once past the point where it could have
  acted: a second one would submit a second job.
- **the mark**: ``recoverygate-drill-<16 hex>`` in the job's ``Comment``, the job's
  identity for cleanup and the sweep: a job is cancelled only while it carries the mark
  of the drill that submitted it, which also finds a job whose sbatch answer was lost.
- **the owner record**: ``recoverygate-slurm-<16 hex>.json`` in the drill lock folder
  (:func:`~pytest_recoverygate.shared.lock.lock_dir`), made before sbatch runs and held
  ``flock``-ed while the drill runs: the cluster (``SLURM_CONF``), the mark, the job id
  once known.
- **cancel** (the orchestrator's cleanup, every way out): ``scancel`` of the marked jobs,
  then a wait (up to :data:`CANCEL_WAIT`) until ``squeue`` lists none of them (pending,
  running or completing), then the record removed.
- **sweep** (``recoverygate sweep``): a record no drill holds belongs to a drill that was
  itself SIGKILLed; its marked jobs are cancelled and the record removed. A record still
  held, or one that is not what a drill writes, is left alone, and the sweep says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pytest_recoverygate.errors import BackendError, DiscoveryError, PermissionDeniedError
from pytest_recoverygate.orchestrators.slurm.commands import (
    CommandNotStarted,
    CommandOutcomeUnknown,
    JobGone,
    SlurmCommands,
)
from pytest_recoverygate.shared.lock import lock_dir, same_file

__all__ = [
    "CANCEL_WAIT",
    "MARK_PREFIX",
    "RECORD_PREFIX",
    "Submission",
    "SubmittedJob",
    "SweptJobs",
    "cancel_marked",
    "marked_jobs",
    "sweep",
]

#: The job's Comment: this prefix and the drill's 16 hex digits.
MARK_PREFIX = "recoverygate-drill-"
#: The owner record's name: this prefix, the same 16 hex digits, ``.json``.
RECORD_PREFIX = "recoverygate-slurm-"
#: Seconds cleanup waits for a cancelled job to leave squeue (Slurm's KillWait, 30 s by
#: default, and the epilog).
CANCEL_WAIT = 90.0
_MARK = re.compile(rf"{MARK_PREFIX}(?P<id>[0-9a-f]{{16}})")
_RECORD = re.compile(rf"{RECORD_PREFIX}(?P<id>[0-9a-f]{{16}})\.json")
_JOB_ID = re.compile(r"\d{1,10}")
_MAX_RECORD = 4096


@dataclass(frozen=True)
class Submission:
    """What the drill submits: ``sbatch ARGS SCRIPT`` from ``workdir``, with ``env``."""

    script: Path
    args: tuple[str, ...]
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return " ".join(["sbatch", *self.args, str(self.script)])


class SubmittedJob:
    """One drill's submitted job: its record, its mark, its id once sbatch answered."""

    def __init__(
        self, submission: Submission, commands: SlurmCommands, *, directory: Path | None = None
    ) -> None:
        self.submission = submission
        self.commands = commands
        self.id = secrets.token_hex(8)
        self.mark = f"{MARK_PREFIX}{self.id}"
        self.job_id: str | None = None
        self.record = (directory or lock_dir()) / f"{RECORD_PREFIX}{self.id}.json"
        self._fd: int | None = None

    def submit(self) -> str:
        """Make the record, then sbatch the script once; the job id. DiscoveryError when
        sbatch refused the job (nothing was submitted), BackendError when whether it
        submitted one is unknown (cleanup looks for the mark)."""
        self._hold_record()
        args = [
            "sbatch",
            "--parsable",
            "--export=ALL",
            f"--comment={self.mark}",
            *self.submission.args,
            str(self.submission.script),
        ]
        env = {**self.commands.env, **self.submission.env}
        try:
            out = self.commands.run_destructive(args, cwd=self.submission.workdir, env=env)
        except CommandNotStarted as exc:
            raise DiscoveryError(f"nothing was submitted: {exc}") from None
        except CommandOutcomeUnknown as exc:
            raise BackendError(
                f"whether sbatch submitted the job is unknown ({exc}); cleanup cancels any "
                f"job with comment {self.mark}"
            ) from None
        except (BackendError, JobGone) as exc:  # sbatch answered with its refusal
            raise DiscoveryError(
                f"sbatch refused the job ({self.submission.describe()}): {exc}"
            ) from None
        job_id = out.strip().split(";")[0]
        if _JOB_ID.fullmatch(job_id) is None:
            raise BackendError(f"sbatch printed {out.strip()[:200]!r}, not a job id")
        self.job_id = job_id
        self._write_record()
        return job_id

    def cancel(
        self, wait: Callable[[float], None], now: Callable[[], float], limit: float = CANCEL_WAIT
    ) -> str | None:
        """scancel the marked job and wait until squeue lists it no more; then drop the
        record. The problem, if a marked job is still there (the record then stays for
        the sweep); it never raises."""
        if self._fd is None:
            return None
        try:
            problem = cancel_marked(self.commands, self.mark, wait, now, limit)
        except Exception as exc:  # cleanup reports, never stops half-way
            return f"cancelling the job the drill submitted (comment {self.mark}) failed: {exc!r}"
        if problem is None:
            self.close()
        return problem

    def close(self) -> None:
        """Remove the record and drop its lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            if same_file(fd, self.record):
                os.unlink(self.record)
        os.close(fd)

    # ------------------------------------------------------------------ the record

    def _hold_record(self) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.record, flags, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._fd = fd
        self._write_record()

    def _write_record(self) -> None:
        assert self._fd is not None
        text = json.dumps(
            {
                "version": 1,
                "mark": self.mark,
                "slurmConf": self.commands.slurm_conf,
                "jobId": self.job_id,
                "script": str(self.submission.script),
            }
        ).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text, 0)


def marked_jobs(commands: SlurmCommands, mark: str) -> list[str]:
    """The ids of the jobs squeue lists (pending, running, completing) whose Comment is
    exactly ``mark``, among the drill user's own."""
    out = commands.run(["squeue", "-h", "--user", commands.current_user(), "--format=%i|%k"])
    ids = []
    for row in out.splitlines():
        job_id, bar, comment = row.strip().partition("|")
        if bar and comment.strip() == mark and _JOB_ID.fullmatch(job_id):
            ids.append(job_id)
    return ids


def cancel_marked(
    commands: SlurmCommands,
    mark: str,
    wait: Callable[[float], None],
    now: Callable[[], float],
    limit: float = CANCEL_WAIT,
) -> str | None:
    """scancel every job carrying ``mark`` and wait (up to ``limit`` seconds) until none
    is listed; the problem, or None when none is left. A second scancel is harmless (the
    job is the drill's own), so it is sent again while a marked job is still listed."""
    deadline = now() + limit
    sent_at: float | None = None
    while True:
        try:
            ids = marked_jobs(commands, mark)
            if not ids:
                return None
            if sent_at is None or now() - sent_at >= 10.0:
                commands.run(["scancel", *ids])
                sent_at = now()
        except JobGone:
            continue
        except (BackendError, PermissionDeniedError) as exc:
            return f"the job the drill submitted (comment {mark}) could not be cancelled: {exc}"
        if now() >= deadline:
            return (
                f"slurm job {', '.join(ids)} that the drill submitted (comment {mark}) is still "
                f"listed {limit:g} s after its scancel; cancel it: scancel {' '.join(ids)}"
            )
        wait(0.25)


@dataclass
class SweptJobs:
    """What one sweep of submitted jobs found and did."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        """What could not be done: said among the lines, and counted."""
        self.lines.append(text)
        self.problems.append(text)


def sweep(*, dry_run: bool = False, directory: Path | None = None) -> SweptJobs:
    """Cancel the jobs of each drill that no longer runs (a record no one holds) and
    remove its record; a running drill's record, and anything not a drill's, is left."""
    import time

    report = SweptJobs()
    folder = directory or lock_dir()
    for path in sorted(folder.glob(f"{RECORD_PREFIX}*")):
        if _RECORD.fullmatch(path.name) is None:
            report.lines.append(f"{path}: not a file a drill writes; left alone")
            continue
        record = _read_unheld(path, report)
        if record is None:
            continue
        mark, conf, job_id = record
        head = f"slurm job {job_id or '(id not recorded)'} submitted by a drill that no longer runs"
        commands = SlurmCommands(slurm_conf=conf)
        try:
            ids = marked_jobs(commands, mark)
        except (BackendError, PermissionDeniedError) as exc:
            report.problem(f"{head}: squeue failed ({exc}); record {path} kept")
            continue
        if dry_run:
            what = (
                f"would cancel {', '.join(ids)}" if ids else "none is left; would remove its record"
            )
            report.lines.append(f"{head} (comment {mark}): {what}")
            continue
        problem = cancel_marked(commands, mark, time.sleep, time.monotonic) if ids else None
        if problem is not None:
            report.problem(f"{problem}; record {path} kept")
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        done = f"cancelled {', '.join(ids)}" if ids else "none was left"
        report.lines.append(f"{head} (comment {mark}): {done}; record removed")
    return report


def _read_unheld(path: Path, report: SweptJobs) -> tuple[str, str | None, str | None] | None:
    """The record's (mark, SLURM_CONF, job id) when no drill holds it and it is what a
    drill writes; None otherwise (said in ``report``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        report.lines.append(f"{path}: cannot be opened ({exc.strerror}); left alone")
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1:
            report.lines.append(f"{path}: not a plain file of this user; left alone")
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report.lines.append(f"{path.name}: its drill is running; left alone")
            return None
        data = os.read(fd, _MAX_RECORD + 1)
    finally:
        os.close(fd)
    try:
        record = json.loads(data) if len(data) <= _MAX_RECORD else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        report.lines.append(f"{path}: not a record a drill writes; left alone")
        return None
    mark, conf, job_id = record.get("mark"), record.get("slurmConf"), record.get("jobId")
    if (
        not isinstance(mark, str)
        or _MARK.fullmatch(mark) is None
        or not path.name.startswith(f"{RECORD_PREFIX}{mark[len(MARK_PREFIX) :]}")
        or not (conf is None or isinstance(conf, str))
        or not (job_id is None or (isinstance(job_id, str) and _JOB_ID.fullmatch(job_id)))
    ):
        report.lines.append(f"{path}: not a record a drill writes; left alone")
        return None
    return mark, conf, job_id
