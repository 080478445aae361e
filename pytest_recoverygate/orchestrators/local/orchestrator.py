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

import codecs
import contextlib
import dataclasses
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError, PermissionDeniedError
from pytest_recoverygate.orchestrators.local.processes import (
    Identity,
    ProcRow,
    Scan,
    SubreaperGuard,
    WorkerProc,
    is_running,
    leftovers,
    pidfd_open,
    process_table,
    resolve_executable,
    signal_exactly,
    start_time,
)
from pytest_recoverygate.orchestrators.local.torchrun import (
    ERROR_LINE,
    root_cause,
    root_cause_fields,
)
from pytest_recoverygate.registry.seams import cleanup_once
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.filetail import OutputTail
from pytest_recoverygate.shared.joboutput import JobOutput, OutputSplitter, torchrun_rank_of
from pytest_recoverygate.shared.procs import JobLaunch, LaunchedJob, launch
from pytest_recoverygate.shared.textbounds import MAX_MATCH_LINE

if TYPE_CHECKING:
    from pytest_recoverygate.registry.seams import Clock

__all__ = ["DRILL_MARKER", "LocalOrchestrator"]

#: In the launched job's environment, one value per drill: cleanup ends what carries it.
DRILL_MARKER = "RECOVERYGATE_DRILL_ID"
POLL_INTERVAL = 0.05  # seconds between psutil scans while a recovery is under way
IDLE_POLL_INTERVAL = 0.25  # seconds between scans otherwise (a scan costs ~3 ms of CPU)
TERM_GRACE = 5.0  # seconds the agent gets to stop its workers after SIGTERM
REAP_TIMEOUT = 5.0  # seconds to wait for SIGKILLed processes to disappear
LEFTOVER_GRACE = 1.0  # seconds a process found at the end may take to finish exiting
RAW_OUTPUT_LIMIT = 4 * 1024 * 1024  # characters of the job's output kept in memory
ENVIRON_RETRY_AGE = 2.0  # a process older than this without RANK is not a worker
OUTPUT_DRAIN_TIMEOUT = 0.5  # seconds to wait for the agent's final output once it exited
KILL_ROUND_INTERVAL = 0.02  # seconds between cleanup's looks for marked processes


class LocalOrchestrator(LaunchedJob):
    """Launches a torchrun job (or attaches to one), kills one worker by identity, watches it.

    ``command`` is run in ``workdir`` with ``env`` added to this process's environment.
    With ``attach_pid`` nothing is launched: the drill watches the torchrun agent with
    that pid, reads its output from the file its stdout is redirected to, and cleanup
    leaves the job running.
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
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poke = threading.Event()  # wakes the watcher at once (kill, cleanup)
        self._threads: list[threading.Thread] = []
        self._popen: subprocess.Popen[bytes] | None = None
        self._launched_at: float | None = None
        self._agent: Identity | None = None
        self._tmpdir: Path | None = None
        self._tail: OutputTail | None = None  # attach mode: the agent's output file
        self._tail_generation = 0  # bumped each time the tail starts the file over
        self._raw: deque[str] = deque()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._raw_size = 0
        # torchrun's whole stream, plus each rank's prefixed lines ([default1]:, [rank1]:)
        self._output = OutputSplitter(torchrun_rank_of, merged=stream)
        self._seen: dict[int, Identity] = {}
        self._drill_id: str | None = None  # the marker's value in the launched job's environment
        self._marked: set[Identity] = set()  # every process found carrying the marker
        self._events: list[model.GroupEvent] = []
        self._environ_cache: dict[Identity, dict[str, str] | None] = {}
        # group state, owned by the watcher thread after discover()
        self._base_restart = 0
        self._generation = 0
        self._local_world_size = 0
        self._group: dict[int, WorkerProc] = {}
        self._gone_reported = False
        self._running_reported = True
        self._job_failed_reported = False
        self._victim: Identity | None = None
        self._stopped: set[Identity] = set()  # SIGSTOPped by a HangWorker: continued first
        self._recovering = False
        self._subreaper = False

    # ------------------------------------------------------------------ construction

    # ------------------------------------------------------------------ Orchestrator

    def discover(self, deadline: float) -> model.Workload:
        """Launch (or attach to) the job and wait until every local rank's worker is up."""
        if self.attach_pid is None:
            self._launch()
        else:
            self._attach()
        while True:
            scan = self._scan()
            group = self._complete_group(scan)
            if group is not None:
                break
            failure = self._agent_exit()
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
        with self._lock:
            self._local_world_size = len(group)
            self._group = dict(group)
            self._generation = next(iter(group.values())).restart_count
            self._base_restart = self._generation
            self._running_reported = True
        watcher = threading.Thread(
            target=self._watch_loop, name="recoverygate-local-watch", daemon=True
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
        agent = self._agent.pid if self._agent else "?"
        return model.Workload(
            job=f"torchrun agent pid {agent} on {host}",
            workers=workers,
            started_at=self._launched_at,  # None when attached: the job predates the drill
        )

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault = model.KILL
    ) -> model.KillResult:
        """Signal exactly the instance named by ``worker.instance_id``; never retried.

        KillWorker / KillDuringCheckpoint: SIGKILL. Preempt: SIGTERM now, and SIGKILL after
        the grace period to the same instance (its pidfd) if it still runs. HangWorker:
        SIGSTOP (cleanup sends SIGCONT first, so nothing is ever left stopped).
        """
        sig = {"Preempt": signal.SIGTERM, "HangWorker": signal.SIGSTOP}.get(
            fault.type, signal.SIGKILL
        )
        identity = Identity.parse(worker.instance_id)
        if identity is None:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                self._clock.now(),
                f"{worker.instance_id!r} is not a pid@start_time instance id; nothing was touched",
            )
        pidfd = pidfd_open(identity.pid)
        try:
            # With a pidfd open, the identity check below holds for the signal too:
            # the fd pins this exact process even if its pid is recycled meanwhile.
            if identity.process() is None:
                return model.KillResult(
                    model.KillOutcome.ALREADY_GONE,
                    self._clock.now(),
                    f"{worker.describe()} no longer exists (pid gone or reused); "
                    "nothing was touched",
                )
            if dry_run:
                try:
                    os.kill(identity.pid, 0)
                except PermissionError as exc:
                    raise PermissionDeniedError(
                        f"not allowed to signal {worker.describe()}: {exc}; run the drill as the "
                        "user that owns the job"
                    ) from exc
                except ProcessLookupError:
                    return model.KillResult(
                        model.KillOutcome.ALREADY_GONE, self._clock.now(), "exited just now"
                    )
                return model.KillResult(
                    model.KillOutcome.DRY_RUN,
                    self._clock.now(),
                    f"would send {sig.name} to pid {identity.pid} ({worker.describe()})",
                )
            with self._lock:
                self._victim = identity
            if sig is signal.SIGSTOP:
                with self._lock:
                    self._stopped.add(identity)  # before the signal: cleanup always sees it
            timestamp = self._clock.now()
            try:
                if pidfd is not None:
                    signal.pidfd_send_signal(pidfd, sig)
                else:
                    os.kill(identity.pid, sig)
            except ProcessLookupError:
                with self._lock:
                    self._victim = None
                return model.KillResult(
                    model.KillOutcome.ALREADY_GONE, self._clock.now(), "exited just now"
                )
            except PermissionError as exc:
                with self._lock:
                    self._victim = None
                raise PermissionDeniedError(
                    f"not allowed to kill {worker.describe()}: {exc}; run the drill as the user "
                    "that owns the job"
                ) from exc
            self._recovering = True  # watch closely until the new group is up
            self._poke.set()
            detail = f"{sig.name} sent to pid {identity.pid}"
            if sig is signal.SIGTERM:
                self._escalate_later(identity, pidfd, fault.grace_period)
                pidfd = None  # the escalation owns it now
                detail += f"; SIGKILL after {fault.grace_period:g}s if it still runs"
            return model.KillResult(model.KillOutcome.KILLED, timestamp, detail)
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def current_worker(self, rank: int) -> model.Worker | None:
        """That rank's worker in the newest restart generation running now, if any."""
        scan = self._scan()
        newest = max((w.restart_count for w in scan.workers), default=None)
        for proc in scan.workers:
            if proc.rank == rank and proc.restart_count == newest:
                return self._worker(proc)
        return None

    def current_workers(self) -> list[model.Worker]:
        """The newest restart generation's workers running now, by rank (node faults)."""
        scan = self._scan()
        newest = max((w.restart_count for w in scan.workers), default=None)
        return sorted(
            (self._worker(w) for w in scan.workers if w.restart_count == newest),
            key=lambda w: w.rank,
        )

    def processes(self) -> list[Identity]:
        """The agent and every live process under it (what a KillNode ends)."""
        if self._agent is None:
            return []
        found = [self._agent, *self._scan().processes]
        return list(dict.fromkeys(found))

    def _escalate_later(self, identity: Identity, pidfd: int | None, grace: float) -> None:
        """Preempt: SIGKILL that same instance after ``grace`` unless it is gone (or cleanup).

        The pidfd pins the instance, so the SIGKILL can only reach it: a replacement with
        the same pid (or rank) is never hit.
        """

        def escalate() -> None:
            try:
                if self._stop.wait(grace):
                    return  # cleanup ends every process anyway
                if pidfd is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                else:
                    signal_exactly(identity, signal.SIGKILL)
            finally:
                if pidfd is not None:
                    os.close(pidfd)

        thread = threading.Thread(target=escalate, name="recoverygate-preempt", daemon=True)
        thread.start()
        self._threads.append(thread)

    def watch_group(self) -> list[model.GroupEvent]:
        """Group events observed by the watcher thread since the previous call."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def events(self) -> StreamEventSource:
        return self._source

    @cleanup_once
    def cleanup(self) -> None:
        """End every process the drill started or saw, verify none is left, remove the temp dir.

        Idempotent. In attach mode the job is left running; only our threads stop.
        """
        with self._lock:
            stopped, self._stopped = set(self._stopped), set()
        for identity in stopped:  # first of all: never leave a process stopped
            signal_exactly(identity, signal.SIGCONT)
        self._stop.set()
        self._poke.set()
        leftover: list[str] = []
        try:
            if self.attach_pid is None:
                leftover = self._end_processes()
        finally:
            if self._tail is not None:
                self._tail.stop()
            self._source.close()  # stops and joins the pipe reader, closes the pipe
            for thread in self._threads:
                thread.join(timeout=2.0)
            if self._subreaper:
                SubreaperGuard.release()
                self._subreaper = False
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
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
        return self._agent.pid if self._agent else None

    @property
    def agent(self) -> Identity | None:
        """The launched (or attached) process's instance, once discover() has run."""
        return self._agent

    @property
    def marker(self) -> tuple[str, str] | None:
        """``(DRILL_MARKER, value)`` in the launched job's environment (None: attached)."""
        return None if self._drill_id is None else (DRILL_MARKER, self._drill_id)

    @property
    def scratch_dir(self) -> Path | None:
        """The drill-owned TMPDIR of the launched job (removed by cleanup)."""
        return self._tmpdir

    # ------------------------------------------------------------------ output

    def raw_output(self) -> str:
        """The job's merged stdout/stderr as read so far (the last few MiB)."""
        with self._lock:
            return "".join(self._raw)

    def output_tail(self, lines: int) -> str:
        """The last ``lines`` lines of the job's output, for error messages."""
        return "\n".join(self.raw_output().splitlines()[-lines:])

    def job_output(self) -> JobOutput:
        """torchrun's merged output as ``torchrun``; per rank, the lines with its prefix.

        The failing worker is the rank torchrun names as the root cause when that rank's
        own lines show an error (the other ranks' errors are mostly its echo), else the
        worker of the last error line.
        """
        output = self._output.output(
            note=(
                "torchrun's stdout and stderr as one stream (torchrun); lines a rank prefix "
                "marks ([default1]: with torchrun --tee=3, [rank1]: on torch tracebacks) "
                "also in that rank's file"
            ),
            order=[self._stream],
        )
        cause = root_cause_fields(self.raw_output())
        if cause and output.failing not in (None, self._stream):
            root = output.get(f"rank {cause[0]}")
            if root is not None and any(
                ERROR_LINE.match(line[:MAX_MATCH_LINE]) for line in root.text.splitlines()[-200:]
            ):
                output = dataclasses.replace(output, failing=root.label)
        return output

    def _keep_output(self, chunk: bytes) -> None:
        self._output.feed(chunk)
        text = self._decoder.decode(chunk)
        with self._lock:
            self._raw.append(text)
            self._raw_size += len(text)
            while self._raw_size > RAW_OUTPUT_LIMIT and len(self._raw) > 1:
                self._raw_size -= len(self._raw.popleft())

    # ------------------------------------------------------------------ launching

    def _launch(self) -> None:
        executable = resolve_executable(self.command[0])
        self._tmpdir = Path(tempfile.mkdtemp(prefix="recoverygate-local-"))
        env = {**os.environ, **self.env}
        env["PYTHONUNBUFFERED"] = "1"  # otherwise agent-relayed lines arrive ~1 s late
        env.pop("RECOVERYGATE_PARENT_INC", None)  # the job's workers are nobody's children
        # Everything the job starts inherits it: cleanup ends exactly the processes that
        # carry it, wherever they were re-parented and whatever session they are in.
        self._drill_id = secrets.token_hex(16)
        env[DRILL_MARKER] = self._drill_id
        if "TMPDIR" not in self.env:
            env["TMPDIR"] = str(self._tmpdir)  # torchrun's torchelastic_* logs land here
        if not self.workdir.is_dir():
            raise DiscoveryError(
                f"workload.workdir {str(self.workdir)!r} is not a directory; fix the path "
                "(relative paths resolve against the config file's folder)"
            )
        SubreaperGuard.acquire()
        self._subreaper = True
        self._launched_at = time.time()  # the reporter's clock: lines before are not this run's
        self._popen = launch(
            [executable, *self.command[1:]],
            cwd=self.workdir,
            env=env,
            what=f"could not start `{shlex.join(self.command)}`",
        )
        agent = psutil.Process(self._popen.pid)
        self._agent = Identity.of(agent)
        self._remember(self._agent)
        assert self._popen.stdout is not None
        self._source.attach_pipe(
            self._popen.stdout,
            stream=self._stream,
            on_chunk=self._keep_output,
            name="recoverygate-local-output",
        )

    def _attach(self) -> None:
        assert self.attach_pid is not None
        try:
            agent = psutil.Process(self.attach_pid)
            self._agent = Identity.of(agent)
            stdout = next((f.path for f in agent.open_files() if f.fd == 1), None)
            owner = agent.uids().effective  # the agent's output file must be its user's
        except psutil.NoSuchProcess as exc:
            raise DiscoveryError(
                f"workload.attachPid {self.attach_pid}: no such process; give the pid of a "
                "running torchrun agent"
            ) from exc
        except psutil.AccessDenied as exc:
            raise PermissionDeniedError(
                f"workload.attachPid {self.attach_pid}: not allowed to inspect it; run the "
                "drill as the user that owns the job"
            ) from exc
        if stdout is None:
            raise DiscoveryError(
                f"workload.attachPid {self.attach_pid}: its stdout is not a file, so the drill "
                "cannot read the job's progress; start torchrun with `> train.log 2>&1`"
            )
        # The shared tail: what the file holds now is history; a truncation (a restarted
        # agent's "> train.log") or a rotation is followed, every new byte read once.
        self._tail = OutputTail(
            stdout,
            self._feed_attached,
            self._clock,
            interval=POLL_INTERVAL,
            on_start_over=self._attached_started_over,
            name="recoverygate-local-output",
            owner=owner,
            on_notice=self._source.notice,
        )
        self._tail.seek_end()
        self._tail.start()

    def _feed_attached(self, chunk: bytes, received: float) -> None:
        self._keep_output(chunk)
        self._source.feed(chunk, received, stream=("attached", self._tail_generation))

    def _attached_started_over(self) -> None:
        """The output file was truncated or replaced: its old partial line ends here."""
        self._source.end_stream(("attached", self._tail_generation))
        self._tail_generation += 1

    # ------------------------------------------------------------------ scanning

    def _remember(self, identity: Identity) -> None:
        with self._lock:
            self._seen[identity.pid] = identity

    def _environ(self, proc: ProcRow, identity: Identity) -> dict[str, str] | None:
        """The process's environment, cached once it shows RANK (or once it is old enough)."""
        if identity in self._environ_cache:
            return self._environ_cache[identity]
        environ = proc.environ()
        if environ is None:
            return None
        if "RANK" in environ or identity.age() > ENVIRON_RETRY_AGE:
            self._environ_cache[identity] = environ
        return environ

    def _scan(self) -> Scan:
        """Every live descendant of the agent, and which of them are torchrun workers.

        One pass over the process table (``/proc/<pid>/stat`` read for each) per scan:
        ``Process.children()`` would walk the whole table once per root.
        """
        if self._agent is None:
            return Scan((), ())
        table, children = process_table()
        # Roots: the agent, and (for orphans of a dead agent) every process seen before.
        with self._lock:
            known = [self._agent, *self._seen.values()]
        pending = [
            i.pid for i in known if i.pid in table and i.same_start(table[i.pid].create_time)
        ]
        procs: dict[int, ProcRow] = {}
        while pending:
            pid = pending.pop()
            if pid in procs or pid not in table:
                continue
            procs[pid] = table[pid]
            pending.extend(children.get(pid, ()))
        workers: list[WorkerProc] = []
        identities: list[Identity] = []
        for proc in procs.values():
            if proc.zombie:
                continue
            identity = Identity(proc.pid, proc.create_time)
            parent_pid = proc.ppid
            identities.append(identity)
            if identity == self._agent:
                continue
            environ = self._environ(proc, identity)
            if not environ or "RANK" not in environ:
                continue
            parent = procs.get(parent_pid)
            if parent is not None and parent.pid != self._agent.pid:
                parent_identity = Identity(parent.pid, parent.create_time)
                parent_env = self._environ(parent, parent_identity)
                if parent_env and "RANK" in parent_env:
                    continue  # a worker's own subprocess (e.g. a DataLoader worker)
            with contextlib.suppress(ValueError):
                workers.append(
                    WorkerProc(
                        identity=identity,
                        rank=int(environ["RANK"]),
                        local_world_size=int(environ.get("LOCAL_WORLD_SIZE", "1")),
                        restart_count=int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                    )
                )
        for identity in identities:
            self._remember(identity)
        return Scan(tuple(workers), tuple(identities))

    @staticmethod
    def _complete_group(scan: Scan) -> dict[int, WorkerProc] | None:
        """The newest restart generation's workers by rank, if all local ranks are up."""
        if not scan.workers:
            return None
        newest = max(w.restart_count for w in scan.workers)
        group = {w.rank: w for w in scan.workers if w.restart_count == newest}
        size = max(w.local_world_size for w in group.values())
        return group if len(group) >= size else None

    def _agent_exit(self) -> str | None:
        """A description of how the agent ended, or None while it runs."""
        if self._popen is not None:
            code = self._popen.poll()
            if code is None:
                return None
            return f"the torchrun agent exited with code {code}"
        if self._agent is not None and self._agent.process() is None:
            return f"the torchrun agent (pid {self._agent.pid}) is gone"
        return None

    # ------------------------------------------------------------------ watching

    def _emit(self, kind: model.GroupEventKind, detail: str, **extra: Any) -> None:
        with self._lock:
            self._events.append(model.GroupEvent(kind, self._clock.now(), detail, **extra))
        self._clock.wakeup()

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch_once()
            except Exception as exc:  # never die silently: the drill would wait for nothing
                self._emit(model.GroupEventKind.JOB_FAILED, f"watching the job failed: {exc!r}")
                return
            if self._job_failed_reported:
                return
            self._poke.wait(POLL_INTERVAL if self._recovering else IDLE_POLL_INTERVAL)
            self._poke.clear()

    def _watch_once(self) -> None:
        scan = self._scan()
        alive = {w.identity for w in scan.workers}
        # 1. a member of the current group disappeared
        if not self._gone_reported:
            missing = [w for w in self._group.values() if w.identity not in alive]
            if missing:
                victim = self._victim
                first = next((w for w in missing if w.identity == victim), missing[0])
                self._gone_reported = True
                self._emit(
                    model.GroupEventKind.WORKER_GONE,
                    f"rank {first.rank} (pid {first.identity.pid}) is gone",
                    worker=self._worker(first),
                )
        # 2. a new restart generation appeared
        newest = max((w.restart_count for w in scan.workers), default=self._generation)
        if newest > self._generation:
            self._generation = newest
            self._group = {}
            self._gone_reported = False
            self._running_reported = False
            self._emit(
                model.GroupEventKind.RESTARTING,
                f"torchrun restarted the worker group (TORCHELASTIC_RESTART_COUNT={newest})",
                restart_count=newest - self._base_restart,
            )
        # 3. the new generation is complete
        current = {w.rank: w for w in scan.workers if w.restart_count == self._generation}
        for rank, worker in current.items():
            self._group.setdefault(rank, worker)
        if not self._running_reported and len(current) >= self._local_world_size:
            self._running_reported = True
            self._recovering = False
            pids = ", ".join(f"rank {r} pid {w.identity.pid}" for r, w in sorted(current.items()))
            self._emit(
                model.GroupEventKind.REPLACEMENT_RUNNING,
                f"all {len(current)} local ranks running again ({pids})",
                restart_count=self._generation - self._base_restart,
            )
        # 4. the agent exited: the job will not come back
        failure = self._agent_exit()
        if failure is not None and not self._job_failed_reported:
            self._job_failed_reported = True
            # Let the reader drain the agent's last words (its root-cause summary).
            drained = time.monotonic() + OUTPUT_DRAIN_TIMEOUT
            while self._source.open_streams and time.monotonic() < drained:
                time.sleep(0.01)
            if self._popen is not None and self._popen.poll() == 0:
                self._emit(model.GroupEventKind.JOB_SUCCEEDED, failure)
                return
            cause = root_cause(self.raw_output())
            self._emit(model.GroupEventKind.JOB_FAILED, f"{failure}{': ' + cause if cause else ''}")

    def _worker(self, proc: WorkerProc) -> model.Worker:
        return model.Worker(
            rank=proc.rank,
            name=f"rank {proc.rank} pid {proc.identity.pid}",
            instance_id=proc.identity.instance_id,
            node=socket.gethostname(),
        )

    # ------------------------------------------------------------------ cleanup

    def _end_processes(self) -> list[str]:
        """SIGTERM the agent, then SIGKILL every marked process until none is left.

        Returns a description (pid and command line) of every process of the job still
        alive at the deadline: marked ones that would not die, and processes seen in the
        job's tree that do not carry the marker (never signalled, so named instead).
        """
        if self._drill_id is None:
            return []  # nothing was launched
        if self._popen is not None and self._popen.poll() is None and self._agent is not None:
            agent = self._agent.process()
            if agent is not None:
                with contextlib.suppress(psutil.Error):
                    agent.send_signal(signal.SIGTERM)  # torchrun forwards it to the workers
                    # A stopped agent (^Z, a debugger) acts on it only once continued.
                    agent.send_signal(signal.SIGCONT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._popen.wait(timeout=TERM_GRACE)
        with contextlib.suppress(Exception):
            self._scan()  # remember anything that appeared at the last moment
        deadline = time.monotonic() + REAP_TIMEOUT
        while True:
            # Each round: every marked process alive now, wherever it was re-parented.
            # A process that forks while being killed leaves its child to the next round.
            marked = self._marked_processes()
            for identity in marked:
                signal_exactly(identity, signal.SIGKILL)
            self._reap()
            if not marked or time.monotonic() >= deadline:
                break
            time.sleep(KILL_ROUND_INTERVAL)
        # A SIGKILLed process is a zombie only once the kernel has torn it down, which a
        # loaded machine takes its time over: reap the adopted ones until none is left.
        reap_until = max(deadline, time.monotonic() + 1.0)
        while self._reap() and time.monotonic() < reap_until:
            time.sleep(KILL_ROUND_INTERVAL)
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        survivors = {i.pid: i for i in self._marked_processes()}
        with self._lock:
            seen = list(self._seen.values())
        unmarked = {i.pid: i for i in seen if i.pid not in survivors and is_running(i)}
        quiet = f"; not signalled: it does not carry the drill's {DRILL_MARKER}"
        # A process that exits while cleanup looks at it is gone, not left over.
        return leftovers(
            [(i, "") for i in survivors.values()] + [(i, quiet) for i in unmarked.values()],
            grace=LEFTOVER_GRACE,
        )

    def _marked_processes(self) -> list[Identity]:
        """Every live process that carries this drill's marker, among its possible places.

        Where to look: the descendants of this process (a child subreaper: the job's
        orphans re-parent here), and every process seen in the job's tree with its
        descendants (where there is no subreaper, orphans re-parent to init). One pass
        over the process table; a process that vanishes meanwhile is simply skipped.
        """
        table, children = process_table()
        with self._lock:
            seen = list(self._seen.values())
        me = os.getpid()
        pending = list(children.get(me, ()))
        pending += [
            i.pid for i in seen if i.pid in table and i.same_start(table[i.pid].create_time)
        ]
        visited: set[int] = set()
        marked: list[Identity] = []
        while pending:
            pid = pending.pop()
            if pid in visited or pid == me or pid not in table:
                continue
            visited.add(pid)
            pending.extend(children.get(pid, ()))
            proc = table[pid]
            if proc.zombie:
                continue
            environ = proc.environ()
            if environ is None:
                continue  # gone, or not ours to read: never signalled
            if environ.get(DRILL_MARKER) != self._drill_id:
                continue
            identity = Identity(pid, proc.create_time)
            with self._lock:
                self._marked.add(identity)
            marked.append(identity)
        return marked

    def _reap(self) -> int:
        """Collect the exit status of the job's dead processes this process adopted; how
        many of the job's marked processes this process adopted are not reaped yet.

        Only a zombie that is this process's child *and* one of the job's instances (pid
        and start time) is reaped: never another code's child. The agent is left to its
        Popen, which would otherwise take a vanished child for one that exited with 0.
        """
        if self._popen is not None:
            self._popen.poll()
        agent = self._popen.pid if self._popen is not None else None
        me = os.getpid()
        with self._lock:
            known = {*self._seen.values(), *self._marked}
            marked = set(self._marked)
        pending = 0
        for identity in known:
            if identity.pid == agent:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
                proc = psutil.Process(identity.pid)
                same = identity.same_start(start_time(identity.pid))
                if not same or proc.ppid() != me:
                    continue
                if proc.status() == psutil.STATUS_ZOMBIE:
                    reaped, _ = os.waitpid(identity.pid, os.WNOHANG)
                    pending += reaped == 0
                elif identity in marked:  # SIGKILLed, not torn down yet
                    pending += 1
        return pending
