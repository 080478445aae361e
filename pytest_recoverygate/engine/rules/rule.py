"""What a rule of the verdict is: a named function from evidence to a :class:`Check`,
with what the docs say of it (see :data:`pytest_recoverygate.engine.rules.TABLE`)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_recoverygate.engine.verdict import Check, FailureReason

__all__ = ["SCOPES", "Rule", "run"]

#: Where a rule is judged, in the order a drill meets them: ``kill`` each kill of a
#: restart-mode drill (:class:`~pytest_recoverygate.engine.rules.evidence.KillEvidence`);
#: ``hung`` a kill no replacement and no end followed (count: untilBudgetExhausted);
#: ``drill`` the drill over its kills
#: (:class:`~pytest_recoverygate.engine.rules.evidence.DrillEvidence`); ``live`` the
#: kill of a ``recovery: live`` drill
#: (:class:`~pytest_recoverygate.engine.replicas.LiveEvidence`); ``storage`` a fault on the
#: checkpoint storage (:class:`~pytest_recoverygate.engine.rules.evidence.StorageEvidence`),
#: beside the kill's rules when the job restarted after it; ``sticky`` a failure that
#: comes back (:class:`~pytest_recoverygate.engine.rules.evidence.StickyEvidence`).
SCOPES = ("kill", "hung", "drill", "live", "storage", "sticky")


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of the verdict.

    ``judge`` takes the evidence of its scope and returns the check it fills (``check``),
    passed, failed with one of ``fails`` or undecided (``undecided``), or None where it
    does not apply. Its docstring is the rule's condition in the docs. ``passes``: it can
    pass. ``tests``: the scenario tests that pin it (``path::test_name``).
    """

    name: str
    check: str
    scope: str
    judge: Callable[[Any], Check | None]
    fails: tuple[FailureReason, ...]
    tests: tuple[str, ...]
    passes: bool = True
    undecided: bool = True
    note: str = ""

    @property
    def condition(self) -> str:
        """The condition it holds the evidence to (the function's docstring, one line,
        code in single backquotes)."""
        return " ".join((inspect.getdoc(self.judge) or "").split()).replace("``", "`")

    @property
    def where(self) -> str:
        """The function, as ``module.name`` under ``pytest_recoverygate.engine.rules``."""
        module = self.judge.__module__.removeprefix("pytest_recoverygate.engine.rules.")
        return f"{module}.{self.judge.__name__}"


def run(table: Sequence[Rule], scope: str, evidence: object) -> list[Check]:
    """The checks the rules of ``scope`` fill, in the table's order, each named by its
    rule (``Check.rule``)."""
    checks: list[Check] = []
    for rule in table:
        if rule.scope != scope:
            continue
        check = rule.judge(evidence)
        if check is not None:
            checks.append(dataclasses.replace(check, rule=rule.name))
    return checks
