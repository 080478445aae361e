"""What a transcript's lines are: its version, its bounds, the calls it may hold with
their arguments' types, and how an engine's answer is written (docs/reports.md,
"transcript.jsonl").

One JSON object per line. The first is the header (``"transcript": "recoverygate"``,
``version``, the versions of recoverygate and Python, the drill's spec, when it started,
who recorded it); then one line per call into the engine, in the order made (``"call"``:
its name; its arguments by their parameter names; ``then``: what the engine answered,
where it answered anything; ``raised``: the exception the call raised, if it did); a
runner's transcript ends with its ``end`` line (what the runner added to the engine's
result: the target, the malformed lines, a cleanup failure).
"""

from __future__ import annotations

from typing import Any

from pytest_recoverygate.engine import model
from pytest_recoverygate.engine.machine import (
    DrillEngine,
    DrillResult,
    Finish,
    KillTarget,
    RestoreTarget,
)
from pytest_recoverygate.engine.verdict import Verdict
from pytest_recoverygate.report.files import TRANSCRIPT
from pytest_recoverygate.transcript.codec import encode

__all__ = [
    "CALLS",
    "FILE_NAME",
    "MAGIC",
    "MAX_BYTES",
    "MAX_LINES",
    "MAX_LINE_BYTES",
    "VERSION",
    "answer",
    "call_engine",
]

#: The report folder's file (report.files writes it).
FILE_NAME = TRANSCRIPT
#: The header's ``transcript`` value: what says the file is one.
MAGIC = "recoverygate"
#: The format's version; a reader refuses another.
VERSION = 1
#: At most this many lines in all (a longer drill's transcript is cut and says so).
MAX_LINES = 1_000_000
#: At most this many bytes in one line (a start line with its digest parts, a note
#: with a traceback are a few KiB).
MAX_LINE_BYTES = 1 << 20
#: At most this many bytes in all.
MAX_BYTES = 64 << 20

#: Each call into the engine and its arguments' types, in the engine's parameter order:
#: the door's table (the runner's calls; the replay makes the same).
CALLS: dict[str, dict[str, Any]] = {
    "discovered": {
        "now": float,
        "detail": str,
        "restart_budget": int | None,
        "ranks": tuple[int, ...],
        "not_before": float | None,
        "world_size": int | None,
    },
    "on_training_event": {"event": model.TrainingEvent},
    "on_group_event": {"event": model.GroupEvent},
    "on_kill_result": {"result": model.KillResult},
    "on_restore_result": {"result": model.KillResult},
    "on_storage_event": {"event": model.StorageEvent},
    "storage_mounted": {"now": float},
    "sticky_damaged": {"step": int, "files": tuple[str, ...], "at": float},
    "tick": {"now": float},
    "abort": {"now": float, "verdict": Verdict, "message": str},
    "note": {"at": float, "kind": str, "detail": str, "data": dict[str, Any]},
}


def answer(value: list[Any] | DrillResult | None) -> list[dict[str, Any]]:
    """What the engine answered a call, as a transcript writes it: each action (a kill
    with its parameters, a restore, a finish with its verdict and summary); an ``abort``'s
    result as a finish."""
    if value is None:
        return []
    if isinstance(value, DrillResult):
        return [_finish(value)]
    out: list[dict[str, Any]] = []
    for action in value:
        if isinstance(action, KillTarget):
            out.append({"action": "kill", **encode(action)})
        elif isinstance(action, RestoreTarget):
            out.append({"action": "restore", **encode(action)})
        elif isinstance(action, Finish):
            out.append(_finish(action.result))
    return out


def _finish(result: DrillResult) -> dict[str, Any]:
    return {"action": "finish", "verdict": result.verdict.value, "summary": result.summary}


def call_engine(engine: DrillEngine, name: str, args: dict[str, Any]) -> Any:
    """Make the call ``name`` with ``args`` (by the names of :data:`CALLS`) on ``engine``:
    the one way the door and the replay call it."""
    if name == "discovered":
        return engine.discovered(
            args["now"],
            args["detail"],
            restart_budget=args["restart_budget"],
            ranks=args["ranks"],
            not_before=args["not_before"],
            world_size=args["world_size"],
        )
    if name == "note":
        return engine.note(args["at"], args["kind"], args["detail"], **args["data"])
    if name == "abort":
        return engine.abort(args["now"], args["verdict"], args["message"])
    if name == "sticky_damaged":
        return engine.sticky_damaged(args["step"], args["files"], args["at"])
    if name not in CALLS:
        raise ValueError(f"{name!r} is no call into the engine")
    (value,) = args.values()
    return getattr(engine, name)(value)
