"""Starting the job's own processes on this machine: one way for every backend that
launches one (the local backend's torchrun and group members, the Ray driver)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_recoverygate.errors import DiscoveryError

__all__ = ["job_command", "launch"]


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


def job_command(
    command: Sequence[str], *, key: str, what: str, example: str = "", attached: bool = False
) -> list[str]:
    """The command a backend launches the job with, copied; an empty one is a
    :class:`DiscoveryError` naming ``key`` and ``what`` to give (and ``example``), unless
    the drill ``attached`` to a running job instead."""
    if not command and not attached:
        raise DiscoveryError(
            f"{key} is empty: give {what} to launch" + (f", e.g. {example}" if example else "")
        )
    return list(command)
