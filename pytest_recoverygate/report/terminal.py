"""What a drill's result looks like on a terminal: one place for the CLI and pytest.

:func:`print_result` is the verdict block (``recoverygate run`` prints it, and a failing
pytest drill shows it as its failure); :func:`figure_lines` are its figures and recovery
breakdown (also the pytest terminal summary's lines); :func:`shorten` cuts a long message
at a word boundary, visibly. Nothing here decides anything: the values are the result's.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from pytest_recoverygate.shared.jobtext import printable

if TYPE_CHECKING:
    from pytest_recoverygate.engine.machine import DrillResult
    from pytest_recoverygate.report.evidence import Evidence

__all__ = [
    "TAIL_LINE_LIMIT",
    "TERMINAL_MESSAGE_LIMIT",
    "figure_lines",
    "print_result",
    "replay_lines",
    "shorten",
]

TERMINAL_MESSAGE_LIMIT = 600  # characters of one message in the verdict block
TAIL_LINE_LIMIT = 400  # characters of one line of the job's output in the verdict block


def shorten(text: str, limit: int = TERMINAL_MESSAGE_LIMIT) -> str:
    """``text`` cut at a word boundary before ``limit``, with a visible marker saying so.

    The verdict block may shorten a long message (a worker's whole exception, say); it
    never does so silently or in the middle of a word: the report keeps it whole.
    """
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    if cut < limit // 2:
        cut = limit  # one long token: cut it, the marker says so
    more = len(text) - cut
    return f"{text[:cut].rstrip()} … [shortened here: {more} more characters in the report]"


def figure_lines(result: DrillResult) -> list[str]:
    """The figures (by their report names) and the recovery breakdown, one line each."""
    from pytest_recoverygate.report.files import (  # not at import: --help stays light
        RECOVERY_PHASES,
        cost_line,
        figures,
        recovery_phases,
    )

    lines = []
    shown = {k: v for k, v in figures(result).items() if k != "verdict" and v is not None}
    if shown:
        lines.append("  ".join(f"{k}={v}" for k, v in shown.items()))
    if result.breakdown:
        lines.append(
            "recovery breakdown (s after kill): "
            + ", ".join(
                f"{k}={'unknown' if v is None else f'{v:.3f}'}" for k, v in result.breakdown.items()
            )
        )
        took = recovery_phases(result.breakdown)
        lines.append(
            "recovery phases (s): "
            + ", ".join(
                f"{label} {'unknown' if took[name] is None else f'{took[name]:.3f}'}"
                for name, label, _ in RECOVERY_PHASES
            )
        )
    costs = cost_line(result)
    if costs:
        lines.append(costs)
    return lines


def replay_lines(result: DrillResult, limit: int = 12) -> list[str]:
    """expectations.replay: the compared steps of the headline recovery, the killed run's
    loss beside the replacement's (at most ``limit`` rows, from the first divergent)."""
    headline = result.headline
    replay = headline.replay if headline is not None else None
    if not replay or not replay.get("steps"):
        return []
    rows = replay["steps"]
    first = replay.get("firstDivergentStep")
    start = next((i for i, row in enumerate(rows) if row["step"] == first), 0)
    start = max(0, min(start - 2, len(rows) - limit))
    lines = [f"replayed steps ({replay['mode']}): step, killed run, replacement"]
    differs = "   <- differs" + (
        " (outside the tolerance)" if replay["mode"] == "tolerance" else ""
    )
    for row in rows[start : start + limit]:
        matches = row.get("matches")  # reports before it: the values as printed
        if matches is None:
            matches = repr(row["killed"]) == repr(row["replacement"])
        same = "" if matches else differs
        old_data, new_data = row.get("killedData"), row.get("replacementData")
        if old_data is not None and new_data is not None and old_data != new_data:
            same = "   <- data differs"  # compared only where both runs gave one
        lines.append(f"  {row['step']:>8}  {row['killed']!r:>24}  {row['replacement']!r:>24}{same}")
    if len(rows) > limit:
        lines.append(f"  ({len(rows) - limit} more compared steps in the report)")
    return lines


def print_result(
    result: DrillResult,
    stream: TextIO,
    evidence: Evidence | None = None,
    *,
    report_dir: Path | None = None,
) -> None:
    """The verdict block: a sentence, the figures, every check; then the diagnoses of
    known failure signatures and, on FAIL or ERROR, the failing worker's last lines.

    The job's text in it (its output, process names, paths) is shown with its control
    characters made visible (:func:`~pytest_recoverygate.shared.jobtext.printable`)."""
    block = io.StringIO()
    _write_result(result, block, evidence, report_dir)
    stream.write(printable(block.getvalue()))
    stream.flush()


def _write_result(
    result: DrillResult, stream: TextIO, evidence: Evidence | None, report_dir: Path | None
) -> None:
    stream.write(f"\nRecoveryGate verdict: {result.verdict.value}\n  {shorten(result.summary)}\n")
    if result.target is not None:
        stream.write(f"  target: {result.target.describe()}\n")
    for line in figure_lines(result):
        stream.write(f"  {line}\n")
    for note in result.notes:
        stream.write(f"  note: {note}\n")
    for entry in result.timeline:
        if entry.kind == "refused":  # a job file the drill would not read (a link, a FIFO)
            stream.write(f"  refused: {shorten(entry.detail)}\n")
    for check in result.checks:
        mark = {"passed": "ok  ", "failed": "FAIL", "undecided": "????", "unchecked": "--  "}[
            check.status
        ]
        stream.write(f"  [{mark}] {check.name}: {shorten(check.message)}\n")
    for line in replay_lines(result):
        stream.write(f"  {line}\n")
    if evidence is not None:
        _print_evidence(result, evidence, stream, report_dir)


def _print_evidence(
    result: DrillResult, evidence: Evidence, stream: TextIO, report_dir: Path | None
) -> None:
    import textwrap

    for diagnosis in evidence.diagnoses:
        stream.write(f"\n  diagnosis: {diagnosis.title}\n")
        stream.write(
            textwrap.fill(
                diagnosis.text,
                width=100,
                initial_indent="    ",
                subsequent_indent="    ",
                break_long_words=False,
                break_on_hyphens=False,
            )
            + "\n"
        )
        stream.write(f"    evidence: {shorten(diagnosis.evidence, TAIL_LINE_LIMIT)}\n")
        stream.write(f"    more: {diagnosis.docs}\n")
    tail = evidence.failing_tail()
    if tail is None or result.verdict.value not in ("FAIL", "ERROR"):
        return
    label, lines = tail
    from pytest_recoverygate.report.files import OUTPUT_FOLDER
    from pytest_recoverygate.shared.joboutput import file_name

    where = (
        f"whole output: {report_dir / OUTPUT_FOLDER / file_name(label)}"
        if report_dir is not None
        else "--report-dir keeps the whole output"
    )
    stream.write(f"\n  last {len(lines)} lines of {label} ({where}):\n")
    for line in lines:
        stream.write(f"    | {shorten(line, TAIL_LINE_LIMIT)}\n")
