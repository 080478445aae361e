"""The kill server: ``helper serve``, a process connected to the Ray cluster once.

Started at discovery, so that a request (a read of the GCS, a probe or a signal on a
node) costs a Ray task (0.1-1 s) instead of an import of ray and a ``ray.init`` (2-5 s on
a busy machine). One JSON request per line on its stdin, one answer line (prefixed
:data:`~.helper.MARK`) on its stdout. Each request carries an id and its answer echoes
it: an answer that comes after its request timed out is discarded by the next request,
never taken for that one's (a cleanup SIGCONT must not read the SIGSTOP's answer). A
request is never sent twice.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import signal
import subprocess
import threading
import time
from typing import Any

from pytest_recoverygate.errors import BackendError
from pytest_recoverygate.orchestrators.ray.helper import MARK as HELPER_MARK
from pytest_recoverygate.orchestrators.ray.helper import helper_command

__all__ = ["KillServer"]

REAP_TIMEOUT = 10.0


class KillServer:
    """``helper serve``: a process connected to the cluster once, ready to run requests."""

    def __init__(self, env: dict[str, str], address: str) -> None:
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._proc = subprocess.Popen(
            helper_command("serve", address),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._ready: bool | None = None
        self._ids = itertools.count(1)
        self._turn = threading.Lock()  # one request in flight
        self._reader = threading.Thread(target=self._read, name="ray-kill-server", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        with self._proc.stdout as pipe:  # closed when the server ends: no pipe left open
            for raw in pipe:
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith(HELPER_MARK):
                    with contextlib.suppress(ValueError):
                        answer = json.loads(line[len(HELPER_MARK) :])
                        if isinstance(answer, dict):
                            self._answers.put(answer)
        self._answers.put(None)

    def ready(self, timeout: float) -> bool:
        """Whether it connected (waits for its first answer once)."""
        with self._turn:
            if self._ready is None:
                try:
                    first = self._answers.get(timeout=timeout)
                except queue.Empty:
                    first = None
                self._ready = bool(first and first.get("ready"))
            return self._ready

    def request(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request, its own answer; BackendError when none comes in ``timeout`` (the
        request is never sent again) or the server says it failed."""
        assert self._proc.stdin is not None
        with self._turn:
            ident = next(self._ids)
            line = json.dumps({**payload, "id": ident}) + "\n"
            deadline = time.monotonic() + timeout
            answer: dict[str, Any] | None = None
            try:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
                while True:
                    got = self._answers.get(timeout=max(deadline - time.monotonic(), 0.0))
                    if got is None:
                        self._answers.put(None)  # the server ended: every later request too
                        break
                    if got.get("id") == ident:
                        answer = got
                        break
                    # an answer to an earlier request that timed out: not this one's
            except (OSError, ValueError, queue.Empty):  # ValueError: closed by close()
                answer = None
        if answer is None:
            raise BackendError(f"the kill server gave no answer within {timeout:g}s")
        if "error" in answer:
            raise BackendError(str(answer["error"]))
        return answer

    def kill(
        self,
        node_id: str,
        pid: int,
        ticks: str,
        timeout: float,
        sig: str = "KILL",
        *,
        marker: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        """One ``signal`` request (see :func:`.helper.signal_here`)."""
        request = {"op": "signal", "node": node_id, "pid": pid, "ticks": ticks, "signal": sig}
        return self.request({**request, "marker": list(marker) if marker else None}, timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=REAP_TIMEOUT)
        self._reader.join(timeout=5)
