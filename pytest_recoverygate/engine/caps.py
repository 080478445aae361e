"""Bounds on the state a job's lines can make the engine hold (a job is hostile input).

At most :data:`MAX_INCARNATIONS` distinct incarnations (every rank's, and those ignored
as older than the run), and :data:`MAX_CHECKPOINTS` checkpoint lines of each kind (the
reporting rank's saves started, completed and loads, each a timeline entry; one other
rank's checkpoints, and at most :data:`MAX_SAVES_OF_A_STEP` saves of one step of one
other rank). Lines past a cap are counted (``Ledger.capped_lines``), never used,
and the report says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sized

from pytest_recoverygate.engine.model import TrainingEvent, TrainingEventKind

__all__ = [
    "CHECKPOINT_KINDS",
    "MAX_CHECKPOINTS",
    "MAX_INCARNATIONS",
    "MAX_REPLAY_POINTS",
    "MAX_SAVES_OF_A_STEP",
    "MAX_STEP_LINES",
    "no_room",
]

MAX_INCARNATIONS = 1024
MAX_CHECKPOINTS = 50_000
#: expectations.replay: the most steps with a loss kept per incarnation (oldest dropped),
#: and the most lines kept per step (a step with that many is not compared).
MAX_REPLAY_POINTS = 4096
MAX_STEP_LINES = 64
#: an other rank's saves of one step kept (each restart may save the step again)
MAX_SAVES_OF_A_STEP = 64
CHECKPOINT_KINDS = frozenset(
    {
        TrainingEventKind.CHECKPOINT_STARTED,
        TrainingEventKind.CHECKPOINT_COMPLETED,
        TrainingEventKind.CHECKPOINT_LOADED,
        TrainingEventKind.CHECKPOINT_FAILED,
        TrainingEventKind.CHECKPOINT_LOAD_STARTED,
        TrainingEventKind.POISONED,
    }
)


def no_room(
    event: TrainingEvent,
    pool: Mapping[str, object],
    saves: Mapping[int, Sized],
    counts: Counter[TrainingEventKind],
    *,
    other: bool,
) -> bool:
    """Whether ``event`` finds no room: a new incarnation past :data:`MAX_INCARNATIONS` in
    ``pool`` (the reporting rank's, or ``other``: the other ranks'), a checkpoint line past
    :data:`MAX_CHECKPOINTS` of its kind (each one is a timeline entry: repeats of one step
    count too; ``counts`` is raised for each one accepted); an other rank's completed
    checkpoint of a new step past the cap of its ``saves`` (step -> its saves), or a save
    of a step it saved :data:`MAX_SAVES_OF_A_STEP` times already."""
    kind = event.kind
    if event.incarnation not in pool and len(pool) >= MAX_INCARNATIONS:
        return True
    if other:
        if kind is not TrainingEventKind.CHECKPOINT_COMPLETED or event.step is None:
            return False
        repeats = saves.get(event.step)
        if repeats is None:
            return len(saves) >= MAX_CHECKPOINTS
        return len(repeats) >= MAX_SAVES_OF_A_STEP
    if kind not in CHECKPOINT_KINDS:
        return False
    if counts[kind] >= MAX_CHECKPOINTS:
        return True
    counts[kind] += 1
    return False
