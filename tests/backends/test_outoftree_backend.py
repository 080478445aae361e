"""A backend from outside the package, installed like a pytest plugin.

``tests/backends/outoftree/`` is its own distribution (``recoverygate-procgroup``): a
group of worker processes the drill starts and restarts, registered under the
``recoverygate.backends`` entry-point group -- the code of docs/backends.md. We test these
aspects:

- it is found through its entry point only: pip installs it into a folder of its own,
  and a drill sees it when that folder is on the path (and not otherwise);
- a drill from YAML, through the CLI, runs on it to a PASS with the figures;
- its own keys get the same ``FILE:LINE: key: problem — got …; allowed: …`` errors as a
  built-in backend's, and ``validate`` prints its effective config;
- it changes no file of the package: nothing in ``pytest_recoverygate`` names it;
- docs/backends.md shows its code as it is.

One pip install (a few seconds) serves the module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.patience import CLUSTER, within

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE / "outoftree"
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example installed by pip into a folder of its own (a copy is built, so the
    source tree gets no build/ or egg-info)."""
    work = tmp_path_factory.mktemp("outoftree")
    source = work / "src"
    shutil.copytree(EXAMPLE, source)
    target = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source)],
        check=True, timeout=within(CLUSTER),
    )  # fmt: skip
    assert (target / "rg_procgroup" / "__init__.py").is_file()
    assert list(target.glob("recoverygate_procgroup-*.dist-info/entry_points.txt"))
    return target


def recoverygate(*args: str, site: Path | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["RECOVERYGATE_PROGRESS_INTERVAL"] = "0"
    if site is not None:
        env["PYTHONPATH"] = str(site)  # what `pip install recoverygate-procgroup` would do
    return subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", *args],
        capture_output=True, text=True, timeout=within(CLUSTER), cwd=cwd, env=env, check=False,
    )  # fmt: skip


def drill(folder: Path, workload: str) -> Path:
    shutil.copy(EXAMPLE / "train.py", folder / "train.py")
    path = folder / "recovery-test.yaml"
    path.write_text(
        "workload:\n"
        "  orchestrator: procgroup\n" + workload + "injectFailure:\n"
        "  afterCheckpoint: step-20\n"
        "expectations:\n"
        "  maxRecoveryTime: 30s\n"
        "  maxLostSteps: 50\n"
        "  sustain: 3 steps\n"  # the example job trains 120 steps (2.4 s) in all
        "safety:\n"
        "  requireConfirm: false\n"
    )
    return path


@pytest.mark.e2e
def test_a_drill_from_yaml_runs_on_the_installed_backend_to_a_pass(
    site: Path, tmp_path: Path
) -> None:
    config = drill(
        tmp_path,
        f"  command: [{sys.executable}, train.py, '120']\n  workers: 2\n  restartDelay: 200ms\n",
    )
    report = tmp_path / "report.json"
    proc = recoverygate(
        "run", "-f", str(config), "-q", "--report", str(report), site=site, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(report.read_text())
    assert (doc["verdict"], doc["orchestrator"]) == ("PASS", "procgroup")
    assert doc["resumeStep"] == doc["expectedResumeStep"] >= 20
    assert doc["restarts"] == 1
    assert "RecoveryGate verdict: PASS" in proc.stdout


def test_it_is_found_through_its_entry_point_only(tmp_path: Path) -> None:
    config = drill(tmp_path, f"  command: [{sys.executable}, train.py]\n")
    proc = recoverygate("validate", "-f", str(config), site=None, cwd=tmp_path)
    assert proc.returncode == 2
    assert f"{config}:2: workload.orchestrator: is not a known orchestrator — got procgroup" in (
        proc.stderr
    )
    assert importlib_spec("rg_procgroup") is None  # never importable from this process


def importlib_spec(name: str) -> object:
    import importlib.util

    return importlib.util.find_spec(name)


def test_its_own_keys_get_file_line_errors(site: Path, tmp_path: Path) -> None:
    config = drill(
        tmp_path,
        "  command: []\n  workers: 1\n  restartDelya: 1s\n  maxRestarts: -1\n  workdir: nowhere\n",
    )
    proc = recoverygate("validate", "-f", str(config), site=site, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()[1:]
    assert lines == [
        f"{config}:3: workload.command: must not be empty — got [] (an empty list); allowed: a "
        'list of strings like ["torchrun", "train.py"], or one string (e.g. command: '
        "[python3, train.py])",
        f"{config}:4: workload.workers: is too small — got 1; allowed: a whole number from 2 "
        "to 64 (e.g. workers: 2)",
        f"{config}:5: workload.restartDelya: unknown key — got restartDelya; allowed: "
        "reportingRank, orchestrator, command, workers, restartDelay, maxRestarts, workdir "
        "(did you mean restartDelay?)",
        f"{config}:6: workload.maxRestarts: is too small — got -1; allowed: a whole number "
        ">= 0 (e.g. maxRestarts: 3)",
        f"{config}:7: workload.workdir: does not exist: {tmp_path / 'nowhere'} — got nowhere; "
        "allowed: an existing folder, relative to the config file's folder (create it or fix "
        "the path)",
    ]


def test_validate_prints_its_effective_config(site: Path, tmp_path: Path) -> None:
    config = drill(tmp_path, "  command: python3 train.py 50\n  restartDelay: 250ms\n")
    proc = recoverygate("validate", "-f", str(config), site=site, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "(procgroup drill 'recovery-test')" in proc.stdout
    assert (
        "workload:\n  reportingRank: 0\n  orchestrator: procgroup\n  command:\n  - python3\n"
        "  - train.py\n  - '50'\n  workers: 2\n  restartDelay: 250ms\n  maxRestarts: 3\n"
    ) in proc.stdout


def test_it_changes_no_file_of_the_package() -> None:
    named = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "pytest_recoverygate").rglob("*.py")
        if re.search(r"procgroup|rg_procgroup", path.read_text())
    ]
    assert named == []


def test_the_tutorial_shows_the_examples_code_as_it_is() -> None:
    """Each code block of docs/backends.md headed by a file name is that file's text."""
    text = (ROOT / "docs" / "backends.md").read_text()
    blocks = re.findall(r"`(tests/backends/outoftree/[\w/.]+)`:\n\n```\w*\n(.*?)```", text, re.S)
    assert {name for name, _ in blocks} >= {
        "tests/backends/outoftree/pyproject.toml",
        "tests/backends/outoftree/rg_procgroup/__init__.py",
        "tests/backends/outoftree/rg_procgroup/orchestrator.py",
    }
    for name, code in blocks:
        assert code in (ROOT / name).read_text(), f"docs/backends.md shows {name} out of date"
