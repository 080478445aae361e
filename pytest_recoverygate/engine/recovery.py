"""Judging kills: the checks of one recovery, and the drill's verdict over all of them.

Pure functions of the :class:`~pytest_recoverygate.engine.ledger.Ledger` (what the job's lines
prove), the :class:`~pytest_recoverygate.engine.spec.DrillSpec` and a :class:`KillRecord` (one
kill and what the backend and the job showed since). The engine decides *when* a kill is
judged; the rules (:data:`pytest_recoverygate.engine.rules.TABLE`) say what the evidence
proves; this module reads the evidence, runs the table and combines its checks: one
:class:`~pytest_recoverygate.engine.verdict.Recovery` per kill, then :func:`overall`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from pytest_recoverygate.engine.ledger import Ledger
from pytest_recoverygate.engine.model import GroupEventKind
from pytest_recoverygate.engine.records import Inc, Resume
from pytest_recoverygate.engine.rules import TABLE, run, wording
from pytest_recoverygate.engine.rules.evidence import (
    ENDED_INSIDE_LINES,
    DrillEvidence,
    KillEvidence,
    KillRecord,
    StorageEvidence,
    Window,
    ended_how,
)
from pytest_recoverygate.engine.rules.lost import lost
from pytest_recoverygate.engine.rules.replay import judge as judge_replay
from pytest_recoverygate.engine.rules.replay import points_of, reference, replay_figures
from pytest_recoverygate.engine.rules.resume import settle
from pytest_recoverygate.engine.spec import DrillSpec
from pytest_recoverygate.engine.storage import storage_details
from pytest_recoverygate.engine.verdict import (
    BREAKDOWN_PHASES,
    Check,
    Recovery,
    Verdict,
    combine,
    format_seconds,
)

__all__ = [
    "ENDED_INSIDE_LINES",
    "KillRecord",
    "Window",
    "breakdown",
    "ended_how",
    "evidence",
    "hung",
    "judge",
    "node_details",
    "overall",
    "replay_diverged",
    "restarts",
]

Note = Callable[..., None]


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


def hung(ledger: Ledger, spec: DrillSpec, kill: KillRecord, now: float) -> Recovery:
    """A kill that no replacement and no end of the job followed (the ``hung`` rules)."""
    ev = evidence(ledger, spec, kill, None, now=now, ranks=(), final=True)
    checks = run(TABLE, "hung", ev)
    return Recovery(
        kill.index,
        spec.fault,
        Verdict.FAIL,
        checks[0].message,
        checks=tuple(checks),
        trigger_checkpoint=kill.step,
        kill_time=kill.time,
        restarts=restarts(ledger, kill),
        breakdown=breakdown(spec, kill),
    )


def evidence(
    ledger: Ledger,
    spec: DrillSpec,
    kill: KillRecord,
    inc: Inc | None,
    *,
    now: float,
    ranks: Sequence[int],
    final: bool,
) -> KillEvidence:
    """The evidence of one kill's judgement (and the kill's record brought up to it:
    the replacement judged and its resume)."""
    resume = kill.resume
    if resume is None and inc is not None and inc.first is not None:
        resume = ledger.resume_of(inc, final=True)
    elif resume is None and inc is not None and inc.loaded is not None:
        resume = Resume(inc.loaded, inc.loaded)  # it holds that state, but never trained
    kill.judged = inc
    kill.resume = resume
    explicit = spec.expected_resume_step is not None and kill.index == 1
    expected, floor = ledger.expected(inc, spec.expected_resume_step if explicit else None)
    past = None
    if inc is not None and resume is not None and inc.first is not None:
        past = inc.first_trained(resume)
    ev = KillEvidence(
        ledger,
        spec,
        kill,
        inc,
        resume,
        ledger.contract(),
        expected,
        floor,
        explicit,
        now,
        final,
        ranks,
        restarts(ledger, kill),
        past,
        resume,
    )
    settled = settle(ev)
    kill.resume = settled
    return dataclasses.replace(ev, settled=settled)


def _figures(ev: KillEvidence, checks: Sequence[Check]) -> None:
    """What the kill's record adds to its ``faultDetails`` from the judgement."""
    spec, kill = ev.spec, ev.kill
    if spec.fault in ("HangWorker", "PartitionNode"):
        detected = None if kill.detected is None else kill.detected - kill.time
        kill.details["detectionSeconds"] = None if detected is None else round(detected, 6)
    node_details(spec, kill, came_back=ev.inc is not None)
    ranks = next((c.observed for c in checks if c.name == "all_ranks_resumed"), None)
    if ranks:
        kill.details["ranks"] = ranks
    if kill.bad_node is not None:  # StickyFault scope node: the node and its placements
        kill.details["badNode"] = kill.bad_node.details(ev.now, ev.restarts)
    if kill.storage is not None:
        if ev.final:
            kill.storage.lifted(ev.now, "the drill ended; its cleanup lifts it")  # if armed
        kill.details["storage"] = storage_details(kill.storage)
    if spec.fault == "Preempt":
        saved = kill.details.get("savedStep")
        resume = ev.settled
        used = resume is not None and saved is not None and resume.step == saved
        kill.details["savedUsed"] = used if saved is not None else None


def _combine(ev: KillEvidence, checks: list[Check]) -> tuple[Verdict, str, list[Check]]:
    """The kill's verdict and summary from its checks."""
    if any(c.passed is False for c in checks):  # an open sustain window adds nothing to it
        checks = [c for c in checks if not (c.name == "progress_after_resume" and c.undecided)]
    verdict, summary = combine(checks)
    if verdict is not Verdict.PASS:
        return verdict, summary, checks
    recovery_time, resume = ev.recovery_time, ev.settled
    assert recovery_time is not None
    assert resume is not None
    window = ev.kill.window
    held = (
        f", then trained {window.last[0] - window.start[0]} more steps over "
        f"{format_seconds(window.last[1] - window.start[1])}"
        if window is not None
        else ""
    )
    if _ended_inside(ev.kill, ev.spec):
        held += " and ended successfully: the run ended inside the sustain window"
    summary = (
        f"resumed from step {resume.step} as expected and recovered in "
        f"{format_seconds(recovery_time)}{held}"
    )
    return Verdict.PASS, summary, checks


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
    """One kill's :class:`Recovery`: the ``kill`` rules of the table over its evidence."""
    ev = evidence(ledger, spec, kill, inc, now=now, ranks=ranks, final=final)
    checks = run(TABLE, "kill", ev)
    if kill.storage is not None:  # StorageFault: the fault this recovery follows
        storage = StorageEvidence(
            spec, kill.storage, now, final, True, spec.stall_limit(ledger.rate())
        )
        checks += run(TABLE, "storage", storage)
    _figures(ev, checks)
    verdict, summary, checks = _combine(ev, checks)
    resume, recovery_time = ev.settled, ev.recovery_time
    steps = lost(ledger, resume, inc) if ev.trained else (None, None)
    proven, bound = ledger.last_before_kill(inc)
    if resume is not None and resume.undecided and resume.step is not None:
        note(now, "note", wording.undecided(resume.undecided))
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
        expected_resume_step=ev.expected,
        loaded_step=(
            resume.loaded if resume is not None else inc.loaded if inc is not None else None
        ),
        last_step_before_kill=proven,
        last_step_before_kill_upper_bound=bound,
        lost_steps=steps[0],
        lost_steps_upper_bound=steps[1],
        recovery_time_seconds=round(recovery_time, 6) if recovery_time is not None else None,
        restarts=ev.restarts,
        judged_incarnation=inc.id if inc is not None else None,
        breakdown=breakdown(spec, kill),
        fault_details=dict(kill.details),
        resume_basis=resume.basis if resume is not None else None,
        resume_upper_bound=resume.upper if resume is not None else None,
        sustained=_sustained(kill, spec),
        replay=replay_figures(ev),
    )


def replay_diverged(ledger: Ledger, spec: DrillSpec, kill: KillRecord, inc: Inc, step: int) -> bool:
    """Whether the judged replacement ``inc``, now at ``step``, already diverged from its
    killed run beyond the allowance (docs/replay.md: decided when proven, not after the
    sustain window). Only its steps before ``step`` are compared: a step may have more
    lines to come until a later step is reported."""
    resume = kill.resume
    if not spec.replay.judges or resume is None or inc.first_trained(resume) is None:
        return False
    old = reference(ledger, kill.index, kill.time, inc)
    done = {s: lines for s, lines in points_of(inc).items() if s < step}
    if old is None or max(done, default=None) not in old.replay_points:
        return False  # the step just completed adds nothing to compare
    check, _ = judge_replay(points_of(old), done, spec.replay, resumed_from=resume.step)
    return check is not None and check.passed is False


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
    # a recovery the drill cut on purpose (KillDuringRecovery's first) is never judged
    recoveries = [r for r in recoveries if r.verdict is not Verdict.INTERRUPTED]
    headline = next(
        (r for r in recoveries if r.verdict is not Verdict.PASS),
        recoveries[-1] if recoveries else None,
    )
    checks: list[Check] = list(headline.checks) if headline is not None else []
    if budget_mode and headline is not None and headline.verdict is Verdict.PASS:
        checks = []
    checks += run(TABLE, "drill", DrillEvidence(spec, recoveries, gave_up, known_budget))
    verdict, _ = combine(checks)
    failed = [c for c in checks if c.passed is False]
    undecided = [c for c in checks if c.passed is None]
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
