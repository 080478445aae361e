"""What the simulated job prints: rank 0's reporter lines, generated lazily up to the
clock's now as training events (and as text, per rank, for ``job_output``), and the
event source the drill polls."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recoverygate import wire

from pytest_recoverygate.engine.model import TrainingEvent, TrainingEventKind
from pytest_recoverygate.orchestrators.fake import losses
from pytest_recoverygate.orchestrators.fake.world import host

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.fake.job import Incarnation
    from pytest_recoverygate.orchestrators.fake.orchestrator import FakeOrchestrator

__all__ = ["FakeEventSource", "generate", "print_rank", "state_parts", "step_at"]


class FakeEventSource:
    """The simulated job's reporter lines, generated up to the clock's now."""

    def __init__(self, owner: FakeOrchestrator) -> None:
        self._owner = owner
        self.closed = False

    def poll(self) -> list[TrainingEvent]:
        self._owner._maybe_raise("poll")
        if self.closed:
            return []
        return generate(self._owner)

    @property
    def malformed_lines(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


def print_rank(job: FakeOrchestrator, rank: int, text: str) -> None:
    """``text`` printed by ``rank`` (the job's output, per rank)."""
    job._printed.feed(text.encode("utf-8", "replace"), label=f"rank {rank}")


def step_at(
    inc: Incarnation, step: int, *, checkpoint_every: int, steps_per_second: float, save_time: float
) -> float:
    """When ``step`` completes (synchronous saves pause training for ``save_time``)."""
    saves = (step - 1) // checkpoint_every - inc.resume_step // checkpoint_every
    return (
        inc.first_step_at + (step - inc.resume_step) / steps_per_second + max(saves, 0) * save_time
    )


def state_parts(step: int, *, fresh_optimizer: bool = False) -> tuple[tuple[str, str], ...]:
    """The simulated state's digest parts after ``step`` steps (a fresh optimizer: empty)."""
    optimizer = "0" * 16 if fresh_optimizer else f"{(step * 7919) % 2**64:016x}"
    return (("model", f"{(step * 104729) % 2**64:016x}"), ("optimizer", optimizer))


def generate(job: FakeOrchestrator) -> list[TrainingEvent]:
    """Every incarnation's lines up to now not generated before, in time order."""
    now = job.clock.now()
    out: list[TrainingEvent] = []
    for inc in job._incarnations:
        out += _generate_for(job, inc, now)
    out.sort(key=lambda e: e.timestamp)
    return out


def _step_at(job: FakeOrchestrator, inc: Incarnation, step: int) -> float:
    return step_at(
        inc,
        step,
        checkpoint_every=job.checkpoint_every,
        steps_per_second=job.steps_per_second,
        save_time=job.save_time,
    )


def _generate_for(job: FakeOrchestrator, inc: Incarnation, now: float) -> list[TrainingEvent]:
    out: list[TrainingEvent] = []
    end = now if inc.killed_at is None else min(now, inc.killed_at)
    if inc.crashes_at is not None:
        end = min(end, inc.crashes_at)

    def event(
        kind: TrainingEventKind,
        at: float,
        step: int | None,
        digest: tuple[tuple[str, str], ...] = (),
    ) -> TrainingEvent:
        loss, data = (None, None)
        if kind is TrainingEventKind.PROGRESS and step is not None:
            loss, data = losses.point(
                job.replay,
                step,
                resumed_from=inc.resume_step if inc.number else None,
                noise=job.replay_noise,
                spikes=job.replay_spikes,
            )
        return TrainingEvent(
            kind,
            at,
            inc.inc_id,
            step=step,
            received=now,
            rank=0,
            pid=1000 + inc.number,
            host=host(job),
            restart_count=inc.number,
            digest=wire.combine_parts(digest) if digest else None,
            digest_parts=digest,
            world_size=inc.ranks if kind is TrainingEventKind.START else None,
            loss=loss,
            data=data,
        )

    if not inc.start_emitted and inc.start <= end:
        inc.start_emitted = True
        if job.start_events:
            out.append(event(TrainingEventKind.START, inc.start, None))
        _print_start(job, inc)
    load_at = inc.first_step_at - 0.01
    if inc.resume_step > 0 and not inc.load_emitted and load_at <= end:
        inc.load_emitted = True
        if job.loaded_events and inc.crashes_at is None:
            loaded = state_parts(inc.resume_step, fresh_optimizer=job.resume == "fresh-optimizer")
            out.append(event(TrainingEventKind.CHECKPOINT_LOADED, load_at, inc.resume_step, loaded))
            print_rank(
                job,
                0,
                wire.format_step("checkpoint_loaded", load_at, inc.inc_id, inc.resume_step, rank=0),
            )
    while inc.crashes_at is None:
        step = inc.next_step
        at = _step_at(job, inc, step)
        if at > end:
            break
        if inc.progress_sent != step:
            reported = step - 1 if job.progress_before_step else step
            out.append(event(TrainingEventKind.PROGRESS, at, reported))
            inc.progress_sent = step
        if step % job.checkpoint_every == 0:
            started, done = at + 1e-4, at + 1e-4 + job.save_time
            if job.save_time > 0:
                if started > end:
                    break
                if inc.started_sent != step:
                    out.append(event(TrainingEventKind.CHECKPOINT_STARTED, started, step))
                    inc.started_sent = step
            if done > end:
                if inc.killed_at is not None and inc.killed_at < done:
                    inc.next_step += 1  # torn by the kill: never completes
                break
            out.append(event(TrainingEventKind.CHECKPOINT_COMPLETED, done, step, state_parts(step)))
            job._checkpoints.append(step)
            print_rank(
                job, 0, wire.format_step("checkpoint_completed", done, inc.inc_id, step, rank=0)
            )
        inc.next_step += 1
    if inc.final_save is not None and inc.final_save[1] <= now:
        step, done = inc.final_save
        inc.final_save = None
        out.append(event(TrainingEventKind.CHECKPOINT_COMPLETED, done, step, state_parts(step)))
    return out


def _print_start(job: FakeOrchestrator, inc: Incarnation) -> None:
    """What an incarnation's processes print when they start."""
    if job.start_events:
        print_rank(
            job,
            0,
            wire.format_start(
                inc.start,
                inc.inc_id,
                pid=1000 + inc.number,
                host=host(job),
                rank=0,
                restart=inc.number,
                world_size=inc.ranks,
            ),
        )
    for rank in range(job.workers):
        print_rank(job, rank, f"[fake job] incarnation {inc.number} started\n")
