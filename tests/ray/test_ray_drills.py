"""The ray backend end to end: real Ray clusters started by the examples' drivers.

We test these aspects, each drill through the CLI as a user runs it:

- the example (TorchTrainer, 2 CPU workers, gloo, ``RECOVERYGATE_AUTO=1``) PASSes: the
  new group resumed from the latest checkpoint Ray registered, the breakdown shows Ray's
  phases in order, and cleanup leaves no process of the drill's cluster and no RAY_TMPDIR;
- its twin that never calls ``get_checkpoint()`` FAILs "restarted from scratch";
- ``count: untilBudgetExhausted`` is held to ``FailureConfig(max_failures=N)`` (N = 1
  here): N recoveries, then the job gives up loudly on the next kill;
- ``KillNode`` on a two-node cluster of this machine (``ray.cluster_utils.Cluster``) ends
  the raylet of rank 1's node, and Train restarts the group on the head from the latest
  checkpoint;
- a ``targetRank`` beyond the workers is an ERROR (exit 3) found at discovery, nothing
  killed; an ``address`` nobody answers at is an ERROR naming it;
- ``Preempt``: the job that saves on SIGTERM (its handler on the worker's main thread,
  through the actor) PASSes with the checkpoint of the SIGTERM's step as the resume; the
  one that leaves SIGTERM to Ray FAILs ``NOT_SAVED_ON_PREEMPT``;
- ``HangWorker``: with a 10 s gloo timeout the hang is detected at Train's restart
  decision (after the timeout, before Ray ends the stopped rank (after
  ``TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S``, 10 s in the example)) and
  the group resumes from the latest checkpoint; with the 1800 s default it FAILs
  ``HANG_NOT_DETECTED`` once ``maxDetectionTime`` (15 s here) + ``recoveryGrace`` passed;
- ``KillDuringCheckpoint``: rank 1 killed inside its upload of checkpoint 40 leaves it
  unregistered, and the job resumes from 20 through ``get_checkpoint()`` (PASS); the twin
  that resumes from the newest folder on disk crash-loops on the torn shard (FAIL).

Every drill starts its own cluster (the driver's ``ray.init``): about 1.6 GB and 2 CPUs.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from pytest_recoverygate.durations import parse_duration
from tests.cli_drill import CliRun, run_cli_drill
from tests.patience import DRILL, within

pytest.importorskip("ray", reason='the ray backend needs pip install "recoverygate[ray]"')

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ray"


def example(name: str, **changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    config["workload"]["workdir"] = str(EXAMPLES)
    for section, values in changes.items():
        config[section] = {**config.get(section, {}), **values}
    return config


def ray_tmpdirs() -> set[Path]:
    return {p for p in Path("/tmp").glob("rg-ray-*") if p.stat().st_uid == os.getuid()}


def in_use(folders: set[Path]) -> set[Path]:
    """The folders a running process holds as its RAY_TMPDIR: another drill's, running."""
    held = set()
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            tmpdir = proc.environ().get("RAY_TMPDIR")
            if tmpdir is not None and Path(tmpdir) in folders:
                held.add(Path(tmpdir))
    return held


def drill(config: dict[str, Any], tmp_path: Path) -> CliRun:
    """Run the drill; nothing of it is left: no process carrying its marker (the driver's
    cluster inherits the job's environment), and no RAY_TMPDIR made while it ran that no
    running process holds (another drill on the machine may hold its own meanwhile)."""
    mark = uuid.uuid4().hex
    config["workload"]["env"] = {**config["workload"].get("env", {}), "RG_E2E_MARK": mark}
    before = ray_tmpdirs()
    run = run_cli_drill(config, tmp_path / "drill.yaml", timeout=within(DRILL))
    leftovers = [p.pid for p in psutil.process_iter() if marked(p, mark)]
    assert leftovers == [], f"processes of the drill's cluster left running: {leftovers}"
    made = ray_tmpdirs() - before
    assert not made - in_use(made), f"the drill's RAY_TMPDIR was not removed: {made}"
    return run


def marked(proc: psutil.Process, mark: str) -> bool:
    try:
        return proc.environ().get("RG_E2E_MARK") == mark
    except psutil.Error:
        return False


def expectation(name: str, key: str) -> float:
    return parse_duration(example(name)["expectations"][key])


def failed(run: CliRun) -> str:
    return f"exit {run.code}, {run.report.get('summary')}\n{run.output[-3000:]}"


def test_the_example_passes_resuming_from_the_latest_registered_checkpoint(
    tmp_path: Path,
) -> None:
    run = drill(example("recovery-test.yaml"), tmp_path)

    report = run.report
    assert run.code == 0, failed(run)
    assert report["verdict"] == "PASS"
    assert report["resumeStep"] == report["expectedResumeStep"] >= 40
    assert report["resumeStep"] % 10 == 0  # a checkpoint step: --ckpt-every=10
    assert 0 < report["recoveryTimeSeconds"] <= expectation("recovery-test.yaml", "maxRecoveryTime")
    assert report["target"]["rank"] == 1
    kinds = [e["kind"] for e in report["timeline"]]
    phases = ["group:worker_gone", "group:restarting", "group:replacement_pending"]
    phases += ["group:replacement_running", "checkpoint_loaded"]
    assert [k for k in kinds if k in phases] == phases, kinds
    breakdown = report["breakdown"]
    assert breakdown["failureDetected"] <= breakdown["replacementRunning"]
    assert breakdown["replacementRunning"] <= breakdown["checkpointLoaded"]
    assert breakdown["checkpointLoaded"] <= breakdown["firstStepAfterResume"]


def test_the_twin_without_get_checkpoint_fails_as_restarted_from_scratch(
    tmp_path: Path,
) -> None:
    config = example("recovery-test-no-resume.yaml")
    config["injectFailure"]["afterCheckpoint"] = "step-20"

    run = drill(config, tmp_path)

    assert run.code == 1, failed(run)
    assert run.report["verdict"] == "FAIL"
    assert run.report["resumeStep"] == 0
    assert "restarted from scratch" in run.report["summary"]


def test_until_budget_exhausted_is_held_to_max_failures(tmp_path: Path) -> None:
    # The example with a budget of 1 (it ships with 2): one recovery, then the give-up;
    # each Ray recovery costs about 20 s here.
    config = example("recovery-test-budget.yaml", expectations={"restartBudget": 1})
    entrypoint = config["workload"]["entrypoint"]
    assert "--max-failures=2" in entrypoint, entrypoint
    entrypoint[entrypoint.index("--max-failures=2")] = "--max-failures=1"

    run = drill(config, tmp_path)

    checks = {c["name"]: c for c in run.report["checks"]}
    assert run.code == 0, failed(run)
    assert checks["gave_up_loudly"]["passed"] is True, checks
    assert checks["restart_budget"]["passed"] is True, checks
    assert checks["restart_budget"]["observed"] == 1
    assert len([e for e in run.report["timeline"] if e["kind"] == "kill"]) == 2


def test_kill_node_ends_the_second_nodes_raylet_and_train_resumes_on_the_head(
    tmp_path: Path,
) -> None:
    run = drill(example("recovery-test-kill-node.yaml"), tmp_path)

    report = run.report
    assert run.code == 0, failed(run)
    assert report["verdict"] == "PASS"
    assert report["resumeStep"] == report["expectedResumeStep"] >= 40
    kinds = [e["kind"] for e in report["timeline"]]
    assert "group:node_gone" in kinds, kinds
    kill = next(e for e in report["timeline"] if e["kind"] == "kill")
    assert "raylet" in kill["detail"], kill


def test_a_target_rank_beyond_the_workers_is_an_error_and_kills_nothing(tmp_path: Path) -> None:
    config = example("recovery-test.yaml", injectFailure={"targetRank": 5})

    run = drill(config, tmp_path)

    assert run.code == 3, failed(run)
    assert run.report["verdict"] == "ERROR"
    assert "targetRank 5 is beyond the Train run" in run.report["summary"]
    assert "world ranks 0-1" in run.report["summary"]
    assert not [e for e in run.report["timeline"] if e["kind"] == "kill"]


def test_an_address_nobody_answers_at_is_an_error_naming_it(tmp_path: Path) -> None:
    config = example("recovery-test.yaml", workload={"address": "127.0.0.1:9"})

    run = drill(config, tmp_path)

    assert run.code == 3, failed(run)
    assert "no Ray cluster answers at 127.0.0.1:9" in run.report["summary"]
    assert "workload.address" in run.report["summary"]


def details(run: CliRun) -> dict[str, Any]:
    found: dict[str, Any] = run.report["recoveries"][0]["faultDetails"]
    return found


def test_preempt_a_job_that_saves_on_sigterm_resumes_from_that_save(tmp_path: Path) -> None:
    name = "recovery-test-preempt-save-on-sigterm.yaml"
    run = drill(example(name), tmp_path)

    report = run.report
    assert run.code == 0, failed(run)
    saved = details(run)
    assert saved["savedUsed"] is True, saved
    assert report["resumeStep"] == saved["savedStep"] > report["triggerCheckpoint"]
    grace = parse_duration(example(name)["injectFailure"]["gracePeriod"])
    assert 0 < saved["savedAfterSeconds"] < grace  # within the grace period
    kill = next(e for e in report["timeline"] if e["kind"] == "kill")
    assert kill["detail"].startswith("SIGTERM sent to pid"), kill


def test_preempt_a_job_that_leaves_sigterm_to_ray_fails_not_saved(tmp_path: Path) -> None:
    run = drill(example("recovery-test-preempt-no-save.yaml"), tmp_path)

    assert run.code == 1, failed(run)
    reasons = run.report["reasons"]
    assert reasons[0] == "NOT_SAVED_ON_PREEMPT", failed(run)
    assert "savedStep" not in details(run)
    # Where the SIGTERM lands is Ray's timing (its log lines reach the driver late under
    # load). One that cuts the periodic save after Ray stored its files leaves that save's
    # completion unseen, and a resume from it undecided: the verdict says so beside the
    # failure (seen once in a full CI run), and nothing else may join it.
    if reasons[1:]:
        assert reasons[1:] == ["INCONCLUSIVE"], failed(run)
        [resume] = [c for c in run.report["recoveries"][0]["checks"] if c["name"] == "resume_step"]
        assert resume["passed"] is None, failed(run)
        assert "before the kill and was cut" in resume["message"], failed(run)


def test_hang_with_a_short_gloo_timeout_is_detected_at_trains_restart_decision(
    tmp_path: Path,
) -> None:
    name = "recovery-test-hang-with-timeout.yaml"
    run = drill(example(name), tmp_path)

    report = run.report
    assert run.code == 0, failed(run)
    detection = details(run)["detectionSeconds"]
    # the job's gloo timeout, then Train's restart decision, within maxDetectionTime
    [gloo] = [a for a in example(name)["workload"]["entrypoint"] if a.startswith("--gloo-timeout=")]
    limit = expectation(name, "maxDetectionTime")
    assert float(gloo.partition("=")[2]) <= detection <= limit, detection
    gone = next(e for e in report["timeline"] if e["kind"] == "group:worker_gone")
    assert gone["detail"].startswith("Train decided to restart the group"), gone
    assert report["resumeStep"] == report["expectedResumeStep"]


def test_hang_with_the_default_gloo_timeout_is_not_detected(tmp_path: Path) -> None:
    # 15 s, not the example's 30 s: nothing notices this hang for 30 minutes either way,
    # and the drill is decided 15 s sooner.
    config = example("recovery-test-hang-default-timeout.yaml", expectations={
        "maxDetectionTime": "15s"
    })  # fmt: skip
    run = drill(config, tmp_path)

    assert run.code == 1, failed(run)
    assert run.report["reasons"][0] == "HANG_NOT_DETECTED", failed(run)  # then NEVER_CAME_BACK
    assert details(run)["detectionSeconds"] is None


def test_kill_during_checkpoint_resumes_from_the_last_registered_checkpoint(
    tmp_path: Path,
) -> None:
    name = "recovery-test-kill-during-checkpoint.yaml"
    run = drill(example(name), tmp_path)

    report = run.report
    assert run.code == 0, failed(run)
    torn = details(run)
    assert torn["tornStep"] == 40, torn
    # the config's delay into the save, before the save (the job's 3 s upload) was over
    delay = parse_duration(example(name)["injectFailure"]["delay"])
    assert delay <= torn["intoSaveSeconds"] < torn["saveSeconds"], torn
    assert report["resumeStep"] == report["expectedResumeStep"] == 20


def test_kill_during_checkpoint_the_twin_that_loads_the_newest_folder_fails(
    tmp_path: Path,
) -> None:
    run = drill(example("recovery-test-kill-during-checkpoint-newest-folder.yaml"), tmp_path)

    assert run.code == 1, failed(run)
    assert run.report["verdict"] == "FAIL"
    assert details(run)["tornStep"] == 40
