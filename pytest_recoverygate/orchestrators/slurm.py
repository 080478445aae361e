"""The SLURM backend: find a running job's ranks, kill one, watch the job come back.

Why it looks the way it does (facts measured on Slurm 22.05, see docs/slurm.md):

- ``sacct`` needs slurmdbd, ``scontrol --json`` does not exist on 22.05 and ``squeue
  --json`` ignores ``-j``, so the job is read with ``scontrol show job -o`` (state,
  ``Restarts``, the expanded ``StdOut`` path, nodes) and its steps with ``scontrol show
  step -o``. :func:`parse_scontrol_records` reads the 22.05 one-line form and the
  multi-line form newer releases print to humans.
- ``scancel --signal=KILL J.S`` kills every task of a step, not one rank. A single rank
  dies alone only by ``kill -9`` of its pid on its node, so both the lookup and the kill
  run *on the node*, inside the job, through ``srun --jobid=J --overlap -w NODE``. The
  kill step re-reads the pid's start time and kills only if it still matches: a
  replacement that reused the rank (or even the pid) is never hit, and a retried kill is
  harmless.
- A rank is a worker process's ``RANK`` environment variable (torchrun's workers) or,
  when no process of the step has one, its Slurm task id (``GLOBALID`` of ``scontrol
  listpids``, i.e. ``SLURM_PROCID``). The top process of each rank's subtree is the
  worker; data-loader children inherit ``RANK`` and are skipped.
- Recovery comes in three shapes: torchrun restarts its workers inside the step (new
  pids, same step), the batch script starts a new step in the same allocation (new step
  id), or the job is requeued (``Restarts`` increments, the job pends, then runs again).
  A job that reaches a final state instead is ``JOB_FAILED``.
- Training events come from the job's ``StdOut`` file, tailed from a byte offset by
  :class:`OutputTail` in bounded memory. inotify wakes it early where it works; the poll
  interval still bounds the wait, because inotify does not see writes from other nodes on
  NFS or Lustre, where real output files live.

Only this module runs ``squeue``/``scontrol``/``scancel``/``srun``. Every command has a
timeout; transient controller errors of *read-only* commands are retried with tenacity; a
missing binary, a missing ``SLURM_CONF`` or an unreachable controller is a
:class:`BackendError` that says what to fix. Commands that act (``scontrol requeue``,
``scancel``, the kill step) are never sent a second time once they may have acted: they
are retried only while it is certain they never started (:class:`CommandNotStarted`); a
timeout or any failure after that is :class:`CommandOutcomeUnknown`, and the kill is
``UNCONFIRMED`` (the drill ends in ERROR). No command goes through a shell with
user-provided text: the scripts run on the node are constants and receive pids and job
ids as arguments.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import tenacity

from pytest_recoverygate.errors import (
    BackendError,
    DiscoveryError,
    PermissionDeniedError,
    UsageError,
)
from pytest_recoverygate.events import StreamEventSource
from pytest_recoverygate.joboutput import JobOutput, OutputSplitter, slurm_task_of
from pytest_recoverygate.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEvent,
    Worker,
    Workload,
)
from pytest_recoverygate.orchestrators.base import Clock, EventSource

__all__ = [
    "CommandNotStarted",
    "CommandOutcomeUnknown",
    "FaultType",
    "JobGone",
    "JobInfo",
    "OutputTail",
    "ProcessRow",
    "SlurmCommands",
    "SlurmEventSource",
    "SlurmOrchestrator",
    "StepInfo",
    "assign_ranks",
    "expand_output_pattern",
    "parse_listpids",
    "parse_probe_output",
    "parse_scontrol_records",
    "parse_slurm_marker",
    "parse_squeue_rows",
]

FaultType = Literal["KillWorker", "KillStep", "Requeue"]
FAULT_TYPES: tuple[str, ...] = ("KillWorker", "KillStep", "Requeue")

PROBE_STEP_NAME = "recoverygate-probe"
_INSTANCE_ID = re.compile(r"(?P<job>[^./@]+)\.(?P<step>[^/@]+)/(?P<pid>\d+)@(?P<start>\d+)")
KILL_STEP_NAME = "recoverygate-kill"
SQUEUE_FIELDS = ("JobID", "Name", "UserName", "State", "Reason", "Partition", "NodeList")

#: States after which a job will not run again by itself (``squeue(1)`` JOB STATE CODES).
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
        "REQUEUE_HOLD",
    }
)
#: States in which a requeued job waits to run again.
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD"})
#: Steps that are not training: the batch script, the extern step, our own probes.
NON_TRAINING_STEPS = frozenset({"batch", "extern", "interactive", "TBD"})

TRANSIENT_ERRORS = (
    "Socket timed out",
    "Unable to contact slurm controller",
    "Zero Bytes were transmitted or received",
    "Connection refused",
    "Resource temporarily unavailable",
    "Transport endpoint is not connected",
)
#: Failures that prove a command never reached slurmctld (the connection itself failed):
#: only these allow sending a command that acts once more.
NOT_SENT_ERRORS = ("Connection refused", "connect failure")
#: srun refused to create its step: nothing ran on any node (only with no output at all).
STEP_NOT_CREATED_ERRORS = ("Unable to create step",)
PERMISSION_ERRORS = ("Access/permission denied", "Permission denied", "Invalid user")
MISSING_JOB_ERRORS = ("Invalid job id specified", "does not exist")

# Run on the job's node inside an overlapping step: list every process of the job there
# with its parent, start time (clock ticks since boot), RANK and torchrun restart count.
# $1 is the job id. Constant text; nothing from the user is interpolated.
PROBE_SCRIPT = r"""
job=$1
scontrol listpids "$job" 2>/dev/null | while read -r pid _job step _local global _rest; do
  case "$pid" in ''|*[!0-9]*) continue ;; esac
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
  rest=${stat##*) }
  set -- $rest
  ppid=$2
  start=${20}
  envs=$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null)
  rank=$(printf '%s\n' "$envs" | sed -n 's/^RANK=//p' | head -n 1)
  restart=$(printf '%s\n' "$envs" | sed -n 's/^TORCHELASTIC_RESTART_COUNT=//p' | head -n 1)
  world=$(printf '%s\n' "$envs" | sed -n 's/^WORLD_SIZE=//p' | head -n 1)
  comm=$(cat "/proc/$pid/comm" 2>/dev/null | tr ' ' '_')
  launcher=-
  for arg in $(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | head -n 3 | tr -d ' '); do
    case "$arg" in
      torchrun|*/torchrun|torch.distributed.run|torch.distributed.launch) launcher=launcher ;;
    esac
  done
  echo "RGPROBE $pid $step ${global:--} $ppid $start" \
    "${rank:--} ${restart:--} ${comm:--} ${world:--} $launcher"
done
echo "RGPROBE-END"
"""

# Run on the target's node: kill -9 the pid only if its start time is still the one
# discovered (same instance). $1 = pid, $2 = start time, $3 = "kill" or "check".
KILL_SCRIPT = r"""
pid=$1; want=$2; mode=$3
stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { echo "RGKILL gone"; exit 0; }
rest=${stat##*) }
set -- $rest
if [ "${20}" != "$want" ]; then echo "RGKILL replaced ${20}"; exit 0; fi
if [ "$mode" = check ]; then echo "RGKILL alive"; exit 0; fi
if kill -9 "$pid"; then echo "RGKILL killed $(date +%s.%N)"; else echo "RGKILL failed"; fi
"""

# ---------------------------------------------------------------------------------------
# Parsing (pure; tested against outputs captured from real Slurm releases)
# ---------------------------------------------------------------------------------------

# A key starts a field only after whitespace and looks like "JobState=", "AllocNode:Sid=",
# "CPUs/Task=" or "ReqB:S:C:T=". Values may contain spaces (JobName, SubmitLine, paths)
# and "=" (TRES=cpu=1,node=1); a "--option=value" inside SubmitLine is not a key.
_FIELD_START = re.compile(r"(?:^|\s+)(?=[A-Za-z][A-Za-z0-9_:/]*=)")


def parse_scontrol_records(text: str, id_key: str = "JobId") -> list[dict[str, str]]:
    """Parse ``scontrol show job|step`` output (one-line ``-o`` or multi-line) into records.

    A record starts at each ``JobId=`` (or ``StepId=``) field. Unknown fields are kept, so
    fields added by newer releases (``ReqTRES``, ``LicensesAlloc``, ``OOMKillStep``…) cost
    nothing and fields removed by them surface as missing keys, not as wrong values.
    """
    records: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    flat = " ".join(line.strip() for line in text.splitlines() if line.strip())
    for piece in _FIELD_START.split(flat):
        if not piece or "=" not in piece:
            continue
        key, _, value = piece.partition("=")
        if key == id_key:
            current = {}
            records.append(current)
        if current is None:
            continue
        current[key] = value.strip()
    return records


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What the drill needs from ``scontrol show job``."""

    job_id: str
    name: str
    user: str
    state: str
    reason: str
    restarts: int
    exit_code: str
    nodes: str
    batch_host: str
    stdout: str
    work_dir: str
    partition: str
    requeue: bool = True

    @classmethod
    def from_record(cls, record: Mapping[str, str]) -> JobInfo:
        user = record.get("UserId", "")
        return cls(
            job_id=record.get("JobId", ""),
            name=record.get("JobName", record.get("Name", "")),
            user=user.split("(", 1)[0],
            # "JobState=CANCELLED by 0" and flags after the state name are possible.
            state=record.get("JobState", "").split(" ", 1)[0].split("+", 1)[0],
            reason=record.get("Reason", ""),
            restarts=_int(record.get("Restarts", "0")),
            exit_code=record.get("ExitCode", ""),
            nodes=_null(record.get("NodeList", "")),
            batch_host=_null(record.get("BatchHost", "")),
            stdout=_null(record.get("StdOut", "")),
            work_dir=_null(record.get("WorkDir", "")),
            partition=record.get("Partition", ""),
            requeue=record.get("Requeue", "1") != "0",
        )

    def describe_end(self) -> str:
        return (
            f"job {self.job_id} ended: state {self.state}, reason {self.reason}, "
            f"exit code {self.exit_code}"
        )


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One step of the job from ``scontrol show step``."""

    job_id: str
    step: str
    name: str
    state: str
    nodes: str
    tasks: int = 0

    @classmethod
    def from_record(cls, record: Mapping[str, str]) -> StepInfo:
        job, _, step = record.get("StepId", "").partition(".")
        return cls(
            job_id=job,
            step=step,
            name=record.get("Name", ""),
            state=record.get("State", ""),
            nodes=_null(record.get("NodeList", "")),
            tasks=_int(record.get("Tasks", "0")),
        )

    @property
    def is_training(self) -> bool:
        """Not the batch script, the extern step or one of RecoveryGate's own steps."""
        if self.step in NON_TRAINING_STEPS or not self.step.isdigit():
            return False
        return self.name not in (PROBE_STEP_NAME, KILL_STEP_NAME)


def parse_squeue_rows(text: str, fields: Sequence[str] = SQUEUE_FIELDS) -> list[dict[str, str]]:
    """Rows of ``squeue -h -O 'F1:|,F2:|,…'`` (each field unpadded, ``|`` after it)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|")
        rows.append(
            {name: values[i].strip() if i < len(values) else "" for i, name in enumerate(fields)}
        )
    return rows


@dataclass(frozen=True, slots=True)
class ProcessRow:
    """One process of the job on one node, as the probe (or ``scontrol listpids``) saw it."""

    pid: int
    step: str
    global_id: int | None
    ppid: int = 0
    start: str = ""
    rank_env: int | None = None
    restart_count: int | None = None
    comm: str = ""
    node: str = ""
    world_size: int | None = None
    launcher: bool = False  # torchrun's agent: it starts the ranks, it is not one


def parse_listpids(text: str) -> list[ProcessRow]:
    """Parse ``scontrol listpids`` (``PID JOBID STEPID LOCALID GLOBALID``; ``-`` = none)."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        rows.append(ProcessRow(pid=int(parts[0]), step=parts[2], global_id=_int_or_none(parts[4])))
    return rows


def parse_probe_output(text: str, node: str) -> list[ProcessRow] | None:
    """Parse the probe's ``RGPROBE`` lines; None when the probe did not run to its end."""
    rows = []
    complete = False
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == ["RGPROBE-END"]:
            complete = True
        if len(parts) < 9 or parts[0] != "RGPROBE" or not parts[1].isdigit():
            continue
        rows.append(
            ProcessRow(
                pid=int(parts[1]),
                step=parts[2],
                global_id=_int_or_none(parts[3]),
                ppid=_int(parts[4]),
                start=parts[5],
                rank_env=_int_or_none(parts[6]),
                restart_count=_int_or_none(parts[7]),
                comm=parts[8],
                node=node,
                world_size=_int_or_none(parts[9]) if len(parts) > 9 else None,
                launcher=len(parts) > 10 and parts[10] == "launcher",
            )
        )
    return rows if complete else None


def assign_ranks(rows: Sequence[ProcessRow]) -> dict[int, ProcessRow]:
    """Map each rank to the process that *is* that rank's worker.

    torchrun layout: processes carry ``RANK``; the worker is the top process of its
    rank's subtree (its parent has no ``RANK`` or another one); while torchrun has not
    started its workers there are no ranks yet. srun-per-task layout: no process has
    ``RANK``; the worker is the task Slurm started (``GLOBALID``).
    """
    by_pid = {row.pid: row for row in rows}
    with_rank = [row for row in rows if row.rank_env is not None]
    ranks: dict[int, ProcessRow] = {}
    if with_rank:
        for row in with_rank:
            parent = by_pid.get(row.ppid)
            if parent is not None and parent.rank_env == row.rank_env:
                continue
            assert row.rank_env is not None
            if row.rank_env in ranks:
                raise DiscoveryError(
                    f"two processes claim RANK={row.rank_env} (pids {ranks[row.rank_env].pid} and "
                    f"{row.pid}); RecoveryGate cannot tell which one is the worker"
                )
            ranks[row.rank_env] = row
        return ranks
    if any(row.launcher for row in rows):
        return ranks  # torchrun is up but has not started its workers yet
    for row in rows:
        if row.global_id is not None and row.global_id not in ranks:
            ranks[row.global_id] = row
    return ranks


_MARKERS = (
    re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<tasks>[0-9,\-]+): (?P<what>.+)"),
    re.compile(
        r"slurmstepd: error: \*\*\* (?P<kind>JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) "
        r"(?P<what>CANCELLED.*?)\s*\*\*\*"
    ),
    re.compile(r"srun: (?P<what>forcing job termination)"),
    re.compile(r"srun: error: (?P<what>Node failure on \S+)"),
)


def parse_slurm_marker(line: str) -> str | None:
    """The failure Slurm itself wrote into the output (``srun: error: node: task 1: Killed``)."""
    for pattern in _MARKERS:
        match = pattern.search(line)
        if match:
            return match.group(0).strip()
    return None


def expand_output_pattern(pattern: str, job: JobInfo) -> str:
    """Expand the ``sbatch --output`` patterns a user may give as the output path."""
    array_job, _, array_task = job.job_id.partition("_")
    replacements = {
        "%j": job.job_id,
        "%J": job.job_id,
        "%A": array_job,
        "%a": array_task or "4294967294",
        "%x": job.name,
        "%u": job.user,
        "%N": job.batch_host,
        "%%": "%",
    }
    return re.sub(r"%[jJAaxuN%]", lambda m: replacements[m.group(0)], pattern)


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


def _int_or_none(value: str) -> int | None:
    return int(value) if value.lstrip("-").isdigit() and value != "-" else None


def _null(value: str) -> str:
    return "" if value in ("(null)", "None", "n/a") else value


# ---------------------------------------------------------------------------------------
# Running the Slurm client commands
# ---------------------------------------------------------------------------------------


class _Transient(Exception):
    """A controller hiccup worth retrying for a read-only command (socket timeout, restart).

    ``sent`` is False only when the failure proves the command never reached slurmctld
    (the connection itself was refused); a timeout or a lost answer may have acted.
    """

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class JobGone(Exception):
    """slurmctld no longer knows the job (finished longer than MinJobAge ago, or a typo)."""


class CommandNotStarted(BackendError):
    """A command certainly did nothing (no connection to slurmctld, srun made no step)."""


class CommandOutcomeUnknown(BackendError):
    """A command that acts failed after it may have acted; it must not be sent again."""


class SlurmCommands:
    """Runs the Slurm clients with a timeout, a clean environment and transient retries.

    :meth:`run` is for commands that only read: a transient failure is retried.
    :meth:`run_destructive` is for commands that act: retried only while it is certain
    the command never started, never after it may have acted.
    """

    def __init__(
        self,
        *,
        slurm_conf: str | None = None,
        timeout: float = 20.0,
        attempts: int = 4,
        env: Mapping[str, str] | None = None,
    ) -> None:
        base = dict(os.environ if env is None else env)
        # Inside an allocation srun would inherit SLURM_JOB_ID & co. and target the wrong
        # job; the probe and kill steps name their job explicitly.
        clean = {
            k: v
            for k, v in base.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))
        }
        conf = slurm_conf or base.get("SLURM_CONF")
        if conf:
            clean["SLURM_CONF"] = conf
        self.slurm_conf = conf
        self.env = clean
        self.timeout = timeout
        self.attempts = attempts
        #: How long to wait before retry n (1-based); tests make it 0.
        self.backoff: Callable[[int], float] = lambda n: min(0.5 * 2 ** (n - 1), 4.0)

    def check_setup(self) -> None:
        """Fail early and clearly when the clients or the configuration are missing."""
        for binary in ("squeue", "scontrol", "srun", "scancel"):
            if shutil.which(binary, path=self.env.get("PATH")) is None:
                raise BackendError(
                    f"the Slurm client '{binary}' is not on PATH; run RecoveryGate on a login "
                    "node, or install slurm-client (Debian/Ubuntu: apt-get install slurm-client)"
                )
        if self.slurm_conf:
            if not Path(self.slurm_conf).is_file():
                raise BackendError(
                    f"SLURM_CONF={self.slurm_conf} does not exist; point SLURM_CONF (or the "
                    "backend's slurm_conf) at the cluster's slurm.conf"
                )
            return
        defaults = (
            "/etc/slurm/slurm.conf",
            "/etc/slurm-llnl/slurm.conf",
            "/run/slurm/conf/slurm.conf",
        )
        if not any(Path(p).is_file() for p in defaults):
            raise BackendError(
                "no Slurm configuration: SLURM_CONF is not set and none of "
                f"{', '.join(defaults)} exists; export SLURM_CONF=/path/to/slurm.conf"
            )

    def run(self, args: Sequence[str], *, timeout: float | None = None, retry: bool = True) -> str:
        """Run one client command and return its stdout; raise JobGone / BackendError.

        With ``retry=False`` the command runs exactly once, and a transient failure says
        whether the command may have acted: :class:`CommandNotStarted` (the connection to
        slurmctld failed) or :class:`CommandOutcomeUnknown` (it timed out, or the answer
        was lost after the request went out).
        """
        if not retry:
            try:
                return self._run_once(args, timeout or self.timeout)
            except _Transient as exc:
                what = f"'{' '.join(args[:3])}' failed: {exc}"
                if not exc.sent:
                    raise CommandNotStarted(f"{what}; it never reached slurmctld") from None
                raise CommandOutcomeUnknown(
                    f"{what}; it may have acted, so it is not sent again"
                ) from None
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Transient),
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=lambda state: self.backoff(state.attempt_number),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return self._run_once(args, timeout or self.timeout)
        except _Transient as exc:
            raise BackendError(
                f"'{' '.join(args[:3])}' kept failing after {self.attempts} attempts: {exc}; "
                "check that slurmctld answers ('scontrol ping', "
                f"SLURM_CONF={self.slurm_conf or 'default'})"
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def run_destructive(self, args: Sequence[str], *, timeout: float | None = None) -> str:
        """Run a command that acts: at most once past the point where it could have acted.

        Each attempt is ``run(args, retry=False)``. Only :class:`CommandNotStarted` is
        tried again (up to ``attempts`` times); :class:`CommandOutcomeUnknown`, JobGone
        and every other error go straight to the caller.
        """
        for attempt in range(1, self.attempts + 1):
            try:
                return self.run(args, timeout=timeout, retry=False)
            except CommandNotStarted:
                if attempt == self.attempts:
                    raise
            time.sleep(self.backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _run_once(self, args: Sequence[str], timeout: float) -> str:
        try:
            proc = subprocess.run(
                list(args),
                capture_output=True,
                text=True,
                timeout=timeout,
                env=self.env,
                check=False,
            )
        except FileNotFoundError:
            raise BackendError(
                f"the Slurm client '{args[0]}' is not on PATH; install slurm-client "
                "or run RecoveryGate on a login node"
            ) from None
        except subprocess.TimeoutExpired:
            raise _Transient(f"'{' '.join(args[:3])}' timed out after {timeout:g} s") from None
        if proc.returncode == 0:
            return proc.stdout
        err = (proc.stderr or proc.stdout).strip()
        # Nothing on stdout: no script line ran on a node (the kill script always prints).
        silent = not proc.stdout.strip()
        if any(marker in err for marker in TRANSIENT_ERRORS):
            sent = not (silent and any(marker in err for marker in NOT_SENT_ERRORS))
            raise _Transient(err, sent=sent)
        if any(marker in err for marker in MISSING_JOB_ERRORS):
            raise JobGone(err)
        if any(marker in err for marker in PERMISSION_ERRORS):
            raise PermissionDeniedError(f"Slurm refused '{' '.join(args[:3])}': {err}")
        if silent and any(marker in err for marker in STEP_NOT_CREATED_ERRORS):
            raise CommandNotStarted(f"'{' '.join(args[:3])}' made no step: {err}")
        raise BackendError(
            f"'{' '.join(args)}' failed (exit {proc.returncode}): {err or 'no message'}"
        )

    # The few commands the backend needs ------------------------------------------------

    def show_job(self, job_id: str) -> JobInfo:
        records = parse_scontrol_records(self.run(["scontrol", "show", "job", "-o", job_id]))
        for record in records:
            if record.get("JobId") == job_id:
                return JobInfo.from_record(record)
        if records:
            return JobInfo.from_record(records[0])
        raise JobGone(f"scontrol printed no record for job {job_id}")

    def show_steps(self, job_id: str) -> list[StepInfo]:
        try:
            text = self.run(["scontrol", "show", "step", "-o", job_id])
        except JobGone:
            return []
        return [StepInfo.from_record(r) for r in parse_scontrol_records(text, id_key="StepId")]

    def hostnames(self, nodelist: str) -> list[str]:
        if not nodelist:
            return []
        if re.fullmatch(r"[A-Za-z0-9_.\-]+", nodelist):
            return [nodelist]
        return self.run(["scontrol", "show", "hostnames", nodelist]).split()

    def find_jobs(self, name: str, user: str | None, partition: str | None) -> list[dict[str, str]]:
        args = ["squeue", "-h", "--name", name, "-O", ",".join(f"{f}:|" for f in SQUEUE_FIELDS)]
        if user:
            args += ["--user", user]
        if partition:
            args += ["--partition", partition]
        return parse_squeue_rows(self.run(args))

    def srun_on_node(
        self,
        job_id: str,
        node: str,
        step_name: str,
        script: str,
        *args: str,
        destructive: bool = False,
    ) -> str:
        """Run a constant sh script inside the job on one node (``--overlap``).

        ``destructive`` (the kill step) runs it through :meth:`run_destructive`.
        """
        command = [
            "srun",
            f"--jobid={job_id}",
            "--overlap",
            "-N1",
            "-n1",
            f"--nodelist={node}",
            f"--job-name={step_name}",
            "--quiet",
            "--wait=0",
            "sh",
            "-c",
            script,
            "recoverygate",
            *args,
        ]
        return self.run_destructive(command) if destructive else self.run(command)


# ---------------------------------------------------------------------------------------
# Tailing the job's output file
# ---------------------------------------------------------------------------------------

#: Largest single read of the output file: a backlog or a giant line is handed on in
#: pieces of this size, never loaded whole.
READ_CHUNK = 1024 * 1024
#: Bytes of the current unfinished line kept for the Slurm marker check (markers are
#: short and end their line, so the last bytes of a long line are the ones that matter).
MARKER_LINE_KEEP = 4096


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


class OutputTail:
    """Follow a file from a byte offset and hand its bytes on in order, in a thread.

    Every byte is handed to ``sink(chunk, received)`` once, in reads of at most
    :data:`READ_CHUNK`: partial lines are the sink's business (a
    :class:`~pytest_recoverygate.events.StreamEventSource` keeps them per stream in
    bounded memory), so a giant line never sits in memory whole. ``on_line`` gets the
    file's lines for Slurm's own failure markers; of an unfinished line only the last
    :data:`MARKER_LINE_KEEP` bytes are kept between reads.

    Starts over from byte 0 when the file shrinks, its inode changes, or the bytes it
    already read are no longer there (truncated and rewritten past the offset between
    two polls, as a requeue without ``--open-mode=append`` does): the last bytes before
    the offset are compared at every poll, and after :meth:`restart` (``Restarts``
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

    def __init__(
        self,
        path: str,
        sink: Callable[[bytes, float], object],
        clock: Clock,
        *,
        interval: float = 0.2,
        on_line: Callable[[bytes, float], None] | None = None,
        on_start_over: Callable[[], None] | None = None,
        use_inotify: bool = True,
    ) -> None:
        self.path = path
        self._sink = sink
        self._clock = clock
        self._interval = interval
        self._on_line = on_line
        self._on_start_over = on_start_over
        self._use_inotify = use_inotify
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
        #: Whether the thread waits on inotify (False: polling only), once it has started.
        self.inotify = False

    def start(self) -> None:
        if self._thread is None:
            self._wake = os.pipe()
            self._thread = threading.Thread(
                target=self._loop, name="recoverygate-slurm-tail", daemon=True
            )
            self._thread.start()

    def restart(self) -> None:
        """Read the file again from the start at the next poll if it was rewritten."""
        with self._lock:
            self._restart_requested = True

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
            handle: BinaryIO = open(self.path, "rb")  # noqa: SIM115 - kept for the next poll
        except OSError:
            return 0  # not there (yet, or between a rename and its replacement)
        try:
            st = os.fstat(handle.fileno())
        except OSError:
            handle.close()
            return 0
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
        received = self._clock.now()
        self._offset += len(data)
        self._last_bytes = (self._last_bytes + data[-self._TAIL_CHECK :])[-self._TAIL_CHECK :]
        if len(self._head) < self._HEAD_CHECK:
            self._head += data[: self._HEAD_CHECK - len(self._head)]
        self._sink(data, received)
        if self._on_line is not None:
            self._lines(data, received)

    def _lines(self, data: bytes, received: float) -> None:
        assert self._on_line is not None
        lines = data.split(b"\n")
        rest = lines.pop()
        if lines:
            lines[0] = self._line + lines[0]
            self._line = b""
            for line in lines:
                self._on_line(line.rstrip(b"\r"), received)
        if len(rest) >= MARKER_LINE_KEEP:
            self._line = rest[-MARKER_LINE_KEEP:]
        else:
            self._line = (self._line + rest)[-MARKER_LINE_KEEP:]

    def _start_over(self) -> None:
        if self._inode is not None:
            self.restarts += 1
        if self._on_start_over is not None:
            self._on_start_over()
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
        notify = _Inotify.open(self.path) if self._use_inotify else None
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
                        self._clock.wakeup()
                except OSError:  # a reader hiccup must not end the drill; retry next poll
                    pass
                self._wait(poller, notify)
        finally:
            if notify is not None:
                notify.close()

    def _wait(self, poller: select.poll, notify: _Inotify | None) -> None:
        """Sleep until the next poll: at most the interval, less when inotify sees a write."""
        deadline = time.monotonic() + self._interval
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready = {fd for fd, _ in poller.poll(max(int(left * 1000), 1))}
            if notify is None or notify.fd not in ready:
                continue  # the deadline passed, or stop() wrote to the wake pipe
            if notify.drain():
                return


class SlurmEventSource:
    """The job's training events: its output file tailed into a StreamEventSource.

    Each content of the file is its own stream of the parser: when the tail starts over
    (truncation, rotation, a requeue that rewrites the file), the old content's stream is
    ended and a new one begins, so a partial line of the old content is never glued to the
    first line of the new one (an event cut off mid-line that way counts as malformed,
    like any cut line).
    """

    def __init__(self, stream: StreamEventSource) -> None:
        self._stream = stream
        self._generation = 0  # bumped by the tail's thread only
        self.tail: OutputTail | None = None
        #: the job's output file as ``job``; per task, the lines ``srun --label`` marks
        self.output = OutputSplitter(slurm_task_of, merged="job")

    def follow(
        self,
        path: str,
        clock: Clock,
        *,
        interval: float,
        on_line: Callable[[bytes, float], None] | None = None,
        use_inotify: bool = True,
    ) -> OutputTail:
        """The tail of ``path`` that feeds this source (not started: call ``start()``)."""
        if self.tail is not None:
            raise RuntimeError(f"already following {self.tail.path}")
        self.tail = OutputTail(
            path,
            self._feed,
            clock,
            interval=interval,
            on_line=on_line,
            on_start_over=self._started_over,
            use_inotify=use_inotify,
        )
        return self.tail

    def poll(self) -> list[TrainingEvent]:
        return self._stream.poll()

    @property
    def malformed_lines(self) -> int:
        return self._stream.malformed_lines

    def close(self) -> None:
        if self.tail is not None:
            self.tail.stop()
        self._stream.close()

    def _feed(self, chunk: bytes, received: float) -> None:
        self._stream.feed(chunk, received, stream=("slurm-output", self._generation))
        self.output.feed(chunk, self._generation)

    def _started_over(self) -> None:
        self._stream.end_stream(("slurm-output", self._generation))
        if self.tail is not None and self.tail.offset:
            self.output.end(self._generation)
            self.output.feed(
                b"\n[recoverygate: the output file was rewritten (a requeue, a rotation); "
                b"what follows is its new content]\n",
                ("marker", self._generation),
            )
        self._generation += 1


# ---------------------------------------------------------------------------------------
# The orchestrator
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Snapshot:
    job: JobInfo
    step: str  # the training step the workers were found in
    workers: dict[int, Worker]
    expected: int  # world size (WORLD_SIZE of the workers, else the step's task count)

    @property
    def complete(self) -> bool:
        return len(self.workers) >= self.expected


class SlurmOrchestrator:
    """Drills a running Slurm job: find ranks, kill one, watch it come back.

    ``fault`` is ``KillWorker`` (kill -9 one rank's process on its node, the default),
    ``KillStep`` (``scancel --signal=KILL J.S``: the whole step, as a node crash looks)
    or ``Requeue`` (``scontrol requeue J``: the graceful path).
    """

    name = "slurm"

    def __init__(
        self,
        *,
        job_id: str | int | None = None,
        job_name: str | None = None,
        user: str | None = None,
        partition: str | None = None,
        output: str | None = None,
        poll_interval: float = 1.0,
        fault: str = "KillWorker",
        target_rank: int = 1,
        reporting_rank: int | None = None,
        clock: Clock,
        slurm_conf: str | None = None,
        env: Mapping[str, str] | None = None,
        command_timeout: float = 20.0,
    ) -> None:
        if job_id is None and not job_name:
            raise UsageError("the slurm backend needs workload.jobId or workload.jobName")
        if fault not in FAULT_TYPES:
            raise UsageError(
                f"unknown fault type {fault!r} for slurm; use one of {', '.join(FAULT_TYPES)}"
            )
        if poll_interval <= 0:
            raise UsageError(f"poll interval must be positive, got {poll_interval}")
        self.job_id = str(job_id) if job_id is not None else None
        self.job_name = job_name
        self.user = user
        self.partition = partition
        self.output = output
        self.poll_interval = poll_interval
        self.fault = fault
        self.target_rank = target_rank
        self.reporting_rank = reporting_rank
        self.clock = clock
        self.commands = SlurmCommands(slurm_conf=slurm_conf, env=env, timeout=command_timeout)
        self._stream = StreamEventSource(wakeup=clock.wakeup, clock=clock.now)
        self._events = SlurmEventSource(self._stream)
        self._lock = threading.Lock()
        self._pending: list[GroupEvent] = []
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._snapshot: _Snapshot | None = None
        self._killed: Worker | None = None
        self._kill_time: float | None = None
        self._kill_restarts = 0
        self._restarts = 0
        self._gone = False
        self._restarting = False
        self._pending_reported = False
        self._replacement: Worker | None = None
        self._ended = False
        self._closed = False

    @classmethod
    def from_config(cls, config: Any, clock: Clock) -> SlurmOrchestrator:
        """Build from a validated DrillConfig (``workload`` and ``inject_failure`` sections)."""
        workload = config.workload
        inject = config.inject_failure
        poll = getattr(workload, "poll_interval", None)
        target = getattr(inject, "target_rank", None)
        return cls(
            job_id=getattr(workload, "job_id", None),
            job_name=getattr(workload, "job_name", None),
            user=getattr(workload, "user", None),
            partition=getattr(workload, "partition", None),
            output=str(workload.output) if getattr(workload, "output", None) else None,
            poll_interval=float(poll) if poll else 1.0,
            fault=str(getattr(inject, "type", "KillWorker") or "KillWorker"),
            target_rank=int(target) if target is not None else 1,
            reporting_rank=getattr(workload, "reporting_rank", None),
            clock=clock,
            slurm_conf=getattr(workload, "slurm_conf", None),
        )

    # --- discovery ----------------------------------------------------------------------

    def discover(self, deadline: float) -> Workload:
        """Find the job and its ranks; wait (until ``deadline``) for it to be running."""
        self.commands.check_setup()
        job_id = self.job_id or self._find_job_by_name()
        self.job_id = job_id
        last_problem = "nothing checked yet"
        while True:
            try:
                job = self.commands.show_job(job_id)
            except JobGone:
                raise DiscoveryError(
                    f"Slurm job {job_id} does not exist (or ended more than MinJobAge ago); "
                    "check the jobId with 'squeue --me'"
                ) from None
            if job.state in FINAL_STATES:
                raise DiscoveryError(f"Slurm job {job_id} is not running: {job.describe_end()}")
            if self.fault == "Requeue" and not job.requeue:
                raise DiscoveryError(
                    f"Slurm job {job_id} cannot be requeued (Requeue=0, submitted with "
                    "--no-requeue or JobRequeue=0); submit it with --requeue, or drill it "
                    "with type: KillWorker"
                )
            if job.state == "RUNNING":
                snapshot = self._snapshot_workers(job)
                if snapshot is not None and snapshot.workers and snapshot.complete:
                    break
                if snapshot is None:
                    last_problem = f"job {job_id} is running but has no training step yet"
                else:
                    last_problem = (
                        f"step {job_id}.{snapshot.step} shows {len(snapshot.workers)} of "
                        f"{snapshot.expected} ranks (ranks {sorted(snapshot.workers)})"
                    )
            else:
                last_problem = f"job {job_id} is {job.state} (reason {job.reason})"
            if self.clock.now() >= deadline:
                raise DiscoveryError(f"gave up waiting for the workload: {last_problem}")
            self.clock.wait(min(self.poll_interval, max(deadline - self.clock.now(), 0.0)))
        self._snapshot = snapshot
        self._restarts = job.restarts
        self._start_tail(job)
        self._start_watcher()
        workers = tuple(snapshot.workers[rank] for rank in sorted(snapshot.workers))
        return Workload(job=f"slurm job {job_id} ({job.name})", workers=workers)

    def _find_job_by_name(self) -> str:
        assert self.job_name
        rows = self.commands.find_jobs(self.job_name, self.user, self.partition)
        ids = sorted({row["JobID"] for row in rows if row.get("JobID")})
        where = f"name {self.job_name!r}" + (f", user {self.user}" if self.user else "")
        if not ids:
            raise DiscoveryError(
                f"no pending or running Slurm job with {where}; check 'squeue --me'"
            )
        if len(ids) > 1:
            raise DiscoveryError(
                f"{len(ids)} Slurm jobs match {where} ({', '.join(ids)}); "
                "set workload.jobId to pick one"
            )
        return ids[0]

    def _training_steps(self, job_id: str) -> list[StepInfo]:
        return [
            s for s in self.commands.show_steps(job_id) if s.is_training and s.state == "RUNNING"
        ]

    def _snapshot_workers(self, job: JobInfo) -> _Snapshot | None:
        """The ranks of the job's running training step, read on every node of the step."""
        steps = self._training_steps(job.job_id)
        if not steps:
            return None
        if len(steps) > 1:
            names = ", ".join(f"{job.job_id}.{s.step} ({s.name})" for s in steps)
            raise DiscoveryError(
                f"job {job.job_id} runs several steps at once ({names}); RecoveryGate drills a job "
                "with one training step"
            )
        step = steps[0]
        rows: list[ProcessRow] = []
        for node in self.commands.hostnames(step.nodes or job.nodes):
            try:
                out = self.commands.srun_on_node(
                    job.job_id, node, PROBE_STEP_NAME, PROBE_SCRIPT, job.job_id
                )
            except (JobGone, BackendError):
                return None  # the step or job ended while we looked; try again later
            found = parse_probe_output(out, node)
            if found is None:
                return None
            rows += [r for r in found if r.step == step.step]
        ranks = assign_ranks(rows)
        workers = {rank: self._worker(job, step.step, row, rank) for rank, row in ranks.items()}
        sizes = [r.world_size for r in ranks.values() if r.world_size is not None]
        expected = max(sizes) if sizes else step.tasks
        return _Snapshot(job=job, step=step.step, workers=workers, expected=expected)

    def _worker(self, job: JobInfo, step: str, row: ProcessRow, rank: int) -> Worker:
        details: tuple[tuple[str, str], ...] = (
            ("job", job.job_id),
            ("step", step),
            ("pid", str(row.pid)),
            ("start", row.start),
            ("restarts", str(job.restarts)),
            ("comm", row.comm),
        )
        if row.restart_count is not None:
            details += (("torchelastic_restart_count", str(row.restart_count)),)
        return Worker(
            rank=rank,
            name=f"{job.job_id}.{step} rank {rank}",
            instance_id=f"{job.job_id}.{step}/{row.pid}@{row.start}",
            node=row.node,
            details=details,
        )

    # --- the kill -----------------------------------------------------------------------

    def kill(self, worker: Worker, *, dry_run: bool) -> KillResult:
        details = dict(worker.details)
        job_id = details.get("job", self.job_id or "")
        step = details.get("step", "")
        if self.fault == "KillWorker":
            # The instance id is the identity: job.step/pid@start, as discover() issued it.
            # Details are for display only, so a stale Worker can never aim at a live pid.
            match = _INSTANCE_ID.fullmatch(worker.instance_id)
            if match is None:
                return KillResult(
                    KillOutcome.ALREADY_GONE,
                    self.clock.now(),
                    f"{worker.instance_id!r} is not a SLURM worker instance this drill "
                    "discovered; nothing was touched",
                )
            details.update(match.groupdict())
            result = self._kill_worker(worker, details, dry_run)
        else:
            result = self._kill_job_level(job_id, step, details, dry_run)
        if result.outcome is KillOutcome.KILLED:
            with self._lock:
                self._killed = worker
                self._kill_time = result.timestamp
                self._kill_restarts = _int(details.get("restarts", "0"))
        return result

    def _kill_worker(self, worker: Worker, details: dict[str, str], dry_run: bool) -> KillResult:
        """kill -9 one rank on its node, once.

        The kill step runs through ``run_destructive``: it is sent again only when it is
        certain it never started (no connection to slurmctld, no step created). Once it
        may have run -- a timeout, a lost answer, srun failing after the step started --
        its outcome is unknown, and asking again would find the victim gone and wrongly
        report "nothing was killed", so the result is UNCONFIRMED (the drill ends in ERROR).
        """
        job_id, pid, start = details["job"], details["pid"], details["start"]
        mode = "check" if dry_run else "kill"
        target = f"{worker.describe()} (pid {pid} on {worker.node})"
        sent_at = self.clock.now()  # the kill happens no earlier than this
        try:
            out = self.commands.srun_on_node(
                job_id,
                worker.node,
                KILL_STEP_NAME,
                KILL_SCRIPT,
                pid,
                start,
                mode,
                destructive=not dry_run,
            )
        except (JobGone, BackendError) as exc:
            return self._failed_destructive(
                exc,
                job_id,
                not_started=lambda e: (
                    f"the kill step for {target} never started ({e}); nothing was killed"
                ),
                unknown=lambda e: (
                    f"the kill step for {target} may have run, its outcome is unknown: {e}"
                ),
            )
        now = self.clock.now()
        verdict = next(
            (line.split()[1:] for line in out.splitlines() if line.startswith("RGKILL ")), []
        )
        what = verdict[0] if verdict else "no answer"
        if what == "killed":
            # The node's own time of the kill (the clock the job's lines are stamped with),
            # else when the step was sent: never the time the answer came back, which
            # would shorten the recovery time by the step's latency.
            try:
                killed_at = float(verdict[1])
            except (IndexError, ValueError):
                killed_at = sent_at
            return KillResult(KillOutcome.KILLED, killed_at, f"kill -9 {target}")
        if what == "alive":
            return KillResult(KillOutcome.DRY_RUN, now, f"would kill -9 {target}; it is running")
        if what in ("gone", "replaced"):
            return KillResult(
                KillOutcome.ALREADY_GONE, now, f"{target} no longer exists; nothing was killed"
            )
        return KillResult(KillOutcome.UNCONFIRMED, now, f"kill step answered {out.strip()!r}")

    def _kill_job_level(
        self, job_id: str, step: str, details: dict[str, str], dry_run: bool
    ) -> KillResult:
        """``scancel --signal=KILL J.S`` or ``scontrol requeue J``, sent at most once.

        Both act on the controller; a timeout or a lost answer may come after they acted
        (a requeue re-sent after that would requeue the replacement run), so they go
        through ``run_destructive`` and any failure past "never sent" is UNCONFIRMED.
        """
        try:
            job = self.commands.show_job(job_id)
        except JobGone:
            return KillResult(KillOutcome.ALREADY_GONE, self.clock.now(), f"job {job_id} is gone")
        if job.restarts != _int(details.get("restarts", "0")) or job.state != "RUNNING":
            return KillResult(
                KillOutcome.ALREADY_GONE,
                self.clock.now(),
                f"job {job_id} is no longer the run discovered "
                f"(state {job.state}, Restarts {job.restarts})",
            )
        if self.fault == "KillStep":
            args = ["scancel", "--signal=KILL", f"{job_id}.{step}"]
            if step not in {s.step for s in self._training_steps(job_id)}:
                return KillResult(
                    KillOutcome.ALREADY_GONE, self.clock.now(), f"step {job_id}.{step} ended"
                )
        else:
            args = ["scontrol", "requeue", job_id]
        if dry_run:
            return KillResult(KillOutcome.DRY_RUN, self.clock.now(), f"would run: {' '.join(args)}")
        sent_at = self.clock.now()  # it acts no earlier than this
        try:
            self.commands.run_destructive(args)
        except (JobGone, BackendError) as exc:
            command = " ".join(args)
            return self._failed_destructive(
                exc,
                job_id,
                not_started=lambda e: f"{command} never reached slurmctld ({e}); nothing was done",
                unknown=lambda e: f"{command} failed; whether it acted is unknown: {e}",
            )
        return KillResult(KillOutcome.KILLED, sent_at, " ".join(args))

    def _failed_destructive(
        self,
        exc: Exception,
        job_id: str,
        *,
        not_started: Callable[[Exception], str],
        unknown: Callable[[Exception], str],
    ) -> KillResult:
        """What a destructive command that raised means: the job is gone, the command
        certainly never started, or whether it acted is unknown (UNCONFIRMED either way,
        since only the first is proof that nothing else was hit)."""
        now = self.clock.now()
        if isinstance(exc, JobGone):
            return KillResult(KillOutcome.ALREADY_GONE, now, f"job {job_id} is gone")
        if isinstance(exc, CommandNotStarted):
            return KillResult(KillOutcome.UNCONFIRMED, now, not_started(exc))
        return KillResult(KillOutcome.UNCONFIRMED, now, unknown(exc))

    # --- watching -----------------------------------------------------------------------

    def watch_group(self) -> list[GroupEvent]:
        with self._lock:
            events, self._pending = self._pending, []
            error, self._error = self._error, None
        if error is not None and not events:
            raise error
        if error is not None:
            with self._lock:
                self._error = error
        return events

    def events(self) -> EventSource:
        return self._events

    def job_output(self) -> JobOutput:
        """The job's output file as the tail read it; per task with ``srun --label``."""
        path = self._events.tail.path if self._events.tail is not None else "not found yet"
        return self._events.output.output(
            note=(
                f"the job's output file ({path}) as ``job``; lines srun --label marks "
                "(0: …) also in that task's file"
            ),
            order=["job"],
        )

    def cleanup(self) -> None:
        """Stop the watcher and the tail. The job itself is the user's and is left alone."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=max(self.commands.timeout * 2, 10))
        self._events.close()

    def _emit(
        self,
        kind: GroupEventKind,
        detail: str,
        worker: Worker | None = None,
        restarts: int | None = None,
    ) -> None:
        event = GroupEvent(kind, self.clock.now(), detail, worker, restarts)
        with self._lock:
            self._pending.append(event)
        self.clock.wakeup()

    def _mark_gone(self) -> bool:
        """True for the first caller only: WORKER_GONE is reported once."""
        with self._lock:
            first, self._gone = not self._gone, True
        return first

    def _start_watcher(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(
                target=self._watch_loop, name="recoverygate-slurm-watch", daemon=True
            )
            self._watcher.start()

    def _watch_loop(self) -> None:
        failures = 0
        while not self._stop.is_set() and not self._ended:
            try:
                self._watch_once()
                failures = 0
            except (BackendError, PermissionDeniedError) as exc:
                failures += 1
                # A controller restart takes a few polls; only a lasting outage ends the drill.
                if failures * self.poll_interval >= 30 or isinstance(exc, PermissionDeniedError):
                    with self._lock:
                        self._error = exc
                    self.clock.wakeup()
                    return
            except Exception as exc:  # surfaced through watch_group, never lost in a thread
                with self._lock:
                    self._error = BackendError(f"the slurm watcher stopped: {exc!r}")
                self.clock.wakeup()
                return
            self._stop.wait(self.poll_interval)

    def _watch_once(self) -> None:
        assert self.job_id is not None
        try:
            job = self.commands.show_job(self.job_id)
        except JobGone:
            self._ended = True
            self._emit(
                GroupEventKind.JOB_FAILED, f"job {self.job_id} is no longer known to slurmctld"
            )
            return
        with self._lock:
            killed, kill_restarts = self._killed, self._kill_restarts
        if job.restarts > self._restarts:
            self._restarts = job.restarts
            if self._events.tail is not None:
                self._events.tail.restart()
            if killed is not None and self._mark_gone():
                self._emit(GroupEventKind.WORKER_GONE, f"job {job.job_id} was requeued", killed)
            if killed is not None and self._replacement is None and not self._restarting:
                self._restarting = True
                self._emit(
                    GroupEventKind.RESTARTING,
                    f"job {job.job_id} was requeued (Restarts={job.restarts})",
                    restarts=job.restarts,
                )
        if job.state in FINAL_STATES:
            self._ended = True
            if job.state == "COMPLETED" and (killed is None or self._replacement is not None):
                return  # training finished normally
            self._emit(GroupEventKind.JOB_FAILED, job.describe_end())
            return
        if killed is None or self._replacement is not None:
            return
        if job.state in WAITING_STATES:
            if not self._pending_reported and job.restarts > kill_restarts:
                self._pending_reported = True
                self._emit(
                    GroupEventKind.REPLACEMENT_PENDING,
                    f"requeued job {job.job_id} is {job.state} (reason {job.reason})",
                    restarts=job.restarts,
                )
            return
        if job.state != "RUNNING":
            return
        self._look_for_replacement(job, killed, kill_restarts)

    def _look_for_replacement(self, job: JobInfo, killed: Worker, kill_restarts: int) -> None:
        old = dict(killed.details)
        try:
            snapshot = self._snapshot_workers(job)
        except DiscoveryError:
            return
        worker = snapshot.workers.get(killed.rank) if snapshot is not None else None
        if (
            worker is not None
            and worker.instance_id == killed.instance_id
            and job.restarts == kill_restarts
        ):
            return  # the kill has not landed yet
        if self._mark_gone():
            where = (
                f"rank {killed.rank} (pid {old.get('pid')}) is gone from step "
                f"{job.job_id}.{old.get('step')}"
            )
            self._emit(GroupEventKind.WORKER_GONE, where, killed)
        if worker is None or snapshot is None:
            return
        new = dict(worker.details)
        if job.restarts > kill_restarts:
            path = (
                f"requeued job {job.job_id} runs again "
                f"(Restarts={job.restarts}, step {snapshot.step})"
            )
            count: int | None = job.restarts
        elif snapshot.step == old.get("step"):
            count = _int_or_none(new.get("torchelastic_restart_count", "-"))
            path = f"torchrun restarted the workers inside step {job.job_id}.{snapshot.step}"
            if count is not None:
                path += f" (TORCHELASTIC_RESTART_COUNT={count})"
        else:
            path = f"a new step {job.job_id}.{snapshot.step} started in the same allocation"
            count = None
        if not self._restarting:
            self._restarting = True
            self._emit(GroupEventKind.RESTARTING, path, restarts=count)
        self._replacement = worker
        self._emit(
            GroupEventKind.REPLACEMENT_RUNNING, f"{path}: {worker.describe()}", worker, count
        )

    # --- the output file ----------------------------------------------------------------

    def output_path(self, job: JobInfo) -> str:
        if self.output:
            path = expand_output_pattern(self.output, job)
        elif job.stdout:
            path = job.stdout
        else:
            path = f"slurm-{job.job_id}.out"
        if not os.path.isabs(path) and job.work_dir:
            path = os.path.join(job.work_dir, path)
        return path

    def _start_tail(self, job: JobInfo) -> None:
        if self._events.tail is not None:
            return
        tail = self._events.follow(
            self.output_path(job),
            self.clock,
            interval=min(self.poll_interval, 0.25),
            on_line=self._on_output_line,
        )
        tail.start()

    def _on_output_line(self, line: bytes, received: float) -> None:
        if b"error" not in line and b"srun:" not in line:
            return
        marker = parse_slurm_marker(line.decode("utf-8", "replace"))
        if marker is None:
            return
        with self._lock:
            after_kill = self._kill_time is not None and received >= self._kill_time
            killed = self._killed
            report = after_kill and not self._gone
            if report:
                self._gone = True
        if report:
            self._emit(GroupEventKind.WORKER_GONE, f"Slurm reported: {marker}", killed)
