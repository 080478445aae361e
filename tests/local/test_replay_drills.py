"""Replay equivalence end to end: a real 2-rank DDP job under torchrun, a real SIGKILL.

Each test runs a shipped example of examples/local/replay/ as a user would (``recoverygate
run -f …``), with the job writing its own per-step record (``--losses``: step, loss as
``float.hex``, batch fingerprint, per process), and holds the drill's ``replay`` figures
to that record. We test these aspects:

- the job that restores everything (model, AdamW, warm-up scheduler, every rank's RNG
  states, the sampler's position mid-epoch, the DataLoader's generator) PASSes
  ``replay: exact``: every compared step equal, bit for bit, in the drill and in the
  job's own record;
- each twin that forgets one thing (the data position, the RNG with dropout, the LR
  scheduler, the optimizer, the DataLoader's generator) FAILs ``REPLAY_DIVERGED`` naming
  the first step at which the job's own record shows the two runs differ.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli_drill import run_cli_drill
from tests.patience import DRILL, within

pytest.importorskip("torch")
pytestmark = [pytest.mark.e2e, pytest.mark.local]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "local" / "replay"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def drill(name: str, tmp_path: Path) -> tuple[dict[str, Any], int, str, Path]:
    config = yaml.safe_load((EXAMPLES / name).read_text())
    command = config["workload"]["command"]
    command[0] = str(TORCHRUN)
    command[:] = [str(EXAMPLES / c) if c == "train_replay.py" else c for c in command]
    command.append(f"--losses={tmp_path / 'losses'}")
    config["workload"]["workdir"] = str(tmp_path)
    run = run_cli_drill(config, tmp_path / name, timeout=within(DRILL))
    return run.report, run.code, run.output, tmp_path / "losses"


def own_record(base: Path) -> tuple[dict[int, tuple[str, str]], dict[int, tuple[str, str]]]:
    """Rank 0's record: the killed process's steps and the replacement's (first two pids).

    A process records each step before it reports it, so every step the drill compared is
    in both records; a process stopped before its first step recorded nothing.
    """
    runs = []
    for path in base.parent.glob(f"{base.name}.0.*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line]
        if rows:
            runs.append((rows[0]["t"], {r["step"]: (r["loss"], r["data"]) for r in rows}))
    runs.sort(key=lambda run: run[0])
    assert len(runs) >= 2, runs
    return runs[0][1], runs[1][1]


def check_against_record(report: dict[str, Any], base: Path) -> int | None:
    """Every compared step's values are the job's own; the record's first divergence."""
    killed, replacement = own_record(base)
    replay = report["replay"]
    for row in replay["steps"]:
        step = row["step"]
        assert float.fromhex(killed[step][0]) == row["killed"], row
        assert killed[step][1] == row["killedData"], row
        assert float.fromhex(replacement[step][0]) == row["replacement"], row
    compared = [row["step"] for row in replay["steps"]]
    return next((s for s in compared if killed[s] != replacement[s]), None)


def test_a_job_that_restores_everything_replays_bit_for_bit(tmp_path: Path) -> None:
    report, code, output, base = drill("recovery-test.yaml", tmp_path)
    assert code == 0, (report.get("summary"), output[-3000:])
    replay = report["replay"]
    assert replay["mode"] == "exact"
    assert replay["stepsCompared"] >= 5, replay  # the delay left ~10 replayed steps
    assert replay["firstDivergentStep"] is None
    assert replay["maxAbsDiff"] == 0.0
    assert replay["dataMatched"] is True
    assert replay["steps"][0]["step"] == report["resumeStep"] + 1
    assert check_against_record(report, base) is None
    check = next(c for c in report["checks"] if c["name"] == "replay_matches")
    assert check["passed"] is True


@pytest.mark.parametrize(
    "twin",
    [
        "forget-data.yaml",
        "forget-rng.yaml",
        "forget-scheduler.yaml",
        "forget-optimizer.yaml",
        "forget-generator.yaml",
    ],
)
def test_a_resume_that_forgets_one_thing_fails_at_its_first_divergent_step(
    tmp_path: Path, twin: str
) -> None:
    report, code, output, base = drill(twin, tmp_path)
    assert code == 1, (report.get("summary"), output[-3000:])
    assert report["reasons"] == ["REPLAY_DIVERGED"], report["summary"]
    first = report["replay"]["firstDivergentStep"]
    assert first is not None
    assert first == check_against_record(report, base)
    check = next(c for c in report["checks"] if c["name"] == "replay_matches")
    assert f"replay diverged at step {first}" in check["message"]
    if twin == "forget-data.yaml":
        assert report["replay"]["dataMatched"] is False
        assert "its data differs" in check["message"]
    else:
        assert report["replay"]["dataMatched"] is True
    _measured(twin, report)


def _measured(twin: str, report: dict[str, Any]) -> None:
    """What the twins measured, for docs/replay.md (printed with -s)."""
    replay = report["replay"]
    print(
        f"\n{twin}: resumed from {report['resumeStep']}, killed run's last step "
        f"{replay['killedRunLastStep']}, compared {replay['stepsCompared']}, first divergent "
        f"{replay['firstDivergentStep']}, divergent {replay['divergentSteps']}, "
        f"maxAbsDiff {replay['maxAbsDiff']}, maxRelDiff {replay['maxRelDiff']}"
    )
