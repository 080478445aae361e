"""Lines of processes without a rank, once processes with a rank report (issue 41).

A launcher or a Ray driver prints its workers' lines; a Ray driver used to report them
as its own, without a rank (RANK is a worker's). Read from the driver's output, each
worker line then came twice, the driver's copy stamped later and going on after the kill
with the replacement's lines. So once a line with a rank came, a line without one stands
for no rank: :class:`RanklessLines` counts it (the report says how many), and the ledger
never takes a rank-less incarnation for the reporting rank's replacement or killed run.
A job whose processes all lack a rank (a plain ``python train.py``) is judged as before.
"""

from __future__ import annotations

from pytest_recoverygate.engine.model import TrainingEvent

__all__ = ["MAX_NAMED", "RanklessLines"]

MAX_NAMED = 64  # rank-less incarnations named in the report's count (the rest counted)


class RanklessLines:
    """Whether ranked lines came; the rank-less lines ignored since."""

    def __init__(self) -> None:
        self.ranked = False
        self.lines = 0
        self.incs: set[str] = set()

    def ignore(self, event: TrainingEvent) -> bool:
        """Whether ``event`` is a rank-less line while ranked processes report (counted)."""
        if event.rank is not None:
            self.ranked = True
            return False
        if not self.ranked:
            return False
        self.lines += 1
        if len(self.incs) < MAX_NAMED:
            self.incs.add(event.incarnation)
        return True

    def stands_in(self, rank: int | None) -> bool:
        """Whether an incarnation of ``rank`` stands in for a rank it is not: a rank-less
        one while ranked ones report (never the reporting rank's replacement or killed
        run)."""
        return rank is None and self.ranked
