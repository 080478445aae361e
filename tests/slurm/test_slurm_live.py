"""``recovery: live`` on the real Slurm test cluster: a real torchft job, one step per replica.

examples/slurm/torchft-replicas.sbatch runs a real lighthouse in the batch script and
each replica group as its own ``srun --job-name=replica-N`` step (one torchrun each,
torchft 0.2.0, gloo on CPU); examples/slurm/recovery-test-torchft.yaml drills it, run by
``run_drill`` as the CLI runs it. We test these aspects:
- PASS: the kill reaches exactly the target replica's step (rank 0 of ``replica-1``,
  identity-checked on its node), the survivor's step keeps committing, torchrun's
  restarted worker inside that step is observed and heals from the survivor;
- the survivor's step is untouched: it still runs, its process started once (one start
  line), and the step hit is the one named ``replica-1``.

One drill takes about 30-50 s here (torch's import and torchft's quorum dominate).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.machine import Verdict
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.slurm.slurm_testcluster import SlurmCluster

pytest.importorskip("torch")
pytest.importorskip("torchft")
pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.torchft]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "slurm"
PYTHON = ROOT / ".venv" / "bin" / "python"


@pytest.fixture(autouse=True)
def _slurm_conf(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm.conf)


def replica_steps(slurm: SlurmCluster, job_id: str) -> dict[str, str]:
    """step name -> step id of the job's running steps."""
    out = slurm.run("scontrol", "show", "step", "-o", job_id, check=False)
    steps: dict[str, str] = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("Name", "").startswith("replica-"):
            steps[fields["Name"]] = fields.get("StepId", "")
    return steps


def test_the_target_replica_s_step_is_hit_and_heals_from_the_survivor(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    name = f"rg-ft-{tmp_path.name}"[:60]
    job_id = slurm.submit(
        (EXAMPLES / "torchft-replicas.sbatch").read_text(),
        "-J",
        name,
        "-o",
        str(tmp_path / "%x-%j.out"),
        workdir=tmp_path,
        env={
            "RECOVERYGATE_PYTHON": str(PYTHON),
            "RECOVERYGATE_TRAIN": str(ROOT / "examples" / "local" / "torchft" / "train_ft.py"),
            "TRAIN_STEPS": "2000",
            "STEP_SECONDS": "0.05",
            "PG_TIMEOUT_SECONDS": "5",
        },
    )
    text = (EXAMPLES / "recovery-test-torchft.yaml").read_text()
    text = text.replace("jobName: rg-torchft", f"jobName: {name}")
    config = parse_config(text, EXAMPLES / "recovery-test-torchft.yaml")
    started = time.monotonic()
    result = run_drill(config, RunOptions(confirmed=True, handle_signals=False))
    seconds = time.monotonic() - started
    timeline = "\n".join(f"  {e.timestamp:.3f} {e.kind} {e.detail}" for e in result.timeline)
    explain = f"{result.verdict.value}: {result.summary}\n{timeline}"
    assert result.verdict is Verdict.PASS, explain
    steps = replica_steps(slurm, job_id)
    assert result.target is not None
    target = dict(result.target.details)
    assert target["step"] == steps["replica-1"].partition(".")[2], (target, steps)
    assert "torchrun restarted the workers inside step" in timeline, explain
    live = result.live
    assert live is not None
    assert live.rejoin_source == "peer", explain
    assert live.survivors_kept_training is True, explain
    replicas = {r.replica: r for r in live.replicas}
    # the survivor's step is untouched: one incarnation (one start line) from start to end
    assert (replicas[0].incarnations, replicas[1].incarnations) == (1, 2), replicas
    assert set(steps) == {"replica-0", "replica-1"}, steps  # both steps still run
    print(
        f"\nslurm torchft live: stall {live.survivor_stall_seconds} s, rejoin "
        f"{live.rejoin_time_seconds} s, heal step {live.rejoin_step}, drill {seconds:.1f} s"
    )
