"""Real drills on this machine: torchrun, 2 gloo ranks on CPU, a real SIGKILL of rank 1.

Every test here starts the example job (examples/local/train.py) under torchrun, so each
costs 10-20 s on two cores. We test these aspects:
- the verdicts: PASS; FAIL from scratch (node-local checkpoints); FAIL on an older
  checkpoint; FAIL on a recovery slower than maxRecoveryTime; a prompt FAIL when torchrun
  may not restart (--max-restarts=0);
- accuracy against the ground truth the training script records itself;
- safety: --dry-run kills nothing; SIGINT and SIGTERM mid-drill exit 130 with no process
  left (orphans included); requireConfirm without a terminal refuses before starting;
- the pytest entry: ``pytest --drill-config=examples/local/recovery-test.yaml --junitxml``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import psutil
import pytest

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.durations import parse_duration
from pytest_recoverygate.engine.machine import DrillResult, FailureReason, Verdict
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.cli_drill import DRILL_SUSTAIN
from tests.patience import CLUSTER, JOB, eventually, within

pytest.importorskip("torch")
pytestmark = [pytest.mark.local, pytest.mark.e2e]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "local"
PASSING = EXAMPLES / "recovery-test.yaml"
NODE_LOCAL = EXAMPLES / "recovery-test-node-local.yaml"
BASE_COMMAND = [
    "torchrun",
    "--standalone",
    "--nproc-per-node=2",
    "--max-restarts=3",
    "train.py",
    "--ckpt-dir={tmpdir}/checkpoints",
    "--ckpt-every=20",
    "--step-time=0.02",
]
# Trigger earlier than the example (step 40, not 100): the same drill, 1-2 s shorter.
FAST = {"injectFailure.afterCheckpoint": "step-40", "expectations.sustain": DRILL_SUSTAIN}


def marker_env(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A unique env marker (to find every process the drill started) and ground truth."""
    mark = uuid.uuid4().hex
    env = {
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "RG_E2E_MARK": mark,
        "RECOVERYGATE_GROUND_TRUTH": str(tmp_path / "truth"),
    }
    return mark, {"workload.env": env}


def processes_marked(mark: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("RG_E2E_MARK") == mark:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def truth_rows(tmp_path: Path, rank: int) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(tmp_path.glob(f"truth.{rank}.*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(rows, key=lambda r: r["t"])


def drill(tmp_path: Path, config: Path = PASSING, **overrides: Any) -> tuple[DrillResult, str]:
    mark, env = marker_env(tmp_path)
    loaded = load_config(config, {**FAST, **env, **overrides})
    result = run_drill(loaded, RunOptions(confirmed=True))
    assert processes_marked(mark) == [], "the drill left processes behind"
    return result, mark


def test_a_job_with_shared_checkpoints_passes_and_the_figures_match_ground_truth(
    tmp_path: Path,
) -> None:
    result, _ = drill(tmp_path)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.target is not None
    assert result.target.rank == 1
    assert result.resume_step == result.expected_resume_step == 40
    assert result.restarts is not None
    assert result.restarts >= 1
    assert result.kill_time is not None
    assert result.recovery_time_seconds is not None
    # Ground truth, from rank 0's own per-step records: the first step after the resume.
    rows = truth_rows(tmp_path, 0)
    restarted = [r for r in rows if r["restart"] > 0 and r["event"] == "step"]
    assert restarted, "rank 0 never trained after the restart"
    # The job records each step just before it prints its progress line, so the first step
    # the replacement printed lies between its record and the record of the next step.
    # (The report rounds to 1 µs.)
    first, following = restarted[0]["t"] - 1e-6, restarted[1]["t"] + 1e-6
    reported = result.kill_time + result.recovery_time_seconds
    assert first <= reported < following, (first, reported, following)
    before = [r["step"] for r in rows if r["t"] <= result.kill_time and r["event"] == "step"]
    assert result.lost_steps is not None
    assert abs(result.lost_steps - (max(before) - 40)) <= 1
    # Every recovery phase the local backend can see was seen.
    for phase in (
        "failureDetected",
        "replacementScheduled",
        "replacementRunning",
        "processStarted",
        "checkpointLoaded",
        "firstStepAfterResume",
    ):
        assert result.breakdown[phase] is not None, phase


def test_node_local_checkpoints_fail_as_a_restart_from_scratch(tmp_path: Path) -> None:
    result, _ = drill(tmp_path, NODE_LOCAL)
    assert result.verdict is Verdict.FAIL
    assert result.reasons[0] is FailureReason.RESTARTED_FROM_SCRATCH
    assert "resumed from step 0, expected step 40" in result.summary


def test_a_job_that_loads_the_previous_checkpoint_fails_as_older(tmp_path: Path) -> None:
    command = [*BASE_COMMAND, "--resume=previous"]
    result, _ = drill(tmp_path, PASSING, **{"workload.command": command})
    assert result.verdict is Verdict.FAIL
    assert result.reasons[0] is FailureReason.RESUMED_FROM_OLDER_CHECKPOINT
    assert result.resume_step == 20


def test_a_recovery_slower_than_the_slo_fails(tmp_path: Path) -> None:
    result, _ = drill(tmp_path, PASSING, **{"expectations.maxRecoveryTime": "500ms"})
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (FailureReason.TOO_SLOW,)
    assert result.recovery_time_seconds is not None
    assert result.recovery_time_seconds > 0.5


def test_a_job_that_may_not_restart_fails_promptly(tmp_path: Path) -> None:
    command = [c if c != "--max-restarts=3" else "--max-restarts=0" for c in BASE_COMMAND]
    limit = "2m"
    result, _ = drill(
        tmp_path, PASSING, **{"workload.command": command, "expectations.maxRecoveryTime": limit}
    )
    assert result.verdict is Verdict.FAIL
    assert result.reasons[0] is FailureReason.NEVER_CAME_BACK
    assert result.kill_time is not None
    assert result.finished_at is not None
    # Prompt: the agent's exit ends the drill, not maxRecoveryTime running out.
    assert result.finished_at - result.kill_time < parse_duration(limit)
    assert "ChildFailedError" in result.summary or "exit" in result.summary


def test_a_dry_run_kills_nothing(tmp_path: Path) -> None:
    mark, env = marker_env(tmp_path)
    loaded = load_config(PASSING, {**FAST, **env, "safety.requireConfirm": True})
    result = run_drill(loaded, RunOptions(dry_run=True))
    assert result.verdict is Verdict.DRY_RUN
    assert processes_marked(mark) == []
    kinds = {entry.kind for entry in result.timeline}
    assert "kill" not in kinds
    assert "group:worker_gone" not in kinds
    # Rank 1 ran as one process from start to end: no incarnation was killed.
    assert len({r["pid"] for r in truth_rows(tmp_path, 1)}) == 1


def cli(*args: str, env_marker: str | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest_recoverygate.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def write_config(tmp_path: Path, **changes: Any) -> tuple[Path, str]:
    """A copy of the passing example with changes, next to train.py's folder (workdir)."""
    import yaml

    mark = uuid.uuid4().hex
    data = yaml.safe_load(PASSING.read_text())
    data["workload"]["workdir"] = str(EXAMPLES)
    data["workload"]["env"]["RG_E2E_MARK"] = mark
    data["expectations"].setdefault("sustain", DRILL_SUSTAIN)
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    path = tmp_path / "drill.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, mark


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_drill_exits_130_with_no_process_left(
    tmp_path: Path,
    sig: signal.Signals,
) -> None:
    path, mark = write_config(tmp_path, **{"injectFailure.afterCheckpoint": "step-100000"})
    proc = cli("run", "-f", str(path))
    eventually(lambda: len(processes_marked(mark)) >= 3, "the agent and both workers", JOB)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=within(JOB))
    assert proc.returncode == 130, err
    assert processes_marked(mark) == []


def test_require_confirm_without_a_terminal_refuses_before_starting_the_job(
    tmp_path: Path,
) -> None:
    path, mark = write_config(tmp_path, **{"safety.requireConfirm": True})
    proc = cli("run", "-f", str(path))
    _, err = proc.communicate(timeout=within(JOB))
    assert proc.returncode == 2
    assert "--yes" in err
    assert processes_marked(mark) == []


def test_pytest_runs_the_example_drill_and_writes_junit(pytester: pytest.Pytester) -> None:
    out = pytester.path / "out.xml"
    result = pytester.runpytest_subprocess(
        f"--drill-config={PASSING}",
        f"--junitxml={out}",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=1)
    props = {p.get("name"): p.get("value") for p in ET.parse(out).getroot().iter("property")}
    verdicts = [v for k, v in props.items() if k and k.endswith(".verdict")]
    assert verdicts == ["PASS"]
    assert [v for k, v in props.items() if k and k.endswith(".resumeStep")] == ["100"]


def test_environment_is_not_leaked_into_the_report(tmp_path: Path) -> None:
    secret = "s3cr3t-" + uuid.uuid4().hex
    path, _ = write_config(
        tmp_path,
        **{"workload.env.RG_SECRET_TOKEN": secret, "injectFailure.afterCheckpoint": "step-40"},
    )
    proc = cli("run", "-f", str(path), "--report-dir", str(tmp_path / "r"), "-q")
    out, err = proc.communicate(timeout=within(CLUSTER))
    assert proc.returncode == 0, out + err
    assert secret not in out + err
    for file in (tmp_path / "r").iterdir():
        if file.suffix in (".json", ".jsonl", ".md", ".svg"):
            assert secret not in file.read_text(errors="replace"), file.name
    os.environ.pop("RG_SECRET_TOKEN", None)
