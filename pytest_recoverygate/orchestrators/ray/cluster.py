"""The drill's line to the Ray cluster: its GCS and dashboard found, the helper subprocess
run, the dashboard read, and each request sent through the kill server (else a one-shot
helper).

Nothing here imports ray: everything that needs it is a :mod:`.helper` subprocess.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.orchestrators.ray import INSTALL_HINT
from pytest_recoverygate.orchestrators.ray.helper import MARK as HELPER_MARK
from pytest_recoverygate.orchestrators.ray.helper import helper_command
from pytest_recoverygate.orchestrators.ray.processes import gcs_port
from pytest_recoverygate.orchestrators.ray.server import KillServer

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.ray.signals import Target
    from pytest_recoverygate.registry.seams import Clock

__all__ = ["HELPER_TIMEOUT", "HTTP_TIMEOUT", "PROBE_TIMEOUT", "ClusterLink", "token_from"]

HELPER_TIMEOUT = 90.0  # seconds a helper subprocess may take (ray import + init + task)
HTTP_TIMEOUT = 10.0
PROBE_TIMEOUT = 5.0  # seconds a TCP connect to a given address may take


def token_from(env: dict[str, str]) -> str | None:
    """The cluster token a client on this machine would use (Ray's own lookup order)."""
    token = env.get("RAY_AUTH_TOKEN")
    if token:
        return token.strip()
    path = env.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


class ClusterLink:
    """The cluster at ``address`` (None: the one the driver starts under its tmpdir): the
    client's environment, the GCS, the dashboard and its token, the kill server."""

    def __init__(self, address: str | None, *, clock: Clock) -> None:
        self.address = address
        self._clock = clock
        self.env: dict[str, str] = {}  # the client's environment (the driver's, once launched)
        self.gcs: str | None = None
        self.dashboard: str | None = None
        self.token: str | None = None
        self.server: KillServer | None = None

    def connect(
        self,
        deadline: float,
        *,
        tmpdir: Path | None,
        check_driver: Callable[[str], None],
        output_tail: Callable[[], str],
    ) -> None:
        """Find the cluster's GCS and dashboard (the cluster the driver starts takes seconds)."""
        env = dict(self.env or os.environ)
        if self.address is None:
            assert tmpdir is not None
            session = tmpdir / "ray" / "session_latest"
            while True:
                text = gcs_port(session)
                if text.isdigit():
                    self.gcs = f"127.0.0.1:{text}"
                    break
                check_driver("before its Ray cluster came up")
                if self._clock.now() >= deadline:
                    raise DiscoveryError(
                        f"the driver started no Ray cluster under {tmpdir} before the "
                        f"discovery deadline; last output:\n{output_tail()}"
                    )
                time.sleep(0.2)
        else:
            self.gcs = self.address
            if self.address != "auto":
                self.probe()
        token = token_from(env)
        if token is not None:
            env.setdefault("RAY_AUTH_MODE", "token")
        self.env, self.token = env, token
        while True:
            try:
                answer = self.helper("resolve", self.gcs, timeout=HELPER_TIMEOUT)
                self.dashboard = str(answer["dashboard"]).rstrip("/")
                if not self.dashboard.startswith("http"):
                    self.dashboard = "http://" + self.dashboard
                return
            except BackendError as exc:
                if self.address is not None or self._clock.now() >= deadline:
                    raise self.no_cluster(str(exc)) from None
                check_driver("before its Ray cluster answered")
                time.sleep(0.5)

    def probe(self) -> None:
        """A TCP connect to the given GCS address: where nothing listens, say so now, not
        after ``ray.init`` has waited out its own GCS timeout (about 30 s)."""
        assert self.address is not None
        host, _, port = self.address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT).close()
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            raise self.no_cluster(f"a TCP connect says {why}") from None

    def no_cluster(self, why: str) -> DiscoveryError:
        where = f"workload.address {self.address!r}" if self.address else "the driver"
        return DiscoveryError(
            f"no Ray cluster answers at {self.gcs} (from {where}): {why}; start the cluster "
            "(`ray start --head`) or fix the address"
        )

    def start_server(self) -> None:
        """The kill server: it connects while Train starts."""
        assert self.gcs is not None
        self.server = KillServer(self.env, self.gcs)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def task_signal(self, target: Target, sig: str) -> dict[str, Any]:
        """One signal through the cluster, by a task pinned to the target's node."""
        marker = list(target.marker) if target.marker else None
        request = {"op": "signal", "node": target.node_id, "pid": target.pid}
        return self.ask(
            request | {"ticks": target.ticks, "signal": sig, "marker": marker}, HELPER_TIMEOUT
        )

    def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request to the cluster: the kill server, else a one-shot helper for it."""
        if self.gcs is None:
            raise BackendError("the drill is not connected to the Ray cluster")
        if self.server is not None and self.server.ready(timeout):
            return self.server.request(request, timeout)
        return self.helper("request", self.gcs, json.dumps(request), timeout=timeout)

    def helper(self, *args: str, timeout: float) -> dict[str, Any]:
        """Run ``helper ARGS`` (the one place ray is imported) and return its JSON answer."""
        try:
            done = subprocess.run(
                helper_command(*args),
                env=self.env or None,
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

    def get(self, path: str) -> Any:
        """The dashboard's JSON answer at ``path``, with the cluster's token."""
        assert self.dashboard is not None
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        # The dashboard's URL is checked to be http(s) when it is resolved (connect).
        request = urllib.request.Request(self.dashboard + path, headers=headers)  # noqa: S310
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as answer:  # noqa: S310
            return json.loads(answer.read())
