"""The drill lanes, from recorded durations (scripts/test-lanes; scripts/test runs them).

The end-to-end drills run in two lanes side by side, each one drill at a time. Which drill
goes to which lane is computed, not kept by hand: ``tests/durations.json`` holds the
seconds each e2e test took in a recorded run (``scripts/test-lanes record`` reads them
from ``--junitxml`` files), and :func:`assign` deals the drills out greedily, longest
first, each to the lane with the least work so far.

What moves as one (a :class:`Unit`):

- the tests of one machine-wide thing: every ``slurm`` test (the session's Slurm cluster:
  split over two pytest processes it would be brought up twice), every ``ray`` test (a
  Ray cluster of about 1.6 GB and 2 CPUs each: two at once would starve each other and the
  lane beside them), every ``torchft`` test (lighthouses on the machine's ports);
- the tests of one module that share a fixture wider than a test (module, class or
  package scope: the contract suite's jobs, a module's Ray head, the trainers' venvs):
  split over the lanes it would be set up twice;
- otherwise each test alone.

A test the file does not know yet counts the median of the recorded tests of its own
module (a module's drills are alike: a new drill beside recorded ones costs about what
they cost), and a test of a module with none recorded :data:`UNRECORDED_SECONDS`, the
mean e2e test of the last whole run that was measured: the drill lanes of the fresh-clone
runs in the README (27-28 and 22-23 min side by side on 2 cores, about 50 min of drills)
over the 218 e2e tests of that commit (5a142f9), 14 s. Not the median of all the recorded
tests: a file seeded with a few long drills would count every short test as one of them.
A new module so lands somewhere sensible until the next ``record``.
"""

from __future__ import annotations

import json
import statistics
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "GROUP_MARKERS",
    "SHARED_SCOPES",
    "UNRECORDED_SECONDS",
    "Collected",
    "Unit",
    "assign",
    "durations_from_junit",
    "load_durations",
    "units",
]

#: Markers whose tests share one machine-wide thing: each such set is one unit.
GROUP_MARKERS = ("slurm", "ray", "torchft")
#: Fixture scopes wider than a test: a module using one moves whole.
SHARED_SCOPES = frozenset({"module", "class", "package"})
#: Seconds counted for a test of a module with no test recorded (see the module docstring).
UNRECORDED_SECONDS = 14.0


@dataclass(frozen=True)
class Collected:
    """One e2e test as pytest collected it: its id, its module's path, the group marker
    it carries (None: none) and whether it uses a fixture wider than a test."""

    nodeid: str
    module: str
    group: str | None
    shares_fixture: bool


@dataclass
class Unit:
    """Tests that run in one lane; ``args`` are what pytest is given for them."""

    name: str
    args: list[str] = field(default_factory=list)
    seconds: float = 0.0
    tests: int = 0


def durations_from_junit(paths: Iterable[Path], root: Path) -> dict[str, float]:
    """Seconds per test id (setup, call and teardown: a testcase's ``time``) from pytest
    ``--junitxml`` files; a class path is told from a module path by the files in
    ``root``. A skipped test is left out (its seconds say nothing)."""
    found: dict[str, float] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            if case.find("skipped") is not None:
                continue
            nodeid = _nodeid(case.get("classname", ""), case.get("name", ""), root)
            if nodeid is not None:
                found[nodeid] = round(float(case.get("time", "0")), 2)
    return found


def _nodeid(classname: str, name: str, root: Path) -> str | None:
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        module = "/".join(parts[:cut]) + ".py"
        if (root / module).is_file():
            return "::".join([module, *parts[cut:], name])
    return None


def load_durations(path: Path) -> dict[str, float]:
    """The ``tests`` table of a durations file (empty when there is none)."""
    if not path.is_file():
        return {}
    tests = json.loads(path.read_text()).get("tests", {})
    return {str(k): float(v) for k, v in tests.items()}


def units(collected: Sequence[Collected], durations: Mapping[str, float]) -> list[Unit]:
    """The units (see the module docstring), each with its seconds: recorded, or for a
    test the file does not know the median of its module's recorded ones, else
    :data:`UNRECORDED_SECONDS`."""
    recorded: dict[str, list[float]] = {}
    for c in collected:
        if c.nodeid in durations:
            recorded.setdefault(c.module, []).append(durations[c.nodeid])
    default = {module: statistics.median(known) for module, known in recorded.items()}
    whole = {c.module for c in collected if c.shares_fixture and c.group is None}
    found: dict[str, Unit] = {}
    for test in collected:
        if test.group is not None:
            key = f"group {test.group}"
        elif test.module in whole:
            key = test.module
        else:
            key = test.nodeid
        unit = found.setdefault(key, Unit(key))
        unit.args.append(test.nodeid)
        unit.seconds += durations.get(test.nodeid, default.get(test.module, UNRECORDED_SECONDS))
        unit.tests += 1
    per_module: dict[str, int] = {}
    for test in collected:
        per_module[test.module] = per_module.get(test.module, 0) + 1
    for unit in found.values():  # a module wholly in one unit is given by its path
        ids = unit.args
        modules = [m for m in dict.fromkeys(i.partition("::")[0] for i in ids)]
        unit.args = []
        for module in modules:
            mine = [i for i in ids if i.partition("::")[0] == module]
            unit.args += [module] if len(mine) == per_module[module] else mine
    return list(found.values())


def assign(work: Sequence[Unit], lanes: int = 2) -> list[list[Unit]]:
    """Longest first, each unit to the lane with the least seconds so far (ties: the
    lower lane); each lane's units in the order they were dealt."""
    dealt: list[list[Unit]] = [[] for _ in range(lanes)]
    totals = [0.0] * lanes
    for unit in sorted(work, key=lambda u: (-u.seconds, u.name)):
        lane = min(range(lanes), key=lambda i: (totals[i], i))
        dealt[lane].append(unit)
        totals[lane] += unit.seconds
    return dealt
