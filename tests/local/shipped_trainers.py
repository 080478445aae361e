"""Drills of trainers as they ship (torchtitan, litgpt), run as a user runs the examples.

Shared by test_torchtitan_drills.py and test_litgpt_drills.py: the example's config with
its torchrun replaced by the one of the trainer's own venv (``scripts/setup
--with-trainers``), its files made absolute, ``{tmpdir}`` put under the test's folder;
``recoverygate run`` in a subprocess; and the job's own printed losses, by step, read
back from its output with a pattern of the test's own (not the preset's).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli_drill import run_cli_drill
from tests.local.test_local_drills import processes_marked
from tests.patience import DRILL, within

__all__ = ["Drill", "check_against_printed", "printed_losses", "require_venv", "run_example"]

ROOT = Path(__file__).resolve().parents[2]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Drill:
    report: dict[str, Any]
    code: int
    output: str
    job_output: str  # what the job printed (torchrun's log in the report), colours removed


def require_venv(name: str) -> Path:
    """The trainer's own venv (``.venv-<name>``); the calling module is skipped without it."""
    venv = ROOT / f".venv-{name}"
    if not (venv / "bin" / "torchrun").exists():
        pytest.skip(
            f"{name} is not installed: scripts/setup --with-trainers makes .venv-{name}",
            allow_module_level=True,
        )
    return venv


def run_example(example: Path, name: str, venv: Path, tmp_path: Path) -> Drill:
    """Run ``example/name`` with ``venv``'s torchrun; its folders under ``tmp_path``."""
    config = yaml.safe_load((example / name).read_text())
    command = config["workload"]["command"]
    command[0] = str(venv / "bin" / "torchrun")
    command[:] = [command[0], *(_absolute(example, c, tmp_path) for c in command[1:])]
    mark = uuid.uuid4().hex
    config["workload"]["workdir"] = str(tmp_path)
    config["workload"]["env"]["RG_E2E_MARK"] = mark
    report_dir = tmp_path / "report"
    run = run_cli_drill(config, tmp_path / name, report_dir=report_dir, timeout=within(DRILL))
    assert processes_marked(mark) == [], "the drill left processes behind"
    log = report_dir / "output" / "torchrun.log"
    job_output = _ANSI.sub("", log.read_text(errors="replace")) if log.exists() else ""
    return Drill(run.report, run.code, run.output, job_output)


def _absolute(example: Path, arg: str, tmp_path: Path) -> str:
    """An argument naming a file of the example (``x.py``, ``--config=x.yaml``), made
    absolute; ``{tmpdir}`` made the test's folder."""
    key, eq, value = arg.rpartition("=")
    if (example / value).is_file():
        return f"{key}{eq}{example / value}"
    return arg.replace("{tmpdir}", str(tmp_path))


def printed_losses(text: str, step_loss: str) -> list[dict[int, str]]:
    """The losses each run printed, by step: a run ends where the step goes back."""
    runs: list[dict[int, str]] = []
    last = None
    for step_text, loss in re.findall(step_loss, text):
        step = int(step_text)
        if last is None or step <= last:
            runs.append({})
        runs[-1][step] = loss
        last = step
    return runs


def check_against_printed(
    report: dict[str, Any], killed: dict[int, str], replacement: dict[int, str]
) -> int | None:
    """Every compared value is one the job printed, and every step both runs printed is
    compared; the first step whose printed losses differ."""
    rows = report["replay"]["steps"]
    for row in rows:
        assert float(killed[row["step"]]) == row["killed"], row
        assert float(replacement[row["step"]]) == row["replacement"], row
    assert [row["step"] for row in rows] == sorted(set(killed) & set(replacement))
    return next((r["step"] for r in rows if killed[r["step"]] != replacement[r["step"]]), None)
