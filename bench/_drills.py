"""Real local drills of examples/local for the accuracy and overhead benchmarks.

One drill: ``examples/local/recovery-test.yaml`` through the runner (real torchrun, two
CPU ranks, one SIGKILL), with ``RECOVERYGATE_GROUND_TRUTH`` set so ``train.py`` records
every rank's steps itself, and the report written to a temporary folder. The backend is
wrapped only to note *when* the runner calls ``cleanup()``: that is the moment the
verdict was reached (the runner cleans up right after the engine's Finish), which the
report cannot say (its ``finishedAt`` is the deciding event's own timestamp).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import ROOT

EXAMPLE = ROOT / "examples" / "local" / "recovery-test.yaml"


class _Timed:
    """The real backend, with the time of the first cleanup() call noted."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.name = inner.name
        self.cleanup_called: float | None = None

    def discover(self, deadline: float) -> Any:
        return self._inner.discover(deadline)

    def kill(self, worker: Any, *, dry_run: bool, fault: Any = None) -> Any:
        if fault is None:
            return self._inner.kill(worker, dry_run=dry_run)
        return self._inner.kill(worker, dry_run=dry_run, fault=fault)

    def current_worker(self, rank: int) -> Any:
        return self._inner.current_worker(rank)

    def watch_group(self) -> Any:
        return self._inner.watch_group()

    def events(self) -> Any:
        return self._inner.events()

    def cleanup(self) -> None:
        if self.cleanup_called is None:
            self.cleanup_called = time.time()
        self._inner.cleanup()


@dataclass
class DrillOutcome:
    """One drill's report figures next to the ground truth train.py recorded."""

    verdict: str
    wall_s: float
    kill_time: float
    reported_recovery: float | None
    true_recovery: float | None
    reported_resume: int | None
    true_resume: int | None
    reported_lost: int | None
    reported_lost_bound: int | None
    true_lost: int | None
    victim_last_step: int | None
    victim_last_beat: float | None
    verdict_latency: float | None
    summary: str

    @property
    def recovery_error_ms(self) -> float | None:
        if self.reported_recovery is None or self.true_recovery is None:
            return None
        return abs(self.reported_recovery - self.true_recovery) * 1e3

    @property
    def lost_error(self) -> int | None:
        if self.reported_lost is None or self.true_lost is None:
            return None
        return abs(self.reported_lost - self.true_lost)


def _records(base: Path) -> list[dict[str, Any]]:
    rows = []
    for path in base.parent.glob(base.name + ".*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def ground_truth(
    rows: list[dict[str, Any]], kill_time: float, target_rank: int = 1, reporting_rank: int = 0
) -> dict[str, Any]:
    """What really happened, from train.py's per-step records around the kill."""
    old = [r for r in rows if r["t"] <= kill_time]
    old_restart = max((r["restart"] for r in old), default=0)
    victim_steps = [
        r
        for r in old
        if r["rank"] == target_rank and r["event"] == "step" and r["restart"] == old_restart
    ]
    victim_last = max(victim_steps, key=lambda r: r["t"]) if victim_steps else None
    new = [r for r in rows if r["restart"] > old_restart and r["rank"] == reporting_rank]
    # the generation that trained again (a restart that failed before training has no steps)
    trained = sorted({r["restart"] for r in new if r["event"] == "step"})
    resume = first = None
    if trained:
        gen = [r for r in new if r["restart"] == trained[0]]
        loaded = [r for r in gen if r["event"] == "loaded"]
        resume = loaded[0]["step"] if loaded else None
        after = sorted(
            (r for r in gen if r["event"] == "step" and resume is not None and r["step"] > resume),
            key=lambda r: r["t"],
        )
        first = after[0]["t"] if after else None
    return {
        "victim_last_step": victim_last["step"] if victim_last else None,
        "victim_last_beat": victim_last["t"] if victim_last else None,
        "resume": resume,
        "recovery": None if first is None else first - kill_time,
        "lost": None
        if victim_last is None or resume is None
        else max(0, victim_last["step"] - resume),
    }


def run_local_drill(config_path: Path = EXAMPLE) -> DrillOutcome:
    """Run one real drill and compare its report with train.py's ground truth."""
    from pytest_recoverygate.config.loading import load_config
    from pytest_recoverygate.orchestrators import build_orchestrator
    from pytest_recoverygate.registry.seams import RealClock
    from pytest_recoverygate.runner import RunOptions, run_drill

    with tempfile.TemporaryDirectory(prefix="rg-bench-drill-") as tmp_name:
        tmp = Path(tmp_name)
        base = tmp / "truth"
        previous = os.environ.get("RECOVERYGATE_GROUND_TRUTH")
        os.environ["RECOVERYGATE_GROUND_TRUTH"] = str(base)
        try:
            config = load_config(config_path)
            clock = RealClock()
            backend = _Timed(build_orchestrator(config, clock))
            report_path = tmp / "report.json"
            started = time.monotonic()
            run_drill(
                config,
                RunOptions(confirmed=True, handle_signals=False, report_path=report_path),
                clock=clock,
                orchestrator=backend,
            )
            wall = time.monotonic() - started
        finally:
            if previous is None:
                os.environ.pop("RECOVERYGATE_GROUND_TRUTH", None)
            else:
                os.environ["RECOVERYGATE_GROUND_TRUTH"] = previous
        report = json.loads(report_path.read_text())
        rows = _records(base)
    kill = report["killTime"]
    truth = ground_truth(rows, kill) if kill is not None else {}
    deciding = None
    if kill is not None and (report.get("breakdown") or {}).get("firstStepAfterResume") is not None:
        deciding = kill + report["breakdown"]["firstStepAfterResume"]
    latency = (
        backend.cleanup_called - deciding
        if deciding is not None and backend.cleanup_called is not None
        else None
    )
    return DrillOutcome(
        verdict=str(report["verdict"]),
        wall_s=wall,
        kill_time=kill,
        reported_recovery=report.get("recoveryTimeSeconds"),
        true_recovery=truth.get("recovery"),
        reported_resume=report.get("resumeStep"),
        true_resume=truth.get("resume"),
        reported_lost=report.get("lostSteps"),
        reported_lost_bound=report.get("lostStepsUpperBound"),
        true_lost=truth.get("lost"),
        victim_last_step=truth.get("victim_last_step"),
        victim_last_beat=truth.get("victim_last_beat"),
        verdict_latency=latency,
        summary=str(report.get("summary")),
    )
