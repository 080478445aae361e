"""Every drill config shipped under examples/ validates: what users copy must parse.

Kubernetes manifests (a ``kind:`` at the top) are not drill configs and are skipped; a
drill config is a mapping with ``workload``. Validation reads files only: nothing runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pytest_recoverygate.config import load_config

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
