"""StorageFault end to end: real torchrun jobs whose checkpoint folder fails, each verdict
held to the job's own records.

We test these aspects, each with a shipped example under examples/local/storage/ run as a
user would (``recoverygate run -f …``), the job (train_storage.py) writing its own
ground truth (``RECOVERYGATE_GROUND_TRUTH``: every save started, failed with its error,
durable, reported complete, every checkpoint it removed, the step it loaded):
- enospc, eio and readonly against the atomic saver: the save fails, the job says so and
  fails loudly, the replacement resumes from the newest durable checkpoint (PASS); the
  same saver told to skip trains on (PASS);
- the savers that get it wrong: a writer thread that reports a failed save complete and
  a ``latest`` link moved to a save that then failed (``SAVE_FAILURE_SWALLOWED``),
  retention that removes the last checkpoint first (``LAST_GOOD_CHECKPOINT_DELETED``);
- stall: behind a barrier without a timeout (``STALLED_ON_STORAGE`` at maxStall), with a
  timeout (PASS), and a stall shorter than maxStall (PASS);
- during: load with latency: within the SLO (PASS), against a tighter one (``TOO_SLOW``,
  the checkpointLoaded phase named);
- after every drill: no mount, no layer process, no owner record, no process of the job.
"""

from __future__ import annotations

import hashlib
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.durations import parse_duration
from tests.cli_drill import run_cli_drill
from tests.patience import DRILL, PROMPT, within
from tests.storage_truth import Run, left_behind, read_truth, record_for_the_docs

pytestmark = [pytest.mark.e2e, pytest.mark.local]

STORAGE = Path(__file__).resolve().parents[2] / "examples" / "local" / "storage"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def drill(name: str, tmp_path: Path) -> Run:
    """Run examples/local/storage/<name> on a fresh checkpoint folder, ground truth on."""
    config = yaml.safe_load((STORAGE / name).read_text())
    command = config["workload"]["command"]
    command[0] = str(TORCHRUN)
    command[:] = [str(STORAGE / c) if c == "train_storage.py" else c for c in command]
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    command[:] = [f"--ckpt-dir={folder}" if c.startswith("--ckpt-dir=") else c for c in command]
    config["workload"]["workdir"] = str(tmp_path)
    config["injectFailure"]["path"] = str(folder)
    base = tmp_path / "truth"
    mark = uuid.uuid4().hex
    env = config["workload"].setdefault("env", {})
    env.update(RECOVERYGATE_GROUND_TRUTH=str(base), RG_E2E_MARK=mark)
    run = run_cli_drill(config, tmp_path / name, timeout=within(DRILL))
    result = Run(run.report, run.code, run.output, read_truth(base))
    record_for_the_docs(name, run.report, run.wall)
    assert not left_behind(mark, folder), "left behind:\n" + "\n".join(left_behind(mark, folder))
    return result


def assert_resumed_from_the_last_durable(run: Run) -> None:
    """PASS, and the job's own records agree: its first process saved 40 durably and
    failed the save of 60; the replacement the drill judged loaded 40."""
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    first, *later = run.processes
    assert max(run.events(first, "durable")) == 40, first
    assert 60 in run.events(first, "save_failed"), first
    assert 60 not in run.events(first, "reported_complete"), first
    loaded = [run.events(p, "loaded")[0] for p in later if run.events(p, "step")]
    assert loaded and loaded[0] == run.report["resumeStep"] == 40, (loaded, run.explain())
    assert run.report["expectedResumeStep"] == 40


# ------------------------------------------------------------------ the savers that get it right


@pytest.mark.parametrize("name", ["atomic-enospc.yaml", "atomic-eio.yaml", "atomic-readonly.yaml"])
def test_an_atomic_saver_fails_loudly_and_resumes_from_the_last_durable(
    name: str, tmp_path: Path
) -> None:
    run = drill(name, tmp_path)
    assert_resumed_from_the_last_durable(run)
    storage = run.storage
    errno = {"atomic-enospc.yaml": "ENOSPC", "atomic-eio.yaml": "EIO"}.get(name, "EROFS")
    assert storage["firstOperation"]["error"] == errno, storage
    assert storage["saveHit"] == 60 and storage["lastDurableCheckpoint"] == 40, storage
    assert storage["liftedAt"] is not None, storage
    checks = {c["name"]: c for c in run.report["checks"]}
    assert checks["failed_save_not_counted"]["passed"] is True, run.explain()
    assert checks["last_good_checkpoint_kept"]["passed"] is True, run.explain()


def test_a_saver_that_skips_a_failed_save_says_so_and_trains_on(tmp_path: Path) -> None:
    run = drill("atomic-skip.yaml", tmp_path)
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    [first] = run.processes  # it never restarted
    assert 60 in run.events(first, "save_failed"), first
    assert 60 not in run.events(first, "durable") and max(run.events(first, "step")) > 60
    assert run.storage["saveEnded"] == "reported failed", run.storage


# ------------------------------------------------------------------ the savers that get it wrong


def test_a_writer_thread_that_reports_a_failed_save_complete_fails(tmp_path: Path) -> None:
    run = drill("swallow-enospc.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert run.report["reasons"][0] == "SAVE_FAILURE_SWALLOWED", run.explain()
    first = run.processes[0]
    # its own records: the write failed, and it reported the checkpoint complete anyway
    assert 60 in run.events(first, "save_failed") and 60 in run.events(first, "reported_complete")


def test_a_latest_link_moved_before_the_save_fails(tmp_path: Path) -> None:
    run = drill("latest-first-enospc.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert "SAVE_FAILURE_SWALLOWED" in run.report["reasons"], run.explain()
    assert "latest was moved to name it" in run.report["summary"], run.explain()
    first = run.processes[0]
    assert 60 in run.events(first, "pointer") and 60 in run.events(first, "save_failed"), first


def test_retention_that_removes_the_last_checkpoint_first_fails(tmp_path: Path) -> None:
    run = drill("delete-first-eio.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert run.report["reasons"][0] == "LAST_GOOD_CHECKPOINT_DELETED", run.explain()
    # The job's own records: its first process removed 40 inside the save of 60, and 60
    # never became durable. The verdict is decided when the layer fails that save's write;
    # the drill then ends the job, which may be before it wrote its own save_failed row.
    first = run.processes[0]
    deleted = [row["t"] for row in first if row["event"] == "deleted" and row["step"] == 40]
    started = [row["t"] for row in first if row["event"] == "save_started" and row["step"] == 60]
    failed = [row["t"] for row in first if row["event"] == "save_failed" and row["step"] == 60]
    assert started and deleted and started[0] < deleted[0], first
    assert 60 not in run.events(first, "durable"), first
    assert all(deleted[0] < t for t in failed), first


# ------------------------------------------------------------------ stall


def test_a_stall_behind_a_barrier_without_a_timeout_fails_at_max_stall(tmp_path: Path) -> None:
    run = drill("stall-barrier.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert run.report["reasons"] == ["STALLED_ON_STORAGE"], run.explain()
    [first] = run.processes
    assert 60 in run.events(first, "save_started"), first
    assert max(run.events(first, "step")) == 60, "no step past the held save"
    assert not run.events(first, "save_failed"), "the save neither failed nor completed"
    [check] = [c for c in run.report["checks"] if c["name"] == "storage_stall_handled"]
    # decided at the example's maxStall, not later
    limit = parse_duration(
        yaml.safe_load((STORAGE / "stall-barrier.yaml").read_text())["expectations"]["maxStall"]
    )
    assert limit <= check["observed"] < limit + within(PROMPT), check


def test_a_stall_behind_a_barrier_with_a_timeout_fails_loudly_and_recovers(
    tmp_path: Path,
) -> None:
    run = drill("stall-barrier-timeout.yaml", tmp_path)
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    # What the replacement must resume from is the job's own record: 40, or 60 when the
    # held save finished once the stall was lifted (the job had failed) before torchrun
    # stopped rank 0 - either is the newest checkpoint the job made durable.
    first = run.processes[0]
    durable = max(run.events(first, "durable"))
    assert durable in (40, 60) and 60 in run.events(first, "save_started"), first
    later = [p for p in run.processes[1:] if run.events(p, "step")]
    assert later and run.events(later[0], "loaded")[0] == run.report["resumeStep"] == durable


def test_a_stall_shorter_than_max_stall_passes(tmp_path: Path) -> None:
    run = drill("stall-short.yaml", tmp_path)
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    [first] = run.processes  # the held save completed once the storage came back
    assert 60 in run.events(first, "durable") and max(run.events(first, "step")) > 60, first


# ------------------------------------------------------------------ during: load


def test_a_slow_load_within_the_slo_passes(tmp_path: Path) -> None:
    run = drill("load-latency.yaml", tmp_path)
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    assert run.storage["operationsDelayed"] >= 1, run.storage
    later = [p for p in run.processes[1:] if run.events(p, "step")]
    assert later and run.events(later[0], "loaded")[0] == 40


def test_a_load_slower_than_the_slo_fails_naming_the_load(tmp_path: Path) -> None:
    run = drill("load-latency-too-slow.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert run.report["reasons"] == ["TOO_SLOW"], run.explain()
    assert "checkpointLoaded phase" in run.report["summary"], run.explain()
    later = [p for p in run.processes[1:] if run.events(p, "step")]
    assert later and run.events(later[0], "loaded")[0] == 40  # the right checkpoint, slowly
    phases = run.report["recoveries"][0]["breakdown"]
    assert phases["checkpointLoaded"] - phases["processStarted"] > 10.0, phases


# ------------------------------------------------------------------ StickyFault, scope: checkpoint
#
# The checkpoint of step 40 is damaged at rest (its files, as its save wrote them), then
# rank 1 is killed: what the job's restart does with it is held to the job's records
# (each checkpoint it rejected, the step and the state digest it loaded, the digest it
# saved at each step).


def rows(run: Run, process: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [row for row in process if row["event"] == event]


def damaged_files(run: Run) -> list[str]:
    damage = run.report["recoveries"][0]["faultDetails"]["damage"]
    assert damage["step"] == 40, damage
    return sorted(text.split(" (", 1)[0] for text in damage["files"])


def test_a_job_that_verifies_on_load_falls_back_past_the_damaged_checkpoint(
    tmp_path: Path,
) -> None:
    run = drill("damaged-verify.yaml", tmp_path)
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    assert damaged_files(run) == ["step-00000040.pt", "step-00000040.pt.sha256"]
    later = [p for p in run.processes[1:] if run.events(p, "step")]
    assert later, run.explain()
    assert run.events(later[0], "rejected") == [40]  # the job saw the damage ...
    assert run.events(later[0], "loaded") == [20] == [run.report["resumeStep"]]  # ... fell back
    # nothing but step 40's files was touched: step 20's file still matches its checksum
    folder = tmp_path / "checkpoints"
    twenty = folder / "step-00000020.pt"
    if twenty.exists():  # retention may have removed it since
        sidecar = (folder / "step-00000020.pt.sha256").read_text().strip()
        assert hashlib.sha256(twenty.read_bytes()).hexdigest() == sidecar


def test_a_job_that_trusts_a_silently_damaged_checkpoint_fails_by_its_digest(
    tmp_path: Path,
) -> None:
    run = drill("damaged-trust-flip.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert run.report["reasons"][0] == "LOADED_CORRUPT_CHECKPOINT", run.explain()
    # the job's records: it loaded step 40 with another state than it saved there
    first, *later = run.processes
    [saved] = [r["digest"] for r in rows(run, first, "reported_complete") if r["step"] == 40]
    loads = [r for p in later for r in rows(run, p, "loaded") if r["step"] == 40]
    assert loads and all(r["digest"] != saved for r in loads), (saved, loads)


def test_a_job_that_trusts_a_truncated_checkpoint_crash_loops(tmp_path: Path) -> None:
    run = drill("damaged-trust-truncate.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert run.report["reasons"][0] == "CRASH_LOOP", run.explain()
    # the job's records: every process after the kill died before it loaded anything,
    # restart after restart (the drill decides at the fourth restart: that process may
    # be ended before it writes its first record)
    kill = run.report["recoveries"][0]["killTime"]
    later = [p for p in run.processes if p[0]["t"] > kill]
    assert [p[0]["restart"] for p in later][:3] == [1, 2, 3], run.explain()
    assert all(not run.events(p, "loaded") for p in later), later
    assert run.report["recoveries"][0]["restarts"] == 4


def test_a_job_that_drops_a_damaged_checkpoint_for_step_0_has_no_fallback(
    tmp_path: Path,
) -> None:
    run = drill("damaged-scratch.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL", run.explain()
    assert run.report["reasons"][0] == "NO_FALLBACK", run.explain()
    later = [p for p in run.processes[1:] if run.events(p, "step")]
    assert run.events(later[0], "rejected") == [40] and run.events(later[0], "loaded") == [0]
