"""The truth corpus judged from its recordings, in the quick lane: no drill runs here.

Every scenario of the corpus (tests/truth/scenarios.py) was run live once by
``scripts/truth-corpus record``, which kept its transcript, its report and the job's own
truth files in ``tests/fixtures/truth/<scenario>/``. Each is replayed here through a fresh
engine with no clock and held to the job's truth by the scenario's own assertions, the
same code the live drill runs.

We test these aspects:
- each recording replays with every answer of the engine as recorded and gives the
  recorded report value for value (verdict, reasons, summary, checks, figures), with the
  exit code ``run`` gave and, where the output is kept, the same diagnoses: no behaviour
  changed since it was recorded;
- the rejudged report holds to the job's stored truth, by the scenario's assertions;
- every scenario has its recording, and every recording is a scenario's;
- one live drill of each family stays in the drill lanes, and every other live test is
  marked ``recorded``.
"""

from __future__ import annotations

import json

import pytest

from tests.truth.scenarios import FAMILIES, FIXTURES, META, Scenario, load_all, replayed

SCENARIOS = load_all()
RECORDED = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) if FIXTURES.is_dir() else []


@pytest.mark.parametrize("name", RECORDED)
def test_each_recording_replays_to_its_report_and_holds_to_the_job_s_truth(name: str) -> None:
    scenario = SCENARIOS.get(name)
    assert scenario is not None, f"tests/fixtures/truth/{name} is no scenario's recording"
    drill = replayed(scenario.folder)
    scenario.check(drill)


def test_every_scenario_has_its_recording_and_every_recording_a_scenario() -> None:
    missing = sorted(set(SCENARIOS) - set(RECORDED))
    extra = sorted(set(RECORDED) - set(SCENARIOS))
    assert not missing, f"not recorded (scripts/truth-corpus record NAME): {missing}"
    assert not extra, f"recordings of no scenario (remove them): {extra}"


def test_one_live_drill_of_each_family_stays_in_the_drill_lanes() -> None:
    live: dict[str, list[Scenario]] = {}
    for scenario in SCENARIOS.values():
        if scenario.live is not None:
            live.setdefault(scenario.live, []).append(scenario)
            assert scenario.why_live, f"{scenario.name}: say why it stays live (why_live=)"
    assert sorted(live) == sorted(FAMILIES)
    assert all(len(kept) == 1 for kept in live.values()), live


def test_each_recording_says_how_it_ran() -> None:
    for name in RECORDED:
        meta = json.loads((FIXTURES / name / META).read_text("utf-8"))
        assert meta["scenario"] == name
        assert isinstance(meta["exitCode"], int) and meta["wallSeconds"] > 0
