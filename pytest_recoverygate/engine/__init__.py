"""The pure core: the drill state machine, judging a kill, what the lines prove, verdicts
(standard library only, no I/O, no clock).
"""

from __future__ import annotations

__all__: list[str] = []
