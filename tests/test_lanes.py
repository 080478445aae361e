"""The drill lanes from recorded durations (tests/lanes.py, scripts/test-lanes).

We test these aspects:
- a run's junit XML becomes seconds per test id (a class inside a module, a parametrized
  id; skipped tests left out);
- units: a Slurm, Ray or torchft test moves with the others of its marker, a module whose
  tests share a fixture wider than a test moves whole, any other test alone; a module
  wholly in one unit is given to pytest by its path, else by its tests' ids; a test the
  file does not know counts the median of its module's recorded tests, or
  ``UNRECORDED_SECONDS`` in a module with none recorded;
- assign: longest first, each to the lane with the least so far, every unit exactly once;
- tests/durations.json, as checked in: every test it names is in a module that exists.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.lanes import (
    UNRECORDED_SECONDS,
    Collected,
    Unit,
    assign,
    durations_from_junit,
    load_durations,
    units,
)

ROOT = Path(__file__).resolve().parent.parent

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.local.test_local_faults" name="test_a[x-1]" time="61.5"/>
<testcase classname="tests.contract.test_orchestrator_contract.TestLocal" name="test_b"
 time="2.25"/>
<testcase classname="tests.local.test_local_faults" name="test_skipped" time="0.01">
<skipped message="no"/></testcase>
<testcase classname="tests.nowhere" name="test_c" time="1"/>
</testsuite></testsuites>
"""


def test_a_runs_junit_xml_becomes_seconds_per_test_id(tmp_path: Path) -> None:
    (tmp_path / "tests" / "local").mkdir(parents=True)
    (tmp_path / "tests" / "contract").mkdir(parents=True)
    (tmp_path / "tests" / "local" / "test_local_faults.py").touch()
    (tmp_path / "tests" / "contract" / "test_orchestrator_contract.py").touch()
    xml = tmp_path / "lane-1.xml"
    xml.write_text(JUNIT)
    assert durations_from_junit([xml], tmp_path) == {
        "tests/local/test_local_faults.py::test_a[x-1]": 61.5,
        "tests/contract/test_orchestrator_contract.py::TestLocal::test_b": 2.25,
    }


def c(nodeid: str, group: str | None = None, shares: bool = False) -> Collected:
    return Collected(nodeid, nodeid.partition("::")[0], group, shares)


def test_units_keep_a_marker_s_tests_and_a_shared_fixture_s_module_together() -> None:
    collected = [
        c("tests/ray/test_a.py::t1", "ray"),
        c("tests/ray/test_a.py::t2", "ray"),
        c("tests/truth/test_r.py::t3", "ray"),  # a ray test in a module of other tests
        c("tests/truth/test_r.py::t4"),
        c("tests/contract/test_k.py::t5", shares=True),
        c("tests/contract/test_k.py::t6"),
        c("tests/local/test_f.py::t7"),
        c("tests/local/test_f.py::t8"),
    ]
    seconds = {"tests/ray/test_a.py::t1": 100.0, "tests/ray/test_a.py::t2": 50.0}
    seconds |= {"tests/truth/test_r.py::t3": 10.0, "tests/truth/test_r.py::t4": 20.0}
    seconds |= {"tests/contract/test_k.py::t5": 5.0, "tests/contract/test_k.py::t6": 6.0}
    seconds |= {"tests/local/test_f.py::t7": 30.0}  # t8 unknown: its module's median, 30 s
    found = {u.name: (u.args, u.seconds, u.tests) for u in units(collected, seconds)}
    assert found == {
        "group ray": (["tests/ray/test_a.py", "tests/truth/test_r.py::t3"], 160.0, 3),
        "tests/truth/test_r.py::t4": (["tests/truth/test_r.py::t4"], 20.0, 1),
        "tests/contract/test_k.py": (["tests/contract/test_k.py"], 11.0, 2),
        "tests/local/test_f.py::t7": (["tests/local/test_f.py::t7"], 30.0, 1),
        "tests/local/test_f.py::t8": (["tests/local/test_f.py::t8"], 30.0, 1),
    }


def test_an_unrecorded_test_counts_its_modules_median_or_the_unrecorded_default() -> None:
    collected = [
        c("tests/local/test_f.py::t1"),
        c("tests/local/test_f.py::t2"),
        c("tests/local/test_f.py::t3"),
        c("tests/local/test_f.py::new"),  # beside recorded drills: their median, 20 s
        c("tests/local/test_new.py::t1"),  # a module with none recorded: the default
        c("tests/local/test_new.py::t2"),
    ]
    seconds = {"tests/local/test_f.py::t1": 10.0, "tests/local/test_f.py::t2": 20.0}
    seconds |= {"tests/local/test_f.py::t3": 90.0, "tests/elsewhere.py::t9": 500.0}
    found = {u.name: u.seconds for u in units(collected, seconds)}
    assert found["tests/local/test_f.py::new"] == 20.0
    assert found["tests/local/test_new.py::t1"] == UNRECORDED_SECONDS
    assert found["tests/local/test_new.py::t2"] == UNRECORDED_SECONDS


def test_assign_deals_the_longest_first_to_the_least_loaded_lane() -> None:
    work = [Unit(name, [name], seconds, 1) for name, seconds in
            [("a", 10.0), ("b", 50.0), ("c", 30.0), ("d", 25.0), ("e", 5.0)]]  # fmt: skip
    lanes = assign(work, 2)
    assert [[u.name for u in lane] for lane in lanes] == [["b", "a"], ["c", "d", "e"]]
    assert sorted(u.name for lane in lanes for u in lane) == ["a", "b", "c", "d", "e"]
    assert [sum(u.seconds for u in lane) for lane in lanes] == [60.0, 60.0]


def test_the_checked_in_durations_name_tests_of_modules_that_exist() -> None:
    path = ROOT / "tests" / "durations.json"
    doc = json.loads(path.read_text())
    assert set(doc) == {"about", "recorded", "tests"}
    durations = load_durations(path)
    assert durations and all(seconds >= 0 for seconds in durations.values())
    missing = {i.partition("::")[0] for i in durations} - {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")
    }
    assert not missing, f"tests/durations.json names modules that are gone: {missing}"
