"""StorageFault on a Ray Train run's ``storage_path``, the verdict held to the job's records.

We test these aspects, with examples/ray/recovery-test-storage-enospc.yaml run as a user
runs it (``recoverygate run``), train_ray.py writing its own records
(``RECOVERYGATE_GROUND_TRUTH``: the step each worker loaded, each save started, each
``ray.train.report`` with a checkpoint that returned or raised):
- the storage layer covers the storage_path the entrypoint names, mounted before the
  driver starts; enospc from the checkpoint at step 40 on;
- what Ray does, as measured (docs/ray.md): rank 0's next ``report`` cannot persist its
  checkpoint (``OSError`` ENOSPC creating the checkpoint folder: its records say so), and
  Train's controller rewrites its index of the run's checkpoints,
  ``checkpoint_manager_snapshot.json``, in place: truncated while the storage is full, a
  run restored from that storage_path cannot start. FAIL ``LAST_GOOD_CHECKPOINT_DELETED``
  naming the index, decided while the fault holds;
- after the drill: no mount, no layer process, no owner record, no process of the drill's
  cluster.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli_drill import run_cli_drill
from tests.patience import DRILL, within
from tests.storage_truth import Run, left_behind, read_truth, record_for_the_docs

pytest.importorskip("ray", reason='the ray backend needs pip install "recoverygate[ray]"')

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ray"
INDEX = "recoverygate-example/checkpoint_manager_snapshot.json"


def drill(name: str, tmp_path: Path) -> Run:
    """examples/ray/<name> with the run's storage_path in ``tmp_path``, ground truth on."""
    config: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    storage = tmp_path / "storage"
    storage.mkdir()
    workload = config["workload"]
    workload["workdir"] = str(EXAMPLES)
    workload["entrypoint"] = [
        f"--storage={storage}" if word.startswith("--storage=") else word
        for word in workload["entrypoint"]
    ]
    config["injectFailure"]["path"] = str(storage)
    mark = uuid.uuid4().hex
    workload["env"].update(RECOVERYGATE_GROUND_TRUTH=str(tmp_path / "truth"), RG_E2E_MARK=mark)
    run = run_cli_drill(config, tmp_path / name, timeout=within(DRILL))
    record_for_the_docs(f"ray/{name}", run.report, run.wall)
    left = left_behind(mark, storage)
    assert not left, "left behind:\n" + "\n".join(left)
    return Run(run.report, run.code, run.output, read_truth(tmp_path / "truth"))


def test_a_full_storage_path_truncates_rays_checkpoint_index(tmp_path: Path) -> None:
    run = drill("recovery-test-storage-enospc.yaml", tmp_path)
    assert run.report["verdict"] == "FAIL" and run.code == 1, run.explain()
    assert run.report["reasons"][0] == "LAST_GOOD_CHECKPOINT_DELETED", run.explain()
    storage = run.storage
    assert storage["firstOperation"]["error"] == "ENOSPC", storage
    [fact] = [f for f in storage["jobDid"] if f["what"] == "removed its last durable checkpoint"]
    assert fact["shownBy"].startswith(f"{INDEX} truncated"), fact
    assert f"{INDEX} was part of checkpoints" in run.report["summary"], run.explain()
    # The job's own records: rank 0 reported the last durable checkpoint (its report
    # returned: Ray persisted it) and the report of the save the fault hit raised ENOSPC.
    first = run.processes[0]
    hit, durable = storage["saveHit"], storage["lastDurableCheckpoint"]
    assert durable in run.events(first, "reported"), first
    failed = [row for row in first if row["event"] == "save_failed" and row["step"] == hit]
    assert failed and "No space left on device" in failed[0]["error"], first
    assert hit not in run.events(first, "reported"), first
