"""Fixtures shared by the unit tests: drill configs written to disk, fake backends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.config.loading import DrillConfig, load_config

pytest_plugins = ["tests.slurm.cluster_fixture"]  # one Slurm cluster per session, for all folders

FAKE_DRILL: dict[str, Any] = {
    "workload": {
        "orchestrator": "fake",
        "fake": {
            "workers": 2,
            "stepsPerSecond": 100,
            "checkpointEvery": 20,
            "restartDelay": "500ms",
            "resume": "latest",
        },
    },
    "injectFailure": {"type": "KillWorker", "afterCheckpoint": "step-40"},
    "expectations": {"resumeFromCheckpoint": "latest", "maxRecoveryTime": "2s", "maxLostSteps": 40},
    "safety": {"requireConfirm": False},
    "timeouts": {"recovery": "5s"},
}


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


@pytest.fixture
def write_drill(tmp_path: Path) -> Callable[..., Path]:
    """Write a fake-backend drill YAML (with nested changes) and return its path."""

    def write(changes: dict[str, Any] | None = None, name: str = "recovery-test.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(merge(FAKE_DRILL, changes or {}), sort_keys=False))
        return path

    return write


@pytest.fixture
def fake_config(write_drill: Callable[..., Path]) -> Callable[..., DrillConfig]:
    """A loaded fake-backend drill config (with nested changes)."""

    def make(changes: dict[str, Any] | None = None) -> DrillConfig:
        return load_config(write_drill(changes))

    return make
