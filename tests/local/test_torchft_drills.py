"""Real torchft drills: a real lighthouse, two real torchrun replica groups, a real SIGKILL.

Each test runs one of examples/local/torchft/'s configs through ``recoverygate run`` (one
drill ~40-60 s on two cores; the three ~3 min). We test these aspects:
- PASS: the survivor keeps committing (its stall is the lighthouse's heartbeat timeout,
  not the restart), the restarted replica heals from the survivor at the survivors' step,
  no committed step goes backwards; the report's live figures and per-replica steps;
- FAIL, survivors stalled: the ``min_replica_size: 2`` twin, decided as soon as the stall
  passed ``maxSurvivorStall`` (before the replica came back);
- FAIL, rejoined from scratch: the ``allow_heal=False`` twin, reported through
  ``RECOVERYGATE_AUTO=1`` (no ``instrument()`` call in the job);
- FAIL, state differs: the twin whose ``load_state_dict`` applies nothing
  (``stateDigestMatches``: every other check passes, only the digests differ; ~50 s);
- every member ends with the drill: no process carrying the run's marker is left.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from pytest_recoverygate.durations import parse_duration
from tests.cli_drill import CliRun, run_cli_drill
from tests.patience import CLUSTER, within

pytest.importorskip("torch")
pytest.importorskip("torchft")
pytestmark = [pytest.mark.local, pytest.mark.e2e, pytest.mark.torchft]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "local" / "torchft"
EXAMPLE = "recovery-test.yaml"


def processes_marked(mark: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("RG_E2E_MARK") == mark:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def example(name: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return config


def limit(name: str, key: str) -> float:
    """An expectation of the example as shipped, in seconds."""
    return parse_duration(example(name)["expectations"][key])


def setting(name: str, variable: str) -> float:
    """A number the example's job is given in its environment."""
    return float(example(name)["workload"]["env"][variable])


def run_example(tmp_path: Path, name: str, **env: str) -> CliRun:
    """The example config as shipped, run from a copy (its folder absolute, a marker added)."""
    config: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    mark = uuid.uuid4().hex
    workload = config["workload"]
    workload["workdir"] = str(EXAMPLES)
    workload["env"] = {**workload.get("env", {}), "RG_E2E_MARK": mark, **env}
    run = run_cli_drill(
        config, tmp_path / name, report_dir=tmp_path / "report", timeout=within(CLUSTER)
    )
    assert processes_marked(mark) == [], "a member of the job outlived the drill"
    return run


def test_the_example_passes_survivors_train_on_and_the_replica_heals_from_a_peer(
    tmp_path: Path,
) -> None:
    run = run_example(tmp_path, EXAMPLE)
    report = run.report
    assert run.code == 0, run.output
    assert report["verdict"] == "PASS"
    assert report["recoveryMode"] == "live"
    assert report["rejoinSource"] == "peer"
    assert report["survivorsKeptTraining"] is True
    # The survivor stalls for about the lighthouse's heartbeat timeout, within the drill's
    # maxSurvivorStall, and less than the replica's restart, which takes the job's
    # RESTART_DELAY_SECONDS and more: it never waited for the replica.
    stall, restart = report["survivorStallSeconds"], setting(EXAMPLE, "RESTART_DELAY_SECONDS")
    assert 0 < stall <= limit(EXAMPLE, "maxSurvivorStall"), stall
    assert report["rejoinTimeSeconds"] > restart
    assert stall < restart, (stall, restart)
    live = report["live"]
    replicas = {r["replica"]: r for r in live["replicas"]}
    assert set(replicas) == {0, 1}
    assert replicas[1]["target"] is True
    assert replicas[1]["incarnations"] == 2
    assert replicas[0]["incarnations"] == 1
    # It healed to the survivor's state: at or after the survivor's step when it joined,
    # and past the step the job had when the kill landed.
    assert report["triggerCheckpoint"] >= 50  # the step that armed the kill (afterStep)
    assert report["rejoinStep"] > report["triggerCheckpoint"]
    assert report["rejoinStep"] >= replicas[0]["stepAtRejoin"] - 1  # the survivor's step
    assert live["rejoinPeer"] == 0
    checks = {c["name"]: c["passed"] for c in report["checks"]}
    assert checks == {
        "target_killed": True,
        "survivors_kept_training": True,
        "rejoin_time": True,
        "rejoin_source": True,
        "heal_step": True,
        "lost_steps": True,
        "state_digest": True,  # stateDigestMatches: the healed state is the survivor's
    }
    phases = report["breakdown"]
    assert phases["replica restarted"] < phases["healed"] <= phases["first committed step"]
    lines = (tmp_path / "report" / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    starts = [e for e in events if e["event"] == "start"]
    assert sorted(e.get("replica") for e in starts) == [0, 1, 1]
    heals = [
        e for e in events if e["event"] == "checkpoint_loaded" and e["time"] > report["killTime"]
    ]
    # the heal line at the transfer, then again once load_state_dict applied it (its digest)
    assert [(e["step"], e.get("source"), e.get("peer")) for e in heals] == [
        (report["rejoinStep"], "peer", 0)
    ] * 2


def test_the_min_replica_size_2_twin_fails_survivors_stalled(tmp_path: Path) -> None:
    name = "recovery-test-min-replicas-2.yaml"
    run = run_example(tmp_path, name)
    report = run.report
    assert run.code == 1, run.output
    assert report["verdict"] == "FAIL"
    assert "SURVIVORS_STALLED" in report["reasons"]
    assert report["survivorStallSeconds"] > limit(name, "maxSurvivorStall")
    assert report["survivorsKeptTraining"] is False
    assert "replica 0 committed no step for" in report["summary"]


def test_the_no_heal_twin_fails_rejoined_from_scratch(tmp_path: Path) -> None:
    # Reported without instrument(): RECOVERYGATE_AUTO=1 instruments the Manager.
    run = run_example(
        tmp_path,
        "recovery-test-no-heal.yaml",
        RECOVERYGATE_AUTO="1",
        TRAIN_FT_INSTRUMENT="0",
    )
    report = run.report
    assert run.code == 1, run.output
    assert report["verdict"] == "FAIL"
    assert report["rejoinSource"] == "scratch"
    assert "REJOINED_FROM_SCRATCH" in report["reasons"]
    assert "LOST_TOO_MANY_STEPS" in report["reasons"]
    assert report["survivorsKeptTraining"] is True


def test_the_heal_applies_nothing_twin_fails_state_differs(tmp_path: Path) -> None:
    run = run_example(tmp_path, "recovery-test-heal-applies-nothing.yaml")
    report = run.report
    assert run.code == 1, run.output
    assert report["verdict"] == "FAIL"
    assert report["reasons"] == ["STATE_DIFFERS"], report["summary"]
    assert report["rejoinSource"] == "peer"  # torchft healed; the job did not apply it
    checks = {c["name"]: c for c in report["checks"]}
    assert all(c["passed"] for name, c in checks.items() if name != "state_digest")
    assert checks["state_digest"]["passed"] is False
    assert checks["state_digest"]["observed"] not in checks["state_digest"]["expected"]
