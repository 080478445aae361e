"""A node fault on Kubernetes takes the discovered job's pods and never another job's.

Issue 30, finding 4: KillNode / DrainNode re-list the node's pods by the selector before
acting, so a pod of another job that also matches it (a broad selector, a job started
after discovery) used to be deleted or evicted with the drill's. Over real HTTP with the
real client, against the fake API server (its request log is what shows that not one
request changed anything; the real server keeps no log of the requests it got), we test
these aspects:
- a pod of another PyTorchJob matching the selector lands on the target node after
  discovery: KillNode and DrainNode (and their dry runs) are refused with an error naming
  that pod, and not one request changes anything;
- the same for a job without Kubeflow labels (pods owned by a controller): a pod of
  another controller that matches the selector on the node is refused too;
- another job's pod on the *other* node does not stop KillNode, and is not touched;
- a log line of several MiB from the job: the log stream holds at most MAX_LINE_BYTES of
  it, the kept log says where it was cut, and the events printed after it still arrive.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes")

from pytest_recoverygate.engine.model import Fault, KillOutcome
from pytest_recoverygate.errors import BackendError
from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator
from pytest_recoverygate.shared.textbounds import MAX_LINE_BYTES
from tests.kubernetes.fake_apiserver import RBAC_DRILL_RULES, RBAC_NODE_RULES, FakeApiServer
from tests.kubernetes.fake_cluster import NAMESPACE, FakeTrainingJob, pytorchjob_pod
from tests.patience import PROCESS, deadline, eventually
from tests.reliability.conftest import Figures

pytestmark = pytest.mark.kubernetes

HOSTS = ["node-a", "node-b"]


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=0.5) as api:
        api.allowed = RBAC_DRILL_RULES | RBAC_NODE_RULES
        for host in HOSTS:
            api.add_node(host)
        yield api


@pytest.fixture
def kubeconfig(server: FakeApiServer, tmp_path: Path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)


@pytest.fixture
def job(server: FakeApiServer) -> Iterator[FakeTrainingJob]:
    job = FakeTrainingJob(server, nodes=4, hosts=HOSTS).start(wait_for_checkpoint=10)
    yield job
    job.stop()


@pytest.fixture
def orchestrators(kubeconfig: Path) -> Iterator[list[KubernetesOrchestrator]]:
    made: list[KubernetesOrchestrator] = []
    yield made
    for orchestrator in made:
        orchestrator.cleanup()


def make(made: list[KubernetesOrchestrator], kubeconfig: Path, **kwargs: Any) -> Any:
    orchestrator = KubernetesOrchestrator(
        kubeconfig=kubeconfig, watch_timeout_seconds=5, request_timeout=5.0, **kwargs
    )
    made.append(orchestrator)
    return orchestrator


def foreign_pod(server: FakeApiServer, node: str, *, labels: dict[str, str]) -> dict[str, Any]:
    """Another job's pod that also matches ``training-run=llama``, running on ``node``."""
    pod = pytorchjob_pod("other", "worker", 0)
    pod["metadata"]["labels"] = labels
    pod["spec"]["nodeName"] = node
    created = server.create_pod(pod)
    server.start_container(NAMESPACE, created["metadata"]["name"])
    return created


def changed(server: FakeApiServer) -> list[tuple[str, str, str]]:
    return [(r.verb, r.resource, r.name) for r in server.requests if r.acted]


@pytest.mark.parametrize("fault", ["KillNode", "DrainNode"])
def test_another_jobs_pod_on_the_node_refuses_the_node_fault(
    server: FakeApiServer,
    kubeconfig: Path,
    job: FakeTrainingJob,
    orchestrators: list[KubernetesOrchestrator],
    fault: str,
    figures: Figures,
) -> None:
    orchestrator = make(orchestrators, kubeconfig, selector=job.selector, fault=fault)
    target = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert target is not None and target.node == "node-b"
    intruder = foreign_pod(
        server,
        "node-b",
        labels={
            "training.kubeflow.org/job-name": "other",
            "training.kubeflow.org/replica-type": "worker",
            "training.kubeflow.org/replica-index": "0",
            "training-run": job.name,
        },
    )
    name = intruder["metadata"]["name"]
    for dry_run in (True, False):
        with pytest.raises(BackendError) as refused:
            orchestrator.kill(target, dry_run=dry_run, fault=Fault(fault))
        message = str(refused.value)
        assert f"refusing {fault} on node node-b" in message
        assert name in message and "PyTorchJob/other" in message
        assert "Nothing was touched" in message
        figures.add("hostile_k8s_refusals")
    assert changed(server) == []
    assert server.get_pod(NAMESPACE, name) is not None


def test_a_pod_of_another_controller_is_refused_for_an_unlabelled_job(
    server: FakeApiServer,
    kubeconfig: Path,
    orchestrators: list[KubernetesOrchestrator],
) -> None:
    def owned(name: str, rank: int, node: str, owner: str) -> str:
        pod = {
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "labels": {"app": "trainer", "rank": str(rank)},
                "ownerReferences": [
                    {
                        "kind": "StatefulSet",
                        "name": owner,
                        "uid": f"uid-{owner}",
                        "controller": True,
                    }
                ],
            },
            "spec": {"containers": [{"name": "main", "image": "x"}], "nodeName": node},
        }
        created = server.create_pod(pod)
        server.start_container(NAMESPACE, name)
        return str(created["metadata"]["uid"])

    owned("train-0", 0, "node-a", "train")
    owned("train-1", 1, "node-b", "train")
    orchestrator = make(orchestrators, kubeconfig, selector="app=trainer", fault="KillNode")
    target = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert target is not None
    owned("eval-0", 0, "node-b", "eval")  # another StatefulSet, same labels
    with pytest.raises(BackendError, match=r"refusing KillNode on node node-b.*eval-0"):
        orchestrator.kill(target, dry_run=False, fault=Fault("KillNode"))
    assert changed(server) == []


def test_another_jobs_pod_on_the_other_node_is_left_alone(
    server: FakeApiServer,
    kubeconfig: Path,
    job: FakeTrainingJob,
    orchestrators: list[KubernetesOrchestrator],
) -> None:
    orchestrator = make(orchestrators, kubeconfig, selector=job.selector, fault="KillNode")
    workload = orchestrator.discover(deadline(PROCESS))
    target = workload.by_rank(1)
    assert target is not None
    on_b = {w.instance_id for w in workload.workers if w.node == "node-b"}
    intruder = foreign_pod(
        server,
        "node-a",
        labels={"training.kubeflow.org/job-name": "other", "training-run": job.name},
    )
    result = orchestrator.kill(target, dry_run=False, fault=Fault("KillNode"))
    assert result.outcome is KillOutcome.KILLED, result.detail
    reached = {r.target_uid for r in server.deletes(acted_only=True)}
    assert reached == on_b
    assert intruder["metadata"]["uid"] not in reached


def test_a_giant_log_line_is_cut_and_the_events_after_it_still_arrive(
    server: FakeApiServer,
    kubeconfig: Path,
    job: FakeTrainingJob,
    orchestrators: list[KubernetesOrchestrator],
) -> None:
    orchestrator = make(orchestrators, kubeconfig, selector=job.selector)
    orchestrator.discover(deadline(PROCESS))
    eventually(orchestrator.events().poll, "an event (the stream is open and reading)")
    giant = 3 * MAX_LINE_BYTES + 12345
    assert server.append_log(NAMESPACE, job.pod_name(0), "x" * giant)
    written = len(job.written)
    eventually(
        lambda: [e for e in orchestrator.events().poll() if e.step and e.step > 0],
        "an event after the giant line",
    )
    assert len(job.written) > written  # the job went on printing, and the drill reads it
    output = orchestrator.job_output()
    assert f"1 line(s) longer than {MAX_LINE_BYTES} bytes were cut" in output.note
    [pod_log] = output.workers
    assert f"longer than {MAX_LINE_BYTES} bytes" in pod_log.text
    assert "x" * giant not in pod_log.text
    assert len(pod_log.text) < 2 * MAX_LINE_BYTES  # the kept log's own limit holds
