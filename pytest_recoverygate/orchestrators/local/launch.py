"""The local job's processes as the drill started them (or attached to them): the agent and
its Popen, the drill's marker and TMPDIR, the subreaper, the output pipe or file."""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from pytest_recoverygate.errors import DiscoveryError, PermissionDeniedError
from pytest_recoverygate.orchestrators.local.processes import (
    Identity,
    SubreaperGuard,
    resolve_executable,
)
from pytest_recoverygate.orchestrators.local.scan import POLL_INTERVAL
from pytest_recoverygate.shared.filetail import OutputTail
from pytest_recoverygate.shared.procs import launch

if TYPE_CHECKING:
    from pytest_recoverygate.registry.seams import Clock
    from pytest_recoverygate.shared.events import StreamEventSource

__all__ = ["DRILL_MARKER", "LocalJob"]

#: In the launched job's environment, one value per drill: cleanup ends what carries it.
DRILL_MARKER = "RECOVERYGATE_DRILL_ID"


class LocalJob:
    """The agent the drill launched (or attached to), and what it owns for the job.

    Every chunk of the job's output goes to ``source`` (training events) and to ``keep``
    (the raw copy). A launch or attach that fails half-way leaves what it made here for
    :meth:`release` to undo.
    """

    def __init__(
        self, *, source: StreamEventSource, keep: Callable[[bytes], None], clock: Clock
    ) -> None:
        self._source = source
        self._keep = keep
        self._clock = clock
        self.popen: subprocess.Popen[bytes] | None = None
        self.launched_at: float | None = None
        self.agent: Identity | None = None
        self.tmpdir: Path | None = None
        self.drill_id: str | None = None  # the marker's value in the launched job's environment
        self._tail: OutputTail | None = None  # attach mode: the agent's output file
        self._tail_generation = 0  # bumped each time the tail starts the file over
        self._subreaper = False

    def launch(
        self,
        command: list[str],
        workdir: Path,
        job_env: dict[str, str],
        *,
        stream: str,
        remember: Callable[[Identity], None],
    ) -> None:
        """Start ``command`` with the drill's marker and TMPDIR, its output piped here."""
        executable = resolve_executable(command[0])
        self.tmpdir = Path(tempfile.mkdtemp(prefix="recoverygate-local-"))
        env = {**os.environ, **job_env}
        env["PYTHONUNBUFFERED"] = "1"  # otherwise agent-relayed lines arrive ~1 s late
        env.pop("RECOVERYGATE_PARENT_INC", None)  # the job's workers are nobody's children
        # Everything the job starts inherits it: cleanup ends exactly the processes that
        # carry it, wherever they were re-parented and whatever session they are in.
        self.drill_id = secrets.token_hex(16)
        env[DRILL_MARKER] = self.drill_id
        if "TMPDIR" not in job_env:
            env["TMPDIR"] = str(self.tmpdir)  # torchrun's torchelastic_* logs land here
        if not workdir.is_dir():
            raise DiscoveryError(
                f"workload.workdir {str(workdir)!r} is not a directory; fix the path "
                "(relative paths resolve against the config file's folder)"
            )
        SubreaperGuard.acquire()
        self._subreaper = True
        self.launched_at = time.time()  # the reporter's clock: lines before are not this run's
        self.popen = launch(
            [executable, *command[1:]],
            cwd=workdir,
            env=env,
            what=f"could not start `{shlex.join(command)}`",
        )
        agent = psutil.Process(self.popen.pid)
        self.agent = Identity.of(agent)
        remember(self.agent)
        assert self.popen.stdout is not None
        self._source.attach_pipe(
            self.popen.stdout,
            stream=stream,
            on_chunk=self._keep,
            name="recoverygate-local-output",
        )

    def attach(self, attach_pid: int) -> None:
        """Watch the running agent ``attach_pid``: follow the file its stdout goes to."""
        try:
            agent = psutil.Process(attach_pid)
            self.agent = Identity.of(agent)
            stdout = next((f.path for f in agent.open_files() if f.fd == 1), None)
            owner = agent.uids().effective  # the agent's output file must be its user's
        except psutil.NoSuchProcess as exc:
            raise DiscoveryError(
                f"workload.attachPid {attach_pid}: no such process; give the pid of a "
                "running torchrun agent"
            ) from exc
        except psutil.AccessDenied as exc:
            raise PermissionDeniedError(
                f"workload.attachPid {attach_pid}: not allowed to inspect it; run the "
                "drill as the user that owns the job"
            ) from exc
        if stdout is None:
            raise DiscoveryError(
                f"workload.attachPid {attach_pid}: its stdout is not a file, so the drill "
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
        self._keep(chunk)
        self._source.feed(chunk, received, stream=("attached", self._tail_generation))

    def _attached_started_over(self) -> None:
        """The output file was truncated or replaced: its old partial line ends here."""
        self._source.end_stream(("attached", self._tail_generation))
        self._tail_generation += 1

    def ended(self) -> str | None:
        """A description of how the agent ended, or None while it runs."""
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:
                return None
            return f"the torchrun agent exited with code {code}"
        if self.agent is not None and self.agent.process() is None:
            return f"the torchrun agent (pid {self.agent.pid}) is gone"
        return None

    def stop_tail(self) -> None:
        """Stop following the attached agent's output file (nothing when launched)."""
        if self._tail is not None:
            self._tail.stop()

    def release(self) -> None:
        """Give the subreaper back and remove the drill's TMPDIR (once the job is ended)."""
        if self._subreaper:
            SubreaperGuard.release()
            self._subreaper = False
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
