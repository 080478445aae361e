"""``recoverygate rejudge``: a drill's transcript replayed through a fresh engine with no
clock (the transcript's own times), its result rebuilt as the runner built it, and the
report compared with the one the drill wrote.

The replay makes each recorded call on a new engine (:func:`~.lines.call_engine`, as
the runner's door did), keeps the events as the runner kept them, and checks each answer
against the one recorded (``then``): a replay that answers differently is an engine that
is not the one that ran, or one that is not deterministic, and each such line is named.
The result is then what the runner made of it (:mod:`.outcome`: a cleanup failure, the
target, the costs, the notes, the unmatched evidence patterns).

With other expectations (``-f``: :func:`expectations_from`), the spec's judging fields
come from that config and everything else (the fault, the trigger, the job) stays the
transcript's. The replay holds as long as the drill would have acted the same: where the
engine under the new expectations would have killed or restored at another moment than
the drill did, the transcript cannot say what the job would have done, and the verdict
is an ERROR that says so; where it would have waited for more than the drill saw, the
same (the drill stopped at its own verdict).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_recoverygate.engine.machine import DrillEngine, DrillResult, DrillSpec, Finish, Verdict
from pytest_recoverygate.errors import TranscriptError
from pytest_recoverygate.report.files import result_to_dict
from pytest_recoverygate.shared.safefiles import read_safely
from pytest_recoverygate.transcript.lines import answer, call_engine
from pytest_recoverygate.transcript.outcome import (
    EventLog,
    finished,
    unmatched_evidence,
    with_cleanup_error,
)
from pytest_recoverygate.transcript.read import Call, Transcript, read_transcript

__all__ = [
    "EXPECTATIONS",
    "Difference",
    "Rejudged",
    "as_json",
    "differences",
    "expectations_from",
    "rejudge",
    "replay",
    "report_doc",
    "text_lines",
]

#: The spec's fields ``-f`` takes from another config: its ``expectations`` section, what
#: the drill expects of the job; never what the drill did (its fault, trigger, target,
#: recovery mode, timeouts: when it stopped watching is part of what it saw).
EXPECTATIONS = (
    "max_recovery_time",
    "expected_resume_step",
    "max_lost_steps",
    "restart_budget",
    "max_detection_time",
    "saved_on_preempt",
    "state_digest_matches",
    "sustain",
    "max_stall",
    "all_ranks",
    "max_survivor_stall",
    "max_rejoin_time",
    "rejoin_from",
    "replay",
)

#: The report keys a rejudged report is compared on: every key of the result
#: (:func:`~pytest_recoverygate.report.files.result_to_dict`) but the projection, which
#: rejudge does not compute (``recoverygate goodput`` does, from the report).
_NOT_COMPARED = frozenset({"projection"})
#: A recorded report.json is read up to this size.
_MAX_REPORT_BYTES = 256 << 20
#: Differences listed (the rest counted).
MAX_SHOWN = 50


@dataclass(frozen=True, slots=True)
class Difference:
    """One value of the report that differs: its path (``checks[2].observed``), the
    recorded value and the rejudged one (``None`` where one side has no such key)."""

    path: str
    recorded: Any
    rejudged: Any

    def describe(self) -> str:
        return f"{self.path}: recorded {_show(self.recorded)}, rejudged {_show(self.rejudged)}"


@dataclass(frozen=True, slots=True)
class Rejudged:
    """A transcript rejudged: the result and its report document; the recorded report
    (None: no report.json beside the transcript) and the differences from it; the lines
    where the engine answered otherwise than recorded; the spec's fields that ``-f``
    changed (name, recorded, new)."""

    transcript: Transcript
    result: DrillResult
    doc: dict[str, Any]
    recorded: dict[str, Any] | None
    differences: tuple[Difference, ...]
    diverged: tuple[str, ...]
    changed: tuple[tuple[str, Any, Any], ...] = ()
    ignored: tuple[str, ...] = ()  # -f: the config's other settings that differ, unused

    @property
    def exit_code(self) -> int:
        """As ``run``: 0 PASS (or a dry run), 1 FAIL, 3 ERROR; an interrupted drill's
        transcript is 3 too (130 is rejudge itself interrupted)."""
        if self.result.verdict is Verdict.INTERRUPTED:
            return Verdict.ERROR.exit_code
        return self.result.verdict.exit_code


def expectations_from(recorded: DrillSpec, other: DrillSpec) -> tuple[DrillSpec, list[str]]:
    """``recorded`` with :data:`EXPECTATIONS` taken from ``other``; and the other fields
    in which ``other`` differs (not used: the transcript is what the drill did)."""
    changes = {name: getattr(other, name) for name in EXPECTATIONS}
    ignored = [
        f.name
        for f in dataclasses.fields(DrillSpec)
        if f.name not in EXPECTATIONS and getattr(other, f.name) != getattr(recorded, f.name)
    ]
    return dataclasses.replace(recorded, **changes), ignored


def _time_of(call: Call) -> float | None:
    args = call.args
    for key in ("now", "at"):
        if key in args:
            now: float = args[key]
            return now
    timestamp = getattr(next(iter(args.values()), None), "timestamp", None)
    return timestamp if isinstance(timestamp, (int, float)) else None


def _normal(value: Any) -> Any:
    """A value as it reads back from JSON (tuples as lists, NaN kept)."""
    return json.loads(json.dumps(value, default=str))


def replay(
    transcript: Transcript, spec: DrillSpec | None = None
) -> tuple[DrillResult, tuple[str, ...]]:
    """The transcript's calls made on a fresh engine (under ``spec``, else the recorded
    one); the result as the runner reported it, and each line the engine answered
    otherwise than recorded."""
    header, file = transcript.header, transcript.path
    faithful = spec is None
    engine = DrillEngine(spec or header.spec, header.started_at)
    log = EventLog()
    result: DrillResult | None = None
    diverged: list[str] = []
    last = header.started_at
    for call in transcript.calls:
        at = _time_of(call)
        last = last if at is None or not math.isfinite(at) else max(last, at)
        if call.name == "on_training_event":
            log.add(call.args["event"])  # the runner keeps each event before the engine sees it
        try:
            value = call_engine(engine, call.name, call.args)
        except Exception as exc:  # a crafted value, or an engine bug: said, never raised
            raised = f"{type(exc).__name__}: {exc}"
            if call.raised == raised:
                continue  # it raised as recorded: the recorded lines that follow say the rest
            diverged.append(f"{file}:{call.line}: {call.name} raised {raised}")
            if result is None:
                result = _abort(
                    engine, last, f"the engine raised {raised} replaying {file.name}:{call.line}"
                )
            break
        if call.raised is not None:
            diverged.append(
                f"{file}:{call.line}: {call.name} raised {call.raised} when recorded; "
                "the replay did not"
            )
        got = _normal(answer(value))
        if result is None and got != list(call.then):
            diverged.append(
                f"{file}:{call.line}: {call.name}: recorded {_answers(call.then)}, "
                f"replayed {_answers(got)}"
            )
            finish = any(a.get("action") == "finish" for a in got)
            acts = [a for a in got if a.get("action") != "finish"]
            recorded_acts = [a for a in call.then if a.get("action") != "finish"]
            if not faithful and not finish and acts != recorded_acts:
                result = _abort(
                    engine,
                    last,
                    "rejudge cannot decide under these expectations: the drill would have "
                    f"acted otherwise at {file.name}:{call.line} ({_answers(got)}, where it "
                    f"did {_answers(call.then)}), and the transcript cannot say what the job "
                    "would have done then; run the drill under them",
                )
                break
        if result is None:
            if isinstance(value, DrillResult):
                result = value
            elif isinstance(value, list):
                result = next((a.result for a in value if isinstance(a, Finish)), None)
    if result is None:
        result = _abort(
            engine,
            last,
            "inconclusive: the transcript ends before the engine reached a verdict"
            + (
                ""
                if faithful
                else " under these expectations (the drill stopped at its own verdict; run "
                "it under them to see more of the job)"
            ),
        )
    end = transcript.end
    if end is None:  # an engine's own transcript: its result as the engine gave it
        return result, tuple(diverged)
    result = with_cleanup_error(result, end.cleanup_error)
    result = finished(
        result,
        log=log,
        timeline=engine.timeline_entries(),
        target=end.target,
        malformed_lines=end.malformed_lines,
    )
    return unmatched_evidence(result, header.evidence, log.rows), tuple(diverged)


def _abort(engine: DrillEngine, now: float, message: str) -> DrillResult:
    """The replay ended from outside with an ERROR: the engine's result with what it knows,
    or, where its state cannot make one (a value it raised on), the bare verdict."""
    try:
        return engine.abort(now, Verdict.ERROR, message)
    except Exception as exc:
        return DrillResult(
            verdict=Verdict.ERROR,
            summary=f"{message}; no figures: the engine's result raised {type(exc).__name__}",
            timeline=tuple(engine.timeline_entries()),
            started_at=engine.started_at,
            finished_at=now,
        )


def _answers(then: Any) -> str:
    if not then:
        return "nothing"
    parts = []
    for action in then:
        kind = action.get("action")
        if kind == "finish":
            summary = str(action.get("summary"))
            summary = summary if len(summary) <= 80 else summary[:77] + "..."
            parts.append(f"finish {action.get('verdict')} ({summary!r})")
        elif kind == "kill":
            parts.append(f"kill {action.get('index')} ({action.get('fault')})")
        else:
            parts.append(str(kind))
    return ", ".join(parts)


def report_doc(result: DrillResult, transcript: Transcript, spec: DrillSpec) -> dict[str, Any]:
    """The rejudged result as report.json has it (as it reads back from JSON), with the
    drill's name, config and backend from the header and the SLO from ``spec``."""
    header = transcript.header
    doc = result_to_dict(result)
    doc.update(
        drill=header.drill,
        config=header.config,
        orchestrator=header.orchestrator,
        maxRecoveryTimeSeconds=spec.max_recovery_time if header.recorded_by == "runner" else None,
    )
    normal: dict[str, Any] = _normal(doc)
    return normal


def _recorded_report(file: Path) -> dict[str, Any] | None:
    """The report.json beside the transcript, when there is one that is a drill report."""
    if not (file.parent / "report.json").is_file():
        return None
    try:
        data = read_safely(file.parent, "report.json", limit=_MAX_REPORT_BYTES)
        doc = json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise TranscriptError(
            f"{file.parent / 'report.json'}: the recorded report cannot be read ({exc}); "
            f"give the transcript alone (a copy of {file.name} in another folder)"
        ) from None
    if not isinstance(doc, dict) or "verdict" not in doc:
        raise TranscriptError(f"{file.parent / 'report.json'}: is no drill report")
    return doc


def differences(recorded: dict[str, Any], rejudged: dict[str, Any]) -> list[Difference]:
    """Every value of ``rejudged`` (but the projection) that ``recorded`` has otherwise;
    floats compared by their exact value (NaN equal to NaN, -0.0 not 0.0)."""
    out: list[Difference] = []
    for key, value in rejudged.items():
        if key not in _NOT_COMPARED:
            out += _walk(key, recorded.get(key, _MISSING), value)
    return out


class _Missing:
    def __repr__(self) -> str:
        return "(absent)"


_MISSING: Any = _Missing()


def _walk(path: str, old: Any, new: Any) -> Iterator[Difference]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in dict.fromkeys([*old, *new]):
            yield from _walk(f"{path}.{key}", old.get(key, _MISSING), new.get(key, _MISSING))
        return
    if isinstance(old, list) and isinstance(new, list):
        for i in range(min(len(old), len(new))):
            yield from _walk(f"{path}[{i}]", old[i], new[i])
        if len(old) != len(new):  # the rest of the longer list, as one difference
            shorter = min(len(old), len(new))
            yield Difference(f"{path}[{shorter}:]", old[shorter:], new[shorter:])
        return
    if not _same(old, new):
        yield Difference(path, old, new)


def _same(old: Any, new: Any) -> bool:
    if type(old) is not type(new):
        return False
    if isinstance(old, float):
        return repr(old) == repr(new)  # NaN is NaN; -0.0 is not 0.0
    return bool(old == new)


def _show(value: Any) -> str:
    text = json.dumps(value, default=repr) if value is not _MISSING else "(absent)"
    return text if len(text) <= 120 else text[:117] + "..."


def rejudge(path: Path, other: DrillSpec | None = None) -> Rejudged:
    """Read the transcript at ``path`` (a report folder or the file) and rejudge it, under
    the expectations of ``other`` when given; compare with the report beside it."""
    transcript = read_transcript(path)
    end = transcript.end
    if end is not None and end.cut is not None:
        raise TranscriptError(
            f"{transcript.path}:{end.line}: the transcript was cut ({end.cut}); "
            f"{end.unrecorded} call(s) after that were not written, so it cannot be replayed"
        )
    recorded_spec = transcript.header.spec
    spec, ignored = recorded_spec, list[str]()
    changed: list[tuple[str, Any, Any]] = []
    if other is not None:
        spec, ignored = expectations_from(recorded_spec, other)
        changed = [
            (name, getattr(recorded_spec, name), getattr(spec, name))
            for name in EXPECTATIONS
            if getattr(spec, name) != getattr(recorded_spec, name)
        ]
    result, diverged = replay(transcript, spec if changed else None)
    doc = report_doc(result, transcript, spec)
    recorded = _recorded_report(transcript.path)
    found = () if recorded is None else tuple(differences(recorded, doc))
    return Rejudged(
        transcript,
        result,
        doc,
        recorded,
        found,
        diverged,
        tuple(changed),
        tuple(ignored),
    )


def _value(value: Any) -> Any:
    """A spec value as the output shows it (a dataclass as its fields)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _normal(dataclasses.asdict(value))
    return _normal(value)


def as_json(judged: Rejudged, expectations: Path | None = None) -> dict[str, Any]:
    """``rejudge --json``: the rejudged report, the differences from the recorded one
    (``null``: there is none beside the transcript), the lines answered otherwise."""
    header = judged.transcript.header
    return {
        "transcript": str(judged.transcript.path),
        "version": header.version,
        "recordedWith": {"recoverygate": header.recoverygate, "python": header.python},
        "expectations": None if expectations is None else str(expectations),
        "changed": {
            name: {"recorded": _value(old), "rejudged": _value(new)}
            for name, old, new in judged.changed
        },
        "ignored": list(judged.ignored),
        "exitCode": judged.exit_code,
        "report": judged.doc,
        "diverged": list(judged.diverged),
        "differences": None
        if judged.recorded is None
        else [
            {"path": d.path, "recorded": _json_side(d.recorded), "rejudged": _json_side(d.rejudged)}
            for d in judged.differences
        ],
    }


def _json_side(value: Any) -> Any:
    return None if value is _MISSING else value


def text_lines(judged: Rejudged, expectations: Path | None = None) -> tuple[list[str], list[str]]:
    """``rejudge``'s text: the lines before the verdict block and those after it."""
    transcript = judged.transcript
    header = transcript.header
    head = [
        f"transcript: {transcript.path} (version {header.version}; recorded by recoverygate "
        f"{header.recoverygate} on Python {header.python}; {len(transcript.calls):,} calls)"
    ]
    if expectations is None:
        head.append("expectations: the transcript's own")
    else:
        changed = "; ".join(
            f"{name} {json.dumps(_value(old))} -> {json.dumps(_value(new))}"
            for name, old, new in judged.changed
        )
        head.append(f"expectations: from {expectations}: {changed or 'the same as recorded'}")
        if judged.ignored:
            head.append(
                f"  not taken from {expectations.name} (the transcript is what the drill did): "
                + ", ".join(judged.ignored)
            )
    tail = []
    if judged.diverged:
        under = "under these expectations " if expectations is not None else ""
        tail.append(
            f"replay: {under}the engine answered otherwise than recorded at "
            f"{len(judged.diverged)} line(s):"
        )
        tail += [f"  {line}" for line in judged.diverged[:MAX_SHOWN]]
    else:
        tail.append("replay: every answer of the engine as recorded")
    if judged.recorded is None:
        tail.append(f"no report.json beside {transcript.path.name}: nothing to compare with")
    elif not judged.differences:
        tail.append("differences from the recorded report: none")
    else:
        tail.append(f"differences from the recorded report: {len(judged.differences)}")
        tail += [f"  {d.describe()}" for d in judged.differences[:MAX_SHOWN]]
        if len(judged.differences) > MAX_SHOWN:
            tail.append(f"  … and {len(judged.differences) - MAX_SHOWN} more (--json has all)")
    return head, tail
