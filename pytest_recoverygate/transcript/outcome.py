"""What the runner adds to the engine's result, in one place for the runner and the replay:
the events it keeps (for ``events.jsonl``, the costs and the picture, within bounds), a
cleanup failure, the measured costs and its notes, and the ``evidence`` section's
unmatched patterns. ``recoverygate rejudge`` rebuilds a drill's result from its transcript
with these same functions, so that it reproduces the report bit for bit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pytest_recoverygate.engine import model
from pytest_recoverygate.engine.costs import measure
from pytest_recoverygate.engine.machine import DrillResult, Verdict

if TYPE_CHECKING:
    from pytest_recoverygate.config.schema import DrillConfig

__all__ = [
    "MAX_RAW_OTHER",
    "MAX_RAW_PROGRESS",
    "EventLog",
    "EvidenceView",
    "ProgressRecord",
    "finished",
    "unmatched_evidence",
    "with_cleanup_error",
]

#: The most event rows of each kind the runner keeps for events.jsonl (the rest counted).
MAX_RAW_PROGRESS = 100_000
MAX_RAW_OTHER = 200_000  # above what the engine holds: 3 x 50,000 checkpoint lines, starts


class ProgressRecord:
    """The progress lines a drill keeps for its costs and its picture, in bounded memory:
    every line of the last :data:`RECENT`, and of those before them every ``stride``-th,
    at most :data:`HISTORY` (when the history is full, every other one is dropped and the
    stride doubles). The costs take time per step over the span between two kept lines,
    so a sparser history averages more steps per sample; it biases nothing."""

    RECENT = 32_768
    HISTORY = 32_768

    def __init__(self) -> None:
        self._recent: deque[tuple[float, str, int]] = deque()
        self._history: list[tuple[float, str, int]] = []
        self.stride = 1
        self.seen = 0
        self._aged = 0  # lines that left the recent window so far

    def add(self, point: tuple[float, str, int]) -> None:
        self.seen += 1
        self._recent.append(point)
        if len(self._recent) <= self.RECENT:
            return
        old = self._recent.popleft()
        if self._aged % self.stride == 0:
            self._history.append(old)
            if len(self._history) >= self.HISTORY:
                del self._history[1::2]
                self.stride *= 2
        self._aged += 1

    def points(self) -> tuple[tuple[float, str, int], ...]:
        """The kept lines, in the order they came."""
        return (*self._history, *self._recent)

    def __len__(self) -> int:
        return len(self._history) + len(self._recent)


class EventLog:
    """The job's events as the runner keeps them: every progress line for the costs
    (:class:`ProgressRecord`), and rows for ``events.jsonl`` within bounds (what the job
    prints must not grow the drill's memory; the engine is capped the same way)."""

    def __init__(self) -> None:
        self.progress = ProgressRecord()
        self.rows: list[dict[str, Any]] = []
        self.dropped = 0  # event rows past the bounds: not in events.jsonl
        self._progress_rows = 0

    def add(self, event: model.TrainingEvent) -> None:
        progress = event.kind is model.TrainingEventKind.PROGRESS
        if progress and event.step is not None:
            self.progress.add((event.timestamp, event.incarnation, event.step))
        kept = self._progress_rows if progress else len(self.rows) - self._progress_rows
        if kept >= (MAX_RAW_PROGRESS if progress else MAX_RAW_OTHER):
            self.dropped += 1
            return
        self._progress_rows += progress
        row: dict[str, Any] = {
            "time": event.timestamp,
            "received": event.received,
            "event": event.kind.value,
            "step": event.step,
            "inc": event.incarnation,
            "rank": event.rank,
        }
        # recovery: live's fields, only where a line carried them
        extra = {"replica": event.replica, "source": event.source, "peer": event.peer}
        row.update({k: v for k, v in extra.items() if v is not None})
        self.rows.append(row)


def with_cleanup_error(result: DrillResult, error: str | None) -> DrillResult:
    """A cleanup that failed makes the drill an ERROR (a FAIL stays one), said in the
    summary; an interrupt is reported as it is."""
    if error is None or result.verdict is Verdict.INTERRUPTED:
        return result
    return replace(
        result,
        verdict=Verdict.ERROR if result.verdict is not Verdict.FAIL else result.verdict,
        summary=f"{result.summary}; cleanup failed: {error}",
    )


def finished(
    result: DrillResult,
    *,
    log: EventLog,
    timeline: Iterable[model.TimelineEntry],
    target: model.Worker | None,
    malformed_lines: int,
) -> DrillResult:
    """The result as the runner reports it: the target, the whole timeline in time order,
    the malformed lines, the progress kept, the costs measured from it, and notes on what
    was not kept."""
    costs = measure(
        log.progress.points(),
        [(step, at) for step, at, _ in result.checkpoints],
        result.saves,
        result.recoveries,
        [inc for _, _, inc in result.checkpoints],
    )
    notes = result.notes
    if log.dropped:
        notes += (
            f"{log.dropped} event line(s) past the drill's bounds on what it keeps "
            f"({MAX_RAW_PROGRESS:,} progress lines, {MAX_RAW_OTHER:,} others) are not in "
            "events.jsonl; the verdict saw every line",
        )
    if log.progress.stride > 1:
        notes += (
            f"the progress kept for the costs and the picture is every line of the "
            f"last {ProgressRecord.RECENT:,} and every {log.progress.stride}th before "
            f"them ({log.progress.seen:,} lines in all)",
        )
    return replace(
        result,
        target=target,
        timeline=tuple(sorted(timeline, key=lambda e: e.timestamp)),
        malformed_lines=malformed_lines,
        progress=log.progress.points(),
        costs=costs.as_dict(),
        notes=notes,
    )


@dataclass(frozen=True, slots=True)
class EvidenceView:
    """What :func:`unmatched_evidence` reads of a config's ``evidence`` section (a
    transcript's header keeps it): the preset, ``podLogs``, each kind's pattern."""

    preset: str | None
    pod_logs: bool
    sources: Mapping[str, str | None]

    @classmethod
    def of(cls, config: DrillConfig) -> EvidenceView | None:
        evidence = config.evidence
        if evidence is None:
            return None
        return cls(evidence.preset, evidence.pod_logs, dict(evidence.spec().sources))

    def as_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, "pod_logs": self.pod_logs, "sources": dict(self.sources)}


#: ``evidence.patterns`` kind -> the event its matches report.
_EVIDENCE_EVENTS = {
    "progress": "progress",
    "checkpointStarted": "checkpoint_started",
    "checkpointCompleted": "checkpoint_completed",
    "checkpointLoaded": "checkpoint_loaded",
}


def unmatched_evidence(
    result: DrillResult, evidence: EvidenceView | None, rows: Iterable[Mapping[str, Any]]
) -> DrillResult:
    """A drill with an ``evidence`` section: what pod-log evidence lacks (``podLogs``);
    and, when it did not PASS, each pattern no line matched during the whole drill
    (``rows``: the events kept; the CLI and the report show the job's last lines). When
    not one progress line matched, the summary says so: the drill could not see the job
    train, which is not evidence of anything about its recovery."""
    if evidence is None:
        return result
    if evidence.pod_logs:
        from pytest_recoverygate.shared.logevidence import LACKS

        result = replace(result, notes=(*result.notes, LACKS))
    if result.verdict is Verdict.PASS:
        return result
    seen = {row.get("event") for row in rows}
    where = f"preset {evidence.preset}" if evidence.preset else "your patterns"
    notes = []
    # A drill that saw no replacement start (a StorageFault the job went on from, a drill
    # ended before any kill) had no load to match: its load line's silence says nothing.
    came_back = any(info.new for info in result.incarnations)
    for kind, pattern in evidence.sources.items():
        if kind == "checkpointLoaded" and not came_back:
            continue
        if pattern and _EVIDENCE_EVENTS.get(kind) not in seen:
            notes.append(
                f"evidence: no line matched the {kind} pattern ({where}) {pattern!r} during "
                "the whole drill; compare it with the job's last lines, and check that the "
                "reporter is installed in the job's Python (its start-up hook does the matching)"
            )
    if not notes:
        return result
    summary = result.summary
    if "progress" not in seen:  # "inconclusive" only where the verdict says so (ERROR)
        said = "inconclusive: " if result.verdict is Verdict.ERROR else "note: "
        summary = f"{summary} ({said}{notes[0].removeprefix('evidence: ')})"
    return replace(result, summary=summary, notes=(*result.notes, *notes))
