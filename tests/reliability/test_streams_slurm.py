"""The SLURM output tail under truncation, rotation and requeues: each event exactly once.

We test these aspects, on a plain file (no cluster needed) through the adapter's own
event source (:class:`SlurmEventSource` with its :class:`OutputTail`, polled by hand):

- the file written in pieces of 1..97 bytes with a poll after each, so lines (events and
  Slurm's own markers) are split across polls;
- a requeue that truncates the file (seen shrunk; rewritten past the old offset before
  the next poll; the requeue noticed late), and one that cuts a partial line;
- ``--open-mode=append`` requeues (no byte read twice), also after a partial line;
- rotation by rename with bytes not read yet (the old file is read to its end first)
  and by copy-and-truncate; a 3 MiB line without a newline between the runs;
- and with the tail's own thread: woken by inotify well before its (long) interval, and
  polling alone when inotify is off.

For each case: the events seen are exactly the events written, in order (nothing lost,
nothing twice), cut lines are counted as malformed, every Slurm marker line is seen
once and whole, and the drill engine's verdict on the events seen is the verdict on the
events written (PASS, and FAIL for a job that restarts from scratch).
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from recoverygate.wire import format_start, format_step

from pytest_recoverygate.engine.machine import DrillEngine, Finish, KillTarget, Verdict
from pytest_recoverygate.engine.model import (
    KillOutcome,
    KillResult,
    TrainingEvent,
    TrainingEventKind,
)
from pytest_recoverygate.engine.spec import DrillSpec, Sustain
from pytest_recoverygate.orchestrators.slurm.events import SlurmEventSource
from pytest_recoverygate.orchestrators.slurm.parsing import parse_slurm_marker
from pytest_recoverygate.registry.seams import Clock, RealClock, SimulatedClock
from pytest_recoverygate.shared.events import StreamEventSource
from tests.patience import PROMPT, eventually
from tests.reliability.conftest import Figures

T0 = 1_800_000_000.0
KILL_AT = T0 + 2.55
MARKER = b"srun: error: node1: task 1: Killed\n"
P = TrainingEventKind.PROGRESS
C = TrainingEventKind.CHECKPOINT_COMPLETED
L = TrainingEventKind.CHECKPOINT_LOADED
S = TrainingEventKind.START

Key = tuple[TrainingEventKind, float, str, int | None]


# ------------------------------------------------------------------ the job's output


@dataclass(frozen=True)
class Run:
    """One incarnation's output: its bytes and the events they carry, in order."""

    data: bytes
    events: tuple[Key, ...]


def line(kind: TrainingEventKind, t: float, inc: str, step: int | None = None) -> bytes:
    if kind is S:
        return format_start(T0 + t, inc, pid=4242, host="node1", rank=0).encode()
    assert step is not None
    return format_step(kind.value, T0 + t, inc, step, rank=0).encode()


def key(kind: TrainingEventKind, t: float, inc: str, step: int | None = None) -> Key:
    return (kind, round(T0 + t, 6), inc, step)


def make_run(
    inc: str, events: list[tuple[TrainingEventKind, float, int | None]], noise: int, tail: bytes
) -> Run:
    """Events of ``inc`` between noise lines (the job's own prints), then ``tail``."""
    rng = random.Random(inc)
    data = b"".join(
        f"[{inc}] initialising, {'x' * rng.randrange(10, 60)}\n".encode() for _ in range(noise)
    )
    for kind, t, step in events:
        data += line(kind, t, inc, step)
        if rng.random() < 0.3:
            data += f"loss {rng.random():.4f}\n".encode()
    return Run(data + tail, tuple(key(kind, t, inc, step) for kind, t, step in events))


def old_events() -> list[tuple[TrainingEventKind, float, int | None]]:
    """Steps 1..25 at 10/s, checkpoints at 10 and 20 (the trigger), as in test_engine."""
    out: list[tuple[TrainingEventKind, float, int | None]] = [(S, 0.0, None)]
    for step in range(1, 26):
        out.append((P, step / 10, step))
        if step % 10 == 0:
            out.append((C, step / 10 + 0.001, step))
    return out


def new_events(resume: int) -> list[tuple[TrainingEventKind, float, int | None]]:
    out: list[tuple[TrainingEventKind, float, int | None]] = [(S, 5.0, None)]
    if resume:
        out.append((L, 5.5, resume))
    out += [(P, 6.0 + i / 10, resume + 1 + i) for i in range(40)]
    return out


OLD = make_run("01d", old_events(), noise=5, tail=MARKER)
# Longer than OLD, with events from its first lines: a rewrite that outgrows the old
# offset hides events before it, which only a start over finds again.
NEW = make_run("7e3", new_events(resume=20), noise=2, tail=b"")
SCRATCH = make_run("5c4", new_events(resume=0), noise=2, tail=b"")
#: An event line the killed process had half written.
CUT = line(P, 2.6, "01d", 26)[:40]


# ------------------------------------------------------------------ the file and the tail


class OutputFile:
    """The job's output file and the adapter's event source tailing it, poll by poll."""

    def __init__(
        self,
        folder: Path,
        clock: Clock | None = None,
        *,
        interval: float = 0.05,
        use_inotify: bool = True,
    ) -> None:
        self.path = folder / "slurm-7.out"
        self.clock = clock or SimulatedClock()
        self.source = SlurmEventSource(StreamEventSource(clock=self.clock.now))
        self.tail = self.source.follow(
            str(self.path),
            self.clock,
            interval=interval,
            on_line=self._line,
            use_inotify=use_inotify,
            owner=os.geteuid(),  # the stand-in job writes as the test's own user
        )
        self.events: list[TrainingEvent] = []
        self.markers: list[str] = []
        self.rng = random.Random(7)
        self.polls = 0

    def _line(self, raw: bytes, _received: float) -> None:
        marker = parse_slurm_marker(raw.decode("utf-8", "replace"))
        if marker is not None:
            self.markers.append(marker)

    def poll(self) -> None:
        self.tail.poll_once()
        self.events += self.source.poll()
        self.polls += 1

    def append(self, data: bytes) -> None:
        with self.path.open("ab") as handle:
            handle.write(data)

    def append_in_pieces(self, data: bytes) -> None:
        """Write ``data`` in pieces of 1..97 bytes, polling after each."""
        at = 0
        while at < len(data):
            size = self.rng.randrange(1, 98)
            self.append(data[at : at + size])
            at += size
            self.poll()

    def rewrite(self, data: bytes) -> None:
        """Truncate in place (same inode) and write: a requeue without append mode."""
        self.path.write_bytes(data)

    def rotate(self, data: bytes) -> None:
        """logrotate's rename: the old file moves away, a new one takes the name."""
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self.path.write_bytes(data)

    def copytruncate(self) -> None:
        shutil.copyfile(self.path, self.path.with_name(self.path.name + ".1"))
        with self.path.open("r+b") as handle:
            handle.truncate(0)

    def requeue_seen(self) -> None:
        """The watcher saw ``Restarts`` go up and told the tail (as the adapter does)."""
        self.tail.restart()

    def close(self) -> None:
        self.source.close()


Scenario = Callable[[OutputFile, Run], None]


def appended_in_pieces(out: OutputFile, new: Run) -> None:
    out.append_in_pieces(OLD.data)
    out.append_in_pieces(new.data)  # torchrun restarted the workers in the same step


def requeue_truncates_seen_shrunk(out: OutputFile, new: Run) -> None:
    out.append_in_pieces(OLD.data)
    out.requeue_seen()
    out.rewrite(b"")
    out.poll()
    out.append_in_pieces(new.data)


def requeue_truncates_and_outgrows_the_offset(out: OutputFile, new: Run) -> None:
    out.append_in_pieces(OLD.data)
    cut = len(OLD.data) + 100
    assert len(new.data) > cut and new.data.index(b"RECOVERYGATE/v1") < 200
    out.rewrite(new.data[:cut])  # between two polls: never seen shorter
    out.requeue_seen()
    out.poll()
    out.append_in_pieces(new.data[cut:])


def requeue_noticed_late(out: OutputFile, new: Run) -> None:
    out.append_in_pieces(OLD.data)
    out.rewrite(b"")
    out.append_in_pieces(new.data[:300])
    out.requeue_seen()  # the watcher's poll came after the tail's
    out.append_in_pieces(new.data[300:])


def requeue_truncates_a_cut_line(out: OutputFile, new: Run) -> None:
    out.append_in_pieces(OLD.data + CUT)
    out.requeue_seen()
    out.rewrite(b"")
    out.append_in_pieces(new.data)


def append_mode_requeue(out: OutputFile, new: Run) -> None:
    out.append_in_pieces(OLD.data)
    out.requeue_seen()
    out.poll()
    out.append_in_pieces(new.data)


def append_mode_requeue_after_a_cut_line(out: OutputFile, new: Run) -> None:
    out.append_in_pieces(OLD.data + CUT)
    out.requeue_seen()
    out.append(b"\n")  # slurmstepd's own line end, then the new run
    out.append_in_pieces(new.data)


def rotated_by_rename_with_unread_bytes(out: OutputFile, new: Run) -> None:
    half = len(OLD.data) // 2
    out.append_in_pieces(OLD.data[:half])
    out.append(OLD.data[half:])  # written, not polled yet
    out.rotate(new.data[:200])
    out.poll()
    out.append_in_pieces(new.data[200:])


def rotated_by_copytruncate(out: OutputFile, new: Run) -> None:
    out.append_in_pieces(OLD.data)
    out.copytruncate()
    out.append_in_pieces(new.data)


def a_giant_line_between_the_runs(out: OutputFile, new: Run) -> None:
    out.append_in_pieces(OLD.data)
    out.append(b"#" * (3 * 1024 * 1024))
    out.poll()
    out.append(b"\n")
    out.append_in_pieces(new.data)


# name, what happens to the file, the new run, events cut off mid-line (malformed)
TABLE: list[tuple[Scenario, Run, int]] = [
    (appended_in_pieces, NEW, 0),
    (requeue_truncates_seen_shrunk, NEW, 0),
    (requeue_truncates_seen_shrunk, SCRATCH, 0),
    (requeue_truncates_and_outgrows_the_offset, NEW, 0),
    (requeue_noticed_late, NEW, 0),
    (requeue_truncates_a_cut_line, NEW, 1),
    (append_mode_requeue, NEW, 0),
    (append_mode_requeue, SCRATCH, 0),
    (append_mode_requeue_after_a_cut_line, NEW, 1),
    (rotated_by_rename_with_unread_bytes, NEW, 0),
    (rotated_by_copytruncate, NEW, 0),
    (a_giant_line_between_the_runs, NEW, 0),
]


# ------------------------------------------------------------------ the verdict


def as_events(keys: tuple[Key, ...]) -> list[TrainingEvent]:
    return [TrainingEvent(kind, t, inc, step=step, rank=0) for kind, t, inc, step in keys]


def verdict_of(events: list[TrainingEvent]) -> tuple[object, ...]:
    """Drive the real engine with ``events``; the kill lands at KILL_AT when asked for."""
    # The streams' new runs are a few lines long: hold them for 3 lines, not 10 s.
    spec = DrillSpec(max_recovery_time=10.0, after_checkpoint=20, sustain=Sustain(3, 0.0))
    engine = DrillEngine(spec, T0)
    engine.discovered(T0, "the stream under test")
    for event in events:
        for action in engine.on_training_event(event):
            if isinstance(action, KillTarget):
                engine.on_kill_result(KillResult(KillOutcome.KILLED, KILL_AT))
            assert not isinstance(action, Finish) or engine.result is not None
    if engine.result is None:
        engine.tick(T0 + 3600)
    result = engine.result
    assert result is not None
    return (
        result.verdict,
        result.resume_step,
        result.lost_steps,
        result.recovery_time_seconds,
        result.reasons,
    )


def seen(events: list[TrainingEvent]) -> list[Key]:
    return [(e.kind, round(e.timestamp, 6), e.incarnation, e.step) for e in events]


@pytest.fixture
def output(tmp_path: Path) -> Iterator[OutputFile]:
    out = OutputFile(tmp_path)
    yield out
    out.close()


@pytest.mark.parametrize(
    ("scenario", "new", "cut"),
    TABLE,
    ids=[
        f"{scenario.__name__}-{'scratch' if new is SCRATCH else 'resume'}"
        for scenario, new, _ in TABLE
    ],
)
def test_every_event_is_seen_exactly_once_and_the_verdict_is_unchanged(
    scenario: Scenario, new: Run, cut: int, output: OutputFile, figures: Figures
) -> None:
    scenario(output, new)
    output.poll()
    written = list(OLD.events + new.events)
    assert seen(output.events) == written
    assert output.source.malformed_lines == cut
    assert output.markers == [MARKER.decode().strip()]
    expected = verdict_of(as_events(OLD.events + new.events))
    assert expected[0] is (Verdict.FAIL if new is SCRATCH else Verdict.PASS), expected
    assert verdict_of(output.events) == expected
    figures.add("stream_cases")
    figures.add("stream_polls", output.polls)


# ------------------------------------------------------------------ with the tail's thread


def wait_for(out: OutputFile, count: int) -> None:
    """Until the tail's thread has passed on ``count`` events (polled from its source)."""

    def enough() -> bool:
        out.events += out.source.poll()
        return len(out.events) >= count

    eventually(enough, f"{count} events from the tail", PROMPT, seen=lambda: len(out.events))


def threaded_requeue(tmp_path: Path, *, use_inotify: bool, interval: float) -> OutputFile:
    """The tail's own thread follows a run, a truncating requeue, and the next run."""
    out = OutputFile(tmp_path, RealClock(), interval=interval, use_inotify=use_inotify)
    out.tail.start()
    for piece in (OLD.data[: len(OLD.data) // 2], OLD.data[len(OLD.data) // 2 :]):
        out.append(piece)
        time.sleep(0.01)  # not a wait: the writer's pace
    wait_for(out, len(OLD.events))
    out.tail.restart()
    out.rewrite(b"")
    for at in range(0, len(NEW.data), 500):
        out.append(NEW.data[at : at + 500])
        time.sleep(0.01)  # not a wait: the writer's pace
    wait_for(out, len(OLD.events) + len(NEW.events))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
def test_the_tail_thread_is_woken_by_inotify_long_before_its_interval(
    tmp_path: Path, figures: Figures
) -> None:
    interval = 120.0  # longer than both waits' budgets (PROMPT, stretched): a wait that
    # took the interval would fail the wait itself
    started = time.monotonic()
    out = threaded_requeue(tmp_path, use_inotify=True, interval=interval)
    took = time.monotonic() - started
    try:
        assert out.tail.inotify
        assert seen(out.events) == list(OLD.events + NEW.events)
        assert out.markers == [MARKER.decode().strip()]
        # every write waited for inotify, never for the interval
        assert took < interval, f"{took:.1f} s"
    finally:
        stop_started = time.monotonic()
        out.close()
        assert time.monotonic() - stop_started < interval  # stop() cuts the wait short
    figures.add("stream_cases")


def test_without_inotify_the_poll_interval_bounds_the_wait(
    tmp_path: Path, figures: Figures
) -> None:
    out = threaded_requeue(tmp_path, use_inotify=False, interval=0.05)
    try:
        assert not out.tail.inotify
        assert seen(out.events) == list(OLD.events + NEW.events)
    finally:
        out.close()
    figures.add("stream_cases")
