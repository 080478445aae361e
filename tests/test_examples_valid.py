"""Every drill config shipped under examples/ validates: what users copy must parse.

Kubernetes manifests (a ``kind:`` at the top) are not drill configs and are skipped; a
drill config is a mapping with ``workload``. Validation reads files only: nothing runs.
Every example is also decidable: its broken twin's lost steps never land on its limit.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pytest_recoverygate.config.loading import DrillConfig, load_config
from tests.patience import CLUSTER, within

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def drill_configs() -> list[Path]:
    configs = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        documents = list(yaml.safe_load_all(path.read_text()))
        if len(documents) == 1 and isinstance(documents[0], dict) and "workload" in documents[0]:
            configs.append(path)
    return configs


def test_the_examples_hold_a_drill_config_for_every_fault() -> None:
    types = {str(load_config(path).inject_failure.type) for path in drill_configs()}
    assert {"KillWorker", "KillDuringCheckpoint", "Preempt", "HangWorker"} <= types


@pytest.mark.parametrize("path", drill_configs(), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_an_example_drill_config_validates(path: Path) -> None:
    load_config(path)


def checkpoint_interval(config: DrillConfig, trigger: int) -> int:
    """Steps between the example job's checkpoints: the fake's ``checkpointEvery``, the
    ``--ckpt-every`` of its command; else the trigger step (no shipped job saves less often)."""
    fake = getattr(config.workload, "fake", None)
    if fake is not None:
        return int(fake.checkpoint_every)
    command = " ".join(getattr(config.workload, "command", None) or [])
    found = re.search(r"--ckpt-every[= ](\d+)", command)
    return int(found.group(1)) if found else trigger


@pytest.mark.parametrize("path", drill_configs(), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_an_example_decides_lost_steps_even_for_a_restart_from_scratch(path: Path) -> None:
    # A job that restarts from scratch loses the steps since 0: at least the trigger step,
    # at most one checkpoint interval (and one progress line) more. A limit inside that
    # band leaves lost_steps undecided ("between 100 and 101 steps against a limit of
    # 100"), in the very output that shows the broken twin off.
    config = load_config(path)
    limit, trigger = config.expectations.max_lost_steps, config.inject_failure.after_checkpoint
    if limit is None or not isinstance(trigger, int):
        return
    band = (trigger, trigger + checkpoint_interval(config, trigger) + 1)
    assert not band[0] <= limit <= band[1], (
        f"maxLostSteps {limit} lies in {band}, where a restart from scratch lands: "
        f"set it below {trigger}"
    )


@pytest.mark.slow
@pytest.mark.local
def test_the_local_examples_own_unit_tests_pass() -> None:
    """What a user copies keeps working: examples/local/test_recovery.py's unit tests (the
    checkpoint round trip, the latest of the kept checkpoints, the batches) against the
    example's train.py as it is now. Its drills are run by tests/local."""
    import subprocess
    import sys

    folder = EXAMPLES / "local"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not drill"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=within(CLUSTER),
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout, proc.stdout[-3000:]
