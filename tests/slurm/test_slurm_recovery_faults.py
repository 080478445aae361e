"""KillDuringRecovery and StickyFault on the real Slurm test cluster, each verdict held to
the job's own records.

We test these aspects, with the example recovery-test yamls under examples/slurm/ as
shipped (only the folders moved into the test's own), run as a user runs them
(``recoverygate run``); each job is submitted by the drill itself (``workload.script``:
torchrun-in-step.sbatch or torchrun-storage.sbatch, torchrun inside one Slurm step, its
workers restarted in the step), and writes its own records (``RECOVERYGATE_GROUND_TRUTH``):
- KillDuringRecovery, phase checkpointLoad: both kills through the kill step, by
  identity; the second lands while the replacement of rank 1 loads (its process started
  after the first kill and never recorded a load). Staged atomically the job resumes
  from step 40 (PASS); staged straight to the final name it crash-loops on the partial
  copy (FAIL ``RECOVERY_NOT_REENTRANT``; no process after the second kill loaded or
  trained);
- StickyFault scope step: the poison reaches the job through the environment the drill
  submits it with and shows on the node rank 1 runs on; every process the drill counted
  as a death is a rank-1 process whose last step was 50; a bounded restart budget gives
  up loudly (PASS), an unbounded one crash-loops (FAIL ``CRASH_LOOP``);
- StickyFault scope checkpoint: the trigger checkpoint's files damaged in a folder the job
  shows, then rank 1 killed: a job that verifies on load falls back to step 20 (PASS), one
  that trusts the newest loads the damaged state (FAIL ``LOADED_CORRUPT_CHECKPOINT``, by
  the digest it saved and the one it loaded); a ``path`` outside what the job shows is
  refused (ERROR) with nothing damaged;
- after every drill: no job left (squeue), no poison and no owner record in the drill's
  lock folder (the sweeps would find none), no process of the job; a drill ended by
  SIGINT with its poison armed cleans up, one SIGKILLed leaves its poison and its job to
  ``recoverygate sweep``, which removes both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.orchestrators.slurm.submit import RECORD_PREFIX
from pytest_recoverygate.orchestrators.slurm.submit import sweep as sweep_jobs
from pytest_recoverygate.storage.poison import POISON_PREFIX
from pytest_recoverygate.storage.poison import sweep as sweep_poison
from tests.cli_drill import run_cli_drill
from tests.patience import CLUSTER, DRILL, JOB, PROMPT, Hold, eventually, within
from tests.slurm.slurm_testcluster import SlurmCluster
from tests.storage_truth import left_behind, read_truth
from tests.truth.truth import Process, load_processes

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "slurm"
TRAIN = ROOT / "examples" / "local" / "train.py"
TRAIN_STORAGE = ROOT / "examples" / "local" / "storage" / "train_storage.py"


@dataclass(frozen=True)
class Drill:
    report: dict[str, Any]
    code: int
    output: str
    truth: Path  # RECOVERYGATE_GROUND_TRUTH of the job

    def explain(self) -> str:
        return (
            f"\nexit {self.code}\nsummary: {self.report.get('summary')}\nreasons: "
            f"{self.report.get('reasons')}\noutput tail:\n"
            + "\n".join(self.output.splitlines()[-25:])
        )

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        return list(self.report["recoveries"])

    def processes(self) -> list[Process]:
        """train.py's records, per process, oldest first."""
        return load_processes(self.truth)


def drill(
    cluster: SlurmCluster,
    tmp_path: Path,
    example: str,
    *,
    path: Path | None = None,
    hold: Hold | None = None,
) -> Drill:
    """Run examples/slurm/``example`` with the job's folders in ``tmp_path`` (its
    checkpoints, its records, its output) and a lock folder of the test's own; then
    check that nothing of the drill is left."""
    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / example).read_text())
    workload = spec["workload"]
    storage = workload["script"] == "torchrun-storage.sbatch"
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    mark = uuid.uuid4().hex
    workload["script"] = str(EXAMPLES / workload["script"])
    workload["workdir"] = str(tmp_path)
    workload["env"].update(
        RECOVERYGATE_TRAIN=str(TRAIN_STORAGE if storage else TRAIN),
        RECOVERYGATE_CKPT_DIR=str(folder),
        RECOVERYGATE_GROUND_TRUTH=str(tmp_path / "truth"),
        RG_E2E_MARK=mark,
        **(hold.env if hold is not None else {}),
    )
    if "path" in spec["injectFailure"]:
        spec["injectFailure"]["path"] = str(path or folder)
    env = {
        **cluster.env,
        "RECOVERYGATE_PYTHON": sys.executable,
        "RECOVERYGATE_LOCK_DIR": str(locks),
    }
    run = run_cli_drill(spec, tmp_path / example, timeout=within(DRILL), env=env)
    record_for_the_docs(example, run.report, run.wall)
    print(f"\n{example}: {run.report['verdict']} {run.report.get('reasons')} in {run.wall:.1f} s")
    name = next(a.split("=", 1)[1] for a in workload["sbatchArgs"] if a.startswith("--job-name="))
    assert cluster.run("squeue", "-h", "--name", name, check=False).strip() == "", "a job is left"
    assert not list(locks.glob(f"{POISON_PREFIX}*")), "a poison is left"
    assert not list(locks.glob(f"{RECORD_PREFIX}*")), "an owner record is left"
    orphans = sweep_poison(dry_run=True, directory=locks).lines
    orphans += sweep_jobs(dry_run=True, directory=locks).lines
    assert not orphans, orphans
    left = left_behind(mark, folder)
    assert not left, "left behind:\n" + "\n".join(left)
    return Drill(run.report, run.code, run.output, tmp_path / "truth")


def record_for_the_docs(example: str, report: dict[str, Any], wall: float) -> None:
    """With RECOVERYGATE_FAULT_TABLE=FILE, one JSON line per drill: the figures
    docs/faults.md and docs/slurm.md quote come from a run, never typed in."""
    out = os.environ.get("RECOVERYGATE_FAULT_TABLE")
    if not out:
        return
    keys = ("verdict", "resumeStep", "recoveryTimeSeconds", "restarts", "killTime")
    line = {
        "example": f"slurm/{example}",
        "verdict": report.get("verdict"),
        "reasons": report.get("reasons"),
        "wall": round(wall, 1),
        "recoveries": [
            {**{k: r.get(k) for k in keys}, "faultDetails": r.get("faultDetails")}
            for r in report.get("recoveries", [])
        ],
    }
    with open(out, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


# ------------------------------------------------------------------ KillDuringRecovery


def test_a_second_kill_inside_the_load_is_survived_by_an_atomic_staging(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run = drill(slurm, tmp_path, "recovery-test-kill-during-load.yaml")
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    first, second = run.recoveries
    assert first["verdict"] == "INTERRUPTED", first
    assert second["faultDetails"]["secondKillPhase"] == "checkpointLoad", second
    # the job's own records: the second kill landed on a rank-1 process that had started
    # after the first kill and never recorded a load; a later one loaded step 40
    processes = run.processes()
    cut = [
        p
        for p in processes
        if p.rank == 1
        and first["killTime"] < p.started < second["killTime"]
        and p.loaded is None
        and not p.steps
    ]
    assert len(cut) == 1, [(p.rank, p.pid, p.started, p.loaded) for p in processes]
    later = [p for p in processes if p.rank == 1 and p.started > second["killTime"]]
    assert later and later[0].loaded is not None and later[0].loaded.step == 40, later
    assert second["resumeStep"] == 40


def test_a_second_kill_inside_the_load_of_a_direct_staging_is_not_reentrant(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # The replacements' staged loads park after their first write until the second kill
    # (CI: without the hold, the kill step's 0.6 s let a staged copy finish first, and the
    # job rightly came back: PASS).
    with Hold(tmp_path, "load", 40) as hold:
        run = drill(slurm, tmp_path, "recovery-test-kill-during-load-direct.yaml", hold=hold)
    assert hold.killed, run.explain()  # the second kill landed in a parked load
    assert run.report["verdict"] == "FAIL" and run.code == 1, run.explain()
    assert run.report["reasons"][0] == "RECOVERY_NOT_REENTRANT", run.explain()
    second = run.recoveries[1]
    # the job's own records: after the second kill no process loaded or trained, and
    # rank 1 was started again and again (each crashed on the partial staged copy)
    later = [p for p in run.processes() if p.started > second["killTime"]]
    assert later and all(p.loaded is None and not p.steps for p in later), [
        (p.rank, p.pid, p.loaded, len(p.steps)) for p in later
    ]
    assert len([p for p in later if p.rank == 1]) >= 2


# ------------------------------------------------------------------ StickyFault, scope: step


def deaths_at_50(run: Drill) -> list[int]:
    """The rank-1 processes whose last step was the poisoned one, by pid."""
    return [p.pid for p in run.processes() if p.rank == 1 and p.steps and p.steps[-1].step == 50]


def test_a_bounded_restart_budget_stops_retrying_a_poisoned_step(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run = drill(slurm, tmp_path, "recovery-test-crash-loop-bounded.yaml")
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    assert "gave up loudly" in run.report["summary"], run.explain()
    sticky = run.recoveries[0]["faultDetails"]["sticky"]
    assert sticky["deaths"] == len(deaths_at_50(run)) == 3, (sticky, deaths_at_50(run))
    assert sticky["restarts"] == 2, sticky  # torchrun's, from the processes' start lines
    assert "state FAILED" in sticky["jobEnded"], sticky


def test_an_unbounded_restart_budget_crash_loops_on_a_poisoned_step(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run = drill(slurm, tmp_path, "recovery-test-crash-loop-unbounded.yaml")
    assert run.report["verdict"] == "FAIL" and run.code == 1, run.explain()
    assert run.report["reasons"] == ["CRASH_LOOP"], run.explain()
    sticky = run.recoveries[0]["faultDetails"]["sticky"]
    assert sticky["deaths"] == 4 and len(deaths_at_50(run)) >= 4, (sticky, deaths_at_50(run))
    assert sticky["restarts"] >= 3, sticky


# ------------------------------------------------------------------ StickyFault, scope: checkpoint


def storage_processes(run: Drill, rank: int = 0) -> list[list[dict[str, Any]]]:
    """train_storage.py's records of ``rank``, per process, oldest first."""
    return sorted(read_truth(run.truth, rank).values(), key=lambda rows: rows[0]["t"])


def steps_of(process: list[dict[str, Any]], event: str) -> list[int]:
    return [row["step"] for row in process if row["event"] == event]


def test_a_job_that_verifies_on_load_falls_back_past_the_damaged_checkpoint(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run = drill(slurm, tmp_path, "recovery-test-damaged-verify.yaml")
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    damage = run.recoveries[0]["faultDetails"]["damage"]
    assert damage["step"] == 40, damage
    files = sorted(text.split(" (", 1)[0] for text in damage["files"])
    assert files == ["step-00000040.pt", "step-00000040.pt.sha256"], damage
    later = [p for p in storage_processes(run)[1:] if steps_of(p, "step")]
    assert later, run.explain()
    assert steps_of(later[0], "rejected") == [40]  # the job saw the damage ...
    assert steps_of(later[0], "loaded") == [20] == [run.report["resumeStep"]]  # ... fell back


def test_a_job_that_trusts_a_silently_damaged_checkpoint_fails_by_its_digest(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run = drill(slurm, tmp_path, "recovery-test-damaged-trust.yaml")
    assert run.report["verdict"] == "FAIL" and run.code == 1, run.explain()
    assert run.report["reasons"][0] == "LOADED_CORRUPT_CHECKPOINT", run.explain()
    first, *later = storage_processes(run)
    [saved] = [r["digest"] for r in first if r["event"] == "reported_complete" and r["step"] == 40]
    loads = [r for p in later for r in p if r["event"] == "loaded" and r["step"] == 40]
    assert loads and all(r["digest"] != saved for r in loads), (saved, loads)


def test_a_damage_path_outside_what_the_job_shows_is_refused_with_nothing_damaged(
    slurm: SlurmCluster, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    elsewhere = tmp_path_factory.mktemp("not-the-jobs")
    planted = elsewhere / "step-00000040.pt"
    planted.write_bytes(b"\x01" * 4096)
    run = drill(slurm, tmp_path, "recovery-test-damaged-verify.yaml", path=elsewhere)
    assert run.report["verdict"] == "ERROR" and run.code == 3, run.explain()
    assert "lies outside what the job can be shown to use" in run.report["summary"]
    assert "nothing was damaged" in run.report["summary"]
    assert planted.read_bytes() == b"\x01" * 4096
    assert not any(e["kind"] == "kill" for e in run.report["timeline"]), run.explain()


# ------------------------------------------------------------------ every way out


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL"])
def test_a_drill_ended_with_its_poison_armed_leaves_nothing(
    slurm: SlurmCluster, tmp_path: Path, signal_name: str
) -> None:
    """The crash-loop drill, ended by a signal once its poison is armed: SIGINT runs its
    cleanup (exit 130: the poison removed, the job cancelled); after a SIGKILL the poison
    file, the owner record and the job stay until ``recoverygate sweep`` removes them."""
    spec: dict[str, Any] = yaml.safe_load(
        (EXAMPLES / "recovery-test-crash-loop-unbounded.yaml").read_text()
    )
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    mark = uuid.uuid4().hex
    workload = spec["workload"]
    workload["script"] = str(EXAMPLES / workload["script"])
    workload["workdir"] = str(tmp_path)
    workload["env"].update(
        RECOVERYGATE_TRAIN=str(TRAIN),
        RECOVERYGATE_CKPT_DIR=str(tmp_path / "checkpoints"),
        RG_E2E_MARK=mark,
    )
    config = tmp_path / "drill.yaml"
    config.write_text(yaml.safe_dump(spec))
    env = {**slurm.env, "RECOVERYGATE_PYTHON": sys.executable, "RECOVERYGATE_LOCK_DIR": str(locks)}
    cli = [sys.executable, "-m", "pytest_recoverygate.cli"]
    drill_proc = subprocess.Popen(
        [*cli, "run", "-f", str(config), "--yes", "-q"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def armed() -> bool:
        if list(locks.glob(f"{POISON_PREFIX}*.armed")):
            return True
        assert drill_proc.poll() is None, f"the drill ended first ({drill_proc.returncode})"
        return False

    try:
        eventually(armed, "poison armed", CLUSTER)
        [record] = locks.glob(f"{RECORD_PREFIX}*")
        job_id = json.loads(record.read_text())["jobId"]
        drill_proc.send_signal(getattr(signal, signal_name))
        code = drill_proc.wait(within(JOB))
    finally:
        if drill_proc.poll() is None:
            drill_proc.kill()
            drill_proc.wait(within(PROMPT))
    if signal_name == "SIGINT":
        assert code == 130
    else:
        assert code == -signal.SIGKILL
        assert list(locks.glob(f"{POISON_PREFIX}*.armed")), "the poison went with the drill?"
        assert slurm.job_field(job_id, "JobState") == "RUNNING"
        swept = subprocess.run(
            [*cli, "sweep"],
            env=env,
            capture_output=True,
            text=True,
            timeout=within(CLUSTER),
            check=False,
        )
        assert swept.returncode == 0, swept.stdout + swept.stderr
        assert "removed an armed poison" in swept.stdout, swept.stdout
        assert f"cancelled {job_id}; record removed" in swept.stdout, swept.stdout
    assert slurm.run("squeue", "-h", "-j", job_id, check=False).strip() == ""
    leftover = [*locks.glob(f"{POISON_PREFIX}*"), *locks.glob(f"{RECORD_PREFIX}*")]
    assert not leftover, leftover  # (a SIGKILLed drill's job lock file is no lock: no flock)
    left = left_behind(mark, tmp_path / "checkpoints")
    assert not left, "left behind:\n" + "\n".join(left)
