"""The decision pictures: failure cost against where the kill landed, goodput against the
checkpoint interval. Like the timeline picture (:mod:`pytest_recoverygate.report.timeline`),
each is drawn from plain data (the report document, a projection), with matplotlib as the
optional ``plot`` extra; without it, nothing is drawn and :data:`PLOT_HINT` says how.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_recoverygate.report.pictures import plotting_available, save_pictures

if TYPE_CHECKING:
    from pytest_recoverygate.engine.goodput import Projection

__all__ = [
    "PLOT_HINT",
    "build_goodput_figure",
    "build_spread_figure",
    "spread_points",
    "write_goodput_picture",
    "write_spread_picture",
]

PLOT_HINT = "install the plot extra (pip install 'recoverygate[plot]') to get the pictures"


def spread_points(doc: dict[str, Any]) -> list[tuple[float, float | None, float | None]]:
    """(position in the interval, recovery seconds, lost work seconds) per kill with a position."""
    kills = ((doc.get("costs") or {}).get("perKill")) or []
    return [
        (k["position"], k.get("recoveryTimeSeconds"), k.get("lostWorkSeconds"))
        for k in kills
        if k.get("position") is not None
    ]


def build_spread_figure(doc: dict[str, Any]) -> Any:
    """Recovery time and lost work per kill against its position in the checkpoint interval."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    points = spread_points(doc)
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
    nan = float("nan")  # a kill without the figure leaves a gap
    xs = [p for p, _, _ in points]
    # (which figure of a point, line style, colour, label): recovery time, lost work
    for figure, style, colour, label in (
        (1, "o-", "#0969da", "recovery time (s)"),
        (2, "s--", "#cf222e", "lost work (s)"),
    ):
        ys = [nan if (y := point[figure]) is None else y for point in points]
        ax.plot(xs, ys, style, color=colour, label=label)
    ax.set_xlim(-0.05, 1.05)
    ax.set_xlabel("where the kill landed in the checkpoint interval (0 = right after a save)")
    ax.set_ylabel("seconds")
    ax.set_title(
        f"{doc.get('verdict', '')}: the cost of a failure across the interval "
        f"({len(points)} kills)",
        fontsize=10,
    )
    ax.grid(alpha=0.25)
    ax.legend(fontsize=8, loc="upper left")
    return fig


def write_spread_picture(doc: dict[str, Any], directory: Path) -> list[Path]:
    """``spread.png``/``.svg`` for a drill that killed at two or more positions; else []."""
    if not plotting_available() or len(spread_points(doc)) < 2:
        return []
    return save_pictures(build_spread_figure(doc), directory, "spread")


def build_goodput_figure(projection: Projection) -> Any:
    """Goodput against the checkpoint interval, today's and the optimal interval marked."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from pytest_recoverygate.engine.goodput import useful_fraction

    i = projection.inputs
    mtbf = projection.mtbf_hours * 3600.0
    top = max(projection.current_interval, projection.optimal_interval) * 4
    low = max(min(projection.current_interval, projection.optimal_interval) / 8, 1e-3)
    xs = [low * (top / low) ** (k / 300) for k in range(301)]
    ys = [useful_fraction(x, i.stall, i.recovery, mtbf) for x in xs]
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
    ax.plot([x / 60 for x in xs], ys, color="#1a7f37")
    ax.axvline(
        projection.current_interval / 60,
        color="#57606a",
        ls="--",
        label=f"today: {projection.current_goodput:.1%}",
    )
    ax.axvline(
        projection.optimal_interval / 60,
        color="#8250df",
        ls=":",
        label=f"optimal: {projection.optimal_goodput:.1%}",
    )
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes of training, log scale)")
    ax.set_ylabel("expected goodput")
    ax.set_title(f"{projection.gpus:,} GPUs, MTBF {projection.mtbf_hours:.2f} h", fontsize=10)
    ax.grid(alpha=0.25)
    ax.legend(fontsize=8, loc="lower center")
    return fig


def write_goodput_picture(projection: Projection, directory: Path) -> list[Path]:
    """``goodput.png``/``.svg`` in ``directory``; [] without matplotlib."""
    if not plotting_available():
        return []
    return save_pictures(build_goodput_figure(projection), directory, "goodput")
