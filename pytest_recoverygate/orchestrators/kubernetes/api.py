"""One drill's connection to the API server: the client, reads with retries, the streams.

The only module that imports ``kubernetes`` (lazily, inside its functions: ``recoverygate
--help`` and the other backends never pay for it). :class:`ApiSession` loads the client
configuration once (a given client, in-cluster, or a kubeconfig), gives each thread and
each kill its own connection pool, retries reads on 429/5xx/connection errors with the
shared :func:`~pytest_recoverygate.shared.retry.retry_read` (a 403 becomes an error that names
the RBAC it needs), registers streamed responses so that cleanup can cut them, starts
and joins the backend's threads, and carries the first fatal error a thread met to the
runner.

urllib3's own retries are off for every request (``Configuration.retries = False``):
urllib3 would re-send a GET *and a DELETE* on 429/503 with Retry-After and on some
connection errors. Reads are retried here; the kill is never re-sent behind our back.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pytest_recoverygate.errors import (
    BackendError,
    DrillError,
    PermissionDeniedError,
    UsageError,
)
from pytest_recoverygate.orchestrators.kubernetes.pods import Pod
from pytest_recoverygate.registry.seams import Clock
from pytest_recoverygate.shared.retry import RetryPolicy, retry_read
from pytest_recoverygate.shared.textbounds import LineSplitter

__all__ = [
    "RBAC_EXAMPLE",
    "RETRY",
    "WATCH_LINE_BYTES",
    "ApiSession",
    "is_transient",
    "iter_lines",
    "shutdown",
    "status_message",
]

T = TypeVar("T")

RBAC_EXAMPLE = "examples/kubernetes/rbac.yaml"
#: Retries against the API server: 0.2 s doubling to 2 s, Retry-After up to 5 s, 8 tries.
RETRY = RetryPolicy(attempts=8, base=0.2, cap=2.0, retry_after_cap=5.0)

_TRANSIENT_STATUS = frozenset({0, 429, 500, 502, 503, 504})
_SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def status_message(exc: Any) -> str:
    """The ``message`` of an apiserver Status body, else the HTTP reason."""
    body = getattr(exc, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = json.loads(body).get("message")
            if message:
                return str(message)
    return str(getattr(exc, "reason", "") or exc)


def is_transient(exc: BaseException) -> bool:
    """A failure worth trying again: 429, 5xx, a dropped or refused connection."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        return exc.status in _TRANSIENT_STATUS or (exc.status or 0) >= 500
    return isinstance(exc, (HTTPError, OSError))


#: The longest watch event line kept whole: the API server's objects are at most ~1.5 MiB
#: (etcd's request limit), so a longer line is no pod of ours.
WATCH_LINE_BYTES = 16 * 1024 * 1024


def iter_lines(resp: Any, splitter: LineSplitter | None = None) -> Iterator[bytes]:
    """Non-empty lines of a streamed urllib3 response, as they arrive.

    At most ``splitter.max_line`` bytes of an unfinished line are held (a pod's log is the
    job's: a line without a newline must not grow without bound); a longer line comes out
    cut, and ``splitter.truncated`` counts it."""
    lines = splitter if splitter is not None else LineSplitter(WATCH_LINE_BYTES)
    for chunk in resp.stream(amt=None, decode_content=False):
        for line in lines.feed(chunk.encode() if isinstance(chunk, str) else chunk):
            if line:
                yield line
    yield from lines.flush()


def shutdown(resp: Any) -> None:
    """Unblock a thread reading ``resp`` (urllib3 >= 2.3 has shutdown(); else the socket)."""
    cut = getattr(resp, "shutdown", None)
    if callable(cut):
        with contextlib.suppress(Exception):
            cut()
            return
    conn = getattr(resp, "connection", None) or getattr(resp, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@dataclass(eq=False, kw_only=True)
class ApiSession:
    """The API server as one drill sees it: ``selector`` in one namespace (``api_client``:
    a client whose configuration to copy, instead of in-cluster or kubeconfig)."""

    selector: str
    namespace: str | None
    context: str | None
    kubeconfig: str | None
    api_client: Any
    request_timeout: float
    retry: RetryPolicy
    clock: Clock

    def __post_init__(self) -> None:
        #: set once cleanup begins: threads end, reads stop, new streams cut themselves
        self.stop = threading.Event()
        self._configuration: Any = None
        self._clients: list[Any] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._open_responses: set[Any] = set()
        self._fatal: DrillError | None = None

    # ------------------------------------------------------------------ connection

    def connect(self) -> None:
        """Load the client configuration once: given client, in-cluster, or kubeconfig."""
        if self._configuration is not None:
            return
        try:
            import kubernetes.config
            from kubernetes import client
        except ImportError:
            raise UsageError(
                "orchestrator: kubernetes needs the kubernetes client, which is not "
                f"installed in the environment RecoveryGate runs in ({sys.executable}): "
                "pip install 'kubernetes>=35' (it comes with pip install recoverygate)"
            ) from None

        config: Any = kubernetes.config  # untyped in some client versions
        if self.api_client is not None:
            configuration = copy.deepcopy(self.api_client.configuration)
        else:
            configuration = client.Configuration()
            in_cluster = (
                self.kubeconfig is None
                and self.context is None
                and "KUBERNETES_SERVICE_HOST" in os.environ
            )
            loaded = False
            if in_cluster:
                try:
                    config.load_incluster_config(client_configuration=configuration)
                    loaded = True
                    if self.namespace is None and _SA_NAMESPACE_FILE.exists():
                        self.namespace = _SA_NAMESPACE_FILE.read_text().strip() or None
                except config.ConfigException:
                    loaded = False
            if not loaded:
                where = self.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
                try:
                    config.load_kube_config(
                        config_file=self.kubeconfig,
                        context=self.context,
                        client_configuration=configuration,
                        persist_config=False,
                    )
                    if self.namespace is None:
                        self.namespace = self._kubeconfig_namespace()
                except (config.ConfigException, OSError, ValueError, TypeError) as exc:
                    context = f" context {self.context!r}" if self.context else ""
                    raise UsageError(
                        f"cannot load the Kubernetes configuration from {where}{context}: {exc}. "
                        "Fix: set workload.kubeconfig / workload.context, or run in a pod "
                        "with a ServiceAccount."
                    ) from None
        # Deliberate: urllib3 would silently re-send GET *and DELETE* on 429/503 with
        # Retry-After and on some connection errors. Reads are retried here, the kill never.
        configuration.retries = False
        if hasattr(configuration, "client_go_retries"):
            configuration.client_go_retries = False
        self._configuration = configuration
        if self.namespace is None:
            self.namespace = "default"

    def _kubeconfig_namespace(self) -> str | None:
        import kubernetes.config

        config: Any = kubernetes.config
        contexts, active = config.list_kube_config_contexts(self.kubeconfig)
        chosen = active
        if self.context is not None:
            chosen = next((c for c in contexts if c.get("name") == self.context), None)
        if not chosen:
            return None
        namespace = (chosen.get("context") or {}).get("namespace")
        return str(namespace) if namespace else None

    def new_api(self) -> Any:
        """A CoreV1Api on its own connection pool (each thread, and each kill, gets one)."""
        from kubernetes import client

        self.connect()
        api_client = client.ApiClient(configuration=self._configuration)
        with self._lock:
            self._clients.append(api_client)
        return client.CoreV1Api(api_client)

    def host(self) -> str:
        return str(getattr(self._configuration, "host", "?"))

    # ------------------------------------------------------------------ reads

    def forbidden(self, verb: str, resource: str, exc: Any) -> PermissionDeniedError:
        """A 403 as the error that says which permissions the drill needs."""
        return PermissionDeniedError(
            f"Kubernetes refused to {verb} {resource} in namespace {self.namespace!r} "
            f"(403 Forbidden: {status_message(exc)}). RecoveryGate needs exactly pods "
            f"list/watch/delete and pods/log get in that namespace. Fix: kubectl apply -n "
            f"{self.namespace} -f {RBAC_EXAMPLE} and run as its ServiceAccount "
            "(or grant those verbs to your user)."
        )

    def read(
        self,
        verb: str,
        resource: str,
        call: Callable[[], T],
        *,
        deadline: float | None = None,
        passthrough: frozenset[int] = frozenset(),
    ) -> T:
        """A read with retries on 429/5xx/connection errors, 403 made clear.

        Statuses in ``passthrough`` are re-raised as the client's ApiException for the
        caller to interpret; anything else that does not clear becomes a DrillError.
        """
        from kubernetes.client.exceptions import ApiException

        def attempt() -> T:
            if self.stop.is_set():
                raise BackendError("the drill is cleaning up")
            return call()

        try:
            return retry_read(
                attempt,
                transient=is_transient,
                policy=self.retry,
                deadline=deadline,
                now=self.clock.now,
            )
        except ApiException as exc:
            if exc.status in passthrough:
                raise
            if exc.status == 403:
                raise self.forbidden(verb, resource, exc) from None
            raise BackendError(
                f"Kubernetes API error on {verb} {resource} in namespace {self.namespace!r}: "
                f"{exc.status} {status_message(exc)}"
            ) from None
        except DrillError:
            raise
        except Exception as exc:
            if is_transient(exc):
                raise BackendError(
                    f"cannot reach the Kubernetes API at {self.host()} to {verb} {resource}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            raise

    def list_pods(
        self, api: Any, *, deadline: float | None = None, passthrough: frozenset[int] = frozenset()
    ) -> tuple[list[Pod], str]:
        """The selector's pods and the list's resourceVersion."""

        def call() -> tuple[list[Pod], str]:
            resp = api.list_namespaced_pod(
                self.namespace,
                label_selector=self.selector,
                _preload_content=False,
                _request_timeout=(5, self.request_timeout),
            )
            try:
                body = json.loads(resp.data)
            finally:
                resp.release_conn()
            return list(body.get("items") or []), str(
                (body.get("metadata") or {}).get("resourceVersion", "")
            )

        return self.read("list", "pods", call, deadline=deadline, passthrough=passthrough)

    # ------------------------------------------------------------------ fatal errors

    def set_fatal(self, error: DrillError) -> None:
        """A thread met an error the drill cannot go on with: the runner sees it next."""
        with self._lock:
            if self._fatal is None:
                self._fatal = error
        self.clock.wakeup()

    def raise_fatal(self) -> None:
        with self._lock:
            fatal = self._fatal
        if fatal is not None:
            raise fatal

    # ------------------------------------------------------------------ threads and streams

    def start_thread(self, target: Callable[[], None], name: str) -> None:
        """Start a background thread, unless cleanup has begun (it would never be joined)."""
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            if self.stop.is_set():
                return
            self._threads.append(thread)
        thread.start()

    @property
    def started(self) -> bool:
        """Whether the backend's threads were started."""
        with self._lock:
            return bool(self._threads)

    @contextlib.contextmanager
    def tracked(self, resp: Any) -> Iterator[None]:
        """Register a streamed response so that cleanup can cut it.

        Cleanup sets ``stop`` and then cuts the responses registered so far, under the
        lock. A response that arrives later (its request was in flight) is registered
        after that, so it must see ``stop`` here and cut itself: otherwise its thread
        blocks on a silent stream and cleanup waits out its join.
        """
        with self._lock:
            self._open_responses.add(resp)
            stopping = self.stop.is_set()
        if stopping:
            shutdown(resp)
        try:
            yield
        finally:
            with self._lock:
                self._open_responses.discard(resp)
            with contextlib.suppress(Exception):
                resp.close()
            with contextlib.suppress(Exception):
                resp.release_conn()

    def stop_threads(self) -> None:
        """Set ``stop``, cut every open stream, join every thread."""
        with self._lock:  # after this, no thread starts and no response goes unseen
            self.stop.set()
            responses = list(self._open_responses)
            threads = list(self._threads)
        for resp in responses:
            shutdown(resp)
        for thread in threads:
            thread.join(timeout=10)

    def close_clients(self) -> None:
        """Close every connection pool."""
        with self._lock:
            clients, self._clients = self._clients, []
        for api_client in clients:
            with contextlib.suppress(Exception):
                api_client.close()
