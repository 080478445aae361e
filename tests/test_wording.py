"""The sentences worded from the ledger's facts (engine/rules/wording.py), pinned word for word.

We test these aspects: every fact the ledger returns instead of a sentence (issue 44,
item 4) reaches the user as the sentence it had before it moved — a checkpoint that
cannot trigger (each :class:`~pytest_recoverygate.engine.facts.IndistinctKind`, a
timeline note), a broken step contract (each ``BreachKind``, on the result's
``step_contract.problem`` and the ``step_contract`` check), and why a resume step is
undecided (each ``UndecidedKind``); every kind of each fact has its wording. The engine
scenarios drive the engine through its door only, so they read the same before and after
the move.
"""

from __future__ import annotations

import pytest

from pytest_recoverygate.engine.facts import (
    Breach,
    BreachKind,
    Indistinct,
    IndistinctKind,
    Undecided,
    UndecidedKind,
)
from pytest_recoverygate.engine.machine import DrillEngine, DrillResult, Finish, KillTarget
from pytest_recoverygate.engine.model import TrainingEvent
from pytest_recoverygate.engine.rules import wording
from tests.engine_events import T0, C, L, P, S, ev
from tests.test_engine import engine_for, old_run

WAITING = "waiting for a later checkpoint"


def notes_of(engine: DrillEngine, events: list[TrainingEvent]) -> list[str]:
    """The engine's timeline notes after ``events`` (nothing killed)."""
    for event in events:
        assert not [a for a in engine.on_training_event(event) if isinstance(a, KillTarget)]
    return [e.detail for e in engine.timeline_entries() if e.kind == "note"]


def deadline_result(events: list[TrainingEvent]) -> DrillResult:
    """The ERROR at the checkpoint deadline of a drill whose trigger never came."""
    engine = engine_for(after_checkpoint=1000, checkpoint_timeout=60.0)
    notes_of(engine, events)
    [finish] = engine.tick(T0 + 61)
    assert isinstance(finish, Finish)
    return finish.result


# ------------------------------------------------------------------ a checkpoint that cannot trigger


def test_checkpoint_zero_is_worded_as_a_fresh_start() -> None:
    engine = engine_for(after_checkpoint=0)
    notes = notes_of(engine, [ev(S, 0.0, "old"), ev(C, 0.01, "old", 0), ev(P, 0.1, "old", 1)])
    assert notes == [
        "checkpoint 0 holds the state of a fresh start: a resume from it cannot be told "
        f"from a restart from scratch; {WAITING}"
    ]


def test_a_checkpoint_before_any_progress_line_is_worded_with_its_step() -> None:
    engine = engine_for(after_checkpoint=1)
    notes = notes_of(engine, [ev(S, 0.0, "old"), ev(C, 0.1, "old", 5)])
    assert notes == [
        "checkpoint 5 came before any progress line, so a resume from it might report the "
        f"same first step as a fresh start; {WAITING}"
    ]


def test_a_checkpoint_below_the_first_step_is_worded_with_both() -> None:
    engine = engine_for(after_checkpoint=1)
    notes = notes_of(engine, [ev(S, 0.0, "old"), ev(P, 1.0, "old", 10), ev(C, 1.1, "old", 5)])
    assert notes == [
        "the first progress line reported step 10, after checkpoint 5: a resume from it "
        f"might report the same first step as a fresh start; {WAITING}"
    ]


def test_a_checkpoint_within_the_first_stride_is_worded_with_the_stride() -> None:
    engine = engine_for(after_checkpoint=1)
    events = [ev(S, 0.0, "old"), *(ev(P, s / 10, "old", s) for s in (1, 10, 20, 30))]
    notes = notes_of(engine, [*events, ev(C, 3.1, "old", 5)])
    assert notes == [
        "progress is reported every 10 steps, so a resume from checkpoint 5 would report "
        "the same first step (10) as a fresh start; waiting for a checkpoint at step 10 or "
        "later"
    ]


# ------------------------------------------------------------------ a broken step contract


@pytest.mark.parametrize(
    ("events", "problem"),
    [
        (
            [ev(S, 0.0, "old"), ev(P, 0.1, "old", 5), ev(P, 0.2, "old", 3)],
            "progress went backwards right after the start (5, then 3): report the number "
            "of steps completed",
        ),
        (
            [ev(S, 0.0, "old"), ev(L, 0.1, "old", 10), ev(P, 0.2, "old", 5)],
            "after loading checkpoint 10 the first step was reported as 5: report "
            "progress(n) after the n-th completed step (a resume from checkpoint 10 reports "
            "11 first)",
        ),
        (
            old_run(25, zero_based=True),
            "the first step after a fresh start was reported as 0: report progress(epoch + "
            "1), not progress(epoch) — `step` is the number of steps completed, so a fresh "
            "start reports 1 first",
        ),
    ],
    ids=["backwards", "below-loaded", "zero-first"],
)
def test_a_broken_contract_is_worded_on_the_result_and_its_check(
    events: list[TrainingEvent], problem: str
) -> None:
    result = deadline_result(events)
    assert result.step_contract is not None
    assert result.step_contract.problem == problem
    assert result.step_contract.as_dict()["problem"] == problem


def test_a_kept_contract_has_no_problem_to_word() -> None:
    result = deadline_result(old_run(25))
    assert result.step_contract is not None and result.step_contract.problem is None


# ------------------------------------------------------------------ every kind worded

UNDECIDED = {
    UndecidedKind.HELD_TICKS: (
        Undecided(UndecidedKind.HELD_TICKS, 20, lines=2, zero_dropped=True),
        "the replacement printed 0 before step 20 and step 20 twice, then a step past it, "
        "so its lines do not all come after a step (a metrics thread ticking the state it "
        "holds): it resumed from checkpoint 20 or did step 20 again, and the lines cannot "
        "tell which: call reporter.checkpoint_loaded(step) after loading a checkpoint",
    ),
    UndecidedKind.NO_GRID: (
        Undecided(UndecidedKind.NO_GRID, 31, upper=30, grid="irregular"),
        "the job's progress lines keep no reporting grid (irregular), so the replacement's "
        "first step (31) does not tell where it resumed (at most step 30): call "
        "reporter.checkpoint_loaded(step) after loading a checkpoint",
    ),
    UndecidedKind.ONE_LINE: (
        Undecided(UndecidedKind.ONE_LINE, 21),
        "the replacement reported one progress line (step 21), so the progress stride is "
        "unknown and its resume step cannot be inferred: call "
        "reporter.checkpoint_loaded(step) after loading a checkpoint, or let it train longer",
    ),
    UndecidedKind.OFF_GRID: (
        Undecided(UndecidedKind.OFF_GRID, 30, stride=10, off_grid=(5, 15, 25, 35)),
        "progress is reported every 10 steps and checkpoints …, 15, 25, 35 are not on that "
        "grid, so the resume step lies between 20 and 29: call "
        "reporter.checkpoint_loaded(step) after loading, or report progress every step",
    ),
    UndecidedKind.LOADED_ONE_LINE: (
        Undecided(UndecidedKind.LOADED_ONE_LINE, 25, loaded=20),
        "the replacement loaded checkpoint 20 and then reported step 25, and the progress "
        "stride is unknown (one progress line): let it train longer, or report progress "
        "every step",
    ),
    UndecidedKind.LOADED_FAR: (
        Undecided(UndecidedKind.LOADED_FAR, 40, stride=10, loaded=20),
        "the replacement reported checkpoint_loaded(20) but its first step was 40, more "
        "than one progress stride (10) later: report checkpoint_loaded(n) with the step the "
        "resumed process holds",
    ),
}


@pytest.mark.parametrize("kind", list(UndecidedKind), ids=lambda k: k.value)
def test_every_undecided_kind_is_worded(kind: UndecidedKind) -> None:
    fact, sentence = UNDECIDED[kind]
    assert wording.undecided(fact) == sentence


def test_every_indistinct_and_breach_kind_is_worded() -> None:
    for kind in IndistinctKind:
        assert wording.indistinct(Indistinct(kind, 5, first=10, stride=10))
    for breach in BreachKind:
        assert wording.breach(Breach(breach, 5, second=3, loaded=10))
