"""A drill's transcript: every call the runner made into the engine, written as one JSON
line each to ``transcript.jsonl`` in the report folder, and ``recoverygate rejudge``,
which replays it through a fresh engine with no clock (docs/reports.md).

``lines`` says what the lines are (version, bounds, the calls); ``codec`` turns the
engine's values into JSON and back, checked; ``record`` is the runner's recorded door
into the engine; ``read`` reads a transcript as hostile input; ``outcome`` is what the
runner adds to the engine's result (shared with the replay); ``rejudge`` replays and
compares.
"""

from __future__ import annotations

__all__: list[str] = []
