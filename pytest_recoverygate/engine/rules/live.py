"""Rules of a live recovery (``recovery: live``, torchft): the survivors train on, the
killed replica rejoins in time, healed from a peer, to the survivors' step, and no
committed step goes backwards (docs/torchft.md)."""

from __future__ import annotations

import itertools

from pytest_recoverygate.engine.replicas import LiveEvidence
from pytest_recoverygate.engine.verdict import Check, FailureReason, format_seconds

__all__ = [
    "heal_step",
    "live_lost_steps",
    "live_state_digest",
    "rejoin_source",
    "rejoin_time",
    "survivors_kept_training",
    "target_killed",
]

R = FailureReason

#: How long after its DELETE or signal was sent a kill may still be taking effect: a
#: kubelet kills a force-deleted pod's container a moment later (SIGTERM, then SIGKILL
#: after a short grace), and the pod's clock may be a little off the drill's.
KILL_TAKES_EFFECT = 5.0


def target_killed(ev: LiveEvidence) -> Check:
    """The killed replica's old incarnations stopped reporting once the kill took effect:
    none wrote a line after its replacement's first line (both were alive at once) or
    more than ``KILL_TAKES_EFFECT`` (5 s) after the kill was sent. A kill takes effect a
    moment after it is sent (a kubelet's, a second or so), so lines in between are not
    counted. An old incarnation that kept reporting is undecided, not failed: the kill
    did not end the process that reports, so the recovery from it cannot be judged (the
    drill's kill did not happen as planned; the job is not at fault). No line of the
    target replica before the kill is undecided."""
    log, kill = ev.log, ev.kill
    victims = [p for p in log.procs.values() if p.replica == log.target and log.old(p)]
    if not victims:
        return Check(
            "target_killed",
            None,
            f"lines of replica {log.target} before the kill",
            "none",
            f"no line of replica {log.target} was seen before the kill, so the drill "
            "cannot tell which process it killed: does its start line carry replica "
            "(REPLICA_GROUP_ID or RECOVERYGATE_REPLICA)?",
            R.INCONCLUSIVE,
        )
    firsts = [
        p.start_time if p.start_time is not None else p.first_seen
        for p in log.procs.values()
        if p.replica == log.target and log.born_after_kill(p)
    ]
    replaced = min(firsts) if firsts else None
    late = [
        p
        for p in victims
        if (replaced is not None and p.last_line > replaced)
        or p.last_line > kill + KILL_TAKES_EFFECT
    ]
    if not late:
        return Check(
            "target_killed",
            True,
            "no line of the killed instance once its replacement ran",
            "none",
            "the target replica died by the kill",
        )
    worst = max(late, key=lambda p: p.last_line)
    after = format_seconds(worst.last_line - kill)
    why = (
        f"after its replacement had started ({format_seconds(worst.last_line - replaced)} "
        "after the replacement's first line): both were alive at once"
        if replaced is not None and worst.last_line > replaced
        else f"more than {format_seconds(KILL_TAKES_EFFECT)} after the kill was sent"
    )
    return Check(
        "target_killed",
        None,
        "no line of the killed instance once its replacement ran",
        f"{len(late)} incarnation(s) kept writing",
        f"the killed replica's old incarnation {worst.inc} kept reporting until {after} "
        f"after the kill, {why}: the kill had not ended the process that reports by then, "
        "so the recovery from it cannot be judged; check that the target the drill kills "
        "is the process that prints the replica's lines",
        R.INCONCLUSIVE,
    )


def _stalled(ev: LiveEvidence, limit: float, stall_value: float) -> Check:
    log, stalls = ev.log, ev.stalls
    worst = max(stalls, key=lambda r: stalls[r][0])
    restarted = [
        r
        for r in ev.survivors
        if any(p.replica == r and log.born_after_kill(p) for p in log.procs.values())
    ]
    why = (
        f"replica(s) {restarted} restarted after the kill: a survivor crashed instead of "
        "training on (torchft's DDP comm hook does when the dead peer resets a "
        "connection inside the allreduce; use manager.allreduce on the gradients, as "
        "the torchft example does)"
        if restarted
        else "the survivors waited for the dead replica (min_replica_size > survivors?) "
        "instead of training on"
    )
    return Check(
        "survivors_kept_training",
        False,
        f"<= {format_seconds(limit)}",
        format_seconds(stall_value),
        f"replica {worst} committed no step for {format_seconds(stall_value)} after "
        f"the kill (maxSurvivorStall {format_seconds(limit)}): {why}",
        R.SURVIVORS_STALLED,
    )


def survivors_kept_training(ev: LiveEvidence) -> Check:
    """Every surviving replica committed steps from the kill to the rejoin, its longest
    gap (the gaps spanning the kill and the rejoin included) within ``maxSurvivorStall``.
    No survivor line, no committed step at all, or a stall not closed by the end, is
    undecided."""
    log, kill, survivors, stalls = ev.log, ev.kill, ev.survivors, ev.stalls
    stall_value = max((v for v, _ in stalls.values()), default=None)
    limit = ev.spec.max_survivor_stall
    silent = [r for r in survivors if not any(t > kill for t, _ in log.commits(r))]
    kept_expected = f"<= {format_seconds(limit)}" if limit is not None else "training on"
    if not survivors:
        return Check(
            "survivors_kept_training",
            None,
            "committed steps from every surviving replica",
            "no survivor reported a replica",
            "no line of a replica other than the target was seen: every replica's "
            "start line must carry replica (REPLICA_GROUP_ID)",
            R.INCONCLUSIVE,
        )
    if limit is not None and stall_value is not None and stall_value > limit:
        return _stalled(ev, limit, stall_value)
    if silent and all(not any(True for _ in log.commits(r)) for r in silent):
        return Check(
            "survivors_kept_training",
            None,
            "committed steps from every surviving replica",
            f"no committed-step line from replica(s) {silent}",
            "the survivors reported no committed step at all: report them with "
            "recoverygate.integrations.torchft.instrument(manager)",
            R.INCONCLUSIVE,
        )
    if ev.rejoin is None and not silent:
        return _kept(kept_expected, stall_value, " (no rejoin to wait for)")
    if ev.rejoin is None or not all(done for _, done in stalls.values()):
        return Check(
            "survivors_kept_training",
            None,
            kept_expected,
            f">= {format_seconds(stall_value or 0.0)} so far",
            "the survivors' stall is not closed: the replacement has not rejoined, or "
            "a survivor committed nothing after the rejoin before the drill ended",
            R.INCONCLUSIVE,
        )
    return _kept(kept_expected, stall_value, "")


def _kept(expected: str, stall_value: float | None, how: str) -> Check:
    return Check(
        "survivors_kept_training",
        True,
        expected,
        format_seconds(stall_value or 0.0),
        f"the survivors kept training{how}; longest stall {format_seconds(stall_value or 0)}",
    )


def rejoin_time(ev: LiveEvidence) -> Check:
    """A new instance of the target replica committed a step within ``maxRejoinTime``
    (``maxRecoveryTime`` when unset) of the kill; none by then fails, none yet when the
    drill was decided earlier is undecided."""
    log, kill, now = ev.log, ev.kill, ev.now
    limit = format_seconds(log.rejoin_limit)
    if ev.rejoin is None:
        proven = now >= kill + log.rejoin_limit
        replacements = log.replacements()
        seen = (
            f"{len(replacements)} new instance(s) started, none committed a step"
            if replacements
            else "no new instance of the replica reported"
        )
        return Check(
            "rejoin_time",
            False if proven else None,
            f"<= {limit}",
            f"none after {format_seconds(now - kill)}",
            f"replica {log.target} never rejoined within {limit}: {seen}"
            if proven
            else f"replica {log.target} had not rejoined when the drill was decided, "
            f"{format_seconds(now - kill)} after the kill: {seen}",
            R.NEVER_REJOINED if proven else R.INCONCLUSIVE,
        )
    seconds = ev.rejoin[1] - kill
    ok = seconds <= log.rejoin_limit
    return Check(
        "rejoin_time",
        ok,
        f"<= {limit}",
        format_seconds(seconds),
        f"the replacement committed its first step {format_seconds(seconds)} after the kill",
        None if ok else R.NEVER_REJOINED,
    )


def rejoin_source(ev: LiveEvidence) -> Check | None:
    """The replacement's state came from ``rejoinFrom`` (a heal line,
    ``checkpoint_loaded(source="peer")``, or a checkpoint load); a first committed step of
    1 with no load line is a start from scratch; no load line otherwise is undecided."""
    if ev.rejoin is None:
        return None
    first, source, wanted, step = ev.rejoin[2], ev.heal.source, ev.spec.rejoin_from, ev.heal.step
    if source is None:
        return Check(
            "rejoin_source",
            None,
            wanted,
            f"no load line; first committed step {first}",
            "the replacement committed a step without a heal or load line: report "
            "heals with recoverygate.integrations.torchft (or "
            'checkpoint_loaded(step, source="peer"))',
            R.INCONCLUSIVE,
        )
    ok = source == wanted
    reason = {
        "scratch": R.REJOINED_FROM_SCRATCH,
        "checkpoint": R.REJOINED_FROM_CHECKPOINT,
        "peer": R.REJOINED_FROM_CHECKPOINT,  # wanted checkpoint, got a peer
    }[source]
    what = {
        "scratch": f"started from scratch (first committed step {first}, no load line)",
        "checkpoint": f"loaded checkpoint step {step}",
        "peer": f"healed from a peer at step {step}",
    }[source]
    return Check(
        "rejoin_source", ok, wanted, source, f"the replacement {what}", None if ok else reason
    )


def heal_step(ev: LiveEvidence) -> Check | None:
    """The replacement healed to a step at or after the survivors' newest committed step
    when it joined (no survivor step before the heal: undecided). It is judged by the
    quorum it joined: healed to S with S + 1 its first commit, a survivor's commit of
    S + 1 is the same quorum's, whatever the order of the lines, and not counted; a
    survivor commit past S + 1 before the heal still fails."""
    step, survivors_step, joined = ev.heal.step, ev.heal.survivors_step, ev.heal.joined
    if ev.rejoin is None or step is None:
        return None
    ok_step = survivors_step is None or step >= survivors_step
    quorum = (
        f" (it joined the quorum of step {joined} with them)"
        if joined is not None and ok_step
        else ""
    )
    return Check(
        "heal_step",
        ok_step if survivors_step is not None else None,
        f">= {survivors_step}" if survivors_step is not None else "the survivors'",
        step,
        f"it took state of step {step}; the survivors were at step {survivors_step} when it "
        f"joined{quorum}"
        if survivors_step is not None
        else "no survivor step was reported before the heal",
        None if ok_step else R.HEALED_TO_OLDER_STEP,
    )


def live_lost_steps(ev: LiveEvidence) -> Check | None:
    """No committed step went backwards, within ``maxLostSteps`` (0 by default here): the
    replacement's first committed step against the job's step when it took its state, and
    each survivor's own steps. A commit of the quorum it joined (its first step, right
    after its heal step) is no step it lost, whenever its line was printed."""
    if ev.rejoin is None:
        return None
    log = ev.log
    replacement, _, first = ev.rejoin
    # the job's step when the replacement took its state (its heal, else its start)
    cutoff = ev.heal.at
    if cutoff is None:
        born = replacement.start_time
        cutoff = born if born is not None else replacement.first_seen
    joined = ev.heal.joined
    reference = [
        s
        for r in log.replicas()
        for t, s in log.commits(r, old_only=True)
        if t <= cutoff and s != joined
    ]
    lost = max(0, max(reference) - (first - 1)) if reference else None
    backwards = 0
    for r in ev.survivors:
        steps = [s for _, s in log.commits(r)]
        for a, b in itertools.pairwise(steps):
            backwards = max(backwards, a - b)
    lost = max(lost or 0, backwards)
    allowed = ev.spec.max_lost_steps if ev.spec.max_lost_steps is not None else 0
    return Check(
        "lost_steps",
        lost <= allowed,
        f"<= {allowed}",
        lost,
        f"{lost} committed step(s) went backwards (the replacement's first committed "
        f"step {first}; the job had reached step "
        f"{max(reference) if reference else '?'})"
        if lost
        else "no committed step went backwards",
        None if lost <= allowed else R.LOST_TOO_MANY_STEPS,
    )


def live_state_digest(ev: LiveEvidence) -> Check | None:
    """``stateDigestMatches``: the healed replica's digest at its heal step (of the state
    it applied) equals a survivor's digest of the state it sent for that step; no heal,
    or a digest missing on either side, is undecided."""
    if not ev.spec.state_digest_matches:
        return None
    wanted = "a survivor's digest at the heal step"
    step = ev.heal.step
    if ev.rejoin is None or step is None:
        return Check(
            "state_digest",
            None,
            wanted,
            "no heal",
            "no heal of the replacement was seen, so there is no healed state to compare",
            R.INCONCLUSIVE,
        )
    healed = ev.rejoin[0].load_digests.get(step)
    theirs = {
        digest
        for p in ev.log.procs.values()
        if p.replica in ev.survivors
        for at_step, digest in p.served.items()
        if at_step == step
    }
    if healed is None or not theirs:
        missing = "the healed replica's" if healed is None else "no survivor's"
        return Check(
            "state_digest",
            None,
            wanted,
            f"{missing} digest at step {step}",
            f"{missing} state digest at heal step {step} was reported: report heals "
            "with recoverygate.integrations.torchft (it sends both), or "
            "checkpoint_loaded(step, source='peer', digest=...) on the healed replica and "
            "checkpoint_completed(step, digest=...) on the survivor that sent the state",
            R.INCONCLUSIVE,
        )
    ok = healed in theirs
    return Check(
        "state_digest",
        ok,
        ", ".join(sorted(theirs)),
        healed,
        f"the healed replica's state at step {step} is the survivors' (digest {healed})"
        if ok
        else f"the healed replica's state at step {step} (digest {healed}) differs "
        f"from the state the survivors sent ({', '.join(sorted(theirs))}): the heal did not "
        "apply what it received (the job's load_state_dict?)",
        None if ok else R.STATE_DIFFERS,
    )
