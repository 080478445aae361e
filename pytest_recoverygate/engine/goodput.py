"""From a drill's measured failure cost to the goodput of the job at scale (pure).

The model (docs/goodput.md states it with its assumptions): failures arrive as a Poisson
process with mean time between failures ``M`` for the whole job (``1 / (F × GPUs)`` for a
per-GPU-hour rate ``F``). Training runs in periods of ``τ`` seconds of work followed by a
checkpoint that stalls training ``δ`` seconds (the measured save stall). Each failure
costs the restart ``R`` (the measured recovery time: detection, rescheduling, start-up,
load) plus the work since the last checkpoint, on average half a period. To first order
the useful fraction of wall-clock time is::

    U(τ) = τ / (τ + δ) · (1 − (R + (τ + δ) / 2) / M)

which is largest at ``τ* = √(2 δ (M − R)) − δ`` — Young's ``√(2 δ M)`` with Daly's
first-order corrections for the save and the restart. The measured recovery and save cost
are taken as independent of scale.

The default failure rate is the one Meta reported for Llama 3 405B pre-training: 419
unexpected interruptions in 54 days on 16,384 H100 GPUs (The Llama 3 Herd of Models, 2024).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LLAMA3_FAILURES_PER_GPU_HOUR",
    "LLAMA3_SOURCE",
    "Inputs",
    "Projection",
    "ProjectionError",
    "format_projection",
    "inputs_from_report",
    "optimal_interval",
    "project",
    "useful_fraction",
]

#: 419 unexpected interruptions in 54 days on 16,384 GPUs.
LLAMA3_FAILURES_PER_GPU_HOUR = 419 / (54 * 24 * 16_384)
LLAMA3_SOURCE = (
    "Llama 3 405B pre-training: 419 unexpected interruptions in 54 days on 16,384 GPUs "
    "(The Llama 3 Herd of Models, 2024)"
)


class ProjectionError(ValueError):
    """The report lacks a figure the projection needs (the message names it and the fix)."""


def useful_fraction(interval: float, stall: float, restart: float, mtbf: float) -> float:
    """U(τ): the fraction of wall-clock time that is useful training (0 when it never is)."""
    if interval <= 0 or mtbf <= 0:
        return 0.0
    period = interval + stall
    return max(interval / period * (1.0 - (restart + period / 2.0) / mtbf), 0.0)


def optimal_interval(stall: float, restart: float, mtbf: float, floor: float = 0.0) -> float:
    """τ* = √(2 δ (M − R)) − δ, the maximum of :func:`useful_fraction` (seconds of work).

    ``floor`` is the shortest interval the job can run (a save must finish before the
    next begins, and a checkpoint holds at least one step): with a stall too small to
    measure the model's optimum tends to 0, and the floor is the answer.
    """
    span = max(mtbf - restart, 0.0)
    best = math.sqrt(2.0 * stall * span) - stall if stall > 0 else 0.0
    return max(best, floor)


@dataclass(frozen=True, slots=True)
class Inputs:
    """The measured components the projection uses (seconds)."""

    step_time: float
    interval_seconds: float
    interval_steps: float | None
    stall: float
    stall_source: str
    recovery: float
    recovery_source: str
    save_time: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "stepTimeSeconds": round(self.step_time, 6),
            "checkpointIntervalSeconds": round(self.interval_seconds, 6),
            "checkpointIntervalSteps": self.interval_steps,
            "saveStallSeconds": round(self.stall, 6),
            "saveStallSource": self.stall_source,
            "recoveryTimeSeconds": round(self.recovery, 6),
            "recoveryTimeSource": self.recovery_source,
        }


def inputs_from_report(doc: Mapping[str, Any]) -> Inputs:
    """The projection's inputs from a report.json document, or a ProjectionError saying why."""
    costs = doc.get("costs")
    if not isinstance(costs, Mapping):
        raise ProjectionError(
            "the report has no 'costs' section: it was written by an older RecoveryGate or "
            "by a drill that never ran; run the drill again with --report"
        )
    missing = costs.get("missing") or {}
    need: list[str] = []
    step = costs.get("stepTimeMedianSeconds")
    interval = costs.get("checkpointIntervalSeconds")
    stall = costs.get("saveStallMedianSeconds")
    save = costs.get("saveTimeMedianSeconds")
    recovery = (costs.get("recoveryTimeSeconds") or {}).get("median")
    if step is None:
        need.append(f"the step time ({missing.get('stepTime', 'not measured')})")
    if interval is None:
        need.append(
            f"the checkpoint interval ({missing.get('checkpointInterval', 'not measured')})"
        )
    if stall is None and save is None:
        need.append(
            f"the save stall ({missing.get('saveStall', 'not measured')}; "
            f"{missing.get('saveTime', 'no save time either')})"
        )
    if recovery is None:
        need.append(
            "the recovery time (no kill of this drill recovered: a PASS or FAIL "
            "report with a measured recovery is needed)"
        )
    if need or step is None or interval is None or recovery is None:
        raise ProjectionError("this report lacks what the projection needs: " + "; ".join(need))
    if stall is not None:
        stall_value, stall_source = float(stall), "measured gap in progress around saves"
    else:
        stall_value = float(save or 0.0)
        stall_source = "save time (no progress bracketed a save: assumed synchronous)"
    return Inputs(
        step_time=float(step),
        interval_seconds=float(interval),
        interval_steps=costs.get("checkpointIntervalSteps"),
        stall=stall_value,
        stall_source=stall_source,
        recovery=float(recovery),
        recovery_source=(
            f"median of {(costs.get('recoveryTimeSeconds') or {}).get('count', 1)} kill(s)"
        ),
        save_time=None if save is None else float(save),
    )


@dataclass(frozen=True)
class Projection:
    """Expected goodput at a scale, for the measured job, and the best interval."""

    gpus: int
    mtbf_hours: float
    rate_source: str
    inputs: Inputs
    current_interval: float
    current_goodput: float
    optimal_interval: float
    optimal_goodput: float
    young_interval: float
    table: tuple[tuple[float, float, str], ...]  # (interval s, goodput, label)
    evaluated: tuple[float, float] | None = None  # --interval: (interval s, goodput)

    def as_dict(self) -> dict[str, Any]:
        steps = self.inputs.interval_steps
        per_step = (self.inputs.interval_seconds / steps) if steps else None
        return {
            "gpus": self.gpus,
            "mtbfHours": round(self.mtbf_hours, 6),
            "failureRateSource": self.rate_source,
            "inputs": self.inputs.as_dict(),
            "currentIntervalSeconds": round(self.current_interval, 6),
            "currentGoodput": round(self.current_goodput, 6),
            "optimalIntervalSeconds": round(self.optimal_interval, 6),
            "optimalIntervalSteps": (
                None if per_step is None else round(self.optimal_interval / per_step)
            ),
            "optimalGoodput": round(self.optimal_goodput, 6),
            "youngIntervalSeconds": round(self.young_interval, 6),
            "table": [
                {"intervalSeconds": round(i, 6), "goodput": round(g, 6), "label": label}
                for i, g, label in self.table
            ],
            "evaluated": None
            if self.evaluated is None
            else {
                "intervalSeconds": round(self.evaluated[0], 6),
                "goodput": round(self.evaluated[1], 6),
            },
        }


def project(
    inputs: Inputs,
    gpus: int,
    *,
    mtbf_hours: float | None = None,
    failures_per_gpu_hour: float | None = None,
    interval: float | None = None,
) -> Projection:
    """The goodput of the measured job on ``gpus`` GPUs (see the module docstring).

    ``mtbf_hours`` is the whole job's mean time between failures at that scale;
    ``failures_per_gpu_hour`` a per-GPU rate (scaled by ``gpus``); neither: Llama 3's rate.
    ``interval`` (seconds of work between checkpoints) is evaluated besides today's.
    """
    if gpus <= 0:
        raise ProjectionError(f"--gpus must be at least 1, got {gpus}")
    if mtbf_hours is not None and failures_per_gpu_hour is not None:
        raise ProjectionError("give --mtbf-hours or --failures-per-gpu-hour, not both")
    if mtbf_hours is not None:
        if mtbf_hours <= 0:
            raise ProjectionError(f"--mtbf-hours must be above 0, got {mtbf_hours}")
        mtbf, source = mtbf_hours, f"the given MTBF of {mtbf_hours:g} h for the whole job"
    else:
        rate = failures_per_gpu_hour
        if rate is None:
            rate, source = LLAMA3_FAILURES_PER_GPU_HOUR, LLAMA3_SOURCE
        else:
            if rate <= 0:
                raise ProjectionError(f"--failures-per-gpu-hour must be above 0, got {rate}")
            source = f"the given rate of {rate:g} failures per GPU-hour"
        mtbf = 1.0 / (rate * gpus)
    m = mtbf * 3600.0
    d, r = inputs.stall, inputs.recovery
    current = inputs.interval_seconds
    best = optimal_interval(d, r, m, floor=max(inputs.save_time or 0.0, inputs.step_time))
    young = math.sqrt(2.0 * d * m)
    rows: list[tuple[float, float, str]] = []
    candidates: list[tuple[float, str]] = [
        (current * f, f"{f:g}× today") for f in (0.25, 0.5, 2.0, 4.0)
    ]
    candidates += [(current, "today"), (best, "optimal")]
    if interval is not None:
        candidates.append((interval, "asked"))
    named = ("today", "optimal", "asked")
    by_key: dict[float, tuple[float, str]] = {}
    for value, label in candidates:
        key = round(value, 9)
        if value <= 0:
            continue
        if key not in by_key or (label in named and by_key[key][1] not in named):
            by_key[key] = (value, label)
        elif label in named and by_key[key][1] in named and label not in by_key[key][1]:
            by_key[key] = (value, f"{by_key[key][1]}, {label}")
    for value, label in sorted(by_key.values()):
        rows.append((value, useful_fraction(value, d, r, m), label))
    evaluated = None if interval is None else (interval, useful_fraction(interval, d, r, m))
    return Projection(
        gpus=gpus,
        mtbf_hours=mtbf,
        rate_source=source,
        inputs=inputs,
        current_interval=current,
        current_goodput=useful_fraction(current, d, r, m),
        optimal_interval=best,
        optimal_goodput=useful_fraction(best, d, r, m),
        young_interval=young,
        table=tuple(rows),
        evaluated=evaluated,
    )


def _seconds(value: float) -> str:
    """A duration for the projection's lines: milliseconds below a second."""
    from pytest_recoverygate.engine.verdict import format_seconds

    return f"{value * 1000:.1f}ms" if value < 1 else format_seconds(value)


def format_projection(p: Projection) -> list[str]:
    """The projection as terminal lines (the ``goodput`` command's output)."""
    format_seconds = _seconds

    i = p.inputs
    per_step = (i.interval_seconds / i.interval_steps) if i.interval_steps else None

    def steps(seconds: float) -> str:
        return f" ≈ {seconds / per_step:,.0f} steps" if per_step else ""

    lines = [
        f"Goodput of this job on {p.gpus:,} GPUs",
        f"  failure rate: MTBF {p.mtbf_hours:.2f} h for the whole job ({p.rate_source})",
        f"  measured: step {format_seconds(i.step_time)}, checkpoint every "
        f"{format_seconds(i.interval_seconds)}{steps(i.interval_seconds)}, save stall "
        f"{format_seconds(i.stall)} ({i.stall_source}), recovery "
        f"{format_seconds(i.recovery)} ({i.recovery_source})",
        f"  today: {p.current_goodput:.2%} goodput",
        f"  best interval: {format_seconds(p.optimal_interval)}{steps(p.optimal_interval)} "
        f"→ {p.optimal_goodput:.2%} (τ* = √(2δ(M−R)) − δ; Young's √(2δM) = "
        f"{format_seconds(p.young_interval)})",
        "",
        "  interval            goodput",
    ]
    for value, goodput, label in p.table:
        mark = (
            f"  ← {label}"
            if any(n in label for n in ("today", "optimal", "asked")) and ("×" not in label)
            else ""
        )
        lines.append(f"  {format_seconds(value):>10}{steps(value):>16}  {goodput:7.2%}{mark}")
    return lines
