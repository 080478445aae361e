"""The SLURM orchestrator: find a running job's ranks, kill one, watch the job come back.

Why it looks the way it does (facts measured on Slurm 22.05, see docs/slurm.md):

- The job is read with ``scontrol show job -o`` (state, ``Restarts``, the expanded
  ``StdOut`` path, nodes) and its steps with ``scontrol show step -o`` (why these, and
  how: :mod:`.parsing`).
- ``scancel --signal=KILL J.S`` kills every task of a step, not one rank. A single rank
  gets a signal alone only by ``kill`` of its pid on its node, so both the lookup and the
  kill run *on the node*, inside the job, through ``srun --jobid=J --overlap -w NODE``.
  The kill step signals only a pid ``scontrol listpids`` lists for the job's step there,
  with the start time discovered: no replacement and no process outside the step is ever
  hit (the job controls what the probe reads: :mod:`.parsing`). One script carries
  every fault that hits one rank: SIGKILL (KillWorker, KillDuringCheckpoint), SIGTERM and
  a second identity-checked step with SIGKILL after the grace period (Preempt), SIGSTOP
  and, at cleanup, SIGCONT (HangWorker).
- A rank is a worker process's ``RANK`` environment variable (torchrun's workers) or,
  when no process of the step has one, its Slurm task id (``GLOBALID`` of ``scontrol
  listpids``, i.e. ``SLURM_PROCID``). The top process of each rank's subtree is the
  worker; data-loader children inherit ``RANK`` and are skipped.
- Recovery comes in three shapes: torchrun restarts its workers inside the step (new
  pids, same step), the batch script starts a new step in the same allocation (new step
  id), or the job is requeued (``Restarts`` increments, the job pends, then runs again).
  A job that reaches a final state instead is ``JOB_FAILED``.
- Training events come from the job's ``StdOut`` file, tailed from a byte offset by the
  shared :class:`~pytest_recoverygate.shared.filetail.OutputTail` in bounded memory
  (:mod:`.events`). inotify wakes it early where it works; the poll interval still
  bounds the wait, because inotify does not see writes from other nodes on NFS or
  Lustre, where real output files live.

Only this package runs ``squeue``/``scontrol``/``scancel``/``srun`` (:mod:`.commands`:
timeouts, retries of reads, destructive commands never sent twice once they may have
acted; a kill whose outcome is unknown is ``UNCONFIRMED`` and the drill ends in ERROR).
What the clients print is read in :mod:`.parsing`, purely. No command goes through a
shell with user-provided text: the scripts run on the node are constants and receive
pids and job ids as arguments.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import (
    BackendError,
    DiscoveryError,
    PermissionDeniedError,
    UsageError,
)
from pytest_recoverygate.orchestrators.slurm import FAULT_TYPES
from pytest_recoverygate.orchestrators.slurm.commands import (
    JobGone,
    SlurmCommands,
    failed_destructive,
)
from pytest_recoverygate.orchestrators.slurm.events import SlurmEventSource, uid_of
from pytest_recoverygate.orchestrators.slurm.nodes import (
    NodeKills,
    job_nodes,
    rgnode_gone,
    signal_time,
)
from pytest_recoverygate.orchestrators.slurm.parsing import (
    FINAL_STATES,
    KILL_SCRIPT,
    KILL_SIGNALS,
    KILL_STEP_NAME,
    PROBE_SCRIPT,
    PROBE_STEP_NAME,
    WAITING_STATES,
    JobInfo,
    ProcessRow,
    StepInfo,
    assign_ranks,
    int_or_none,
    int_or_zero,
    output_file,
    parse_probe_output,
    parse_slurm_marker,
)
from pytest_recoverygate.orchestrators.slurm.storage import JobStorage
from pytest_recoverygate.orchestrators.slurm.submit import Submission, SubmittedJob
from pytest_recoverygate.registry.seams import Clock, EventSource, cleanup_once, node_moved
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.joboutput import JobOutput

__all__ = ["SlurmOrchestrator"]
_INSTANCE_ID = re.compile(r"(?P<job>[^./@]+)\.(?P<step>[^/@]+)/(?P<pid>\d+)@(?P<start>\d+)")
#: The signal of each fault that hits one rank through the kill step; the others
#: (KillStep, Requeue) act on the controller.
SIGNAL_OF = {
    "KillWorker": "KILL",
    "KillDuringCheckpoint": "KILL",
    "Preempt": "TERM",
    "HangWorker": "STOP",
    "KillDuringRecovery": "KILL",  # both kills; the second hits the replacement
    "StickyFault": "KILL",  # scope checkpoint: the kill after the damage
}


@dataclass(frozen=True, slots=True)
class _Snapshot:
    job: JobInfo
    step: str  # the training step the workers were found in
    workers: dict[int, model.Worker]
    expected: int  # world size (WORLD_SIZE of the workers, else the step's task count)

    @property
    def complete(self) -> bool:
        return len(self.workers) >= self.expected


@dataclass(slots=True)
class _Watch:
    """What the watcher follows after one kill: a new one per kill (``count: N``)."""

    killed: model.Worker
    time: float
    restarts: int  # the job's Restarts when it was hit
    group: dict[int, model.Worker] = field(default_factory=dict)  # the ranks it was hit among
    gone: bool = False
    restarting: bool = False
    pending_reported: bool = False
    replacement: model.Worker | None = None


class SlurmOrchestrator(JobStorage):
    """Drills a running Slurm job: find ranks, kill one, watch it come back.

    ``fault`` is the default of :meth:`kill` (the drill passes its own) and what
    discovery checks the job against (a ``Requeue`` needs a requeueable job). One rank
    is hit on its node by the kill step: ``KillWorker`` and ``KillDuringCheckpoint``
    SIGKILL it, ``Preempt`` SIGTERMs it and SIGKILLs that same instance after the grace
    period if it still runs, ``HangWorker`` SIGSTOPs it (cleanup SIGCONTs it first of
    all). ``KillStep`` is ``scancel --signal=KILL J.S`` (the whole step, as a node crash
    looks), ``Requeue`` is ``scontrol requeue J`` (the graceful path).
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
        drain_node: bool = False,
        step_name: str | None = None,
        submission: Submission | None = None,
    ) -> None:
        if job_id is None and not job_name and submission is None:
            raise UsageError(
                "the slurm backend needs workload.jobId or workload.jobName, or workload.script"
            )
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
        self._pending: list[model.GroupEvent] = []
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._snapshot: _Snapshot | None = None
        self._watch: _Watch | None = None  # the latest kill, followed by the watcher
        self._hit: set[str] = set()  # every instance id a kill reached
        self._stopped: dict[str, model.Worker] = {}  # SIGSTOPped by a HangWorker: continued first
        self._escalations: list[threading.Thread] = []
        #: What each Preempt's escalation did (``kill -KILL …`` answered, or why not sent).
        self.escalations: list[str] = []
        self._restarts = 0
        self._ended = False
        #: KillNode with ``drainNode``: also set the node DRAIN (RESUMEd at cleanup).
        self.drain_node = drain_node
        self._nodes = NodeKills(self.commands, clock)
        #: recovery: live (``workload.replicas``): the target replica group's job step, by
        #: name (``srun --job-name``); the other groups' steps run beside it, untouched.
        self.step_name = step_name
        #: ``workload.script``: the job the drill submits at discovery, cancels at cleanup.
        self.submitted = SubmittedJob(submission, self.commands) if submission is not None else None

    # --- discovery ----------------------------------------------------------------------

    def discover(self, deadline: float) -> model.Workload:
        """Find the job and its ranks; wait (until ``deadline``) for it to be running."""
        self.commands.check_setup()
        if self.fault == "KillNode" and self.drain_node:
            self._nodes.check_operator()
        if self.submitted is not None and self.job_id is None:
            self.job_id = self.submitted.submit()
        job_id = self.job_id or self.commands.job_by_name(
            self.job_name or "", self.user, self.partition
        )
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
                    named = f" named {self.step_name!r}" if self.step_name is not None else ""
                    last_problem = f"job {job_id} is running but has no training step{named} yet"
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
        # The owner is part of the name: the prompt and the report say whose job is hit.
        label = f"slurm job {job_id} ({job.name}, user {job.user or 'unknown'})"
        return model.Workload(job=label, workers=workers, nodes=job_nodes(snapshot))

    def _training_steps(self, job_id: str) -> list[StepInfo]:
        return [
            s
            for s in self.commands.show_steps(job_id)
            if s.is_training
            and s.state == "RUNNING"
            and (self.step_name is None or s.name == self.step_name)
        ]

    def _snapshot_workers(self, job: JobInfo) -> _Snapshot | None:
        """The ranks of the job's running training step, read on every node of the step."""
        steps = self._training_steps(job.job_id)
        if not steps:
            return None
        if len(steps) > 1:
            names = ", ".join(f"{job.job_id}.{s.step} ({s.name})" for s in steps)
            if self.step_name is not None:
                raise DiscoveryError(
                    f"job {job.job_id} runs several steps named {self.step_name!r} at once "
                    f"({names}); give each replica group's srun a --job-name of its own"
                )
            raise DiscoveryError(
                f"job {job.job_id} runs several steps at once ({names}); RecoveryGate drills a job "
                "with one training step (or, with recovery: live, one step per replica group: "
                "workload.replicas)"
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

    def _worker(self, job: JobInfo, step: str, row: ProcessRow, rank: int) -> model.Worker:
        details: tuple[tuple[str, str], ...] = (
            ("job", job.job_id),
            ("step", step),
            ("pid", str(row.pid)),
            ("start", row.start),
            ("restarts", str(job.restarts)),
            ("comm", row.comm),
            ("user", job.user),  # the job's owner, in the report's target
        )
        if row.restart_count is not None:
            details += (("torchelastic_restart_count", str(row.restart_count)),)
        return model.Worker(
            rank=rank,
            name=f"{job.job_id}.{step} rank {rank}",
            instance_id=f"{job.job_id}.{step}/{row.pid}@{row.start}",
            node=row.node,
            details=details,
        )

    # --- the kill -----------------------------------------------------------------------

    def _not_discovered(self, worker: model.Worker) -> model.KillResult:
        """ALREADY_GONE for an instance id that is not one :meth:`discover` issued."""
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE,
            self.clock.now(),
            f"{worker.instance_id!r} is not a SLURM worker instance this drill "
            "discovered; nothing was touched",
        )

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault | None = None
    ) -> model.KillResult:
        """Hit the instance ``worker.instance_id`` names, as ``fault.type`` says; never twice.

        Without ``fault`` the constructor's fault type is used (30 s grace for a Preempt).
        """
        fault = fault if fault is not None else model.Fault(self.fault)
        details = dict(worker.details)
        job_id = details.get("job", self.job_id or "")
        step = details.get("step", "")
        if fault.type in SIGNAL_OF:
            # The instance id is the identity: job.step/pid@start, as discover() issued it.
            # Details are for display only, so a stale Worker can never aim at a live pid.
            match = _INSTANCE_ID.fullmatch(worker.instance_id)
            if match is None:
                return self._not_discovered(worker)
            details.update(match.groupdict())
            result = self._kill_worker(worker, details, dry_run, fault)
        elif fault.type == "KillNode":
            match = _INSTANCE_ID.fullmatch(worker.instance_id)
            if match is None:
                return self._not_discovered(worker)
            drain = fault.drain_node or self.drain_node
            result = self._nodes.kill(
                worker, match.groupdict(), dry_run, drain, self._failed_destructive
            )
        elif fault.type in ("KillStep", "Requeue"):
            result = self._kill_job_level(job_id, step, details, dry_run, fault.type)
        else:
            raise UsageError(
                f"unknown fault type {fault.type!r} for slurm; use one of {', '.join(FAULT_TYPES)}"
            )
        if result.outcome is model.KillOutcome.KILLED:
            group = self._snapshot.workers if self._snapshot is not None else {}
            with self._lock:
                self._hit.add(worker.instance_id)
                self._watch = _Watch(
                    killed=worker,
                    time=result.timestamp,
                    restarts=int_or_zero(details.get("restarts", "0")),
                    group=dict(group),
                )
        return result

    def _running_snapshot(self) -> _Snapshot | None:
        """The job's running training step now; None when it is not running (or gone)."""
        assert self.job_id is not None
        try:
            job = self.commands.show_job(self.job_id)
            return self._snapshot_workers(job) if job.state == "RUNNING" else None
        except (JobGone, DiscoveryError):
            return None

    def current_worker(self, rank: int) -> model.Worker | None:
        """That rank's worker in the job's running training step now, as discover() builds
        it; None when there is none, or when it is an instance a kill already reached."""
        snapshot = self._running_snapshot()
        worker = snapshot.workers.get(rank) if snapshot is not None else None
        with self._lock:
            if worker is None or worker.instance_id in self._hit:
                return None
        assert snapshot is not None
        self._snapshot = snapshot  # the group the next kill hits (for the watcher)
        return worker

    # --- the node seam (NodeFaults) ------------------------------------------------------

    @property
    def resumed(self) -> list[str]:
        """What cleanup's RESUME of each node a KillNode drained answered."""
        return list(self._nodes.resumed)

    def current_node(self, index: int) -> model.Node | None:
        """Node ``index`` of the job's running training step now (its ranks there), or
        None (no running step, no such node)."""
        snapshot = self._running_snapshot()
        if snapshot is None:
            return None
        self._snapshot = snapshot
        nodes = job_nodes(snapshot)
        return nodes[index] if 0 <= index < len(nodes) else None

    def kill_node(self, node: model.Node, *, dry_run: bool, fault: model.Fault) -> model.KillResult:
        """KillNode: every process of the training step on ``node``, by one kill step
        there (``fault.drain_node``: the node set DRAIN first). ALREADY_GONE when the
        node's identity (node, job step, run) is no longer the job's, or none of the
        instances seen on it still runs."""
        if fault.type != "KillNode":
            raise UsageError(
                f"{fault.type} cannot be injected on slurm; the node fault here is KillNode"
            )
        now = self.current_node(node.index)
        moved = node_moved(node, now, self.clock, "no such node in a running step")
        if moved is not None:
            return moved
        result = self.kill(node.workers[0], dry_run=dry_run, fault=fault)
        if result.outcome is model.KillOutcome.KILLED:
            gone_at = rgnode_gone(result.detail)
            if gone_at is not None:
                self._emit(
                    model.GroupEventKind.NODE_GONE,
                    f"every process of the job on {node.name} is gone",
                    node.workers[0],
                )
        return result

    def restore_node(self, node: model.Node) -> model.KillResult:
        """Nothing to restore: slurm has no PartitionNode."""
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE, self.clock.now(), "nothing to restore"
        )

    def _kill_worker(
        self, worker: model.Worker, details: dict[str, str], dry_run: bool, fault: model.Fault
    ) -> model.KillResult:
        """One signal to one rank on its node, through the kill step, once.

        The kill step runs through ``run_destructive``: it is sent again only when it is
        certain it never started (no connection to slurmctld, no step created). Once it
        may have run -- a timeout, a lost answer, srun failing after the step started --
        its outcome is unknown, and asking again would find the victim gone and wrongly
        report "nothing was killed", so the result is UNCONFIRMED (the drill ends in ERROR).

        ``Preempt``: SIGTERM, then a second, identity-checked kill step SIGKILLs that same
        instance after the grace period if it still runs (:meth:`_escalate_later`).
        ``HangWorker``: SIGSTOP, remembered *before* the step is sent, so cleanup always
        SIGCONTs it (identity-checked) whatever the answer was.
        """
        sig = SIGNAL_OF[fault.type]
        job_id, pid, start = details["job"], details["pid"], details["start"]
        target = f"{worker.describe()} (pid {pid} on {worker.node})"
        if not dry_run and sig == "STOP":
            with self._lock:
                self._stopped[worker.instance_id] = worker
        sent_at = self.clock.now()  # the signal lands no earlier than this
        try:
            verdict = self._signal(worker, sig, dry_run=dry_run, destructive=not dry_run)
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
        what = verdict[0] if verdict else "no answer"
        if what == "killed":
            killed_at = signal_time(verdict, sent_at)
            detail = f"kill -{sig} {target}"
            if sig == "TERM":
                self._escalate_later(worker, fault.grace_period)
                detail += (
                    f"; SIGKILL after the {fault.grace_period:g} s grace period if that same "
                    f"instance (pid {pid}, start {start}) still runs"
                )
            elif sig == "STOP":
                detail += "; cleanup sends SIGCONT if that same instance is still there"
            return model.KillResult(model.KillOutcome.KILLED, killed_at, detail)
        if not dry_run and sig == "STOP":
            with self._lock:
                self._stopped.pop(worker.instance_id, None)  # never stopped: nothing to undo
        if what == "alive":
            return model.KillResult(
                model.KillOutcome.DRY_RUN, now, f"would kill -{sig} {target}; it is running"
            )
        if what in ("gone", "replaced"):
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                now,
                f"{target} no longer exists; nothing was killed",
            )
        if what == "unlisted":
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                now,
                f"pid {pid} on {worker.node} is not one scontrol listpids lists for step "
                f"{job_id}.{details['step']} there; nothing was signalled",
            )
        return model.KillResult(
            model.KillOutcome.UNCONFIRMED, now, f"kill step answered {' '.join(verdict) or what!r}"
        )

    def _signal(
        self, worker: model.Worker, sig: str, *, dry_run: bool = False, destructive: bool = True
    ) -> list[str]:
        """Run the kill step for ``worker`` (job, step, pid + start time from its instance
        id); its ``RGKILL`` answer as words (``killed TIME``, ``gone``, ``replaced START``,
        ``unlisted``: the pid is not one scontrol listpids lists for that step there, …)."""
        assert sig in KILL_SIGNALS
        match = _INSTANCE_ID.fullmatch(worker.instance_id)
        assert match is not None
        out = self.commands.srun_on_node(
            match["job"],
            worker.node,
            KILL_STEP_NAME,
            KILL_SCRIPT,
            match["job"],
            match["step"],
            match["pid"],
            match["start"],
            "check" if dry_run else "kill",
            sig,
            destructive=destructive,
        )
        answer = next((line for line in out.splitlines() if line.startswith("RGKILL ")), "")
        return answer.split()[1:] if answer else ([out.strip()] if out.strip() else [])

    def _escalate_later(self, worker: model.Worker, grace: float) -> None:
        """Preempt: SIGKILL that same instance after ``grace`` if it still runs.

        A second kill step, identity-checked by pid + start time on the node like the
        first: a replacement (the rank restarted, even on the same pid) is never hit.
        Cleanup stops the wait and joins the thread: a drill that ended before the grace
        period sends no SIGKILL (the job is the user's; its own scheduler would).
        """

        def escalate() -> None:
            if self._stop.wait(grace):
                self.escalations.append("not sent: the drill ended within the grace period")
                return
            try:
                verdict = self._signal(worker, "KILL")
            except Exception as exc:  # recorded, never raised in a thread (JobGone: ended)
                self.escalations.append(f"kill -KILL {worker.instance_id} failed: {exc!r}")
                return
            what = " ".join(verdict) or "no answer"
            self.escalations.append(f"kill -KILL {worker.instance_id}: {what}")

        thread = threading.Thread(target=escalate, name="recoverygate-slurm-preempt", daemon=True)
        with self._lock:
            self._escalations.append(thread)
        thread.start()

    def _kill_job_level(
        self, job_id: str, step: str, details: dict[str, str], dry_run: bool, fault: str
    ) -> model.KillResult:
        """``scancel --signal=KILL J.S`` or ``scontrol requeue J``, sent at most once.

        Both act on the controller; a timeout or a lost answer may come after they acted
        (a requeue re-sent after that would requeue the replacement run), so they go
        through ``run_destructive`` and any failure past "never sent" is UNCONFIRMED.
        """
        try:
            job = self.commands.show_job(job_id)
        except JobGone:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE, self.clock.now(), f"job {job_id} is gone"
            )
        if job.restarts != int_or_zero(details.get("restarts", "0")) or job.state != "RUNNING":
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                self.clock.now(),
                f"job {job_id} is no longer the run discovered "
                f"(state {job.state}, Restarts {job.restarts})",
            )
        if fault == "KillStep":
            args = ["scancel", "--signal=KILL", f"{job_id}.{step}"]
            if step not in {s.step for s in self._training_steps(job_id)}:
                return model.KillResult(
                    model.KillOutcome.ALREADY_GONE, self.clock.now(), f"step {job_id}.{step} ended"
                )
        else:
            args = ["scontrol", "requeue", job_id]
        if dry_run:
            return model.KillResult(
                model.KillOutcome.DRY_RUN, self.clock.now(), f"would run: {' '.join(args)}"
            )
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
        return model.KillResult(model.KillOutcome.KILLED, sent_at, " ".join(args))

    def _failed_destructive(
        self, exc: Exception, job_id: str, **how: Callable[[Exception], str]
    ) -> model.KillResult:
        """:func:`.commands.failed_destructive`, now."""
        return failed_destructive(self.clock.now(), exc, job_id, **how)

    # --- watching -----------------------------------------------------------------------

    def watch_group(self) -> list[model.GroupEvent]:
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

    @cleanup_once
    def cleanup(self) -> None:
        """SIGCONT what a HangWorker stopped, first of all; then stop the Preempt
        escalations, the watcher and the tail. A job the drill found is the user's and is
        left running; a job it submitted (``workload.script``) is cancelled last, and
        waited for until squeue lists it no more.

        The SIGCONT goes through the kill step, identity-checked like every signal: an
        instance that is gone (torchrun or Slurm killed it) or replaced is not touched.
        One that could not be continued is named in the error, with the command to do it.
        """
        with self._lock:
            stopped, self._stopped = list(self._stopped.values()), {}
        stuck: list[str] = []
        for worker in stopped:
            try:
                answer = self._signal(worker, "CONT", destructive=False)
            except JobGone:
                continue  # the job ended: Slurm killed its processes, nothing stays stopped
            except (BackendError, PermissionDeniedError) as exc:
                answer = [str(exc)]
            if answer[:1] not in (["killed"], ["gone"], ["replaced"]):
                pid = dict(worker.details).get("pid", "?")
                job = dict(worker.details).get("job", self.job_id)
                stuck.append(
                    f"{worker.describe()}: {' '.join(answer) or 'no answer'} (continue it: "
                    f"srun --jobid={job} --overlap -w {worker.node} kill -CONT {pid})"
                )
        stuck_nodes = self._nodes.resume_drained()
        self._stop.set()
        with self._lock:
            escalations = list(self._escalations)
        current = threading.current_thread()
        for thread in [*escalations, self._watcher]:
            if thread is not None and thread is not current:
                thread.join(timeout=max(self.commands.timeout * 2, 10))
        self._events.close()
        ours = self.submitted
        submitted = ours.cancel(self.clock.wait, self.clock.now) if ours is not None else None
        if stuck:
            raise BackendError(
                "cleanup could not SIGCONT the worker a HangWorker stopped: " + "; ".join(stuck)
            )
        if stuck_nodes:
            raise BackendError(
                "cleanup could not RESUME the node a KillNode drained: " + "; ".join(stuck_nodes)
            )
        if submitted is not None:
            raise BackendError(submitted)

    def _emit(
        self,
        kind: model.GroupEventKind,
        detail: str,
        worker: model.Worker | None = None,
        restarts: int | None = None,
    ) -> None:
        event = model.GroupEvent(kind, self.clock.now(), detail, worker, restarts)
        with self._lock:
            self._pending.append(event)
        self.clock.wakeup()

    def _mark_gone(self, watch: _Watch) -> bool:
        """True for the first caller only: WORKER_GONE is reported once per kill."""
        with self._lock:
            first, watch.gone = not watch.gone, True
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
                model.GroupEventKind.JOB_FAILED,
                f"job {self.job_id} is no longer known to slurmctld",
            )
            return
        with self._lock:
            watch = self._watch
        if job.restarts > self._restarts:
            self._restarts = job.restarts
            if self._events.tail is not None:
                self._events.tail.restart()
            if watch is not None and self._mark_gone(watch):
                self._emit(
                    model.GroupEventKind.WORKER_GONE, f"job {job.job_id} was requeued", watch.killed
                )
            if watch is not None and watch.replacement is None and not watch.restarting:
                watch.restarting = True
                self._emit(
                    model.GroupEventKind.RESTARTING,
                    f"job {job.job_id} was requeued (Restarts={job.restarts})",
                    restarts=job.restarts,
                )
        if job.state in FINAL_STATES:
            self._ended = True
            if job.state == "COMPLETED" and (watch is None or watch.replacement is not None):
                # Training finished normally: a successful end the verdict is told of (a
                # recovery that ended inside its sustain window is judged on it).
                self._emit(model.GroupEventKind.JOB_SUCCEEDED, job.describe_end())
                return
            self._emit(model.GroupEventKind.JOB_FAILED, job.describe_end())
            return
        if watch is None or watch.replacement is not None:
            return
        if job.state in WAITING_STATES:
            if not watch.pending_reported and job.restarts > watch.restarts:
                watch.pending_reported = True
                self._emit(
                    model.GroupEventKind.REPLACEMENT_PENDING,
                    f"requeued job {job.job_id} is {job.state} (reason {job.reason})",
                    restarts=job.restarts,
                )
            return
        if job.state != "RUNNING":
            return
        self._look_for_replacement(job, watch)

    def _look_for_replacement(self, job: JobInfo, watch: _Watch) -> None:
        killed = watch.killed
        old = dict(killed.details)
        try:
            snapshot = self._snapshot_workers(job)
        except DiscoveryError:
            return
        now = snapshot.workers if snapshot is not None else {}
        worker = now.get(killed.rank)
        if (
            worker is not None
            and worker.instance_id == killed.instance_id
            and job.restarts == watch.restarts
        ):
            # The hit instance is still there (a SIGSTOP, a SIGTERM in its grace period, a
            # kill not landed yet). The job noticing shows first as another rank going.
            other = next(
                (
                    w
                    for rank, w in sorted(watch.group.items())
                    if rank != killed.rank and now.get(rank) != w
                ),
                None,
            )
            if other is not None and self._mark_gone(watch):
                self._emit(
                    model.GroupEventKind.WORKER_GONE,
                    f"rank {other.rank} (pid {dict(other.details).get('pid')}) is gone from "
                    f"step {job.job_id}.{old.get('step')}; the rank hit is still there",
                    other,
                )
            return
        if self._mark_gone(watch):
            where = (
                f"rank {killed.rank} (pid {old.get('pid')}) is gone from step "
                f"{job.job_id}.{old.get('step')}"
            )
            self._emit(model.GroupEventKind.WORKER_GONE, where, killed)
        if worker is None or snapshot is None:
            return
        new = dict(worker.details)
        if job.restarts > watch.restarts:
            path = (
                f"requeued job {job.job_id} runs again "
                f"(Restarts={job.restarts}, step {snapshot.step})"
            )
            count: int | None = job.restarts
        elif snapshot.step == old.get("step"):
            count = int_or_none(new.get("torchelastic_restart_count", "-"))
            path = f"torchrun restarted the workers inside step {job.job_id}.{snapshot.step}"
            if count is not None:
                path += f" (TORCHELASTIC_RESTART_COUNT={count})"
        else:
            path = f"a new step {job.job_id}.{snapshot.step} started in the same allocation"
            count = None
        if not watch.restarting:
            watch.restarting = True
            self._emit(model.GroupEventKind.RESTARTING, path, restarts=count)
        watch.replacement = worker
        self._emit(
            model.GroupEventKind.REPLACEMENT_RUNNING, f"{path}: {worker.describe()}", worker, count
        )

    # --- the output file ----------------------------------------------------------------

    def output_path(self, job: JobInfo) -> str:
        return output_file(self.output, job)

    def _start_tail(self, job: JobInfo) -> None:
        if self._events.tail is not None:
            return
        tail = self._events.follow(
            self.output_path(job),
            self.clock,
            interval=min(self.poll_interval, 0.25),
            on_line=self._on_output_line,
            owner=uid_of(job.user),  # the file must be the job user's (filetail)
        )
        tail.start()

    def _on_output_line(self, line: bytes, received: float) -> None:
        if b"error" not in line and b"srun:" not in line:
            return
        marker = parse_slurm_marker(line.decode("utf-8", "replace"))
        if marker is None:
            return
        with self._lock:
            watch = self._watch
            if watch is None or received < watch.time or watch.gone:
                return
            watch.gone = True
        self._emit(model.GroupEventKind.WORKER_GONE, f"Slurm reported: {marker}", watch.killed)
