"""The Slurm job watched after a kill: a thread polls the job and turns what it sees (the
rank gone, a requeue, new pids or a new step, the job's end), and the errors Slurm writes
into the output file, into group events."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError, PermissionDeniedError
from pytest_recoverygate.orchestrators.slurm.commands import JobGone, SlurmCommands
from pytest_recoverygate.orchestrators.slurm.discovery import JobSnapshot
from pytest_recoverygate.orchestrators.slurm.events import SlurmEventSource
from pytest_recoverygate.orchestrators.slurm.parsing import (
    FINAL_STATES,
    WAITING_STATES,
    JobInfo,
    int_or_none,
    parse_slurm_marker,
)
from pytest_recoverygate.registry.seams import Clock

__all__ = ["GroupWatch", "KillWatch", "Snapshotter", "look_for_replacement", "watch_once"]

#: The ranks of the job's running training step now (:func:`.discovery.snapshot_workers`).
Snapshotter = Callable[[JobInfo], JobSnapshot | None]


@dataclass(slots=True)
class KillWatch:
    """What the watcher follows after one kill: a new one per kill (``count: N``)."""

    killed: model.Worker
    time: float
    restarts: int  # the job's Restarts when it was hit
    group: dict[int, model.Worker] = field(default_factory=dict)  # the ranks it was hit among
    gone: bool = False
    restarting: bool = False
    pending_reported: bool = False
    replacement: model.Worker | None = None


class GroupWatch:
    """The group events of one drill: those pending, the watcher's error, the latest kill
    followed and every instance a kill reached.

    ``lock`` and ``stop`` are the orchestrator's (cleanup sets ``stop``).
    """

    def __init__(
        self,
        clock: Clock,
        *,
        lock: threading.Lock,
        stop: threading.Event,
        poll_interval: float,
    ) -> None:
        self.clock = clock
        self.lock = lock
        self.stop = stop
        self.poll_interval = poll_interval
        self.pending: list[model.GroupEvent] = []
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.current: KillWatch | None = None  # the latest kill, followed by the watcher
        self.hit: set[str] = set()  # every instance id a kill reached
        self.restarts = 0
        self.ended = False

    def drain(self) -> list[model.GroupEvent]:
        """The events since the last call; the watcher's error once none are left."""
        with self.lock:
            events, self.pending = self.pending, []
            error, self.error = self.error, None
        if error is not None and not events:
            raise error
        if error is not None:
            with self.lock:
                self.error = error
        return events

    def follow(
        self, killed: model.Worker, time: float, restarts: int, group: dict[int, model.Worker]
    ) -> None:
        """A kill landed: ``killed`` is never handed back, and the watcher follows it."""
        with self.lock:
            self.hit.add(killed.instance_id)
            self.current = KillWatch(killed=killed, time=time, restarts=restarts, group=group)

    def was_hit(self, worker: model.Worker | None) -> bool:
        """True for no worker, or an instance a kill already reached."""
        with self.lock:
            return worker is None or worker.instance_id in self.hit

    def emit(
        self,
        kind: model.GroupEventKind,
        detail: str,
        worker: model.Worker | None = None,
        restarts: int | None = None,
    ) -> None:
        event = model.GroupEvent(kind, self.clock.now(), detail, worker, restarts)
        with self.lock:
            self.pending.append(event)
        self.clock.wakeup()

    def mark_gone(self, watch: KillWatch) -> bool:
        """True for the first caller only: WORKER_GONE is reported once per kill."""
        with self.lock:
            first, watch.gone = not watch.gone, True
        return first

    def start(self, once: Callable[[], None]) -> None:
        """Start the watcher thread (once), calling ``once`` every poll interval."""
        if self.thread is None:
            self.thread = threading.Thread(
                target=self._loop, args=(once,), name="recoverygate-slurm-watch", daemon=True
            )
            self.thread.start()

    def _loop(self, once: Callable[[], None]) -> None:
        failures = 0
        while not self.stop.is_set() and not self.ended:
            try:
                once()
                failures = 0
            except (BackendError, PermissionDeniedError) as exc:
                failures += 1
                # A controller restart takes a few polls; only a lasting outage ends the drill.
                if failures * self.poll_interval >= 30 or isinstance(exc, PermissionDeniedError):
                    with self.lock:
                        self.error = exc
                    self.clock.wakeup()
                    return
            except Exception as exc:  # surfaced through watch_group, never lost in a thread
                with self.lock:
                    self.error = BackendError(f"the slurm watcher stopped: {exc!r}")
                self.clock.wakeup()
                return
            self.stop.wait(self.poll_interval)

    def on_output_line(self, line: bytes, received: float) -> None:
        """A line of the job's output file: Slurm reporting the rank's end is WORKER_GONE."""
        if b"error" not in line and b"srun:" not in line:
            return
        marker = parse_slurm_marker(line.decode("utf-8", "replace"))
        if marker is None:
            return
        with self.lock:
            watch = self.current
            if watch is None or received < watch.time or watch.gone:
                return
            watch.gone = True
        self.emit(model.GroupEventKind.WORKER_GONE, f"Slurm reported: {marker}", watch.killed)


def watch_once(
    group: GroupWatch,
    commands: SlurmCommands,
    job_id: str,
    events: SlurmEventSource,
    snapshot: Snapshotter,
) -> None:
    """One poll of the job: a requeue, its end, its pending, or the hit rank's replacement."""
    try:
        job = commands.show_job(job_id)
    except JobGone:
        group.ended = True
        group.emit(
            model.GroupEventKind.JOB_FAILED,
            f"job {job_id} is no longer known to slurmctld",
        )
        return
    with group.lock:
        watch = group.current
    if job.restarts > group.restarts:
        group.restarts = job.restarts
        if events.tail is not None:
            events.tail.restart()
        if watch is not None and group.mark_gone(watch):
            group.emit(
                model.GroupEventKind.WORKER_GONE, f"job {job.job_id} was requeued", watch.killed
            )
        if watch is not None and watch.replacement is None and not watch.restarting:
            watch.restarting = True
            group.emit(
                model.GroupEventKind.RESTARTING,
                f"job {job.job_id} was requeued (Restarts={job.restarts})",
                restarts=job.restarts,
            )
    if job.state in FINAL_STATES:
        group.ended = True
        if job.state == "COMPLETED" and (watch is None or watch.replacement is not None):
            # Training finished normally: a successful end the verdict is told of (a
            # recovery that ended inside its sustain window is judged on it).
            group.emit(model.GroupEventKind.JOB_SUCCEEDED, job.describe_end())
            return
        group.emit(model.GroupEventKind.JOB_FAILED, job.describe_end())
        return
    if watch is None or watch.replacement is not None:
        return
    if job.state in WAITING_STATES:
        if not watch.pending_reported and job.restarts > watch.restarts:
            watch.pending_reported = True
            group.emit(
                model.GroupEventKind.REPLACEMENT_PENDING,
                f"requeued job {job.job_id} is {job.state} (reason {job.reason})",
                restarts=job.restarts,
            )
        return
    if job.state != "RUNNING":
        return
    look_for_replacement(group, job, watch, snapshot)


def look_for_replacement(
    group: GroupWatch, job: JobInfo, watch: KillWatch, snapshot: Snapshotter
) -> None:
    """The hit rank gone (or another rank first), then its replacement and which of the
    three recovery paths brought it: torchrun, a new step, a requeue."""
    killed = watch.killed
    old = dict(killed.details)
    try:
        seen = snapshot(job)
    except DiscoveryError:
        return
    now = seen.workers if seen is not None else {}
    worker = now.get(killed.rank)
    if (
        worker is not None
        and worker.instance_id == killed.instance_id
        and job.restarts == watch.restarts
    ):
        # The hit instance is still there (a SIGSTOP, a SIGTERM in its grace period, a
        # kill not landed yet). The job noticing shows first as another rank going.
        other = next(
            (
                w
                for rank, w in sorted(watch.group.items())
                if rank != killed.rank and now.get(rank) != w
            ),
            None,
        )
        if other is not None and group.mark_gone(watch):
            group.emit(
                model.GroupEventKind.WORKER_GONE,
                f"rank {other.rank} (pid {dict(other.details).get('pid')}) is gone from "
                f"step {job.job_id}.{old.get('step')}; the rank hit is still there",
                other,
            )
        return
    if group.mark_gone(watch):
        where = (
            f"rank {killed.rank} (pid {old.get('pid')}) is gone from step "
            f"{job.job_id}.{old.get('step')}"
        )
        group.emit(model.GroupEventKind.WORKER_GONE, where, killed)
    if worker is None or seen is None:
        return
    new = dict(worker.details)
    if job.restarts > watch.restarts:
        path = f"requeued job {job.job_id} runs again (Restarts={job.restarts}, step {seen.step})"
        count: int | None = job.restarts
    elif seen.step == old.get("step"):
        count = int_or_none(new.get("torchelastic_restart_count", "-"))
        path = f"torchrun restarted the workers inside step {job.job_id}.{seen.step}"
        if count is not None:
            path += f" (TORCHELASTIC_RESTART_COUNT={count})"
    else:
        path = f"a new step {job.job_id}.{seen.step} started in the same allocation"
        count = None
    if not watch.restarting:
        watch.restarting = True
        group.emit(model.GroupEventKind.RESTARTING, path, restarts=count)
    watch.replacement = worker
    group.emit(
        model.GroupEventKind.REPLACEMENT_RUNNING, f"{path}: {worker.describe()}", worker, count
    )
