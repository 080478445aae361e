"""docs/verdict-rules.md, generated from :data:`~pytest_recoverygate.engine.rules.TABLE`
and the names of each rule's fixtures (``scripts/verdict-rules`` lists them in
tests/fixtures/rules and writes the page; a test holds the file to this text)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_recoverygate.engine.rules.rule import Rule
from pytest_recoverygate.engine.verdict import FailureReason

__all__ = ["FIXTURES", "render"]

#: Where each rule's fixtures are, from docs/: ``<rule>/<scenario>.jsonl`` (a transcript)
#: beside ``<scenario>.checks.json`` (the checks it must produce).
FIXTURES = "../tests/fixtures/rules"

HEADINGS = {
    "kill": "Each kill (recovery: restart)",
    "hung": "A kill that nothing followed (count: untilBudgetExhausted)",
    "drill": "The drill over its kills",
    "live": "The kill of a live recovery (recovery: live)",
    "storage": "A fault on the checkpoint storage (StorageFault)",
    "sticky": "A failure that comes back (StickyFault)",
}

INTRO = """\
<!-- Generated from pytest_recoverygate/engine/rules (TABLE) by scripts/verdict-rules:
     do not edit; change the rule's function or its row, then run the script. -->

# The verdict's rules

Every check of a drill's verdict is filled by one rule: a small function in
`pytest_recoverygate/engine/rules/` that takes the evidence (the job's lines as the ledger
reads them, the backend's group events, the drill's expectations) and returns the check
passed, failed with a reason, or undecided with what would decide it — or nothing, where
it does not apply. The rules run in the order of this page. A kill PASSes only when every
check it got passed; it FAILs when any failed (each failed check named, with its
reason); otherwise it is ERROR *inconclusive*. The drill's verdict is that of the first
kill that did not pass (else the last), with the checks of the drill over its kills. The
state machine (`engine/machine.py`) decides *when* a kill is judged; these rules decide
*what* the evidence proves. `recoverygate explain REPORT.json` names, for each check of a
report, the rule below that decided it. The step contract and the evidence are described
in [step-contract.md](step-contract.md); the reasons' meaning in the report in
[reports.md](reports.md).

Each rule has fixtures, in the manner of ruff's: drill transcripts
(`tests/fixtures/rules/<rule>/<scenario>.jsonl`, recorded from the rule's pinning tests by
`scripts/rule-fixtures`, never written by hand), each with the checks it must produce
beside it (`<scenario>.checks.json`). One parametrized test replays them all
(`tests/test_rule_fixtures.py`); `recoverygate rejudge` replays any one of them, and a
drill's `transcript.jsonl` can become one.

| rule | check | scope | passes | fails with | undecided |
| --- | --- | --- | --- | --- | --- |
"""


def _fails(rule: Rule) -> str:
    if rule.note and not rule.fails:
        return rule.note
    return ", ".join(f"`{r.name}`" for r in rule.fails) or "—"


def _row(rule: Rule) -> str:
    yes = {True: "yes", False: "—"}
    return (
        f"| [`{rule.name}`](#{rule.name}) | `{rule.check}` | {rule.scope} "
        f"| {yes[rule.passes]} | {_fails(rule)} | {yes[rule.undecided]} |"
    )


def _section(rule: Rule, fixtures: Sequence[str]) -> list[str]:
    lines = [f"### {rule.name}", "", rule.condition, ""]
    lines.append(f"- fills the check `{rule.check}`; function `rules/{rule.where}`")
    outcomes = []
    if rule.passes:
        outcomes.append("passed")
    for reason in rule.fails:
        outcomes.append(f"FAIL `{reason.name}` ({reason.value})")
    if rule.note:
        outcomes.append(f"FAIL: {rule.note}")
    if rule.undecided:
        outcomes.append(f"undecided `{FailureReason.INCONCLUSIVE.name}`")
    lines.append("- outcomes: " + "; ".join(outcomes))
    lines.append("- pinned by:")
    lines += [f"  - `{test}`" for test in rule.tests]
    if fixtures:
        lines.append("- fixtures (a transcript each, with the checks it must produce):")
        lines += [
            f"  - [`{name}`]({FIXTURES}/{rule.name}/{name}.jsonl) "
            f"([checks]({FIXTURES}/{rule.name}/{name}.checks.json))"
            for name in fixtures
        ]
    return [*lines, ""]


def render(table: Sequence[Rule], fixtures: Mapping[str, Sequence[str]] | None = None) -> str:
    """The page, from the table and each rule's fixtures (rule name -> scenario names)."""
    fixtures = fixtures or {}
    lines = [INTRO.rstrip("\n")]
    lines += [_row(rule) for rule in table]
    lines.append("")
    for scope, heading in HEADINGS.items():
        rules = [rule for rule in table if rule.scope == scope]
        if not rules:
            continue
        lines += [f"## {heading}", ""]
        for rule in rules:
            lines += _section(rule, fixtures.get(rule.name, ()))
    return "\n".join(lines).rstrip("\n") + "\n"
