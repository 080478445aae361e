"""Rules of the comeback: the job noticed the fault, a new incarnation came back, and it
came back within ``maxRecoveryTime``."""

from __future__ import annotations

from pytest_recoverygate.engine.rules.evidence import KillEvidence, ended_how
from pytest_recoverygate.engine.verdict import Check, FailureReason, format_seconds

__all__ = ["detected", "new_incarnation", "recovery_time", "reentrant"]

R = FailureReason


def detected(ev: KillEvidence) -> Check | None:
    """``HangWorker`` / ``PartitionNode``, the first question: the job noticed the hung
    worker (or the cut link) — a rank failed or a restart began — within
    ``maxDetectionTime``; never noticing by the drill's deadline fails."""
    spec, kill = ev.spec, ev.kill
    if spec.fault not in ("HangWorker", "PartitionNode"):
        return None
    seconds = None if kill.detected is None else kill.detected - kill.time
    what = "the hung worker" if spec.fault == "HangWorker" else "the cut link"
    limit = spec.max_detection_time
    expected = f"<= {format_seconds(limit)}" if limit is not None else "noticed"
    if seconds is None:
        return Check(
            "hang_detected",
            False,
            expected,
            None,
            f"the job never noticed {what}: no rank failed and nothing was "
            "restarted (is the collective timeout left at its 30-minute default? set "
            "init_process_group(timeout=…) or a watchdog)",
            R.HANG_NOT_DETECTED,
        )
    ok = limit is None or seconds <= limit
    return Check(
        "hang_detected",
        ok,
        expected,
        round(seconds, 6),
        f"the job noticed {what} after {format_seconds(seconds)}"
        + ("" if ok else f" > {format_seconds(limit or 0.0)}"),
        None if ok else R.HANG_NOT_DETECTED,
    )


def new_incarnation(ev: KillEvidence) -> Check | None:
    """A new incarnation of the job reported training events after the kill; none by the
    end fails (never came back), unless the job finished first (undecided). A judgement
    before the end (another check's failure proven early) claims nothing of it."""
    came_back = ev.inc is not None
    finished_ok = ev.finished_ok
    if not came_back and not ev.final and ev.kill.job_ended is None:
        return None
    count = sum(1 for i in ev.ledger.order if i.born == ev.kill.index)
    return Check(
        "new_incarnation",
        True if came_back else (None if finished_ok else False),
        "a new incarnation reports training events",
        f"{count} new incarnation(s), {ev.restarts} restart(s)",
        (
            f"a new incarnation came back after {ev.restarts} restart(s)"
            if came_back
            else "inconclusive: the job finished before a replacement reported; "
            "lengthen the run so it is still training at the kill"
            if finished_ok
            else f"never came back: no new incarnation reported — {ev.ended}"
        ),
        None if came_back else (R.INCONCLUSIVE if finished_ok else R.NEVER_CAME_BACK),
    )


def recovery_time(ev: KillEvidence) -> Check | None:
    """From the kill to the replacement's first step past the resume, within
    ``maxRecoveryTime``. A first line at the loaded step may be a step done again: when
    only the span between it and the first step past the resume straddles the limit,
    undecided."""
    seconds, inc, resume = ev.recovery_time, ev.inc, ev.settled
    if seconds is None or inc is None or resume is None or not ev.trained:
        return None
    # A first line at the loaded step is the state it holds, or (for a job whose lines
    # may not come after steps) a step done again: the recovery time lies between them.
    earliest = inc.first[1] - ev.kill.time if resume.held_line and inc.first is not None else None
    limit = ev.spec.max_recovery_time
    ok: bool | None = seconds <= limit
    if not ok and earliest is not None and earliest <= limit:
        ok = None
    return Check(
        "recovery_time",
        ok,
        f"<= {format_seconds(limit)}",
        round(seconds, 6),
        (
            f"recovered in {format_seconds(seconds)} (limit {format_seconds(limit)})"
            if ok
            else f"came back too slowly: {format_seconds(seconds)} > {format_seconds(limit)}"
            + _load_phase(ev)
            if ok is False
            else f"the recovery took between {format_seconds(earliest or 0.0)} (its first "
            f"line, at the loaded step) and {format_seconds(seconds)} (its first "
            f"step past it), against a limit of {format_seconds(limit)}: call "
            "progress only after a step, or report checkpoint_loaded later"
        ),
        None if ok else (R.TOO_SLOW if ok is False else R.INCONCLUSIVE),
    )


def _load_phase(ev: KillEvidence) -> str:
    """StorageFault ``during: load``: the phase the fault made grow, named."""
    storage, inc = ev.kill.storage, ev.inc
    if storage is None or storage.spec.during != "load" or inc is None or inc.loaded_at is None:
        return ""
    started = inc.start_time if inc.start_time is not None else inc.first_seen
    took = max(inc.loaded_at - started, 0.0)
    return (
        f"; the checkpointLoaded phase (from the replacement's start to its checkpoint_loaded) "
        f"took {format_seconds(took)} of it, reading through the {storage.spec.mode} fault"
    )


def _phase_over_before(ev: KillEvidence) -> str | None:
    """How the phase the second kill was aimed at had ended before it landed (the job's
    own lines: the replacement that began loading had loaded, a checkpoint completed
    after the first kill, a replacement had trained), or None: it landed inside it."""
    kill, ledger = ev.kill, ev.ledger
    after_first = kill.details.get("afterFirstKillSeconds")
    if not isinstance(after_first, (int, float)):
        return None
    first = kill.time - after_first
    phase = ev.spec.recovery_phase
    if phase == "checkpointLoad":
        sign = kill.details.get("phaseIncarnation")
        inc = ledger.incs.get(sign) or ledger.others.get(sign) if isinstance(sign, str) else None
        if inc is not None and inc.loaded_at is not None and inc.loaded_at <= kill.time:
            early = format_seconds(kill.time - inc.loaded_at)
            return f"the replacement that began loading had loaded step {inc.loaded} {early} before"
        return None
    if phase == "firstInterval":
        done = [c for c in ledger.checkpoints if first < c.time <= kill.time]
        if done:
            early = format_seconds(kill.time - done[0].time)
            return f"checkpoint {done[0].step} had completed {early} before"
        return None
    trained = [
        inc.first[1]
        for inc in (*ledger.order, *ledger.others.values())
        if first < inc.first_seen <= kill.time and inc.first is not None
    ]
    if trained and min(trained) <= kill.time:
        early = format_seconds(kill.time - min(trained))
        return f"a replacement had reported a training step {early} before"
    return None


def reentrant(ev: KillEvidence) -> Check | None:
    """``KillDuringRecovery``, the second kill: the job came back (a replacement trained
    past its resume) from a failure inside the recovery of the first; one it left hung,
    crash-looping or failed for good fails, the phase named (a job that finished first is
    undecided). A second kill that landed after its phase was over, by the job's own
    lines (the replacement that began loading had loaded; a checkpoint had completed
    since the first kill; a replacement had trained), is undecided whatever followed: it
    tested another phase."""
    spec, kill = ev.spec, ev.kill
    if spec.fault != "KillDuringRecovery" or kill.index < 2:
        return None
    phase = spec.recovery_phase or "?"
    where = f"a second failure in the {phase} phase of its recovery"
    expected = "the job recovers again"
    missed = _phase_over_before(ev)
    if missed is not None:
        return Check(
            "reentrant",
            None,
            f"the second kill inside the {phase} phase",
            missed,
            f"inconclusive: the second kill landed after the {phase} phase was over "
            f"({missed}), so this drill did not test a failure in it; make that phase of "
            "the job's recovery last longer than the kill takes to land",
            R.INCONCLUSIVE,
        )
    if ev.trained:
        return Check("reentrant", True, expected, "came back", f"the job came back from {where}")
    if ev.inc is not None and not ev.final and kill.job_ended is None:
        return None  # a replacement that has not trained yet: not decided
    if ev.finished_ok:
        return Check(
            "reentrant",
            None,
            expected,
            None,
            f"inconclusive: the job finished after {where}; lengthen the run",
            R.INCONCLUSIVE,
        )
    after = format_seconds(ev.now - kill.time)
    if kill.job_ended is not None and ev.restarts >= 2:
        how = (
            f"it crash-looped: {ev.restarts} restarts, none trained, then {ended_how(kill, ev.now)}"
        )
    elif kill.job_ended is not None:
        how = f"it failed for good ({ended_how(kill, ev.now)})"
    elif ev.restarts >= 2:
        how = f"it crash-looped: {ev.restarts} restarts in {after}, none reported back"
    elif ev.restarts == 1:
        how = f"it restarted once, and nothing reported back in {after}"
    else:
        how = f"it hung: nothing restarted it in {after}"
    return Check(
        "reentrant",
        False,
        expected,
        how,
        f"the recovery is not re-entrant: after {where}, {how}",
        R.RECOVERY_NOT_REENTRANT,
    )
