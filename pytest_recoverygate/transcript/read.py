"""A transcript read as hostile input: versioned, bounded, each line checked.

:func:`read_transcript` takes a report folder or a ``transcript.jsonl`` and returns its
header, its calls and its end line as typed values, or raises
:class:`~pytest_recoverygate.errors.TranscriptError` naming the file and line
(``FILE:LINE: problem``): a file that is not one (no header), another version, a file,
line or line count over the bounds of :mod:`.lines`, a line that is not UTF-8 or not
JSON or nested too deeply, an unknown call, a missing or unknown argument, a value of
the wrong type (:mod:`.codec` names its field), a runner's transcript cut short (no end
line), a line after the end line. Nothing in it is trusted further than its types: the
replay makes the calls on a fresh engine, which has no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recoverygate import __version__

from pytest_recoverygate.engine.model import Worker
from pytest_recoverygate.engine.spec import DrillSpec
from pytest_recoverygate.errors import TranscriptError
from pytest_recoverygate.shared.safefiles import UnsafeFile, read_safely
from pytest_recoverygate.transcript.codec import MAX_NESTING, ShapeError, decode_value
from pytest_recoverygate.transcript.lines import (
    CALLS,
    FILE_NAME,
    MAGIC,
    MAX_BYTES,
    MAX_LINE_BYTES,
    MAX_LINES,
    VERSION,
)
from pytest_recoverygate.transcript.outcome import EvidenceView

__all__ = ["Call", "End", "Header", "Transcript", "find_transcript", "read_transcript"]


@dataclass(frozen=True, slots=True)
class Header:
    """The first line: the versions, who recorded it, the drill and its spec."""

    version: int
    recoverygate: str
    python: str
    recorded_by: str  # "runner" (a drill) or "engine" (an engine driven directly)
    started_at: float
    spec: DrillSpec
    drill: str | None = None
    config: str | None = None
    orchestrator: str | None = None
    dry_run: bool = False
    evidence: EvidenceView | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """One call into the engine: its line, name, arguments (typed), what the engine
    answered then (as written) and what it raised, if it did."""

    line: int
    name: str
    args: dict[str, Any]
    then: tuple[dict[str, Any], ...] = ()
    raised: str | None = None


@dataclass(frozen=True, slots=True)
class End:
    """A runner's last line: what it added to the engine's result, and whether the
    transcript was cut (``cut``: why; ``unrecorded``: the calls not written)."""

    line: int
    target: Worker | None
    malformed_lines: int
    cleanup_error: str | None
    cut: str | None = None
    unrecorded: int = 0


@dataclass(frozen=True, slots=True)
class Transcript:
    path: Path
    header: Header
    calls: tuple[Call, ...]
    end: End | None


_HEADER_KEYS = {
    "transcript": str,
    "version": int,
    "recoverygate": str,
    "python": str,
    "recorded_by": str,
    "started_at": float,
    "spec": DrillSpec,
    "drill": str | None,
    "config": str | None,
    "orchestrator": str | None,
    "dry_run": bool,
    "evidence": dict[str, Any] | None,
}
_END_KEYS = {
    "call": str,
    "target": Worker | None,
    "malformed_lines": int,
    "cleanup_error": str | None,
    "cut": str,
    "unrecorded": int,
}
_ACTIONS = ("kill", "restore", "finish")


def find_transcript(path: Path) -> Path:
    """The transcript ``path`` names: the file itself, a report folder's, or that of the
    one drill folder inside a ``--drill-report-dir`` folder."""
    if not path.is_dir():
        if not path.exists():
            raise TranscriptError(
                f"{path}: no such file or folder; give a report folder (--report-dir) or "
                f"its {FILE_NAME}"
            )
        return path
    if (path / FILE_NAME).exists():
        return path / FILE_NAME
    inside = sorted(path.glob(f"*/{FILE_NAME}"))
    if len(inside) == 1:
        return inside[0]
    if inside:
        names = ", ".join(p.parent.name for p in inside)
        raise TranscriptError(
            f"{path}: holds the transcripts of {len(inside)} drills ({names}); give one "
            "drill's folder"
        )
    raise TranscriptError(
        f"{path}: the folder holds no {FILE_NAME}; a report folder written with --report-dir "
        f"(pytest: --drill-report-dir) has one (--report alone writes none)"
    )


def read_transcript(path: Path) -> Transcript:
    """The transcript at ``path`` (see :func:`find_transcript`), checked line by line."""
    file = find_transcript(path)
    try:
        data = read_safely(file.parent, file.name, limit=MAX_BYTES + 1)
    except UnsafeFile as exc:
        raise TranscriptError(f"{file}: not read: {exc.strerror}") from None
    except OSError as exc:
        raise TranscriptError(f"{file}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise TranscriptError(
            f"{file}: over {MAX_BYTES:,} bytes; a transcript recoverygate writes is at most that"
        )
    chunks = data.split(b"\n")
    if chunks and chunks[-1] == b"":
        chunks.pop()
    if not chunks:
        raise TranscriptError(f"{file}: empty; a transcript starts with its header line")
    if len(chunks) > MAX_LINES:
        raise TranscriptError(
            f"{file}:{MAX_LINES + 1}: more than {MAX_LINES:,} lines; a transcript "
            "recoverygate writes has at most that many"
        )
    header = _header(file, _json(file, 1, chunks[0]))
    calls: list[Call] = []
    end: End | None = None
    for number, chunk in enumerate(chunks[1:], start=2):
        if end is not None:
            raise TranscriptError(f"{file}:{number}: a line after the end line (line {end.line})")
        line = _json(file, number, chunk)
        name = line.get("call")
        if name == "end":
            end = _end(file, number, line)
        else:
            calls.append(_call(file, number, line))
    if header.recorded_by == "runner" and end is None:
        raise TranscriptError(
            f"{file}:{len(chunks)}: the transcript ends without its end line: it was cut "
            "short (the drill was killed before it wrote its report, or the file was "
            "truncated); it cannot be replayed whole"
        )
    return Transcript(file, header, tuple(calls), end)


def _json(file: Path, number: int, chunk: bytes) -> dict[str, Any]:
    where = f"{file}:{number}"
    if len(chunk) + 1 > MAX_LINE_BYTES:
        raise TranscriptError(
            f"{where}: a line of {len(chunk):,} bytes; a transcript line has at most "
            f"{MAX_LINE_BYTES:,}"
        )
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TranscriptError(f"{where}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise TranscriptError(f"{where}: an empty line; each line is one JSON object")
    try:
        value = json.loads(text)
    except RecursionError:
        raise TranscriptError(f"{where}: JSON nested too deeply for a transcript line") from None
    except ValueError as exc:
        raise TranscriptError(f"{where}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise TranscriptError(f"{where}: {type(value).__name__}, not a JSON object")
    if _depth(value) > MAX_NESTING + 2:
        raise TranscriptError(f"{where}: nested deeper than a transcript line is")
    return value


def _depth(value: Any, level: int = 0) -> int:
    """How deep ``value`` nests (bounded: stops counting past the limit)."""
    if level > MAX_NESTING + 2 or not isinstance(value, (dict, list)):
        return level
    items = value.values() if isinstance(value, dict) else value
    return max((_depth(item, level + 1) for item in items), default=level + 1)


def _typed(
    file: Path, number: int, what: str, kinds: dict[str, Any], line: dict[str, Any]
) -> dict[str, Any]:
    where = f"{file}:{number}"
    unknown = [key for key in line if key not in kinds]
    if unknown:
        raise TranscriptError(f"{where}: {what}: unknown key {unknown[0]!r}")
    out = {}
    for key, value in line.items():
        try:
            out[key] = decode_value(kinds[key], value, key)
        except ShapeError as exc:
            raise TranscriptError(f"{where}: {what}: {exc}") from None
    return out


def _header(file: Path, line: dict[str, Any]) -> Header:
    if line.get("transcript") != MAGIC:
        raise TranscriptError(
            f"{file}:1: not a RecoveryGate transcript (its first line has no "
            f'"transcript": "{MAGIC}"); give the {FILE_NAME} of a report folder'
        )
    version = line.get("version")
    if version != VERSION or not isinstance(version, int) or isinstance(version, bool):
        raise TranscriptError(
            f"{file}:1: transcript version {version!r}; recoverygate {__version__} reads "
            f"version {VERSION}: rejudge it with the recoverygate that wrote it "
            f"({line.get('recoverygate')!r})"
        )
    values = _typed(file, 1, "header", _HEADER_KEYS, line)
    for key in ("recoverygate", "python", "recorded_by", "started_at", "spec"):
        if key not in values:
            raise TranscriptError(f"{file}:1: header: {key!r} is missing")
    if values["recorded_by"] not in ("runner", "engine"):
        raise TranscriptError(
            f"{file}:1: header: recorded_by {values['recorded_by']!r} is neither 'runner' "
            "nor 'engine'"
        )
    evidence = values.get("evidence")
    view = None
    if evidence is not None:
        try:
            view = EvidenceView(
                decode_value(str | None, evidence.get("preset"), "evidence.preset"),
                decode_value(bool, evidence.get("pod_logs"), "evidence.pod_logs"),
                decode_value(dict[str, str | None], evidence.get("sources"), "evidence.sources"),
            )
        except ShapeError as exc:
            raise TranscriptError(f"{file}:1: header: {exc}") from None
    return Header(
        version=version,
        recoverygate=values["recoverygate"],
        python=values["python"],
        recorded_by=values["recorded_by"],
        started_at=values["started_at"],
        spec=values["spec"],
        drill=values.get("drill"),
        config=values.get("config"),
        orchestrator=values.get("orchestrator"),
        dry_run=values.get("dry_run", False),
        evidence=view,
    )


def _call(file: Path, number: int, line: dict[str, Any]) -> Call:
    where = f"{file}:{number}"
    name = line.get("call")
    if not isinstance(name, str) or name not in CALLS:
        known = ", ".join([*CALLS, "end"])
        shown = "no" if name is None else repr(name)[:60]
        raise TranscriptError(f"{where}: {shown} call; a line is one of the calls {known}")
    kinds: dict[str, Any] = {"call": str, **CALLS[name], "then": Any, "raised": str}
    values = _typed(file, number, name, kinds, line)
    missing = [arg for arg in CALLS[name] if arg not in values]
    if missing:
        raise TranscriptError(f"{where}: {name}: the argument {missing[0]!r} is missing")
    then = values.get("then", [])
    if not isinstance(then, list) or not all(
        isinstance(a, dict) and a.get("action") in _ACTIONS for a in then
    ):
        raise TranscriptError(
            f"{where}: {name}: 'then' is not a list of actions ({', '.join(_ACTIONS)})"
        )
    args = {arg: values[arg] for arg in CALLS[name]}
    return Call(number, name, args, tuple(then), values.get("raised"))


def _end(file: Path, number: int, line: dict[str, Any]) -> End:
    values = _typed(file, number, "end", _END_KEYS, line)
    for key in ("target", "malformed_lines", "cleanup_error"):
        if key not in values:
            raise TranscriptError(f"{file}:{number}: end: {key!r} is missing")
    return End(
        line=number,
        target=values["target"],
        malformed_lines=values["malformed_lines"],
        cleanup_error=values["cleanup_error"],
        cut=values.get("cut"),
        unrecorded=values.get("unrecorded", 0),
    )
