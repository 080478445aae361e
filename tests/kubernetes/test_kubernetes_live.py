"""``recovery: live`` on the real cluster: a real torchft job, one PyTorchJob per replica
group, drilled with one selector per group and held to the job's own records.

The job is examples/kubernetes/torchft-kube-cluster.yaml as a user applies it: a torchft
lighthouse (a Pod behind a headless Service) and replica groups 0 and 1, each a
PyTorchJob of one pod running examples/local/torchft/train_ft.py (torchft 0.2.0, gloo on
CPU), every process writing its heals and commits (``RECOVERYGATE_GROUND_TRUTH``). The
drill is examples/kubernetes/recovery-test-torchft.yaml, run through the CLI as the
ServiceAccount of rbac.yaml. We test these aspects:

- PASS: the target replica group's pod -- and only it -- is deleted by uid; the operator
  recreates it and its torchrun starts train_ft.py again, which heals from the survivor;
- the figures are the job's: the rejoin step is the step of the state the replacement
  applied (its own ``heal`` record), and the survivor committed steps, in order, between
  the kill and the replacement's first commit (it kept training);
- the replica groups' orchestrator is an Orchestrator (mypy and at run time).
"""

from __future__ import annotations

import json
import string
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.orchestrators.base import EventSource, Orchestrator, RealClock
from pytest_recoverygate.orchestrators.kubernetes import ReplicaGroupsOrchestrator
from tests.cli_drill import run_cli_drill
from tests.kubernetes.kube_cluster import KubeCluster, eventually
from tests.kubernetes.kube_drills import TIMES, grant, killed_uids
from tests.kubernetes.kube_jobs import EXAMPLES, host_folders
from tests.patience import CLUSTER, within

pytestmark = [pytest.mark.kubernetes, pytest.mark.e2e, pytest.mark.kube_cluster]


@dataclass
class LiveJob:
    cluster: KubeCluster
    namespace: str
    truth: Path  # host folder of the records (<base>.<replica>.<pid>.jsonl)
    kubeconfig: Path

    def records(self, replica: int) -> list[dict[str, Any]]:
        rows = []
        for path in self.truth.glob(f"gt.{replica}.*.jsonl"):
            rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return sorted(rows, key=lambda r: float(r["t"]))

    def pod(self, replica: int) -> dict[str, Any]:
        [pod] = [
            p
            for p in self.cluster.pods(
                self.namespace, f"training.kubeflow.org/job-name=ft-replica-{replica}"
            )
            if not p["metadata"].get("deletionTimestamp")
        ]
        return pod


def manifests(truth: Path) -> list[dict[str, Any]]:
    """The example's documents, filled, each replica writing its records to ``truth``."""
    text = string.Template((EXAMPLES / "torchft-kube-cluster.yaml").read_text())
    documents = [d for d in yaml.safe_load_all(text.safe_substitute(host_folders(truth))) if d]
    for document in documents:
        if document["kind"] != "PyTorchJob":
            continue
        spec = document["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        spec["volumes"].append({"name": "truth", "hostPath": {"path": str(truth)}})
        [container] = spec["containers"]
        container["volumeMounts"].append({"name": "truth", "mountPath": "/truth"})
        container["env"].append({"name": "RECOVERYGATE_GROUND_TRUTH", "value": "/truth/gt"})
    return documents


@pytest.fixture(scope="module")
def live_job(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveJob]:
    folder = tmp_path_factory.mktemp("k8s-live")
    truth = folder / "truth"
    truth.mkdir()
    with kube_cluster.namespace("live") as namespace:
        kubeconfig = grant(kube_cluster, namespace, folder)
        started = time.monotonic()
        kube_cluster.apply(namespace, *manifests(truth))
        job = LiveJob(kube_cluster, namespace, truth, kubeconfig)

        def both_committing() -> bool | None:  # the quorum of both replica groups trains
            done = all(any(r["event"] == "commit" for r in job.records(i)) for i in (0, 1))
            return True if done else None

        eventually(both_committing, "commits of both replica groups")
        TIMES["torchft start"] = time.monotonic() - started
        yield job


def test_the_replica_groups_orchestrator_is_an_orchestrator(live_job: LiveJob) -> None:
    orchestrator = ReplicaGroupsOrchestrator(
        {0: "job=a", 1: "job=b"},
        target_replica=1,
        kubeconfig=live_job.kubeconfig,
        clock=RealClock(),
    )
    try:
        conforming: Orchestrator = orchestrator  # the static check (mypy)
        assert isinstance(conforming, Orchestrator)
        assert isinstance(conforming.events(), EventSource)
        assert list(orchestrator.groups) == [1, 0]  # the target's workers come first
    finally:
        orchestrator.cleanup()


def test_the_target_replica_s_pod_is_killed_and_heals_from_the_survivor(
    live_job: LiveJob, tmp_path: Path
) -> None:
    job = live_job
    target, survivor = job.pod(1)["metadata"], job.pod(0)["metadata"]
    config = yaml.safe_load((EXAMPLES / "recovery-test-torchft.yaml").read_text())
    config["workload"].update(namespace=job.namespace, kubeconfig=str(job.kubeconfig))
    config["safety"]["requireConfirm"] = False
    run = run_cli_drill(config, tmp_path / "recovery-test-torchft.yaml", timeout=within(CLUSTER))
    TIMES["torchft live"] = run.wall
    report = run.report
    assert run.code == 0, run.output
    assert report["verdict"] == "PASS", report["summary"]
    assert report["recoveryMode"] == "live"
    assert report["target"]["instanceId"] == target["uid"]
    assert killed_uids(report) == [target["uid"]]
    assert job.pod(0)["metadata"]["uid"] == survivor["uid"], "the survivor was never touched"
    assert report["rejoinSource"] == "peer"
    assert report["survivorsKeptTraining"] is True
    kill = float(report["killTime"])
    # The replacement's own record of the heal: the state of the step the drill names.
    heals = [r for r in job.records(1) if r["event"] == "heal" and float(r["t"]) > kill]
    assert heals and heals[0]["step"] == report["rejoinStep"], (heals, report["rejoinStep"])
    # The replacement's first commit follows its heal. (Not any commit of replica 1 after
    # the kill: the killed container runs on until the kubelet's SIGKILL, and its record
    # of a commit follows the commit's line. In CI the target's line of step 35 came
    # 0.3 ms before the kill's time, no survivor commit fell before the replica's next
    # record, and the test said the survivor committed nothing while the drill saw it
    # train from 34 to 176.)
    healed_at = float(heals[0]["t"])
    first_commit = min(
        float(r["t"])
        for r in job.records(1)
        if r["event"] == "commit" and float(r["t"]) >= healed_at
    )
    survivor_commits = [
        r["step"]
        for r in job.records(0)
        if r["event"] == "commit" and kill < float(r["t"]) < first_commit
    ]
    assert survivor_commits, "the survivor committed nothing while replica 1 was out"
    assert survivor_commits == sorted(set(survivor_commits)), survivor_commits
