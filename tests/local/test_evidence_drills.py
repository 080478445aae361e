"""Real drills of a job that never calls the reporter: examples/local/nanogpt-style/.

torchrun runs train.py (2 gloo ranks on CPU), which prints only nanoGPT's lines; the
drill reads them through ``evidence: {preset: nanogpt}`` (the start-up hook matches them
in each worker) and SIGKILLs rank 1 once the checkpoint at step 20 is proven complete.
We test these aspects:
- PASS: ``init_from='resume'`` resumes from step 20, the load's step read from the
  ``step 20: train loss`` line after ``Resuming training from``;
- FAIL, restarted from scratch: the ``init_from='scratch'`` twin;
- nothing left behind, and the job's lines reach the report's output untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.engine.machine import DrillResult, FailureReason, Verdict
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.cli_drill import DRILL_SUSTAIN
from tests.local.test_local_drills import marker_env, processes_marked

pytest.importorskip("torch")
pytestmark = [pytest.mark.local, pytest.mark.e2e]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local" / "nanogpt-style"


def drill(tmp_path: Path, name: str, **overrides: Any) -> DrillResult:
    mark, env = marker_env(tmp_path)
    config = load_config(
        EXAMPLE / name, {"expectations.sustain": DRILL_SUSTAIN, **env, **overrides}
    )
    assert config.evidence is not None
    assert config.evidence.preset == "nanogpt"
    result = run_drill(config, RunOptions(confirmed=True))
    assert processes_marked(mark) == [], "the drill left processes behind"
    return result


def test_a_nanogpt_style_job_drilled_from_its_own_lines_passes(tmp_path: Path) -> None:
    result = drill(tmp_path, "recovery-test.yaml")
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == result.expected_resume_step == 20
    assert result.loaded_step == 20  # "Resuming training from" + "step 20: train loss"
    assert result.lost_steps is not None
    assert result.lost_steps <= 5


def test_its_init_from_scratch_twin_fails_restarted_from_scratch(tmp_path: Path) -> None:
    result = drill(tmp_path, "recovery-test-scratch.yaml")
    assert result.verdict is Verdict.FAIL, result.summary
    assert FailureReason.RESTARTED_FROM_SCRATCH in result.reasons, result.summary
    assert result.expected_resume_step == 20
    assert "restarted from scratch" in result.summary


def test_a_pattern_that_never_matches_is_named_in_an_inconclusive_error(tmp_path: Path) -> None:
    result = drill(
        tmp_path,
        "recovery-test.yaml",
        **{
            "evidence.patterns": {"progress": r"^epoch (?P<step>\d+) done"},
            "timeouts.checkpoint": "15s",
        },
    )
    assert result.verdict is Verdict.ERROR, result.summary
    assert "inconclusive: no line matched the progress pattern (preset nanogpt)" in result.summary
    assert "'^epoch (?P<step>\\\\d+) done'" in result.summary
