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

Where each job is done: the ranks and discovery's wait in :mod:`.discovery`, each
fault's kill in :mod:`.kill` (KillNode in :mod:`.nodes`), the watcher in :mod:`.watch`,
the output file in :mod:`.events`; this class composes them.

Only this package runs ``squeue``/``scontrol``/``scancel``/``srun`` (:mod:`.commands`:
timeouts, retries of reads, destructive commands never sent twice once they may have
acted; a kill whose outcome is unknown is ``UNCONFIRMED`` and the drill ends in ERROR).
What the clients print is read in :mod:`.parsing`, purely. No command goes through a
shell with user-provided text: the scripts run on the node are constants and receive
pids and job ids as arguments.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, UsageError
from pytest_recoverygate.orchestrators.slurm import FAULT_TYPES
from pytest_recoverygate.orchestrators.slurm.commands import SlurmCommands, failed_destructive
from pytest_recoverygate.orchestrators.slurm.discovery import (
    INSTANCE_ID,
    JobSnapshot,
    running_snapshot,
    snapshot_workers,
    wait_for_ranks,
)
from pytest_recoverygate.orchestrators.slurm.events import SlurmEventSource, uid_of
from pytest_recoverygate.orchestrators.slurm.kill import (
    SIGNAL_OF,
    RankSignals,
    kill_job_level,
    not_discovered,
    signal,
)
from pytest_recoverygate.orchestrators.slurm.nodes import NodeKills, job_nodes, rgnode_gone
from pytest_recoverygate.orchestrators.slurm.parsing import JobInfo, int_or_zero, output_file
from pytest_recoverygate.orchestrators.slurm.storage import JobStorage
from pytest_recoverygate.orchestrators.slurm.submit import Submission, SubmittedJob
from pytest_recoverygate.orchestrators.slurm.watch import GroupWatch, watch_once
from pytest_recoverygate.registry.seams import Clock, EventSource, cleanup_once, node_moved
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.joboutput import JobOutput

__all__ = ["SlurmOrchestrator"]


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
        self._stop = threading.Event()
        self._snapshot: JobSnapshot | None = None
        self._group = GroupWatch(
            clock, lock=self._lock, stop=self._stop, poll_interval=poll_interval
        )
        self._signals = RankSignals(self._signal, clock, lock=self._lock, stop=self._stop)
        #: What each Preempt's escalation did (``kill -KILL …`` answered, or why not sent).
        self.escalations: list[str] = self._signals.escalations
        #: KillNode with ``drainNode``: also set the node DRAIN (RESUMEd at cleanup).
        self.drain_node = drain_node
        self._nodes = NodeKills(self.commands, clock)
        #: recovery: live (``workload.replicas``): the target replica group's job step, by
        #: name (``srun --job-name``); the other groups' steps run beside it, untouched.
        self.step_name = step_name
        #: ``workload.script``: the job the drill submits at discovery, cancels at cleanup.
        self.submitted = SubmittedJob(submission, self.commands) if submission is not None else None

    # --- discovery (:mod:`.discovery`) --------------------------------------------------

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
        job, snapshot = wait_for_ranks(
            self.commands,
            self.clock,
            job_id,
            fault=self.fault,
            step_name=self.step_name,
            poll_interval=self.poll_interval,
            deadline=deadline,
        )
        self._snapshot = snapshot
        self._group.restarts = job.restarts
        self._start_tail(job)
        self._group.start(self._watch_once)
        workers = tuple(snapshot.workers[rank] for rank in sorted(snapshot.workers))
        # The owner is part of the name: the prompt and the report say whose job is hit.
        label = f"slurm job {job_id} ({job.name}, user {job.user or 'unknown'})"
        return model.Workload(job=label, workers=workers, nodes=job_nodes(snapshot))

    def _snapshot_workers(self, job: JobInfo) -> JobSnapshot | None:
        return snapshot_workers(self.commands, job, self.step_name)

    def _running_snapshot(self) -> JobSnapshot | None:
        assert self.job_id is not None
        return running_snapshot(self.commands, self.job_id, self.step_name)

    def current_worker(self, rank: int) -> model.Worker | None:
        """That rank's worker in the job's running training step now, as discover() builds
        it; None when there is none, or when it is an instance a kill already reached."""
        snapshot = self._running_snapshot()
        worker = snapshot.workers.get(rank) if snapshot is not None else None
        if self._group.was_hit(worker):
            return None
        assert snapshot is not None
        self._snapshot = snapshot  # the group the next kill hits (for the watcher)
        return worker

    # --- the kill (:mod:`.kill`) --------------------------------------------------------

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault | None = None
    ) -> model.KillResult:
        """Hit the instance ``worker.instance_id`` names, as ``fault.type`` says; never twice.

        Without ``fault`` the constructor's fault type is used (30 s grace for a Preempt).
        """
        fault = fault if fault is not None else model.Fault(self.fault)
        details = dict(worker.details)
        job_id = details.get("job", self.job_id or "")
        if fault.type in SIGNAL_OF:
            result = self._signals.kill(worker, dry_run, fault)
        elif fault.type == "KillNode":
            match = INSTANCE_ID.fullmatch(worker.instance_id)
            if match is None:
                return not_discovered(self.clock.now(), worker)
            drain = fault.drain_node or self.drain_node
            result = self._nodes.kill(
                worker, match.groupdict(), dry_run, drain, self._failed_destructive
            )
        elif fault.type in ("KillStep", "Requeue"):
            result = kill_job_level(
                self.commands,
                self.clock,
                worker,
                job_id=job_id,
                dry_run=dry_run,
                fault=fault.type,
                step_name=self.step_name,
            )
        else:
            raise UsageError(
                f"unknown fault type {fault.type!r} for slurm; use one of {', '.join(FAULT_TYPES)}"
            )
        if result.outcome is model.KillOutcome.KILLED:
            group = self._snapshot.workers if self._snapshot is not None else {}
            restarts = int_or_zero(details.get("restarts", "0"))
            self._group.follow(worker, result.timestamp, restarts, dict(group))
        return result

    def _signal(
        self, worker: model.Worker, sig: str, *, dry_run: bool = False, destructive: bool = True
    ) -> list[str]:
        """:func:`.kill.signal` with this orchestrator's commands, now."""
        return signal(self.commands, worker, sig, dry_run=dry_run, destructive=destructive)

    def _failed_destructive(
        self, exc: Exception, job_id: str, **how: Callable[[Exception], str]
    ) -> model.KillResult:
        """:func:`.commands.failed_destructive`, now."""
        return failed_destructive(self.clock.now(), exc, job_id, **how)

    # --- the node seam (NodeFaults, :mod:`.nodes`) --------------------------------------

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
                self._group.emit(
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

    # --- watching (:mod:`.watch`) and the output file (:mod:`.events`) ------------------

    def watch_group(self) -> list[model.GroupEvent]:
        return self._group.drain()

    def _watch_once(self) -> None:
        assert self.job_id is not None
        watch_once(self._group, self.commands, self.job_id, self._events, self._snapshot_workers)

    def events(self) -> EventSource:
        return self._events

    def job_output(self) -> JobOutput:
        """The job's output file as the tail read it; per task with ``srun --label``."""
        return self._events.job_output()

    def output_path(self, job: JobInfo) -> str:
        return output_file(self.output, job)

    def _start_tail(self, job: JobInfo) -> None:
        if self._events.tail is not None:
            return
        tail = self._events.follow(
            self.output_path(job),
            self.clock,
            interval=min(self.poll_interval, 0.25),
            on_line=self._group.on_output_line,
            owner=uid_of(job.user),  # the file must be the job user's (filetail)
        )
        tail.start()

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
        stuck = self._signals.continue_all(self.job_id)
        stuck_nodes = self._nodes.resume_drained()
        self._stop.set()
        escalations = self._signals.pending()
        current = threading.current_thread()
        for thread in [*escalations, self._group.thread]:
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
