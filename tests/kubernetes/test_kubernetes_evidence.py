"""evidence.podLogs: what a real cluster cannot show on cue, and what needs no cluster.

The drills of a job without the reporter (nanoGPT's lines, read from the reporting
rank's pod log) run on the real cluster: test_kubernetes_jobs.py. Here, on the fake API
server (the real one's watch cannot be held back from showing a container restart on cue),
we test these aspects:

- the log of a restarted container can be open before the watch's view of the pod shows
  the restart (seen once in a full run); a view that never shows it is forced here (the
  real watch cannot be held back on cue): the incarnation still comes from a fresh list
  of the pods when the log is opened, and the job that restarts from scratch FAILs;
- podLogs on another backend is refused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.machine import FailureReason, Verdict
from pytest_recoverygate.errors import ConfigError
from pytest_recoverygate.orchestrators import build_orchestrator
from pytest_recoverygate.orchestrators.kubernetes.pods import Pod, pod_uid
from pytest_recoverygate.runner import RunOptions, run_drill
from pytest_recoverygate.shared.clock import RealClock
from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.kubernetes.fake_cluster import FakeTrainingJob, job_drill_yaml

pytestmark = [pytest.mark.kubernetes, pytest.mark.e2e]

MakeJob = Callable[..., FakeTrainingJob]
EVIDENCE = "evidence:\n  preset: nanogpt\n  podLogs: true\n"


def test_a_container_restart_the_watch_has_not_shown_is_still_a_new_incarnation(
    apiserver: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path
) -> None:
    """The log of the restarted container can be open before the watch's view of the pod
    shows the restart (seen once in a full run: the new container's lines were taken for
    the old one's, and the drill said "never came back"). Here the view never shows it:
    the incarnation comes from a fresh list of the pods when the log is opened."""
    job = make_job(
        nodes=2, step_time=0.02, lines="nanogpt", restart_reporter_container=True, resume="zero"
    ).start()
    text = job_drill_yaml(job, kubeconfig, name="k8s-nanogpt", max_recovery="10s") + EVIDENCE
    path = tmp_path / "recovery-test.yaml"
    path.write_text(text)
    config, clock = parse_config(text, path), RealClock()
    orchestrator = cast(Any, build_orchestrator(config, clock))
    view = orchestrator._logs._reporting_pod  # the watch's view of the reporting rank's pod
    first_seen: dict[str, Pod] = {}

    def stale() -> Pod | None:  # each pod as the watch first showed it
        pod = view()
        return None if pod is None else first_seen.setdefault(pod_uid(pod), copy.deepcopy(pod))

    orchestrator._logs._reporting_pod = stale
    result = run_drill(
        config, RunOptions(handle_signals=False), clock=clock, orchestrator=orchestrator
    )
    assert result.verdict is Verdict.FAIL, result.summary
    assert FailureReason.RESTARTED_FROM_SCRATCH in result.reasons


def test_a_restart_whose_log_is_served_before_the_pod_s_status_shows_it_passes(
    apiserver: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path
) -> None:
    """The kubelet serves a restarted container's log as soon as it prints, and posts the
    pod's status on its own schedule: a list made when the log was opened still showed
    the old container terminated (seen in CI on the real cluster: the new container's
    lines were taken for the old one's, and the drill said "never came back" of a job
    that had resumed). Here the status trails the restart by 2 s; the drill waits for the
    status that shows the instance, and PASSes on the resume the job made."""
    job = make_job(
        nodes=2, step_time=0.02, lines="nanogpt", restart_reporter_container=True, status_lag=2.0
    ).start()
    text = job_drill_yaml(job, kubeconfig, name="k8s-nanogpt", max_recovery="20s") + EVIDENCE
    path = tmp_path / "recovery-test.yaml"
    path.write_text(text)
    result = run_drill(parse_config(text, path), RunOptions(handle_signals=False))
    assert result.verdict is Verdict.PASS, result.summary
    [recovery] = result.recoveries
    assert recovery.resume_step is not None and recovery.resume_step > 0
    assert recovery.resume_step == recovery.expected_resume_step
    assert len(job.incarnations) == 2, job.incarnations


def test_pod_logs_is_refused_on_another_backend(tmp_path: Path) -> None:
    text = (
        "workload: {orchestrator: local, command: [python, t.py]}\n"
        "injectFailure: {afterCheckpoint: next}\nexpectations: {maxRecoveryTime: 60s}\n" + EVIDENCE
    )
    with pytest.raises(
        ConfigError,
        match="podLogs needs a backend that reads the job's log itself \\(Kubernetes\\), not local",
    ):
        parse_config(text, tmp_path / "recovery-test.yaml")
