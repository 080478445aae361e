"""A StorageFault's keys, and the bad input it refuses before anything starts.

We test these aspects:
- a valid StorageFault reaches the engine as a StorageSpec (mode, during, path, latency,
  duration, killAfter), and its keys are refused with other faults;
- each refusal names the file, the line, the key and the fix, and exits 2 from
  ``recoverygate validate``: an unknown mode, a missing mode or path, latency without
  ``mode: latency`` (and the reverse), ``during: load`` with ``killAfter``, ``count`` or
  ``delay``; a path that does not exist, is not a folder, is ``/``, a system folder or a
  shared root, or lies outside what the job can be shown to use.
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
