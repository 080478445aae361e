"""The truth corpus, third pass (issue 31), on Ray: a job reporting without a step.

We test this aspect (examples/ray/train_ray.py --no-step, Ray's torch_linear_example.py
shape): a job reporting metrics without a step, Ray registering its 4 checkpoints, ends in
ERROR saying it printed no line with a step and how to give one, with the workers' own
warning as the diagnosis' evidence (was "the job finished before the drill could kill
anything … lengthen the run"). The truth is what Ray registered, on disk.

Its own module, apart from test_truth_third_pass.py: scripts/test runs the Ray drills in a
lane of their own, beside the others, and that module's check that no job.py is left
would see the other lane's jobs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli_drill import run_cli_drill
from tests.patience import DRILL, within
from tests.truth.scenarios import Drill, scenario

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

RAY_EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ray"


#: The truth, what Ray registered on disk: its checkpoint folders (relative to the run's
#: storage), listed by the run into the drill's folder.
SAVED = "ray-checkpoints.json"


def run_ray_reporting_without_a_step(tmp_path: Path) -> Drill:
    """examples/ray/train_ray.py --no-step: Ray's torch_linear_example.py shape, metrics
    without a step; Ray registers every checkpoint, the drill sees no line with a step."""
    storage = tmp_path / "storage"
    config: dict[str, Any] = yaml.safe_load((RAY_EXAMPLES / "recovery-test.yaml").read_text())
    config["workload"]["workdir"] = str(RAY_EXAMPLES)
    config["workload"]["entrypoint"] = [
        "python",
        "train_ray.py",
        "--steps=40",
        "--ckpt-every=10",
        "--step-time=0.02",
        "--no-step",
        f"--storage={storage}",
    ]
    run = run_cli_drill(config, tmp_path / "recovery-test.yaml", timeout=within(DRILL))
    saved = sorted(
        p.relative_to(storage).as_posix() for p in storage.glob("*/step-*") if p.is_dir()
    )
    (tmp_path / SAVED).write_text(json.dumps(saved, indent=1) + "\n")
    return Drill(run.report, run.code, run.output, run.wall, tmp_path)


@scenario(
    run_ray_reporting_without_a_step,
    needs=("ray",),
    truth=(SAVED,),
    keeps_output=True,  # the diagnosis quotes the workers' own warning
    compact=False,
)
def test_a_ray_job_reporting_without_a_step_is_told_the_real_cause(drill: Drill) -> None:
    report, output = drill.report, drill.output
    why = f"\n{report.get('summary')}\n{output[-3000:]}"
    saved = json.loads((drill.root / SAVED).read_text())
    assert len(saved) == 40 // 10, f"{saved}{why}"  # 40 steps, a checkpoint every 10
    assert report["verdict"] == "ERROR" and drill.returncode == 3, why
    assert "printed no progress or checkpoint line with a step" in report["summary"], why
    assert "lengthen the run" not in report["summary"], why
    assert "diagnosis: metrics reported without a step" in output, why
    [evidence] = [line for line in output.splitlines() if line.startswith("    evidence:")]
    assert "recoverygate: ray: report() without a step" in evidence, evidence
