"""Run a real drill on a framework job and read what the job itself printed.

Like tests/truth: a ``recovery-test.yaml`` written into ``tmp_path``, ``recoverygate run``
in a subprocess (local backend, real torchrun, a real SIGKILL), then the report and the
job's own RECOVERYGATE/v1 lines from the report folder's ``output/`` -- the lines are
the job's ground truth for what it saved and loaded, digests included.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cli_drill import run_cli_drill
from tests.patience import DRILL, within

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).parent / "torchrun"
HF_TRAIN = ROOT / "examples" / "transformers" / "train.py"
LIGHTNING_TRAIN = ROOT / "examples" / "lightning" / "train.py"
DCP_JOB = Path(__file__).resolve().parent / "dcp_job.py"
SENTINEL = "RECOVERYGATE/v1 "


@dataclass
class Drill:
    report: dict[str, Any]
    returncode: int
    output: str
    wall_seconds: float
    lines: list[dict[str, Any]] = field(default_factory=list)  # the job's events, in order

    @property
    def verdict(self) -> str:
        return str(self.report.get("verdict"))

    def explain(self) -> str:
        r = self.report
        figures = {
            k: r.get(k)
            for k in (
                "verdict",
                "resumeStep",
                "expectedResumeStep",
                "loadedStep",
                "lostSteps",
                "recoveryTimeSeconds",
                "restarts",
                "inconclusive",
                "reasons",
            )
        }
        failed = [
            (c.get("name"), c.get("message")) for c in r.get("checks", []) if not c.get("passed")
        ]
        return (
            f"\nsummary: {r.get('summary')}\nfigures: {figures}\nfailed checks: {failed}"
            f"\nexit {self.returncode}, {self.wall_seconds:.1f}s\n"
            f"--- drill output (tail) ---\n{self.output[-3000:]}"
        )

    def events(self, kind: str, rank: int | None = 0) -> list[dict[str, Any]]:
        """The job's ``kind`` lines of ``rank`` (every rank prints its checkpoint lines;
        None: all ranks)."""
        return [
            e
            for e in self.lines
            if e.get("event") == kind and (rank is None or e.get("rank", 0) == rank)
        ]

    def incarnations(self, rank: int | None = 0) -> list[str]:
        seen: list[str] = []
        for e in self.lines:
            if (rank is None or e.get("rank", 0) == rank) and e.get("inc") not in seen:
                seen.append(e["inc"])
        return seen


def job_lines(report_dir: Path) -> list[dict[str, Any]]:
    """Every RECOVERYGATE/v1 event the job printed (from the kept job output), by time."""
    found: dict[tuple[str, str, float], dict[str, Any]] = {}
    for log in sorted((report_dir / "output").glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            at = line.find(SENTINEL)
            if at < 0:
                continue
            try:
                event = json.loads(line[at + len(SENTINEL) :])
            except ValueError:
                continue
            found[(event.get("inc", ""), event.get("event", ""), event.get("time", 0.0))] = event
    return sorted(found.values(), key=lambda e: e.get("time", 0.0))


def run_drill(
    tmp_path: Path,
    script: Path,
    job_args: list[str],
    *,
    after: str = "step-20",
    fault: str = "KillWorker",
    target_rank: int | None = 1,
    env: dict[str, str] | None = None,
    max_recovery: str = "90s",
    extra_expectations: dict[str, Any] | None = None,
) -> Drill:
    command = [
        str(TORCHRUN),
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=3",
        str(script),
        *job_args,
    ]
    inject: dict[str, Any] = {"type": fault, "afterCheckpoint": after}
    if target_rank is not None:
        inject["targetRank"] = target_rank
    config = {
        "name": tmp_path.name,
        "workload": {
            "orchestrator": "local",
            "command": command,
            "workdir": str(script.parent),
            "env": {
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "HF_HUB_OFFLINE": "1",
                **(env or {}),
            },
        },
        "injectFailure": inject,
        "expectations": {
            "resumeFromCheckpoint": "latest",
            "maxRecoveryTime": max_recovery,
            "maxLostSteps": 100,
            "sustain": "3 steps",  # about the integrations, not the sustain window
            **(extra_expectations or {}),
        },
        "safety": {"requireConfirm": False},
        "timeouts": {"discovery": "2m", "checkpoint": "2m", "recovery": "3m"},
    }
    report_dir = tmp_path / "report"
    run = run_cli_drill(
        config,
        tmp_path / "recovery-test.yaml",
        report_dir=report_dir,
        timeout=within(DRILL),
        env={k: v for k, v in os.environ.items() if k != "RECOVERYGATE_AUTO"},
    )
    return Drill(run.report, run.code, run.output, run.wall, job_lines(report_dir))
