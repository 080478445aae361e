"""A drill's trend over many runs: ``recoverygate history DIR... -o OUT``.

It reads the report folders a nightly job keeps (each a ``--report-dir`` folder holding
``report.json``, or a folder of them, e.g. ``runs/2026-11-30/`` holding one folder per
drill) and writes ``OUT/history.png`` and ``.svg`` (recovery time stacked by phase, the
SLO line, failures marked; lost steps with their bound) and ``OUT/history.md`` (one row
per run, for a CI job to post). Runs come in the order given, or by their start time.
The picture needs the ``plot`` extra (matplotlib); the table never does.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_recoverygate.errors import BaselineError
from pytest_recoverygate.report.compare import (
    KNOWN_PHASES,
    extract_figures,
    load_report,
    phase_durations,
)
from pytest_recoverygate.report.files import write_private
from pytest_recoverygate.report.pictures import plotting_available, save_pictures

__all__ = [
    "HISTORY_PLOT_HINT",
    "Run",
    "build_history_figure",
    "collect_runs",
    "history_markdown",
    "write_history",
]

HISTORY_PLOT_HINT = (
    "install the plot extra (pip install 'recoverygate[plot]') to get history.png/.svg"
)

_PHASE_COLORS = {
    "failureDetected": "#cf222e",
    "replacementScheduled": "#bf8700",
    "replacementRunning": "#0969da",
    "processStarted": "#54aeff",
    "firstReport": "#8250df",
    "checkpointLoaded": "#1a7f37",
    "firstStepAfterResume": "#6e7781",
}


@dataclass(frozen=True)
class Run:
    """One run of the drill: where its report is, and the report."""

    path: Path
    doc: dict[str, Any]

    @property
    def drill(self) -> str:
        return str(self.doc.get("drill"))

    @property
    def started(self) -> float | None:
        value = self.doc.get("startedAt")
        return float(value) if isinstance(value, int | float) else None

    @property
    def label(self) -> str:
        """The run's name on the x axis: its start time (UTC), else its folder."""
        if self.started is not None:
            stamp = datetime.datetime.fromtimestamp(self.started, tz=datetime.timezone.utc)
            return stamp.strftime("%m-%d %H:%M")
        return self.path.name


def collect_runs(
    dirs: Sequence[Path], *, by_start: bool = False, drill: str | None = None
) -> list[Run]:
    """The runs in ``dirs`` (report folders, or folders of them), of one drill.

    Raise :class:`BaselineError` for a folder that holds no report, for no run left, and
    for reports of several drills without ``drill`` to choose one.
    """
    runs: list[Run] = []
    for directory in dirs:
        if (directory / "report.json").is_file() or directory.is_file():
            runs.append(Run(directory, load_report(directory, "DIR")))
            continue
        if not directory.is_dir():
            raise BaselineError(f"DIR {directory}: does not exist; give a report folder")
        inside = sorted(p.parent for p in directory.glob("*/report.json"))
        if not inside:
            raise BaselineError(
                f"DIR {directory}: holds no report.json, neither itself nor in a sub-folder; "
                "give the folders --report-dir/--drill-report-dir wrote"
            )
        runs += [Run(p, load_report(p, "DIR")) for p in inside]
    if drill is not None:
        runs = [r for r in runs if r.drill == drill]
        if not runs:
            raise BaselineError(f"--drill {drill!r}: no report of that drill in the folders given")
    names = sorted({r.drill for r in runs})
    if len(names) > 1:
        raise BaselineError(
            f"the folders hold reports of {len(names)} drills ({', '.join(names)}); "
            "choose one with --drill NAME"
        )
    if by_start:
        runs.sort(key=lambda r: (r.started is None, r.started or 0.0))
    return runs


def _cell(value: float | None, unit: str = "s") -> str:
    if value is None:
        return "—"
    return f"{value:.2f}s" if unit == "s" else f"{value:g}"


def history_markdown(runs: Sequence[Run], picture: str | None) -> str:
    """The table: one row per run, the verdict, the headline figures, where it is."""
    first = runs[0].doc
    lines = [
        f"### RecoveryGate drill `{runs[0].drill}`: {len(runs)} run(s)",
        "",
        f"SLO: recovery within {_cell(first.get('maxRecoveryTimeSeconds'))}.",
        "",
    ]
    if picture:
        lines += [f"![history]({picture})", ""]
    lines += [
        "| # | started (UTC) | verdict | recovery time | lost steps | lost work | step time "
        "| report |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for number, run in enumerate(runs, 1):
        figures = {name: value for name, (value, _) in extract_figures(run.doc).items()}
        lost = _cell(figures.get("lostSteps"), "steps")
        bound = figures.get("lostStepsUpperBound")
        if bound is not None and bound != figures.get("lostSteps"):
            lost += f"–{bound:g}"
        verdict = str(run.doc.get("verdict"))
        lines.append(
            f"| {number} | {run.label} | {'**' + verdict + '**' if verdict != 'PASS' else verdict}"
            f" | {_cell(figures.get('recoveryTime'))} | {lost} | {_cell(figures.get('lostWork'))}"
            f" | {_cell(figures.get('stepTime'))} | `{run.path}` |"
        )
    return "\n".join(lines) + "\n"


def build_history_figure(runs: Sequence[Run]) -> Any:
    """Recovery time stacked by phase (SLO line, failures marked) over lost steps."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(10, 6), dpi=100, sharex=True, gridspec_kw={"height_ratios": [3, 1.4]}
    )
    xs = list(range(len(runs)))
    durations = [phase_durations(r.doc) for r in runs]
    phases = [*KNOWN_PHASES]
    phases += [p for d in durations for p in d if p not in phases]
    bottoms = [0.0] * len(runs)
    for phase in phases:
        heights = [d.get(phase) or 0.0 for d in durations]
        if not any(heights):
            continue
        top.bar(xs, heights, bottom=bottoms, width=0.6, label=phase, color=_PHASE_COLORS.get(phase))
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    recovery = [r.doc.get("recoveryTimeSeconds") for r in runs]
    for x, (value, stacked) in enumerate(zip(recovery, bottoms, strict=True)):
        if isinstance(value, int | float) and value > stacked + 1e-6:  # no breakdown
            top.bar([x], [value - stacked], bottom=[stacked], width=0.6, color="#afb8c1")
    slo = [r.doc.get("maxRecoveryTimeSeconds") for r in runs]
    if any(isinstance(s, int | float) for s in slo):
        top.step(
            [x - 0.5 for x in xs] + [xs[-1] + 0.5],
            [*(s if isinstance(s, int | float) else float("nan") for s in slo), slo[-1] or 0],
            where="post",
            color="#cf222e",
            ls="--",
            lw=1.2,
            label="SLO (maxRecoveryTime)",
        )
    failed = [x for x, r in zip(xs, runs, strict=True) if r.doc.get("verdict") != "PASS"]
    heights = [
        max(float(v) if isinstance(v, int | float) else 0.0, b)
        for v, b in zip(recovery, bottoms, strict=True)
    ]
    for x, (value, height) in enumerate(zip(recovery, heights, strict=True)):
        if isinstance(value, int | float):
            top.annotate(
                f"{value:.2f}s",
                (x, height),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=7,
            )
    if failed:
        top.scatter(
            failed,
            [heights[x] * 1.04 + 0.05 for x in failed],
            marker="X",
            s=70,
            color="#cf222e",
            zorder=4,
            label="FAIL / ERROR",
        )
    top.set_ylabel("recovery time (s)")
    top.set_title(
        f"drill {runs[0].drill!r}: {len(runs)} run(s), {len(failed)} not PASS", fontsize=10
    )
    top.grid(axis="y", alpha=0.25)
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    lost = [r.doc.get("lostSteps") for r in runs]
    bound = [r.doc.get("lostStepsUpperBound") for r in runs]
    values = [float(v) if isinstance(v, int | float) else 0.0 for v in lost]
    extra = [
        max(float(b) - v, 0.0) if isinstance(b, int | float) else 0.0
        for b, v in zip(bound, values, strict=True)
    ]
    bottom.bar(xs, values, width=0.6, color="#8250df", label="lost steps")
    if any(extra):
        bottom.bar(
            xs, extra, bottom=values, width=0.6, color="#8250df", alpha=0.3, label="up to (bound)"
        )
    bottom.set_ylabel("lost steps")
    bottom.grid(axis="y", alpha=0.25)
    bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bottom.set_xticks(xs)
    bottom.set_xticklabels(
        [f"#{n} {r.label}" for n, r in enumerate(runs, 1)],
        rotation=30 if len(runs) > 6 else 0,
        fontsize=7,
        ha="right",
    )
    for label, run in zip(bottom.get_xticklabels(), runs, strict=True):
        if run.doc.get("verdict") != "PASS":
            label.set_color("#cf222e")
    bottom.set_xlabel("run (start time, UTC)")
    fig.tight_layout()
    return fig


def write_history(runs: Sequence[Run], out: Path) -> list[Path]:
    """``history.png``, ``history.svg`` (with matplotlib) and ``history.md`` in ``out``."""
    if out.exists() and not out.is_dir():
        raise BaselineError(f"-o {out}: is a file; give a folder for history.png/.svg/.md")
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if plotting_available():
        written = save_pictures(build_history_figure(runs), out, "history")
    text = history_markdown(runs, "history.png" if written else None)
    if not written:
        text += f"\nNo picture: {HISTORY_PLOT_HINT}.\n"
    write_private(out / "history.md", text)
    return [*written, out / "history.md"]
