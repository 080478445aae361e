"""Whole drills through the runner on the fake cluster: config file -> verdict.

We test these aspects: PyTorchJob PASS; a job that restarts from step 0 FAILs; a
replacement that never runs FAILs; TrainJob PASS; a dry run makes no destructive call;
a 403 is an ERROR naming rbac.yaml; every drill stays within the RBAC allow-list and
sends at most one destructive delete, to the discovered instance.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.machine import DrillResult, Verdict
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.kubernetes.fake_apiserver import RBAC_DRILL_RULES, FakeApiServer
from tests.kubernetes.fake_cluster import FakeTrainingJob, job_drill_yaml

pytestmark = [pytest.mark.kubernetes, pytest.mark.e2e]

MakeJob = Callable[..., FakeTrainingJob]


def drill(
    job: FakeTrainingJob,
    kubeconfig: Path,
    tmp_path: Path,
    *,
    dry_run: bool = False,
    max_recovery: str = "10s",
) -> DrillResult:
    text = job_drill_yaml(job, kubeconfig, name=f"k8s-{job.kind}", max_recovery=max_recovery)
    path = tmp_path / "recovery-test.yaml"
    path.write_text(text)
    config = parse_config(text, path)
    return run_drill(config, RunOptions(dry_run=dry_run, handle_signals=False))


def assert_safe(server: FakeApiServer, victim_uid: str | None) -> None:
    assert server.requests_outside(RBAC_DRILL_RULES) == []
    acted = server.deletes(acted_only=True)
    assert len(acted) <= 1
    if acted:
        assert acted[0].target_uid == victim_uid


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_a_job_that_resumes_from_its_checkpoint_passes(
    apiserver: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path, kind: str
) -> None:
    job = make_job(kind=kind, nodes=2, step_time=0.02).start()
    victim_uid = job.pod(1)["metadata"]["uid"]
    result = drill(job, kubeconfig, tmp_path)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == result.expected_resume_step
    assert result.target is not None
    assert result.target.instance_id == victim_uid
    assert len(apiserver.deletes(acted_only=True)) == 1
    assert_safe(apiserver, victim_uid)


def test_a_job_that_restarts_from_step_zero_fails(
    apiserver: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path
) -> None:
    job = make_job(nodes=2, step_time=0.02, resume="zero").start()
    victim_uid = job.pod(1)["metadata"]["uid"]
    result = drill(job, kubeconfig, tmp_path)
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.resume_step == 0
    assert_safe(apiserver, victim_uid)


def test_a_replacement_that_never_runs_fails(
    apiserver: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path
) -> None:
    job = make_job(nodes=2, step_time=0.02, replacement="pending").start()
    victim_uid = job.pod(1)["metadata"]["uid"]
    result = drill(job, kubeconfig, tmp_path, max_recovery="3s")
    assert result.verdict is Verdict.FAIL, result.summary
    assert_safe(apiserver, victim_uid)


def test_a_dry_run_drill_makes_no_destructive_call(
    apiserver: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path
) -> None:
    job = make_job(nodes=2, step_time=0.02).start()
    drill(job, kubeconfig, tmp_path, dry_run=True)
    assert [(r.dry_run, r.acted) for r in apiserver.deletes()] in ([], [(True, False)])
    assert apiserver.deletes(acted_only=True) == []


def test_a_forbidden_delete_is_an_error_that_names_rbac_yaml(
    apiserver: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path
) -> None:
    job = make_job(nodes=2, step_time=0.02).start()
    apiserver.allowed = RBAC_DRILL_RULES - {("delete", "pods")}
    result = drill(job, kubeconfig, tmp_path)
    assert result.verdict is Verdict.ERROR
    assert "examples/kubernetes/rbac.yaml" in result.summary
    assert apiserver.deletes(acted_only=True) == []
