"""StorageFault: what the storage layer over the job's checkpoint folder and the job's own
lines showed of a fault on that folder (pure: the facts the storage rules read).

The storage layer reports every file the job writes, renames, truncates and removes in
the folder, healthy or faulted, and each operation the fault failed or held; the drill
reads files back once the fault is lifted (the audit). :class:`StorageRecord` turns that,
with the job's checkpoint lines, into facts:

- which files each completed checkpoint is made of (those closed after writes between the
  save's ``checkpoint_started``, else the previous checkpoint, and its
  ``checkpoint_completed``; renames followed);
- the newest durable checkpoint when the fault was armed, and whether the job removed,
  truncated or replaced one of its files before a newer checkpoint was durable;
- the faulted save (the first operation the fault failed or held, and the save it lies
  in), how it ended (reported complete, reported failed, retried, the job moved on), and
  which small file it moved to name its step (a ``latest`` pointer);
- what the job did: failed loudly, said the save failed, retried, trained on, stalled.

Bounded: at most :data:`MAX_FILES` files are followed (more are counted) and
:data:`MAX_FACTS` facts kept, whatever the job does in its folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pytest_recoverygate.engine.model import (
    StorageEvent,
    StorageEventKind,
    TrainingEvent,
    TrainingEventKind,
)

__all__ = [
    "MAX_FACTS",
    "MAX_FILES",
    "POINTER_BYTES",
    "FaultedSave",
    "FileState",
    "StorageRecord",
    "StorageSpec",
    "names_step",
    "storage_details",
]

#: Files of the folder followed (their writes, renames, removals); more are counted.
MAX_FILES = 4096
#: Facts kept of what the job did.
MAX_FACTS = 64
#: A file this small written while the storage was faulty is read back as a possible
#: ``latest`` pointer (its text names a step).
POINTER_BYTES = 256

S = StorageEventKind


@dataclass(frozen=True, slots=True)
class StorageSpec:
    """``injectFailure`` of a StorageFault, in plain values."""

    mode: str  # enospc | eio | readonly | stall | latency
    during: str = "save"  # save | load
    path: str = ""
    latency: float | None = None
    duration: float | None = None  # None: until the job failed, restarted or dealt with it
    kill_after: bool = False  # killAfter: save


@dataclass(slots=True)
class FileState:
    """One file of the folder as the layer saw it last."""

    size: int
    written: float  # closed after its last write
    first: float  # its first write then
    gone: tuple[float, str] | None = None  # (when, how): removed, truncated, replaced
    link: str = ""  # a symbolic link: what it points to (never part of a checkpoint)


@dataclass(slots=True)
class FaultedSave:
    """The save the fault hit: its step (None until a line names it), when it started,
    the first operation of it the fault failed or held, and how it ended."""

    step: int | None
    started: float | None
    hit: float
    op: str
    path: str
    error: str
    ended: tuple[float, str] | None = None  # (when, how)


@dataclass(slots=True)
class StorageRecord:
    """The facts of one StorageFault (see the module docstring)."""

    spec: StorageSpec
    mounted_at: float | None = None  # the layer came up (after discovery on some backends)
    armed_at: float | None = None
    lifted_at: float | None = None
    lift_why: str = ""
    failed: int = 0
    stalled: int = 0
    first_failed: StorageEvent | None = None
    first_stalled: StorageEvent | None = None
    delayed: int = 0
    first_delayed: StorageEvent | None = None
    files: dict[str, FileState] = field(default_factory=dict)
    files_over: int = 0  # files past MAX_FILES, not followed
    started: dict[int, float] = field(default_factory=dict)  # save step -> started
    completed: dict[int, float] = field(default_factory=dict)  # checkpoint step -> completed
    made_of: dict[int, list[str]] = field(default_factory=dict)  # checkpoint -> its files
    said_failed: dict[int, tuple[float, str]] = field(default_factory=dict)
    durable: int | None = None  # the newest durable checkpoint when the fault was armed
    hit: FaultedSave | None = None
    swallowed: list[tuple[int, float, str]] = field(default_factory=list)  # step, when, how
    pointer: tuple[str, str, float] | None = None  # (file, its text, written)
    deleted: tuple[str, float, str] | None = None  # (file of `durable`, when, how)
    audit: dict[str, StorageEvent] = field(default_factory=dict)
    facts: list[tuple[str, float, str]] = field(default_factory=list)  # (what, when, shown by)
    last_progress: tuple[int, float] | None = None
    progress_after_stall: tuple[int, float] | None = None  # the first advance past it
    progress_after_lift: list[tuple[int, float]] = field(default_factory=list)
    job_failed: tuple[float, str] | None = None  # (when, shown by)

    # ------------------------------------------------------------------ state

    @property
    def armed(self) -> bool:
        """The fault is in effect now."""
        return self.armed_at is not None and self.lifted_at is None

    def in_effect(self, at: float) -> bool:
        """Whether the fault was in effect at ``at``."""
        return (
            self.armed_at is not None
            and at >= self.armed_at
            and (self.lifted_at is None or at < self.lifted_at)
        )

    @property
    def stall_began(self) -> float | None:
        return self.first_stalled.timestamp if self.first_stalled is not None else None

    def fact(self, what: str, at: float, shown_by: str) -> None:
        if len(self.facts) < MAX_FACTS and not any(f[0] == what for f in self.facts):
            self.facts.append((what, at, shown_by))

    def durable_steps(self) -> list[int]:
        """Completed checkpoints that are durable: not a save the fault hit (reported
        complete anyway), not one whose file the audit found missing or short."""
        bad = {step for step, _, _ in self.swallowed}
        return sorted(step for step in self.completed if step not in bad)

    def intact(self, step: int) -> bool:
        """Whether completed checkpoint ``step``'s files (as the layer saw them written)
        are all still there: none removed, truncated or replaced since."""
        names = self.made_of.get(step)
        if not names:
            return False
        return all(name in self.files and self.files[name].gone is None for name in names)

    # ------------------------------------------------------------------ the fault

    def armed_now(self, at: float) -> None:
        self.armed_at = at
        done = [s for s in self.completed if self.completed[s] <= at]
        self.durable = max(done) if done else None

    def lifted(self, at: float, why: str) -> None:
        if self.lifted_at is None and self.armed_at is not None:
            self.lifted_at = at
            self.lift_why = why

    # ------------------------------------------------------------------ job lines

    def on_training(self, event: TrainingEvent) -> None:
        """A line of the reporting rank (or a child of it), after the ledger took it."""
        kind, step, at = event.kind, event.step, event.timestamp
        if step is None:
            return
        if kind is TrainingEventKind.PROGRESS:
            self._progress(step, at)
            return
        if kind is TrainingEventKind.CHECKPOINT_STARTED:
            self._save_started(step, at)
        elif kind is TrainingEventKind.CHECKPOINT_COMPLETED:
            self._completed(step, at)
        elif kind is TrainingEventKind.CHECKPOINT_FAILED:
            self._said_failed(step, at, event.error or "")
        self._pointer()  # a line may name the failed save's step

    def _progress(self, step: int, at: float) -> None:
        previous = self.last_progress
        self.last_progress = (step, at)
        began = self.stall_began
        if (
            began is not None
            and at > began
            and previous is not None
            and step > previous[0]
            and self.progress_after_stall is None
        ):
            self.progress_after_stall = (step, at)
        lifted = self.lifted_at is not None and at >= self.lifted_at
        if lifted and len(self.progress_after_lift) < MAX_FACTS:
            self.progress_after_lift.append((step, at))
        hit = self.hit
        if (
            hit is not None
            and hit.ended is None
            and hit.step is not None
            and step > hit.step
            and at > hit.hit
        ):
            hit.ended = (at, f"the job moved on to step {step}")

    def _save_started(self, step: int, at: float) -> None:
        again = step in self.started and self.armed_at is not None and at >= self.armed_at
        self.started.setdefault(step, at)
        if again and step in self.said_failed:
            self.fact("retried the save", at, f"checkpoint_started({step}) again")
            self.started[step] = at
        hit = self.hit
        if hit is not None and hit.step is None and at <= hit.hit:
            hit.step, hit.started = step, at

    def _completed(self, step: int, at: float) -> None:
        self.completed[step] = at
        self.made_of[step] = self._files_between(self._window_start(step), at)
        hit = self.hit
        if hit is not None and hit.step is None and at >= hit.hit:
            hit.step = step
        if hit is None or hit.step != step:
            return
        if hit.error in ("held", "delayed"):  # slowed, not failed: a checkpoint like any
            if hit.ended is None:
                hit.ended = (at, f"completed once the storage let it ({hit.error})")
            return
        lifted = self.lifted_at
        rewritten = lifted is not None and (
            self.started.get(step, 0.0) >= lifted
            or any(
                self.files[name].first >= lifted
                for name in self.made_of[step]
                if name in self.files
            )
        )
        if rewritten:  # written again once the storage was healthy: a retry
            self.fact("retried the save", at, f"checkpoint_completed({step}) after the lift")
            if hit.ended is None:
                hit.ended = (at, "retried and completed")
            return
        self.swallowed.append((step, at, "reported complete"))
        self.fact("reported the failed save complete", at, f"checkpoint_completed({step})")
        if hit.ended is None:
            hit.ended = (at, "reported complete")

    def _said_failed(self, step: int, at: float, error: str) -> None:
        self.said_failed.setdefault(step, (at, error))
        shown = f"checkpoint_failed({step})" + (f": {error}" if error else "")
        self.fact("said the save failed", at, shown)
        hit = self.hit
        if hit is not None and hit.step is None and at >= hit.hit:
            hit.step = step
        if hit is not None and hit.step == step and hit.ended is None:
            hit.ended = (at, "reported failed")

    def _window_start(self, step: int) -> float:
        started = self.started.get(step)
        if started is not None:
            return started
        before = [t for s, t in self.completed.items() if s < step]
        return max(before) if before else 0.0

    def _files_between(self, start: float, end: float) -> list[str]:
        return sorted(
            name
            for name, state in self.files.items()
            if state.gone is None and not state.link and start <= state.written <= end
        )

    # ------------------------------------------------------------------ the layer

    def on_storage(self, event: StorageEvent) -> None:
        kind, at = event.kind, event.timestamp
        if kind is S.FAILED:
            self.failed += 1
            if self.first_failed is None:
                self.first_failed = event
            self._hit(event)
        elif kind is S.STALLED:
            self.stalled += 1
            if self.first_stalled is None:
                self.first_stalled = event
                self._hit(event)
        elif kind is S.DELAYED:
            self.delayed += 1
            if self.first_delayed is None:
                self.first_delayed = event
                self._hit(event)
        elif kind is S.WROTE:
            self._wrote(event)
        elif kind is S.RENAMED:
            self._renamed(event)
        elif kind in (S.REMOVED, S.TRUNCATED):
            how = "removed" if kind is S.REMOVED else "truncated"
            self._gone(event.path, at, how)
        elif kind is S.AUDIT:
            if len(self.audit) < MAX_FILES:
                self.audit[event.path] = event
            self._audited(event)

    def _hit(self, event: StorageEvent) -> None:
        if self.hit is not None:
            return
        step, started = None, None
        running = [(t, s) for s, t in self.started.items() if t <= event.timestamp]
        if running:
            started, step = max(running)
            if step in self.completed and self.completed[step] <= event.timestamp:
                step, started = None, None  # that save was over: a later line names this one
        how = {S.STALLED: "held", S.DELAYED: "delayed"}.get(event.kind, event.error)
        self.hit = FaultedSave(step, started, event.timestamp, event.op, event.path, how)
        self._pointer()

    def _wrote(self, event: StorageEvent) -> None:
        name = event.path
        if name not in self.files and len(self.files) >= MAX_FILES:
            self.files_over += 1
            return
        first = event.first if event.first is not None else event.timestamp
        self.files[name] = FileState(event.size or 0, event.timestamp, first, link=event.content)
        if not event.content:  # a write the layer reported after the job's completed line
            for step, done in self.completed.items():
                names = self.made_of.setdefault(step, [])
                if name not in names and self._window_start(step) <= event.timestamp <= done:
                    names.append(name)
                    names.sort()
        self._pointer()

    def _renamed(self, event: StorageEvent) -> None:
        old, new, at = event.path, event.to, event.timestamp
        if event.detail == "replaced":
            self._gone(new, at, f"replaced by {old}")
        state = self.files.pop(old, None)
        if state is not None and new:
            self.files[new] = state
            for names in self.made_of.values():
                if old in names:
                    names[names.index(old)] = new

    def _gone(self, name: str, at: float, how: str) -> None:
        state = self.files.get(name)
        if state is not None and state.gone is None:
            state.gone = (at, how)
        if not self.in_effect(at) or self.deleted is not None:
            return  # a file rewritten in place once the storage is healthy again is no loss
        if self.durable is None or name not in self.made_of.get(self.durable, ()):
            return
        newer = [s for s in self.durable_steps() if s > self.durable and self.completed[s] <= at]
        if not newer:  # its replacement was not durable yet
            self.deleted = (name, at, how)
            self.fact(
                "removed its last durable checkpoint",
                at,
                f"{name} {how} (checkpoint {self.durable}) before a newer checkpoint was durable",
            )

    def _pointer(self) -> None:
        """A link made, or a small file read back, while the storage was faulty, that names
        the failed save: the job moved its ``latest`` pointer to it."""
        hit = self.hit
        if self.pointer is not None or hit is None or hit.step is None:
            return
        if hit.error in ("held", "delayed"):
            return  # a slowed save is no failed one
        candidates = [
            (name, state.link, state.written)
            for name, state in self.files.items()
            if state.link and self.in_effect(state.written)
        ]
        candidates += [
            (name, event.content, event.timestamp)
            for name, event in self.audit.items()
            if event.content and name in self.files and self.in_effect(self.files[name].written)
        ]
        for name, text, at in candidates:
            if names_step(text, hit.step):
                self.pointer = (name, text, at)
                shown = f"{name} -> {text}" if self.files[name].link else f"{name} reads {text!r}"
                self.fact("moved its latest pointer to the failed save", at, shown)
                return

    def _audited(self, event: StorageEvent) -> None:
        self._pointer()
        durable = self.durable
        if (
            durable is not None
            and event.detail in ("missing", "short", "unreadable")
            and event.path in self.made_of.get(durable, ())
            and self.deleted is None
        ):
            self.deleted = (event.path, event.timestamp, f"{event.detail} when read back")

    # ------------------------------------------------------------------ what to audit

    def audit_plan(self) -> list[tuple[str, int | None]]:
        """The files to read back once the fault is lifted, each with the size it had when
        its checkpoint completed (None: a small file written while the storage was faulty,
        read for its text)."""
        plan: dict[str, int | None] = {}
        steps = [self.durable] if self.durable is not None else []
        steps += [s for s, _, _ in self.swallowed]
        for step in steps:
            for name in self.made_of.get(step, ()):
                state = self.files.get(name)
                plan[name] = state.size if state is not None else None
        for name, state in self.files.items():
            if name not in plan and state.size <= POINTER_BYTES and self.in_effect(state.written):
                plan[name] = None
        return sorted(plan.items())[:MAX_FILES]


def names_step(text: str, step: int) -> bool:
    """Whether a pointer's text names ``step``: a run of digits equal to it (``60``,
    ``step-00000060.pt``, ``iter_0000060``, ``global_step60``), in one short line."""
    line = text.strip()
    if not line or "\n" in line or len(line) > POINTER_BYTES:
        return False
    return any(int(run) == step for run in re.findall(r"\d{1,19}", line))


def storage_details(record: StorageRecord) -> dict[str, object]:
    """``faultDetails.storage``: the fault, what it met and what the job did."""
    spec, hit = record.spec, record.hit
    first = record.first_failed or record.first_stalled or record.first_delayed

    def op(event: StorageEvent | None) -> dict[str, object] | None:
        if event is None:
            return None
        return {
            "time": event.timestamp,
            "op": event.op,
            "path": event.path,
            "error": event.error
            or {StorageEventKind.STALLED: "held", StorageEventKind.DELAYED: "delayed"}.get(
                event.kind, ""
            ),
            "pid": event.pid,
        }

    audit = list(record.audit.values())
    return {
        "mode": spec.mode,
        "during": spec.during,
        "path": spec.path,
        "latencySeconds": spec.latency,
        "durationSeconds": spec.duration,
        "killAfter": "save" if spec.kill_after else "none",
        "armedAt": record.armed_at,
        "liftedAt": record.lifted_at,
        "liftedBecause": record.lift_why or None,
        "firstOperation": op(first),
        "operationsFailed": record.failed,
        "operationsHeld": record.stalled,
        "operationsDelayed": record.delayed,
        "saveHit": None if hit is None else hit.step,
        "saveEnded": None if hit is None or hit.ended is None else hit.ended[1],
        "lastDurableCheckpoint": record.durable,
        "audit": {
            "filesChecked": len(audit),
            "missing": sorted(e.path for e in audit if e.detail == "missing"),
            "short": sorted(e.path for e in audit if e.detail == "short"),
            "unreadable": sorted(e.path for e in audit if e.detail == "unreadable"),
        },
        "jobDid": [{"what": w, "time": t, "shownBy": s} for w, t, s in record.facts],
        "filesFollowed": len(record.files),
        "filesNotFollowed": record.files_over,
    }
