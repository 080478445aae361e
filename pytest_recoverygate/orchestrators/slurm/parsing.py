"""What the Slurm clients and RecoveryGate's node scripts print, and how it is read.

Pure: text in, values out, no command runs here. Tested against outputs captured from
real Slurm releases (``tests/slurm/data/``). ``sacct`` needs slurmdbd, ``scontrol --json``
does not exist on 22.05 and ``squeue --json`` ignores ``-j``, so the job is read with
``scontrol show job -o`` and its steps with ``scontrol show step -o``;
:func:`parse_scontrol_records` reads the 22.05 one-line form and the multi-line form
newer releases print to humans. The two scripts RecoveryGate runs on a job's node
(:data:`PROBE_SCRIPT`, :data:`KILL_SCRIPT`) are here too, next to the parser of what
they print: they are constant text and receive pids and job ids as arguments only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_recoverygate.errors import DiscoveryError

__all__ = [
    "FINAL_STATES",
    "KILL_SCRIPT",
    "KILL_SIGNALS",
    "KILL_STEP_NAME",
    "NODE_KILL_SCRIPT",
    "NON_TRAINING_STEPS",
    "PROBE_SCRIPT",
    "PROBE_STEP_NAME",
    "SQUEUE_FIELDS",
    "WAITING_STATES",
    "JobInfo",
    "ProcessRow",
    "StepInfo",
    "assign_ranks",
    "expand_output_pattern",
    "int_or_none",
    "int_or_zero",
    "output_file",
    "parse_listpids",
    "parse_probe_output",
    "parse_scontrol_records",
    "parse_slurm_marker",
    "parse_squeue_rows",
]

PROBE_STEP_NAME = "recoverygate-probe"
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

# Run on the job's node inside an overlapping step: list every process of the job there
# with its parent, start time (clock ticks since boot), RANK and torchrun restart count.
# $1 is the job id. Constant text; nothing from the user is interpolated.
# Everything a job controls (its processes' names, environments, command lines) is hostile
# text: only numbers that pass `num`, a name cut to [A-Za-z0-9._-] and the constant
# "launcher" reach the output, so no row can carry a newline or an extra field. First the
# pids scontrol listpids lists (RGPIDS, ended by RGPIDS-END: nothing a job controls is
# printed before it), then one RGPROBE row per listed pid; the parser accepts a row only
# for a pid listed for that same step, once.
PROBE_SCRIPT = r"""
job=$1
num() { case "$1" in ''|*[!0-9]*) echo - ;; *) echo "$1" ;; esac; }
listed=$(scontrol listpids "$job" 2>/dev/null \
  | awk '$1 ~ /^[0-9]+$/ && $3 ~ /^[A-Za-z0-9_]+$/ && $5 ~ /^([0-9]+|-)$/ { print $1, $3, $5 }')
printf '%s\n' "$listed" | while read -r pid step global; do
  [ -n "$pid" ] && echo "RGPIDS $pid $step $global"
done
echo "RGPIDS-END"
printf '%s\n' "$listed" | while read -r pid step global; do
  [ -n "$pid" ] || continue
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
  rest=${stat##*) }
  set -- $rest
  ppid=$(num "$2")
  start=$(num "${20}")
  envs=$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null)
  rank=$(num "$(printf '%s\n' "$envs" | sed -n 's/^RANK=//p' | head -n 1)")
  restart=$(num "$(printf '%s\n' "$envs" | sed -n 's/^TORCHELASTIC_RESTART_COUNT=//p' | head -n 1)")
  world=$(num "$(printf '%s\n' "$envs" | sed -n 's/^WORLD_SIZE=//p' | head -n 1)")
  comm=$(head -c 16 "/proc/$pid/comm" 2>/dev/null | tr -d '\n' | tr -c 'A-Za-z0-9._-' '_')
  launcher=-
  for arg in $(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | head -n 3 | tr -d ' '); do
    case "$arg" in
      torchrun|*/torchrun|torch.distributed.run|torch.distributed.launch) launcher=launcher ;;
    esac
  done
  echo "RGPROBE $pid $step $global $ppid $start $rank $restart ${comm:--} $world $launcher"
done
echo "RGPROBE-END"
"""

# Run on the target's node: send one signal to the pid only if scontrol listpids lists it
# for the job's step on this node (a process of that step, not any process of the node)
# and its start time is still the one discovered (same instance), read again just before
# the signal. $1 = job, $2 = step, $3 = pid, $4 = start time, $5 = "kill" or "check",
# $6 = the signal: KILL (the default), TERM, STOP or CONT; anything else is refused.
# "RGKILL killed TIME" means kill(1) delivered the signal, whichever it was, at the
# node's TIME; "RGKILL unlisted" that the pid is not one of the step's: nothing was sent.
KILL_SCRIPT = r"""
job=$1; step=$2; pid=$3; want=$4; mode=$5; sig=${6:-KILL}
case "$sig" in KILL|TERM|STOP|CONT) ;; *) echo "RGKILL refused $sig"; exit 0 ;; esac
case "$pid" in ''|*[!0-9]*) echo "RGKILL refused pid"; exit 0 ;; esac
stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { echo "RGKILL gone"; exit 0; }
listed=$(scontrol listpids "$job.$step" 2>/dev/null \
  | awk '$1 == p && $3 == s { print "yes"; exit }' p="$pid" s="$step")
[ "$listed" = yes ] || { echo "RGKILL unlisted"; exit 0; }
stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { echo "RGKILL gone"; exit 0; }
rest=${stat##*) }
set -- $rest
if [ "${20}" != "$want" ]; then echo "RGKILL replaced ${20}"; exit 0; fi
if [ "$mode" = check ]; then echo "RGKILL alive $1"; exit 0; fi
if kill -s "$sig" "$pid"; then echo "RGKILL killed $(date +%s.%N)"; else echo "RGKILL failed"; fi
"""
# Run on the target's node (KillNode): SIGKILL every process of the training step on this
# node at once (the torchrun agent, its workers and their children: what a host crash
# takes), only if the discovered worker there is still the same instance.
# $1 = job, $2 = step, $3 = pid, $4 = its start time, $5 = "kill" or "check".
# scontrol listpids asks this node's slurmd only: another node's processes are never
# listed, and neither is this kill step (another step). "RGKILL killed TIME N PIDS...",
# then "RGNODE gone TIME" once every one of them is dead or a zombie (within 5 s).
NODE_KILL_SCRIPT = r"""
job=$1; step=$2; pid=$3; want=$4; mode=$5
stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { echo "RGKILL gone"; exit 0; }
rest=${stat##*) }
set -- $rest
if [ "${20}" != "$want" ]; then echo "RGKILL replaced ${20}"; exit 0; fi
pids=$(scontrol listpids "$job.$step" 2>/dev/null \
  | awk '$1 ~ /^[0-9]+$/ && $3 == s { print $1 }' s="$step" | sort -un)
[ -n "$pids" ] || { echo "RGKILL gone"; exit 0; }
n=$(printf '%s\n' $pids | wc -l)
if [ "$mode" = check ]; then echo "RGKILL alive $n" $pids; exit 0; fi
t=$(date +%s.%N)
kill -s KILL $pids 2>/dev/null  # one kill(1) for all; a pid that just exited is fine
echo "RGKILL killed $t $n" $pids
i=0; left=$pids
while [ -n "$left" ] && [ $i -lt 50 ]; do
  still=""
  for p in $left; do
    st=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    r=${st##*) }; set -- $r; [ "$1" = Z ] || still="$still $p"
  done
  left=$still; [ -n "$left" ] && sleep 0.1; i=$((i + 1))
done
if [ -z "$left" ]; then echo "RGNODE gone $(date +%s.%N)"; else echo "RGNODE alive" $left; fi
"""
#: The signals :data:`KILL_SCRIPT` sends, by name.
KILL_SIGNALS = ("KILL", "TERM", "STOP", "CONT")


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
    command: str = ""  # the batch script (sbatch) or the command (srun, salloc)

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
            restarts=int_or_zero(record.get("Restarts", "0")),
            exit_code=record.get("ExitCode", ""),
            nodes=_null(record.get("NodeList", "")),
            batch_host=_null(record.get("BatchHost", "")),
            stdout=_null(record.get("StdOut", "")),
            work_dir=_null(record.get("WorkDir", "")),
            partition=record.get("Partition", ""),
            requeue=record.get("Requeue", "1") != "0",
            command=_null(record.get("Command", "")),
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
            tasks=int_or_zero(record.get("Tasks", "0")),
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
        rows.append(ProcessRow(pid=int(parts[0]), step=parts[2], global_id=int_or_none(parts[4])))
    return rows


_PROBE_ROW = re.compile(
    r"RGPROBE (?P<pid>[0-9]+) (?P<step>[A-Za-z0-9_]+) (?P<global>[0-9]+|-) (?P<ppid>[0-9]+|-) "
    r"(?P<start>[0-9]+) (?P<rank>[0-9]+|-) (?P<restart>[0-9]+|-) (?P<comm>[A-Za-z0-9._-]+) "
    r"(?P<world>[0-9]+|-) (?P<launcher>launcher|-)"
)
_LISTED_ROW = re.compile(r"RGPIDS (?P<pid>[0-9]+) (?P<step>[A-Za-z0-9_]+) (?P<global>[0-9]+|-)")


def parse_probe_output(text: str, node: str) -> list[ProcessRow] | None:
    """Parse the probe's output; None when the probe did not run to its end.

    The probe prints the pids ``scontrol listpids`` lists (``RGPIDS``, up to
    ``RGPIDS-END``), then one ``RGPROBE`` row per listed pid. A row is accepted only in
    the exact form the probe prints, for a pid listed for that same step, once: a row
    for a pid the listing does not have, a second row for one pid, or any other line
    that starts with ``RGPROBE`` is a job forging the probe's output (its process names
    and environment are its own to choose), and the whole probe is refused
    (:class:`DiscoveryError`) so that nothing is ever aimed at such a pid.
    """
    lines = [line.strip() for line in text.splitlines()]
    if "RGPROBE-END" not in lines:
        return None
    listed: dict[int, tuple[str, int | None]] = {}
    rows: dict[int, ProcessRow] = {}
    in_listing = True
    for line in lines:
        if in_listing:
            if line == "RGPIDS-END":
                in_listing = False
            elif (pids := _LISTED_ROW.fullmatch(line)) is not None:
                listed[int(pids["pid"])] = (pids["step"], int_or_none(pids["global"]))
            continue
        if not line.startswith("RGPROBE") or line == "RGPROBE-END":
            continue
        row = _probe_row(line, node, listed)
        if row.pid in rows:
            raise DiscoveryError(_forged(node, f"a second row for pid {row.pid}"))
        rows[row.pid] = row
    if in_listing:
        raise DiscoveryError(
            f"the probe on node {node} printed no RGPIDS-END (not RecoveryGate's probe, or "
            "an older one); refusing to aim at any process it names"
        )
    return list(rows.values())


def _probe_row(line: str, node: str, listed: Mapping[int, tuple[str, int | None]]) -> ProcessRow:
    """One ``RGPROBE`` row, checked against the listing (see :func:`parse_probe_output`)."""
    match = _PROBE_ROW.fullmatch(line)
    if match is None:
        raise DiscoveryError(_forged(node, f"a malformed row {line[:120]!r}"))
    pid = int(match["pid"])
    step, global_id = listed.get(pid, ("", None))
    if step != match["step"] or global_id != int_or_none(match["global"]):
        raise DiscoveryError(
            _forged(
                node,
                f"a row for pid {pid} in step {match['step']} that scontrol listpids "
                "does not list for the job there",
            )
        )
    return ProcessRow(
        pid=pid,
        step=step,
        global_id=global_id,
        ppid=int_or_zero(match["ppid"]),
        start=match["start"],
        rank_env=int_or_none(match["rank"]),
        restart_count=int_or_none(match["restart"]),
        comm=match["comm"],
        node=node,
        world_size=int_or_none(match["world"]),
        launcher=match["launcher"] == "launcher",
    )


def _forged(node: str, what: str) -> str:
    return (
        f"the probe on node {node} printed {what}; a process of the job may be forging the "
        "probe's output (a newline in its name or environment), so no process it names is "
        "trusted and nothing is signalled"
    )


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


# The job writes the lines these read, so every repetition is bounded and no two
# quantifiers can trade the same characters: a search costs a bounded amount per place
# the literal prefix occurs, never the square of the line (``CANCELLED.*?\s*\*\*\*``
# took 2.3 s on 40 kB of spaces). Node names, job ids and the reason are short in Slurm.
_MARKERS = (
    re.compile(
        r"srun: error: (?P<node>[^\s:]{1,255}): tasks? (?P<tasks>[0-9,\-]{1,1024}): "
        r"(?P<what>[^\n]{1,1024})"
    ),
    re.compile(
        r"slurmstepd: error: \*\*\* (?P<kind>JOB|STEP) (?P<id>\S{1,64}) ON (?P<node>\S{1,255}) "
        r"(?P<what>CANCELLED[^*]{0,512})\*\*\*"
    ),
    re.compile(r"srun: (?P<what>forcing job termination)"),
    re.compile(r"srun: error: (?P<what>Node failure on \S{1,255})"),
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


def output_file(pattern: str | None, job: JobInfo) -> str:
    """The job's output file: the user's ``output`` pattern expanded, else the job's
    ``StdOut``, else Slurm's default ``slurm-<id>.out``; relative paths are under its
    working directory."""
    if pattern:
        path = expand_output_pattern(pattern, job)
    elif job.stdout:
        path = job.stdout
    else:
        path = f"slurm-{job.job_id}.out"
    if not os.path.isabs(path) and job.work_dir:
        path = os.path.join(job.work_dir, path)
    return path


def int_or_zero(value: str) -> int:
    """A number Slurm printed, or 0 when it printed something else."""
    try:
        return int(value)
    except ValueError:
        return 0


def int_or_none(value: str) -> int | None:
    """A number the probe printed, or None for its ``-`` (not set)."""
    return int(value) if value.lstrip("-").isdigit() and value != "-" else None


def _null(value: str) -> str:
    return "" if value in ("(null)", "None", "n/a") else value
