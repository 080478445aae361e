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

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli_drill import run_cli_drill
from tests.patience import DRILL, within

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

RAY_EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ray"


def test_a_ray_job_reporting_without_a_step_is_told_the_real_cause(tmp_path: Path) -> None:
    # examples/ray/train_ray.py --no-step: Ray's torch_linear_example.py shape, metrics
    # without a step; Ray registers every checkpoint, the drill sees no line with a step.
    pytest.importorskip("ray")
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
    report, why = run.report, f"\n{run.report.get('summary')}\n{run.output[-3000:]}"
    # The truth: the checkpoints Ray registered, on disk.
    saved = [p for p in storage.glob("*/step-*") if p.is_dir()]
    assert len(saved) == 40 // 10, f"{saved}{why}"  # 40 steps, a checkpoint every 10
    assert report["verdict"] == "ERROR" and run.code == 3, why
    assert "printed no progress or checkpoint line with a step" in report["summary"], why
    assert "lengthen the run" not in report["summary"], why
    assert "diagnosis: metrics reported without a step" in run.output, why
    [evidence] = [line for line in run.output.splitlines() if line.startswith("    evidence:")]
    assert "recoverygate: ray: report() without a step" in evidence, evidence
