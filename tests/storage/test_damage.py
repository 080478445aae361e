"""StickyFault's damage (storage.damage): exactly the files a save wrote, under the folder.

We test these aspects, on real files:
- the files whose last write lies in the save's window are found, below sub-folders too,
  under their final names after a rename; older files are not;
- each damage does what it says (half the size; 4 KiB of zeros; one byte inverted) and
  keeps the file's name;
- nothing outside the folder is ever touched: a planted link to a file or a folder
  outside, a hard link to a file outside, a name that climbs out (``..``), all in the
  window, are left alone, and the files they point at keep their bytes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pytest_recoverygate.storage.damage import BLOCK, damage, files_written


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, float, float]:
    """A folder with an old checkpoint and a save (a rename, a sub-folder) in a window."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "step-20.pt").write_bytes(b"t" * 10_000)
    old = time.time() - 60
    os.utime(folder / "step-20.pt", (old, old))
    start = time.time()
    (folder / ".tmp-40").write_bytes(b"f" * 10_000)
    os.rename(folder / ".tmp-40", folder / "step-40.pt")
    (folder / "shards").mkdir()
    (folder / "shards" / "rank-1.pt").write_bytes(b"s" * 8_192)
    return folder, start, time.time()


def test_the_files_a_save_wrote_are_found_under_their_final_names(
    saved: tuple[Path, float, float],
) -> None:
    folder, start, end = saved
    assert files_written(folder, start, end) == [
        ("shards/rank-1.pt", 8_192),
        ("step-40.pt", 10_000),
    ]


def test_each_damage_does_what_it_says(saved: tuple[Path, float, float]) -> None:
    folder, _, _ = saved
    [cut] = damage(folder, ["step-40.pt"], "truncate")
    assert (folder / "step-40.pt").stat().st_size == 5_000 and cut.size == 10_000
    [zeroed] = damage(folder, ["shards/rank-1.pt"], "zero")
    data = (folder / "shards" / "rank-1.pt").read_bytes()
    assert data.count(0) == BLOCK and len(data) == 8_192, zeroed
    before = (folder / "step-20.pt").read_bytes()
    [flipped] = damage(folder, ["step-20.pt"], "flip")
    after = (folder / "step-20.pt").read_bytes()
    assert [i for i in range(len(before)) if before[i] != after[i]] == [5_000], flipped


def test_nothing_outside_the_folder_is_touched(
    tmp_path: Path, saved: tuple[Path, float, float]
) -> None:
    folder, start, _ = saved
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data").write_bytes(b"p" * 4_096)
    (folder / "link-to-file").symlink_to(outside / "data")
    (folder / "link-to-folder").symlink_to(outside)
    os.link(outside / "data", folder / "hardlink")  # two names: never written
    end = time.time()
    found = [name for name, _ in files_written(folder, start, end)]
    assert "link-to-file" not in found and "hardlink" not in found
    assert not any(name.startswith("link-to-folder") for name in found)
    asked = [
        "link-to-file",
        "link-to-folder/data",
        "hardlink",
        "../precious/data",
        "shards/../../precious/data",
    ]
    assert damage(folder, asked, "truncate") == []
    assert (outside / "data").read_bytes() == b"p" * 4_096
