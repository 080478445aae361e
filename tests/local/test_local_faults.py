"""Every fault of the catalogue, end to end on real torchrun, with its broken twin.

We test these aspects, each with a shipped example under examples/local/faults/ run as a
user would (`recoverygate run -f …`), the job writing its own ground truth
(``RECOVERYGATE_GROUND_TRUTH``) so the figures are held to what really happened:
- KillDuringCheckpoint: an atomic save survives a kill mid-save (resume from the last
  completed checkpoint), the drill's own aim (half the measured save) into a save written
  over 3 s, held to the job's records (the killed process began the save and never
  finished it); a save straight to the final path crash-loops on the partial file (never
  came back, diagnosed ``torch-load-truncated``), its kill aimed into a save parked at the
  suite's barrier (tests/patience.py ``Hold``: no time window to hit);
- Preempt: a job that saves on SIGTERM resumes from the checkpoint it saved in the grace
  period; one that does not fails ``savedOnPreempt``;
- HangWorker: a short process-group timeout is noticed within ``maxDetectionTime``; the
  30-minute default is not, and the stopped worker is never left stopped;
- count: N kills, each at the first checkpoint after the previous recovery, all judged;
- count: untilBudgetExhausted against torchrun's --max-restarts, and a mismatched budget;
- delay: beforeNextCheckpoint (the worst case) and spread (four kills across the
  interval), per-kill lost work held to the job's own records;
- stateDigestMatches: the state digest catches an optimizer re-created and a scheduler
  never restored, while every other check passes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from pytest_recoverygate.durations import parse_duration
from pytest_recoverygate.storage.poison import sweep as sweep_poison
from tests.cli_drill import run_cli_drill
from tests.patience import DRILL, Hold, within
from tests.truth.truth import Truth, compute, load_processes

pytestmark = [pytest.mark.e2e, pytest.mark.local]

FAULTS = Path(__file__).resolve().parents[2] / "examples" / "local" / "faults"
TORCHRUN = Path(sys.executable).parent / "torchrun"


@dataclass(frozen=True)
class Run:
    report: dict[str, Any]
    code: int
    output: str
    truths: list[Truth]
    wall: float
    mark: str  # RG_E2E_MARK in the job's environment: this run's processes, exactly

    def explain(self) -> str:
        return (
            f"\nexit {self.code} in {self.wall:.1f}s\nsummary: {self.report.get('summary')}"
            f"\nreasons: {self.report.get('reasons')}\noutput tail:\n"
            + "\n".join(self.output.splitlines()[-25:])
        )


def example(name: str) -> dict[str, Any]:
    """examples/local/faults/<name> as shipped."""
    config: dict[str, Any] = yaml.safe_load((FAULTS / name).read_text())
    return config


def drill(name: str, tmp_path: Path, hold: Hold | None = None) -> Run:
    """Run examples/local/faults/<name> with ground truth on; the truth of every kill.
    With ``hold``, the job parks at that barrier (see tests/patience.py)."""
    config = yaml.safe_load((FAULTS / name).read_text())
    command = config["workload"]["command"]
    command[0] = str(TORCHRUN)
    command[:] = [str(FAULTS.parent / "train.py") if c == "../train.py" else c for c in command]
    config["workload"]["workdir"] = str(tmp_path)
    base = tmp_path / "truth"
    mark = uuid.uuid4().hex
    config["workload"].setdefault("env", {})["RECOVERYGATE_GROUND_TRUTH"] = str(base)
    config["workload"]["env"]["RG_E2E_MARK"] = mark
    if hold is not None:
        config["workload"]["env"].update(hold.env)
    # The figures docs/faults.md quotes come from the examples as shipped (their sustain).
    as_shipped = bool(os.environ.get("RECOVERYGATE_FAULT_TABLE"))
    run = run_cli_drill(
        config, tmp_path / name, timeout=within(DRILL), drill_sustain=not as_shipped
    )
    report, wall = run.report, run.wall
    kills = [r["killTime"] for r in report.get("recoveries", []) if r.get("killTime")]
    truths = [compute(base, float(kill)) for kill in kills]
    _record_for_the_docs(name, report, wall)
    return Run(report, run.code, run.output, truths, wall, mark)


def killed_in_the_save(tmp_path: Path, step: int, kill_time: float) -> bool:
    """By the job's records: rank 0's first process (the drill's one kill) recorded the
    start of the save of ``step`` last, before the kill, and no process recorded that
    checkpoint before the kill."""
    processes = load_processes(tmp_path / "truth")
    [killed] = [p for p in processes if p.rank == 0 and p.restart == 0]
    last = killed.records[-1]
    assert last.t <= kill_time, (last, kill_time)
    done = [r for p in processes for r in p.checkpoints if r.step == step and r.t <= kill_time]
    return (last.event, last.step) == ("save_started", step) and not done


def left_behind(run: Run) -> list[str]:
    """The run's processes still alive after the drill (``pid stat cmdline``), each then
    continued and killed, so that one leak fails this test and no later one."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("RG_E2E_MARK") != run.mark:
                continue
            found.append(f"{proc.pid} {proc.status()} {' '.join(proc.cmdline())}")
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _record_for_the_docs(name: str, report: dict[str, Any], wall: float) -> None:
    """With RECOVERYGATE_FAULT_TABLE=FILE, one JSON line per drill: the verdicts and
    figures docs/faults.md quotes come from a run, never typed in."""
    out = os.environ.get("RECOVERYGATE_FAULT_TABLE")
    if not out:
        return
    keys: tuple[str, ...] = ("fault", "verdict", "resumeStep", "lostSteps")
    keys += ("recoveryTimeSeconds", "restarts", "faultDetails")
    line = {
        "example": name,
        "verdict": report.get("verdict"),
        "reasons": report.get("reasons"),
        "wall": round(wall, 1),
        "recoveries": [{k: r.get(k) for k in keys} for r in report.get("recoveries", [])],
    }
    with open(out, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def assert_passes(run: Run) -> None:
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    for recovery, truth in zip(run.report["recoveries"], run.truths, strict=True):
        assert recovery["resumeStep"] == truth.resume_step, (recovery, truth.describe())
        lo, hi = recovery["lostSteps"], recovery["lostStepsUpperBound"]
        assert truth.lost_steps is not None
        assert lo <= truth.lost_steps <= (hi if hi is not None else lo), truth.describe()


# ------------------------------------------------------------------ KillDuringCheckpoint


def test_a_kill_mid_save_of_an_atomic_checkpoint_resumes_from_the_last_completed(
    tmp_path: Path,
) -> None:
    run = drill("torn-checkpoint.yaml", tmp_path)
    assert_passes(run)
    [recovery] = run.report["recoveries"]
    details = recovery["faultDetails"]
    assert details["tornStep"] == 60
    assert 0 <= details["intoSaveSeconds"] < details["saveSeconds"], details
    assert recovery["resumeStep"] == 40, run.explain()  # the torn 60 never completed
    # The job's own records: the process the drill killed began the save of 60 and never
    # finished it (its last record), and no process ever completed a checkpoint 60 first.
    assert killed_in_the_save(tmp_path, 60, recovery["killTime"]), run.explain()


def test_a_kill_mid_save_of_a_direct_save_crash_loops_and_fails(tmp_path: Path) -> None:
    with Hold(tmp_path, "save", 60) as hold:  # the save of 60 parks until the kill
        run = drill("torn-checkpoint-direct-save.yaml", tmp_path, hold)
    assert hold.killed, run.explain()  # the kill landed in the parked save
    assert run.report["recoveries"][0]["faultDetails"]["tornStep"] == 60, run.explain()
    assert run.report["verdict"] == "FAIL", run.explain()
    # The pointer names the partial file: every restart's torch.load crashes on it.
    assert run.report["reasons"][0] == "NEVER_CAME_BACK", run.explain()
    diagnoses = [d["signature"] for d in run.report.get("diagnoses", [])]
    assert "torch-load-truncated" in diagnoses, run.explain()


# ------------------------------------------------------------------ Preempt


def test_a_job_that_saves_on_sigterm_resumes_from_that_checkpoint(tmp_path: Path) -> None:
    run = drill("preempt-save-on-sigterm.yaml", tmp_path)
    assert_passes(run)
    details = run.report["recoveries"][0]["faultDetails"]
    assert details["savedStep"] is not None and details["savedUsed"] is True, details
    grace = parse_duration(example("preempt-save-on-sigterm.yaml")["injectFailure"]["gracePeriod"])
    assert 0 < details["savedAfterSeconds"] < grace, details  # saved within the grace period
    assert details["savedStep"] % 20 != 0  # saved on SIGTERM, not a regular checkpoint


def test_a_job_that_ignores_sigterm_fails_saved_on_preempt(tmp_path: Path) -> None:
    run = drill("preempt-no-save.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert run.report["reasons"] == ["NOT_SAVED_ON_PREEMPT"], run.explain()


# ------------------------------------------------------------------ HangWorker


def test_a_hang_with_a_short_collective_timeout_is_noticed_and_recovers(tmp_path: Path) -> None:
    name = "hang-with-timeout.yaml"
    run = drill(name, tmp_path)
    assert_passes(run)
    [recovery] = run.report["recoveries"]
    noticed = recovery["killTime"] + recovery["faultDetails"]["detectionSeconds"]
    # The job's records: rank 0 entered the collective that timed out after its last step
    # record, so it was noticed no sooner than the job's gloo --timeout after that, and
    # within the drill's maxDetectionTime of the kill.
    config = example(name)
    [timeout] = [
        float(c.split("=")[1]) for c in config["workload"]["command"] if c.startswith("--timeout=")
    ]
    survivor = [p for p in load_processes(tmp_path / "truth") if p.rank == 0 and p.restart == 0]
    last_step = max(r.t for r in survivor[0].steps if r.t <= noticed)
    limit = parse_duration(config["expectations"]["maxDetectionTime"])
    assert last_step + timeout <= noticed <= recovery["killTime"] + limit, run.explain()


def test_a_hang_with_the_default_timeout_is_never_noticed_and_fails(tmp_path: Path) -> None:
    run = drill("hang-default-timeout.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert "HANG_NOT_DETECTED" in run.report["reasons"], run.explain()
    assert "cleanup failed" not in str(run.report.get("summary")), run.explain()
    found = left_behind(run)
    assert not found, "left behind:\n" + "\n".join(found) + run.explain()


# ------------------------------------------------------------------ count


def test_three_kills_each_judged_each_after_the_previous_recovery(tmp_path: Path) -> None:
    run = drill("repeated-failures.yaml", tmp_path)
    assert_passes(run)
    recoveries = run.report["recoveries"]
    assert len(recoveries) == 3
    steps = [r["triggerCheckpoint"] for r in recoveries]
    assert steps == sorted(steps) and len(set(steps)) == 3


def test_the_job_survives_its_restart_budget_then_gives_up_loudly(tmp_path: Path) -> None:
    run = drill("restart-budget.yaml", tmp_path)
    assert run.report["verdict"] == "PASS", run.explain()
    assert "survived 2 kill(s) and gave up loudly on kill 3" in run.report["summary"]
    assert "launcher allows 2 restart(s)" in json.dumps(run.report["checks"])


def test_a_restart_budget_other_than_the_launchers_fails(tmp_path: Path) -> None:
    run = drill("restart-budget-mismatch.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert "RESTART_BUDGET_MISMATCH" in run.report["reasons"]


# ------------------------------------------------------------------ delay


def test_a_kill_just_before_the_next_checkpoint_loses_the_worst_case(tmp_path: Path) -> None:
    run = drill("worst-case-timing.yaml", tmp_path)
    assert_passes(run)
    [recovery] = run.report["recoveries"]
    assert 10 <= run.truths[0].lost_steps <= 20, run.truths[0].describe()  # type: ignore[operator]
    assert recovery["position"] is not None and recovery["position"] > 0.6


def test_four_kills_spread_over_the_interval_give_the_cost_distribution(tmp_path: Path) -> None:
    run = drill("failure-cost-spread.yaml", tmp_path)
    assert_passes(run)
    per_kill = run.report["costs"]["perKill"]
    assert len(per_kill) == 4
    positions = [k["position"] for k in per_kill]
    assert positions == pytest.approx([0.0, 0.25, 0.5, 0.75], abs=0.15), positions
    step = run.report["costs"]["stepTimeMedianSeconds"]
    for kill, truth in zip(per_kill, run.truths, strict=True):
        assert truth.lost_steps is not None
        true_work = truth.lost_steps * step
        # The report rounds seconds to 1 µs: the step time (times the lost steps) and the bound.
        eps = (truth.lost_steps + 1) * 1e-6
        assert kill["lostWorkSeconds"] <= true_work + eps, (kill, truth.describe())
        assert true_work <= kill["lostWorkUpperBoundSeconds"] + eps, (kill, truth.describe())
    spread = run.report["costs"]["lostWorkSeconds"]
    assert spread["count"] == 4 and spread["min"] <= spread["median"] <= spread["max"]


# ------------------------------------------------------------------ state digests


def test_matching_digests_pass(tmp_path: Path) -> None:
    run = drill("state-digest.yaml", tmp_path)
    assert_passes(run)
    assert any(c["name"] == "state_digest" and c["passed"] for c in run.report["checks"])


@pytest.mark.parametrize(
    ("name", "part"),
    [
        ("state-digest-fresh-optimizer.yaml", "optimizer"),
        ("state-digest-reset-scheduler.yaml", "scheduler"),
    ],
)
def test_a_resume_that_loses_part_of_the_state_fails_on_that_part(
    name: str,
    part: str,
    tmp_path: Path,
) -> None:
    run = drill(name, tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert run.report["reasons"] == ["STATE_DIFFERS"], run.explain()
    assert f"{part} state differs" in run.report["summary"]
    others = [c for c in run.report["checks"] if c["name"] != "state_digest"]
    assert all(c["passed"] for c in others), others  # the step came back right


# ------------------------------------------------------------------ KillDuringRecovery


def test_a_second_kill_inside_the_load_is_survived_by_an_atomic_staging(tmp_path: Path) -> None:
    run = drill("kill-during-load.yaml", tmp_path)
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    first, second = run.report["recoveries"]
    assert first["verdict"] == "INTERRUPTED", first
    assert first["faultDetails"]["secondKillPhase"] == "checkpointLoad"
    # the job's own records: the second kill landed on a rank-1 process that had begun
    # to load (started after the first kill, no "loaded" record), and the replacement
    # judged loaded the checkpoint of step 40
    processes = load_processes(tmp_path / "truth")
    cut = [
        p
        for p in processes
        if p.rank == 1 and first["killTime"] < p.started < second["killTime"] and p.loaded is None
    ]
    assert cut, [(p.rank, p.started, p.loaded) for p in processes]
    [truth] = run.truths[1:]
    assert second["resumeStep"] == truth.resume_step == 40, truth.describe()


def test_a_second_kill_inside_the_load_of_a_direct_staging_is_not_reentrant(
    tmp_path: Path,
) -> None:
    with Hold(tmp_path, "load", 40) as hold:  # the replacements' loads park until the kill
        run = drill("kill-during-load-staged-direct.yaml", tmp_path, hold)
    assert hold.killed, run.explain()  # the second kill landed in a parked load
    assert run.report["verdict"] == "FAIL", run.explain()
    assert run.report["reasons"][0] == "RECOVERY_NOT_REENTRANT", run.explain()
    second = run.report["recoveries"][1]
    # the job's own records: after the second kill, no rank-1 process ever loaded (each
    # crashed on the partial staged copy), and no process trained a step
    processes = load_processes(tmp_path / "truth")
    later = [p for p in processes if p.started > second["killTime"]]
    assert later and all(p.loaded is None and not p.steps for p in later), [
        (p.rank, p.loaded, len(p.steps)) for p in later
    ]
    assert len([p for p in later if p.rank == 1]) >= 2  # it tried again, and again


# ------------------------------------------------------------------ StickyFault, scope: step


def sticky_drill(name: str, tmp_path: Path) -> tuple[Run, dict[str, Any], list[int]]:
    """The drill, then the job's records: each rank-1 process whose last step was the
    poisoned one (50), by pid. Nothing of the drill is left: no process, no poison (a
    poison no running drill holds is what the sweep would remove)."""
    run = drill(name, tmp_path)
    details = run.report["recoveries"][0]["faultDetails"]["sticky"]
    orphans = [line for line in sweep_poison(dry_run=True).lines if "would remove" in line]
    assert not orphans, orphans
    assert not left_behind(run), left_behind(run)
    deaths = [
        p.pid
        for p in load_processes(tmp_path / "truth")
        if p.rank == 1 and p.steps and p.steps[-1].step == 50
    ]
    return run, details, deaths


def test_a_bounded_restart_budget_stops_retrying_a_poisoned_step(tmp_path: Path) -> None:
    run, details, deaths = sticky_drill("crash-loop-bounded.yaml", tmp_path)
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    assert "gave up loudly" in run.report["summary"]
    # every death the drill counted is a process of rank 1 whose last step was 50
    assert details["deaths"] == len(deaths) == 3, (details, deaths)


def test_an_unbounded_restart_budget_crash_loops_on_a_poisoned_step(tmp_path: Path) -> None:
    run, details, deaths = sticky_drill("crash-loop-unbounded.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert run.report["reasons"] == ["CRASH_LOOP"], run.explain()
    assert details["deaths"] == 4 and len(deaths) >= 4, (details, deaths)
