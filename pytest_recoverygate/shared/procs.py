"""Starting the job's own processes on this machine: one way, and one holder of the
command, for every backend that launches one (the local backend's torchrun, its nodes
and group members, the Ray driver)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pytest_recoverygate.errors import DiscoveryError

if TYPE_CHECKING:
    from pytest_recoverygate.shared.clock import Clock

__all__ = ["JobLaunch", "LaunchedJob", "launch"]


def launch(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], what: str
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in ``cwd`` in a session of its own (a kill of its group reaches only
    the job), stdin closed, stdout and stderr merged on one pipe.

    A program that cannot start (not found, not executable, the folder gone) is a
    :class:`DiscoveryError` that opens with ``what`` (the config key and the command).
    """
    try:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        raise DiscoveryError(f"{what} in {cwd}: {exc}") from exc


@dataclass(frozen=True)
class JobLaunch:
    """What the drill launches: ``command`` run in ``workdir`` with ``env`` added to this
    process's environment (both copied)."""

    command: Sequence[str]
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)


class LaunchedJob:
    """What a backend that launches its job from a command holds of it: the
    :class:`JobLaunch` (as ``command``, ``workdir`` and ``env``), on the drill's ``clock``.

    An empty command is a :class:`DiscoveryError` naming the backend's
    :attr:`command_key` and :attr:`command_what` to give (and :attr:`command_example`),
    unless the drill ``attached`` to a running job instead.
    """

    #: The config key that gives the command, what it is, and an example (for that error).
    command_key: ClassVar[str] = "workload.command"
    command_what: ClassVar[str]
    command_example: ClassVar[str] = ""

    def __init__(self, job: JobLaunch, *, clock: Clock, attached: bool = False) -> None:
        if not job.command and not attached:
            example = self.command_example
            raise DiscoveryError(
                f"{self.command_key} is empty: give {self.command_what} to launch"
                + (f", e.g. {example}" if example else "")
            )
        self.command = list(job.command)
        self.workdir = Path(job.workdir)
        self.env = dict(job.env)
        self._clock = clock
