"""Cleanup of the Kubernetes adapter when it races a request that is still in flight.

We test this aspect: cleanup() promptly stops the watch and log threads even when one
of them is between sending its request and registering the response (the server is
slow to answer), and the stream then stays silent (a hung job prints nothing; a real
apiserver sends a watch bookmark about once a minute). Found by the fault-injection
suite: cleanup set the stop flag and shut down the responses it knew of, but a response
registered just after that was never shut down, so its thread blocked on it and cleanup
waited out its 10 s join. The adapter now cuts a response that arrives after the stop.

On the fake API server: the real one cannot be made to hold one chosen request (the watch
or the log request) unanswered for seconds on cue, and keeps no log of the requests it got,
which is how the test knows both were sent before cleanup.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator
from tests.kubernetes.fake_apiserver import FakeApiServer, Fault, RequestInfo
from tests.patience import PROMPT, deadline, eventually, within
from tests.reliability.kube_faults import InstantController

pytestmark = pytest.mark.kubernetes

SLOW_ANSWER = 0.5  # the server answers the watch or log request this late


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=3600) as api:  # no bookmark rescues a stuck watch
        yield api


@pytest.mark.parametrize("slow", ["watch", "pods/log"])
def test_cleanup_stops_the_threads_even_mid_request(
    server: FakeApiServer, tmp_path: Path, slow: str
) -> None:
    controller = InstantController(server, "ns", "pytorchjob", "job")
    for rank in range(2):
        controller.create(rank)

    def hook(info: RequestInfo) -> Fault | None:
        is_slow = info.verb == "watch" if slow == "watch" else info.resource == "pods/log"
        return Fault(delay=SLOW_ANSWER) if is_slow else None

    server.fault_hook = hook
    orchestrator = KubernetesOrchestrator(
        selector="training-run=job",
        namespace="ns",
        kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig"),
        watch_timeout_seconds=3600,
    )
    orchestrator.discover(deadline(PROMPT))

    def both_sent() -> bool:  # the server's own log: the watch and the log request came
        kinds = {(r.verb, r.resource) for r in server.requests}
        return ("watch", "pods") in kinds and ("get", "pods/log") in kinds

    eventually(both_sent, "the watch and the log request", PROMPT)
    started = time.monotonic()
    orchestrator.cleanup()
    took = time.monotonic() - started
    left = [t.name for t in threading.enumerate() if t.name.startswith("recoverygate-k8s")]
    assert left == [], f"cleanup returned after {took:.1f}s leaving {left} running"
    assert took < within(PROMPT)  # not the watch's 3600 s
