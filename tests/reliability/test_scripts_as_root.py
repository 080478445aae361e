"""The scripts that run as root never run a program from the caller's PATH (issue 41).

Root's ``PATH`` may name a folder a user or a job can write; the drill itself runs its
root tools from root-owned system folders only (netns.py). We test these aspects, as
root, with a folder of planted programs first on ``PATH`` (every tool the scripts use:
each one leaves a mark and fails):

- ``scripts/slurm-cluster down`` and ``status`` run none of them (the script takes root's
  system folders as PATH, each checked to be root's and written by no one else);
- ``scripts/demo`` runs none of them before it hands over to ``scripts/setup`` (a stub
  here: the real one builds a 2 GB venv), and hands it root's system folders as PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.patience import JOB, within

ROOT = Path(__file__).resolve().parents[2]
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the scripts' root paths")
TRUSTED = "/usr/sbin:/usr/bin:/sbin:/bin"
#: What the scripts run, and what a caller's PATH could hold instead.
TOOLS = (
    "awk basename cat chmod chown cut date dirname getent grep head hostname id ip kill ls "
    "mkdir mktemp nsenter pgrep ps readlink realpath rm scancel scontrol sed seq sinfo sleep "
    "sort squeue stat tail timeout touch tr unshare"
).split()


def planted(folder: Path) -> tuple[Path, Path]:
    """A folder of programs named as the system's, each writing its name to a mark."""
    tools, mark = folder / "planted", folder / "ran"
    tools.mkdir()
    for name in TOOLS:
        path = tools / name
        path.write_text(f"#!/bin/sh\necho {name} >> {mark}\nexit 1\n")
        path.chmod(0o755)
    return tools, mark


@ROOT_ONLY
@pytest.mark.parametrize("command", ["down", "status"])
def test_slurm_cluster_runs_nothing_from_the_callers_path(command: str, tmp_path: Path) -> None:
    tools, mark = planted(tmp_path)
    folder = tmp_path / "cluster"
    folder.mkdir(mode=0o700)
    (folder / ".slurm-cluster").write_text("rg-0123456789abcdef\n")
    for sub in ("etc", "run", "munge"):
        (folder / sub).mkdir()
    env = {**os.environ, "PATH": f"{tools}:{os.environ.get('PATH', TRUSTED)}"}

    proc = subprocess.run(
        [str(ROOT / "scripts" / "slurm-cluster"), command, str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )

    ran = mark.read_text().split() if mark.exists() else []
    assert ran == [], f"ran from the caller's PATH: {sorted(set(ran))}\n{proc.stderr}"


@ROOT_ONLY
def test_demo_runs_nothing_from_the_callers_path(tmp_path: Path) -> None:
    tools, mark = planted(tmp_path)
    tree = tmp_path / "checkout"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "demo", tree / "scripts" / "demo")
    seen = tmp_path / "setup-saw"
    setup = tree / "scripts" / "setup"
    setup.write_text(f'#!/bin/sh\necho "$PATH" > {seen}\nexit 3\n')
    setup.chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}:{os.environ.get('PATH', TRUSTED)}"}

    proc = subprocess.run(
        ["/bin/bash", str(tree / "scripts" / "demo")],
        env=env,
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )

    ran = mark.read_text().split() if mark.exists() else []
    assert ran == [], f"ran from the caller's PATH: {sorted(set(ran))}\n{proc.stderr}"
    assert proc.returncode == 2, proc.stderr  # the stub setup failed: the demo stops there
    assert seen.read_text().strip() == TRUSTED
