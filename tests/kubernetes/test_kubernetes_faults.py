"""The fault catalogue through the fake Kubernetes API server: config file -> verdict.

We test these aspects, each on a PyTorchJob whose pods the fake operator recreates:
- Preempt sends one DELETE with the grace period and the uid precondition; a job that
  saves on SIGTERM PASSes ``savedOnPreempt`` and resumes from that checkpoint; its twin
  that ignores SIGTERM (killed by the kubelet when the grace period ends) FAILs with
  NOT_SAVED_ON_PREEMPT;
- ``count: 2`` kills twice, the second time the replacement pod (a new uid), never the
  pod killed before, one DELETE at a time; both recoveries are judged;
- ``delay: "50%"`` and ``beforeNextCheckpoint`` kill between checkpoints, and the lost
  steps are the work since the last checkpoint;
- HangWorker is refused before anything is touched, with the RBAC reason.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.machine import DrillResult, FailureReason, Verdict
from pytest_recoverygate.errors import ConfigError
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.kubernetes.fake_apiserver import RBAC_DRILL_RULES, FakeApiServer
from tests.kubernetes.fake_cluster import FakeTrainingJob, drill_yaml, job_drill_yaml

pytestmark = [pytest.mark.kubernetes, pytest.mark.e2e]

MakeJob = Callable[..., FakeTrainingJob]


def drill(job: FakeTrainingJob, kubeconfig: Path, tmp_path: Path, **options: Any) -> DrillResult:
    text = job_drill_yaml(job, kubeconfig, name="k8s-faults", **options)
    path = tmp_path / "recovery-test.yaml"
    path.write_text(text)
    return run_drill(parse_config(text, path), RunOptions(handle_signals=False))


def test_a_preempted_job_that_saves_on_sigterm_resumes_from_that_checkpoint(
    apiserver: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path
) -> None:
    job = make_job(nodes=2, step_time=0.02, on_sigterm="save").start()
    victim_uid = job.pod(1)["metadata"]["uid"]
    result = drill(
        job,
        kubeconfig,
        tmp_path,
        fault="Preempt",
        failure={"gracePeriod": "5s", "delay": "0.1s"},
        expect={"savedOnPreempt": "true"},
    )
    assert result.verdict is Verdict.PASS, result.summary
    acted = apiserver.deletes(acted_only=True)
    assert len(acted) == 1
    assert acted[0].target_uid == victim_uid
    assert acted[0].precondition_uid == victim_uid
    assert acted[0].grace_period == 5
    assert job.saved_on_sigterm, "the job never saved on SIGTERM"
    saved = job.saved_on_sigterm[0]
    [recovery] = result.recoveries
    assert recovery.fault_details["savedStep"] == saved
    assert recovery.fault_details["savedUsed"] is True
    assert recovery.resume_step == saved  # the checkpoint written inside the grace period
    assert recovery.lost_steps == 0
    assert apiserver.requests_outside(RBAC_DRILL_RULES) == []


def test_a_preempted_job_that_ignores_sigterm_fails_saved_on_preempt(
    apiserver: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path
) -> None:
    # Checkpoints every 2s, a grace period of 1s: no regular save falls inside it either.
    job = make_job(nodes=2, step_time=0.05, checkpoint_every=40, on_sigterm="ignore").start()
    result = drill(
        job,
        kubeconfig,
        tmp_path,
        after=40,
        max_lost_steps=40,
        fault="Preempt",
        failure={"gracePeriod": "1s"},
        expect={"savedOnPreempt": "true"},
    )
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons[0] is FailureReason.NOT_SAVED_ON_PREEMPT, result.summary
    assert job.sigterms and not job.saved_on_sigterm
    [acted] = apiserver.deletes(acted_only=True)
    assert acted.grace_period == 1
    # Recovered from the checkpoint before the SIGTERM: only the save is missing.
    [recovery] = result.recoveries
    assert recovery.resume_step == recovery.expected_resume_step


def test_count_two_kills_the_replacement_pod_the_second_time(
    apiserver: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path
) -> None:
    job = make_job(nodes=2, step_time=0.02).start()
    first_uid = job.pod(1)["metadata"]["uid"]
    result = drill(job, kubeconfig, tmp_path, failure={"count": "2"}, max_lost_steps=50)
    assert result.verdict is Verdict.PASS, result.summary
    assert [r.verdict for r in result.recoveries] == [Verdict.PASS, Verdict.PASS]
    acted = apiserver.deletes(acted_only=True)
    assert len(acted) == 2
    assert acted[0].target_uid == first_uid
    assert acted[1].target_uid != first_uid
    assert job.uids[acted[1].target_uid or ""] == 1  # the replacement of the same rank
    assert all(a.precondition_uid == a.target_uid for a in acted)
    # The second kill tests a checkpoint written after the first recovery.
    first, second = result.recoveries
    assert first.trigger_checkpoint is not None and second.trigger_checkpoint is not None
    assert second.trigger_checkpoint > (first.resume_step or 0)
    assert apiserver.requests_outside(RBAC_DRILL_RULES) == []


@pytest.mark.parametrize("delay", ['"50%"', "beforeNextCheckpoint"])
def test_a_delayed_kill_lands_between_checkpoints(
    apiserver: FakeApiServer,
    make_job: MakeJob,
    kubeconfig: Path,
    tmp_path: Path,
    delay: str,
) -> None:
    job = make_job(nodes=2, step_time=0.03, checkpoint_every=10).start()
    result = drill(job, kubeconfig, tmp_path, failure={"delay": delay}, max_lost_steps=10)
    assert result.verdict is Verdict.PASS, result.summary
    [recovery] = result.recoveries
    assert recovery.delay_seconds is not None and recovery.delay_seconds > 0
    assert recovery.lost_steps is not None and recovery.lost_steps > 0
    assert recovery.lost_steps < 10
    assert len(apiserver.deletes(acted_only=True)) == 1


def test_hang_worker_is_refused_with_the_rbac_reason(kubeconfig: Path, tmp_path: Path) -> None:
    text = drill_yaml("training-run=llama", "training", kubeconfig, name="hang", fault="HangWorker")
    with pytest.raises(ConfigError, match="pods-only RBAC"):
        parse_config(text, tmp_path / "recovery-test.yaml")
