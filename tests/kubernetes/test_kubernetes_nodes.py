"""Node faults on Kubernetes, against the fake API server with cluster nodes, over real
HTTP with the real client.

We test these aspects, on a PyTorchJob of four pods on two nodes (ranks 0 and 2 on
node-a, ranks 1 and 3 on node-b):
- the fake cluster: pods bound to nodes; nodes get/patch, Eviction (201, dry run, 429 from
  a PodDisruptionBudget naming it) and 403s at the cluster scope, as the apiserver does;
- KillNode: one DELETE per pod of the job on the node, grace 0, each with its uid
  precondition; not one request acts on a pod of the other node; the replacements come
  back on the same node; a dry run deletes nothing;
- ``cordon``: the node is cordoned before the deletes, the replacements land on the other
  node, and cleanup uncordons it (a node already cordoned is left as it was);
- DrainNode: one policy/v1 Eviction per pod of the job on the node; a blocking
  PodDisruptionBudget is an error naming it with nothing evicted or deleted;
- whole drills through the config: KillNode with cordon (shared PASS, hostPath FAIL),
  DrainNode PASS; a PodDisruptionBudget, or cordon / DrainNode without the rights, is an
  ERROR naming why, with nothing touched;
- rights: the default RBAC is pods-only, so cordon and DrainNode without the opt-in
  rights (examples/kubernetes/rbac-nodes.yaml) are refused at discovery, before anything
  is touched; PartitionNode is refused with the reason;
- storage: with checkpoints on the node's hostPath, a KillNode with cordon moves the
  reporting rank to a node without them and the job restarts from scratch; on shared
  storage the same fault resumes from the latest checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.machine import DrillResult, FailureReason, Verdict
from pytest_recoverygate.engine.model import Fault, GroupEventKind, KillOutcome
from pytest_recoverygate.errors import BackendError, PermissionDeniedError, UsageError
from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.kubernetes.fake_apiserver import RBAC_DRILL_RULES, RBAC_NODE_RULES, FakeApiServer
from tests.kubernetes.fake_cluster import NAMESPACE, FakeTrainingJob, job_drill_yaml
from tests.patience import PROCESS, PROMPT, deadline, eventually, gather

pytestmark = pytest.mark.kubernetes

MakeJob = Callable[..., FakeTrainingJob]
MakeOrchestrator = Callable[..., KubernetesOrchestrator]
HOSTS = ["node-a", "node-b"]


@pytest.fixture
def two_nodes(apiserver: FakeApiServer) -> FakeApiServer:
    for host in HOSTS:
        apiserver.add_node(host)
    return apiserver


def start_job(make_job: MakeJob, **kwargs: object) -> FakeTrainingJob:
    return make_job(nodes=4, hosts=HOSTS, **kwargs).start(wait_for_checkpoint=20)


def acted_on(server: FakeApiServer) -> list[tuple[str, str, str]]:
    """(verb, resource, name) of every request that changed something."""
    return [(r.verb, r.resource, r.name) for r in server.requests if r.acted]


def test_pods_are_bound_to_nodes(
    two_nodes: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = start_job(make_job)
    workload = make_orchestrator(selector=job.selector).discover(deadline(PROCESS))
    assert [(w.rank, w.node) for w in workload.workers] == [
        (0, "node-a"),
        (1, "node-b"),
        (2, "node-a"),
        (3, "node-b"),
    ]


def test_the_fake_answers_nodes_and_evictions_like_the_apiserver(
    two_nodes: FakeApiServer, make_job: MakeJob, core_api: object
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api: client.CoreV1Api = core_api  # type: ignore[assignment]
    api.patch_node("node-a", {"spec": {"unschedulable": True}}, dry_run="All")
    assert not two_nodes.unschedulable("node-a")
    api.patch_node("node-a", {"spec": {"unschedulable": True}})
    assert two_nodes.unschedulable("node-a")
    api.patch_node("node-a", {"spec": {"unschedulable": None}})
    assert not two_nodes.unschedulable("node-a")

    job = start_job(make_job)
    name = job.pod_name(1)
    two_nodes.add_pdb(NAMESPACE, "llama-pdb", {"training-run": "llama"}, 0)
    with pytest.raises(ApiException) as caught:
        api.create_namespaced_pod_eviction(
            name, NAMESPACE, client.V1Eviction(metadata=client.V1ObjectMeta(name=name))
        )
    assert caught.value.status == 429
    causes = json.loads(caught.value.body or "{}")["details"]["causes"]
    assert causes[0]["reason"] == "DisruptionBudget"
    assert causes[0]["message"].startswith("The disruption budget llama-pdb needs")
    assert two_nodes.get_pod(NAMESPACE, name) is not None

    two_nodes.allowed = RBAC_DRILL_RULES
    with pytest.raises(ApiException) as forbidden:
        api.patch_node("node-a", {"spec": {"unschedulable": True}})
    assert forbidden.value.status == 403
    message = json.loads(forbidden.value.body or "{}")["message"]
    assert 'cannot patch resource "nodes" in API group "" at the cluster scope' in message


def test_killnode_deletes_every_pod_of_the_node_and_none_of_the_other(
    two_nodes: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = start_job(make_job)
    orchestrator = make_orchestrator(selector=job.selector, fault="KillNode")
    workload = orchestrator.discover(deadline(PROCESS))
    target = workload.by_rank(1)
    assert target is not None
    on_b = {w.name: w.instance_id for w in workload.workers if w.node == "node-b"}
    on_a = {w.name for w in workload.workers if w.node == "node-a"}

    dry = orchestrator.kill(target, dry_run=True, fault=Fault("KillNode"))
    assert dry.outcome is KillOutcome.DRY_RUN, dry.detail
    assert acted_on(two_nodes) == []

    result = orchestrator.kill(target, dry_run=False, fault=Fault("KillNode"))
    assert result.outcome is KillOutcome.KILLED, result.detail
    acted = two_nodes.deletes(acted_only=True)
    assert {(r.name, r.precondition_uid, r.grace_period) for r in acted} == {
        (name, uid, 0) for name, uid in on_b.items()
    }
    assert not {r.name for r in two_nodes.requests if r.acted} & on_a
    assert {v for v, _, _ in acted_on(two_nodes)} == {"delete"}
    eventually(lambda: len(job.replaced) == 2, "two replacements", PROMPT)
    assert sorted(job.node_of_rank[rank] for rank, _ in job.replaced) == ["node-b", "node-b"]
    again = orchestrator.kill(target, dry_run=False, fault=Fault("KillNode"))
    assert again.outcome is KillOutcome.ALREADY_GONE, again.detail


def test_cordon_moves_the_replacements_and_cleanup_uncordons(
    two_nodes: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    two_nodes.allowed = RBAC_DRILL_RULES | RBAC_NODE_RULES
    job = start_job(make_job)
    orchestrator = make_orchestrator(selector=job.selector, fault="KillNode", cordon=True)
    target = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert target is not None
    assert acted_on(two_nodes) == [], "the rights check is a read and a dry run"
    result = orchestrator.kill(target, dry_run=False, fault=Fault("KillNode"))
    assert result.outcome is KillOutcome.KILLED, result.detail
    assert "cordoned node node-b" in result.detail
    assert acted_on(two_nodes)[0] == ("patch", "nodes", "node-b"), "cordoned first"
    assert two_nodes.unschedulable("node-b")
    eventually(lambda: len(job.replaced) == 2, "two replacements", PROMPT)
    assert [job.node_of_rank[rank] for rank, _ in job.replaced] == ["node-a", "node-a"]
    orchestrator.cleanup()
    assert not two_nodes.unschedulable("node-b")
    assert orchestrator.uncordoned == ["node-b"]
    assert two_nodes.requests_outside(RBAC_DRILL_RULES | RBAC_NODE_RULES) == []


def test_a_node_cordoned_before_the_drill_stays_cordoned(
    two_nodes: FakeApiServer,
    make_job: MakeJob,
    make_orchestrator: MakeOrchestrator,
    core_api: object,
) -> None:
    job = start_job(make_job)
    orchestrator = make_orchestrator(selector=job.selector, fault="KillNode", cordon=True)
    target = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert target is not None
    # An operator cordons node-b (kubectl cordon) before the kill.
    core_api.patch_node("node-b", {"spec": {"unschedulable": True}})  # type: ignore[attr-defined]
    result = orchestrator.kill(target, dry_run=False, fault=Fault("KillNode"))
    assert "was already cordoned" in result.detail, result.detail
    orchestrator.cleanup()
    assert two_nodes.unschedulable("node-b")
    assert orchestrator.uncordoned == []


def test_drainnode_evicts_every_pod_of_the_node(
    two_nodes: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    two_nodes.allowed = RBAC_DRILL_RULES | RBAC_NODE_RULES
    job = start_job(make_job)
    orchestrator = make_orchestrator(selector=job.selector, fault="DrainNode")
    workload = orchestrator.discover(deadline(PROCESS))
    target = workload.by_rank(1)
    assert target is not None
    result = orchestrator.kill(target, dry_run=False, fault=Fault("DrainNode"))
    assert result.outcome is KillOutcome.KILLED, result.detail
    real = [r for r in two_nodes.evictions() if not r.dry_run]
    assert sorted(r.name for r in real) == sorted(
        w.name for w in workload.workers if w.node == "node-b"
    )
    assert all(r.status == 201 for r in real)
    assert {(v, res) for v, res, _ in acted_on(two_nodes)} == {("create", "pods/eviction")}
    assert all(r.precondition_uid for r in real)
    gone = GroupEventKind.WORKER_GONE
    gather(orchestrator.watch_group, lambda seen: gone in {e.kind for e in seen}, "worker gone")


def test_a_pod_disruption_budget_blocks_the_drain_with_nothing_touched(
    two_nodes: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = start_job(make_job)
    orchestrator = make_orchestrator(selector=job.selector, fault="DrainNode")
    target = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert target is not None
    two_nodes.add_pdb(NAMESPACE, "llama-pdb", {"training-run": "llama"}, 0)
    with pytest.raises(BackendError, match="eviction blocked by PodDisruptionBudget llama-pdb"):
        orchestrator.kill(target, dry_run=False, fault=Fault("DrainNode"))
    assert acted_on(two_nodes) == []
    assert len(job.replaced) == 0


@pytest.mark.parametrize(
    ("fault", "cordon", "missing"),
    [("KillNode", True, "nodes get"), ("DrainNode", False, "pods/eviction create")],
)
def test_node_rights_are_checked_before_anything_is_touched(
    two_nodes: FakeApiServer,
    make_job: MakeJob,
    make_orchestrator: MakeOrchestrator,
    fault: str,
    cordon: bool,
    missing: str,
) -> None:
    two_nodes.allowed = RBAC_DRILL_RULES  # examples/kubernetes/rbac.yaml: pods only
    job = start_job(make_job)
    orchestrator = make_orchestrator(selector=job.selector, fault=fault, cordon=cordon)
    with pytest.raises(PermissionDeniedError) as caught:
        orchestrator.discover(deadline(PROCESS))
    assert f"needs {missing}" in str(caught.value)
    assert "examples/kubernetes/rbac-nodes.yaml" in str(caught.value)
    assert acted_on(two_nodes) == []


def test_partition_node_is_refused_with_the_reason(make_orchestrator: MakeOrchestrator) -> None:
    with pytest.raises(UsageError, match="no operation that cuts a node's network"):
        make_orchestrator(selector="a=b", fault="PartitionNode")


@pytest.mark.parametrize(("storage", "resumed"), [("shared", "latest"), ("hostPath", "zero")])
def test_checkpoints_on_the_node_are_lost_when_the_pods_move(
    two_nodes: FakeApiServer,
    make_job: MakeJob,
    make_orchestrator: MakeOrchestrator,
    tmp_path: Path,
    storage: str,
    resumed: str,
) -> None:
    two_nodes.allowed = RBAC_DRILL_RULES | RBAC_NODE_RULES
    job = start_job(make_job, storage=storage, local_root=tmp_path / "nodes", step_time=0.02)
    orchestrator = make_orchestrator(selector=job.selector, fault="KillNode", cordon=True)
    target = orchestrator.discover(deadline(PROCESS)).by_rank(0)  # the reporting rank, on node-a
    assert target is not None and target.node == "node-a"
    saved = job.last_checkpoint
    assert saved >= 20
    incarnations = len(job.incarnations)
    result = orchestrator.kill(target, dry_run=False, fault=Fault("KillNode"))
    assert result.outcome is KillOutcome.KILLED, result.detail
    eventually(
        lambda: len(job.incarnations) > incarnations and job.step > 0, "a new incarnation", PROMPT
    )
    assert job.node_of_rank[0] == "node-b"
    resumed_from = _first_progress(job) - 1
    if resumed == "latest":
        assert resumed_from >= saved
    else:
        assert resumed_from == 0
        assert (tmp_path / "nodes" / "node-a" / "ckpt").is_dir(), "left on the old node"


def _first_progress(job: FakeTrainingJob) -> int:
    """The first step the newest incarnation reported."""
    inc = job.incarnations[-1]
    for _, line in job.written:
        if inc in line and '"progress"' in line:
            return int(json.loads(line.split("RECOVERYGATE/v1 ", 1)[1])["step"])
    raise AssertionError(f"no progress of incarnation {inc} yet")


def test_the_opt_in_rbac_manifest_grants_exactly_the_node_rules() -> None:
    import yaml

    path = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "rbac-nodes.yaml"
    granted: dict[str, set[tuple[str, str]]] = {}
    for doc in yaml.safe_load_all(path.read_text()):
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                assert rule["apiGroups"] == [""]
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.setdefault(doc["kind"], set()).add((verb, resource))
    assert granted["ClusterRole"] == {("get", "nodes"), ("patch", "nodes")}
    assert granted["Role"] == {("create", "pods/eviction")}
    assert granted["ClusterRole"] | granted["Role"] == RBAC_NODE_RULES


# ---------------------------------------------------------------------- whole drills


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("storage", "verdict"), [("shared", Verdict.PASS), ("hostPath", Verdict.FAIL)]
)
def test_a_killnode_drill_with_cordon(
    two_nodes: FakeApiServer,
    make_job: MakeJob,
    kubeconfig: Path,
    tmp_path: Path,
    storage: str,
    verdict: Verdict,
) -> None:
    """KillNode of node 0 (the reporting rank's, node-a) with cordon: the replacements
    land on node-b. Shared checkpoints PASS; the hostPath twin restarts from scratch."""
    two_nodes.allowed = RBAC_DRILL_RULES | RBAC_NODE_RULES
    job = start_job(make_job, storage=storage, local_root=tmp_path / "nodes", step_time=0.02)
    text = job_drill_yaml(
        job,
        kubeconfig,
        name=f"k8s-killnode-{storage}",
        failure={"type": "KillNode", "targetNode": "0", "cordon": "true"},
    ).replace("  type: KillWorker\n", "")
    path = tmp_path / "recovery-test.yaml"
    path.write_text(text)
    result = run_drill(parse_config(text, path), RunOptions(handle_signals=False))
    assert result.verdict is verdict, result.summary
    assert job.node_of_rank[0] == "node-b"
    assert not two_nodes.unschedulable("node-a"), "uncordoned at cleanup"
    acted = two_nodes.deletes(acted_only=True)
    assert sorted(r.name for r in acted) == ["llama-master-0", "llama-worker-1"], "node-a's"
    assert all(r.grace_period == 0 and r.precondition_uid for r in acted)
    assert two_nodes.requests_outside(RBAC_DRILL_RULES | RBAC_NODE_RULES) == []
    if verdict is Verdict.FAIL:
        reasons = {c.reason for c in result.checks if c.passed is False}
        assert FailureReason.RESTARTED_FROM_SCRATCH in reasons, result.summary
    else:
        assert result.resume_step == result.expected_resume_step
    print(f"\nk8s KillNode+cordon ({storage}): {result.verdict.value}: {result.summary}")


def node_drill(
    job: FakeTrainingJob, kubeconfig: Path, tmp_path: Path, **failure: str
) -> DrillResult:
    text = job_drill_yaml(
        job, kubeconfig, name="k8s-node-drill", max_recovery="20s", failure=failure
    ).replace("  type: KillWorker\n", "")
    path = tmp_path / "recovery-test.yaml"
    path.write_text(text)
    return run_drill(parse_config(text, path), RunOptions(handle_signals=False))


@pytest.mark.e2e
def test_a_drainnode_drill_evicts_the_node_and_passes(
    two_nodes: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path
) -> None:
    two_nodes.allowed = RBAC_DRILL_RULES | RBAC_NODE_RULES
    job = start_job(make_job, on_sigterm="save", step_time=0.02)
    result = node_drill(job, kubeconfig, tmp_path, type="DrainNode", targetNode="1")
    assert result.verdict is Verdict.PASS, result.summary
    evicted = sorted(r.name for r in two_nodes.evictions() if r.acted)
    assert evicted == ["llama-worker-0", "llama-worker-2"], "node-b's pods, once each"
    assert two_nodes.deletes(acted_only=True) == [], "evictions only, no DELETE"
    print(f"\nk8s DrainNode: {result.summary}")


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("setup", "failure", "message"),
    [
        ("pdb", {"type": "DrainNode"}, "eviction blocked by PodDisruptionBudget llama-pdb"),
        ("pods-only", {"type": "KillNode", "cordon": "true"}, "rbac-nodes.yaml"),
        ("pods-only", {"type": "DrainNode"}, "needs pods/eviction create"),
    ],
)
def test_a_node_drill_that_may_not_act_is_an_error_with_nothing_touched(
    two_nodes: FakeApiServer,
    make_job: MakeJob,
    kubeconfig: Path,
    tmp_path: Path,
    setup: str,
    failure: dict[str, str],
    message: str,
) -> None:
    if setup == "pdb":
        two_nodes.allowed = RBAC_DRILL_RULES | RBAC_NODE_RULES
        two_nodes.add_pdb(NAMESPACE, "llama-pdb", {"training-run": "llama"}, 0)
    else:
        two_nodes.allowed = RBAC_DRILL_RULES
    job = start_job(make_job)
    result = node_drill(job, kubeconfig, tmp_path, targetNode="1", **failure)
    assert result.verdict is Verdict.ERROR, result.summary
    assert message in result.summary, result.summary
    assert acted_on(two_nodes) == []
    assert not any(two_nodes.unschedulable(h) for h in HOSTS)
