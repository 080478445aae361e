"""The sentences a user reads of what the ledger found: each fact of
:mod:`~pytest_recoverygate.engine.facts` worded, with its figures and the fix.

The ledger answers with facts (why a resume step is undecided, why a checkpoint cannot
trigger, how the job breaks the step contract, how a replacement resumed); the rules that
pass them on (``step_contract``, ``resume_step``), the judge's notes and the state
machine's timeline word them here, in one place.
"""

from __future__ import annotations

import dataclasses

from pytest_recoverygate.engine.facts import (
    Breach,
    BreachKind,
    Indistinct,
    IndistinctKind,
    Undecided,
    UndecidedKind,
)
from pytest_recoverygate.engine.records import Inc, Resume
from pytest_recoverygate.engine.verdict import StepContract

__all__ = ["breach", "contract", "indistinct", "resumed", "steps_text", "undecided"]

_LOAD_CALL = "reporter.checkpoint_loaded(step) after loading a checkpoint"


def steps_text(values: list[int], limit: int = 6) -> str:
    """``10, 20, 30`` (the last ``limit``), or ``none``."""
    shown = ", ".join(str(v) for v in values[-limit:])
    return ("…, " if len(values) > limit else "") + shown if values else "none"


def undecided(fact: Undecided) -> str:
    """Why the replacement's resume step cannot be told, and the fix."""
    kind, first = fact.kind, fact.first
    if kind is UndecidedKind.HELD_TICKS:
        times = "twice" if fact.lines == 2 else f"{fact.lines} times"
        shown = [f"step {first} {times}"] if fact.lines > 1 else []
        if fact.zero_dropped:
            shown.insert(0, f"0 before step {first}")
        return (
            f"the replacement printed {' and '.join(shown)}, then a step past it, "
            "so its lines do not all come after a step (a metrics thread ticking "
            f"the state it holds): it resumed from checkpoint {first} or did step "
            f"{first} again, and the lines cannot tell which: call {_LOAD_CALL}"
        )
    if kind is UndecidedKind.NO_GRID:
        keeps = (
            "come from a metrics thread (samples of its step count)"
            if fact.metrics_thread
            else f"keep no reporting grid ({fact.grid})"
        )
        return (
            f"the job's progress lines {keeps}, so the replacement's first step "
            f"({first}) does not tell where it resumed (at most step {fact.upper}): call "
            f"{_LOAD_CALL}"
        )
    if kind is UndecidedKind.ONE_LINE:
        return (
            f"the replacement reported one progress line (step {first}), so the "
            "progress stride is unknown and its resume step cannot be inferred: call "
            f"{_LOAD_CALL}, or let it train longer"
        )
    if kind is UndecidedKind.OFF_GRID:
        stride = fact.stride
        assert stride is not None
        return (
            f"progress is reported every {stride} steps and checkpoints "
            f"{steps_text(list(fact.off_grid), 3)} are not on that grid, so the resume step "
            f"lies between {first - stride} and {first - 1}: call "
            "reporter.checkpoint_loaded(step) after loading, or report progress every step"
        )
    if kind is UndecidedKind.LOADED_ONE_LINE:
        return (
            f"the replacement loaded checkpoint {fact.loaded} and then reported step "
            f"{first}, and the progress stride is unknown (one progress line): let "
            "it train longer, or report progress every step"
        )
    assert kind is UndecidedKind.LOADED_FAR
    return (
        f"the replacement reported checkpoint_loaded({fact.loaded}) but its first step "
        f"was {first}, more than one progress stride ({fact.stride}) later: report "
        "checkpoint_loaded(n) with the step the resumed process holds"
    )


def indistinct(fact: Indistinct) -> str:
    """Why the drill does not trigger on this checkpoint (a timeline note)."""
    kind, step = fact.kind, fact.step
    if kind is IndistinctKind.ZERO:
        return (
            "checkpoint 0 holds the state of a fresh start: a resume from it cannot be "
            "told from a restart from scratch; waiting for a later checkpoint"
        )
    if kind is IndistinctKind.BEFORE_PROGRESS:
        return (
            f"checkpoint {step} came before any progress line, so a resume from it might "
            "report the same first step as a fresh start; waiting for a later checkpoint"
        )
    if kind is IndistinctKind.BEFORE_FIRST_STEP:
        return (
            f"the first progress line reported step {fact.first}, after checkpoint "
            f"{step}: a resume from it might report the same first step as a fresh "
            "start; waiting for a later checkpoint"
        )
    assert kind is IndistinctKind.WITHIN_STRIDE
    stride = fact.stride
    return (
        f"progress is reported every {stride} steps, so a resume from checkpoint "
        f"{step} would report the same first step ({stride}) as a fresh start; "
        f"waiting for a checkpoint at step {stride} or later"
    )


def breach(fact: Breach) -> str:
    """How the job breaks the step contract, and the fix."""
    if fact.kind is BreachKind.BACKWARDS:
        return (
            f"progress went backwards right after the start ({fact.first}, then "
            f"{fact.second}): report the number of steps completed"
        )
    if fact.kind is BreachKind.BELOW_LOADED:
        loaded = fact.loaded
        assert loaded is not None
        return (
            f"after loading checkpoint {loaded} the first step was reported as "
            f"{fact.first}: report progress(n) after the n-th completed step (a resume "
            f"from checkpoint {loaded} reports {loaded + 1} first)"
        )
    assert fact.kind is BreachKind.ZERO_FIRST
    return (
        "the first step after a fresh start was reported as 0: report "
        "progress(epoch + 1), not progress(epoch) — `step` is the number of "
        "steps completed, so a fresh start reports 1 first"
    )


def contract(learned: StepContract) -> StepContract:
    """The step contract as the result shows it: its breach worded (``problem``)."""
    if learned.breach is None:
        return learned
    return dataclasses.replace(learned, problem=breach(learned.breach))


def resumed(inc: Inc, resume: Resume) -> str:
    """How a replacement resumed, for the timeline."""
    if resume.replayed:
        return (
            f"loaded checkpoint {resume.loaded}, then reported step "
            f"{inc.first[0] if inc.first else '?'}"
        )
    if resume.step is None:
        return "resume step undecided"
    how = "checkpoint_loaded" if resume.loaded is not None else "inferred from progress"
    return f"resumed from step {resume.step} ({how})"
