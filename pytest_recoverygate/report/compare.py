"""A drill report as a baseline: figure by figure, how a new run compares with an old one.

``recoverygate compare BASE NEW`` and pytest's ``--drill-baseline`` both call
:func:`compare`. It is generic over the figures a report holds:

- the known figures (:data:`KNOWN_FIGURES`): each a short name (``recoveryTime``), where
  it sits in ``report.json``, its unit and which way is better;
- every recovery phase of ``breakdown`` by its own name, as its own duration
  (``checkpointLoaded``: from the previous phase to the checkpoint loaded), whichever
  phases the backend reports;
- any other number ending in ``Seconds`` at the top of the report or in ``costs``
  (``healTimeSeconds``, say): a figure named by its key, lower is better (limits such as
  ``maxRecoveryTimeSeconds`` and the checkpoint interval, a setting, are not figures).
  A new report field slots in without a change here; a row in :data:`KNOWN_FIGURES`
  gives it a short name, a unit or the other direction.

An allowance (``--max-regression recoveryTime=20%,lostSteps=0,checkpointLoaded=2s``) is
relative (``%`` of the base) or absolute (a duration such as ``2s`` or ``500ms`` for a
time, a count for steps). A figure regressed when it moved the worse way by more than
its allowance; a relative allowance on a base of 0 allows nothing. Without an allowance
a figure is only shown. Nothing here reads a file except :func:`load_report`.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_recoverygate.durations import parse_duration
from pytest_recoverygate.engine.verdict import BREAKDOWN_PHASES
from pytest_recoverygate.errors import BaselineError
from pytest_recoverygate.shared.jobtext import markdown_text, printable

__all__ = [
    "KNOWN_FIGURES",
    "KNOWN_PHASES",
    "Allowance",
    "Comparison",
    "Direction",
    "Figure",
    "Row",
    "Status",
    "compare",
    "extract_figures",
    "format_table",
    "load_report",
    "parse_allowances",
    "phase_durations",
    "table_rows",
]


class Direction(enum.Enum):
    """Which way a figure gets better."""

    LOWER_IS_BETTER = "lower"
    HIGHER_IS_BETTER = "higher"


class Status(enum.Enum):
    """A row's verdict: ``REGRESSED`` only beyond an allowance.

    ``SHOWN`` (no allowance), ``OK`` (within it), ``IMPROVED`` (moved the better way),
    ``MISSING`` (in one report only: nothing to compare), ``REGRESSED``.
    """

    SHOWN = ""
    OK = "ok"
    IMPROVED = "improved"
    MISSING = "missing"
    REGRESSED = "REGRESSED"


@dataclass(frozen=True)
class Figure:
    """A known figure: its name, where ``report.json`` holds it, its unit, its direction."""

    name: str
    path: tuple[str, ...]
    unit: str  # "s" (seconds) or "steps"
    direction: Direction = Direction.LOWER_IS_BETTER
    description: str = ""

    def read(self, doc: Mapping[str, Any]) -> float | None:
        value: Any = doc
        for key in self.path:
            if not isinstance(value, Mapping):
                return None
            value = value.get(key)
        return _number(value)


#: The figures a report carries today, in the order the table shows them; the recovery
#: phases come right after ``recoveryTime``.
KNOWN_FIGURES: tuple[Figure, ...] = (
    Figure("recoveryTime", ("recoveryTimeSeconds",), "s", description="kill to first step"),
    Figure("lostSteps", ("lostSteps",), "steps", description="steps trained again"),
    Figure("lostStepsUpperBound", ("lostStepsUpperBound",), "steps"),
    Figure("lostWork", ("costs", "lostWorkSeconds", "median"), "s", description="median"),
    Figure("saveStall", ("costs", "saveStallMedianSeconds"), "s", description="median"),
    Figure("saveTime", ("costs", "saveTimeMedianSeconds"), "s", description="median"),
    Figure("stepTime", ("costs", "stepTimeMedianSeconds"), "s", description="median"),
    Figure("stepTimeP95", ("costs", "stepTimeP95Seconds"), "s"),
    Figure("recoveryTimeMax", ("costs", "recoveryTimeSeconds", "max"), "s", description="count: N"),
    Figure("lostStepsMax", ("costs", "lostSteps", "max"), "steps", description="count: N"),
)

#: The recovery phases the backends report (``breakdown``), in their order after a kill.
KNOWN_PHASES = BREAKDOWN_PHASES

_KNOWN_PATHS = {f.path for f in KNOWN_FIGURES}
# limits and settings, not measurements
_NOT_FIGURES = re.compile(r"^(max|min|expected)[A-Z]|^checkpointInterval")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value) if math.isfinite(value) else None
    except OverflowError:  # an integer beyond a float: no figure
        return None


def phase_durations(doc: Mapping[str, Any]) -> dict[str, float | None]:
    """Each recovery phase's own duration: its time after the kill minus the previous
    phase's (``breakdown`` is in the order of time), so a slower checkpoint load shows on
    ``checkpointLoaded`` alone. A phase without a time is None; the next one counts from
    the last phase that had one."""
    breakdown = doc.get("breakdown")
    if not isinstance(breakdown, Mapping):
        return {}
    out: dict[str, float | None] = {}
    previous = 0.0
    for phase, value in breakdown.items():
        at = _number(value)
        if at is None:
            out[str(phase)] = None
            continue
        out[str(phase)] = max(at - previous, 0.0)
        previous = at
    return out


def extract_figures(doc: Mapping[str, Any]) -> dict[str, tuple[float | None, Figure]]:
    """Every figure of one report: name -> (value or None, its description)."""
    out: dict[str, tuple[float | None, Figure]] = {}
    for figure in KNOWN_FIGURES:
        out[figure.name] = (figure.read(doc), figure)
        if figure.name == "recoveryTime":
            for phase, seconds in phase_durations(doc).items():
                out[phase] = (
                    seconds,
                    Figure(phase, ("breakdown", phase), "s", description="phase"),
                )
    costs = doc.get("costs")
    for where, block in (((), doc), (("costs",), costs if isinstance(costs, Mapping) else {})):
        for key, value in block.items():
            path = (*where, key)
            if (
                isinstance(key, str)
                and key.endswith("Seconds")
                and path not in _KNOWN_PATHS
                and not _NOT_FIGURES.match(key)
                and _number(value) is not None
                and key not in out
            ):
                out[key] = (_number(value), Figure(key, path, "s"))
    return out


@dataclass(frozen=True)
class Allowance:
    """How far a figure may move the worse way: ``relative`` percent, or ``absolute``."""

    figure: str
    text: str
    relative: float | None = None
    absolute: float | None = None

    def allowed(self, base: float) -> float:
        """The largest allowed worsening from ``base`` (in the figure's unit)."""
        if self.relative is not None:
            return abs(base) * self.relative / 100.0
        assert self.absolute is not None
        return self.absolute


_ALIASES = {f.path[0]: f.name for f in KNOWN_FIGURES if len(f.path) == 1}


def parse_allowances(text: str, where: str) -> dict[str, Allowance]:
    """``recoveryTime=20%,lostSteps=0,checkpointLoaded=2s`` -> figure -> allowance.

    Figure names are checked against the reports by :func:`compare` (a phase or a new
    figure is known only from a report); the syntax is checked here. ``where`` names the
    option in error messages.
    """
    out: dict[str, Allowance] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not name or not value:
            raise BaselineError(
                f"{where}: {part!r} is not FIGURE=ALLOWANCE; write e.g. recoveryTime=20%, "
                "lostSteps=0 or checkpointLoaded=2s"
            )
        name = _ALIASES.get(name, name)
        out[name] = _allowance(name, value, where)
    return out


def _allowance(name: str, value: str, where: str) -> Allowance:
    hint = (
        f"{where}: {name}={value!r} is not an allowance; write a percentage of the base "
        "(20%), a duration (2s, 500ms) or a number in the figure's unit (0, 3)"
    )
    try:
        if value.endswith("%"):
            number = float(value[:-1])
            if not math.isfinite(number) or number < 0:
                raise BaselineError(hint)
            return Allowance(name, value, relative=number)
        if re.fullmatch(r"\d+(\.\d+)?", value):
            return Allowance(name, value, absolute=float(value))
        return Allowance(name, value, absolute=parse_duration(value))
    except ValueError:
        raise BaselineError(hint) from None


@dataclass(frozen=True)
class Row:
    """One figure of the table."""

    figure: str
    unit: str
    base: float | None
    new: float | None
    allowance: Allowance | None
    status: Status
    direction: Direction = Direction.LOWER_IS_BETTER

    @property
    def change(self) -> float | None:
        if self.base is None or self.new is None:
            return None
        return self.new - self.base


@dataclass(frozen=True)
class Comparison:
    """Two reports compared: the rows, the warnings (different drills) and the verdicts."""

    base_name: str
    new_name: str
    rows: tuple[Row, ...]
    warnings: tuple[str, ...]
    base_verdict: str | None
    new_verdict: str | None

    @property
    def regressed(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.status is Status.REGRESSED)

    @property
    def verdict_regressed(self) -> bool:
        """The base PASSed and the new run did not (FAIL, or ERROR: not proven): a
        regression whatever the figures, with or without an allowance."""
        return self.base_verdict == "PASS" and self.new_verdict in ("FAIL", "ERROR")


def compare(
    base: Mapping[str, Any],
    new: Mapping[str, Any],
    allowances: Mapping[str, Allowance] | None = None,
    *,
    base_name: str = "BASE",
    new_name: str = "NEW",
    where: str = "--max-regression",
) -> Comparison:
    """Compare two report documents; raise :class:`BaselineError` for an unknown figure."""
    allowances = dict(allowances or {})
    old_figures, new_figures = extract_figures(base), extract_figures(new)
    names = list(old_figures) + [n for n in new_figures if n not in old_figures]
    unknown = sorted(set(allowances) - set(names) - set(KNOWN_PHASES))
    if unknown:
        known = ", ".join([*names, *(p for p in KNOWN_PHASES if p not in names)])
        raise BaselineError(
            f"{where}: unknown figure {unknown[0]!r}; the figures of these reports are: {known}"
        )
    rows: list[Row] = []
    for name in names:
        old_value, figure = old_figures.get(name) or new_figures[name]
        new_value = (new_figures.get(name) or (None, figure))[0]
        if name not in old_figures:
            old_value = None
        if old_value is None and new_value is None and name not in allowances:
            continue  # measured by neither: not worth a row
        rows.append(
            Row(
                name,
                figure.unit,
                old_value,
                new_value,
                allowances.get(name),
                _status(old_value, new_value, allowances.get(name), figure.direction),
                figure.direction,
            )
        )
    warnings: list[str] = []
    for key, what in (("drill", "drills"), ("orchestrator", "backends")):
        if base.get(key) != new.get(key):
            warnings.append(
                f"{base_name} and {new_name} are different {what}: "
                f"{base.get(key)!r} and {new.get(key)!r}"
            )
    return Comparison(
        base_name,
        new_name,
        tuple(rows),
        tuple(warnings),
        _text(base.get("verdict")),
        _text(new.get("verdict")),
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _status(
    base: float | None, new: float | None, allowance: Allowance | None, direction: Direction
) -> Status:
    if base is None or new is None:
        return Status.MISSING if (base is None) != (new is None) else Status.SHOWN
    worse = new - base if direction is Direction.LOWER_IS_BETTER else base - new
    if allowance is None:
        return Status.SHOWN
    if worse > allowance.allowed(base) + 1e-9:
        return Status.REGRESSED
    return Status.IMPROVED if worse < 0 else Status.OK


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        return f"{value:.3f}s"
    return f"{value:g}"


def _change(row: Row) -> str:
    delta = row.change
    if delta is None or row.base is None:
        return "—"
    text = f"{delta:+.3f}s" if row.unit == "s" else f"{delta:+g}"
    if abs(row.base) >= (0.001 if row.unit == "s" else 1):  # no % of a rounding error
        text += f" ({delta / abs(row.base):+.1%})"
    return text


def table_rows(comparison: Comparison) -> list[list[str]]:
    """The table as cells: a header, then one row per figure."""
    rows = [["figure", comparison.base_name, comparison.new_name, "change", "allowed", ""]]
    for row in comparison.rows:
        allowed = row.allowance.text if row.allowance is not None else ""
        rows.append(
            [
                row.figure,
                _value(row.base, row.unit),
                _value(row.new, row.unit),
                _change(row),
                allowed,
                row.status.value,
            ]
        )
    return rows


def format_table(comparison: Comparison, *, markdown: bool = False) -> str:
    """The comparison as an aligned text table (or a markdown one), verdicts first.

    Every text that came from a report (its verdicts, the names of its figures) is shown
    as text: control characters made visible on a terminal; in markdown (a CI comment)
    also no link, image, HTML or table cell of its own (:func:`.jobtext.markdown_text`).
    """
    safe = markdown_text if markdown else printable
    cells = [[safe(c) for c in row] for row in table_rows(comparison)]
    verdicts = (
        f"verdict: {safe(comparison.base_name)} {safe(comparison.base_verdict or '—')}, "
        f"{safe(comparison.new_name)} {safe(comparison.new_verdict or '—')}"
    )
    if comparison.verdict_regressed:
        verdicts += (
            f" — the verdict regressed ({comparison.base_verdict} to "
            f"{comparison.new_verdict}): exit 1"
        )
    if markdown:
        lines = [f"| {' | '.join(cells[0])} |", "|" + " --- |" * len(cells[0])]
        lines += [f"| {' | '.join(row)} |" for row in cells[1:]]
        return "\n".join([verdicts, "", *lines])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths).rstrip())
    regressed = comparison.regressed
    tail = (
        f"{len(regressed)} figure(s) regressed beyond the allowance: "
        + ", ".join(safe(r.figure) for r in regressed)
        if regressed
        else "no figure regressed beyond its allowance"
        if any(r.allowance is not None for r in comparison.rows)
        else "no allowance given (--max-regression): figures shown only"
    )
    return "\n".join([verdicts, *lines, tail])


def load_report(path: Path, what: str = "report") -> dict[str, Any]:
    """A drill report from ``path``: a report.json, a folder holding one, or a
    ``--drill-report-dir`` folder holding one drill's folder.

    Raise :class:`BaselineError` naming the path: missing, unreadable, not JSON, or JSON
    that is no drill report.
    """
    file = path / "report.json" if path.is_dir() else path
    if path.is_dir() and not file.is_file():  # a --drill-report-dir folder of one drill
        inside = sorted(path.glob("*/report.json"))
        if len(inside) == 1:
            file = inside[0]
        elif inside:
            names = ", ".join(p.parent.name for p in inside)
            raise BaselineError(
                f"{what} {path}: holds the reports of {len(inside)} drills ({names}); "
                "give one drill's folder"
            )
    if not file.is_file():
        fix = (
            "the folder holds no report.json; give a --report-dir folder or a report.json"
            if path.is_dir()
            else "the file does not exist; give a report.json or the folder holding it"
        )
        raise BaselineError(f"{what} {path}: {fix}")
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{what} {file}: cannot read it: {exc}") from None
    except ValueError as exc:
        raise BaselineError(
            f"{what} {file}: not JSON ({exc}); give a drill's report.json"
        ) from None
    except RecursionError:
        raise BaselineError(
            f"{what} {file}: its JSON is nested too deeply to be a drill report; give the "
            "report.json that recoverygate run --report/--report-dir wrote"
        ) from None
    if not isinstance(doc, dict) or "verdict" not in doc or "reportVersion" not in doc:
        raise BaselineError(
            f"{what} {file}: this JSON is no drill report (no 'reportVersion' and 'verdict' "
            "keys); give the report.json that recoverygate run --report/--report-dir wrote"
        )
    for key, kind in _SHAPES.items():
        value = doc.get(key)
        if value is not None and not isinstance(value, kind):
            raise BaselineError(
                f"{what} {file}: {key!r} is {type(value).__name__}, not {kind.__name__}: this "
                "is no report recoverygate wrote; give the report.json of recoverygate run"
            )
    return doc


#: The types of the top-level fields the commands read (a report recoverygate wrote).
_SHAPES: dict[str, type] = {
    "verdict": str,
    "summary": str,
    "drill": str,
    "orchestrator": str,
    "checks": list,
    "recoveries": list,
    "breakdown": dict,
    "costs": dict,
}
