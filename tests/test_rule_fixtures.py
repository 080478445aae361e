"""The rules' fixtures (tests/fixtures/rules), in the manner of ruff's: per rule of the
verdict, drill transcripts recorded from its pinning tests (scripts/rule-fixtures), each
with the checks it must produce beside it.

We test these aspects: every fixture replays through a fresh engine answering every call
as recorded and produces exactly its snapshot (verdict, summary, every check with its
expected and observed values, its reason and its rule); every rule of the table has a
fixture, and in at least one of them that rule decides a check; every fixture folder is a
rule's and every transcript has its snapshot; docs/verdict-rules.md links each fixture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.engine.machine import DrillResult
from pytest_recoverygate.engine.rules import TABLE
from pytest_recoverygate.transcript.read import read_transcript
from pytest_recoverygate.transcript.rejudge import replay

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "rules"
TRANSCRIPTS = sorted(FIXTURES.glob("*/*.jsonl"))


def snapshot(result: DrillResult) -> dict[str, Any]:
    """What a fixture produces, as its snapshot file has it (scripts/rule-fixtures)."""
    doc = {
        "verdict": result.verdict.value,
        "summary": result.summary,
        "checks": [check.as_dict() for check in result.checks],
    }
    normal: dict[str, Any] = json.loads(json.dumps(doc, default=str))
    return normal


def expected(path: Path) -> dict[str, Any]:
    shot: dict[str, Any] = json.loads(path.with_suffix(".checks.json").read_text("utf-8"))
    return shot


@pytest.mark.parametrize(
    "path",
    TRANSCRIPTS,
    ids=[p.relative_to(FIXTURES).with_suffix("").as_posix() for p in TRANSCRIPTS],
)
def test_each_fixture_produces_its_checks(path: Path) -> None:
    result, diverged = replay(read_transcript(path))
    assert diverged == ()
    got, want = snapshot(result), expected(path)
    # compared as JSON text: a NaN loss in a check reads back as NaN on both sides
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True), (
        f"{path.relative_to(ROOT)}: the checks changed; if the change is meant, run "
        "scripts/rule-fixtures (never edit a snapshot by hand)"
    )


@pytest.mark.parametrize("rule", [rule.name for rule in TABLE])
def test_every_rule_has_a_fixture_it_decides(rule: str) -> None:
    paths = sorted((FIXTURES / rule).glob("*.jsonl"))
    assert paths, f"rule {rule} has no fixture: run scripts/rule-fixtures"
    decided = [p for p in paths if any(c.get("rule") == rule for c in expected(p)["checks"])]
    assert decided, f"no fixture of {rule} has a check that {rule} decided"


def test_every_fixture_is_a_rules_and_has_its_snapshot() -> None:
    assert {p.name for p in FIXTURES.iterdir()} <= {rule.name for rule in TABLE}
    transcripts = {p.with_suffix("") for p in FIXTURES.glob("*/*.jsonl")}
    snapshots = {p.with_suffix("").with_suffix("") for p in FIXTURES.glob("*/*.checks.json")}
    assert transcripts == snapshots
    assert {p.name for p in FIXTURES.glob("*/*")} == {
        *(f"{p.name}.jsonl" for p in transcripts),
        *(f"{p.name}.checks.json" for p in transcripts),
    }


def test_the_rules_page_links_every_fixture() -> None:
    page = (ROOT / "docs" / "verdict-rules.md").read_text(encoding="utf-8")
    for path in TRANSCRIPTS:
        link = f"(../{path.relative_to(ROOT).as_posix()})"
        assert link in page, f"docs/verdict-rules.md does not link {path.name}"
