"""KillNode on Kubernetes under injected faults, read from the fake API server's own log.

On the fake API server because the real one cannot be made to answer the node's requests
with 500s or 429s, reset them before or after acting, or cut and 410 its streams on cue,
and keeps no request log to show which pod each DELETE reached; KillNode and DrainNode
without faults run on the real cluster (tests/kubernetes/test_kubernetes_drills.py).

We test these aspects, over ``NODE_DRILLS`` whole drills (each its own namespace and its
own two nodes; a few without faults, the rest under kube_faults.py's random faults on the
job's requests: 500s, 503/429, resets before and after acting, read timeouts, cut
streams, 410s), half of them with ``cordon: true``:
- never a pod of another node: every DELETE that acted reached a pod that was on the
  target node when the drill began, with grace period 0 and its uid precondition;
- the cordon is always undone: after the drill no node is cordoned;
- the verdict: PASS (shared checkpoints) or ERROR (a fault left a delete's outcome
  unknown), never FAIL; PASS only after a DELETE acted; without faults, every pod of the
  node was deleted exactly once and the drill PASSed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.machine import DrillResult, Verdict
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.kubernetes.fake_apiserver import RBAC_DRILL_RULES, RBAC_NODE_RULES, FakeApiServer
from tests.kubernetes.fake_cluster import FakeTrainingJob, job_drill_yaml
from tests.reliability.kube_faults import FaultPlan, FaultRouter, request_trace

pytestmark = pytest.mark.kubernetes

NODE_DRILLS = 16
NODE_CLEAN = 4  # without faults: every pod of the node deleted once, PASS
AT_ONCE = 8


@pytest.fixture(scope="module")
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=0.1) as api:
        api.allowed = RBAC_DRILL_RULES | RBAC_NODE_RULES
        yield api


@pytest.fixture(scope="module")
def router(server: FakeApiServer) -> FaultRouter:
    return FaultRouter(server)


@pytest.fixture(scope="module")
def kubeconfig(server: FakeApiServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return server.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")


def one_killnode(
    server: FakeApiServer, router: FaultRouter, kubeconfig: Path, seed: int, tmp: Path
) -> tuple[FaultPlan, set[str], list[str], DrillResult, bool]:
    rng = random.Random(seed)
    namespace = f"killnode-{seed}"
    hosts = [f"n{seed}-a", f"n{seed}-b"]
    for host in hosts:
        server.add_node(host)
    cordon = seed % 2 == 1
    job = FakeTrainingJob(
        server,
        name=f"job-{seed}",
        namespace=namespace,
        nodes=4,
        hosts=hosts,
        step_time=0.01,
        checkpoint_every=5,
        recreate_delay=0.02,
        start_delay=0.05,
    )
    probability = 0.0 if seed < NODE_CLEAN else rng.choice([0.1, 0.2, 0.3])
    plan = FaultPlan(namespace, seed, probability=probability, read_timeout=1.0)
    router.add(plan)
    try:
        job.start(wait_for_checkpoint=5)
        on_node = {
            p["metadata"]["uid"]
            for p in server.pods(namespace)
            if p["spec"].get("nodeName") == hosts[1]
        }
        text = job_drill_yaml(
            job,
            kubeconfig,
            name="killnode-drill",
            after=10,
            max_recovery="20s",
            max_lost_steps=10000,
            fault="KillNode",
            failure={"targetNode": "1", **({"cordon": "true"} if cordon else {})},
        ).replace("  targetRank: 1\n", "")
        path = tmp / f"killnode-{seed}.yaml"
        path.write_text(text)
        plan.active = True
        result = run_drill(parse_config(text, path), RunOptions(handle_signals=False))
        plan.active = False
        return plan, on_node, hosts, result, cordon
    finally:
        plan.active = False
        job.stop()


@pytest.mark.slow  # node drills on the fake API server under faults (about 4 s)
def test_killnode_under_faults_never_touches_another_node_and_undoes_the_cordon(
    server: FakeApiServer, router: FaultRouter, kubeconfig: Path, tmp_path: Path
) -> None:
    with ThreadPoolExecutor(AT_ONCE) as pool:
        runs = list(
            pool.map(
                lambda seed: one_killnode(server, router, kubeconfig, seed, tmp_path),
                range(NODE_DRILLS),
            )
        )
    verdicts = []
    for seed, (plan, on_node, hosts, result, cordon) in enumerate(runs):
        namespace = plan.namespace
        why = f"seed {seed} ({result.verdict.value}: {result.summary})\n" + request_trace(
            server, namespace
        )
        acted = [r for r in server.deletes(acted_only=True) if r.namespace == namespace]
        assert all(r.target_uid in on_node for r in acted), why
        assert all(r.grace_period == 0 and r.precondition_uid for r in acted), why
        assert len({r.target_uid for r in acted}) == len(acted), "never one pod twice: " + why
        assert not any(server.unschedulable(h) for h in hosts), "cordon undone: " + why
        patches = [r for r in server.requests if r.resource == "nodes" and r.name in hosts]
        if not cordon:
            assert not [r for r in patches if r.acted], "no cordon asked: " + why
        assert result.verdict in (Verdict.PASS, Verdict.ERROR), why
        if result.verdict is Verdict.PASS:
            assert acted, why
        if seed < NODE_CLEAN:
            assert result.verdict is Verdict.PASS, why
            assert {r.target_uid for r in acted} == on_node, why
        verdicts.append(result.verdict)
    assert verdicts.count(Verdict.PASS) >= NODE_CLEAN
    injected = sum(sum(plan.injected.values()) for plan, *_ in runs)
    assert injected > 0, "the faulty drills had faults"
    print(
        f"\nKillNode under faults: {NODE_DRILLS} drills, {injected} faults injected, "
        f"{verdicts.count(Verdict.PASS)} PASS, {verdicts.count(Verdict.ERROR)} ERROR"
    )
