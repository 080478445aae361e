"""The owner records ``recoverygate sweep`` reads, as hostile input (no root needed).

We test these aspects on records in a private folder, with no namespace involved (those
are tests/local/test_netns_sweep.py):
- a claim is written and locked before it is visible, leaves no draft, and is removed on
  a clean release; a release that is not clean leaves it for the sweep;
- a running drill's record (its lock held) is left alone;
- a dead drill's record: its folder (the very folder it made) and the record go;
- the folder is left alone when another folder has its name now, or a link does (and
  so is what the link points to);
- a record that is a link, has a second link, is not JSON (or nested past Python's
  limit), names another drill, or has a name that is no drill id is left alone, said so;
- the CLI says what it swept, and that there is nothing to sweep after that (exit 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_recoverygate.orchestrators.local.sweep import RECORD_PREFIX, claim, sweep
from tests.patience import JOB, within

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "locks"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("RECOVERYGATE_LOCK_DIR", str(folder))
    return folder


def drill_folder(tmp_path: Path, name: str = "recoverygate-nodes-x") -> Path:
    folder = tmp_path / name
    (folder / "shared").mkdir(parents=True)
    (folder / "hosts").write_text("10.77.0.1 node0\n")
    return folder


def record(locks: Path, drill_id: str) -> Path:
    return locks / f"{RECORD_PREFIX}{drill_id}.json"


def ours(found: list[str]) -> list[str]:
    """The sweep's lines about these tests' records. A namespace named like a drill's is
    another drill's on this machine (these tests make none): none of theirs."""
    return [line for line in found if not line.startswith("namespace ")]


def lines(locks: Path) -> list[str]:
    return ours(sweep(directory=locks).lines)


def test_a_claim_is_locked_when_visible_and_removed_on_a_clean_release(
    locks: Path, tmp_path: Path
) -> None:
    folder = drill_folder(tmp_path)
    owner = claim("abc123", folder)
    assert sorted(p.name for p in locks.iterdir()) == [record(locks, "abc123").name]
    content = json.loads(record(locks, "abc123").read_text())
    assert content["drill"] == "abc123" and content["folder"] == str(folder)
    assert content["pid"] == os.getpid()
    assert "drill rgabc123: running (it holds its record); left alone" in lines(locks)
    assert folder.is_dir()
    owner.release(done=True)
    assert list(locks.iterdir()) == []


def test_a_dead_drills_record_and_folder_are_swept(locks: Path, tmp_path: Path) -> None:
    folder = drill_folder(tmp_path)
    claim("abc123", folder).release(done=False)  # as if it died: the lock is gone
    report = sweep(directory=locks)
    assert ours(report.lines) == [
        f"drill rgabc123 (no longer running; its record names pid {os.getpid()}): removed namespaces none; "
        f"removed its folder {folder}"
    ]
    assert report.swept == ["abc123"] and report.problems == []
    assert not folder.exists() and not record(locks, "abc123").exists()


def test_a_dry_run_touches_nothing(locks: Path, tmp_path: Path) -> None:
    folder = drill_folder(tmp_path)
    claim("abc123", folder).release(done=False)
    report = sweep(directory=locks, dry_run=True)
    assert ours(report.lines)[0].endswith(
        f"would remove namespaces none, the processes in them, and {folder}"
    )
    assert folder.is_dir() and record(locks, "abc123").is_file()


def test_a_folder_that_another_took_the_name_of_is_left_alone(locks: Path, tmp_path: Path) -> None:
    folder = drill_folder(tmp_path)
    claim("abc123", folder).release(done=False)
    folder.rename(tmp_path / "moved")
    drill_folder(tmp_path)  # someone else's folder by that name now
    report = sweep(directory=locks)
    assert f"; {folder} is not the folder the drill made (another file" in ours(report.lines)[0]
    assert (folder / "hosts").is_file() and (tmp_path / "moved").is_dir()


def test_a_folder_replaced_by_a_link_is_left_alone_and_so_is_what_it_points_to(
    locks: Path, tmp_path: Path
) -> None:
    folder = drill_folder(tmp_path)
    claim("abc123", folder).release(done=False)
    precious = tmp_path / "precious"
    folder.rename(precious)
    folder.symlink_to(precious)
    report = sweep(directory=locks)
    assert "is not the folder the drill made" in ours(report.lines)[0]
    assert (precious / "hosts").is_file()


@pytest.mark.parametrize(
    ("make", "said"),
    [
        ("link", "cannot be opened"),
        ("second link", "not a plain file of this user"),
        ("not json", "not what a drill writes"),
        ("nested", "not what a drill writes"),
        ("another drill", "not what a drill writes"),
        ("no folder id", "not what a drill writes"),
    ],
)
def test_a_hostile_record_is_left_alone_and_said_so(
    locks: Path, tmp_path: Path, make: str, said: str
) -> None:
    folder = drill_folder(tmp_path)
    path = record(locks, "abc123")
    good = {"drill": "abc123", "pid": 1, "folder": str(folder), "folderId": [0, 0]}
    if make == "link":
        target = tmp_path / "target.json"
        target.write_text(json.dumps(good))
        path.symlink_to(target)
    elif make == "second link":
        path.write_text(json.dumps(good))
        os.link(path, tmp_path / "other")
    elif make == "not json":
        path.write_text("{not json")
    elif make == "nested":
        path.write_text("[" * 3000 + "]" * 3000)
    elif make == "another drill":
        path.write_text(json.dumps({**good, "drill": "ffffff"}))
    else:
        path.write_text(json.dumps({k: v for k, v in good.items() if k != "folderId"}))
    [line] = lines(locks)
    assert said in line and "left alone" in line
    assert folder.is_dir()


def test_a_record_whose_name_is_no_drill_id_is_left_alone(locks: Path) -> None:
    odd = locks / f"{RECORD_PREFIX}XYZ.json"
    odd.write_text("{}")
    assert lines(locks) == [f"{odd}: not a record a drill writes; left alone"]
    assert odd.exists()


def run_cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "reporter")])
    return subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", "sweep"],
        env={**os.environ, **env, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )


def test_the_cli_says_what_it_swept(locks: Path, tmp_path: Path) -> None:
    folder = drill_folder(tmp_path)
    claim("abc123", folder).release(done=False)
    done = run_cli({"RECOVERYGATE_LOCK_DIR": str(locks)})
    assert done.returncode == 0, done.stderr
    assert (
        f"drill rgabc123 (no longer running; its record names pid {os.getpid()}): removed"
        in done.stdout
    )
    again = run_cli({"RECOVERYGATE_LOCK_DIR": str(locks)})
    nothing = f"nothing to sweep: no drill's owner record in {locks}"
    assert again.returncode == 0 and ours(again.stdout.splitlines()) in ([nothing], []), again
