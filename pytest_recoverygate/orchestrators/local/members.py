"""A job made of several members: ``workload.group`` (a torchft lighthouse and its replicas).

Each member is one command with its own environment and folder. A *worker* member is a
torchrun job, run by its own :class:`~.orchestrator.LocalOrchestrator` (launch, scan,
kill by identity, watch, clean up its own marked processes); a *service* member
(``service: true``, e.g. torchft's lighthouse) is one process that runs for the others
and never keeps the job alive. Every member's output goes into one shared event source,
as the stream named after the member, so each event and each output line knows its member.

- ``{port:NAME}`` in a member's command or environment is one free port per NAME for the
  whole drill, the same number wherever it appears (:func:`allocate_ports`).
- The *target* member is the one whose ``REPLICA_GROUP_ID`` (or ``RECOVERYGATE_REPLICA``)
  is ``injectFailure.targetReplica``, else the first worker member. Its workers come first
  in the workload (the runner's ``by_rank`` finds the target there); kills and
  ``current_worker`` go to it.
- Group events: the target member's, as they are; another worker member that fails is
  JOB_FAILED (naming it); JOB_SUCCEEDED once every worker member ended with success; a
  service that exits while worker members run is JOB_FAILED.
- Cleanup ends every member: the worker members first (each its own way), the services
  last (SIGTERM, then SIGKILL), on every path, and reports what would not die.

Measured with torchft 0.2.0 (docs/torchft.md). The member model is written for nodes too:
a member is a command, an environment and a place; nothing here assumes more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.orchestrators.local import REPLICA_VARIABLES, replica_of
from pytest_recoverygate.orchestrators.local.orchestrator import DRILL_MARKER, LocalOrchestrator
from pytest_recoverygate.orchestrators.local.processes import SubreaperGuard, resolve_executable
from pytest_recoverygate.registry.seams import cleanup_once
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.joboutput import JobOutput, WorkerOutput
from pytest_recoverygate.shared.procs import JobLaunch, launch

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_recoverygate.registry.seams import Clock

__all__ = [
    "PORT_PATTERN",
    "REPLICA_VARIABLES",
    "GroupOrchestrator",
    "MemberSpec",
    "OutputKeeper",
    "ServiceProcess",
    "allocate_ports",
    "fill_ports",
    "replica_of",
]

#: ``{port:NAME}``: one free port per NAME.
PORT_PATTERN = re.compile(r"\{port:([A-Za-z0-9_.-]+)\}")
SERVICE_TERM_GRACE = 3.0  # seconds a service gets after SIGTERM before SIGKILL
SERVICE_READY_WAIT = 0.5  # seconds a service gets to bind its port before the others start


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """One member of the job, as configured (ports not yet filled in)."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: Path = Path()
    service: bool = False


def _free_port() -> int:
    """A port free on loopback right now (IPv4, else IPv6): the services a drill starts
    are bound to loopback (the examples bind ``127.0.0.1:{port:NAME}``), never probed on
    every interface."""
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((address, 0))
                return int(sock.getsockname()[1])
        except OSError:
            continue
    raise DiscoveryError("no free port could be found for {port:NAME}: is networking off?")


def allocate_ports(members: Sequence[MemberSpec]) -> dict[str, int]:
    """One free port per ``{port:NAME}`` used anywhere in ``members`` (distinct numbers)."""
    names: list[str] = []
    for member in members:
        for text in (*member.command, *member.env.values()):
            names += [n for n in PORT_PATTERN.findall(text) if n not in names]
    ports: dict[str, int] = {}
    for name in names:
        port = _free_port()
        while port in ports.values():
            port = _free_port()
        ports[name] = port
    return ports


def _fill(text: str, ports: Mapping[str, int]) -> str:
    return PORT_PATTERN.sub(lambda m: str(ports[m.group(1)]), text)


def fill_ports(member: MemberSpec, ports: Mapping[str, int]) -> MemberSpec:
    """``member`` with every ``{port:NAME}`` replaced by its number."""
    return dataclasses.replace(
        member,
        command=tuple(_fill(arg, ports) for arg in member.command),
        env={key: _fill(value, ports) for key, value in member.env.items()},
    )


class ServiceProcess:
    """A member that runs for the others (the lighthouse): one process, its own session."""

    def __init__(self, member: MemberSpec, env: Mapping[str, str]) -> None:
        self.member = member
        self._env = dict(env)
        self._popen: subprocess.Popen[bytes] | None = None

    def launch(self, source: StreamEventSource, keep: OutputKeeper) -> None:
        member = self.member
        executable = resolve_executable(member.command[0])
        self._popen = launch(
            [executable, *member.command[1:]],
            cwd=member.workdir,
            env={
                k: v
                for k, v in {**os.environ, **self._env}.items()
                if k != "RECOVERYGATE_PARENT_INC"  # the members are nobody's children
            },
            what=f"workload.group member {member.name!r}: could not start "
            f"`{shlex.join(member.command)}`",
        )
        assert self._popen.stdout is not None
        source.attach_pipe(
            self._popen.stdout,
            stream=member.name,
            on_chunk=lambda chunk: keep.feed(member.name, chunk),
            name=f"recoverygate-member-{member.name}",
        )

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def exit_code(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def stop(self) -> str | None:
        """SIGTERM, then SIGKILL; a description if it still runs afterwards."""
        popen = self._popen
        if popen is None or popen.poll() is not None:
            return None
        with contextlib.suppress(ProcessLookupError):
            popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=SERVICE_TERM_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
            try:
                popen.wait(timeout=SERVICE_TERM_GRACE)
            except subprocess.TimeoutExpired:
                return f"pid {popen.pid} ({shlex.join(self.member.command)})"
        return None


class OutputKeeper:
    """The services' output, per member, bounded (the worker members keep their own)."""

    LIMIT = 1024 * 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._text: dict[str, str] = {}

    def feed(self, name: str, chunk: bytes) -> None:
        with self._lock:
            text = self._text.get(name, "") + chunk.decode("utf-8", "replace")
            self._text[name] = text[-self.LIMIT :]

    def get(self, name: str) -> str:
        with self._lock:
            return self._text.get(name, "")


class GroupOrchestrator:
    """Launches every member of ``workload.group``, kills in the target member, watches all."""

    name = "local"

    def __init__(
        self,
        members: Sequence[MemberSpec],
        base_env: Mapping[str, str],
        *,
        target_replica: int | None,
        target_rank: int,
        clock: Clock,
    ) -> None:
        if not any(not m.service for m in members):
            raise DiscoveryError(
                "workload.group has no member that trains (every member is service: true); "
                "give at least one torchrun member"
            )
        self._clock = clock
        self._ports = allocate_ports(members)
        self.members = [fill_ports(m, self._ports) for m in members]
        self._source = StreamEventSource(wakeup=clock.wakeup, clock=clock.now)
        self._keeper = OutputKeeper()
        self._services: list[ServiceProcess] = []
        self._workers: dict[str, LocalOrchestrator] = {}
        self._drill_id = secrets.token_hex(16)
        for member in self.members:
            env = {**base_env, **member.env}
            if member.service:
                self._services.append(ServiceProcess(member, {**env, DRILL_MARKER: self._drill_id}))
            else:
                self._workers[member.name] = LocalOrchestrator(
                    JobLaunch(member.command, member.workdir, env),
                    target_rank=target_rank,
                    clock=clock,
                    source=self._source,
                    stream=member.name,
                )
        self.target_member = self._target_member(target_replica)
        self._ended: dict[str, bool] = {}  # worker member -> ended with success
        self._failed_reported = False
        self._subreaper = False

    @property
    def ports(self) -> dict[str, int]:
        """The number each ``{port:NAME}`` became."""
        return dict(self._ports)

    def _target_member(self, replica: int | None) -> str:
        workers = [m for m in self.members if not m.service]
        if replica is not None:
            for member in workers:
                if replica_of(member.env) == replica:
                    return member.name
            known = sorted({r for m in workers if (r := replica_of(m.env)) is not None})
            raise DiscoveryError(
                f"injectFailure.targetReplica {replica} is not the replica of any "
                f"workload.group member (their REPLICA_GROUP_ID / RECOVERYGATE_REPLICA: "
                f"{known or 'none'}); set targetReplica to one of them"
            )
        return workers[0].name

    # ------------------------------------------------------------------ Orchestrator

    def discover(self, deadline: float) -> model.Workload:
        """Start the services, then each worker member, and wait for every worker group."""
        SubreaperGuard.acquire()
        self._subreaper = True
        for service in self._services:
            service.launch(self._source, self._keeper)
        if self._services:
            time.sleep(SERVICE_READY_WAIT)  # the lighthouse binds its port
        for service in self._services:
            code = service.exit_code()
            if code is not None:
                raise DiscoveryError(
                    f"workload.group service {service.member.name!r} exited with code "
                    f"{code} before the job started; its output:\n"
                    + "\n".join(self._keeper.get(service.member.name).splitlines()[-15:])
                )
        # Every member starts at once: a replica launched only after another's workers
        # appeared would join the quorum seconds late.
        found: dict[str, model.Workload] = {}
        with ThreadPoolExecutor(
            len(self._workers), thread_name_prefix="recoverygate-member"
        ) as pool:
            futures = {name: pool.submit(m.discover, deadline) for name, m in self._workers.items()}
            for name, future in futures.items():
                try:
                    found[name] = future.result()
                except DiscoveryError as exc:
                    raise DiscoveryError(f"workload.group member {name!r}: {exc}") from exc
        order = [self.target_member, *(n for n in found if n != self.target_member)]
        workers = tuple(
            dataclasses.replace(w, name=f"{name} {w.name}")
            for name in order
            for w in found[name].workers
        )
        what = ", ".join(
            [f"{n} ({len(found[n].workers)} worker(s))" for n in found]
            + [f"{s.member.name} (service, pid {s.pid})" for s in self._services]
        )
        return model.Workload(
            job=f"a group of {len(self.members)} members: {what}", workers=workers
        )

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault = model.KILL
    ) -> model.KillResult:
        return self._workers[self.target_member].kill(worker, dry_run=dry_run, fault=fault)

    def current_worker(self, rank: int) -> model.Worker | None:
        worker = self._workers[self.target_member].current_worker(rank)
        if worker is None:
            return None
        return dataclasses.replace(worker, name=f"{self.target_member} {worker.name}")

    def watch_group(self) -> list[model.GroupEvent]:
        out: list[model.GroupEvent] = []
        ended_kinds = (model.GroupEventKind.JOB_FAILED, model.GroupEventKind.JOB_SUCCEEDED)
        for name, member in self._workers.items():
            for event in member.watch_group():
                if event.kind in ended_kinds:
                    ok = event.kind is model.GroupEventKind.JOB_SUCCEEDED
                    self._ended[name] = ok
                    if not ok and not self._failed_reported:
                        self._failed_reported = True
                        out.append(
                            dataclasses.replace(event, detail=f"member {name}: {event.detail}")
                        )
                    continue
                if name == self.target_member:
                    out.append(event)
        if (
            not self._failed_reported
            and len(self._ended) == len(self._workers)
            and all(self._ended.values())
        ):
            self._failed_reported = True
            out.append(
                model.GroupEvent(
                    model.GroupEventKind.JOB_SUCCEEDED,
                    self._clock.now(),
                    f"every member that trains exited with 0 ({', '.join(self._workers)})",
                )
            )
        if not self._failed_reported and len(self._ended) < len(self._workers):
            for service in self._services:
                code = service.exit_code()
                if code is not None:
                    self._failed_reported = True
                    out.append(
                        model.GroupEvent(
                            model.GroupEventKind.JOB_FAILED,
                            self._clock.now(),
                            f"service member {service.member.name} exited with code {code} "
                            "while the job trained",
                        )
                    )
                    break
        return out

    def events(self) -> StreamEventSource:
        return self._source

    @cleanup_once
    def cleanup(self) -> None:
        """End every member: the worker members, then the services; say what survived."""
        problems: list[str] = []
        try:
            for name, member in self._workers.items():
                try:
                    member.cleanup()
                except BackendError as exc:
                    problems.append(f"member {name}: {exc}")
        finally:
            for service in self._services:
                left = service.stop()
                if left is not None:
                    problems.append(f"service member {service.member.name}: {left}")
            self._source.close()
            if self._subreaper:
                SubreaperGuard.release()
                self._subreaper = False
        if problems:
            raise BackendError("; ".join(problems))

    # ------------------------------------------------------------------ output

    def raw_output(self) -> str:
        parts = [
            f"== {s.member.name} ==\n{self._keeper.get(s.member.name)}" for s in self._services
        ]
        parts += [f"== {n} ==\n{m.raw_output()}" for n, m in self._workers.items()]
        return "\n".join(parts)

    def output_tail(self, lines: int) -> str:
        return "\n".join(self.raw_output().splitlines()[-lines:])

    def job_output(self) -> JobOutput:
        """Every member's output: each worker member's files prefixed by its name."""
        workers: list[WorkerOutput] = [
            WorkerOutput(s.member.name, self._keeper.get(s.member.name)) for s in self._services
        ]
        failing: str | None = None
        for name, member in self._workers.items():
            output = member.job_output()
            for w in output.workers:
                label = w.label if w.label == name else f"{name} {w.label}"
                workers.append(WorkerOutput(label, w.text, w.cut_bytes))
            if output.failing is not None and (failing is None or name == self.target_member):
                failing = output.failing if output.failing == name else f"{name} {output.failing}"
        return JobOutput(
            tuple(workers),
            failing,
            "one file per member (its torchrun's merged output, or the service's), plus each "
            "rank's prefixed lines",
        )
