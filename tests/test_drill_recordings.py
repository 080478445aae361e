"""The twin drills judged from their recordings, in the quick lane: no drill runs here.

Each twin of tests/recorded_drills.py ran live once, its test passing on real processes
(``scripts/test --record-twins``), and its drills' report folders were kept in
``tests/fixtures/drills/<test>/``. Each is rejudged here through a fresh engine with no
clock.

We test these aspects:
- every recorded drill replays with every answer of the engine as recorded and gives the
  recorded report value for value (verdict, reasons, summary, checks, figures): the
  engine still reads each twin's job as it did when the twin's test passed on it;
- every twin has its recording, and every recording is a twin's;
- every twin's sibling is a test of the suite that stays live (not itself a twin), so
  that its fault and backend still run on real processes in every run.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.recorded_drills import RECORDINGS, TWINS, recording_folder
from tests.transcripts import assert_rejudged

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = sorted(p for p in RECORDINGS.iterdir() if p.is_dir()) if RECORDINGS.is_dir() else []
DRILLS = [drill for folder in FOLDERS for drill in sorted(folder.iterdir()) if drill.is_dir()]


@pytest.mark.parametrize("drill", DRILLS, ids=lambda p: f"{p.parent.name[-60:]}/{p.name}")
def test_each_recorded_twin_drill_replays_to_its_report(drill: Path) -> None:
    judged = assert_rejudged(drill)
    assert judged.recorded is not None
    assert judged.doc["verdict"] == judged.recorded["verdict"]


def test_every_twin_has_its_recording_and_every_recording_is_a_twin_s() -> None:
    expected = {recording_folder(nodeid): nodeid for nodeid in TWINS}
    missing = sorted(nodeid for folder, nodeid in expected.items() if folder not in FOLDERS)
    extra = sorted(folder.name for folder in FOLDERS if folder not in expected)
    assert not missing, f"not recorded (scripts/test --record-twins): {missing}"
    assert not extra, f"recordings of no twin (remove them): {extra}"
    for folder, nodeid in expected.items():
        meta = json.loads((folder / "meta.json").read_text("utf-8"))
        assert meta["test"] == nodeid
        assert meta["drills"], f"{nodeid}: its recording has no drill"
        assert sorted(meta["drills"]) == sorted(p.name for p in folder.iterdir() if p.is_dir())


def _defined(nodeid: str) -> bool:
    """Whether the test function ``nodeid`` names is defined in its module."""
    path, _, name = nodeid.partition("::")
    function = name.partition("[")[0]
    tree = ast.parse((ROOT / path).read_text("utf-8"))
    return any(isinstance(node, ast.FunctionDef) and node.name == function for node in tree.body)


def test_every_twin_s_sibling_stays_live() -> None:
    for twin, sibling in TWINS.items():
        assert _defined(twin), f"{twin}: no such test (tests/recorded_drills.py)"
        assert _defined(sibling), f"{twin}: its sibling {sibling} is no test"
        assert sibling not in TWINS, f"{twin}: its sibling {sibling} is a twin too"
