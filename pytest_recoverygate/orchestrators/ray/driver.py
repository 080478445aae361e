"""The driver the drill launches: its environment (``RAY_TMPDIR`` or ``RAY_ADDRESS``,
Train's state tracking, the drill's marker, a token of the drill for a cluster it starts)
and its interpreter, started in a session of its own.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from pytest_recoverygate.orchestrators.ray.processes import DRILL_MARKER
from pytest_recoverygate.shared.procs import launch

__all__ = ["driver_env", "start_driver"]


def driver_env(
    env: dict[str, str], *, address: str | None, drill_id: str, tmpdir: Path
) -> dict[str, str]:
    """The driver's environment: this process's, then the workload's ``env``, then the
    drill's own variables."""
    env = {**os.environ, **env}
    env.pop("RECOVERYGATE_PARENT_INC", None)  # the job's workers are nobody's children
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "RAY_TRAIN_ENABLE_STATE_TRACKING": "1",
            DRILL_MARKER: drill_id,
        }
    )
    if address is not None:
        # Joining a cluster: its own temp folder holds its sockets (and, for
        # address: auto, the ray_current_cluster file ray.init looks for).
        env["RAY_ADDRESS"] = address
    else:
        env["RAY_TMPDIR"] = str(tmpdir)
    if (
        address is None
        and not env.get("RAY_AUTH_TOKEN")
        and env.get("RAY_AUTH_MODE", "") != "disabled"
    ):
        # The cluster the driver starts gets a token of this drill, not ~/.ray's.
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    return env


def start_driver(
    command: list[str], *, workdir: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Launch ``command`` (``python``: the drill's own interpreter, the one with ray)."""
    argv = [shutil.which(command[0]) or command[0], *command[1:]]
    if argv[0] == "python" or Path(argv[0]).name in ("python", "python3"):
        argv[0] = sys.executable  # the drill's own interpreter: the one with ray
    return launch(
        argv,
        cwd=workdir,
        env=env,
        what=f"could not launch workload.entrypoint `{shlex.join(command)}`",
    )
