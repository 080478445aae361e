"""Transcripts in the tests: a drill's report folder rejudged and held to its own report,
and engines driven directly (the engine tests) recorded as transcripts.

:func:`assert_rejudged` is what every drill of the suite calls on its report folder
(tests/cli_drill.py does it for each drill it runs): the transcript replayed through a
fresh engine must answer every call as recorded and give the report the drill wrote,
value for value. :func:`capture_engines` records every :class:`DrillEngine` made while it
is active, call by call, as the runner's door does; scripts/rule-fixtures makes the rule
fixtures (tests/fixtures/rules) with it from the rules' own pinning tests.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_recoverygate.engine.machine import DrillEngine, DrillSpec
from pytest_recoverygate.transcript.codec import encode
from pytest_recoverygate.transcript.lines import CALLS, answer
from pytest_recoverygate.transcript.record import Recorder
from pytest_recoverygate.transcript.rejudge import Rejudged, rejudge

__all__ = ["Captured", "assert_rejudged", "capture_engines"]


def assert_rejudged(report_dir: Path) -> Rejudged:
    """Rejudge the drill of ``report_dir`` and assert it reproduces: every answer of the
    engine as recorded, and no difference from the recorded report."""
    judged = rejudge(report_dir)
    shown = [*judged.diverged[:10], *(d.describe() for d in judged.differences[:20])]
    assert judged.recorded is not None, f"{report_dir}: no report.json beside the transcript"
    assert not judged.diverged and not judged.differences, (
        f"recoverygate rejudge {report_dir} does not reproduce the drill "
        f"({len(judged.diverged)} answer(s) otherwise, {len(judged.differences)} "
        "difference(s) from the report):\n  " + "\n  ".join(shown)
    )
    return judged


@dataclass
class Captured:
    """One engine made while :func:`capture_engines` was active, and its transcript."""

    engine: DrillEngine
    recorder: Recorder
    depth: int = 0  # the engine's calls into itself (not inputs: not recorded)


@contextlib.contextmanager
def capture_engines() -> Iterator[list[Captured]]:
    """Record every engine made inside the block: each input call from outside it (the
    calls of :data:`~pytest_recoverygate.transcript.lines.CALLS`), with its arguments and
    the engine's answer, as the runner's door records them (``recorded_by: engine``)."""
    captured: list[Captured] = []
    by_engine: dict[int, Captured] = {}
    init = DrillEngine.__init__
    originals = {name: getattr(DrillEngine, name) for name in CALLS}
    own = {name: DrillEngine.__dict__.get(name) for name in ("__init__", *CALLS)}

    def __init__(self: DrillEngine, spec: DrillSpec, started_at: float) -> None:
        init(self, spec, started_at)
        entry = Captured(self, Recorder(spec, started_at, recorded_by="engine"))
        captured.append(entry)
        by_engine[id(self)] = entry

    def recorded(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def method(self: DrillEngine, *args: Any, **kwargs: Any) -> Any:
            entry = by_engine.get(id(self))
            if entry is None or entry.engine is not self or entry.depth:
                return original(self, *args, **kwargs)
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            values = {key: value for key, value in bound.arguments.items() if key != "self"}
            line: dict[str, Any] = {"call": name, **{k: encode(v) for k, v in values.items()}}
            entry.depth += 1
            try:
                value = original(self, *args, **kwargs)
            except BaseException as exc:
                line["raised"] = f"{type(exc).__name__}: {exc}"
                entry.recorder.record(line)
                raise
            finally:
                entry.depth -= 1
            then = answer(value)
            if then:
                line["then"] = then
            entry.recorder.record(line)
            return value

        return method

    try:
        setattr(DrillEngine, "__init__", __init__)
        for name, original in originals.items():
            setattr(DrillEngine, name, recorded(name, original))
        yield captured
    finally:
        for name, defined in own.items():  # as they were: its own, or inherited
            if defined is None:
                delattr(DrillEngine, name)
            else:
                setattr(DrillEngine, name, defined)
