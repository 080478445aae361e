"""StorageFault on the real Slurm test cluster, each verdict held to the job's own records.

We test these aspects, with the example sbatch script and recovery-test yamls a user
would copy (examples/slurm/torchrun-storage.sbatch: examples/local/storage/
train_storage.py under torchrun in one step), run as a user runs them (``recoverygate run``):
- on the one-node cluster (its slurmd, and so the job, in the drill's mount namespace):
  enospc against the atomic saver: the save fails, the job says so and fails, torchrun
  restarts its workers in the same step and they resume from the newest durable
  checkpoint (PASS; the job's records: the failed save, the step loaded); its twin whose
  writer thread reports the failed save complete (FAIL ``SAVE_FAILURE_SWALLOWED``);
- the layer is mounted after discovery, over a job already saving: the trigger is a
  checkpoint the layer saw written;
- refused before anything is mounted (ERROR, nothing left): a ``path`` outside what the
  running job shows it uses; a job whose slurmd runs in a mount namespace of its own (the
  session's cluster of several nodes), where the layer would not show;
- after every drill: no mount, no layer process, no owner record.
"""

from __future__ import annotations

import contextlib
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from pytest_recoverygate.storage.layer import our_mounts
from tests.cli_drill import run_cli_drill
from tests.patience import CLUSTER, eventually, within
from tests.slurm.slurm_testcluster import SlurmCluster
from tests.storage_truth import Run, left_behind, read_truth, record_for_the_docs

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "slurm"
TRAIN = ROOT / "examples" / "local" / "storage" / "train_storage.py"


@pytest.fixture
def one_node(slurm_one_node: SlurmCluster) -> Iterator[SlurmCluster]:
    """The one-node cluster; the jobs a test submits are cancelled after it."""
    try:
        yield slurm_one_node
    finally:
        slurm_one_node.cancel_all()


def drill(
    cluster: SlurmCluster,
    tmp_path: Path,
    config: str,
    *,
    saver: str = "atomic",
    path: Path | None = None,
) -> Run:
    """Submit torchrun-storage.sbatch (``saver``) and run the example drill ``config``
    against it, its ``path`` the job's checkpoint folder (or ``path``)."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    name = f"rg-{tmp_path.name}"[:60]
    mark = uuid.uuid4().hex
    cluster.submit(
        (EXAMPLES / "torchrun-storage.sbatch").read_text(),
        "-J",
        name,
        "-o",
        str(tmp_path / "%x-%j.out"),
        workdir=tmp_path,
        env={
            "RECOVERYGATE_PYTHON": sys.executable,
            "RECOVERYGATE_TRAIN": str(TRAIN),
            "RECOVERYGATE_CKPT_DIR": str(folder),
            "RECOVERYGATE_GROUND_TRUTH": str(tmp_path / "truth"),
            "SAVER": saver,
            "RG_E2E_MARK": mark,
        },
    )
    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / config).read_text())
    spec["workload"]["jobName"] = name
    spec["injectFailure"]["path"] = str(path or folder)
    run = run_cli_drill(spec, tmp_path / config, timeout=within(CLUSTER), env=cluster.env)
    record_for_the_docs(f"slurm/{config}", run.report, run.wall)
    cluster.cancel_all()  # the job is the user's: a drill leaves it running
    # scancel: SIGTERM, then SIGKILL after KillWait
    eventually(lambda: not _running(mark), "the job's processes gone", seen=lambda: _running(mark))
    left = left_behind(mark, path or folder)
    assert not left, "left behind:\n" + "\n".join(left)
    assert not [t for t, _ in our_mounts() if t.startswith(str(tmp_path))]
    return Run(run.report, run.code, run.output, read_truth(tmp_path / "truth"))


def _running(mark: str) -> list[int]:
    """The processes of the job marked ``mark`` (its environment's RG_E2E_MARK)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("RG_E2E_MARK") == mark:
                found.append(proc.pid)
    return found


def test_an_atomic_saver_under_enospc_fails_loudly_and_resumes_from_the_last_durable(
    one_node: SlurmCluster, tmp_path: Path
) -> None:
    run = drill(one_node, tmp_path, "recovery-test-storage-enospc.yaml")
    assert run.report["verdict"] == "PASS" and run.code == 0, run.explain()
    storage = run.storage
    hit, durable = storage["saveHit"], storage["lastDurableCheckpoint"]
    assert storage["firstOperation"]["error"] == "ENOSPC", storage
    assert hit == durable + 20, storage  # the first save after the trigger checkpoint
    # The job's own records: its first process saved `durable` durably and failed `hit`
    # (never reported complete); the replacement the drill judged loaded `durable`.
    first, *later = run.processes
    assert max(s for s in run.events(first, "durable") if s < hit) == durable, first
    assert hit in run.events(first, "save_failed"), first
    assert hit not in run.events(first, "reported_complete"), first
    loaded = [run.events(p, "loaded")[0] for p in later if run.events(p, "step")]
    assert loaded and loaded[0] == run.report["resumeStep"] == durable, (loaded, run.explain())
    assert run.report["expectedResumeStep"] == durable
    checks = {c["name"]: c for c in run.report["checks"]}
    assert checks["failed_save_not_counted"]["passed"] is True, run.explain()
    assert checks["last_good_checkpoint_kept"]["passed"] is True, run.explain()
    # mounted after discovery, over the job already running: discovery found the target's
    # process (its pid and start time), and the layer was mounted before the drill went on.
    # (Not "after the job's first line": a worker group that fails before its first line,
    # as one did on a port another process took, leaves its replacement's line the first.)
    timeline = run.report["timeline"]
    [mounted] = [e for e in timeline if e["detail"].startswith("storage layer mounted")]
    [found] = [e for e in timeline if e["kind"] == "discovered"]
    assert re.search(r"instance \S+/\d+@\d+", found["detail"]), found
    assert mounted["time"] <= found["time"], timeline


def test_a_writer_thread_that_reports_a_failed_save_complete_fails(
    one_node: SlurmCluster, tmp_path: Path
) -> None:
    run = drill(one_node, tmp_path, "recovery-test-storage-swallow.yaml", saver="swallow")
    assert run.report["verdict"] == "FAIL" and run.code == 1, run.explain()
    assert run.report["reasons"][0] == "SAVE_FAILURE_SWALLOWED", run.explain()
    hit = run.storage["saveHit"]
    first = run.processes[0]
    # its own records: the write failed, and it reported the checkpoint complete anyway
    assert hit in run.events(first, "save_failed"), first
    assert hit in run.events(first, "reported_complete"), first


def test_a_path_outside_what_the_job_uses_is_refused_before_anything_is_mounted(
    one_node: SlurmCluster, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    elsewhere = tmp_path_factory.mktemp("not-the-job's")
    run = drill(one_node, tmp_path, "recovery-test-storage-enospc.yaml", path=elsewhere)
    assert run.report["verdict"] == "ERROR" and run.code == 3, run.explain()
    assert "lies outside what the job can be shown to use" in run.report["summary"], run.explain()
    assert "nothing was mounted" in run.report["summary"]
    assert not any(e["kind"] == "storage" for e in run.report["timeline"]), run.explain()


def test_a_job_in_a_mount_namespace_of_its_own_is_refused(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The session's cluster of several nodes: each slurmd (and so each job) runs in a
    mount namespace of its own, where a layer mounted by the drill would not show."""
    if len(slurm.nodes) < 2:
        pytest.skip("needs the cluster of several nodes (RECOVERYGATE_SLURM_NODES=3, the default)")
    run = drill(slurm, tmp_path, "recovery-test-storage-enospc.yaml")
    assert run.report["verdict"] == "ERROR" and run.code == 3, run.explain()
    assert "runs in a mount namespace of its own" in run.report["summary"], run.explain()
    assert "nothing was mounted" in run.report["summary"]
