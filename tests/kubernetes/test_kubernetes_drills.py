"""Whole drills against the real cluster (scripts/kube-cluster): one PyTorchJob, drilled as
a user would drill it, each drill held to the job's own records.

The job is examples/kubernetes/pytorchjob-kube-cluster.yaml (2 workers, elastic c10d
rendezvous, ``restartPolicy: OnFailure``) training examples/local/train.py on torch, with
``--save-on-sigterm`` and ground truth on (tests/kubernetes/kube_jobs.py). The real
training operator recreates a deleted pod, the real kubelets restart the survivor's
container; nothing is played. Every drill runs through the CLI (``recoverygate run``) as
the ServiceAccount of examples/kubernetes/rbac.yaml (a bound token in a kubeconfig),
with rbac-nodes.yaml added for the node faults only: exactly the rights the docs name.

One job serves the module's drills one after the other (a job's start costs 20-60 s of
two busy cores; a drill on a job that was drilled before is what users do too). We test
these aspects, in this order:

- a dry run: DRY_RUN, the pods keep their uids, no process of the job restarted;
- KillWorker with ``count: 2``: PASS; the first DELETE reached the discovered pod of rank
  1, the second its replacement (a new uid, the same name: the operator's), and each
  recovery's resume step and lost steps agree with the ground truth;
- Preempt (a graceful delete; the job saves on SIGTERM): PASS ``savedOnPreempt``, resumed
  from the step the job itself recorded saving as it exited, 0 lost steps;
- DrainNode with a PodDisruptionBudget in place (minAvailable 1: evicting one pod of two
  is allowed): PASS, the node's pods evicted through the eviction API, none deleted;
- a PodDisruptionBudget that allows no disruption: ERROR naming it, nothing evicted;
- KillNode with ``cordon: true``: PASS, the node's pods deleted and replaced on the
  other node, and the node uncordoned when the drill ends.

The permission errors (each verb of rbac.yaml and rbac-nodes.yaml taken away) are in
test_kubernetes_rbac.py, the TrainJob and ``evidence.podLogs`` drills in
test_kubernetes_jobs.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.kubernetes.kube_cluster import eventually
from tests.kubernetes.kube_drills import Drilled, assert_matches_truth, killed_uids, run
from tests.kubernetes.kube_jobs import KubeJob

pytestmark = [pytest.mark.kubernetes, pytest.mark.e2e, pytest.mark.kube_cluster]


@pytest.fixture
def drilled(pytorchjob_drilled: Drilled) -> Drilled:
    """The session's PyTorchJob (tests/kubernetes/conftest.py), drilled in file order."""
    return pytorchjob_drilled


def uids(job: KubeJob) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in job.pods()}


def test_a_dry_run_deletes_nothing(drilled: Drilled, tmp_path: Path) -> None:
    job = drilled.job
    before, processes = uids(job), len(job.processes())
    result = run(drilled, tmp_path, "dry-run", drilled.pods_only, dry_run=True)
    assert result.report["verdict"] == "DRY-RUN", result.output
    assert result.code == 0, result.output
    time.sleep(2)  # not a wait: a kill would show by now (the pod gone, a process restarting)
    assert uids(job) == before
    assert len(job.processes()) == processes, job.describe()


def test_killworker_twice_passes_and_each_recovery_matches_the_job_s_records(
    drilled: Drilled, tmp_path: Path
) -> None:
    job = drilled.job
    victim = job.pod_of_rank(1)["metadata"]
    result = run(drilled, tmp_path, "killworker-count-2", drilled.pods_only, failure={"count": 2})
    report = result.report
    assert report["verdict"] == "PASS", result.output
    assert [r["verdict"] for r in report["recoveries"]] == ["PASS", "PASS"]
    killed = killed_uids(report)
    # The discovered pod, then its replacement: a new uid (the operator's, same name).
    assert len(killed) == 2 and killed[0] == victim["uid"] != killed[1], killed
    first, second = report["recoveries"]
    now = job.pod_of_rank(1)["metadata"]
    # The operator recreated rank 1's pod under the same name twice: a third uid now.
    assert now["name"] == victim["name"] and now["uid"] != victim["uid"]
    assert second["triggerCheckpoint"] > (first["resumeStep"] or 0)
    assert_matches_truth(job, result)


def test_a_preempted_job_saves_on_sigterm_and_resumes_from_that_save(
    drilled: Drilled, tmp_path: Path
) -> None:
    job = drilled.job
    result = run(
        drilled,
        tmp_path,
        "preempt",
        drilled.pods_only,
        fault="Preempt",
        failure={"gracePeriod": "5s"},
        expect={"savedOnPreempt": True},
    )
    report = result.report
    assert report["verdict"] == "PASS", result.output
    [recovery] = report["recoveries"]
    kill = float(recovery["killTime"])
    # The job's own record of the save it made on SIGTERM (rank 0 saves for the group).
    exits = [p.exit for p in job.processes(rank=0) if p.exit is not None and p.exit.t > kill]
    assert exits, job.describe()
    saved = exits[0].step
    assert recovery["faultDetails"]["savedStep"] == saved, recovery
    assert recovery["resumeStep"] == saved
    assert recovery["lostSteps"] == 0
    assert_matches_truth(job, result)


def pdb(namespace: str, name: str, selector: str, **spec: Any) -> dict[str, Any]:
    key, _, value = selector.partition("=")
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": {key: value}}, **spec},
    }


def node_pods(job: KubeJob, node: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in job.pods()
        if p["spec"].get("nodeName") == node and not p["metadata"].get("deletionTimestamp")
    }


def test_a_pod_disruption_budget_that_allows_nothing_stops_the_drain(
    drilled: Drilled, tmp_path: Path
) -> None:
    job, cluster = drilled.job, drilled.cluster
    cluster.apply(job.namespace, pdb(job.namespace, "llama-strict", job.selector, maxUnavailable=0))

    def counted() -> bool | None:  # the disruption controller has counted the pods
        budget = cluster.get(job.namespace, "pdb", "llama-strict")
        return True if budget.get("status", {}).get("expectedPods") == 2 else None

    eventually(counted, "PodDisruptionBudget llama-strict's status")
    before = uids(job)
    try:
        result = run(drilled, tmp_path, "drain-blocked", drilled.with_nodes, fault="DrainNode")
    finally:
        cluster.kubectl("delete", "-n", job.namespace, "pdb", "llama-strict")
    assert result.report["verdict"] == "ERROR", result.output
    assert result.code == 3
    assert "PodDisruptionBudget llama-strict" in result.report["summary"], result.report["summary"]
    assert "Traceback" not in result.output
    assert uids(job) == before


def test_drainnode_evicts_the_node_s_pods_past_a_budget_and_passes(
    drilled: Drilled, tmp_path: Path
) -> None:
    job, cluster = drilled.job, drilled.cluster
    cluster.apply(job.namespace, pdb(job.namespace, "llama-pdb", job.selector, minAvailable=1))
    node = job.pod_of_rank(1)["spec"]["nodeName"]
    on_node = node_pods(job, node)
    result = run(
        drilled,
        tmp_path,
        "drainnode",
        drilled.with_nodes,
        fault="DrainNode",
    )
    cluster.kubectl("delete", "-n", job.namespace, "pdb", "llama-pdb")
    report = result.report
    assert report["verdict"] == "PASS", result.output
    [kill] = [e["detail"] for e in report["timeline"] if e.get("kind") == "kill"]
    assert f"evicted {len(on_node)} pod(s) of the job on node {node}" in kill, kill
    assert all(name in kill for name in on_node), (kill, on_node)
    for name, uid in on_node.items():  # each pod of the node was replaced
        assert uids(job).get(name) != uid, name
    assert_matches_truth(job, result)


def test_killnode_with_cordon_moves_the_pods_and_uncordons_the_node(
    drilled: Drilled, tmp_path: Path
) -> None:
    job, cluster = drilled.job, drilled.cluster
    node = job.pod_of_rank(1)["spec"]["nodeName"]
    on_node = node_pods(job, node)
    result = run(
        drilled,
        tmp_path,
        "killnode-cordon",
        drilled.with_nodes,
        fault="KillNode",
        failure={"cordon": True},
    )
    report = result.report
    assert report["verdict"] == "PASS", result.output
    [kill] = [e["detail"] for e in report["timeline"] if e.get("kind") == "kill"]
    assert kill.startswith(f"cordoned node {node} (uncordoned at cleanup); deleted "), kill
    assert f"deleted {len(on_node)} pod(s) of the job on node {node}" in kill, kill
    for name, uid in on_node.items():
        assert uids(job).get(name) != uid, name
    # The replacements could not land on the cordoned node; it is schedulable again now.
    replaced = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in job.pods()}
    assert all(replaced[name] != node for name in on_node), replaced
    assert not cluster.get("default", "node", node)["spec"].get("unschedulable"), node
    assert_matches_truth(job, result)
