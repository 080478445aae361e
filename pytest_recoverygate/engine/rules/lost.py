"""The rule of the lost steps: steps done before the kill and done again after it."""

from __future__ import annotations

from pytest_recoverygate.engine.ledger import Ledger
from pytest_recoverygate.engine.records import Inc, Resume
from pytest_recoverygate.engine.rules.evidence import KillEvidence
from pytest_recoverygate.engine.verdict import Check, FailureReason

__all__ = ["lost", "lost_steps"]

R = FailureReason


def lost(
    ledger: Ledger, resume: Resume | None, judged: Inc | None
) -> tuple[int | None, int | None]:
    """(proven, upper bound) of the steps done before the kill and done again after it."""
    if resume is None or resume.step is None:
        return None, None
    proven, bound = ledger.last_before_kill(judged)
    lo = None if proven is None else max(proven - resume.step, 0)
    hi = None if bound is None else max(bound - resume.step, 0)
    return lo, hi


def lost_steps(ev: KillEvidence) -> Check | None:
    """``maxLostSteps``: the last step completed before the kill minus the resume step is
    within the limit — its upper bound to pass, its proven part to fail; a bound that
    straddles the limit (progress rate-limited) is undecided, naming
    RECOVERYGATE_PROGRESS_INTERVAL=0 (which narrows it to a step or two) or a larger
    limit."""
    limit = ev.spec.max_lost_steps
    if limit is None or not ev.trained:
        return None
    lo, hi = lost(ev.ledger, ev.settled, ev.inc)
    observed = lo if hi is None or hi == lo else f"{lo}–{hi}"
    if hi is not None and hi <= limit:
        return Check(
            "lost_steps",
            True,
            f"<= {limit}",
            observed,
            f"lost {observed} step(s) (limit {limit})",
        )
    if lo is not None and lo > limit:
        return Check(
            "lost_steps",
            False,
            f"<= {limit}",
            observed,
            f"lost too many steps: {lo} > {limit}"
            + (f" (at most {hi})" if hi is not None and hi != lo else ""),
            R.LOST_TOO_MANY_STEPS,
        )
    span = (
        "an unknown number of"
        if lo is None
        else (f"at least {lo}" if hi is None else f"between {lo} and {hi}")
    )
    return Check(
        "lost_steps",
        None,
        f"<= {limit}",
        observed,
        f"the job lost {span} steps against a limit of {limit}: the last step before the "
        "kill is not known precisely enough; report progress on every step "
        "(RECOVERYGATE_PROGRESS_INTERVAL=0) to narrow the bound to a step or two, or "
        "allow that much more in maxLostSteps",
        R.INCONCLUSIVE,
    )
