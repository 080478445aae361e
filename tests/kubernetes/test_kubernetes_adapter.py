"""KubernetesOrchestrator's discovery and group watch against the real API server.

Pods made by hand in a namespace of the session's real cluster, labelled as the Training
Operator and JobSet label theirs (tests/kubernetes/fake_cluster.py's templates), most of
them left Pending on purpose (a node selector no node has: discovery reads labels, not
containers). We test these aspects:

- ranks: a PyTorchJob's Master is rank 0 and ``worker-N`` rank N+1; without a Master,
  ``worker-N`` is rank N; TrainJob pods by ``batch.kubernetes.io/job-completion-index``
  (label or annotation), initializer pods skipped; else a ``rank`` label, then a literal
  ``RANK`` env value;
- every refusal of discovery, with its message: no pod matches, pods of two jobs, an
  absent target rank, two live pods claiming one rank, a pod whose rank cannot be told,
  a selector the API server rejects (the real server's own 400);
- the namespace comes from the kubeconfig context the config names;
- the events: a line's receive time is the container runtime's timestamp of it (the
  log is read seconds after the lines were written), not the moment it was read;
- the group watch: a job whose pods all end Failed is JOB_FAILED, all Succeeded is
  JOB_SUCCEEDED (real containers that exit 1 / 0);
- KillNode with ``cordon`` on a node an operator cordoned before: the kill says so, and
  cleanup leaves the node cordoned (it uncordons only what it cordoned).

The adapter's answers to a server that misbehaves (429, 500, resets, dropped watches, 410
Gone) are in test_kubernetes_orchestrator.py, on the fake API server.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.engine.model import GroupEvent, GroupEventKind, TrainingEventKind
from pytest_recoverygate.errors import DiscoveryError
from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator
from tests.kubernetes.fake_cluster import pytorchjob_pod, trainjob_pod
from tests.kubernetes.kube_cluster import KubeCluster, eventually
from tests.patience import JOB, deadline, gather

pytestmark = [pytest.mark.kubernetes, pytest.mark.kube_cluster]

Pod = dict[str, Any]
MakeOrchestrator = Callable[..., KubernetesOrchestrator]


def far() -> float:
    return deadline(JOB)


@pytest.fixture(scope="module")
def space(kube_cluster: KubeCluster) -> Iterator[tuple[KubeCluster, str]]:
    with kube_cluster.namespace("adapter") as namespace:
        yield kube_cluster, namespace


def create(
    space: tuple[KubeCluster, str], pod: Pod, *, run: str | None = None, node: str | None = None
) -> dict[str, Any]:
    """Create ``pod`` (a fake_cluster template) on the real server: Pending on no node,
    or, with ``run``, running that shell command in the cluster image once (on ``node``
    when given)."""
    cluster, namespace = space
    pod = copy.deepcopy(pod)
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    meta = pod["metadata"]
    meta["namespace"] = namespace
    meta.pop("finalizers", None)  # a Job's tracking finalizer: no Job here to remove it
    spec = pod.setdefault("spec", {})
    containers = spec.setdefault("containers", [{"name": "main"}])
    for container in containers:
        container["image"] = cluster.image
        container["imagePullPolicy"] = "Never"
        container["command"] = ["sh", "-c", run or "sleep 3600"]
    if node is not None:
        spec["nodeName"] = node  # bound by hand: no scheduler, no controller
    elif run is None:
        spec["nodeSelector"] = {"recoverygate.test/no-such-node": "true"}
    if run is not None:
        spec["restartPolicy"] = "Never"
    spec["terminationGracePeriodSeconds"] = 0
    created: dict[str, Any] = cluster.core_api().create_namespaced_pod(namespace, pod).to_dict()
    return created


def labelled(name: str, labels: dict[str, str], env: dict[str, str] | None = None) -> Pod:
    container: dict[str, Any] = {"name": "main"}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {"metadata": {"name": name, "labels": labels}, "spec": {"containers": [container]}}


@pytest.fixture
def make_orchestrator(space: tuple[KubeCluster, str]) -> Iterator[MakeOrchestrator]:
    cluster, namespace = space
    made: list[KubernetesOrchestrator] = []

    def make(**kwargs: Any) -> KubernetesOrchestrator:
        kwargs.setdefault("kubeconfig", cluster.kubeconfig)
        kwargs.setdefault("namespace", namespace)
        orchestrator = KubernetesOrchestrator(**kwargs)
        made.append(orchestrator)
        return orchestrator

    yield make
    for orchestrator in made:
        orchestrator.cleanup()


def test_it_ranks_a_pytorchjob_master_as_zero_and_workers_from_one(
    space: tuple[KubeCluster, str], make_orchestrator: MakeOrchestrator
) -> None:
    uids = [
        create(space, pytorchjob_pod("llama", kind, index))["metadata"]["uid"]
        for kind, index in (("master", 0), ("worker", 0), ("worker", 1))
    ]
    workload = make_orchestrator(selector="training-run=llama").discover(far())
    assert workload.job == "PyTorchJob/llama"
    assert [(w.rank, w.name, w.instance_id) for w in workload.workers] == [
        (0, "llama-master-0", uids[0]),
        (1, "llama-worker-0", uids[1]),
        (2, "llama-worker-1", uids[2]),
    ]


def test_it_ranks_pytorchjob_workers_from_zero_without_a_master(
    space: tuple[KubeCluster, str], make_orchestrator: MakeOrchestrator
) -> None:
    for index in range(2):
        create(space, pytorchjob_pod("elastic", "worker", index))
    workload = make_orchestrator(selector="training-run=elastic").discover(far())
    assert [(w.rank, w.name) for w in workload.workers] == [
        (0, "elastic-worker-0"),
        (1, "elastic-worker-1"),
    ]


@pytest.mark.parametrize("as_label", [True, False], ids=["label", "annotation"])
def test_it_ranks_trainjob_nodes_by_completion_index_and_skips_initializers(
    space: tuple[KubeCluster, str], make_orchestrator: MakeOrchestrator, as_label: bool
) -> None:
    job = f"tj-{'l' if as_label else 'a'}"
    create(space, trainjob_pod(job, 0, replicated_job="dataset-initializer"))
    for index in (1, 0):
        create(space, trainjob_pod(job, index, as_label=as_label))
    workload = make_orchestrator(selector=f"training-run={job}").discover(far())
    assert workload.job == f"TrainJob/{job}"
    assert [w.rank for w in workload.workers] == [0, 1]
    assert all(w.name.startswith(f"{job}-node-0-{w.rank}-") for w in workload.workers)


def test_it_falls_back_to_a_rank_label_and_then_to_the_rank_env(
    space: tuple[KubeCluster, str], make_orchestrator: MakeOrchestrator
) -> None:
    create(space, labelled("fa", {"app": "fallback", "rank": "1"}))
    create(space, labelled("fb", {"app": "fallback"}, env={"RANK": "0"}))
    workload = make_orchestrator(selector="app=fallback").discover(far())
    assert [(w.rank, w.name) for w in workload.workers] == [(0, "fb"), (1, "fa")]


def test_it_refuses_when_no_pod_matches(make_orchestrator: MakeOrchestrator) -> None:
    with pytest.raises(
        DiscoveryError, match=r"no pods match selector 'training-run=nothing'.*kubectl get pods"
    ):
        make_orchestrator(selector="training-run=nothing").discover(far())


def test_it_refuses_a_selector_that_matches_two_jobs(
    space: tuple[KubeCluster, str], make_orchestrator: MakeOrchestrator
) -> None:
    for job in ("one", "two"):
        pod = pytorchjob_pod(job, "master", 0)
        pod["metadata"]["labels"]["pair"] = "yes"
        create(space, pod)
    with pytest.raises(
        DiscoveryError, match="matches pods of 2 jobs.*PyTorchJob/one, PyTorchJob/two"
    ):
        make_orchestrator(selector="pair=yes").discover(far())


def test_it_refuses_a_target_rank_that_does_not_exist(
    space: tuple[KubeCluster, str], make_orchestrator: MakeOrchestrator
) -> None:
    for index in range(2):
        create(space, pytorchjob_pod("small", "worker", index))
    with pytest.raises(DiscoveryError, match=r"target rank 5 is not among the ranks .*\(0, 1\)"):
        make_orchestrator(selector="training-run=small", target_rank=5).discover(far())


def test_it_refuses_two_live_pods_claiming_one_rank(
    space: tuple[KubeCluster, str], make_orchestrator: MakeOrchestrator
) -> None:
    for name in ("dx", "dy"):
        create(space, labelled(name, {"app": "twice", "rank": "1"}))
    with pytest.raises(DiscoveryError, match="2 pods claim rank 1"):
        make_orchestrator(selector="app=twice").discover(far())


def test_it_refuses_a_pod_whose_rank_it_cannot_tell(
    space: tuple[KubeCluster, str], make_orchestrator: MakeOrchestrator
) -> None:
    create(space, labelled("mystery", {"app": "mystery"}))
    with pytest.raises(DiscoveryError, match="cannot tell the rank of pod 'mystery'"):
        make_orchestrator(selector="app=mystery").discover(far())


def test_it_reports_a_selector_the_server_rejects_as_a_discovery_error(
    make_orchestrator: MakeOrchestrator,
) -> None:
    with pytest.raises(DiscoveryError, match="rejected selector"):
        make_orchestrator(selector="app in (a,").discover(far())


def test_it_takes_the_namespace_from_the_kubeconfig_context(
    space: tuple[KubeCluster, str], tmp_path: Path
) -> None:
    cluster, namespace = space
    for index in range(2):
        create(space, pytorchjob_pod("ctx", "worker", index))
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    context = copy.deepcopy(config["contexts"][0])
    context["name"] = "lab"
    context["context"]["namespace"] = namespace
    config["contexts"].append(context)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    orchestrator = KubernetesOrchestrator(
        selector="training-run=ctx", kubeconfig=kubeconfig, context="lab"
    )
    try:
        assert len(orchestrator.discover(far()).workers) == 2
        assert orchestrator.namespace == namespace
    finally:
        orchestrator.cleanup()


#: A container that writes three RECOVERYGATE/v1 progress lines, each stamped with its
#: own clock (the node's: the same machine as the container runtime's), then sleeps.
STAMPED = (
    'for i in 1 2 3; do echo "RECOVERYGATE/v1 {\\"event\\":\\"progress\\",'
    '\\"time\\":$(date +%s.%6N),\\"inc\\":\\"0123456789abcdef\\",'
    '\\"rank\\":0,\\"step\\":$i}"; sleep 0.2; done; sleep 3600'
)


def test_events_carry_the_log_timestamp_as_their_receive_time(
    space: tuple[KubeCluster, str], make_orchestrator: MakeOrchestrator
) -> None:
    cluster, namespace = space
    create(space, labelled("stamped", {"app": "stamped", "rank": "0"}), run=STAMPED)
    eventually(
        lambda: (
            True if cluster.pod_log(namespace, "stamped").count("RECOVERYGATE/v1") == 3 else None
        ),
        "the three lines in the pod's log",
    )
    time.sleep(3)  # not a wait: the stream below is opened 3 s after the lines were written
    orchestrator = make_orchestrator(selector="app=stamped", target_rank=0)
    orchestrator.discover(far())
    seen = [
        e
        for e in gather(
            orchestrator.events().poll,
            lambda got: sum(e.kind is TrainingEventKind.PROGRESS for e in got) >= 3,
            "three progress events",
            JOB,
        )
        if e.kind is TrainingEventKind.PROGRESS
    ]
    read = time.time()
    assert [e.step for e in seen] == [1, 2, 3], seen
    for event in seen:
        assert event.received is not None
        # The runtime stamps a line as the container writes it: within a fraction of a
        # second of the line's own time, whereas the stream was read 3 s and more later.
        assert abs(event.received - event.timestamp) < 0.5, (event.received, event.timestamp)
        assert read - event.received > 2.5, (read, event.received)


def wait_group(orchestrator: KubernetesOrchestrator, until: GroupEventKind) -> list[GroupEvent]:
    return gather(
        orchestrator.watch_group,
        lambda seen: any(e.kind is until for e in seen),
        f"{until} from the group watch",
        JOB,
        seen=lambda seen: [e.kind for e in seen],
    )


@pytest.mark.parametrize(
    ("code", "phase", "kind"),
    [(1, "Failed", GroupEventKind.JOB_FAILED), (0, "Succeeded", GroupEventKind.JOB_SUCCEEDED)],
    ids=["failed", "succeeded"],
)
def test_a_job_whose_pods_all_ended_is_reported_so(
    space: tuple[KubeCluster, str],
    make_orchestrator: MakeOrchestrator,
    code: int,
    phase: str,
    kind: GroupEventKind,
) -> None:
    """Real containers that end: the kubelet's phase, seen through the watch."""
    app = f"ends-{phase.lower()}"
    for rank in range(2):
        create(
            space,
            labelled(f"{app}-{rank}", {"app": app, "rank": str(rank)}),
            run=f"sleep 8; exit {code}",
        )
    orchestrator = make_orchestrator(selector=f"app={app}")
    job = orchestrator.discover(far()).job
    events = wait_group(orchestrator, kind)
    assert f"every pod of {job} is {phase}" in events[-1].detail
    assert not any(
        e.kind in (GroupEventKind.JOB_FAILED, GroupEventKind.JOB_SUCCEEDED) and e.kind is not kind
        for e in events
    )


def test_a_node_cordoned_before_the_kill_stays_cordoned(
    space: tuple[KubeCluster, str], make_orchestrator: MakeOrchestrator
) -> None:
    from pytest_recoverygate.engine.model import Fault

    cluster, _ = space
    for rank, node in ((0, "node1"), (1, "node2")):
        pod = labelled(f"cordoned-{rank}", {"app": "cordoned", "rank": str(rank)})
        create(space, pod, run="sleep 3600", node=node)
    orchestrator = make_orchestrator(selector="app=cordoned", fault="KillNode", cordon=True)
    target = orchestrator.discover(far()).by_rank(1)
    assert target is not None and target.node == "node2"
    cluster.kubectl("cordon", "node2")  # an operator cordons it before the kill
    try:
        result = orchestrator.kill(target, dry_run=False, fault=Fault("KillNode"))
        assert "node node2 was already cordoned" in result.detail, result.detail
        orchestrator.cleanup()
        assert orchestrator.uncordoned == []
        assert cluster.get("default", "node", "node2")["spec"].get("unschedulable") is True
    finally:
        cluster.kubectl("uncordon", "node2")
