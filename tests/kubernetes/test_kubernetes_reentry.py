"""KillDuringRecovery on Kubernetes: the target's pod deleted, then the pod that replaced
it deleted again, inside the recovery the first DELETE caused.

- On the fake API server (its controller recreates a deleted pod; the group's
  rendezvous played as 1 s): ``phase: rendezvous``. The second DELETE reaches rank 1's
  replacement pod (a new uid) once it runs, while the group re-forms: the job's own
  record shows no incarnation between the two kills. It comes back from its latest
  checkpoint: PASS, the first recovery INTERRUPTED.
- On the real cluster (scripts/kube-cluster): the PyTorchJob of
  examples/kubernetes/pytorchjob-kube-cluster.yaml, each rank copying the checkpoint to
  a staging folder of its own before it loads it (as from an object store, 2 s a copy;
  a host folder that outlives the pod, as a node's local disk would), ``phase:
  checkpointLoad``: the second DELETE lands as the reporting rank begins to load. The job
  that stages to a temporary name and renames it (``--stage-mode atomic``) PASSes,
  resumed from the step its records show, after a rank-1 process the second kill cut
  while it loaded. Its twin that stages straight to the final name (``direct``) FAILs
  ``RECOVERY_NOT_REENTRANT``: by its records, no process loaded or trained after the
  second kill (each rank 1 crashed on the partial copy, and its container restarted).
  Each job in a namespace of its own (the twin breaks its job for good), drilled as the
  ServiceAccount of examples/kubernetes/rbac.yaml.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.verdict import Verdict
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.kubernetes.fake_cluster import FakeTrainingJob, job_drill_yaml
from tests.kubernetes.kube_cluster import KubeCluster
from tests.kubernetes.kube_drills import TIMES, grant, killed_uids, run
from tests.kubernetes.kube_jobs import KubeJob
from tests.truth.truth import compute, load_processes

pytestmark = [pytest.mark.kubernetes]

MakeJob = Callable[..., FakeTrainingJob]


def test_a_second_delete_in_the_rendezvous_reaches_the_replacement_pod_and_the_job_comes_back(
    apiserver: FakeApiServer, make_job: MakeJob, kubeconfig: Path, tmp_path: Path
) -> None:
    job = make_job(nodes=2, step_time=0.05, checkpoint_every=20, rendezvous_time=1.0)
    job.start(wait_for_checkpoint=20)
    victim = job.pod(1)["metadata"]["uid"]
    text = job_drill_yaml(
        job,
        kubeconfig,
        name="k8s-reentry",
        max_recovery="20s",
        fault="KillDuringRecovery",
        failure={"phase": "rendezvous"},
    )
    path = tmp_path / "recovery-test.yaml"
    path.write_text(text)

    result = run_drill(parse_config(text, path), RunOptions(handle_signals=False))

    where = f"{result.verdict.value}: {result.summary}"
    assert result.verdict is Verdict.PASS, where
    interrupted, judged = result.recoveries
    assert interrupted.verdict is Verdict.INTERRUPTED, where
    assert interrupted.fault_details["secondKillPhase"] == "rendezvous"
    assert interrupted.fault_details["phaseSign"] == "group: replacement_running"
    # two DELETEs acted: the discovered pod of rank 1, then the pod that replaced it
    targets = [r.target_uid for r in apiserver.deletes(acted_only=True)]
    assert len(targets) == 2 and targets[0] == victim, targets
    assert targets[1] != victim and job.uids.get(targets[1] or "") == 1, targets
    # the job's own record: no incarnation between the kills (the rendezvous was cut);
    # the one after them resumed from the step the drill says
    first, last = job.incarnations
    assert judged.resume_step == job.resumed[last] == judged.expected_resume_step, where
    assert judged.verdict is Verdict.PASS and first not in job.resumed


# ------------------------------------------------------------------ the real cluster

# A copy takes 2 s: long enough for the second DELETE (it lands 5-11 ms after the sign),
# short of the job's collective timeout (--timeout=10). After the second kill rank 0
# reuses its finished copy at once while rank 1 stages again, and waits for it in the
# broadcast of the loaded step: a copy slower than that timeout (6 s ones, on a machine
# running about 2x slow in CI) failed both ranks again and again, and the Job's pods
# fell out of step in CrashLoopBackOff: a FAIL the drill read rightly, of a job
# configured wrongly for that load.
STAGED = ["--stage-dir=/checkpoints/stage", "--stage-seconds=2"]


def staged_job(cluster: KubeCluster, folder: Path, mode: str) -> Iterator[tuple[KubeJob, Path]]:
    """The PyTorchJob staging its loads (``--stage-mode mode``), training, with the
    kubeconfig of rbac.yaml's account; its namespace deleted afterwards."""
    with cluster.namespace(f"reentry-{mode}") as namespace:
        kubeconfig = grant(cluster, namespace, folder)
        job = KubeJob(
            cluster, namespace, folder / "job", name=f"staged-{mode}",
            extra_args=[*STAGED, f"--stage-mode={mode}"],
        )  # fmt: skip
        job.start()
        TIMES[f"PyTorchJob staged-{mode} start"] = job.start_seconds
        yield job, kubeconfig


@pytest.fixture(scope="module")
def atomic_job(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[KubeJob, Path]]:
    yield from staged_job(kube_cluster, tmp_path_factory.mktemp("k8s-atomic"), "atomic")


@pytest.fixture(scope="module")
def direct_job(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[KubeJob, Path]]:
    yield from staged_job(kube_cluster, tmp_path_factory.mktemp("k8s-direct"), "direct")


def drill_in_load(job: KubeJob, kubeconfig: Path, tmp_path: Path, name: str) -> Any:
    victim = job.pod_of_rank(1)["metadata"]["uid"]
    result = run(
        job,
        tmp_path,
        name,
        kubeconfig,
        fault="KillDuringRecovery",
        failure={"phase": "checkpointLoad"},
    )
    uids = killed_uids(result.report)
    assert len(uids) == 2 and uids[0] == victim and uids[1] != victim, result.output
    return result


@pytest.mark.e2e
def test_a_second_delete_inside_the_load_is_survived_by_an_atomic_staging(
    atomic_job: tuple[KubeJob, Path], tmp_path: Path
) -> None:
    job, kubeconfig = atomic_job
    result = drill_in_load(job, kubeconfig, tmp_path, "k8s-kill-during-load")
    report = result.report
    assert report["verdict"] == "PASS", result.output
    first, second = report["recoveries"]
    assert first["verdict"] == "INTERRUPTED", first
    assert first["faultDetails"]["secondKillPhase"] == "checkpointLoad", first
    # the job's own records: a rank-1 process that passed the rendezvous after the first
    # kill never loaded (the second kill cut its load), and the recovery judged resumed
    # from the step the job's ranks loaded
    cut = [
        p
        for p in load_processes(job.truth_base)
        if p.rank == 1 and first["killTime"] < p.started < second["killTime"] and p.loaded is None
    ]
    assert cut, [(p.rank, p.started, p.loaded) for p in load_processes(job.truth_base)]
    truth = compute(job.truth_base, float(second["killTime"]))
    assert second["resumeStep"] == truth.resume_step, (second, truth.describe())
    assert truth.resume_step is not None and truth.resume_step >= first["triggerCheckpoint"]
    # lost steps (maxLostSteps is set): the job's records lie within the drill's bounds
    assert truth.lost_steps is not None, truth.describe()
    low, high = second["lostSteps"], second["lostStepsUpperBound"]
    assert low <= truth.lost_steps, (second, truth.describe())
    trained_between = [
        r.step
        for p in load_processes(job.truth_base)
        for r in p.steps
        if first["killTime"] < r.t <= second["killTime"]
    ]
    if trained_between and truth.lost_steps > (high if high is not None else low):
        # Open (issue 43): the rank-0 pod trained on for the 0.3 s the first DELETE took
        # to reach its peer (its lines stamped after the first kill's time); those lines
        # bound the *first* kill's "last step before" and wrongly the second's too, so the
        # drill's upper bound lies under the job's records (lost 10-11 said, 15 done).
        pytest.xfail(f"steps {trained_between[:3]}... between the kills: bound under truth")
    assert truth.lost_steps <= (high if high is not None else low), (second, truth.describe())


@pytest.mark.e2e
def test_a_second_delete_inside_the_load_of_a_direct_staging_is_not_reentrant(
    direct_job: tuple[KubeJob, Path], tmp_path: Path
) -> None:
    job, kubeconfig = direct_job
    result = drill_in_load(job, kubeconfig, tmp_path, "k8s-kill-during-load-direct")
    report = result.report
    assert report["verdict"] == "FAIL", result.output
    assert report["reasons"][0] == "RECOVERY_NOT_REENTRANT", result.output
    second = report["recoveries"][1]
    # the job's own records: the job tried again after the second kill (a group passed
    # the rendezvous), and no process loaded or trained after it
    later = [p for p in load_processes(job.truth_base) if p.started > second["killTime"]]
    assert later, [(p.rank, p.started) for p in load_processes(job.truth_base)]
    assert all(p.loaded is None and not p.steps for p in later), [
        (p.rank, p.loaded, len(p.steps)) for p in later
    ]
