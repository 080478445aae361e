"""Real drills of torchtitan's own trainer, read from the lines it prints.

examples/local/torchtitan/ runs ``python -m torchtitan.train`` (torchtitan 0.3.0, the
llama3 debug model) under torchrun on CPU through titan_cpu.py, which changes only what
stops torchtitan on a CPU-only machine (its docstring says what). The job never calls the
reporter: the drill reads torchtitan's log lines through ``evidence: {preset:
torchtitan}``, SIGKILLs the worker a few steps after the save of step 10, and compares the
replayed steps (``replay: exact``). Each drill is held to what the job itself wrote: its
own printed lines (the killed run's before "Loading the checkpoint from", the
replacement's after) and its checkpoint folders. We test these aspects:

- the job as torchtitan ships it PASSes: it loads step-10, resumes at step 11 and prints,
  at every step it redoes, the loss the killed run printed;
- its twin with ``--checkpoint.exclude_from_loading=dataloader`` resumes at the same step
  but FAILs ``REPLAY_DIVERGED`` at the first step its own lines show a different loss;
- nothing is left behind.

Needs .venv-torchtitan (``scripts/setup --with-torchtitan``, which ``scripts/test`` runs).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli_drill import run_cli_drill
from tests.local.test_local_drills import processes_marked

pytestmark = [pytest.mark.e2e, pytest.mark.local]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "local" / "torchtitan"
TORCHRUN = ROOT / ".venv-torchtitan" / "bin" / "torchrun"

if not TORCHRUN.exists():
    pytest.skip(
        "torchtitan is not installed: scripts/setup --with-torchtitan makes .venv-torchtitan",
        allow_module_level=True,
    )

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+(\S+)")


def drill(name: str, tmp_path: Path) -> tuple[dict[str, Any], int, str, Path]:
    """Run the example as a user would, its folders under ``tmp_path``."""
    config = yaml.safe_load((EXAMPLE / name).read_text())
    command = config["workload"]["command"]
    command[0] = str(TORCHRUN)
    command[:] = [
        str(EXAMPLE / c) if c == "titan_cpu.py" else c.replace("{tmpdir}", str(tmp_path))
        for c in command
    ]
    mark = uuid.uuid4().hex
    config["workload"]["workdir"] = str(tmp_path)
    config["workload"]["env"]["RG_E2E_MARK"] = mark
    run = run_cli_drill(config, tmp_path / name, report_dir=tmp_path / "report", timeout=900)
    assert processes_marked(mark) == [], "the drill left processes behind"
    return run.report, run.code, run.output, tmp_path


def own_lines(report_dir: Path) -> tuple[dict[int, str], dict[int, str]]:
    """The losses the job printed, by step: the killed run's and the replacement's.

    One worker: torchrun's output holds the killed run's lines, then the replacement's,
    which begin with its "Loading the checkpoint from" line.
    """
    text = _ANSI.sub("", (report_dir / "output" / "torchrun.log").read_text(errors="replace"))
    before, loading, after = text.partition("Loading the checkpoint from")
    assert loading, "the replacement loaded no checkpoint"
    killed = {int(s): loss for s, loss in _STEP.findall(before)}
    replacement = {int(s): loss for s, loss in _STEP.findall(after)}
    return killed, replacement


def check_against_own_lines(report: dict[str, Any], tmp: Path) -> int | None:
    """Every compared value is one the job printed; the first step its lines differ."""
    killed, replacement = own_lines(tmp / "report")
    assert min(replacement) == report["resumeStep"] + 1
    rows = report["replay"]["steps"]
    for row in rows:
        assert float(killed[row["step"]]) == row["killed"], row
        assert float(replacement[row["step"]]) == row["replacement"], row
    assert [row["step"] for row in rows] == sorted(set(killed) & set(replacement))
    return next((r["step"] for r in rows if killed[r["step"]] != replacement[r["step"]]), None)


def test_torchtitan_as_it_ships_resumes_and_replays_its_losses(tmp_path: Path) -> None:
    report, code, output, tmp = drill("recovery-test.yaml", tmp_path)
    assert code == 0, (report.get("summary"), output[-3000:])
    assert report["resumeStep"] == report["expectedResumeStep"] == 10
    assert report["loadedStep"] == 10  # "Loading the checkpoint from …/step-10."
    assert (tmp / "titan" / "out" / "checkpoint" / "step-10").is_dir()  # the job's own save
    replay = report["replay"]
    assert replay["mode"] == "exact"
    assert replay["stepsCompared"] >= 2, replay
    assert replay["firstDivergentStep"] is None
    assert check_against_own_lines(report, tmp) is None


def test_its_twin_that_leaves_the_data_loader_out_fails_replay_diverged(tmp_path: Path) -> None:
    report, code, output, tmp = drill("recovery-test-forget-data.yaml", tmp_path)
    assert code == 1, (report.get("summary"), output[-3000:])
    assert report["reasons"] == ["REPLAY_DIVERGED"], report["summary"]
    assert report["resumeStep"] == 10  # the step number shows nothing wrong
    first = report["replay"]["firstDivergentStep"]
    assert first is not None
    assert first == check_against_own_lines(report, tmp)
    assert f"replay diverged at step {first}" in report["summary"]
