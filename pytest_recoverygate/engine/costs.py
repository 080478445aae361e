"""What a failure costs this job, measured from one drill's record (pure).

From the progress lines, checkpoints and saves a drill saw, and its recoveries:

- **step time**: median and p95 of the time per step between consecutive progress lines of
  one process (lines that span a save or a kill are left out, so a save's stall is not a
  slow step; with rate-limited lines each sample averages the steps between two lines);
- **save time**: ``checkpoint_started`` → ``checkpoint_completed`` (needs ``checkpoint_started``);
- **save stall**: the training time each save costs — the gap in progress across the save
  minus the steps it held at the median step time (a synchronous save stalls about its save
  time, an asynchronous one should stall about nothing);
- **checkpoint interval**: steps and seconds between consecutive checkpoints of one process;
- **recovery time** and **lost work** per kill: the redone steps × the step time, with the
  distribution over kills (min, median, p95, max) when a drill kills more than once.

Every figure that cannot be measured is ``None`` with its reason in ``missing``.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_recoverygate.engine.verdict import Recovery

__all__ = ["Costs", "Spread", "measure", "percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Spread:
    """min / median / p95 / max of one figure over the drill's kills."""

    count: int
    min: float
    median: float
    p95: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread | None:
        data = [float(v) for v in values]
        if not data:
            return None
        return cls(len(data), min(data), statistics.median(data), percentile(data, 95), max(data))

    def as_dict(self) -> dict[str, float | int]:
        return {
            "count": self.count,
            "min": round(self.min, 6),
            "median": round(self.median, 6),
            "p95": round(self.p95, 6),
            "max": round(self.max, 6),
        }


@dataclass(frozen=True, kw_only=True)
class Costs:
    """The measured components of a failure's cost (seconds unless named otherwise), each
    given by :func:`measure` (None: not measured; ``missing`` says why)."""

    step_time_median: float | None
    step_time_p95: float | None
    step_samples: int
    save_time_median: float | None
    save_time_max: float | None
    save_stall_median: float | None
    saves_measured: int
    checkpoint_interval_steps: float | None
    checkpoint_interval_seconds: float | None
    recovery_time: Spread | None
    lost_steps: Spread | None
    lost_work_seconds: Spread | None
    lost_work_upper_seconds: Spread | None
    per_kill: tuple[dict[str, Any], ...]
    missing: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        def r(value: float | None) -> float | None:
            return None if value is None else round(value, 6)

        return {
            "stepTimeMedianSeconds": r(self.step_time_median),
            "stepTimeP95Seconds": r(self.step_time_p95),
            "stepSamples": self.step_samples,
            "saveTimeMedianSeconds": r(self.save_time_median),
            "saveTimeMaxSeconds": r(self.save_time_max),
            "saveStallMedianSeconds": r(self.save_stall_median),
            "savesMeasured": self.saves_measured,
            "checkpointIntervalSteps": r(self.checkpoint_interval_steps),
            "checkpointIntervalSeconds": r(self.checkpoint_interval_seconds),
            "recoveryTimeSeconds": self.recovery_time.as_dict() if self.recovery_time else None,
            "lostSteps": self.lost_steps.as_dict() if self.lost_steps else None,
            "lostWorkSeconds": (
                self.lost_work_seconds.as_dict() if self.lost_work_seconds else None
            ),
            "lostWorkUpperBoundSeconds": (
                self.lost_work_upper_seconds.as_dict() if self.lost_work_upper_seconds else None
            ),
            "perKill": [dict(k) for k in self.per_kill],
            "missing": dict(self.missing),
        }

    def flat(self) -> dict[str, float | int | None]:
        """The headline figures, flat (JUnit properties, the CLI block)."""

        def med(spread: Spread | None) -> float | None:
            return None if spread is None else round(spread.median, 6)

        return {
            "stepTimeMedianSeconds": self.as_dict()["stepTimeMedianSeconds"],
            "stepTimeP95Seconds": self.as_dict()["stepTimeP95Seconds"],
            "saveTimeMedianSeconds": self.as_dict()["saveTimeMedianSeconds"],
            "saveStallMedianSeconds": self.as_dict()["saveStallMedianSeconds"],
            "checkpointIntervalSteps": self.as_dict()["checkpointIntervalSteps"],
            "checkpointIntervalSeconds": self.as_dict()["checkpointIntervalSeconds"],
            "lostWorkSeconds": med(self.lost_work_seconds),
        }


def _spans(
    saves: Sequence[tuple[int, float, float | None]], kills: Sequence[float]
) -> list[tuple[float, float]]:
    spans = [(start, done) for _, start, done in saves if done is not None]
    spans += [(k, k) for k in kills]
    return spans


Points = dict[str, list[tuple[float, int]]]  # incarnation -> (time, step), time-sorted


def _step_samples(by_inc: Points, blocked: Sequence[tuple[float, float]]) -> list[float]:
    """Seconds per step between consecutive lines of one process (no save, no kill between)."""
    samples: list[float] = []
    for points in by_inc.values():
        points.sort()
        for (t0, s0), (t1, s1) in itertools.pairwise(points):
            if s1 <= s0 or t1 <= t0:
                continue
            if any(t0 < end and start < t1 for start, end in blocked):
                continue
            samples.append((t1 - t0) / (s1 - s0))
    return samples


def _save_stalls(
    by_inc: Points,
    windows: Sequence[tuple[float, float]],
    kills: Sequence[float],
    step_median: float | None,
) -> list[float]:
    """Each save's gap in progress minus the steps it held at the median step time."""
    stalls: list[float] = []
    if step_median is None:
        return stalls
    for start, end in windows:
        for points in by_inc.values():
            before = [p for p in points if p[0] <= start]
            after = [p for p in points if p[0] > end]
            if not before or not after:
                continue
            (t0, s0), (t1, s1) = before[-1], after[0]
            if s1 <= s0 or any(t0 < k <= t1 for k in kills):
                continue
            stalls.append(max((t1 - t0) - (s1 - s0) * step_median, 0.0))
            break
    return stalls


def _interval(
    checkpoints: Sequence[tuple[int, float]],
    checkpoint_incs: Sequence[str] | None,
    kills: Sequence[float],
) -> tuple[float | None, float | None]:
    """(steps, seconds): the median gap between consecutive checkpoints of one process."""
    if not checkpoints:
        return None, None
    owners = list(checkpoint_incs) if checkpoint_incs is not None else [""] * len(checkpoints)
    groups: dict[str, list[tuple[float, int]]] = {}
    for (step, at), owner in zip(checkpoints, owners, strict=False):
        groups.setdefault(owner, []).append((at, step))
    gaps = [
        (t1 - t0, s1 - s0)
        for pts in groups.values()
        for (t0, s0), (t1, s1) in zip(sorted(pts), sorted(pts)[1:], strict=False)
        if t1 > t0 and s1 > s0 and not any(t0 < k <= t1 for k in kills)
    ]
    if not gaps:
        return None, None
    return statistics.median(g[1] for g in gaps), statistics.median(g[0] for g in gaps)


def _per_kill(
    recoveries: Sequence[Recovery], step_median: float | None
) -> tuple[list[dict[str, Any]], list[float], list[float]]:
    """Each kill's figures, and the lost work (and its upper bound) of those measured."""
    per_kill: list[dict[str, Any]] = []
    lost_work: list[float] = []
    lost_upper: list[float] = []
    for rec in recoveries:
        work = (
            rec.lost_steps * step_median
            if rec.lost_steps is not None and step_median is not None
            else None
        )
        upper = (
            rec.lost_steps_upper_bound * step_median
            if rec.lost_steps_upper_bound is not None and step_median is not None
            else None
        )
        if work is not None:
            lost_work.append(work)
        if upper is not None:
            lost_upper.append(upper)
        per_kill.append(
            {
                "index": rec.index,
                "position": rec.position,
                "recoveryTimeSeconds": rec.recovery_time_seconds,
                "lostSteps": rec.lost_steps,
                "lostStepsUpperBound": rec.lost_steps_upper_bound,
                "lostWorkSeconds": None if work is None else round(work, 6),
                "lostWorkUpperBoundSeconds": None if upper is None else round(upper, 6),
                "verdict": rec.verdict.value,
            }
        )
    return per_kill, lost_work, lost_upper


def measure(
    progress: Sequence[tuple[float, str, int]],
    checkpoints: Sequence[tuple[int, float]],
    saves: Sequence[tuple[int, float, float | None]],
    recoveries: Sequence[Recovery],
    checkpoint_incs: Sequence[str] | None = None,
) -> Costs:
    """The cost components of one drill (see the module docstring).

    ``progress`` is (time, incarnation, step) as the drill saw it; ``checkpoints`` (step,
    time) completed; ``saves`` (step, started, completed or None); ``checkpoint_incs`` the
    incarnation of each checkpoint (pairs of checkpoints of one process give the interval).
    """
    missing: dict[str, str] = {}
    kills = [r.kill_time for r in recoveries if r.kill_time is not None]
    by_inc: Points = {}
    for at, inc, step in progress:
        by_inc.setdefault(inc, []).append((at, step))
    samples = _step_samples(by_inc, _spans(saves, kills))
    step_median = statistics.median(samples) if samples else None
    step_p95 = percentile(samples, 95) if samples else None
    if not samples:
        missing["stepTime"] = "fewer than two progress lines of one process between saves"
    done = [(s, a, c) for s, a, c in saves if c is not None and c >= a]
    save_times = [c - a for _, a, c in done]
    if not saves:
        missing["saveTime"] = (
            "the job reports no checkpoint_started: call reporter.checkpoint_started(step) "
            "when a save begins"
        )
    elif not save_times:
        missing["saveTime"] = "no save was seen from checkpoint_started to checkpoint_completed"
    windows = [(a, c) for _, a, c in done] if done else [(t, t) for _, t in checkpoints]
    stalls = _save_stalls(by_inc, windows, kills, step_median)
    if not stalls:
        missing["saveStall"] = (
            "no save was bracketed by progress lines of one process"
            if step_median is not None
            else "the step time is unknown"
        )
    interval_steps, interval_seconds = _interval(checkpoints, checkpoint_incs, kills)
    if interval_seconds is None:
        missing["checkpointInterval"] = "fewer than two checkpoints of one process were seen"
    per_kill, lost_work, lost_upper = _per_kill(recoveries, step_median)
    if recoveries and not lost_work:
        missing["lostWork"] = (
            "the step time or the lost steps are unknown"
            if step_median is None
            else "no kill has a measured number of lost steps"
        )
    return Costs(
        step_time_median=step_median,
        step_time_p95=step_p95,
        step_samples=len(samples),
        save_time_median=statistics.median(save_times) if save_times else None,
        save_time_max=max(save_times) if save_times else None,
        save_stall_median=statistics.median(stalls) if stalls else None,
        saves_measured=len(stalls),
        checkpoint_interval_steps=interval_steps,
        checkpoint_interval_seconds=interval_seconds,
        recovery_time=Spread.of(
            r.recovery_time_seconds for r in recoveries if r.recovery_time_seconds is not None
        ),
        lost_steps=Spread.of(r.lost_steps for r in recoveries if r.lost_steps is not None),
        lost_work_seconds=Spread.of(lost_work),
        lost_work_upper_seconds=Spread.of(lost_upper),
        per_kill=tuple(per_kill),
        missing=missing,
    )
