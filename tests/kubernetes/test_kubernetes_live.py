"""``recovery: live`` on Kubernetes: replica groups as pods, one selector per group.

The fake cluster's pods are not processes, so the torchft job is played too
(tests/kubernetes/fake_live.py: its pods print the torchft integration's lines, formatted
by the real ``recoverygate.wire``); the drill, the kubernetes client, the API server over
HTTP and the judgement are real. We test these aspects:
- PASS: the target replica group's pod -- and only it -- is deleted by uid, the
  survivor's log keeps its committed steps, the pod recreated by the operator is
  observed and its heal from the peer is judged from its own log;
- FAIL, rejoined from scratch: the twin whose replacement does not heal;
- the drill stays inside the pods-only RBAC; a dry run deletes nothing;
- the replica groups' orchestrator is an Orchestrator (mypy and at run time).

Each drill takes 2-4 s here (a 20 ms step, a 0.5 s heartbeat timeout).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.durations import parse_duration
from pytest_recoverygate.orchestrators.base import EventSource, Orchestrator, RealClock
from pytest_recoverygate.orchestrators.kubernetes import ReplicaGroupsOrchestrator
from tests.cli_drill import CliRun, run_cli_drill
from tests.kubernetes.fake_apiserver import RBAC_DRILL_RULES, FakeApiServer
from tests.kubernetes.fake_cluster import NAMESPACE
from tests.kubernetes.fake_live import FakeLiveJob
from tests.patience import JOB, within

pytestmark = [pytest.mark.kubernetes, pytest.mark.e2e]


@pytest.fixture
def live_job(apiserver: FakeApiServer, request: pytest.FixtureRequest) -> Iterator[FakeLiveJob]:
    job = FakeLiveJob(apiserver, **getattr(request, "param", {}))
    yield job.start(until_step=5)
    job.stop()


def live_config(job: FakeLiveJob, kubeconfig: Path) -> dict[str, Any]:
    return {
        "name": "k8s-live",
        "workload": {
            "orchestrator": "kubernetes",
            "namespace": NAMESPACE,
            "kubeconfig": str(kubeconfig),
            "replicas": [
                {"replica": r.replica, "selector": job.selector(r.replica)} for r in job.replicas
            ],
        },
        "injectFailure": {
            "type": "KillWorker",
            "afterStep": 30,
            "targetReplica": 1,
            "targetRank": 0,
        },
        "expectations": {
            "recovery": "live",
            "maxSurvivorStall": "3s",
            "maxRejoinTime": "10s",
            "rejoinFrom": "peer",
            "maxLostSteps": 0,
        },
        "safety": {"requireConfirm": False},
        "timeouts": {"discovery": "20s", "checkpoint": "20s"},
    }


def run_live(
    job: FakeLiveJob, kubeconfig: Path, tmp_path: Path, *, dry_run: bool = False
) -> CliRun:
    config = live_config(job, kubeconfig)
    config["safety"]["dryRun"] = dry_run
    return run_cli_drill(config, tmp_path / "recovery-test.yaml", timeout=within(JOB))


def test_the_replica_groups_orchestrator_is_an_orchestrator(kubeconfig: Path) -> None:
    orchestrator = ReplicaGroupsOrchestrator(
        {0: "job=a", 1: "job=b"}, target_replica=1, kubeconfig=kubeconfig, clock=RealClock()
    )
    try:
        conforming: Orchestrator = orchestrator  # the static check (mypy)
        assert isinstance(conforming, Orchestrator)
        assert isinstance(conforming.events(), EventSource)
        assert list(orchestrator.groups) == [1, 0]  # the target's workers come first
    finally:
        orchestrator.cleanup()


def test_a_dry_run_deletes_nothing(
    apiserver: FakeApiServer, live_job: FakeLiveJob, kubeconfig: Path, tmp_path: Path
) -> None:
    run_live(live_job, kubeconfig, tmp_path, dry_run=True)
    assert apiserver.deletes(acted_only=True) == []
    assert [len(r.incarnations) for r in live_job.replicas] == [1, 1]


def test_the_target_replica_s_pod_is_killed_and_heals_from_a_peer(
    apiserver: FakeApiServer, live_job: FakeLiveJob, kubeconfig: Path, tmp_path: Path
) -> None:
    target_uid, survivor_uid = live_job.uid(1), live_job.uid(0)
    run = run_live(live_job, kubeconfig, tmp_path)
    report = run.report
    assert run.code == 0, run.output
    assert report["verdict"] == "PASS", report["summary"]
    assert report["recoveryMode"] == "live"
    assert report["target"]["instanceId"] == target_uid
    assert [d.target_uid for d in apiserver.deletes(acted_only=True)] == [target_uid]
    assert live_job.uid(0) == survivor_uid  # the survivor's pod was never touched
    assert apiserver.requests_outside(RBAC_DRILL_RULES) == []
    assert report["rejoinSource"] == "peer"
    assert report["survivorsKeptTraining"] is True
    # the survivors wait for the lighthouse's heartbeat timeout (the job's), not for the
    # restart: at least that long, and within the drill's maxSurvivorStall
    limit = parse_duration(live_config(live_job, kubeconfig)["expectations"]["maxSurvivorStall"])
    assert live_job.heartbeat_timeout <= report["survivorStallSeconds"] <= limit
    replicas = {r["replica"]: r for r in report["live"]["replicas"]}
    assert replicas[1]["target"] is True
    assert (replicas[0]["incarnations"], replicas[1]["incarnations"]) == (1, 2)
    healed = [step for replica, step in live_job.heals if replica == 1]
    assert healed == [report["rejoinStep"]]
    assert report["live"]["rejoinPeer"] == 0
    print(
        f"\nk8s live: stall {report['survivorStallSeconds']} s, rejoin "
        f"{report['rejoinTimeSeconds']} s, heal step {report['rejoinStep']}, drill {run.wall:.1f} s"
    )


@pytest.mark.parametrize("live_job", [{"heal": "scratch"}], indirect=True)
def test_a_replacement_that_does_not_heal_fails_rejoined_from_scratch(
    apiserver: FakeApiServer, live_job: FakeLiveJob, kubeconfig: Path, tmp_path: Path
) -> None:
    target_uid = live_job.uid(1)
    run = run_live(live_job, kubeconfig, tmp_path)
    report = run.report
    assert run.code == 1, run.output
    assert report["verdict"] == "FAIL"
    assert "REJOINED_FROM_SCRATCH" in report["reasons"], report["summary"]
    assert report["rejoinSource"] == "scratch"
    assert [d.target_uid for d in apiserver.deletes(acted_only=True)] == [target_uid]
