"""Rules of a failure that comes back (StickyFault): ``scope: step``, the poisoned step
was reached and the job stopped retrying it within ``maxCrashLoop`` incarnations;
``scope: checkpoint``, the job did not train on the damaged checkpoint, fell back to an
older one rather than to nothing, and did not retry the damaged one again and again;
``scope: node``, the job stopped placing work on the node that stays bad within
``maxCrashLoop`` placements that died there."""

from __future__ import annotations

from pytest_recoverygate.engine.rules.evidence import KillEvidence, StickyEvidence
from pytest_recoverygate.engine.verdict import Check, FailureReason, format_seconds

__all__ = [
    "bad_node_avoided",
    "crash_loop_bounded",
    "damage_handled",
    "gpu_hours",
    "poison_reached",
]

R = FailureReason


def poison_reached(ev: StickyEvidence) -> Check | None:
    """``scope: step``: an incarnation of the target rank reached the poisoned step (and
    died there); none by the end is undecided (the run ends before it, or the target rank
    never calls the reporter's progress)."""
    step = ev.sticky.at_step
    expected = f"an incarnation reaches step {step}"
    if ev.deaths:
        first = format_seconds(ev.deaths[0][1] - ev.armed_at)
        return Check(
            "fault_hit",
            True,
            expected,
            len(ev.deaths),
            f"the target rank reached the poisoned step {step} {first} after the poison was "
            "armed, and died there",
        )
    if not ev.final:
        return None
    return Check(
        "fault_hit",
        None,
        expected,
        0,
        f"inconclusive: no incarnation of rank {ev.spec.target_rank} reached step {step} "
        "(the poisoned step must come after the trigger and before the run ends, on a rank "
        "that calls reporter.progress)",
        R.INCONCLUSIVE,
    )


def gpu_hours(ev: StickyEvidence) -> tuple[float, float] | None:
    """``projection.gpus`` x the time the retries took (from the first death to now) and
    x the mean time between deaths, in GPU-hours; None without the scale or two deaths."""
    gpus, deaths = ev.sticky.gpus, ev.deaths
    if gpus is None or len(deaths) < 2:
        return None
    span = ev.now - deaths[0][1]
    per = (deaths[-1][1] - deaths[0][1]) / (len(deaths) - 1)
    return gpus * span / 3600.0, gpus * per / 3600.0


def crash_loop_bounded(ev: StickyEvidence) -> Check | None:
    """``scope: step``: the job stopped retrying the poisoned step within ``maxCrashLoop``
    incarnations: it gave up with a non-zero exit, or trained past the step; more deaths
    there fail ``CRASH_LOOP`` as soon as proven (with the incarnations, restarts and
    seconds the retries burned)."""
    limit, deaths = ev.sticky.max_crash_loop, len(ev.deaths)
    step = ev.sticky.at_step
    expected = f"at most {limit} incarnation(s) die at step {step}"
    burned = (
        f"{deaths} incarnations died there, {ev.restarts} restart(s), "
        f"{format_seconds(ev.now - ev.armed_at)} since the poison was armed"
    )
    cost = gpu_hours(ev)
    if cost is not None:
        burned += (
            f"; at projection.gpus {ev.sticky.gpus} that is {cost[0]:.3g} GPU-hours, "
            f"{cost[1]:.3g} more for each retry"
        )
    if deaths > limit:
        return Check(
            "crash_loop",
            False,
            expected,
            deaths,
            f"the job crash-loops on step {step}: {burned}; it retries the same failure "
            "instead of stopping (bound the restarts, or skip the step and say so)",
            R.CRASH_LOOP,
        )
    if not deaths or not ev.final:
        return None
    if ev.past is not None:
        return Check(
            "crash_loop",
            True,
            expected,
            deaths,
            f"after {deaths} death(s) at step {step} the job went on past it (step {ev.past[0]})",
        )
    if ev.ended is not None and not ev.ended[2]:
        detail = f" ({ev.ended[1]})" if ev.ended[1] else ""
        return Check(
            "crash_loop",
            True,
            expected,
            deaths,
            f"after {deaths} death(s) at step {step} the job gave up loudly{detail}",
        )
    why = (
        "the job finished"
        if ev.ended is not None
        else "it neither died again, gave up nor trained past the step"
    )
    return Check(
        "crash_loop",
        None,
        expected,
        deaths,
        f"inconclusive: after {deaths} death(s) at step {step}, {why} by "
        f"{format_seconds(ev.now - ev.armed_at)}",
        R.INCONCLUSIVE,
    )


def damage_handled(ev: KillEvidence) -> Check | None:
    """``scope: checkpoint``: the job did not train on the checkpoint the drill damaged.
    A resume from an older checkpoint passes; a resume from the damaged step with the
    state saved (equal digests: an intact copy) passes, with another digest fails
    ``LOADED_CORRUPT_CHECKPOINT``, with no digest to compare is undecided; a restart from
    scratch while an older checkpoint was intact fails ``NO_FALLBACK``; more restarts than
    ``maxCrashLoop`` with none trained fail ``CRASH_LOOP`` when proven; a job that gave up
    loudly passes when its last error names a damaged file, else is undecided."""
    sticky, step = ev.spec.sticky, ev.kill.step
    damaged = ev.ledger.damaged.get(step)
    if sticky is None or sticky.scope != "checkpoint" or not damaged:
        return None
    names = [text.split(" (", 1)[0] for text in damaged]
    expected = f"no training on the damaged checkpoint {step}"
    intact = [
        c.step
        for c in ev.ledger.checkpoints
        if c.step < step and c.step not in ev.ledger.not_durable
    ]
    resume = ev.settled or ev.resume
    if ev.trained and resume is not None and resume.step is not None:
        return _resumed(ev, resume.step, step, intact, expected)
    if not ev.trained and ev.restarts > sticky.max_crash_loop:
        return Check(
            "damage_handled",
            False,
            expected,
            f"{ev.restarts} restarts",
            f"the job crash-loops on the damaged checkpoint {step}: {ev.restarts} restarts "
            f"in {format_seconds(ev.now - ev.kill.time)}, none trained (maxCrashLoop "
            f"{sticky.max_crash_loop}); verify a checkpoint on load and fall back to the one "
            "before it",
            R.CRASH_LOOP,
        )
    ended = ev.kill.job_ended
    if ev.trained or ended is None or ended[2]:
        return None
    named = [name for name in names if name.rsplit("/", 1)[-1] in ended[1]]
    if named:
        return Check(
            "damage_handled",
            True,
            expected,
            "failed loudly",
            f"the job gave up loudly, naming the damaged {named[0]} ({ended[1]})",
        )
    return Check(
        "damage_handled",
        None,
        expected,
        "failed loudly",
        f"inconclusive: the job gave up after {ev.restarts} restart(s) without naming a "
        f"damaged file ({', '.join(names)}) in its last error; a crash on the damage cannot "
        "be told from another: name the file (or fall back to "
        + (f"checkpoint {max(intact)})" if intact else "an older checkpoint)"),
        R.INCONCLUSIVE,
    )


def _resumed(ev: KillEvidence, observed: int, step: int, intact: list[int], expected: str) -> Check:
    """A replacement that trained, resumed from ``observed``; ``step`` was damaged."""
    if observed == step:
        inc = ev.inc
        # The first save of the step: the one the fault damaged. A later one may be an
        # earlier replacement's save of the damaged state it loaded.
        saved = [c.digest for c in ev.ledger.checkpoints if c.step == step and c.digest]
        loaded = inc.loaded_digest if inc is not None else None
        if saved and loaded is not None and loaded != saved[0]:
            return Check(
                "damage_handled",
                False,
                expected,
                f"loaded step {step}",
                f"the job loaded the damaged checkpoint {step} and trains on it: the state "
                "digest it loaded differs from the one saved; verify a checkpoint on load",
                R.LOADED_CORRUPT_CHECKPOINT,
            )
        if saved and loaded is not None:
            return Check(
                "damage_handled",
                True,
                expected,
                f"loaded step {step}",
                f"the job resumed from step {step} with the state saved there (its digest "
                "matches): it read an intact copy",
            )
        return Check(
            "damage_handled",
            None,
            expected,
            f"resumed from step {step}",
            f"inconclusive: the job resumed from the damaged checkpoint {step}; whether it "
            "read the damage or an intact copy needs the state digest on checkpoint_completed "
            "and checkpoint_loaded (reporter.state_digest)",
            R.INCONCLUSIVE,
        )
    if observed == 0 and intact:
        return Check(
            "damage_handled",
            False,
            expected,
            "resumed from step 0",
            f"the job restarted from scratch though checkpoint {max(intact)} was intact: it "
            f"did not fall back past the damaged checkpoint {step}",
            R.NO_FALLBACK,
        )
    if observed < step:
        return Check(
            "damage_handled",
            True,
            expected,
            f"resumed from step {observed}",
            f"the job fell back past the damaged checkpoint {step} to step {observed}",
        )
    return Check(
        "damage_handled",
        True,
        expected,
        f"resumed from step {observed}",
        f"the job resumed from step {observed}, a checkpoint newer than the damaged {step}",
    )


def bad_node_avoided(ev: KillEvidence) -> Check | None:
    """``scope: node``: the job stopped placing work on the bad node within
    ``maxCrashLoop`` placements that died (or hung) there. More fail ``BAD_NODE_REUSED``
    as soon as proven, with what the rejoining burned (placements, restarts, seconds);
    the node's agent leaving the job, or the job ending, passes; a job still training
    with the node's agent in it at the end is undecided (its next placement may come)."""
    bad = ev.kill.bad_node
    sticky = ev.spec.sticky
    if bad is None or sticky is None:
        return None
    limit, deaths, verb = sticky.max_crash_loop, bad.deaths, bad.verb
    node = bad.node or "the bad node"
    expected = f"at most {limit} placement(s) on {node} {verb} there"
    placed = len(bad.placements) + bad.dropped
    burned = (
        f"{placed} placement(s) on {node} since it went bad, {deaths} {verb} there, "
        f"{ev.restarts} restart(s), {format_seconds(ev.now - bad.armed_at)}"
    )
    if deaths > limit:
        return Check(
            "bad_node",
            False,
            expected,
            deaths,
            f"the job keeps placing work on the bad node: {burned}; take a node out after "
            "a failure or two (a health check that ends its agent, the scheduler's exclude "
            "list) instead of rejoining it",
            R.BAD_NODE_REUSED,
        )
    if bad.left is not None:
        when, why = bad.left
        return Check(
            "bad_node",
            True,
            expected,
            deaths,
            f"the job stopped placing work on {node} after {placed} placement(s) "
            f"({deaths} {verb} there): it left the job {format_seconds(when - bad.armed_at)} "
            f"after the node went bad ({why})",
        )
    ended = ev.kill.job_ended
    if ended is not None:
        return Check(
            "bad_node",
            True,
            expected,
            deaths,
            f"the job placed no more work on {node} after {placed} placement(s) "
            f"({deaths} {verb} there): it ended ({ended[1] or 'no detail'})",
        )
    if not ev.final:
        return None
    return Check(
        "bad_node",
        None,
        expected,
        deaths,
        f"inconclusive: after {deaths} placement(s) {verb} on {node}, its agent is still in "
        f"the job {format_seconds(ev.now - bad.armed_at)} after the node went bad, so another "
        "placement there may come (the drill proves the node's exclusion by its agent "
        "leaving the job); allow more time (maxRecoveryTime), or see what the agent waits for",
        R.INCONCLUSIVE,
    )
