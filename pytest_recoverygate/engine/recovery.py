"""Judging kills: the checks of one recovery, and the drill's verdict over all of them.

Pure functions of the :class:`~pytest_recoverygate.engine.ledger.Ledger` (what the job's lines
prove), the :class:`~pytest_recoverygate.engine.spec.DrillSpec` and a :class:`KillRecord` (one
kill and what the backend and the job showed since). The engine decides *when* a kill is
judged; this module says what the judgement is: one
:class:`~pytest_recoverygate.engine.verdict.Recovery` per kill, then :func:`overall`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_recoverygate.engine import checks as checks_of
from pytest_recoverygate.engine.ledger import Inc, Ledger, Resume
from pytest_recoverygate.engine.model import GroupEventKind
from pytest_recoverygate.engine.spec import DrillSpec, Sustain
from pytest_recoverygate.engine.verdict import (
    BREAKDOWN_PHASES,
    Check,
    FailureReason,
    Recovery,
    Verdict,
    format_seconds,
)

__all__ = [
    "KillRecord",
    "Window",
    "breakdown",
    "budget_checks",
    "ended_how",
    "hung",
    "judge",
    "node_details",
    "overall",
    "preempt_checks",
    "ranks_check",
    "restarts",
    "sustain_check",
]

R = FailureReason
Note = Callable[..., None]

#: A job that ends successfully inside the sustain window (exit 0, pod Succeeded, Slurm
#: COMPLETED, Ray SUCCEEDED) sustained its recovery once this many progress lines past the
#: resume advanced the step: it trained on, then finished.
ENDED_INSIDE_LINES = 3


@dataclass(slots=True)
class Window:
    """The sustain window of one judged replacement: its first step past the resume, the
    newest line that advanced the step, and how many did."""

    start: tuple[int, float]
    last: tuple[int, float]
    stall_limit: float
    lines: int = 0

    def held(self, sustain: Sustain, resume_step: int | None) -> bool:
        """Whether the recovery was held for the whole window."""
        if self.lines < sustain.lines or self.last[1] - self.start[1] < sustain.seconds:
            return False
        return sustain.steps is None or self.last[0] - (resume_step or 0) >= sustain.steps

    def ended_inside(self, sustain: Sustain, resume_step: int | None, succeeded: bool) -> bool:
        """Whether a job that ended successfully inside the window sustained its recovery:
        at least :data:`ENDED_INSIDE_LINES` (or the window's own line count, if larger)
        advancing progress lines past the resume, the first step past it included."""
        if not succeeded or self.held(sustain, resume_step):
            return False
        return self.lines + 1 >= max(ENDED_INSIDE_LINES, sustain.lines)


@dataclass(slots=True)
class KillRecord:
    """One kill under judgement and what the backend and the job showed since."""

    index: int
    step: int
    trigger_time: float
    time: float
    rank: int | None
    position: float | None = None
    group_seen: dict[GroupEventKind, float] = field(default_factory=dict)
    group_restarts: int = 0
    judged: Inc | None = None
    resume: Resume | None = None
    job_ended: tuple[float, str, bool] | None = None  # (time, detail, succeeded)
    detected: float | None = None  # HangWorker: when the job noticed
    details: dict[str, Any] = field(default_factory=dict)
    slipped: list[int] = field(default_factory=list)  # checkpoints between trigger and kill
    window: Window | None = None  # the sustain window, once it opened


def restarts(ledger: Ledger, kill: KillRecord) -> int:
    ev = ledger
    counted = [kill.group_restarts]
    workers = [i for i in ev.order if not ev.is_child(i)]  # a worker's children are no restarts
    olds = [i.restart for i in workers if i.born < kill.index and i.restart is not None]
    news = [i.restart for i in workers if i.born == kill.index and i.restart is not None]
    if news and olds:
        counted.append(max(news) - max(olds))
    per_rank: dict[int | None, int] = {}
    for inc in workers:
        if inc.born == kill.index:
            per_rank[inc.rank] = per_rank.get(inc.rank, 0) + 1
    counted.append(max(per_rank.values(), default=0))
    return max(counted)


def ended_how(kill: KillRecord, now: float) -> str:
    if kill.job_ended is not None:
        _, detail, ok = kill.job_ended
        what = "the job finished" if ok else "the job failed"
        return f"{what} ({detail})" if detail else what
    return f"within {format_seconds(now - kill.time)} of the kill"


def hung(ledger: Ledger, spec: DrillSpec, kill: KillRecord, now: float) -> Recovery:
    check = Check(
        "gave_up_loudly",
        False,
        "a replacement, or the job ends non-zero",
        None,
        f"the job neither came back nor failed within "
        f"{format_seconds(now - kill.time)} of kill {kill.index}: it hangs (a job that "
        "gives up must end non-zero, or the backend must mark it failed)",
        R.HUNG_INSTEAD_OF_FAILING,
    )
    return Recovery(
        kill.index,
        spec.fault,
        Verdict.FAIL,
        check.message,
        checks=(check,),
        trigger_checkpoint=kill.step,
        kill_time=kill.time,
        restarts=restarts(ledger, kill),
        breakdown=breakdown(spec, kill),
    )


def judge(
    ledger: Ledger,
    spec: DrillSpec,
    kill: KillRecord,
    inc: Inc | None,
    *,
    now: float,
    note: Note,
    ranks: Sequence[int] = (),
    final: bool = True,
) -> Recovery:
    ev = ledger
    resume = kill.resume
    if resume is None and inc is not None and inc.first is not None:
        resume = ev.resume_of(inc, final=True)
    elif resume is None and inc is not None and inc.loaded is not None:
        resume = Resume(inc.loaded, inc.loaded)  # it holds that state, but never trained
    kill.judged = inc
    kill.resume = resume
    finished_ok = kill.job_ended is not None and kill.job_ended[2]
    ended = ended_how(kill, now)
    contract = ev.contract()
    restart_count = restarts(ledger, kill)
    checks: list[Check] = []
    if spec.fault in ("HangWorker", "PartitionNode"):  # the first question: did it notice?
        detected = None if kill.detected is None else kill.detected - kill.time
        what = "the hung worker" if spec.fault == "HangWorker" else "the cut link"
        checks.append(
            checks_of.detection_check(
                ev, detected, spec.max_detection_time, deadline_passed=True, what=what
            )
        )
        kill.details["detectionSeconds"] = None if detected is None else round(detected, 6)
    node_details(spec, kill, came_back=inc is not None)
    came_back = inc is not None
    checks.append(
        Check(
            "new_incarnation",
            True if came_back else (None if finished_ok else False),
            "a new incarnation reports training events",
            f"{sum(1 for i in ev.order if i.born == kill.index)} new incarnation(s), "
            f"{restart_count} restart(s)",
            (
                f"a new incarnation came back after {restart_count} restart(s)"
                if came_back
                else "inconclusive: the job finished before a replacement reported; "
                "lengthen the run so it is still training at the kill"
                if finished_ok
                else f"never came back: no new incarnation reported — {ended}"
            ),
            None if came_back else (R.INCONCLUSIVE if finished_ok else R.NEVER_CAME_BACK),
        )
    )
    checks.append(checks_of.contract_check(ev, contract))
    explicit = spec.expected_resume_step is not None and kill.index == 1
    expected, floor = ev.expected(inc, spec.expected_resume_step if explicit else None)
    recovery_time: float | None = None
    lost: tuple[int | None, int | None] = (None, None)
    past = None
    if inc is not None and resume is not None and inc.first is not None:
        past = inc.first_trained(resume)
    if inc is not None and (inc.first is None or past is None):
        checks += checks_of.no_progress_checks(ev, inc, expected, ended, finished_ok)
    elif inc is not None and resume is not None and past is not None:
        resume_check = checks_of.unless_proven(
            checks_of.resume_check(
                ev, inc, resume, expected, floor, explicit=explicit, contract=contract
            ),
            resume,
            expected,
            contract,
        )
        checks.append(resume_check)
        if resume.step is None and resume_check.observed == 0 and resume_check.passed is False:
            # Proven whatever the grid: nothing at or below its first line but step 0.
            resume = kill.resume = dataclasses.replace(resume, step=0, undecided=None)
        recovery_time = past[1] - kill.time
        # A first line at the loaded step is the state it holds, or (for a job whose lines
        # may not come after steps) a step done again: the recovery time lies between them.
        earliest = inc.first[1] - kill.time if resume.held_line and inc.first is not None else None
        limit = spec.max_recovery_time
        ok: bool | None = recovery_time <= limit
        if not ok and earliest is not None and earliest <= limit:
            ok = None
        checks.append(
            Check(
                "recovery_time",
                ok,
                f"<= {format_seconds(limit)}",
                round(recovery_time, 6),
                (
                    f"recovered in {format_seconds(recovery_time)} (limit {format_seconds(limit)})"
                    if ok
                    else f"came back too slowly: {format_seconds(recovery_time)} > "
                    f"{format_seconds(limit)}"
                    if ok is False
                    else f"the recovery took between {format_seconds(earliest or 0.0)} (its first "
                    f"line, at the loaded step) and {format_seconds(recovery_time)} (its first "
                    f"step past it), against a limit of {format_seconds(limit)}: call "
                    "progress only after a step, or report checkpoint_loaded later"
                ),
                None if ok else (R.TOO_SLOW if ok is False else R.INCONCLUSIVE),
            )
        )
        lost = checks_of.lost(ev, resume, inc)
        if spec.max_lost_steps is not None:
            checks.append(checks_of.lost_check(lost, spec.max_lost_steps))
        if spec.state_digest_matches:
            digest = checks_of.digest_check(ev, inc, resume)
            if digest is not None:
                checks.append(digest)
        if inc.backwards is not None:
            was, then = inc.backwards
            checks.append(
                Check(
                    "progress_after_resume",
                    False,
                    f"steps advancing from {resume.step}",
                    f"{was}, then {then}",
                    f"progress went backwards after the resume ({was}, then {then}): the "
                    "step counter was reset and steps were done again",
                    R.RESTARTED_FROM_SCRATCH if then <= 1 else R.STEPS_REPLAYED,
                )
            )
        sustained = sustain_check(spec, kill, inc, past, now, final=final)
        if sustained is not None:
            checks.append(sustained)
    rank_states: list[dict[str, Any]] = []
    if (
        inc is not None
        and len(set(ranks) | {r.rank for r in ev.others.values() if r.rank is not None}) > 1
    ):
        rank_check, rank_states = ranks_check(
            ev, spec, kill, inc, window=(expected, None if explicit else floor), ranks=ranks
        )
        if rank_check is not None:
            checks.append(rank_check)
    if rank_states:
        kill.details["ranks"] = rank_states
    if spec.fault == "Preempt":
        checks += preempt_checks(spec, kill, resume)
    failed = [c for c in checks if c.passed is False]
    if failed:  # a sustain window still open adds nothing to a proven failure
        checks = [c for c in checks if not (c.name == "progress_after_resume" and c.undecided)]
    undecided = [c for c in checks if c.passed is None]
    if failed:
        verdict, summary = Verdict.FAIL, "; ".join(c.message for c in failed)
    elif undecided:
        verdict = Verdict.ERROR
        summary = "; ".join(
            c.message if c.message.startswith("inconclusive") else f"inconclusive: {c.message}"
            for c in undecided
        )
    else:
        assert recovery_time is not None
        assert resume is not None
        verdict = Verdict.PASS
        window = kill.window
        held = (
            f", then trained {window.last[0] - window.start[0]} more steps over "
            f"{format_seconds(window.last[1] - window.start[1])}"
            if window is not None
            else ""
        )
        if _ended_inside(kill, spec):
            held += " and ended successfully: the run ended inside the sustain window"
        summary = (
            f"resumed from step {resume.step} as expected and recovered in "
            f"{format_seconds(recovery_time)}{held}"
        )
    proven, bound = ev.last_before_kill(inc)
    if resume is not None and resume.undecided and resume.step is not None:
        note(now, "note", resume.undecided)
    note(now, "recovery", f"kill {kill.index}: {verdict.value}: {summary}")
    return Recovery(
        index=kill.index,
        fault=spec.fault,
        verdict=verdict,
        summary=summary,
        checks=tuple(checks),
        trigger_checkpoint=kill.step,
        kill_time=kill.time,
        delay_seconds=round(kill.time - kill.trigger_time, 6),
        position=kill.position,
        resume_step=resume.step if resume is not None else None,
        expected_resume_step=expected,
        loaded_step=(
            resume.loaded if resume is not None else inc.loaded if inc is not None else None
        ),
        last_step_before_kill=proven,
        last_step_before_kill_upper_bound=bound,
        lost_steps=lost[0],
        lost_steps_upper_bound=lost[1],
        recovery_time_seconds=round(recovery_time, 6) if recovery_time is not None else None,
        restarts=restart_count,
        judged_incarnation=inc.id if inc is not None else None,
        breakdown=breakdown(spec, kill),
        fault_details=dict(kill.details),
        resume_basis=resume.basis if resume is not None else None,
        resume_upper_bound=resume.upper if resume is not None else None,
        sustained=_sustained(kill, spec),
    )


def _ended_inside(kill: KillRecord, spec: DrillSpec) -> bool:
    """Whether the judged job ended successfully inside its sustain window, held by it."""
    window = kill.window
    if window is None or kill.job_ended is None:
        return False
    resume_step = kill.resume.step if kill.resume is not None else None
    return window.ended_inside(spec.sustain, resume_step, kill.job_ended[2])


def _sustained(kill: KillRecord, spec: DrillSpec) -> dict[str, Any] | None:
    window = kill.window
    if window is None:
        return None
    return {
        "endedInsideWindow": _ended_inside(kill, spec),
        "window": spec.sustain.describe(),
        "fromStep": window.start[0],
        "lastStep": window.last[0],
        "steps": window.last[0] - window.start[0],
        "seconds": round(window.last[1] - window.start[1], 6),
        "lines": window.lines,
        "stallLimitSeconds": round(window.stall_limit, 6),
    }


def sustain_check(
    spec: DrillSpec,
    kill: KillRecord,
    inc: Inc,
    past: tuple[int, float],
    now: float,
    *,
    final: bool = True,
) -> Check | None:
    """``progress_after_resume``: training kept advancing for the whole sustain window."""
    window = kill.window
    if window is None:  # judged before a second line: the window is its first step alone
        window = Window(past, inc.advanced or past, kill.window.stall_limit if kill.window else 5.0)
    resume_step = kill.resume.step if kill.resume is not None else None
    expected = f"training for {spec.sustain.describe()} after the resume"
    observed = {
        "steps": window.last[0] - window.start[0],
        "seconds": round(window.last[1] - window.start[1], 6),
        "lines": window.lines,
    }
    if window.held(spec.sustain, resume_step):
        return Check(
            "progress_after_resume",
            True,
            expected,
            observed,
            f"trained {observed['steps']} steps over "
            f"{format_seconds(window.last[1] - window.start[1])} after the resume "
            f"({window.lines} advancing progress lines)",
        )
    last, at = window.last
    where = f"its last step was {last}, {format_seconds(at - kill.time)} after the kill"
    if kill.job_ended is not None:
        _, detail, ok = kill.job_ended
        if window.ended_inside(spec.sustain, resume_step, ok):
            return Check(
                "progress_after_resume",
                True,
                expected,
                observed,
                f"trained {observed['steps']} steps over "
                f"{format_seconds(window.last[1] - window.start[1])} after the resume "
                f"({window.lines + 1} advancing progress lines past it), then the job ended "
                "successfully" + (f" ({detail})" if detail else "") + ": the run ended inside "
                f"the sustain window ({spec.sustain.describe()})",
            )
        if ok:
            return Check(
                "progress_after_resume",
                None,
                expected,
                observed,
                "inconclusive: the job finished inside the sustain window "
                f"({spec.sustain.describe()}) after resuming ({where}); lengthen the run or "
                "shorten expectations.sustain",
                R.INCONCLUSIVE,
            )
        return Check(
            "progress_after_resume",
            False,
            expected,
            observed,
            f"training stopped progressing after resume: {where}, then the job failed"
            + (f" ({detail})" if detail else ""),
            R.STOPPED_PROGRESSING,
        )
    if now - at >= window.stall_limit:
        return Check(
            "progress_after_resume",
            False,
            expected,
            observed,
            f"training stopped progressing after resume: {where}, and no step followed for "
            f"{format_seconds(now - at)} (stall limit {format_seconds(window.stall_limit)}; "
            "a job that pauses on purpose after the resume, to evaluate say, sets "
            "expectations.maxStall)",
            R.STOPPED_PROGRESSING,
        )
    if not final:
        return None  # the window is still open: nothing is proven either way yet
    return Check(
        "progress_after_resume",
        None,
        expected,
        observed,
        f"inconclusive: the sustain window ({spec.sustain.describe()}) was not held by the "
        f"drill's deadline ({where}); several processes may be reporting for the rank",
        R.INCONCLUSIVE,
    )


def ranks_check(
    ledger: Ledger,
    spec: DrillSpec,
    kill: KillRecord,
    judged: Inc,
    *,
    window: tuple[int | None, int | None],
    ranks: Sequence[int],
) -> tuple[Check | None, list[dict[str, Any]]]:
    """``all_ranks_resumed``: every rank of the replacement group loaded the expected step.

    Each rank's own ``checkpoint_loaded`` (its shard: ZeRO/FSDP optimizer state, per-rank
    RNG or data-loader state) is held to the expected step, and with stateDigestMatches to
    the digest that rank saved at that step. A rank that loaded another step, or none
    before it saved again, FAILs with the rank named; a rank that says nothing is
    unchecked (a FAIL with ``expectations.allRanks``). With ``latest`` (``window`` gives
    the floor) a rank that loaded a checkpoint durable before its own load and no older
    than the floor loaded a latest one too, as the judged rank may.
    """
    expected, floor = window
    if expected is None:
        return None, []
    known = set(ranks) | {o.rank for o in ledger.others.values() if o.rank is not None}
    known.discard(judged.rank if judged.rank is not None else -1)
    states: list[dict[str, Any]] = []
    failed: list[str] = []
    unchecked: list[int] = []  # said nothing about its resume
    undigested: list[int] = []  # loaded, but its saved or loaded digest was never seen
    reason: FailureReason | None = None
    for rank in sorted(known):
        new = [
            o
            for o in ledger.others.values()
            if o.rank == rank and o.born == kill.index and not ledger.is_child(o)
        ]
        # The rank's newest process is its member of the group (an older one died).
        newest = max(new, key=lambda o: o.first_seen) if new else None
        loaded = [newest] if newest is not None and newest.loaded is not None else []
        state: dict[str, Any] = {"rank": rank, "expected": expected}
        if loaded:
            o = loaded[-1]
            state["loaded"] = o.loaded
            # The judged rank's own check decides whether the step it loaded was right; a rank
            # that loaded that same step is consistent with it.
            same = kill.resume is not None and o.loaded == kill.resume.loaded
            ok = o.loaded == expected or same
            if not ok and floor is not None and o.loaded is not None and o.loaded_at is not None:
                durable = {c.step for c in ledger.checkpoints if c.time <= o.loaded_at}
                ok = o.loaded in durable and o.loaded >= floor
            if not ok:
                assert o.loaded is not None
                failed.append(f"rank {rank} loaded step {o.loaded}, expected step {expected}")
                reason = reason or (
                    R.RESTARTED_FROM_SCRATCH
                    if o.loaded == 0
                    else R.RESUMED_FROM_OLDER_CHECKPOINT
                    if o.loaded < expected
                    else R.RESUMED_FROM_UNEXPECTED_CHECKPOINT
                )
            elif spec.state_digest_matches:
                saved = (
                    ledger.rank_saves.get(rank, {}).get(o.loaded) if o.loaded is not None else None
                )
                if saved is None or saved.digest is None or o.loaded_digest is None:
                    # Its shard's digest at that step was never seen (the kill came first,
                    # or no digest=): the state cannot be compared.
                    state["status"] = "unchecked"
                    undigested.append(rank)
                    states.append(state)
                    continue
                state["digestMatches"] = saved.digest == o.loaded_digest
                if saved.digest != o.loaded_digest:
                    ok = False
                    failed.append(
                        f"rank {rank} loaded checkpoint {o.loaded} but its state differs "
                        "from the shard it saved at that step"
                    )
                    reason = reason or R.STATE_DIFFERS
            state["status"] = "ok" if ok else "failed"
        elif newest is not None and newest.first_line is not None:
            state["status"] = "failed"
            failed.append(
                f"rank {rank} loaded no checkpoint: its replacement saved again without "
                "reporting checkpoint_loaded (its state was re-initialised?)"
            )
            reason = reason or R.RESTARTED_FROM_SCRATCH
        else:
            state["status"] = "unchecked"
            unchecked.append(rank)
        states.append(state)
    if not states:
        return None, []
    quiet_parts = []
    if unchecked:
        quiet_parts.append(
            f"rank(s) {', '.join(map(str, unchecked))} reported no checkpoint_loaded after "
            "the kill, so their state is unchecked (report checkpoint_loaded on every rank: "
            "the reporter prints it on every rank)"
        )
    if undigested:
        quiet_parts.append(
            f"rank(s) {', '.join(map(str, undigested))} loaded a checkpoint whose saved or "
            "loaded digest was never seen, so their state is unchecked (pass digest= to "
            "checkpoint_completed and checkpoint_loaded on every rank)"
        )
    quiet = "; ".join(quiet_parts)
    unchecked = unchecked + undigested
    if failed or (unchecked and spec.all_ranks):
        messages = failed + (
            [quiet + " and expectations.allRanks is set"] if unchecked and spec.all_ranks else []
        )
        return (
            Check(
                "all_ranks_resumed",
                False,
                f"every rank loaded step {expected}",
                states,
                "; ".join(messages),
                reason or R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
            ),
            states,
        )
    judged_loaded = kill.resume.loaded if kill.resume is not None else None
    said = _loaded_text(states, expected, judged_loaded, floor)
    if not said:  # no other rank said what it loaded: nothing was verified
        return (
            Check(
                "all_ranks_resumed",
                True,
                f"every rank loaded step {expected}",
                states,
                f"not checked: {quiet}",
                checked=False,
            ),
            states,
        )
    return (
        Check(
            "all_ranks_resumed",
            True,
            f"every rank loaded step {expected}",
            states,
            said + (f"; {quiet}" if quiet else ""),
        ),
        states,
    )


def _loaded_text(
    states: Sequence[dict[str, Any]], expected: int, judged: int | None, floor: int | None
) -> str:
    """What the checked ranks loaded, from their entries: ``rank(s) 1, 2 loaded step 20``,
    with why a step other than the expected one was accepted ("" when none was checked)."""
    loaded_by: dict[int, list[int]] = {}
    for state in states:
        if state.get("status") == "ok":
            loaded_by.setdefault(state["loaded"], []).append(state["rank"])
    return "; ".join(
        f"rank(s) {', '.join(map(str, ranks))} loaded step {step}"
        + (
            ""
            if step == expected
            else " (the judged rank's step)"
            if step == judged
            else f" (a checkpoint durable before its load, no older than step {floor})"
        )
        for step, ranks in sorted(loaded_by.items())
    )


def node_details(spec: DrillSpec, kill: KillRecord, *, came_back: bool) -> None:
    """A node fault's figures: the replacement node, and whether the cut node rejoined."""
    if spec.fault not in ("KillNode", "PartitionNode", "DrainNode"):
        return
    started = kill.group_seen.get(GroupEventKind.NODE_REPLACEMENT_STARTED)
    gone = kill.group_seen.get(GroupEventKind.NODE_GONE)
    if gone is not None:
        kill.details["nodeGoneSeconds"] = round(gone - kill.time, 6)
    if started is not None:
        kill.details["replacementNodeStartedSeconds"] = round(started - kill.time, 6)
    if spec.fault == "KillNode":
        kill.details["replaceNode"] = spec.replace_node
    if spec.fault == "PartitionNode":
        kill.details["nodeOutcome"] = (
            "replaced" if started is not None else "rejoined" if came_back else None
        )


def preempt_checks(spec: DrillSpec, kill: KillRecord, resume: Resume | None) -> list[Check]:
    saved = kill.details.get("savedStep")
    used = resume is not None and saved is not None and resume.step == saved
    kill.details["savedUsed"] = used if saved is not None else None
    if not spec.saved_on_preempt:
        return []
    grace = format_seconds(spec.grace_period)
    if saved is None:
        return [
            Check(
                "saved_on_preempt",
                False,
                f"a checkpoint completed within {grace}",
                None,
                f"no checkpoint was completed within the {grace} grace period after SIGTERM "
                "(save on SIGTERM, and keep the save shorter than the grace period)",
                R.NOT_SAVED_ON_PREEMPT,
            )
        ]
    after = format_seconds(kill.details["savedAfterSeconds"])
    return [
        Check(
            "saved_on_preempt",
            True,
            f"a checkpoint completed within {grace}",
            saved,
            f"checkpoint {saved} was completed {after} after SIGTERM"
            + ("; the resume used it" if used else "; the resume did not use it"),
        )
    ]


def breakdown(spec: DrillSpec, kill: KillRecord) -> dict[str, float | None]:
    seen = kill.group_seen
    judged = kill.judged
    scheduled = [
        seen[k]
        for k in (GroupEventKind.RESTARTING, GroupEventKind.REPLACEMENT_PENDING)
        if k in seen
    ]
    detected = seen.get(GroupEventKind.WORKER_GONE)
    if spec.fault in ("HangWorker", "PartitionNode"):
        detected = kill.detected
    times: dict[str, float | None] = dict.fromkeys(BREAKDOWN_PHASES)
    times["failureDetected"] = detected
    times["replacementScheduled"] = min(scheduled) if scheduled else None
    times["replacementRunning"] = seen.get(GroupEventKind.REPLACEMENT_RUNNING)
    if judged is not None:
        times["processStarted"] = judged.start_time
        times["firstReport"] = judged.first_line
        times["checkpointLoaded"] = judged.loaded_at
        if judged.first is not None and kill.resume is not None:
            times["firstStepAfterResume"] = judged.first[1]
    _bound_by_what_follows(times, kill.time)
    relative = {k: (round(v - kill.time, 6) if v is not None else None) for k, v in times.items()}
    order = sorted(
        BREAKDOWN_PHASES,
        key=lambda k: (relative[k] is None, relative[k] or 0.0, BREAKDOWN_PHASES.index(k)),
    )
    return {k: relative[k] for k in order}


def _bound_by_what_follows(times: dict[str, float | None], killed_at: float) -> None:
    """Each phase means the same on every backend: a restart is scheduled before its
    process starts, and a failure detected before its restart is scheduled. A backend that
    sees one only by scanning for what follows it (local: torchrun's new process) saw it
    late; what followed bounds when it happened."""
    for phase, bound in (
        ("replacementScheduled", "processStarted"),
        ("failureDetected", "replacementScheduled"),
    ):
        at, limit = times[phase], times[bound]
        if at is not None and limit is not None and killed_at <= limit < at:
            times[phase] = limit


def budget_checks(
    spec: DrillSpec,
    recoveries: Sequence[Recovery],
    gave_up: tuple[int, float, str] | None,
    known_budget: int | None,
) -> list[Check]:
    """``count: untilBudgetExhausted``: the job survives its budget, then gives up loudly."""
    survived = sum(1 for r in recoveries if r.verdict is Verdict.PASS)
    budget = spec.restart_budget
    known = known_budget
    read = (
        f"; its launcher allows {known} restart(s)"
        if known is not None
        else ("; the job's own restart budget could not be read")
    )
    checks: list[Check] = []
    if gave_up is not None:
        index, _, detail = gave_up
        how = f" ({detail})" if detail else ""
        checks.append(
            Check(
                "gave_up_loudly",
                True,
                "the job ends non-zero once its budget is used",
                index,
                f"the job survived {survived} kill(s) and gave up loudly on kill {index}{how}",
            )
        )
        if budget is not None:
            ok = survived == budget
            checks.append(
                Check(
                    "restart_budget",
                    ok,
                    budget,
                    survived,
                    (
                        f"it survived exactly restartBudget = {budget} kills{read}"
                        if ok
                        else f"it survived {survived} kill(s), but restartBudget is {budget}{read}"
                    ),
                    None if ok else R.RESTART_BUDGET_MISMATCH,
                )
            )
        return checks
    last = recoveries[-1] if recoveries else None
    if (
        last is not None
        and last.verdict is Verdict.PASS
        and budget is not None
        and (survived > budget)
    ):
        checks.append(
            Check(
                "restart_budget",
                False,
                budget,
                survived,
                f"the job survived {survived} kills, more than restartBudget = {budget}{read}",
                R.RESTART_BUDGET_MISMATCH,
            )
        )
    elif last is not None and last.verdict is Verdict.PASS:
        checks.append(
            Check(
                "gave_up_loudly",
                None,
                "the job gives up within the drill",
                survived,
                f"inconclusive: the job survived {survived} kills without giving up; set "
                "expectations.restartBudget (or a smaller restart budget in the job)",
                R.INCONCLUSIVE,
            )
        )
    return checks


def overall(
    spec: DrillSpec,
    recoveries: Sequence[Recovery],
    gave_up: tuple[int, float, str] | None,
    known_budget: int | None,
) -> tuple[Verdict, str, tuple[Check, ...], Recovery | None]:
    """The drill's verdict over its kills: (verdict, summary, checks, headline kill).

    The headline is the first kill that did not pass, else the last. ``count: N`` adds a
    ``recoveries`` check; ``untilBudgetExhausted`` judges the budget instead.
    """
    budget_mode = spec.count is None
    headline = next(
        (r for r in recoveries if r.verdict is not Verdict.PASS),
        recoveries[-1] if recoveries else None,
    )
    checks: list[Check] = list(headline.checks) if headline is not None else []
    if budget_mode:
        if headline is not None and headline.verdict is Verdict.PASS:
            checks = []
        checks += budget_checks(spec, recoveries, gave_up, known_budget)
    elif len(recoveries) > 1 or (spec.count or 1) > 1:
        passed = sum(1 for r in recoveries if r.verdict is Verdict.PASS)
        first = headline.failed_checks[0] if headline and headline.failed_checks else None
        checks.append(
            Check(
                "recoveries",
                passed == len(recoveries),
                f"{spec.count} verified",
                passed,
                f"{passed} of {len(recoveries)} recoveries passed",
                None if passed == len(recoveries) or first is None else first.reason,
            )
        )
    failed = [c for c in checks if c.passed is False]
    undecided = [c for c in checks if c.passed is None]
    verdict = Verdict.FAIL if failed else Verdict.ERROR if undecided else Verdict.PASS
    many = len(recoveries) > 1 or spec.count != 1
    if verdict is Verdict.PASS and many:
        if gave_up is not None:
            summary = "; ".join(c.message for c in checks)
        else:
            times = [
                r.recovery_time_seconds for r in recoveries if r.recovery_time_seconds is not None
            ]
            spread = (
                f"; recovery {format_seconds(min(times))}–{format_seconds(max(times))}"
                if times
                else ""
            )
            summary = f"all {len(recoveries)} recoveries passed{spread}"
    elif headline is not None and headline.verdict is not Verdict.PASS:
        prefix = f"kill {headline.index} of {len(recoveries)}: " if many else ""
        extra = [
            c.message
            for c in failed + undecided
            if c not in headline.checks and c.name != "recoveries"
        ]
        summary = prefix + "; ".join([headline.summary, *extra])
    elif failed or undecided:
        summary = "; ".join(c.message for c in failed + undecided)
    else:
        summary = headline.summary if headline is not None else "no recovery was judged"
    return verdict, summary, tuple(checks), headline
