"""Which thread of a process printed its lines: a metrics thread told from the loop
(issue 41, item 7; pure).

A job may report progress from a metrics thread: the completed count every 0.1 s, and
once as the thread starts, while the training loop saves and loads. The thread's first
tick and the loop's first step then race in every process: on a loaded machine the first
run's tick came after step 1 (its first line read as a line after a step), the
replacement's before step 41 (its first line, the loaded step, read as that step done
again). Lines alone cannot tell such a job from a loop that logs the first step of each
process and redoes the step it loaded; the reporter numbers the thread that printed each
line (wire's ``thread`` field: 0, or absent, for the first thread of the process that
printed, then 1, 2, ...), and :class:`Threads` keeps, per process, which numbers printed
progress and which printed checkpoint lines.

Progress lines only from threads that printed none of the process's checkpoint lines,
while one did, are a metrics thread's samples of a counter: where its first tick falls
against the first step is a race, not the job's contract. Lines that say no thread are
thread 0's: a job whose writer does not number its threads is read as one thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_recoverygate.engine.model import TrainingEvent, TrainingEventKind

__all__ = ["Threads"]

_CHECKPOINT_KINDS = frozenset(
    {
        TrainingEventKind.CHECKPOINT_STARTED,
        TrainingEventKind.CHECKPOINT_COMPLETED,
        TrainingEventKind.CHECKPOINT_LOADED,
        TrainingEventKind.CHECKPOINT_FAILED,
        TrainingEventKind.CHECKPOINT_LOAD_STARTED,
    }
)


@dataclass(slots=True)
class Threads:
    """The thread numbers of one process's progress and checkpoint lines (at most 64 of
    each: the wire caps the number)."""

    progress: set[int] = field(default_factory=set)
    checkpoint: set[int] = field(default_factory=set)

    def saw(self, event: TrainingEvent) -> None:
        """Note the thread of one of the process's lines."""
        number = event.thread or 0
        if event.kind is TrainingEventKind.PROGRESS:
            self.progress.add(number)
        elif event.kind in _CHECKPOINT_KINDS:
            self.checkpoint.add(number)

    def metrics_thread(self) -> bool:
        """Whether its progress came only from threads that printed none of its checkpoint
        lines, while one did: a metrics thread's samples, not the loop's reports."""
        return bool(self.progress and self.checkpoint) and self.progress.isdisjoint(self.checkpoint)
