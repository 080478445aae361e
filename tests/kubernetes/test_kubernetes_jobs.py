"""Two more jobs on the real cluster: a Trainer v2 TrainJob, and a PyTorchJob whose image
has no reporter (``evidence.podLogs``), each drill held to the job's own records.

- The TrainJob is examples/kubernetes/trainjob-kube-cluster.yaml (Trainer v2.3's
  ``runtimePatches``, the ``torch-distributed`` runtime: JobSet, an Indexed Job, static
  rendezvous) with its checkpoints on an ``emptyDir``: node-local storage, the pod's own.
  Killing rank 1 PASSes: rank 0 saves and every rank loads rank 0's checkpoint, and rank
  0's pod (its container restarted by the kubelet) keeps its emptyDir; the Job replaces
  rank 1's pod under a new name. Killing rank 0 FAILs, restarted from scratch: its
  replacement is a new pod with an empty emptyDir -- the misconfiguration a drill exists
  to catch, found by the drill and confirmed by the job's records (its first step is 1).
- The PyTorchJob runs examples/local/nanogpt-style/train.py, which prints nanoGPT's
  lines and never calls the reporter (PYTHONPATH has no reporter): ``evidence: {preset:
  nanogpt, podLogs: true}`` reads the reporting rank's pod log itself. PASS, resumed from
  the step the job's records show, with the note on what such evidence lacks; no
  RECOVERYGATE/v1 line was ever in the log.

Both jobs start together (their start overlaps) in one namespace, and are drilled as the
ServiceAccount of examples/kubernetes/rbac.yaml.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_recoverygate.shared.logevidence import LACKS
from tests.kubernetes.kube_cluster import KubeCluster
from tests.kubernetes.kube_drills import TIMES, assert_matches_truth, grant, killed_uids, run
from tests.kubernetes.kube_jobs import KubeJob
from tests.truth.truth import compute

pytestmark = [pytest.mark.kubernetes, pytest.mark.e2e, pytest.mark.kube_cluster]


@dataclass
class Jobs:
    trainjob: KubeJob
    nanogpt: KubeJob
    kubeconfig: Path


@pytest.fixture(scope="module")
def jobs(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    folder = tmp_path_factory.mktemp("k8s-jobs")
    with kube_cluster.namespace("jobs") as namespace:
        kubeconfig = grant(kube_cluster, namespace, folder)
        trainjob = KubeJob(
            kube_cluster,
            namespace,
            folder / "trainjob",
            kind="trainjob",
            name="llama-tj",
            checkpoint_volume="emptyDir",
        )
        nanogpt = KubeJob(
            kube_cluster, namespace, folder / "nanogpt", name="nano", script="nanogpt"
        )
        for job in (trainjob.submit(), nanogpt.submit()):
            job.wait_training()
            TIMES[f"{job.kind} {job.name} start"] = job.start_seconds
        yield Jobs(trainjob, nanogpt, kubeconfig)


def test_a_trainjob_that_loses_rank_1_passes_and_its_replacement_has_a_new_name(
    jobs: Jobs, tmp_path: Path
) -> None:
    job = jobs.trainjob
    victim = job.pod_of_rank(1)["metadata"]
    result = run(job, tmp_path, "trainjob-killworker", jobs.kubeconfig)
    report = result.report
    assert report["verdict"] == "PASS", result.output
    assert killed_uids(report) == [victim["uid"]]
    replacement = job.pod_of_rank(1)["metadata"]
    assert replacement["name"] != victim["name"], "JobSet's Job names a replacement anew"
    assert replacement["labels"]["batch.kubernetes.io/job-completion-index"] == "1"
    assert_matches_truth(job, result)


def test_a_job_without_the_reporter_is_judged_from_its_pod_log(jobs: Jobs, tmp_path: Path) -> None:
    job = jobs.nanogpt
    result = run(
        job,
        tmp_path,
        "podlogs-nanogpt",
        jobs.kubeconfig,
        evidence={"preset": "nanogpt", "podLogs": True},
    )
    report = result.report
    assert report["verdict"] == "PASS", result.output
    assert LACKS in report["notes"], report["notes"]
    assert_matches_truth(job, result)
    logs = "".join(job.cluster.pod_log(job.namespace, p["metadata"]["name"]) for p in job.pods())
    assert "iter " in logs and "RECOVERYGATE/v1" not in logs


def test_a_trainjob_that_loses_rank_0_with_node_local_checkpoints_fails_from_scratch(
    jobs: Jobs, tmp_path: Path
) -> None:
    job = jobs.trainjob
    result = run(
        job, tmp_path, "trainjob-emptydir-rank0", jobs.kubeconfig, failure={"targetRank": 0}
    )
    report = result.report
    assert report["verdict"] == "FAIL", result.output
    assert "RESTARTED_FROM_SCRATCH" in report["reasons"], report["summary"]
    [recovery] = report["recoveries"]
    truth = compute(job.truth_base, float(recovery["killTime"]))
    assert truth.from_scratch, truth.describe()
    assert recovery["resumeStep"] == truth.resume_step == 0
