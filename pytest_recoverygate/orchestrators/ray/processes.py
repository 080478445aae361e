"""The Ray backend's processes on this machine: its addresses, the driver the drill
launched (ended by session), the port of the cluster that driver started, and every
process of that cluster, found by the drill's marker in its environment and killed
(psutil, imported when needed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = [
    "DRILL_MARKER",
    "REAP_TIMEOUT",
    "TERM_GRACE",
    "end_driver",
    "end_marked",
    "gcs_port",
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


def gcs_port(session: Path) -> str:
    """The GCS port the cluster's head wrote in its ``session`` folder ("" while it has not).

    The GCS writes ``gcs_server_port_<node>`` through a ``….tmp`` file it then renames:
    the temporary file is skipped, and a file gone between the look and the read is looked
    for again on the caller's next try."""
    try:
        ports = sorted(p for p in session.glob("gcs_server_port_*") if p.suffix != ".tmp")
        return ports[0].read_text().strip() if ports else ""
    except OSError:  # the session or the file went between the look and the read
        return ""


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
