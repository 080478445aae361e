"""StickyFault's poison (storage.poison): a file that exists exactly while its drill arms it.

We test these aspects:
- the job's environment names the rank, the step and the file; the file exists only
  between ``arm`` and ``disarm``/``close``; ``close`` removes the record too;
- the sweep leaves a running drill's poison (its record is held) and removes a dead
  drill's armed poison and its record, or a poison file with no record; it leaves files
  that are not a drill's alone.
"""

from __future__ import annotations

import os
from pathlib import Path

from pytest_recoverygate.storage.poison import ENV, POISON_PREFIX, Poison, sweep


def test_the_file_exists_only_while_armed(tmp_path: Path) -> None:
    poison = Poison(1, 50, directory=tmp_path)
    rank, step, path = poison.environment[ENV].split(":", 2)
    assert (rank, step, Path(path)) == ("1", "50", poison.file)
    assert not poison.file.exists()
    poison.arm()
    assert poison.file.exists()
    assert poison.disarm() and not poison.file.exists()
    poison.arm()
    assert poison.close() is None
    assert list(tmp_path.iterdir()) == []


def test_the_sweep_removes_only_dead_drills_poisons(tmp_path: Path) -> None:
    running = Poison(1, 50, directory=tmp_path)
    running.arm()
    dead = Poison(0, 7, directory=tmp_path)
    dead.arm()
    assert dead._fd is not None
    os.close(dead._fd)  # the drill died: nothing holds its record any more
    dead._fd = None
    orphan = tmp_path / f"{POISON_PREFIX}{'a' * 16}.armed"
    orphan.touch()
    stranger = tmp_path / f"{POISON_PREFIX}not-ours.armed"
    stranger.touch()
    listed = sweep(dry_run=True, directory=tmp_path)
    assert dead.file.exists() and orphan.exists(), "a dry run removes nothing"
    assert sum("would remove" in line for line in listed.lines) == 2
    report = sweep(directory=tmp_path)
    assert not dead.file.exists() and not dead.record.exists() and not orphan.exists()
    assert running.file.exists() and stranger.exists()
    assert any("its drill is running; left alone" in line for line in report.lines)
    assert any("not a file a drill writes" in line for line in report.lines)
    assert report.problems == []
    assert running.close() is None
