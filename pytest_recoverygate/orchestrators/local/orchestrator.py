"""The local orchestrator: a torchrun job on this machine, launched (or attached to) by the drill.

How it sees the job (facts measured with torch 2.13, see docs/local.md):

- The launched command is torchrun's elastic agent (or a script that runs one). Workers
  are the agent's children whose environment holds ``RANK``; each sits in its own session,
  so nothing here signals a process group. Right after a fork a child's environment is
  still the agent's: a process without ``RANK`` is asked again on the next poll.
- A worker instance is ``pid@start_time`` (psutil's create time). A kill re-checks that
  identity through a pidfd immediately before signalling, so a recycled pid or a
  replacement with the same rank is never hit, and a kill is never retried.
- A background thread polls psutil every 50 ms and turns what it sees into group
  events: the victim gone, each restart (TORCHELASTIC_RESTART_COUNT goes up), the new
  group complete, the agent exited (with its exit code and root cause).
- A second thread reads the job's merged stdout/stderr pipe into the event source and
  keeps a raw copy for the report and for error messages.
- Cleanup must reach orphans: SIGKILL of the agent leaves workers training and holding
  the pipe, and an agent that dies mid-restart leaves workers in sessions no scan has
  seen. So the launched job's environment carries a per-drill marker
  (``RECOVERYGATE_DRILL_ID=<random>``, inherited by everything the job starts), the drill
  process becomes a child subreaper while it runs (orphans re-parent to it, not to
  init), and cleanup SIGKILLs every descendant of the drill (and of any process it saw)
  whose environment carries the marker, again and again until a look finds none left or
  a deadline passes; survivors are named by pid and command line. A process without the
  marker is never signalled, even an orphan the drill adopted. TMPDIR points at a
  drill-owned folder (torchrun's ``torchelastic_*`` logs land there) that cleanup removes.

Nothing here finds processes by name: other torchrun jobs may run on the same machine.
"""

from __future__ import annotations

import shlex
import signal
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.orchestrators.local.cleanup import end_processes
from pytest_recoverygate.orchestrators.local.kill import Struck, kill_instance
from pytest_recoverygate.orchestrators.local.launch import DRILL_MARKER, LocalJob
from pytest_recoverygate.orchestrators.local.output import KeptOutput
from pytest_recoverygate.orchestrators.local.processes import Identity, signal_exactly
from pytest_recoverygate.orchestrators.local.scan import (
    POLL_INTERVAL,
    JobScan,
    complete_group,
    newest_workers,
    worker_of,
)
from pytest_recoverygate.orchestrators.local.watch import GroupWatch
from pytest_recoverygate.registry.seams import cleanup_once
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.procs import JobLaunch, LaunchedJob

if TYPE_CHECKING:
    from pytest_recoverygate.registry.seams import Clock
    from pytest_recoverygate.shared.joboutput import JobOutput

__all__ = ["DRILL_MARKER", "LocalOrchestrator"]


class LocalOrchestrator(LaunchedJob):
    """Launches a torchrun job (or attaches to one), kills one worker by identity, watches it.

    ``command`` is run in ``workdir`` with ``env`` added to this process's environment.
    With ``attach_pid`` nothing is launched: the drill watches the torchrun agent with
    that pid, reads its output from the file its stdout is redirected to, and cleanup
    leaves the job running.

    A facade: launching and attaching are :mod:`.launch`'s, the scans :mod:`.scan`'s,
    the kill :mod:`.kill`'s, the watcher :mod:`.watch`'s, the output :mod:`.output`'s,
    ending the processes :mod:`.cleanup`'s.
    """

    name = "local"
    command_what = "the torchrun command"
    command_example = '["torchrun", "--nproc-per-node=2", "train.py"]'

    def __init__(
        self,
        job: JobLaunch,
        *,
        target_rank: int | None = 1,
        clock: Clock,
        attach_pid: int | None = None,
        source: StreamEventSource | None = None,
        stream: str = "torchrun",
    ) -> None:
        """``source`` and ``stream``: one member of a group (``.members``) shares the
        group's event source, its output named ``stream`` (default: its own, "torchrun")."""
        super().__init__(job, clock=clock, attached=attach_pid is not None)
        self.target_rank = target_rank
        self.attach_pid = attach_pid
        self._stream = stream
        self._source = (
            source
            if source is not None
            else StreamEventSource(wakeup=clock.wakeup, clock=clock.now)
        )
        self._stop = threading.Event()
        self._poke = threading.Event()  # wakes the watcher at once (kill, cleanup)
        self._threads: list[threading.Thread] = []
        self._output = KeptOutput(stream)
        self._job = LocalJob(source=self._source, keep=self._output.keep, clock=clock)
        self._scan = JobScan(lambda: self._job.agent)
        self._struck = Struck()  # the victim; what a HangWorker stopped
        self._watch = GroupWatch(
            job=self._job,
            scan=self._scan,
            struck=self._struck,
            source=self._source,
            raw_output=self._output.raw,
            clock=clock,
            stop=self._stop,
            poke=self._poke,
        )

    # ------------------------------------------------------------------ Orchestrator

    def discover(self, deadline: float) -> model.Workload:
        """Launch (or attach to) the job and wait until every local rank's worker is up."""
        if self.attach_pid is None:
            self._job.launch(
                self.command,
                self.workdir,
                self.env,
                stream=self._stream,
                remember=self._scan.remember,
            )
        else:
            self._job.attach(self.attach_pid)
        while True:
            scan = self._scan.scan()
            group = complete_group(scan)
            if group is not None:
                break
            failure = self._job.ended()
            if failure is not None:
                raise DiscoveryError(
                    f"the job exited before its workers appeared ({failure}); "
                    f"last output:\n{self.output_tail(15)}"
                )
            if self._clock.now() >= deadline:
                seen = ", ".join(f"rank {w.rank} pid {w.identity.pid}" for w in scan.workers)
                raise DiscoveryError(
                    f"no complete torchrun worker group appeared before the deadline "
                    f"(workers seen: {seen or 'none'}); is `{shlex.join(self.command)}` a "
                    f"torchrun command? last output:\n{self.output_tail(15)}"
                )
            time.sleep(POLL_INTERVAL)

        ranks = sorted(group)
        if self.target_rank is not None and self.target_rank not in group:
            raise DiscoveryError(
                f"target rank {self.target_rank} is not among the job's local ranks {ranks}; "
                f"set injectFailure.targetRank to one of them"
            )
        self._watch.adopt(group)
        watcher = threading.Thread(
            target=self._watch.run, name="recoverygate-local-watch", daemon=True
        )
        watcher.start()
        self._threads.append(watcher)
        host = socket.gethostname()
        workers = tuple(
            model.Worker(
                rank=rank,
                name=f"rank {rank} pid {group[rank].identity.pid}",
                instance_id=group[rank].identity.instance_id,
                node=host,
                details=(
                    ("pid", str(group[rank].identity.pid)),
                    ("restart_count", str(group[rank].restart_count)),
                ),
            )
            for rank in ranks
        )
        agent = self._job.agent.pid if self._job.agent else "?"
        return model.Workload(
            job=f"torchrun agent pid {agent} on {host}",
            workers=workers,
            started_at=self._job.launched_at,  # None when attached: the job predates the drill
        )

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault = model.KILL
    ) -> model.KillResult:
        """Signal exactly the instance named by ``worker.instance_id``; never retried.

        KillWorker / KillDuringCheckpoint: SIGKILL. Preempt: SIGTERM now, and SIGKILL after
        the grace period to the same instance (its pidfd) if it still runs. HangWorker:
        SIGSTOP (cleanup sends SIGCONT first, so nothing is ever left stopped).
        """
        return kill_instance(
            worker,
            dry_run=dry_run,
            fault=fault,
            clock=self._clock,
            struck=self._struck,
            stop=self._stop,
            threads=self._threads,
            on_signalled=self._signalled,
        )

    def _signalled(self) -> None:
        """A kill was sent: the watcher looks closely, at once, until the new group is up."""
        self._watch.recovering = True
        self._poke.set()

    def current_worker(self, rank: int) -> model.Worker | None:
        """That rank's worker in the newest restart generation running now, if any."""
        for proc in newest_workers(self._scan.scan()):
            if proc.rank == rank:
                return worker_of(proc)
        return None

    def current_workers(self) -> list[model.Worker]:
        """The newest restart generation's workers running now, by rank (node faults)."""
        return sorted(
            (worker_of(w) for w in newest_workers(self._scan.scan())), key=lambda w: w.rank
        )

    def processes(self) -> list[Identity]:
        """The agent and every live process under it (what a KillNode ends)."""
        if self._job.agent is None:
            return []
        found = [self._job.agent, *self._scan.scan().processes]
        return list(dict.fromkeys(found))

    def watch_group(self) -> list[model.GroupEvent]:
        """Group events observed by the watcher thread since the previous call."""
        return self._watch.drain()

    def events(self) -> StreamEventSource:
        return self._source

    @cleanup_once
    def cleanup(self) -> None:
        """End every process the drill started or saw, verify none is left, remove the temp dir.

        Idempotent. In attach mode the job is left running; only our threads stop.
        """
        for identity in self._struck.take_stopped():  # first of all: never leave one stopped
            signal_exactly(identity, signal.SIGCONT)
        self._stop.set()
        self._poke.set()
        leftover: list[str] = []
        try:
            if self.attach_pid is None:
                leftover = end_processes(self._job, self._scan)
        finally:
            self._job.stop_tail()
            self._source.close()  # stops and joins the pipe reader, closes the pipe
            for thread in self._threads:
                thread.join(timeout=2.0)
            self._job.release()
        if leftover:
            raise BackendError(
                "cleanup could not end these processes of the drill's job: "
                + "; ".join(leftover)
                + "; end them by hand (kill -9 PID)"
            )

    # ------------------------------------------------------------------ introspection

    @property
    def agent_pid(self) -> int | None:
        """The pid of the launched (or attached) process, once discover() has run."""
        return self._job.agent.pid if self._job.agent else None

    @property
    def agent(self) -> Identity | None:
        """The launched (or attached) process's instance, once discover() has run."""
        return self._job.agent

    @property
    def marker(self) -> tuple[str, str] | None:
        """``(DRILL_MARKER, value)`` in the launched job's environment (None: attached)."""
        drill_id = self._job.drill_id
        return None if drill_id is None else (DRILL_MARKER, drill_id)

    @property
    def scratch_dir(self) -> Path | None:
        """The drill-owned TMPDIR of the launched job (removed by cleanup)."""
        return self._job.tmpdir

    # ------------------------------------------------------------------ output

    def raw_output(self) -> str:
        """The job's merged stdout/stderr as read so far (the last few MiB)."""
        return self._output.raw()

    def output_tail(self, lines: int) -> str:
        """The last ``lines`` lines of the job's output, for error messages."""
        return self._output.tail(lines)

    def job_output(self) -> JobOutput:
        """torchrun's merged output as ``torchrun``; per rank, the lines with its prefix.

        The failing worker is the rank torchrun names as the root cause when that rank's
        own lines show an error (the other ranks' errors are mostly its echo), else the
        worker of the last error line.
        """
        return self._output.job_output()
