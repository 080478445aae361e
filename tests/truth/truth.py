"""What really happened in a drill, from the job's own ground-truth records.

The job (``tests/truth/job.py``, or ``examples/local/train.py``) writes one JSON line per
event to ``<base>.<rank>.<pid>.jsonl``. Given the drill's kill time (from its report),
:func:`compute` answers, for the reporting rank (0):

- the last step completed at or before the kill (``t <= killTime``);
- the process the drill must judge: the first process started after the kill that
  completed a step (a replacement that loads and dies is not it; the one after is);
- its first completed step, hence the resume step (first step - 1), the step it loaded
  (its ``loaded`` record, if any), the lost steps (last step before the kill - resume
  step, at least 0) and the recovery time (its first *reported* step past the resume
  step minus the kill time: the moment the drill can see it);
- restarts (processes of rank 0 started after the kill), whether it restarted from
  scratch or replayed steps it had loaded, and what the survivor did after the kill.

Records of ``examples/local/train.py`` have no ``reported`` field (it reports every step
and every checkpoint): a missing ``reported`` means ``true``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Process", "Record", "Truth", "compute", "last_beat", "load_processes"]


@dataclass(frozen=True, slots=True)
class Record:
    t: float
    rank: int
    pid: int
    restart: int
    event: str
    step: int
    reported: bool
    label: int | None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, row: dict[str, Any]) -> Record:
        known = {"t", "rank", "pid", "restart", "event", "step", "reported", "label"}
        return cls(
            t=float(row["t"]),
            rank=int(row["rank"]),
            pid=int(row["pid"]),
            restart=int(row.get("restart", 0)),
            event=str(row["event"]),
            step=int(row.get("step", 0)),
            reported=bool(row.get("reported", True)),
            label=int(row["label"]) if row.get("label") is not None else None,
            extra={k: v for k, v in row.items() if k not in known},
        )


@dataclass(frozen=True, slots=True)
class Process:
    """One worker process (one rank of one restart), its records in time order."""

    pid: int
    rank: int
    restart: int
    records: tuple[Record, ...]

    @property
    def started(self) -> float:
        starts = [r.t for r in self.records if r.event == "start"]
        return starts[0] if starts else self.records[0].t

    @property
    def steps(self) -> tuple[Record, ...]:
        return tuple(r for r in self.records if r.event == "step")

    @property
    def checkpoints(self) -> tuple[Record, ...]:
        return tuple(r for r in self.records if r.event == "checkpoint")

    @property
    def loaded(self) -> Record | None:
        found = [r for r in self.records if r.event == "loaded" and r.step > 0]
        return found[0] if found else None

    @property
    def exit(self) -> Record | None:
        found = [r for r in self.records if r.event == "exit"]
        return found[-1] if found else None

    @property
    def last_t(self) -> float:
        return self.records[-1].t


def load_processes(base: Path) -> list[Process]:
    """Every process's records, from ``<base>.<rank>.<pid>.jsonl``, oldest process first."""
    processes = []
    for path in sorted(base.parent.glob(f"{base.name}.*.*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not rows:
            continue
        records = tuple(sorted((Record.parse(row) for row in rows), key=lambda r: r.t))
        first = records[0]
        processes.append(Process(first.pid, first.rank, first.restart, records))
    return sorted(processes, key=lambda p: p.started)


def last_beat(base: Path, rank: int, pid: int) -> float | None:
    """The last time process ``pid`` of ``rank`` ran its heartbeat thread (``job.py
    --heartbeat``): the last moment it was alive, as far as the job can tell."""
    try:
        return float((base.parent / f"{base.name}.{rank}.{pid}.beat").read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Truth:
    """The ground truth of one drill (reporting rank only), see the module docstring."""

    kill_time: float
    last_step_before_kill: int | None
    checkpoints_before_kill: tuple[int, ...]  # durable, by the old processes, t <= kill
    checkpoints_after_kill: tuple[Record, ...]  # durable, by the old processes, t > kill
    judged: Process | None
    first_step: int | None
    resume_step: int | None
    loaded_step: int | None
    lost_steps: int | None
    recovery_time: float | None
    first_reported_step: Record | None
    restarts: int
    started_after_kill: tuple[Process, ...]
    survivor: Process | None  # the reporting rank's process alive at the kill
    survivor_steps_after_kill: tuple[Record, ...]

    @property
    def from_scratch(self) -> bool:
        return self.first_step == 1

    @property
    def replayed_steps(self) -> int:
        """Steps the judged process re-ran although the state it loaded already had them."""
        if self.loaded_step is None or self.resume_step is None:
            return 0
        return max(0, self.loaded_step - self.resume_step)

    @property
    def survivor_reported_after_kill(self) -> int:
        return sum(1 for r in self.survivor_steps_after_kill if r.reported)

    @property
    def survivor_seconds_after_kill(self) -> float | None:
        if self.survivor is None:
            return None
        return self.survivor.last_t - self.kill_time

    def describe(self) -> str:
        """One paragraph for failure messages and the README table."""
        judged = self.judged
        parts = [
            f"last step before the kill {self.last_step_before_kill}",
            f"checkpoints before the kill {list(self.checkpoints_before_kill)[-3:]}",
        ]
        if self.checkpoints_after_kill:
            parts.append(
                "checkpoints after the kill by the old process "
                f"{[(c.step, c.extra.get('kind'), c.reported) for c in self.checkpoints_after_kill]}"
            )
        if self.survivor is not None:
            survivor_exit = self.survivor.exit
            parts.append(
                f"survivor pid {self.survivor.pid} ran {self.survivor_seconds_after_kill:.3f}s "
                f"and {len(self.survivor_steps_after_kill)} step(s) "
                f"({self.survivor_reported_after_kill} reported) after the kill"
                + (f", exit {survivor_exit.extra.get('why')}" if survivor_exit else "")
            )
        for proc in self.started_after_kill:
            if proc is judged:
                continue
            loaded = proc.loaded
            exit_ = proc.exit
            parts.append(
                f"pid {proc.pid} (restart {proc.restart}) started +{proc.started - self.kill_time:.3f}s, "
                f"loaded {loaded.step if loaded else None}, {len(proc.steps)} step(s), "
                f"exit {exit_.extra.get('why') if exit_ else None}"
            )
        if judged is None:
            parts.append("no process trained after the kill")
        else:
            parts.append(
                f"judged pid {judged.pid} (restart {judged.restart}): loaded {self.loaded_step}, "
                f"first step {self.first_step}, resume step {self.resume_step}, "
                f"lost {self.lost_steps}, replayed {self.replayed_steps}, "
                f"recovery {self.recovery_time if self.recovery_time is None else round(self.recovery_time, 3)}s"
            )
        parts.append(f"restarts {self.restarts}")
        return "; ".join(parts)


def compute(base: Path, kill_time: float, rank: int = 0) -> Truth:
    """The truth of the drill whose kill happened at ``kill_time`` (the report's killTime)."""
    processes = [p for p in load_processes(base) if p.rank == rank]
    old = [p for p in processes if p.started <= kill_time]
    new = tuple(p for p in processes if p.started > kill_time)
    before = [r.step for p in old for r in p.steps if r.t <= kill_time]
    checkpoints_before = tuple(
        sorted(r.step for p in old for r in p.checkpoints if r.t <= kill_time)
    )
    checkpoints_after = tuple(r for p in old for r in p.checkpoints if r.t > kill_time)
    survivors = [p for p in old if p.last_t > kill_time]
    survivor = survivors[-1] if survivors else None
    survivor_steps = tuple(r for r in survivor.steps if r.t > kill_time) if survivor else ()

    judged = next((p for p in new if p.steps), None)
    first_step = resume = loaded = lost = None
    recovery: float | None = None
    first_reported: Record | None = None
    last_before = max(before) if before else None
    if judged is not None:
        first_step = judged.steps[0].step
        resume = first_step - 1
        loaded = judged.loaded.step if judged.loaded is not None else None
        if last_before is not None:
            lost = max(0, last_before - resume)
        # What the drill can see: a reported step past the resume (a metrics thread's
        # ``report`` records are its reports of the completed count).
        first_reported = next(
            (
                r
                for r in judged.records
                if (r.event == "report" or (r.event == "step" and r.reported)) and r.step > resume
            ),
            None,
        )
        if first_reported is not None:
            recovery = first_reported.t - kill_time
    return Truth(
        kill_time=kill_time,
        last_step_before_kill=last_before,
        checkpoints_before_kill=checkpoints_before,
        checkpoints_after_kill=checkpoints_after,
        judged=judged,
        first_step=first_step,
        resume_step=resume,
        loaded_step=loaded,
        lost_steps=lost,
        recovery_time=recovery,
        first_reported_step=first_reported,
        restarts=len(new),
        started_after_kill=new,
        survivor=survivor,
        survivor_steps_after_kill=survivor_steps,
    )
