"""The runner's one door into the engine, recorded: each call written as a transcript
line (its arguments, then what the engine answered), then made.

:class:`EngineDoor` is what the runner holds instead of the engine for its inputs
(``discovered``, ``on_training_event``, ``on_group_event``, ``on_kill_result``,
``on_restore_result``, ``on_storage_event``, ``storage_mounted``, ``sticky_damaged``,
``tick``, ``abort``, ``note``); the engine's queries (``phase``, ``status``,
``deadline``, …) change nothing and are read from ``door.engine``. The engine itself
knows nothing of this: it stays pure, and ``recoverygate rejudge`` makes the same calls
on a fresh one.

:class:`Recorder` keeps the lines within the format's bounds
(:data:`~.lines.MAX_LINES`, :data:`~.lines.MAX_LINE_BYTES`, :data:`~.lines.MAX_BYTES`):
past one it stops recording, counts the calls it did not write and says so in the
``end`` line. Recording never costs a drill its verdict: a value it cannot write cuts
the transcript the same way.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from typing import Any

from recoverygate import __version__

from pytest_recoverygate.engine import model
from pytest_recoverygate.engine.machine import DrillEngine, DrillResult, DrillSpec, Verdict
from pytest_recoverygate.engine.state import Action
from pytest_recoverygate.transcript.codec import encode
from pytest_recoverygate.transcript.lines import (
    MAGIC,
    MAX_BYTES,
    MAX_LINE_BYTES,
    MAX_LINES,
    VERSION,
    answer,
    call_engine,
)

__all__ = ["EngineDoor", "Recorder", "dumps"]

#: Room kept for the end line under :data:`MAX_BYTES` and :data:`MAX_LINES`.
_END_ROOM = 64 << 10


def dumps(line: Mapping[str, Any]) -> str:
    """One transcript line: compact JSON, ASCII only (every string escaped the same way)."""
    return json.dumps(line, separators=(",", ":"))


class Recorder:
    """A transcript being written: the header, then each call, then the end line.

    ``context``: the header's other keys (the drill's name, config path, backend, dry
    run, its evidence section), as the runner knows them. ``recorded_by``: ``runner``
    (a drill; its transcript ends with an ``end`` line) or ``engine`` (an engine driven
    directly, as the engine tests do).
    """

    def __init__(
        self,
        spec: DrillSpec,
        started_at: float,
        *,
        recorded_by: str = "runner",
        context: Mapping[str, Any] | None = None,
    ) -> None:
        header: dict[str, Any] = {
            "transcript": MAGIC,
            "version": VERSION,
            "recoverygate": __version__,
            "python": platform.python_version(),
            "recorded_by": recorded_by,
            **(context or {}),
            "started_at": started_at,
            "spec": encode(spec),
        }
        self._lines: list[str] = []
        self._bytes = 0
        self.cut: str | None = None  # why recording stopped, if it did
        self.unrecorded = 0  # calls made after it stopped
        self.closed = False
        self._add(dumps(header))

    def _add(self, text: str) -> None:
        self._lines.append(text)
        self._bytes += len(text) + 1  # ASCII: one byte a character, and the newline

    def record(self, line: Mapping[str, Any]) -> None:
        """Write one call's line, within the bounds."""
        if self.closed:
            return
        if self.cut is not None:
            self.unrecorded += 1
            return
        try:
            text = dumps(line)
        except (TypeError, ValueError) as exc:
            self.stop(f"a {line.get('call')} call's values could not be written ({exc})")
            return
        if len(text) + 1 > MAX_LINE_BYTES:
            self.stop(
                f"a {line.get('call')} line of {len(text) + 1:,} bytes is over the "
                f"{MAX_LINE_BYTES:,} a line may have"
            )
        elif len(self._lines) + 2 > MAX_LINES:
            self.stop(f"the drill made more than {MAX_LINES - 2:,} calls")
        elif self._bytes + len(text) + 1 > MAX_BYTES - _END_ROOM:
            self.stop(f"the calls took more than {(MAX_BYTES - _END_ROOM) >> 20} MiB")
        else:
            self._add(text)

    def stop(self, why: str) -> None:
        """Record no more calls (each one after is counted): ``why`` goes in the end line."""
        if self.cut is not None:
            self.unrecorded += 1
            return
        self.cut = why
        self.unrecorded += 1

    def end(
        self, *, target: model.Worker | None, malformed_lines: int, cleanup_error: str | None
    ) -> None:
        """The last line: what the runner added to the engine's result. Calls after it
        (the runner's last status line) are not written: nothing of them reaches the
        report."""
        if self.closed:
            return
        line: dict[str, Any] = {
            "call": "end",
            "target": encode(target),
            "malformed_lines": malformed_lines,
            "cleanup_error": cleanup_error,
        }
        if self.cut is not None:
            line.update(cut=self.cut, unrecorded=self.unrecorded)
        text = dumps(line)
        if len(text) + 1 > _END_ROOM and cleanup_error is not None:  # never over the bound
            line["cleanup_error"] = cleanup_error[: _END_ROOM // 8]
            line.update(cut="the cleanup's error is too long to keep", unrecorded=self.unrecorded)
            text = dumps(line)
        self._add(text)
        self.closed = True

    def text(self) -> str:
        """The transcript as written so far, one line each."""
        return "".join(line + "\n" for line in self._lines)

    def __len__(self) -> int:
        return len(self._lines)


class EngineDoor:
    """The runner's inputs into ``engine``, each recorded by ``recorder`` (when there is
    one) and then made; the engine's answer is returned unchanged."""

    def __init__(self, engine: DrillEngine, recorder: Recorder | None = None) -> None:
        self.engine = engine
        self.recorder = recorder

    def _call(self, name: str, args: dict[str, Any]) -> Any:
        recorder = self.recorder
        if recorder is None or recorder.closed:
            return call_engine(self.engine, name, args)
        try:
            line = {"call": name, **{key: encode(value) for key, value in args.items()}}
        except TypeError as exc:  # never costs the drill: the transcript says it is cut
            recorder.stop(f"a {name} call's values could not be written ({exc})")
            return call_engine(self.engine, name, args)
        try:
            value = call_engine(self.engine, name, args)
        except BaseException as exc:  # a bug, or a signal inside the call: said, re-raised
            line["raised"] = f"{type(exc).__name__}: {exc}"
            recorder.record(line)
            raise
        then = answer(value)
        if then:
            line["then"] = then
        recorder.record(line)
        return value

    def discovered(
        self,
        now: float,
        detail: str,
        *,
        restart_budget: int | None = None,
        ranks: tuple[int, ...] = (),
        not_before: float | None = None,
        world_size: int | None = None,
    ) -> None:
        self._call(
            "discovered",
            {
                "now": now,
                "detail": detail,
                "restart_budget": restart_budget,
                "ranks": ranks,
                "not_before": not_before,
                "world_size": world_size,
            },
        )

    def on_training_event(self, event: model.TrainingEvent) -> list[Action]:
        actions: list[Action] = self._call("on_training_event", {"event": event})
        return actions

    def on_group_event(self, event: model.GroupEvent) -> list[Action]:
        actions: list[Action] = self._call("on_group_event", {"event": event})
        return actions

    def on_kill_result(self, result: model.KillResult) -> list[Action]:
        actions: list[Action] = self._call("on_kill_result", {"result": result})
        return actions

    def on_restore_result(self, result: model.KillResult) -> list[Action]:
        actions: list[Action] = self._call("on_restore_result", {"result": result})
        return actions

    def on_storage_event(self, event: model.StorageEvent) -> list[Action]:
        actions: list[Action] = self._call("on_storage_event", {"event": event})
        return actions

    def storage_mounted(self, now: float) -> None:
        self._call("storage_mounted", {"now": now})

    def sticky_damaged(self, step: int, files: tuple[str, ...], at: float) -> None:
        self._call("sticky_damaged", {"step": step, "files": files, "at": at})

    def tick(self, now: float) -> list[Action]:
        actions: list[Action] = self._call("tick", {"now": now})
        return actions

    def abort(self, now: float, verdict: Verdict, message: str) -> DrillResult:
        result: DrillResult = self._call(
            "abort", {"now": now, "verdict": verdict, "message": message}
        )
        return result

    def note(self, at: float, kind: str, detail: str = "", **data: Any) -> None:
        self._call("note", {"at": at, "kind": kind, "detail": detail, "data": data})
