"""StickyFault ``scope: node``: the bad node and the work the job placed on it (pure: the
facts the rule ``bad_node_avoided`` reads).

From the moment the node goes bad until the drill ends, the backend reports each
placement of the job's work on it (``BAD_NODE_PLACEMENT``: a worker group its agent
started there; number 1 is the group running there when it went bad), each hit
(``BAD_NODE_HIT``: the drill killed or stopped that work ``after`` seconds after it
started) and the node leaving the job (``NODE_GONE``: its agent ended).
:class:`BadNodeRecord` keeps them, at most :data:`MAX_PLACEMENTS` (more are counted), and
says what they cost: placements, deaths, time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_recoverygate.engine.model import GroupEvent

__all__ = ["MAX_PLACEMENTS", "BadNodeRecord", "Placement"]

#: Placements kept per drill (a job that rejoins forever is judged long before).
MAX_PLACEMENTS = 1000


@dataclass(slots=True)
class Placement:
    """One placement of the job's work on the bad node: when the drill saw it, its first
    worker (rank, instance), what the backend said, and when it was hit."""

    number: int
    seen: float
    rank: int | None = None
    instance: str = ""
    detail: str = ""
    hit: float | None = None
    hit_detail: str = ""

    def as_dict(self, since: float) -> dict[str, Any]:
        return {
            "placement": self.number,
            "rank": self.rank,
            "instance": self.instance,
            "seenSeconds": round(self.seen - since, 6),
            "hitSeconds": None if self.hit is None else round(self.hit - since, 6),
            "detail": self.detail,
            "hitDetail": self.hit_detail,
        }


@dataclass(slots=True)
class BadNodeRecord:
    """What the job did with the bad node since ``armed_at`` (see the module docstring)."""

    mode: str  # kill | hang
    after: float
    armed_at: float
    node: str = ""  # the node's name, from the backend's events
    placements: dict[int, Placement] = field(default_factory=dict)
    left: tuple[float, str] | None = None  # (when, detail): its agent ended
    dropped: int = 0  # placements past MAX_PLACEMENTS, counted only

    def _placement(self, event: GroupEvent) -> Placement | None:
        number = event.placement
        if number is None:
            return None
        known = self.placements.get(number)
        if known is not None:
            return known
        if len(self.placements) >= MAX_PLACEMENTS:
            self.dropped += 1
            return None
        worker = event.worker
        if worker is not None and not self.node:
            self.node = worker.node
        placement = Placement(
            number,
            event.timestamp,
            worker.rank if worker is not None else None,
            worker.instance_id if worker is not None else "",
            event.detail,
        )
        self.placements[number] = placement
        return placement

    def placed(self, event: GroupEvent) -> None:
        """``BAD_NODE_PLACEMENT``: work started on the bad node."""
        self._placement(event)

    def hit(self, event: GroupEvent) -> None:
        """``BAD_NODE_HIT``: the drill killed or stopped a placement's work."""
        placement = self._placement(event)
        if placement is not None and placement.hit is None:
            placement.hit, placement.hit_detail = event.timestamp, event.detail

    def gone(self, event: GroupEvent) -> None:
        """``NODE_GONE``: the node's agent ended, so the job places nothing more there."""
        if self.left is None:
            self.left = (event.timestamp, event.detail)

    @property
    def deaths(self) -> int:
        """Placements the bad node killed (``mode: kill``) or hung (``mode: hang``)."""
        return sum(1 for p in self.placements.values() if p.hit is not None) + self.dropped

    @property
    def verb(self) -> str:
        return "hung" if self.mode == "hang" else "died"

    def floor(self) -> float:
        """Training counts as going on without the bad node only after this: the last
        hit, and the node's leaving."""
        times = [self.armed_at, *(p.hit for p in self.placements.values() if p.hit)]
        if self.left is not None:
            times.append(self.left[0])
        return max(times)

    def details(self, now: float, restarts: int) -> dict[str, Any]:
        """The report's ``faultDetails.badNode``: the node and every placement on it."""
        until = self.left[0] if self.left is not None else now
        return {
            "node": self.node,
            "mode": self.mode,
            "afterSeconds": self.after,
            "placements": len(self.placements) + self.dropped,
            "deaths": self.deaths,
            "restarts": restarts,
            "leftSeconds": None if self.left is None else round(self.left[0] - self.armed_at, 6),
            "left": None if self.left is None else self.left[1],
            "burnedSeconds": round(until - self.armed_at, 6),
            "each": [
                p.as_dict(self.armed_at)
                for p in sorted(self.placements.values(), key=lambda p: p.number)
            ],
        }
