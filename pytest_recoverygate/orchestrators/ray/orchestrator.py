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
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.orchestrators.ray import INSTALL_HINT
from pytest_recoverygate.orchestrators.ray.guard import WorkerGuard
from pytest_recoverygate.orchestrators.ray.helper import MARK as HELPER_MARK
from pytest_recoverygate.orchestrators.ray.helper import helper_command
from pytest_recoverygate.orchestrators.ray.processes import (
    DRILL_MARKER,
    end_driver,
    end_marked,
    gcs_port,
    local_addresses,
)
from pytest_recoverygate.orchestrators.ray.server import KillServer
from pytest_recoverygate.orchestrators.ray.signals import Target, WorkerSignals
from pytest_recoverygate.orchestrators.ray.state import (
    TrainAttempt,
    TrainRun,
    TrainWorker,
    failed_worker,
    failure_of,
    first_words,
    parse_runs,
)
from pytest_recoverygate.registry.seams import cleanup_once
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.filetail import OutputTail
from pytest_recoverygate.shared.joboutput import JobOutput, OutputSplitter
from pytest_recoverygate.shared.procs import JobLaunch, LaunchedJob, launch

if TYPE_CHECKING:
    from pytest_recoverygate.registry.seams import Clock

__all__ = ["DRILL_MARKER", "RayOrchestrator"]

POLL_INTERVAL = 0.3  # seconds between looks at Train's state
HELPER_TIMEOUT = 90.0  # seconds a helper subprocess may take (ray import + init + task)
HTTP_TIMEOUT = 10.0
PROBE_TIMEOUT = 5.0  # seconds a TCP connect to a given address may take
RUNS_PATH = "/api/train/v2/runs/v1"
DRIVER_BUFFER_CHUNKS = 4096  # chunks of driver output kept until the evidence is chosen
#: The signal of each fault (the others: SIGKILL).
SIGNAL_OF = {"Preempt": "TERM", "HangWorker": "STOP"}


def _token_from(env: dict[str, str]) -> str | None:
    """The cluster token a client on this machine would use (Ray's own lookup order)."""
    token = env.get("RAY_AUTH_TOKEN")
    if token:
        return token.strip()
    path = env.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


# --------------------------------------------------------------------------- orchestrator


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
        self._output = OutputSplitter(lambda line: None, default="driver")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._popen: subprocess.Popen[bytes] | None = None
        self._tmpdir: Path | None = None
        self._drill_id = secrets.token_hex(8)
        self._client_env: dict[str, str] = {}
        self._gcs: str | None = None
        self._dashboard: str | None = None
        self._token: str | None = None
        self._run_id: str | None = None
        self._run: TrainRun | None = None
        self._events: list[model.GroupEvent] = []
        self._watcher: threading.Thread | None = None
        self._tails: dict[str, OutputTail] = {}
        self._worker_logs: Path | None = None  # the session's logs folder, when on this machine
        self._driver_evidence: bool | None = None  # None: not decided yet (buffered)
        self._driver_buffer: list[tuple[bytes, float]] = []
        self._reader: threading.Thread | None = None
        self._server: KillServer | None = None
        self._signals = WorkerSignals(self._task_signal)
        self._killed_nodes: set[str] = set()  # node ids whose raylet the drill ended
        self._killed: set[str] = set()  # actor ids of the workers the drill signalled
        self._guard = WorkerGuard(self._ask, local=local_addresses())
        self._job_id: str | None = None  # submissionId: its Ray job, as the Jobs API names it
        self._followed: set[str] = set()  # actor ids whose worker log is tailed
        self._seen_attempts: set[str] = set()
        self._reported: set[tuple[str, str]] = set()  # (attempt id, phase) already emitted
        self._started_cluster = False
        self._ended = False
        self.discovered_at: float | None = None

    # ------------------------------------------------------------------ Orchestrator

    def discover(self, deadline: float) -> model.Workload:
        """Launch the driver (or find the Job), wait for Train's worker group, name it."""
        if self.submission_id is None:
            self._launch()
        self._connect(deadline)
        assert self._gcs is not None
        self._server = KillServer(self._client_env, self._gcs)  # connects while Train starts
        run = self._wait_for_group(deadline)
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
            job=self._job_id,
        )
        self._choose_evidence(attempt)
        with self._lock:
            self._run = run
            self._seen_attempts.add(attempt.attempt_id)
            self._reported.add((attempt.attempt_id, "running"))
        self._watcher = threading.Thread(target=self._watch, name="recoverygate-ray", daemon=True)
        self._watcher.start()
        self.discovered_at = self._clock.now()
        return model.Workload(
            job=f"ray train run {run.name} ({run.run_id[:8]})",
            workers=tuple(self._worker(w) for w in attempt.workers),
            nodes=self._nodes(attempt),
        )

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault = model.KILL
    ) -> model.KillResult:
        """One signal to exactly that instance, from a task pinned to its node (the drill
        itself for a worker on this machine); never retried.

        ``KillWorker``, ``KillDuringCheckpoint``: SIGKILL. ``Preempt``: SIGTERM, then
        SIGKILL after ``gracePeriod`` to the same instance (pid + start ticks) if it still
        runs. ``HangWorker``: SIGSTOP, remembered before it is sent: cleanup SIGCONTs it
        first of all (:mod:`.signals`).
        """
        sig = SIGNAL_OF.get(fault.type, "KILL")
        actor_id, pid, ticks = self._identity(worker.instance_id)
        run = self._fetch_run()
        current = run.current if run is not None else None
        found = next(
            (w for w in (current.workers if current else ()) if w.actor_id == actor_id), None
        )
        if found is None or not found.alive or found.pid != pid:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                self._clock.now(),
                f"{worker.describe()} is no longer a live worker of the run; nothing was touched",
            )
        target = self._guard.target(found, ticks)  # BackendError: refused, nothing sent
        if target is None:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                self._clock.now(),
                f"the GCS lists {worker.describe()} as gone; nothing was touched",
            )
        if dry_run:
            return model.KillResult(
                model.KillOutcome.DRY_RUN,
                self._clock.now(),
                f"would send SIG{sig} to pid {pid} (actor {actor_id}, node "
                f"{found.node_id[:12]}); nothing was sent",
            )
        before = self._clock.now()
        with self._lock:  # before the signal: the watcher may look before the task answers
            self._killed.add(actor_id)
        try:
            if sig == "STOP":
                result = self._signals.stop(target)
            else:
                result = self._signals.send(target, sig)
        except BackendError as exc:
            return model.KillResult(
                model.KillOutcome.UNCONFIRMED,
                before,
                f"the task sending SIG{sig} to pid {pid} did not answer ({exc}); not retried",
            )
        if result.get("outcome") != "killed":
            with self._lock:
                self._killed.discard(actor_id)  # nothing was sent: its death is not ours
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE, self._clock.now(), str(result.get("detail", "gone"))
            )
        by = str(result.get("by", "a task on its node"))
        detail = f"SIG{sig} sent to pid {pid} (actor {actor_id}, node {found.node_id[:12]}) by {by}"
        if sig == "TERM":
            exact = dataclasses.replace(target, ticks=str(result.get("ticks") or target.ticks))
            self._signals.escalate_later(exact, fault.grace_period)
            detail += f"; SIGKILL after {fault.grace_period:g}s if that same instance still runs"
        elif sig == "STOP":
            detail += "; cleanup sends SIGCONT to that same instance first"
        return model.KillResult(model.KillOutcome.KILLED, float(result.get("at", before)), detail)

    def _task_signal(self, target: Target, sig: str) -> dict[str, Any]:
        """One signal through the cluster, by a task pinned to the target's node."""
        marker = list(target.marker) if target.marker else None
        request = {"op": "signal", "node": target.node_id, "pid": target.pid}
        return self._ask(
            request | {"ticks": target.ticks, "signal": sig, "marker": marker}, HELPER_TIMEOUT
        )

    def _ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request to the cluster: the kill server, else a one-shot helper for it."""
        if self._gcs is None:
            raise BackendError("the drill is not connected to the Ray cluster")
        if self._server is not None and self._server.ready(timeout):
            return self._server.request(request, timeout)
        return self._helper("request", self._gcs, json.dumps(request), timeout=timeout)

    def current_worker(self, rank: int) -> model.Worker | None:
        """That rank's worker in the run's current attempt, when that attempt is running."""
        with self._lock:
            run = self._run
        current = run.current if run is not None else None
        if current is None or not current.running:
            return None
        found = next((w for w in current.workers if w.rank == rank), None)
        return self._worker(found) if found is not None else None

    def watch_group(self) -> list[model.GroupEvent]:
        with self._lock:
            events, self._events = self._events, []
        return events

    # ------------------------------------------------------------------ NodeFaults

    def _nodes(self, attempt: TrainAttempt) -> tuple[model.Node, ...]:
        """The attempt's nodes, each with its live workers, in the order of their lowest
        world rank (index 0: rank 0's node). Not Train's ``node_rank``: Train numbers nodes
        by IP address, and the nodes of one machine share it."""
        by_node: dict[str, list[TrainWorker]] = {}
        for worker in sorted(attempt.workers, key=lambda w: w.rank):
            by_node.setdefault(worker.node_id, []).append(worker)
        nodes = []
        for index, (node_id, workers) in enumerate(by_node.items()):
            first = workers[0]
            nodes.append(
                model.Node(
                    index,
                    first.node,
                    node_id,
                    tuple(self._worker(w) for w in workers if w.alive),
                    (("nodeIp", first.node_ip),),
                )
            )
        return tuple(nodes)

    def current_node(self, index: int) -> model.Node | None:
        """Node ``index`` (Train's node rank) of the current attempt, when it runs."""
        run = self._fetch_run()
        current = run.current if run is not None else None
        if current is None or not current.running:
            return None
        return next((n for n in self._nodes(current) if n.index == index), None)

    def kill_node(self, node: model.Node, *, dry_run: bool, fault: model.Fault) -> model.KillResult:
        """``KillNode``: SIGKILL the node's raylet from a task pinned to it; its workers die
        with it. Never the head (its raylet's death ends the cluster); never retried."""
        run = self._fetch_run()
        current = run.current if run is not None else None
        live = [
            w
            for w in (current.workers if current else ())
            if w.node_id == node.identity and w.alive
        ]
        if not live:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                self._clock.now(),
                f"{node.describe()} runs no live worker of the run now; nothing was touched",
            )
        # Only a node hosting a worker the GCS vouches for, never the head (BackendError)
        self._guard.check_node(node.identity, live)
        if dry_run:
            return model.KillResult(
                model.KillOutcome.DRY_RUN,
                self._clock.now(),
                f"would SIGKILL the raylet of {node.describe()} from a task pinned to it",
            )
        before = self._clock.now()
        with self._lock:
            self._killed_nodes.add(node.identity)
        try:
            result = self._ask({"op": "raylet", "node": node.identity}, HELPER_TIMEOUT)
        except BackendError as exc:
            return model.KillResult(
                model.KillOutcome.UNCONFIRMED,
                before,
                f"the raylet kill task did not answer ({exc})",
            )
        if result.get("outcome") != "killed":
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE, self._clock.now(), str(result.get("detail", "gone"))
            )
        return model.KillResult(
            model.KillOutcome.KILLED,
            float(result.get("at", before)),
            f"SIGKILL sent to the raylet of {node.describe()} by a task on that node "
            f"({result.get('detail', '')})",
        )

    def restore_node(self, node: model.Node) -> model.KillResult:
        """Nothing to restore: the ray backend offers no PartitionNode."""
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE, self._clock.now(), "nothing to restore"
        )

    def events(self) -> StreamEventSource:
        return self._source

    def job_output(self) -> JobOutput:
        source = "the driver's output (fallback)" if self._driver_evidence else "logs/worker-*.out"
        return self._output.output(
            note=(
                "the driver's stdout and stderr (driver); each Train worker's own "
                f"logs/worker-*.out by rank and pid; training events read from {source}"
            ),
            order=("driver",),
        )

    @cleanup_once
    def cleanup(self) -> None:
        """SIGCONT what a HangWorker stopped, first of all; stop the Preempt escalation, the
        watcher and the tails; end the driver (and the cluster it started)."""
        stuck = self._signals.continue_all()
        self._signals.close()
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=10)
        for tail in list(self._tails.values()):
            tail.stop()
        if self._server is not None:
            self._server.close()
        problems = []
        if self._popen is not None:
            problems += end_driver(self._popen)
        if self._reader is not None:
            self._reader.join(timeout=5)
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

    # ------------------------------------------------------------------ launch & connect

    def _launch(self) -> None:
        self._tmpdir = Path(tempfile.mkdtemp(prefix="rg-ray-", dir="/tmp"))
        env = {**os.environ, **self.env}
        env.pop("RECOVERYGATE_PARENT_INC", None)  # the job's workers are nobody's children
        env.update(
            {
                "PYTHONUNBUFFERED": "1",
                "RAY_TRAIN_ENABLE_STATE_TRACKING": "1",
                DRILL_MARKER: self._drill_id,
            }
        )
        if self.address is not None:
            # Joining a cluster: its own temp folder holds its sockets (and, for
            # address: auto, the ray_current_cluster file ray.init looks for).
            env["RAY_ADDRESS"] = self.address
        else:
            env["RAY_TMPDIR"] = str(self._tmpdir)
        if (
            self.address is None
            and not env.get("RAY_AUTH_TOKEN")
            and env.get("RAY_AUTH_MODE", "") != "disabled"
        ):
            # The cluster the driver starts gets a token of this drill, not ~/.ray's.
            env["RAY_AUTH_MODE"] = "token"
            env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        self._client_env = env
        self._started_cluster = self.address is None
        if self._started_cluster:  # every process of it carries the marker, under its tmpdir
            self._guard.marker, self._guard.within = (DRILL_MARKER, self._drill_id), self._tmpdir
        command = [shutil.which(self.command[0]) or self.command[0], *self.command[1:]]
        if command[0] == "python" or Path(command[0]).name in ("python", "python3"):
            command[0] = sys.executable  # the drill's own interpreter: the one with ray
        self._popen = launch(
            command,
            cwd=self.workdir,
            env=env,
            what=f"could not launch workload.entrypoint `{shlex.join(self.command)}`",
        )
        assert self._popen.stdout is not None
        self._reader = threading.Thread(
            target=self._read_driver, args=(self._popen.stdout,), name="ray-driver", daemon=True
        )
        self._reader.start()

    def _read_driver(self, pipe: Any) -> None:
        """The driver's output: kept for the report; evidence only in the fallback mode."""
        fd = pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self._driver_chunk(chunk, self._clock.now())
        with contextlib.suppress(OSError):
            pipe.close()
        self._output.end("driver", label="driver")
        with self._lock:
            evidence = self._driver_evidence
        if evidence:
            self._source.end_stream("driver")

    def _driver_chunk(self, chunk: bytes, received: float) -> None:
        self._output.feed(chunk, "driver", label="driver")
        with self._lock:
            if self._driver_evidence is None:
                self._driver_buffer.append((chunk, received))
                if len(self._driver_buffer) > DRIVER_BUFFER_CHUNKS:
                    del self._driver_buffer[0]
                return
            evidence = self._driver_evidence
        if evidence:
            self._source.feed(chunk, received, stream="driver")

    def _connect(self, deadline: float) -> None:
        """Find the cluster's GCS and dashboard (the cluster the driver starts takes seconds)."""
        env = dict(self._client_env or os.environ)
        if self.address is None:
            assert self._tmpdir is not None
            session = self._tmpdir / "ray" / "session_latest"
            while True:
                text = gcs_port(session)
                if text.isdigit():
                    self._gcs = f"127.0.0.1:{text}"
                    break
                self._check_driver("before its Ray cluster came up")
                if self._clock.now() >= deadline:
                    raise DiscoveryError(
                        f"the driver started no Ray cluster under {self._tmpdir} before the "
                        f"discovery deadline; last output:\n{self.output_tail()}"
                    )
                time.sleep(0.2)
        else:
            self._gcs = self.address
            if self.address != "auto":
                self._probe()
        token = _token_from(env)
        if token is not None:
            env.setdefault("RAY_AUTH_MODE", "token")
        self._client_env, self._token = env, token
        while True:
            try:
                answer = self._helper("resolve", self._gcs, timeout=HELPER_TIMEOUT)
                self._dashboard = str(answer["dashboard"]).rstrip("/")
                if not self._dashboard.startswith("http"):
                    self._dashboard = "http://" + self._dashboard
                return
            except BackendError as exc:
                if self.address is not None or self._clock.now() >= deadline:
                    raise self._no_cluster(str(exc)) from None
                self._check_driver("before its Ray cluster answered")
                time.sleep(0.5)

    def _probe(self) -> None:
        """A TCP connect to the given GCS address: where nothing listens, say so now, not
        after ``ray.init`` has waited out its own GCS timeout (about 30 s)."""
        assert self.address is not None
        host, _, port = self.address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT).close()
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            raise self._no_cluster(f"a TCP connect says {why}") from None

    def _no_cluster(self, why: str) -> DiscoveryError:
        where = f"workload.address {self.address!r}" if self.address else "the driver"
        return DiscoveryError(
            f"no Ray cluster answers at {self._gcs} (from {where}): {why}; start the cluster "
            "(`ray start --head`) or fix the address"
        )

    def _helper(self, *args: str, timeout: float) -> dict[str, Any]:
        """Run ``helper ARGS`` (the one place ray is imported) and return its JSON answer."""
        try:
            done = subprocess.run(
                helper_command(*args),
                env=self._client_env or None,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BackendError(
                f"the ray helper ({args[0]}) did not finish in {timeout:g}s"
            ) from None
        text = done.stdout.decode("utf-8", "replace")
        line = next((ln for ln in reversed(text.splitlines()) if ln.startswith(HELPER_MARK)), None)
        if line is None:
            err = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
            if any("No module named 'ray'" in e for e in err):
                raise BackendError(f"ray is not installed for {sys.executable}: {INSTALL_HINT}")
            raise BackendError(f"the ray helper ({args[0]}) failed: {' '.join(err) or 'no answer'}")
        answer: dict[str, Any] = json.loads(line[len(HELPER_MARK) :])
        if "error" in answer:
            if "No module named 'ray" in str(answer["error"]):
                raise BackendError(f"ray is not installed for {sys.executable}: {INSTALL_HINT}")
            raise BackendError(str(answer["error"]))
        return answer

    def _get(self, path: str) -> Any:
        assert self._dashboard is not None
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        # The dashboard's URL is checked to be http(s) when it is resolved (_connect).
        request = urllib.request.Request(self._dashboard + path, headers=headers)  # noqa: S310
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as answer:  # noqa: S310
            return json.loads(answer.read())

    def _fetch_runs(self) -> list[TrainRun] | None:
        """Train's runs, or None when its state cannot be read right now."""
        try:
            return parse_runs(self._get(RUNS_PATH))
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")[:300]
            if exc.code in (401, 403):
                raise DiscoveryError(
                    f"the Ray dashboard at {self._dashboard} refused the drill's client "
                    f"(HTTP {exc.code}: {body}); give the cluster's token as RAY_AUTH_TOKEN "
                    "(or in ~/.ray/auth_token)"
                ) from None
            return None  # 500 until Train's state actor exists
        except (OSError, ValueError):
            return None

    def _mine(self, runs: list[TrainRun]) -> TrainRun | None:
        """The run of this drill's driver (or Job): the newest one that is ours."""
        if self._run_id is not None:
            return next((r for r in runs if r.run_id == self._run_id), None)
        if self.submission_id is not None:
            ours = [r for r in runs if r.submission_id == self.submission_id]
        else:
            pid = self._popen.pid if self._popen is not None else None
            ours = [r for r in runs if r.driver_pid == pid]
            if not ours and self._started_cluster:
                ours = list(runs)  # a cluster of our own: every run is ours
        return max(ours, key=lambda r: r.start_ns) if ours else None

    def _fetch_run(self) -> TrainRun | None:
        runs = self._fetch_runs()
        if runs is None:
            with self._lock:
                return self._run
        run = self._mine(runs)
        if run is not None:
            with self._lock:
                self._run = run
        return run

    def _wait_for_group(self, deadline: float) -> TrainRun:
        if self.submission_id is not None:
            self._check_job()
        seen = "no Train run"
        while True:
            runs = self._fetch_runs()
            run = self._mine(runs) if runs is not None else None
            if run is not None:
                current = run.current
                seen = f"run {run.name!r} {run.status}" + (
                    f", attempt {current.status}" if current else ""
                )
                if run.terminal:
                    raise DiscoveryError(
                        f"the Train run {run.name!r} ended ({run.status}) before the drill "
                        f"could see its workers: {first_words(run.detail, 400)}"
                    )
                if current is not None and current.running:
                    self._run_id = run.run_id
                    return run
            self._check_driver("before Train's worker group was running")
            if self._clock.now() >= deadline:
                raise DiscoveryError(
                    f"no running Train worker group appeared before the discovery deadline "
                    f"(seen: {seen}); does `{shlex.join(self.command) or self.submission_id}` "
                    f"call TorchTrainer.fit()? last output:\n{self.output_tail()}"
                )
            time.sleep(POLL_INTERVAL)

    def _check_job(self) -> None:
        """``submissionId``: the Ray Job must be running (nothing is killed otherwise)."""
        try:
            assert self.submission_id is not None
            job = self._get(f"/api/jobs/{urllib.parse.quote(self.submission_id, safe='')}")
        except urllib.error.HTTPError as exc:
            raise DiscoveryError(
                f"workload.submissionId {self.submission_id!r}: the cluster at {self.address} "
                f"has no such Ray Job (HTTP {exc.code}); `ray job list` names the running ones"
            ) from None
        except (OSError, ValueError) as exc:
            raise DiscoveryError(
                f"workload.submissionId {self.submission_id!r}: the Jobs API at "
                f"{self._dashboard} did not answer: {exc}"
            ) from None
        status = str(job.get("status", "")) if isinstance(job, dict) else ""
        if isinstance(job, dict) and job.get("job_id"):
            self._job_id = str(job["job_id"])  # its driver's Ray job: the workers' job
        if status != "RUNNING":
            raise DiscoveryError(
                f"workload.submissionId {self.submission_id!r} is not running (its status is "
                f"{status or 'unknown'}); give the id of a RUNNING Ray Job (`ray job list`)"
            )

    def _check_driver(self, when: str) -> None:
        if self._popen is not None and self._popen.poll() is not None:
            raise DiscoveryError(
                f"the driver `{shlex.join(self.command)}` exited with "
                f"{self._popen.returncode} {when}; last output:\n{self.output_tail()}"
            )

    def output_tail(self, lines: int = 15) -> str:
        text = self._output.output().text
        return "\n".join(text.splitlines()[-lines:]) or "(nothing)"

    # ------------------------------------------------------------------ identity

    def _worker(self, worker: TrainWorker) -> model.Worker:
        ticks = self._guard.ticks(worker.actor_id)  # read on its node by the guard's probe
        instance = f"{worker.actor_id}:{worker.pid}" + (f"@{ticks}" if ticks else "")
        return model.Worker(
            worker.rank,
            f"RayTrainWorker pid {worker.pid}",
            instance,
            node=worker.node,
            details=(
                ("actorId", worker.actor_id),
                ("nodeId", worker.node_id),
                ("pid", str(worker.pid)),
            ),
        )

    @staticmethod
    def _identity(instance_id: str) -> tuple[str, int, str | None]:
        actor, _, rest = instance_id.partition(":")
        pid, _, ticks = rest.partition("@")
        try:
            return actor, int(pid), ticks or None
        except ValueError:
            return actor, -1, None

    # ------------------------------------------------------------------ evidence

    def _choose_evidence(self, attempt: TrainAttempt) -> None:
        """Worker logs when the session folder the GCS names is on this machine, else the
        driver's copy (never the folder Train's state names: job code writes that)."""
        for worker in attempt.workers:
            logs = self._guard.logs_folder(worker.node_id)
            if logs is not None and self._guard.log_files(worker):
                self._worker_logs = logs
                break
        with self._lock:
            self._driver_evidence = self._worker_logs is None
            buffered, self._driver_buffer = self._driver_buffer, []
            if self._driver_evidence:  # under the lock: the reader's next chunk comes after
                for chunk, received in buffered:
                    self._source.feed(chunk, received, stream="driver")
        self._follow_logs(attempt)

    def _follow_logs(self, attempt: TrainAttempt) -> None:
        if self._worker_logs is None:
            return
        try:  # the logs folder's user writes the worker logs (not followed if a link)
            owner: int | None = os.lstat(self._worker_logs).st_uid
        except OSError:
            owner = None
        for worker in attempt.workers:
            if worker.actor_id in self._followed:
                continue
            for path in self._guard.log_files(worker):
                self._followed.add(worker.actor_id)
                key = str(path)
                if key in self._tails:
                    continue
                label = f"rank {worker.rank} pid {worker.pid}"
                tail = OutputTail(
                    key,
                    functools.partial(self._worker_chunk, key, label),
                    self._clock,
                    interval=0.2,
                    name=f"ray-worker-{worker.pid}",
                    owner=owner,
                    on_notice=self._source.notice,
                )
                self._tails[key] = tail
                tail.start()

    def _worker_chunk(self, key: str, label: str, chunk: bytes, received: float) -> None:
        self._output.feed(chunk, key, label=label)
        self._source.feed(chunk, received, stream=key)

    # ------------------------------------------------------------------ the group

    def _emit(
        self, kind: model.GroupEventKind, detail: str, worker: model.Worker | None = None
    ) -> None:
        with self._lock:
            restarts = max(len(self._run.attempts) - 1, 0) if self._run is not None else None
            self._events.append(model.GroupEvent(kind, self._clock.now(), detail, worker, restarts))
        self._clock.wakeup()

    def _once(self, attempt: str, phase: str) -> bool:
        with self._lock:
            if (attempt, phase) in self._reported:
                return False
            self._reported.add((attempt, phase))
            return True

    def _watch(self) -> None:
        while not self._stop.wait(POLL_INTERVAL):
            try:
                self._look()
            except Exception as exc:  # a watcher that dies silently would hang the drill
                self._emit(model.GroupEventKind.JOB_FAILED, f"watching Train's state failed: {exc}")
                return
            if self._ended:
                return

    def _look(self) -> None:
        run = self._fetch_run()
        if self._popen is not None and self._popen.poll() is not None and not self._ended:
            self._ended = True
            code = self._popen.returncode
            if code == 0:
                self._emit(model.GroupEventKind.JOB_SUCCEEDED, "the driver exited with 0")
            else:
                status = (
                    f" (run {run.status}: {first_words(run.detail)})" if run is not None else ""
                )
                self._emit(
                    model.GroupEventKind.JOB_FAILED, f"the driver exited with {code}{status}"
                )
            return
        if run is None:
            return
        with self._lock:
            killed_nodes, victims = sorted(self._killed_nodes), set(self._killed)
        for node_id in killed_nodes:
            on_node = [w for a in run.attempts for w in a.workers if w.node_id == node_id]
            if on_node and not any(w.alive for w in on_node) and self._once(node_id, "node gone"):
                self._emit(
                    model.GroupEventKind.NODE_GONE,
                    f"every worker of node {on_node[0].node} is gone with its raylet",
                )
        if run.current is not None and run.current.running:
            self._follow_logs(run.current)  # until the GCS vouched for each worker's log
        for index, attempt in enumerate(run.attempts):
            aid = attempt.attempt_id
            old = index < len(run.attempts) - 1 or attempt.status in ("ERRORED", "ABORTED")
            dead = [w for w in attempt.workers if not w.alive]
            seen = aid in self._seen_attempts
            failed = failure_of(run, index, dead, victims)
            if seen and failed is not None and self._once(aid, "gone"):
                who = failed_worker(attempt, dead, victims)
                self._emit(
                    model.GroupEventKind.WORKER_GONE,
                    failed,
                    self._worker(who) if who is not None else None,
                )
            shut_down = (
                seen and old and attempt.workers and not any(w.alive for w in attempt.workers)
            )
            if shut_down and not run.terminal and self._once(aid, "shut down"):
                self._emit(
                    model.GroupEventKind.RESTARTING,
                    f"group shut down (run {run.status}); Train restarts it",
                )
            if aid not in self._seen_attempts and index == len(run.attempts) - 1:
                if self._once(aid, "pending"):
                    self._emit(
                        model.GroupEventKind.REPLACEMENT_PENDING,
                        f"new group being placed: {attempt.detail or attempt.status}",
                    )
                if attempt.running and self._once(aid, "running"):
                    with self._lock:
                        self._seen_attempts.add(aid)
                    self._follow_logs(attempt)
                    self._emit(
                        model.GroupEventKind.REPLACEMENT_RUNNING,
                        f"new group placed, train function restarted "
                        f"({len(attempt.workers)} workers)",
                    )
        if run.terminal and self._once(run.run_id, "terminal"):
            if run.status == "FINISHED":
                self._emit(model.GroupEventKind.JOB_SUCCEEDED, "the Train run FINISHED")
            else:
                self._emit(
                    model.GroupEventKind.JOB_FAILED,
                    f"the Train run {run.status}: {first_words(run.detail)}",
                )

    # ------------------------------------------------------------------ cleanup
