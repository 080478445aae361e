"""``recoverygate explain REPORT.json``: for each check of a report, the rule of the
verdict that decided it and the condition it holds the evidence to.

A report written since the rule book names each check's rule (``rule``); for an older
report the rule is found from the check's name, outcome and reason, and where several
rules could have filled the check, all of them are listed.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytest_recoverygate.engine.rules import TABLE, Rule, by_name
from pytest_recoverygate.engine.verdict import FailureReason
from pytest_recoverygate.links import docs_link
from pytest_recoverygate.report.compare import load_report

__all__ = ["explain", "explain_report", "rules_of"]

OUTCOME = {True: "passed", False: "FAILED", None: "undecided"}
#: A check that verified nothing (``checked`` false), as the terminal, the page and the
#: rule book call it.
NOT_CHECKED = "not checked"


def _outcome(check: dict[str, Any]) -> str:
    """A check's outcome: passed, FAILED, undecided, or not checked (it verified nothing,
    so it neither passes nor fails the drill; reports before ``checked`` read as before)."""
    if check.get("checked") is False or check.get("status") == "unchecked":
        return NOT_CHECKED
    passed = check.get("passed")  # a crafted report may hold anything here
    return OUTCOME.get(passed, "?") if passed is None or isinstance(passed, bool) else "?"


def _text(value: object) -> str:
    """A report's value as printable text: what the job wrote may hold terminal escapes."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(value)
    )


def rules_of(check: dict[str, Any], *, live: bool) -> list[Rule]:
    """The rules that may have decided ``check`` (one, when the report names it)."""
    named = by_name(str(check.get("rule"))) if check.get("rule") else None
    if named is not None:
        return [named]
    reason = FailureReason.__members__.get(str(check.get("reason")))
    passed = check.get("passed")
    found = []
    for rule in TABLE:
        if rule.check != check.get("name") or (rule.scope == "live") != live:
            continue
        if passed is True and not rule.passes:  # not checked: passed stays True
            continue
        if passed is None and not rule.undecided:
            continue
        if passed is False and rule.fails and reason not in rule.fails:
            continue
        found.append(rule)
    return found


def _lines(checks: list[dict[str, Any]], *, live: bool, indent: str) -> Iterator[str]:
    for check in checks:
        if not isinstance(check, dict):
            continue
        outcome = _outcome(check)
        reason = f" ({_text(check['reason'])})" if check.get("reason") else ""
        name, message = _text(check.get("name")), _text(check.get("message"))
        if outcome == NOT_CHECKED:
            message = message.removeprefix(f"{NOT_CHECKED}: ")
            reason = " (it verified nothing: it neither passes nor fails the drill)"
        yield f"{indent}{name}: {outcome}{reason} — {message}"
        found = rules_of(check, live=live)
        if not found:
            yield f"{indent}  no rule of the verdict: the drill itself recorded this check"
        for rule in found:
            which = "rule" if len(found) == 1 else "one of the rules"
            yield f"{indent}  {which} {rule.name} ({rule.where})"
            yield textwrap.fill(
                rule.condition,
                width=92,
                initial_indent=f"{indent}    ",
                subsequent_indent=f"{indent}    ",
            )


def explain(doc: dict[str, Any]) -> list[str]:
    """The explanation of a drill report, line by line."""
    live = doc.get("recoveryMode") == "live" or bool(doc.get("live"))
    lines = [f"verdict: {_text(doc.get('verdict'))} — {_text(doc.get('summary', ''))}"]
    checks = doc.get("checks") or []
    if not checks:
        lines.append("no checks: the drill decided nothing (see its summary)")
    lines += _lines(list(checks), live=live, indent="")
    recoveries = [r for r in doc.get("recoveries") or () if isinstance(r, dict)]
    if len(recoveries) > 1:
        for recovery in recoveries:
            lines.append(
                f"kill {_text(recovery.get('index'))}: {_text(recovery.get('verdict'))} — "
                f"{_text(recovery.get('summary', ''))}"
            )
            lines += _lines(list(recovery.get("checks") or ()), live=live, indent="  ")
    lines.append(f"the rules: {docs_link('verdict-rules.md')}")
    return lines


def explain_report(path: Path) -> list[str]:
    """:func:`explain` of the report at ``path`` (a report.json or its folder); raises
    :class:`~pytest_recoverygate.errors.BaselineError` naming the path when it is missing,
    unreadable, not JSON or no drill report."""
    return explain(load_report(path, "REPORT"))
