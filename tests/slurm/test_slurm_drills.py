"""End-to-end drills on the real Slurm test cluster with the real training script.

We test these aspects, each with the example sbatch script and recovery-test yaml a user
would copy (examples/slurm/), run by ``run_drill`` exactly as the CLI runs them:
- PASS for the torchrun-in-step layout (torchrun restarts its workers inside the step);
- PASS for the srun-loop layout (a new step in the same allocation);
- PASS for the srun-loop layout under a requeue (same job id, Restarts + 1);
- FAIL for the broken twin whose checkpoints are node-local ($SLURM_TMPDIR): the requeued
  job trains from step 0;
- FAIL when the job does not come back (torchrun with no restarts left);
- the faults that signal one rank through the kill step: Preempt (SIGTERM, SIGKILL after
  the grace period) PASSes with ``savedOnPreempt`` for a job that saves on SIGTERM and
  FAILs ``NOT_SAVED_ON_PREEMPT`` for its twin that does not; HangWorker (SIGSTOP) PASSes
  ``maxDetectionTime`` with a 5 s process-group timeout and leaves nothing stopped;
  KillDuringCheckpoint (SIGKILL mid-save) of atomic saves resumes from the last
  completed checkpoint;
- on several nodes (the default test cluster has three): a job with one torchrun per
  node PASSes from shared storage after KillNode of its second node with drainNode (the
  step fails, the job requeues itself onto the spare node, the drained node is RESUMEd),
  and FAILs "restarted from scratch" when each node checkpoints to its own $SLURM_TMPDIR.

Each drill trains a small DDP model (gloo, 2 CPU ranks) and takes 20-60 s here.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.durations import parse_duration
from pytest_recoverygate.engine.machine import DrillResult, FailureReason, Verdict
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.cli_drill import RAN, with_drill_sustain
from tests.patience import Hold
from tests.slurm.slurm_testcluster import SlurmCluster
from tests.transcripts import assert_rejudged
from tests.truth.truth import load_processes

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "slurm"
PYTHON = ROOT / ".venv" / "bin" / "python"


@pytest.fixture(autouse=True)
def _slurm_conf(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The drill finds the cluster the way a user's shell does: through SLURM_CONF."""
    monkeypatch.setenv("SLURM_CONF", slurm.conf)


def drill(
    slurm: SlurmCluster,
    tmp_path: Path,
    script: str,
    config: str,
    *,
    env: dict[str, str] | None = None,
    replace: tuple[str, str] | None = None,
) -> tuple[DrillResult, float]:
    """Submit an example job, run its example drill against it; returns (result, seconds)."""
    name = f"rg-{tmp_path.name}"[:60]
    job_env = {
        "RECOVERYGATE_PYTHON": str(PYTHON),
        "RECOVERYGATE_TRAIN": str(ROOT / "examples" / "local" / "train.py"),
        "RECOVERYGATE_CKPT_DIR": str(tmp_path / "checkpoints"),
        "STEP_TIME": "0.02",
        **(env or {}),
    }
    slurm.submit(
        (EXAMPLES / script).read_text(),
        "-J",
        name,
        "-o",
        str(tmp_path / "%x-%j.out"),
        workdir=tmp_path,
        env=job_env,
    )
    text = (EXAMPLES / config).read_text()
    text = "\n".join(
        f"  jobName: {name}" if line.strip().startswith("jobName:") else line
        for line in text.splitlines()
    )
    if replace:
        text = text.replace(*replace)
    # The drills' sustain window, by the one rule every drill helper uses.
    sustain = with_drill_sustain(yaml.safe_load(text))["expectations"].get("sustain")
    cfg = parse_config(
        text, EXAMPLES / config, {"expectations.sustain": sustain} if sustain else {}
    )
    report_dir = tmp_path / "report"  # the transcript: kept if the test fails, rejudged
    RAN.append(report_dir)
    started = time.monotonic()
    result = run_drill(cfg, RunOptions(confirmed=True, handle_signals=False, report_dir=report_dir))
    wall = time.monotonic() - started
    assert_rejudged(report_dir)  # the drill's own transcript reproduces its report
    return result, wall


def explain(result: DrillResult) -> str:
    checks = "; ".join(f"{c.name}: {c.message}" for c in result.checks)
    timeline = "\n".join(f"  {e.timestamp:.3f} {e.kind} {e.detail}" for e in result.timeline)
    return f"{result.verdict.value}: {result.summary}\n{checks}\n{timeline}"


def test_torchrun_in_step_recovers(slurm: SlurmCluster, tmp_path: Path) -> None:
    result, seconds = drill(
        slurm, tmp_path, "torchrun-in-step.sbatch", "recovery-test-torchrun.yaml"
    )
    assert result.verdict is Verdict.PASS, explain(result)
    assert result.resume_step == result.expected_resume_step
    print(
        f"\ntorchrun-in-step: recovery {result.recovery_time_seconds:.1f} s, drill {seconds:.1f} s"
    )


def test_srun_loop_recovers_with_a_new_step(slurm: SlurmCluster, tmp_path: Path) -> None:
    result, seconds = drill(
        slurm, tmp_path, "srun-loop-requeue.sbatch", "recovery-test-srun-loop.yaml"
    )
    assert result.verdict is Verdict.PASS, explain(result)
    assert any("new step" in e.detail for e in result.timeline), explain(result)
    print(
        f"\nsrun-loop (new step): recovery {result.recovery_time_seconds:.1f} s, drill {seconds:.1f} s"
    )


def test_srun_loop_recovers_from_a_requeue(slurm: SlurmCluster, tmp_path: Path) -> None:
    result, seconds = drill(
        slurm,
        tmp_path,
        "srun-loop-requeue.sbatch",
        "recovery-test-srun-loop.yaml",
        replace=("type: KillWorker", "type: Requeue"),
    )
    assert result.verdict is Verdict.PASS, explain(result)
    assert any("requeued" in e.detail for e in result.timeline), explain(result)
    print(
        f"\nsrun-loop (requeue): recovery {result.recovery_time_seconds:.1f} s, drill {seconds:.1f} s"
    )


def test_node_local_checkpoints_fail_the_drill(slurm: SlurmCluster, tmp_path: Path) -> None:
    result, _ = drill(
        slurm, tmp_path, "srun-loop-requeue-tmpdir.sbatch", "recovery-test-tmpdir.yaml"
    )
    assert result.verdict is Verdict.FAIL, explain(result)
    assert result.resume_step == 0, explain(result)
    reasons = {c.reason for c in result.checks if not c.passed}
    assert FailureReason.RESTARTED_FROM_SCRATCH in reasons, explain(result)


def test_a_job_that_does_not_come_back_fails_the_drill(slurm: SlurmCluster, tmp_path: Path) -> None:
    result, _ = drill(
        slurm,
        tmp_path,
        "torchrun-in-step.sbatch",
        "recovery-test-torchrun.yaml",
        env={"MAX_RESTARTS": "0"},
    )
    assert result.verdict is Verdict.FAIL, explain(result)
    reasons = {c.reason for c in result.checks if not c.passed}
    assert FailureReason.NEVER_CAME_BACK in reasons, explain(result)


def test_a_preempted_job_that_saves_on_sigterm_resumes_from_that_save(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    result, seconds = drill(
        slurm,
        tmp_path,
        "srun-loop-requeue.sbatch",
        "recovery-test-preempt.yaml",
        env={"TRAIN_ARGS": "--save-on-sigterm"},
    )
    assert result.verdict is Verdict.PASS, explain(result)
    [recovery] = result.recoveries
    saved = recovery.fault_details.get("savedStep")
    assert saved is not None and recovery.fault_details.get("savedUsed") is True, explain(result)
    assert saved % 20 != 0, explain(result)  # saved on SIGTERM, not a regular checkpoint
    assert result.resume_step == saved, explain(result)
    print(
        f"\npreempt (saves on SIGTERM): saved step {saved} "
        f"{recovery.fault_details.get('savedAfterSeconds')} s after the SIGTERM, recovery "
        f"{result.recovery_time_seconds:.1f} s, drill {seconds:.1f} s"
    )


def test_a_preempted_job_that_ignores_sigterm_fails_saved_on_preempt(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    result, seconds = drill(
        slurm, tmp_path, "srun-loop-requeue.sbatch", "recovery-test-preempt-no-save.yaml"
    )
    assert result.verdict is Verdict.FAIL, explain(result)
    reasons = [c.reason for c in result.checks if not c.passed]
    assert reasons == [FailureReason.NOT_SAVED_ON_PREEMPT], explain(result)
    print(f"\npreempt (no save): FAIL NOT_SAVED_ON_PREEMPT, drill {seconds:.1f} s")


def test_a_hung_rank_is_noticed_by_a_short_process_group_timeout(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    timeout, truth = 5.0, tmp_path / "truth"  # the job's gloo timeout; its own records
    result, seconds = drill(
        slurm,
        tmp_path,
        "srun-loop-requeue.sbatch",
        "recovery-test-hang.yaml",
        env={"TRAIN_ARGS": f"--timeout={timeout:g}", "RECOVERYGATE_GROUND_TRUTH": str(truth)},
    )
    assert result.verdict is Verdict.PASS, explain(result)
    [recovery] = result.recoveries
    detected = recovery.fault_details.get("detectionSeconds")
    assert detected is not None and recovery.kill_time is not None, explain(result)
    # The job's records: rank 0 entered the collective that timed out after its last step
    # record, so the hang was noticed no sooner than the gloo timeout after that, and
    # within the drill's maxDetectionTime of the SIGSTOP.
    noticed = recovery.kill_time + detected
    survivor = next(p for p in load_processes(truth) if p.rank == 0)
    last_step = max(r.t for r in survivor.steps if r.t <= noticed)
    config = yaml.safe_load((EXAMPLES / "recovery-test-hang.yaml").read_text())
    limit = parse_duration(config["expectations"]["maxDetectionTime"])
    assert last_step + timeout <= noticed <= recovery.kill_time + limit, explain(result)
    # This job's processes only (their --ckpt-dir is this test's folder): another test's
    # leftover is that test's failure, not this one's.
    ours = f"--ckpt-dir={tmp_path / 'checkpoints'}"
    stopped = [
        line
        for line in slurm.run("ps", "-eo", "stat=,args=").splitlines()
        if line.startswith("T") and "train.py" in line and ours in line
    ]
    assert not stopped, f"a training process of this job is left stopped: {stopped}"
    print(
        f"\nhang (gloo timeout 5 s): detected {detected:.1f} s after the SIGSTOP, recovery "
        f"{result.recovery_time_seconds:.1f} s, drill {seconds:.1f} s"
    )


def test_a_kill_mid_save_of_atomic_checkpoints_resumes_from_the_last_completed(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # The save of 60 parks at the suite's barrier until the kill (tests/patience.py): the
    # kill step's own latency (~0.1 s here) has no save to outrun.
    with Hold(tmp_path, "save", 60) as hold:
        result, seconds = drill(
            slurm,
            tmp_path,
            "torchrun-in-step.sbatch",
            "recovery-test-torn-checkpoint.yaml",
            env=hold.env,
        )
    assert hold.killed, explain(result)
    assert result.verdict is Verdict.PASS, explain(result)
    [recovery] = result.recoveries
    torn = recovery.fault_details.get("tornStep")
    assert torn == 60 and result.resume_step == torn - 20, explain(result)
    print(
        f"\nkill during checkpoint: torn save of step {torn} "
        f"{recovery.fault_details.get('intoSaveSeconds')} s in (save "
        f"{recovery.fault_details.get('saveSeconds')} s), resumed from {result.resume_step}, "
        f"recovery {result.recovery_time_seconds:.1f} s, drill {seconds:.1f} s"
    )


# --- two-node jobs: one torchrun per node (scripts/slurm-cluster up --nodes 3) ----------


def two_node_env(slurm: SlurmCluster) -> dict[str, str]:
    """The job environment of a two-node drill (gloo on eth0: the fixture's, on 2 nodes)."""
    if len(slurm.nodes) < 2:
        pytest.skip("needs two nodes or more (RECOVERYGATE_SLURM_NODES=3, the default)")
    return {"GLOO_SOCKET_IFNAME": slurm.env["GLOO_SOCKET_IFNAME"]}


def test_a_two_node_job_resumes_from_shared_storage_off_a_drained_node(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The two-node job, KillNode of its second node. On the default three-node cluster
    with ``drainNode: true``: the node is DRAIN, so the requeued run starts on the spare
    node and resumes from shared storage, and cleanup RESUMEs the drained node (one drill
    for both: the plain KillNode's requeue is the node-local twin's below). On two nodes
    (RECOVERYGATE_SLURM_NODES=2) the plain KillNode, requeued on the same nodes."""
    env = two_node_env(slurm)
    drain = len(slurm.nodes) >= 3
    result, seconds = drill(
        slurm,
        tmp_path,
        "two-node-torchrun.sbatch",
        "recovery-test-two-node.yaml",
        env=env,
        replace=("  targetNode: 1", "  targetNode: 1\n  drainNode: true") if drain else None,
    )
    assert result.verdict is Verdict.PASS, explain(result)
    assert result.resume_step == result.expected_resume_step
    assert any("requeued" in e.detail for e in result.timeline), explain(result)
    if not drain:
        print(f"\ntwo-node: recovery {result.recovery_time_seconds:.1f} s, drill {seconds:.1f} s")
        return
    job_id = slurm.submitted[-1]
    assert result.target is not None
    drained = result.target.node
    placed = slurm.run("scontrol", "show", "hostnames", slurm.job_field(job_id, "NodeList"))
    assert drained not in placed.split(), explain(result)
    state = slurm.run("sinfo", "-h", "-N", "-n", drained, "-o", "%T").strip()
    assert not state.startswith("drain"), f"{drained} is {state} after cleanup"
    print(
        f"\ntwo-node, KillNode + drainNode: off {drained} onto {' '.join(placed.split())}, "
        f"recovery {result.recovery_time_seconds:.1f} s, drill {seconds:.1f} s"
    )


def test_a_two_node_job_with_node_local_checkpoints_fails(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    result, seconds = drill(
        slurm,
        tmp_path,
        "two-node-torchrun-tmpdir.sbatch",
        "recovery-test-two-node-tmpdir.yaml",
        env=two_node_env(slurm),
    )
    assert result.verdict is Verdict.FAIL, explain(result)
    assert result.resume_step == 0, explain(result)
    reasons = {c.reason for c in result.checks if not c.passed}
    assert FailureReason.RESTARTED_FROM_SCRATCH in reasons, explain(result)
    print(f"\ntwo-node node-local: {result.summary}; drill {seconds:.1f} s")
