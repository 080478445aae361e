"""A StorageFault's keys, and the bad input it refuses before anything starts.

We test these aspects:
- a valid StorageFault reaches the engine as a StorageSpec (mode, during, path, latency,
  duration, killAfter), and its keys are refused with other faults;
- each refusal names the file, the line, the key and the fix, and exits 2 from
  ``recoverygate validate``: an unknown mode, a missing mode or path, latency without
  ``mode: latency`` (and the reverse), ``during: load`` with ``killAfter``, ``count`` or
  ``delay``; a path that does not exist, is not a folder, is ``/``, a system folder or a
  shared root, or lies outside what the job can be shown to use;
- on slurm the scope waits for discovery; on ray it is the entrypoint's folders (its
  storage_path), and a cluster the drill does not start is refused; kubernetes refuses
  StorageFault with its reason.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.config.schema import spec_from_config
from pytest_recoverygate.errors import ConfigError

BASE = """\
workload:
  orchestrator: local
  command: [torchrun, --nproc-per-node=2, train.py, --ckpt-dir=./ckpt]
  workdir: .
injectFailure:
  type: StorageFault
{failure}
  afterCheckpoint: step-40
expectations:
  maxRecoveryTime: 60s
"""


def write(tmp_path: Path, failure: str) -> Path:
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    (tmp_path / "file").write_text("")
    path = tmp_path / "drill.yaml"
    path.write_text(BASE.format(failure=failure))
    return path


def refusal(tmp_path: Path, failure: str) -> str:
    path = write(tmp_path, failure)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


def test_a_storage_fault_reaches_the_engine(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, "  mode: latency\n  latency: 2s\n  during: load\n  path: ./ckpt\n"
              "  duration: 30s")
    )  # fmt: skip
    storage = spec_from_config(config).storage
    assert storage is not None
    assert (storage.mode, storage.during, storage.latency, storage.duration) == (
        "latency", "load", 2.0, 30.0
    )  # fmt: skip
    assert storage.path == str((tmp_path / "ckpt").resolve())
    assert storage.kill_after is False


@pytest.mark.parametrize(
    ("failure", "key", "words"),
    [
        ("  mode: full\n  path: ./ckpt", "injectFailure.mode", "is not a storage fault mode"),
        ("  path: ./ckpt", "injectFailure.mode", "needs a mode"),
        ("  mode: enospc", "injectFailure.path", "needs the job's checkpoint folder"),
        ("  mode: latency\n  path: ./ckpt", "injectFailure.latency", "needs the delay"),
        ("  mode: eio\n  latency: 1s\n  path: ./ckpt", "injectFailure.latency", "mode: latency only"),
        ("  mode: eio\n  during: load\n  killAfter: save\n  path: ./ckpt", "injectFailure.killAfter",
         "does not go with during: load"),
        ("  mode: eio\n  killAfter: later\n  path: ./ckpt", "injectFailure.killAfter", "none or save"),
        ("  mode: eio\n  during: restore\n  path: ./ckpt", "injectFailure.during", "save or load"),
        ("  mode: eio\n  count: 2\n  path: ./ckpt", "injectFailure.count", "does not apply"),
        ("  mode: eio\n  delay: 2s\n  path: ./ckpt", "injectFailure.delay", "does not apply"),
        ("  mode: eio\n  path: ./missing", "injectFailure.path", "does not exist"),
        ("  mode: eio\n  path: ./file", "injectFailure.path", "is not a folder"),
        ("  mode: eio\n  path: /", "injectFailure.path", "is /"),
        ("  mode: eio\n  path: /etc", "injectFailure.path", "a system folder"),
        ("  mode: eio\n  path: /usr/lib", "injectFailure.path", "a system folder"),
        ("  mode: eio\n  path: /tmp", "injectFailure.path", "a system folder"),
    ],
    ids=lambda value: value if "/" not in value and "\n" not in value else None,
)  # fmt: skip
def test_bad_storage_keys_are_refused_at_their_line(
    tmp_path: Path, failure: str, key: str, words: str
) -> None:
    message = refusal(tmp_path, failure)
    assert "drill.yaml:" in message and key in message, message
    assert words in message, message


def test_a_path_outside_what_the_job_uses_is_refused(tmp_path: Path) -> None:
    job, other = tmp_path / "job", tmp_path / "another-team"
    job.mkdir()
    (other / "ckpt").mkdir(parents=True)
    path = job / "drill.yaml"
    path.write_text(BASE.format(failure=f"  mode: eio\n  path: {other / 'ckpt'}"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "lies outside what the job can be shown to use" in str(caught.value)
    assert "injectFailure.path" in str(caught.value)


def test_a_path_the_command_names_outside_the_working_folder_is_accepted(
    tmp_path: Path,
) -> None:
    job, shared = tmp_path / "job", tmp_path / "shared" / "ckpt"
    job.mkdir()
    shared.mkdir(parents=True)
    text = BASE.format(failure=f"  mode: eio\n  path: {shared}").replace(
        "--ckpt-dir=./ckpt", f"--ckpt-dir={shared}"
    )
    (job / "drill.yaml").write_text(text)
    assert spec_from_config(load_config(job / "drill.yaml")).storage is not None


def test_validate_exits_2_naming_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "  mode: eio\n  path: /etc")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", "validate", "-f", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{path}:8: injectFailure.path" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ the other backends


SLURM = """\
workload:
  orchestrator: slurm
  jobName: rg-storage
injectFailure:
  type: StorageFault
  mode: enospc
  path: {path}
  afterCheckpoint: step-40
expectations:
  maxRecoveryTime: 60s
"""

RAY = """\
workload:
  orchestrator: ray
  entrypoint: [python, train_ray.py, --storage=./storage]
  workdir: .
{extra}injectFailure:
  type: StorageFault
  mode: enospc
  path: {path}
  afterCheckpoint: step-40
expectations:
  maxRecoveryTime: 2m
"""


def test_on_slurm_the_scope_waits_for_discovery(tmp_path: Path) -> None:
    """A Slurm job is found by id or name: its folders are read at discovery (the
    runner checks ``path`` then), so any folder that may be covered validates here."""
    (tmp_path / "anywhere").mkdir()
    path = tmp_path / "drill.yaml"
    path.write_text(SLURM.format(path="./anywhere"))
    config = load_config(path)
    assert config.workload.storage_scope() is None
    assert spec_from_config(config).storage is not None


def test_on_ray_the_storage_path_the_entrypoint_names_is_in_scope(tmp_path: Path) -> None:
    (tmp_path / "storage").mkdir()
    (tmp_path / "job" / "elsewhere").mkdir(parents=True)
    path = tmp_path / "drill.yaml"
    path.write_text(RAY.format(extra="", path="./storage"))
    config = load_config(path)
    assert (tmp_path / "storage").resolve() in (config.workload.storage_scope() or ())
    outside = tmp_path / "job" / "drill.yaml"
    outside.write_text(RAY.format(extra="", path=str(tmp_path / "storage")).replace(
        "--storage=./storage", "--storage=./elsewhere"))  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        load_config(outside)
    assert "lies outside what the job can be shown to use" in str(caught.value)


def test_on_ray_a_cluster_the_drill_does_not_start_is_refused(tmp_path: Path) -> None:
    """``address`` (a running cluster; a running Ray Job needs it too): the workers may
    be on other machines."""
    (tmp_path / "storage").mkdir()
    path = tmp_path / "drill.yaml"
    path.write_text(RAY.format(extra="  address: 127.0.0.1:6379\n", path="./storage"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "injectFailure.type" in message and "remove address" in message, message
    assert "a mount made here misses" in message, message


def test_on_kubernetes_it_is_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    path = tmp_path / "drill.yaml"
    path.write_text(
        "workload:\n  orchestrator: kubernetes\n  selector: app=train\n"
        "injectFailure:\n  type: StorageFault\n  mode: eio\n  path: ./ckpt\n"
        "  afterCheckpoint: step-40\nexpectations:\n  maxRecoveryTime: 60s\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "StorageFault cannot be injected on kubernetes yet" in str(caught.value)
