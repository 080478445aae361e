"""The Ray backend's processes on this machine: its addresses, the driver the drill
launched (ended by session), and every process of the cluster that driver started, found
by the drill's marker in its environment and killed (psutil, imported when needed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from typing import Any

__all__ = [
    "DRILL_MARKER",
    "REAP_TIMEOUT",
    "TERM_GRACE",
    "end_driver",
    "end_marked",
    "local_addresses",
    "marked",
]

#: In the launched driver's environment (and so the cluster's): cleanup ends what carries it.
DRILL_MARKER = "RECOVERYGATE_DRILL_ID"
TERM_GRACE = 15.0  # seconds the driver gets to shut its cluster down after SIGTERM
REAP_TIMEOUT = 10.0


def local_addresses() -> set[str]:
    """The names and addresses of this machine (a worker on it is "local")."""
    found = {"127.0.0.1", "localhost", socket.gethostname()}
    with contextlib.suppress(Exception):  # a strange interface: the hostname still counts
        import psutil

        for addresses in psutil.net_if_addrs().values():
            found.update(a.address for a in addresses)
    with contextlib.suppress(OSError):
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    return found


def end_driver(proc: subprocess.Popen[bytes]) -> list[str]:
    """End the driver the drill launched: its session SIGTERMed, then SIGKILLed."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=TERM_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=REAP_TIMEOUT)
            except subprocess.TimeoutExpired:
                return [f"the driver pid {proc.pid} did not exit"]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # what is left of its session
    return []


def marked(drill_id: str) -> list[Any]:
    """Every process but this one whose environment carries the drill's marker."""
    import psutil

    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(DRILL_MARKER) == drill_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def end_marked(drill_id: str) -> list[str]:
    """SIGKILL every process of the cluster this drill's driver started (by its marker)."""
    import psutil

    deadline = time.monotonic() + REAP_TIMEOUT
    left: list[Any] = []
    while time.monotonic() < deadline:
        left = marked(drill_id)
        if not left:
            return []
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(left, timeout=1.0)
    return [f"pid {p.pid} ({' '.join(p.cmdline()[:3])})" for p in left if p.is_running()]
