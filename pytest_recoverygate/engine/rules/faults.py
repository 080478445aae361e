"""Rules of the faults and of the drill over its kills: a preempted job saved within its
grace period, a job that gives up does so loudly, the restart budget, every recovery.

(``KillDuringCheckpoint``'s torn save is judged by the resume rule: a replacement that
resumed from a save the kill cut is undecided, one that resumed from an older durable
checkpoint is judged as any resume; ``HangWorker`` and ``PartitionNode`` by
:func:`~pytest_recoverygate.engine.rules.comeback.detected`.)
"""

from __future__ import annotations

from pytest_recoverygate.engine.rules.evidence import DrillEvidence, KillEvidence
from pytest_recoverygate.engine.verdict import Check, FailureReason, Verdict, format_seconds

__all__ = [
    "budget_matches",
    "gave_up_loudly",
    "gives_up_within_the_drill",
    "hangs_instead_of_failing",
    "recoveries",
    "saved_on_preempt",
    "survived_too_many",
]

R = FailureReason


def saved_on_preempt(ev: KillEvidence) -> Check | None:
    """``Preempt`` with ``expectations.savedOnPreempt``: a checkpoint was completed within
    the grace period after SIGTERM (the message says whether the resume used it)."""
    spec, kill, resume = ev.spec, ev.kill, ev.settled
    if spec.fault != "Preempt" or not spec.saved_on_preempt:
        return None
    saved = kill.details.get("savedStep")
    used = resume is not None and saved is not None and resume.step == saved
    grace = format_seconds(spec.grace_period)
    if saved is None:
        return Check(
            "saved_on_preempt",
            False,
            f"a checkpoint completed within {grace}",
            None,
            f"no checkpoint was completed within the {grace} grace period after SIGTERM "
            "(save on SIGTERM, and keep the save shorter than the grace period)",
            R.NOT_SAVED_ON_PREEMPT,
        )
    after = format_seconds(kill.details["savedAfterSeconds"])
    return Check(
        "saved_on_preempt",
        True,
        f"a checkpoint completed within {grace}",
        saved,
        f"checkpoint {saved} was completed {after} after SIGTERM"
        + ("; the resume used it" if used else "; the resume did not use it"),
    )


def hangs_instead_of_failing(ev: KillEvidence) -> Check:
    """``count: untilBudgetExhausted``: a job that neither came back nor ended by the
    recovery deadline hangs — a job that gives up must end non-zero."""
    kill = ev.kill
    return Check(
        "gave_up_loudly",
        False,
        "a replacement, or the job ends non-zero",
        None,
        f"the job neither came back nor failed within "
        f"{format_seconds(ev.now - kill.time)} of kill {kill.index}: it hangs (a job that "
        "gives up must end non-zero, or the backend must mark it failed)",
        R.HUNG_INSTEAD_OF_FAILING,
    )


def _survived(ev: DrillEvidence) -> int:
    return sum(1 for r in ev.recoveries if r.verdict is Verdict.PASS)


def _read(ev: DrillEvidence) -> str:
    known = ev.known_budget
    return (
        f"; its launcher allows {known} restart(s)"
        if known is not None
        else ("; the job's own restart budget could not be read")
    )


def gave_up_loudly(ev: DrillEvidence) -> Check | None:
    """``count: untilBudgetExhausted``: once its budget was used, the job ended non-zero
    (the kill it gave up on is the observed value)."""
    if ev.spec.count is not None or ev.gave_up is None:
        return None
    index, _, detail = ev.gave_up
    how = f" ({detail})" if detail else ""
    return Check(
        "gave_up_loudly",
        True,
        "the job ends non-zero once its budget is used",
        index,
        f"the job survived {_survived(ev)} kill(s) and gave up loudly on kill {index}{how}",
    )


def budget_matches(ev: DrillEvidence) -> Check | None:
    """``expectations.restartBudget``: the job that gave up survived exactly that many
    kills."""
    budget = ev.spec.restart_budget
    if ev.spec.count is not None or ev.gave_up is None or budget is None:
        return None
    survived = _survived(ev)
    ok = survived == budget
    return Check(
        "restart_budget",
        ok,
        budget,
        survived,
        (
            f"it survived exactly restartBudget = {budget} kills{_read(ev)}"
            if ok
            else f"it survived {survived} kill(s), but restartBudget is {budget}{_read(ev)}"
        ),
        None if ok else R.RESTART_BUDGET_MISMATCH,
    )


def _never_gave_up(ev: DrillEvidence) -> bool:
    """``untilBudgetExhausted``, and the job still recovered from the last kill."""
    last = ev.recoveries[-1] if ev.recoveries else None
    return (
        ev.spec.count is None
        and ev.gave_up is None
        and last is not None
        and last.verdict is Verdict.PASS
    )


def survived_too_many(ev: DrillEvidence) -> Check | None:
    """``expectations.restartBudget``: a job still recovering after more kills than its
    budget fails."""
    budget, survived = ev.spec.restart_budget, _survived(ev)
    if not _never_gave_up(ev) or budget is None or not survived > budget:
        return None
    return Check(
        "restart_budget",
        False,
        budget,
        survived,
        f"the job survived {survived} kills, more than restartBudget = {budget}{_read(ev)}",
        R.RESTART_BUDGET_MISMATCH,
    )


def gives_up_within_the_drill(ev: DrillEvidence) -> Check | None:
    """``count: untilBudgetExhausted`` without a restart budget exceeded: a job that
    survived every kill the drill made without giving up is undecided."""
    budget, survived = ev.spec.restart_budget, _survived(ev)
    if not _never_gave_up(ev) or (budget is not None and survived > budget):
        return None
    return Check(
        "gave_up_loudly",
        None,
        "the job gives up within the drill",
        survived,
        f"inconclusive: the job survived {survived} kills without giving up; set "
        "expectations.restartBudget (or a smaller restart budget in the job)",
        R.INCONCLUSIVE,
    )


def recoveries(ev: DrillEvidence) -> Check | None:
    """``count: N`` (or more than one kill): every recovery passed; a failure carries the
    reason of the first failed check of the first kill that did not pass."""
    spec, done = ev.spec, ev.recoveries
    if spec.count is None or not (len(done) > 1 or (spec.count or 1) > 1):
        return None
    headline = next((r for r in done if r.verdict is not Verdict.PASS), done[-1] if done else None)
    passed = sum(1 for r in done if r.verdict is Verdict.PASS)
    first = headline.failed_checks[0] if headline and headline.failed_checks else None
    return Check(
        "recoveries",
        passed == len(done),
        f"{spec.count} verified",
        passed,
        f"{passed} of {len(done)} recoveries passed",
        None if passed == len(done) or first is None else first.reason,
    )
