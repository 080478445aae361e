"""Rules of the training after the resume: the step counter never went back, and training
kept advancing for the whole sustain window (``expectations.sustain``)."""

from __future__ import annotations

from pytest_recoverygate.engine.rules.evidence import KillEvidence, Window
from pytest_recoverygate.engine.verdict import Check, FailureReason, format_seconds

__all__ = ["counter_went_back", "sustained"]

R = FailureReason
NAME = "progress_after_resume"


def counter_went_back(ev: KillEvidence) -> Check | None:
    """The replacement's step counter never went backwards after the resume; back to 1
    or below is a restart from scratch, elsewhere steps were replayed."""
    inc, resume = ev.inc, ev.settled
    if not ev.trained or inc is None or resume is None or inc.backwards is None:
        return None
    was, then = inc.backwards
    return Check(
        NAME,
        False,
        f"steps advancing from {resume.step}",
        f"{was}, then {then}",
        f"progress went backwards after the resume ({was}, then {then}): the "
        "step counter was reset and steps were done again",
        R.RESTARTED_FROM_SCRATCH if then <= 1 else R.STEPS_REPLAYED,
    )


def sustained(ev: KillEvidence) -> Check | None:
    """Training kept advancing for the whole sustain window after the resume (its lines,
    seconds and steps). A job that ended successfully inside the window after at least
    ``ENDED_INSIDE_LINES`` (3, or the window's own line count if larger) advancing
    progress lines past the resume, the first step past it included, sustained it: it
    passes, noted as ended inside the window. A stall longer than the stall limit, or a
    job that failed inside the window, fails; one that finished inside it after fewer
    lines, or a window not held by the drill's deadline, is undecided; a window still
    open is no check yet. With a StickyFault's bad node, steps from before its last hit
    make no window before the deadline: the job is restarting from that hit."""
    inc, past, kill, spec = ev.inc, ev.past, ev.kill, ev.spec
    if not ev.trained or inc is None or past is None:
        return None
    window = kill.window
    if window is None:  # judged before a second line: the window is its first step alone
        last = inc.advanced or past
        bad = kill.bad_node
        if bad is not None and last[1] <= bad.floor() and not ev.final:
            # StickyFault scope node: the bad node struck after these steps, and the job is
            # restarting from that hit (a recovery, bounded by maxRecoveryTime): no stall,
            # and nothing proven before its first step after the hit.
            return None
        window = Window(past, last, kill.window.stall_limit if kill.window else 5.0)
    resume_step = ev.settled.step if ev.settled is not None else None
    expected = f"training for {spec.sustain.describe()} after the resume"
    observed = {
        "steps": window.last[0] - window.start[0],
        "seconds": round(window.last[1] - window.start[1], 6),
        "lines": window.lines,
    }
    if window.held(spec.sustain, resume_step):
        return Check(
            NAME,
            True,
            expected,
            observed,
            f"trained {observed['steps']} steps over "
            f"{format_seconds(window.last[1] - window.start[1])} after the resume "
            f"({window.lines} advancing progress lines)",
        )
    return _not_held(ev, window, expected, observed)


def _not_held(ev: KillEvidence, window: Window, expected: str, observed: object) -> Check | None:
    kill, spec, now = ev.kill, ev.spec, ev.now
    last, at = window.last
    where = f"its last step was {last}, {format_seconds(at - kill.time)} after the kill"
    if kill.job_ended is not None:
        return _ended(ev, window, expected, observed)
    if now - at >= window.stall_limit:
        return Check(
            NAME,
            False,
            expected,
            observed,
            f"training stopped progressing after resume: {where}, and no step followed for "
            f"{format_seconds(now - at)} (stall limit {format_seconds(window.stall_limit)}; "
            "a job that pauses on purpose after the resume, to evaluate say, sets "
            "expectations.maxStall)",
            R.STOPPED_PROGRESSING,
        )
    if not ev.final:
        return None  # the window is still open: nothing is proven either way yet
    return Check(
        NAME,
        None,
        expected,
        observed,
        f"inconclusive: the sustain window ({spec.sustain.describe()}) was not held by the "
        f"drill's deadline ({where}); several processes may be reporting for the rank",
        R.INCONCLUSIVE,
    )


def _ended(ev: KillEvidence, window: Window, expected: str, observed: object) -> Check:
    """The job ended inside the window: sustained (enough lines, success), undecided
    (success, too few lines) or stopped progressing (it failed)."""
    kill, spec = ev.kill, ev.spec
    assert kill.job_ended is not None
    last, at = window.last
    where = f"its last step was {last}, {format_seconds(at - kill.time)} after the kill"
    _, detail, ok = kill.job_ended
    resume_step = ev.settled.step if ev.settled is not None else None
    if window.ended_inside(spec.sustain, resume_step, ok):
        return Check(
            NAME,
            True,
            expected,
            observed,
            f"trained {window.last[0] - window.start[0]} steps over "
            f"{format_seconds(window.last[1] - window.start[1])} after the resume "
            f"({window.lines + 1} advancing progress lines past it), then the job ended "
            "successfully" + (f" ({detail})" if detail else "") + ": the run ended inside "
            f"the sustain window ({spec.sustain.describe()})",
        )
    if ok:
        return Check(
            NAME,
            None,
            expected,
            observed,
            "inconclusive: the job finished inside the sustain window "
            f"({spec.sustain.describe()}) after resuming ({where}); lengthen the run or "
            "shorten expectations.sustain",
            R.INCONCLUSIVE,
        )
    return Check(
        NAME,
        False,
        expected,
        observed,
        f"training stopped progressing after resume: {where}, then the job failed"
        + (f" ({detail})" if detail else ""),
        R.STOPPED_PROGRESSING,
    )
