"""``stateDigestMatches`` in ``recovery: live``: the healed replica's state against the
survivors', judged from the lines, through the fake backend's replica groups on a
simulated clock (examples/fake/live.yaml).

We test these aspects: PASS when the healed replica's digest at its heal step equals the
digest of the state a survivor sent for that step; FAIL ``STATE_DIFFERS`` naming both
digests when it applied another state (``fake.heal: peer-unapplied``); inconclusive
(ERROR) when a replica healed without digests (a heal from a checkpoint, no survivor
sent one); the key is accepted in live mode now.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.orchestrators import build_orchestrator
from pytest_recoverygate.orchestrators.base import SimulatedClock
from pytest_recoverygate.runner import RunOptions, run_drill

FAKE_LIVE = Path(__file__).resolve().parent.parent / "examples" / "fake" / "live.yaml"


def run_fake(tmp_path: Path, heal: str) -> tuple[int, dict[str, Any]]:
    data = yaml.safe_load(FAKE_LIVE.read_text())
    data["workload"]["fake"]["heal"] = heal
    data["expectations"]["stateDigestMatches"] = True
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    clock = SimulatedClock()
    report = tmp_path / "report.json"
    result = run_drill(
        config,
        RunOptions(report_path=report, handle_signals=False),
        clock=clock,
        orchestrator=build_orchestrator(config, clock),
    )
    return result.exit_code, json.loads(report.read_text())


def digest_check(report: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == "state_digest")


def test_a_healed_replica_with_the_survivor_s_state_passes(tmp_path: Path) -> None:
    code, report = run_fake(tmp_path, "peer")
    assert code == 0, report["summary"]
    check = digest_check(report)
    assert check["passed"] is True
    assert check["observed"] == f"{report['rejoinStep']:016x}"  # the simulated digest


def test_a_healed_replica_with_another_state_fails_state_differs(tmp_path: Path) -> None:
    code, report = run_fake(tmp_path, "peer-unapplied")
    assert code == 1
    check = digest_check(report)
    assert check["passed"] is False
    assert check["reason"] == "STATE_DIFFERS"
    step = report["rejoinStep"]
    assert f"{step + 1:016x}" in check["message"] and f"{step:016x}" in check["message"]
    assert report["reasons"] == ["STATE_DIFFERS"]


@pytest.mark.parametrize("heal", ["checkpoint", "scratch"])
def test_without_a_peer_s_digest_the_comparison_is_not_a_pass(tmp_path: Path, heal: str) -> None:
    code, report = run_fake(tmp_path, heal)
    assert code != 0
    assert digest_check(report)["passed"] is None
