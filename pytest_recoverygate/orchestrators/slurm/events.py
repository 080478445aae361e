"""The SLURM backend's event source: the job's output file, tailed into the shared parser."""

from __future__ import annotations

from collections.abc import Callable

from pytest_recoverygate.engine.model import TrainingEvent
from pytest_recoverygate.registry.seams import Clock
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.filetail import OutputTail
from pytest_recoverygate.shared.joboutput import JobOutput, OutputSplitter, slurm_task_of

__all__ = ["SlurmEventSource", "uid_of"]


def uid_of(user: str) -> int | None:
    """The uid of the job's user on this machine (its output file's owner), or None."""
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid if user else None
    except KeyError:
        return None


class SlurmEventSource:
    """The job's training events: its output file tailed into a StreamEventSource.

    Each content of the file is its own stream of the parser: when the tail starts over
    (truncation, rotation, a requeue that rewrites the file), the old content's stream is
    ended and a new one begins, so a partial line of the old content is never glued to the
    first line of the new one (an event cut off mid-line that way counts as malformed,
    like any cut line).
    """

    def __init__(self, stream: StreamEventSource) -> None:
        self._stream = stream
        self._generation = 0  # bumped by the tail's thread only
        self.tail: OutputTail | None = None
        #: the job's output file as ``job``; per task, the lines ``srun --label`` marks
        self.output = OutputSplitter(slurm_task_of, merged="job")

    def follow(
        self,
        path: str,
        clock: Clock,
        *,
        interval: float,
        on_line: Callable[[bytes, float], None] | None = None,
        use_inotify: bool = True,
        owner: int | None = None,
    ) -> OutputTail:
        """The tail of ``path`` that feeds this source (not started: call ``start()``)."""
        if self.tail is not None:
            raise RuntimeError(f"already following {self.tail.path}")
        self.tail = OutputTail(
            path,
            self._feed,
            clock,
            interval=interval,
            on_line=on_line,
            on_start_over=self._started_over,
            use_inotify=use_inotify,
            name="recoverygate-slurm-tail",
            owner=owner,
            on_notice=self._stream.notice,
        )
        return self.tail

    def poll(self) -> list[TrainingEvent]:
        return self._stream.poll()

    @property
    def malformed_lines(self) -> int:
        return self._stream.malformed_lines

    def notices(self) -> list[tuple[float, str]]:
        """The tail's refusals of the output file (a symlink, a FIFO, another owner)."""
        return self._stream.notices()

    def job_output(self) -> JobOutput:
        """The job's output file as the tail read it; per task with ``srun --label``."""
        path = self.tail.path if self.tail is not None else "not found yet"
        return self.output.output(
            note=(
                f"the job's output file ({path}) as ``job``; lines srun --label marks "
                "(0: …) also in that task's file"
            ),
            order=["job"],
        )

    def close(self) -> None:
        if self.tail is not None:
            self.tail.stop()
        self._stream.close()

    def _feed(self, chunk: bytes, received: float) -> None:
        self._stream.feed(chunk, received, stream=("slurm-output", self._generation))
        self.output.feed(chunk, self._generation)

    def _started_over(self) -> None:
        self._stream.end_stream(("slurm-output", self._generation))
        if self.tail is not None and self.tail.offset:
            self.output.end(self._generation)
            self.output.feed(
                b"\n[recoverygate: the output file was rewritten (a requeue, a rotation); "
                b"what follows is its new content]\n",
                ("marker", self._generation),
            )
        self._generation += 1
