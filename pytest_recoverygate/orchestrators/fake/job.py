"""The simulated job's shape: what both fake orchestrators simulate alike
(:class:`SimulatedJob`) and one incarnation of the solo job's group (:class:`Incarnation`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_recoverygate.engine.model import GroupEvent, TrainingEvent

if TYPE_CHECKING:
    from pytest_recoverygate.registry.seams import Clock

__all__ = ["Incarnation", "SimulatedJob"]


@dataclass(eq=False, kw_only=True)
class SimulatedJob:
    """What both fake orchestrators simulate alike, with ``workload.fake``'s defaults:
    ``workers`` ranks on ``clock`` training at ``steps_per_second``, a checkpoint every
    ``checkpoint_every`` steps, a restart ``restart_delay`` after a kill and the first
    step ``startup_delay`` after a start; the group events it foresees, which
    ``watch_group`` hands out once they are due."""

    name = "fake"

    clock: Clock
    workers: int = 2
    steps_per_second: float = 50.0
    checkpoint_every: int = 20
    restart_delay: float = 1.0
    startup_delay: float = 0.0

    def __post_init__(self) -> None:
        self._group_events: list[GroupEvent] = []  # foreseen, handed out once they are due

    def watch_group(self) -> list[GroupEvent]:
        now = self.clock.now()
        due = [e for e in self._group_events if e.timestamp <= now]
        self._group_events = [e for e in self._group_events if e.timestamp > now]
        return due


@dataclass
class Incarnation:
    """One start of the group: when it started, what it resumed from, what it sent so far."""

    number: int
    start: float
    resume_step: int
    first_step_at: float
    killed_at: float | None = None
    emitted: list[TrainingEvent] = field(default_factory=list)
    next_step: int = 0
    start_emitted: bool = False
    load_emitted: bool = False
    crashes_at: float | None = None  # it dies loading a torn checkpoint
    progress_sent: int = -1  # the last step whose progress line was generated
    started_sent: int = -1  # the last step whose checkpoint_started line was generated
    final_save: tuple[int, float] | None = None  # (step, completed at): a save on SIGTERM
    ranks: int = 0  # how many ranks it runs

    @property
    def inc_id(self) -> str:
        return f"fake-incarnation-{self.number}"
