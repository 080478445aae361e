"""The timeline picture: training step against time around the kill, one line per
incarnation, with checkpoints, the kill, the recovery phases, the resume point, the lost
steps and the SLO window, and the verdict in the title.

matplotlib is an optional extra (``pip install 'recoverygate[plot]'``): it is the
best-kept plotting library with a non-interactive PNG/SVG backend and no browser, and
keeping it optional keeps the core install light. Without it no picture is drawn and
:data:`PICTURE_HINT` says how to get one. The picture is drawn from the JSON report
document, so its data is exactly the report's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_recoverygate.report.pictures import plotting_available, save_pictures

__all__ = [
    "PICTURE_HINT",
    "build_figure",
    "plotting_available",
    "replica_of_incarnation",
    "series_by_incarnation",
    "write_timeline_picture",
]

PICTURE_HINT = "install the plot extra (pip install 'recoverygate[plot]') to get timeline.png"

_PHASE_LABELS = {
    "failureDetected": "failure detected",
    "replacementScheduled": "replacement scheduled",
    "replacementRunning": "replacement running",
    "processStarted": "process started",
    "firstReport": "first report",
    "checkpointLoaded": "checkpoint loaded",
    "firstStepAfterResume": "first step after resume",
    # recovery: live (docs/torchft.md)
    "replica restarted": "replica restarted",
    "healed": "healed from a peer",
    "first committed step": "first committed step",
}
_REPLICA_COLORS = ("#0969da", "#bf3989", "#1a7f37", "#9a6700", "#8250df", "#57606a")

_COLORS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "ERROR": "#9a6700"}


def write_timeline_picture(doc: dict[str, Any], directory: Path) -> list[Path]:
    """Draw ``timeline.png`` and ``timeline.svg`` from a report document; [] without matplotlib."""
    if not plotting_available() or not doc.get("progress"):
        return []
    return save_pictures(build_figure(doc), directory, "timeline")


def build_figure(doc: dict[str, Any]) -> Any:
    """The matplotlib Figure for a report document (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    origin = doc.get("killTime") or doc["progress"][0]["time"]
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=100)
    _draw(ax, doc, origin)
    fig.tight_layout()
    return fig


def series_by_incarnation(doc: dict[str, Any], origin: float) -> dict[str, list[tuple[float, int]]]:
    """(seconds since the kill, step) for each incarnation, in order of appearance."""
    out: dict[str, list[tuple[float, int]]] = {}
    for point in doc["progress"]:
        out.setdefault(point["inc"], []).append((point["time"] - origin, point["step"]))
    return out


def replica_of_incarnation(doc: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """recovery: live: incarnation -> (its replica group, its number within it from 1)."""
    out: dict[str, tuple[int, int]] = {}
    for replica in (doc.get("live") or {}).get("replicas", []):
        for number, inc in enumerate(replica.get("incs", [])):
            out[inc] = (replica["replica"], number + 1)
    return out


def _mark_divergence(ax: Any, doc: dict[str, Any], origin: float) -> None:
    """expectations.replay: a cross on the replacement's line at the first divergent step."""
    step = (doc.get("replay") or {}).get("firstDivergentStep")
    judged = doc.get("judgedIncarnation")
    if step is None:
        return
    at = [p["time"] - origin for p in doc["progress"] if p["inc"] == judged and p["step"] == step]
    if at:
        ax.scatter(
            [at[0]],
            [step],
            marker="X",
            s=70,
            color="#cf222e",
            zorder=5,
            label=f"replay diverged at step {step}",
        )


def _draw(ax: Any, doc: dict[str, Any], origin: float) -> None:
    verdict = doc["verdict"]
    series = series_by_incarnation(doc, origin)
    replicas = replica_of_incarnation(doc)  # live mode: one colour per replica group
    for number, (inc, points) in enumerate(series.items()):
        xs, ys = zip(*points, strict=True)
        # The id is the job's text: "$" would start matplotlib's maths (and fail the picture)
        label = f"incarnation {number + 1} ({inc})".replace("$", r"\$")
        style: dict[str, Any] = {"label": label}
        if inc in replicas:
            replica, nth = replicas[inc]
            style = {
                "label": f"replica {replica}" + (f" (replacement {nth - 1})" if nth > 1 else ""),
                "color": _REPLICA_COLORS[replica % len(_REPLICA_COLORS)],
                "ls": "-" if nth == 1 else "--",
            }
        ax.plot(xs, ys, lw=1.6, marker="." if len(points) < 30 else None, **style)
    checkpoints = [e for e in doc["timeline"] if e["kind"] == "checkpoint" and "step" in e]
    if checkpoints:
        ax.scatter(
            [e["time"] - origin for e in checkpoints],
            [e["step"] for e in checkpoints],
            marker="D",
            s=22,
            color="#0969da",
            zorder=3,
            label="checkpoint saved",
        )
    kill = doc.get("killTime")
    if kill is not None:
        ax.axvline(0.0, color="#cf222e", lw=2, label="kill")
        slo = doc.get("maxRecoveryTimeSeconds")
        seen = [t for points in series.values() for t, _ in points]
        seen += [v for v in (doc.get("breakdown") or {}).values() if v is not None]
        right = max([*seen, 0.0])
        left = min([*seen, 0.0])
        span = max(right - left, 1.0)
        if slo and slo <= right + 0.5 * span:
            ax.axvspan(0.0, slo, color="#2da44e", alpha=0.08, label=f"SLO window ({slo:g}s)")
            right = max(right, slo)
        elif slo:  # a generous SLO would squash the picture: show where it goes on
            edge = right + 0.15 * span
            ax.axvspan(
                0.0,
                edge,
                color="#2da44e",
                alpha=0.08,
                label=f"SLO window ({slo:g}s, continues right)",
            )
            right = edge
        ax.set_xlim(left - 0.05 * span, right + 0.05 * span)
        breakdown = doc.get("breakdown") or {}
        shown = [(k, _PHASE_LABELS[k]) for k in breakdown if k in _PHASE_LABELS]  # by time
        for row, (key, label) in enumerate(shown):
            at = breakdown.get(key)
            if at is not None:
                ax.axvline(at, color="#6e7781", lw=0.8, ls="--")
                ax.annotate(
                    f"{label} +{at:.2f}s",
                    (at, 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(3, -12 - 11 * row),
                    textcoords="offset points",
                    fontsize=7,
                    color="#57606a",
                )
    heal = doc.get("rejoinStep")
    healed = (doc.get("breakdown") or {}).get("healed")
    if heal is not None and healed is not None:
        ax.scatter([healed], [heal], color="#8250df", zorder=4, label=f"healed at step {heal}")
    resume, last = doc.get("resumeStep"), doc.get("lastStepBeforeKill")
    if resume is not None:
        ax.axhline(resume, color="#8250df", lw=0.8, ls=":")
        first = (doc.get("breakdown") or {}).get("firstStepAfterResume")
        if first is not None:
            ax.scatter(
                [first], [resume], color="#8250df", zorder=4, label=f"resume at step {resume}"
            )
        if last is not None and last > resume and kill is not None:
            right = first if first is not None else ax.get_xlim()[1]
            ax.fill_between(
                [0.0, right],
                resume,
                last,
                color="#cf222e",
                alpha=0.12,
                label=f"lost steps ({last - resume})",
            )
    _mark_divergence(ax, doc, origin)
    title = f"{verdict}: {doc['summary']}"
    if len(title) > 110:
        title = title[:107] + "..."
    ax.set_title(title, fontsize=10, color=_COLORS.get(verdict, "#24292f"))
    ax.set_xlabel("seconds since the kill" if kill is not None else "seconds")
    ax.set_ylabel("training step")
    ax.grid(alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
