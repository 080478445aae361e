"""The engine tests' one event builder: the training and group events a test feeds
:class:`~pytest_recoverygate.engine.machine.DrillEngine`, timed in seconds after ``T0``.

``ev(P, 2.5, "a", 25)`` is incarnation ``a``'s progress line for step 25, 2.5 s into the
drill, from rank 0; ``group_ev(G.RESTARTING, 5.2, restart_count=1)`` is the orchestrator's
word at the same clock. ``line_at`` is the torchft tests' line: stamped at an absolute
``now`` and received then. The one-letter kinds are the names every engine test reads.
Feeding the engine and answering its actions stay in each test module.
"""

from __future__ import annotations

from typing import Any

from pytest_recoverygate.engine.model import (
    GroupEvent,
    GroupEventKind,
    TrainingEvent,
    TrainingEventKind,
)

__all__ = [
    "LS",
    "ST",
    "T0",
    "C",
    "F",
    "G",
    "L",
    "P",
    "S",
    "X",
    "ev",
    "group_ev",
    "line_at",
]

T0 = 1_800_000_000.0  # the drill's start: every ``t`` below is seconds after it
P = TrainingEventKind.PROGRESS
C = TrainingEventKind.CHECKPOINT_COMPLETED
ST = TrainingEventKind.CHECKPOINT_STARTED
F = TrainingEventKind.CHECKPOINT_FAILED
LS = TrainingEventKind.CHECKPOINT_LOAD_STARTED
L = TrainingEventKind.CHECKPOINT_LOADED
S = TrainingEventKind.START
X = TrainingEventKind.POISONED
G = GroupEventKind


def ev(
    kind: TrainingEventKind,
    t: float,
    inc: str,
    step: int | None = None,
    rank: int | None = 0,
    **fields: Any,
) -> TrainingEvent:
    """Incarnation ``inc``'s ``kind`` line, ``t`` seconds after ``T0``, from ``rank``
    (``None``: a line without a rank); ``fields`` sets any other
    :class:`TrainingEvent` field (``digest``, ``restart_count``, ``world_size``, ...)."""
    return TrainingEvent(kind, T0 + t, inc, step=step, rank=rank, **fields)


def group_ev(kind: GroupEventKind, t: float, detail: str = "", **fields: Any) -> GroupEvent:
    """The orchestrator's ``kind``, ``t`` seconds after ``T0``; ``fields`` sets any other
    :class:`GroupEvent` field (``worker``, ``restart_count``, ``placement``, ...)."""
    return GroupEvent(kind, T0 + t, detail, **fields)


def line_at(
    kind: TrainingEventKind,
    now: float,
    inc: str,
    step: int | None = None,
    *,
    replica: int | None = None,
    source: str | None = None,
    peer: int | None = None,
) -> TrainingEvent:
    """A torchft replica's rank-0 line stamped and received at the absolute ``now``."""
    return TrainingEvent(
        kind,
        now,
        inc,
        step,
        received=now,
        rank=0,
        replica=replica,
        source=source,
        peer=peer,
    )
