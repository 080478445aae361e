"""The goodput projection: the model against hand-computed values and a brute-force scan.

We test these aspects:
- the useful fraction U(τ) against values worked out by hand;
- the reported optimum against a brute-force scan of the same model (within 1 %), over
  random save stalls, restart times and MTBFs (hypothesis), and against Young's formula
  where the corrections vanish;
- the default failure rate is Llama 3's, named in the output; a given rate overrides it;
- a report without the figures the projection needs is refused with what is missing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_recoverygate.engine.goodput import (
    LLAMA3_FAILURES_PER_GPU_HOUR,
    LLAMA3_SOURCE,
    Inputs,
    ProjectionError,
    format_projection,
    inputs_from_report,
    optimal_interval,
    project,
    useful_fraction,
)
from tests.patience import JOB, within


def test_the_useful_fraction_matches_values_worked_by_hand() -> None:
    # τ = 600 s, δ = 60 s, R = 300 s, M = 10 h = 36000 s:
    # 600/660 × (1 − (300 + 330)/36000) = 0.909090… × 0.9825 = 0.893181…
    assert useful_fraction(600, 60, 300, 36_000) == pytest.approx(600 / 660 * (1 - 630 / 36_000))
    assert useful_fraction(600, 60, 300, 36_000) == pytest.approx(0.8931818, abs=1e-6)
    # free checkpoints and no restart: only the half-period lost on average
    assert useful_fraction(100, 0, 0, 1000) == pytest.approx(1 - 50 / 1000)
    # a period longer than the MTBF: nothing useful
    assert useful_fraction(10_000, 10, 0, 1000) == 0.0


def test_the_optimum_has_the_closed_form_and_reduces_to_young() -> None:
    # τ* = √(2 δ (M − R)) − δ
    assert optimal_interval(60, 300, 36_000) == pytest.approx(math.sqrt(2 * 60 * 35_700) - 60)
    # with no restart and a tiny stall it approaches Young's √(2 δ M)
    young = math.sqrt(2 * 0.01 * 3_600_000)
    assert optimal_interval(0.01, 0, 3_600_000) == pytest.approx(young, rel=1e-3)


@settings(max_examples=60, deadline=None)
@given(
    stall=st.floats(0.1, 600.0),
    restart=st.floats(0.0, 1800.0),
    mtbf=st.floats(3600.0, 30 * 86_400.0),
)
def test_the_reported_optimum_is_within_one_percent_of_a_brute_force_scan(
    stall: float, restart: float, mtbf: float
) -> None:
    reported = optimal_interval(stall, restart, mtbf)
    # a geometric grid over six decades, then a fine linear scan around its best point
    coarse = [mtbf * 10 ** (-6 + 6 * k / 3000) for k in range(3001)]
    best = max(coarse, key=lambda t: useful_fraction(t, stall, restart, mtbf))
    fine = [best * (0.9 + 0.2 * k / 4000) for k in range(4001)]
    scanned = max(fine, key=lambda t: useful_fraction(t, stall, restart, mtbf))
    assert reported == pytest.approx(scanned, rel=0.01)
    assert (
        useful_fraction(reported, stall, restart, mtbf)
        >= useful_fraction(scanned, stall, restart, mtbf) - 1e-9
    )


INPUTS = Inputs(
    step_time=0.5,
    interval_seconds=600.0,
    interval_steps=1200.0,
    stall=30.0,
    stall_source="measured",
    recovery=120.0,
    recovery_source="median of 1 kill(s)",
)


def test_the_default_failure_rate_is_llama3_and_is_named() -> None:
    p = project(INPUTS, 16_384)
    assert LLAMA3_FAILURES_PER_GPU_HOUR == pytest.approx(419 / (54 * 24 * 16_384))
    assert p.mtbf_hours == pytest.approx(54 * 24 / 419)  # one interruption every ~3.09 h
    assert p.rate_source == LLAMA3_SOURCE
    text = "\n".join(format_projection(p))
    assert "Llama 3 405B" in text and "16,384 GPUs" in text
    assert any(label == "today" for _, _, label in p.table)
    assert any(label == "optimal" for _, _, label in p.table)
    assert p.optimal_goodput >= p.current_goodput


def test_a_given_rate_or_mtbf_overrides_the_default() -> None:
    assert project(INPUTS, 1024, mtbf_hours=5.0).mtbf_hours == 5.0
    p = project(INPUTS, 1000, failures_per_gpu_hour=1e-4)
    assert p.mtbf_hours == pytest.approx(10.0)
    with pytest.raises(ProjectionError, match="not both"):
        project(INPUTS, 1000, mtbf_hours=1.0, failures_per_gpu_hour=1e-4)


def test_more_gpus_means_more_failures_and_less_goodput() -> None:
    small, large = project(INPUTS, 1024), project(INPUTS, 16_384)
    assert large.mtbf_hours == pytest.approx(small.mtbf_hours / 16)
    assert large.current_goodput < small.current_goodput
    assert large.optimal_interval < small.optimal_interval


def test_a_report_without_the_needed_figures_is_refused_with_what_is_missing() -> None:
    with pytest.raises(ProjectionError, match="no 'costs' section"):
        inputs_from_report({"verdict": "PASS"})
    doc = {
        "costs": {
            "stepTimeMedianSeconds": 0.1,
            "checkpointIntervalSeconds": None,
            "saveStallMedianSeconds": None,
            "saveTimeMedianSeconds": None,
            "recoveryTimeSeconds": None,
            "missing": {
                "checkpointInterval": "fewer than two checkpoints of one process were seen",
                "saveTime": "the job reports no checkpoint_started",
            },
        }
    }
    with pytest.raises(ProjectionError) as info:
        inputs_from_report(doc)
    message = str(info.value)
    assert "the checkpoint interval (fewer than two checkpoints" in message
    assert "the save stall" in message and "checkpoint_started" in message
    assert "the recovery time" in message


def test_a_report_with_only_the_save_time_assumes_a_synchronous_save() -> None:
    doc = {
        "costs": {
            "stepTimeMedianSeconds": 0.1,
            "checkpointIntervalSeconds": 60.0,
            "checkpointIntervalSteps": 600,
            "saveStallMedianSeconds": None,
            "saveTimeMedianSeconds": 4.0,
            "recoveryTimeSeconds": {"median": 30.0, "count": 1},
            "missing": {},
        }
    }
    inputs = inputs_from_report(doc)
    assert inputs.stall == 4.0 and "assumed synchronous" in inputs.stall_source


# ------------------------------------------------------------------ the command


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", *args],
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )


def test_the_command_projects_a_real_fake_drill_report(tmp_path: Path) -> None:
    config = tmp_path / "drill.yaml"
    config.write_text(
        "workload:\n  orchestrator: fake\n  fake: {stepsPerSecond: 20, checkpointEvery: 10}\n"
        "injectFailure: {afterCheckpoint: step-20}\n"
        "expectations: {maxRecoveryTime: 30s, sustain: 3 steps}\nsafety: {requireConfirm: false}\n"
    )
    report = tmp_path / "report.json"
    run = cli("run", "-f", str(config), "--report", str(report), "-q")
    assert run.returncode == 0, run.stdout + run.stderr
    costs = json.loads(report.read_text())["costs"]
    assert costs["stepTimeMedianSeconds"] == pytest.approx(0.05, rel=0.01)
    assert costs["checkpointIntervalSteps"] == 10
    done = cli(
        "goodput",
        str(report),
        "--gpus",
        "16384",
        "--interval",
        "40steps",
        "--plot",
        str(tmp_path / "plots"),
    )
    assert done.returncode == 0, done.stderr
    assert "Goodput of this job on 16,384 GPUs" in done.stdout
    assert "Llama 3 405B" in done.stdout
    assert "← today" in done.stdout and "← asked" in done.stdout
    assert (tmp_path / "plots" / "goodput.png").stat().st_size > 1000


def test_the_command_refuses_a_report_without_the_figures_it_needs(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text(
        json.dumps(
            {
                "verdict": "ERROR",
                "costs": {
                    "stepTimeMedianSeconds": None,
                    "checkpointIntervalSeconds": None,
                    "saveStallMedianSeconds": None,
                    "saveTimeMedianSeconds": None,
                    "recoveryTimeSeconds": None,
                    "missing": {"stepTime": "fewer than two progress lines"},
                },
            }
        )
    )
    done = cli("goodput", str(report), "--gpus", "1024")
    assert done.returncode == 2
    assert (
        "lacks what the projection needs: the step time (fewer than two progress lines)"
        in done.stderr
    )
    assert "Traceback" not in done.stderr
