"""Fixtures for the Kubernetes backend: on the session's real cluster
(tests/kubernetes/kube_cluster.py), the PyTorchJob that the drill and RBAC modules share;
and, for the tests that need a server that misbehaves on cue, a fake API server on
loopback, a kubeconfig for it, a training job played by the helpers, and orchestrators
that are always cleaned up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.kubernetes.fake_cluster import NAMESPACE, FakeTrainingJob
from tests.kubernetes.kube_cluster import KubeCluster
from tests.kubernetes.kube_drills import TIMES, Drilled, drilled_job

pytest.importorskip("kubernetes")

from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator

pytestmark = pytest.mark.kubernetes


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=0.5) as server:
        yield server


@pytest.fixture
def kubeconfig(apiserver: FakeApiServer, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)


@pytest.fixture
def core_api(kubeconfig: Path) -> Iterator[Any]:
    """The real client, configured from the kubeconfig as a user's script would."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=configuration, persist_config=False
    )
    api_client = client.ApiClient(configuration)
    yield client.CoreV1Api(api_client)
    api_client.close()


@pytest.fixture
def make_job(apiserver: FakeApiServer) -> Iterator[Callable[..., FakeTrainingJob]]:
    jobs: list[FakeTrainingJob] = []

    def make(**kwargs: Any) -> FakeTrainingJob:
        job = FakeTrainingJob(apiserver, **kwargs)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.stop()


@pytest.fixture
def make_orchestrator(kubeconfig: Path) -> Iterator[Callable[..., KubernetesOrchestrator]]:
    made: list[KubernetesOrchestrator] = []

    def make(**kwargs: Any) -> KubernetesOrchestrator:
        kwargs.setdefault("kubeconfig", kubeconfig)
        kwargs.setdefault("watch_timeout_seconds", 5)
        kwargs.setdefault("request_timeout", 5.0)
        orchestrator = KubernetesOrchestrator(**kwargs)
        made.append(orchestrator)
        return orchestrator

    yield make
    for orchestrator in made:
        orchestrator.cleanup()


@pytest.fixture(scope="session")
def pytorchjob_drilled(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Drilled]:
    """One PyTorchJob on the real cluster for the session's drills and permission checks
    (its start costs 15-60 s of two busy cores); gone with its namespace afterwards."""
    with drilled_job(kube_cluster, tmp_path_factory.mktemp("k8s-drilled")) as drilled:
        yield drilled


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The wall time of each real-cluster drill this session ran."""
    if TIMES:
        terminalreporter.section("recoverygate: real-cluster drills (wall time)")
        for name, seconds in TIMES.items():
            terminalreporter.write_line(f"{seconds:7.1f} s  {name}")
