"""The Ray orchestrator: a Ray Train run, launched (or attached to) by the drill.

How it sees the job (Ray 2.60, measured; docs/ray.md):

- **The driver.** By default the drill launches ``entrypoint`` (``ray.init`` +
  ``TorchTrainer.fit``) in its own session, with a short drill-owned ``RAY_TMPDIR`` (Ray's
  Unix sockets live under it: a long path breaks the dashboard and the state API),
  ``PYTHONUNBUFFERED=1``, ``RAY_TRAIN_ENABLE_STATE_TRACKING=1`` (Train's own state, the
  only place a worker's world rank is kept) and, unless the environment brings one, a
  per-drill token (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``). Without ``address`` the
  driver starts its own cluster under that ``RAY_TMPDIR`` and the drill finds it there;
  with ``address`` it joins that cluster. ``submissionId`` attaches to a running Ray Job:
  nothing is launched.
- **Discovery** reads Train's state from the dashboard (``/api/train/v2/runs/v1``): the
  run of this drill's driver (or Job), its current attempt's workers with world rank,
  node, pid and actor id. That state is job input: :class:`.guard.WorkerGuard` checks
  every worker against the GCS and probes it on its node, refusing any mismatch. A worker
  instance is ``ACTOR_ID:PID@TICKS``, the start ticks read on its node by that probe. A
  replacement is a new actor (probed at its kill).
- **The kill** is one signal (SIGKILL; SIGTERM then SIGKILL for Preempt; SIGSTOP for
  HangWorker), sent through a pidfd by a zero-CPU Ray task pinned to the worker's node
  (the drill itself for a worker on this machine whose raylet the probe named), after
  the GCS vouched for it again and the node checked its start time, parent raylet and
  title. Never retried.
- **The group** is Train's run state, polled: the attempt errored (worker death
  detected), its workers all dead (group shut down), a new attempt pending (new group
  being placed), the new attempt running with every worker alive (train function
  restarted); the run ERRORED/ABORTED or the driver exiting non-zero is the job failing.
- **Evidence** is read from ``logs/worker-<worker id>-<job>-<pid>.out`` of every Train
  worker (raw and complete) in the session the GCS names, when that folder is on this
  machine; otherwise from
  the driver's forwarded copy (``(RayTrainWorker pid=N)`` prefixes, which Ray's log dedup
  can fold). One source per drill, never both: a line would count twice.
- **Cleanup** ends what the drill launched: the driver's session (SIGTERM, then SIGKILL),
  and when the driver started its own cluster, every process carrying the drill's marker
  in its environment (the cluster's raylet, GCS, dashboard and workers inherit it). A
  cluster the drill did not start (``address``, ``submissionId``) is never stopped.

This class is the facade; each job is done in its own module: the driver's environment
(:mod:`.driver`), the line to the cluster (:mod:`.cluster`), this drill's run
(:mod:`.runs`), worker and node names (:mod:`.workers`), the kills (:mod:`.kill`), the
group events (:mod:`.watch`), the evidence (:mod:`.logs`).
"""

from __future__ import annotations

import secrets
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.orchestrators.ray.cluster import ClusterLink
from pytest_recoverygate.orchestrators.ray.driver import driver_env, start_driver
from pytest_recoverygate.orchestrators.ray.guard import WorkerGuard
from pytest_recoverygate.orchestrators.ray.kill import kill_node, kill_worker
from pytest_recoverygate.orchestrators.ray.logs import JobLogs
from pytest_recoverygate.orchestrators.ray.processes import (
    DRILL_MARKER,
    end_driver,
    end_marked,
    local_addresses,
)
from pytest_recoverygate.orchestrators.ray.runs import TrainRuns
from pytest_recoverygate.orchestrators.ray.signals import WorkerSignals
from pytest_recoverygate.orchestrators.ray.watch import GroupWatch
from pytest_recoverygate.orchestrators.ray.workers import nodes_of, worker_of
from pytest_recoverygate.registry.seams import cleanup_once
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.procs import JobLaunch, LaunchedJob

if TYPE_CHECKING:
    import subprocess

    from pytest_recoverygate.orchestrators.ray.state import TrainWorker
    from pytest_recoverygate.registry.seams import Clock
    from pytest_recoverygate.shared.joboutput import JobOutput

__all__ = ["DRILL_MARKER", "RayOrchestrator"]


class RayOrchestrator(LaunchedJob):
    """Launches a Ray Train driver (or attaches to a Ray Job), kills one worker, watches Train."""

    name = "ray"
    command_key = "workload.entrypoint"
    command_what = "the driver"
    command_example = "[python, train_ray.py]"

    def __init__(
        self,
        job: JobLaunch,
        *,
        address: str | None,
        submission_id: str | None,
        target_rank: int = 1,
        clock: Clock,
    ) -> None:
        super().__init__(job, clock=clock, attached=submission_id is not None)
        self.address = address
        self.submission_id = submission_id
        self.target_rank = target_rank
        self._source = StreamEventSource(wakeup=clock.wakeup, clock=clock.now)
        self._popen: subprocess.Popen[bytes] | None = None
        self._tmpdir: Path | None = None
        self._drill_id = secrets.token_hex(8)
        self._cluster = ClusterLink(address, clock=clock)
        self._runs = TrainRuns(self._cluster, submission_id=submission_id, clock=clock)
        self._signals = WorkerSignals(self._cluster.task_signal)
        self._guard = WorkerGuard(self._cluster.ask, local=local_addresses())
        self._logs = JobLogs(self._source, self._guard, clock=clock)
        self._watch = GroupWatch(
            self._runs, follow=self._logs.follow, worker=self._worker, clock=clock
        )
        self._started_cluster = False
        self.discovered_at: float | None = None

    # ------------------------------------------------------------------ Orchestrator

    def discover(self, deadline: float) -> model.Workload:
        """Launch the driver (or find the Job), wait for Train's worker group, name it."""
        if self.submission_id is None:
            self._launch()
        self._cluster.connect(
            deadline,
            tmpdir=self._tmpdir,
            check_driver=self._check_driver,
            output_tail=self.output_tail,
        )
        self._cluster.start_server()  # connects while Train starts
        run = self._runs.wait_for_group(
            deadline,
            check_driver=self._check_driver,
            launched=shlex.join(self.command) or str(self.submission_id),
            output_tail=self.output_tail,
        )
        attempt = run.current
        assert attempt is not None
        ranks = [w.rank for w in attempt.workers]
        if self.target_rank not in ranks:
            raise DiscoveryError(
                f"injectFailure.targetRank {self.target_rank} is beyond the Train run "
                f"{run.name!r}: its {len(ranks)} workers have world ranks "
                f"{ranks[0]}-{ranks[-1]}; set targetRank to one of them (nothing was killed)"
            )
        self._guard.verify(
            attempt.workers,
            driver_pid=self._popen.pid if self._popen is not None else None,
            job=self._runs.job_id,
        )
        self._logs.choose(attempt)
        self._runs.hold(run)
        self._watch.start(attempt.attempt_id, self._popen)
        self.discovered_at = self._clock.now()
        return model.Workload(
            job=f"ray train run {run.name} ({run.run_id[:8]})",
            workers=tuple(self._worker(w) for w in attempt.workers),
            nodes=nodes_of(self._guard, attempt),
        )

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault = model.KILL
    ) -> model.KillResult:
        """One signal to exactly that instance, from a task pinned to its node (the drill
        itself for a worker on this machine); never retried.

        ``KillWorker``, ``KillDuringCheckpoint``: SIGKILL. ``Preempt``: SIGTERM, then
        SIGKILL after ``gracePeriod`` to the same instance (pid + start ticks) if it still
        runs. ``HangWorker``: SIGSTOP, remembered before it is sent: cleanup SIGCONTs it
        first of all (:mod:`.signals`). The kill itself: :func:`.kill.kill_worker`.
        """
        return kill_worker(
            worker,
            self._runs.fetch(),
            guard=self._guard,
            signals=self._signals,
            watch=self._watch,
            clock=self._clock,
            dry_run=dry_run,
            fault=fault,
        )

    def current_worker(self, rank: int) -> model.Worker | None:
        """That rank's worker in the run's current attempt, when that attempt is running."""
        run = self._runs.latest()
        current = run.current if run is not None else None
        if current is None or not current.running:
            return None
        found = next((w for w in current.workers if w.rank == rank), None)
        return self._worker(found) if found is not None else None

    def watch_group(self) -> list[model.GroupEvent]:
        return self._watch.drain()

    # ------------------------------------------------------------------ NodeFaults

    def current_node(self, index: int) -> model.Node | None:
        """Node ``index`` (Train's node rank) of the current attempt, when it runs."""
        run = self._runs.fetch()
        current = run.current if run is not None else None
        if current is None or not current.running:
            return None
        return next((n for n in nodes_of(self._guard, current) if n.index == index), None)

    def kill_node(self, node: model.Node, *, dry_run: bool, fault: model.Fault) -> model.KillResult:
        """``KillNode``: SIGKILL the node's raylet from a task pinned to it; its workers die
        with it. Never the head (its raylet's death ends the cluster); never retried
        (:func:`.kill.kill_node`)."""
        return kill_node(
            node,
            self._runs.fetch(),
            guard=self._guard,
            ask=self._cluster.ask,
            watch=self._watch,
            clock=self._clock,
            dry_run=dry_run,
        )

    def restore_node(self, node: model.Node) -> model.KillResult:
        """Nothing to restore: the ray backend offers no PartitionNode."""
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE, self._clock.now(), "nothing to restore"
        )

    def events(self) -> StreamEventSource:
        return self._source

    def job_output(self) -> JobOutput:
        return self._logs.job_output()

    def output_tail(self, lines: int = 15) -> str:
        return self._logs.output_tail(lines)

    @cleanup_once
    def cleanup(self) -> None:
        """SIGCONT what a HangWorker stopped, first of all; stop the Preempt escalation, the
        watcher and the tails; end the driver (and the cluster it started)."""
        stuck = self._signals.continue_all()
        self._signals.close()
        self._watch.stop()
        self._logs.stop_tails()
        self._cluster.close()
        problems = []
        if self._popen is not None:
            problems += end_driver(self._popen)
        self._logs.join_reader()
        if self._started_cluster:
            problems += end_marked(self._drill_id)
        self._source.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        if stuck:
            raise BackendError(
                "cleanup could not SIGCONT the worker a HangWorker stopped: " + "; ".join(stuck)
            )
        if problems:
            raise BackendError("cleanup left processes running: " + "; ".join(problems))

    # ------------------------------------------------------------------ the driver

    def _launch(self) -> None:
        """Start the driver (:mod:`.driver`) and read its output (:mod:`.logs`)."""
        self._tmpdir = Path(tempfile.mkdtemp(prefix="rg-ray-", dir="/tmp"))
        env = driver_env(
            self.env, address=self.address, drill_id=self._drill_id, tmpdir=self._tmpdir
        )
        self._cluster.env = env
        self._started_cluster = self._runs.own_cluster = self.address is None
        if self._started_cluster:  # every process of it carries the marker, under its tmpdir
            self._guard.marker, self._guard.within = (DRILL_MARKER, self._drill_id), self._tmpdir
        self._popen = start_driver(self.command, workdir=self.workdir, env=env)
        self._runs.driver_pid = self._popen.pid
        assert self._popen.stdout is not None
        self._logs.read_driver(self._popen.stdout)

    def _check_driver(self, when: str) -> None:
        if self._popen is not None and self._popen.poll() is not None:
            raise DiscoveryError(
                f"the driver `{shlex.join(self.command)}` exited with "
                f"{self._popen.returncode} {when}; last output:\n{self.output_tail()}"
            )

    def _worker(self, worker: TrainWorker) -> model.Worker:
        return worker_of(self._guard, worker)
