"""Node faults on Kubernetes: the fake API server's nodes and evictions, and what needs no
server.

The node faults themselves run on the real cluster (test_kubernetes_drills.py: KillNode
with cordon, DrainNode past a PodDisruptionBudget and one that blocks it;
test_kubernetes_rbac.py: each node right taken away; test_kubernetes_adapter.py: a node
cordoned beforehand stays so). The fake API server keeps its nodes and evictions for the
tests that need what the real server cannot do on cue, injected 500s, 429s, resets and cut
streams during a KillNode (tests/reliability/test_nodes_kubernetes.py), and a request log
that shows not one request changed anything (test_hostile_kubernetes.py), so we test these
aspects:

- the fake answers nodes get/patch (with dry run), a dry-run Eviction and 403s at the
  cluster scope as the apiserver does;
- PartitionNode is refused with the reason;
- the opt-in manifest (examples/kubernetes/rbac-nodes.yaml) grants exactly the node rules.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_recoverygate.errors import UsageError
from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator
from tests.kubernetes.fake_apiserver import RBAC_DRILL_RULES, RBAC_NODE_RULES, FakeApiServer
from tests.kubernetes.fake_cluster import NAMESPACE, FakeTrainingJob

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
    api.create_namespaced_pod_eviction(
        name,
        NAMESPACE,
        client.V1Eviction(metadata=client.V1ObjectMeta(name=name)),
        dry_run="All",
    )
    pod = two_nodes.get_pod(NAMESPACE, name)
    assert pod is not None and not pod["metadata"].get("deletionTimestamp")
    [eviction] = [r for r in two_nodes.requests if r.resource == "pods/eviction"]
    assert (eviction.verb, eviction.dry_run, eviction.acted) == ("create", True, False)

    two_nodes.allowed = RBAC_DRILL_RULES
    with pytest.raises(ApiException) as forbidden:
        api.patch_node("node-a", {"spec": {"unschedulable": True}})
    assert forbidden.value.status == 403
    message = json.loads(forbidden.value.body or "{}")["message"]
    assert 'cannot patch resource "nodes" in API group "" at the cluster scope' in message


def test_partition_node_is_refused_with_the_reason(make_orchestrator: MakeOrchestrator) -> None:
    with pytest.raises(UsageError, match="no operation that cuts a node's network"):
        make_orchestrator(selector="a=b", fault="PartitionNode")


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
