"""The fake backend: an in-memory simulated training job (``orchestrator: fake``).

It is a shipped adapter, not a test double: a new user runs a whole drill in seconds
with no infrastructure, and our own tests drive the engine and the runner through it on
a :class:`~pytest_recoverygate.orchestrators.base.SimulatedClock` (a drill over
simulated minutes takes milliseconds).

The simulated job: ``workers`` ranks train at ``steps_per_second``; rank 0 reports every
step and saves a checkpoint every ``checkpoint_every`` steps. When a worker is killed,
the group restarts after ``restart_delay`` and the new incarnation resumes according to
``resume``: ``latest`` (the last completed checkpoint), ``zero`` (from scratch),
``older`` (the checkpoint before the last one) or ``never`` (the job does not come back).
Events are generated lazily from the clock, so any clock works.

Faults for tests: ``raise_in`` maps a method name (``discover``, ``kill``,
``watch_group``, ``poll``, ``cleanup``) to an exception raised by that call, and
``kill_outcome`` forces what a kill reports; ``progress_before_step`` makes the job
report ``progress(step)`` before each step instead of after it (breaking the step
contract: a fresh start reports 0 first); ``start_events=False`` makes it print no start
lines (like a non-Python emitter) and ``loaded_events=False`` no ``checkpoint_loaded``
lines, so the drill infers the resume step from the replacement's first two lines.

What the simulated job prints (``job_output()``): rank 0's reporter lines for starts,
loads and checkpoints, and one line per rank for each kill and restart. ``output`` adds
text a worker printed after the kill, by label (``{"rank 1": "Traceback …"}``): how tests
give the fake job the output of a real failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, model_validator
from recoverygate import wire

from pytest_recoverygate.joboutput import JobOutput, OutputSplitter
from pytest_recoverygate.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEvent,
    TrainingEventKind,
    Worker,
    Workload,
)
from pytest_recoverygate.orchestrators.base import Backend
from pytest_recoverygate.schema import (
    MAX_STEP,
    InjectFailure,
    Section,
    WorkloadBase,
    duration,
    meta,
    refuse,
)

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.base import Clock

__all__ = [
    "BACKEND",
    "FakeEventSource",
    "FakeJobSpec",
    "FakeOrchestrator",
    "FakeWorkload",
]

ResumeMode = Literal["latest", "zero", "older", "never"]


# ------------------------------------------------------------------ the config section


class FakeJobSpec(Section):
    """The simulated training job of ``orchestrator: fake`` (the whole block is optional)."""

    workers: int = Field(
        default=2,
        ge=2,
        le=1024,
        json_schema_extra=meta("a whole number from 2 to 1024", "workers: 2"),
    )
    steps_per_second: float = Field(
        default=50.0,
        gt=0,
        le=1_000_000,
        allow_inf_nan=False,
        json_schema_extra=meta("a number above 0 and at most 1000000", "stepsPerSecond: 50"),
    )
    checkpoint_every: int = Field(
        default=20,
        ge=1,
        le=MAX_STEP,
        json_schema_extra=meta("a whole number >= 1 (steps)", "checkpointEvery: 20"),
    )
    restart_delay: Annotated[float, duration()] = Field(
        default=1.0, json_schema_extra=meta("a duration like 1s", "restartDelay: 1s")
    )
    resume: ResumeMode = Field(
        default="latest", json_schema_extra=meta("latest, zero, older or never", "resume: latest")
    )
    startup_delay: Annotated[float, duration()] = Field(
        default=0.0, json_schema_extra=meta("a duration like 0s", "startupDelay: 0s")
    )


class FakeWorkload(WorkloadBase):
    """An in-memory simulated job: try the whole tool with no infrastructure."""

    orchestrator: Literal["fake"] = Field(json_schema_extra=meta("fake", "orchestrator: fake"))
    fake: FakeJobSpec = Field(
        default_factory=FakeJobSpec,
        json_schema_extra=meta("a mapping of the fake job's settings", "fake: {workers: 2}"),
    )

    @model_validator(mode="after")
    def _reporting_rank_exists(self) -> FakeWorkload:
        self._rank_exists(self.reporting_rank, "reportingRank")
        return self

    def check_failure(self, failure: InjectFailure) -> None:
        self._rank_exists(failure.target_rank, "targetRank")

    def _rank_exists(self, rank: int, key: str) -> None:
        if rank >= self.fake.workers:
            raise refuse(
                f"rank {rank} does not exist in a job of {self.fake.workers} workers",
                f"a rank from 0 to {self.fake.workers - 1}",
                key=(key,),
                got=str(rank),
            )


# ------------------------------------------------------------------ the simulated job


@dataclass
class _Incarnation:
    number: int
    start: float
    resume_step: int
    first_step_at: float
    killed_at: float | None = None
    emitted: list[TrainingEvent] = field(default_factory=list)
    next_step: int = 0
    start_emitted: bool = False
    load_emitted: bool = False

    @property
    def inc_id(self) -> str:
        return f"fake-incarnation-{self.number}"


class FakeEventSource:
    """The simulated job's reporter lines, generated up to the clock's now."""

    def __init__(self, owner: FakeOrchestrator) -> None:
        self._owner = owner
        self.closed = False

    def poll(self) -> list[TrainingEvent]:
        self._owner._maybe_raise("poll")
        if self.closed:
            return []
        return self._owner._generate()

    @property
    def malformed_lines(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


class FakeOrchestrator:
    """A simulated distributed training job that a drill can kill."""

    name = "fake"

    def __init__(
        self,
        *,
        clock: Clock,
        workers: int = 2,
        steps_per_second: float = 50.0,
        checkpoint_every: int = 20,
        restart_delay: float = 1.0,
        resume: ResumeMode = "latest",
        startup_delay: float = 0.0,
        raise_in: dict[str, BaseException] | None = None,
        kill_outcome: KillOutcome | None = None,
        progress_before_step: bool = False,
        start_events: bool = True,
        loaded_events: bool = True,
        output: Mapping[str, str] | None = None,
    ) -> None:
        self.clock = clock
        self.workers = workers
        self.steps_per_second = steps_per_second
        self.checkpoint_every = checkpoint_every
        self.restart_delay = restart_delay
        self.resume = resume
        self.startup_delay = startup_delay
        self.raise_in = dict(raise_in or {})
        self.kill_outcome = kill_outcome
        self.progress_before_step = progress_before_step
        self.start_events = start_events
        self.loaded_events = loaded_events
        self.output = dict(output or {})
        self._printed = OutputSplitter(lambda line: None, default="rank 0")
        self.kills: list[tuple[Worker, bool]] = []  # (worker, dry_run) for every kill call
        self.cleanups = 0
        self._incarnations: list[_Incarnation] = []
        self._checkpoints: list[int] = []
        self._group_events: list[GroupEvent] = []
        self._source = FakeEventSource(self)
        self._running = False

    # ---------------------------------------------------------------- protocol

    def discover(self, deadline: float) -> Workload:
        self._maybe_raise("discover")
        if not self._running:
            self._start_incarnation(self.clock.now(), resume_step=0)
            self._running = True
        return self._workload()

    def kill(self, worker: Worker, *, dry_run: bool) -> KillResult:
        self._maybe_raise("kill")
        self.kills.append((worker, dry_run))
        now = self.clock.now()
        self._generate()
        current = self._current()
        alive = current is not None and current.killed_at is None
        if not alive or worker.instance_id not in {w.instance_id for w in self._workload().workers}:
            return KillResult(KillOutcome.ALREADY_GONE, now, f"{worker.instance_id} is not running")
        if self.kill_outcome is not None:
            return KillResult(self.kill_outcome, now, "forced by the fake backend")
        if dry_run:
            return KillResult(KillOutcome.DRY_RUN, now, f"would kill {worker.describe()}")
        assert current is not None
        current.killed_at = now
        self._after_kill(now, worker)
        return KillResult(KillOutcome.KILLED, now, f"killed {worker.describe()}")

    def watch_group(self) -> list[GroupEvent]:
        self._maybe_raise("watch_group")
        now = self.clock.now()
        due = [e for e in self._group_events if e.timestamp <= now]
        self._group_events = [e for e in self._group_events if e.timestamp > now]
        return due

    def events(self) -> FakeEventSource:
        return self._source

    def job_output(self) -> JobOutput:
        """What the simulated workers printed, per rank (see the module docstring)."""
        self._generate()
        return self._printed.output(note="the fake job's simulated output, per rank")

    def cleanup(self) -> None:
        self.cleanups += 1
        self._running = False
        self._source.close()
        self._maybe_raise("cleanup")

    # ---------------------------------------------------------------- simulation

    def _maybe_raise(self, where: str) -> None:
        error = self.raise_in.get(where)
        if error is not None:
            raise error

    def _current(self) -> _Incarnation | None:
        return self._incarnations[-1] if self._incarnations else None

    def _workload(self) -> Workload:
        current = self._current()
        number = current.number if current else 0
        workers = tuple(
            Worker(rank, f"fake-worker-{rank}", f"fake-{rank}-{number}", node="simulated")
            for rank in range(self.workers)
        )
        return Workload(job="fake-job", workers=workers)

    def _start_incarnation(self, at: float, resume_step: int) -> None:
        load = 0.05 if resume_step > 0 else 0.0
        self._incarnations.append(
            _Incarnation(
                number=len(self._incarnations),
                start=at,
                resume_step=resume_step,
                first_step_at=at + self.startup_delay + load,
                next_step=resume_step + 1,
            )
        )

    def _print(self, rank: int, text: str) -> None:
        self._printed.feed(text.encode("utf-8", "replace"), label=f"rank {rank}")

    def _after_kill(self, now: float, worker: Worker) -> None:
        self._print(
            worker.rank,
            f"[fake job] rank {worker.rank} ({worker.instance_id}) was killed by SIGKILL\n",
        )
        for label, text in self.output.items():
            self._printed.feed(text.encode("utf-8", "replace"), label=label)
        restart_at = now + self.restart_delay
        self._group_events += [
            GroupEvent(GroupEventKind.WORKER_GONE, now + 0.1, f"{worker.name} exited", worker),
            GroupEvent(GroupEventKind.RESTARTING, now + 0.15, "restarting the group", None, 1),
        ]
        if self.resume == "never":
            for rank in range(self.workers):
                self._print(rank, "[fake job] the group does not restart (resume: never)\n")
            return
        self._group_events.append(
            GroupEvent(GroupEventKind.REPLACEMENT_RUNNING, restart_at, "all ranks running")
        )
        done = self._checkpoints
        if self.resume == "latest":
            step = done[-1] if done else 0
        elif self.resume == "older":
            step = done[-2] if len(done) >= 2 else 0
        else:
            step = 0
        self._start_incarnation(restart_at, resume_step=step)

    def _generate(self) -> list[TrainingEvent]:
        now = self.clock.now()
        out: list[TrainingEvent] = []
        for inc in self._incarnations:
            out += self._generate_for(inc, now)
        out.sort(key=lambda e: e.timestamp)
        return out

    def _generate_for(self, inc: _Incarnation, now: float) -> list[TrainingEvent]:
        out: list[TrainingEvent] = []
        end = now if inc.killed_at is None else min(now, inc.killed_at)

        def event(kind: TrainingEventKind, at: float, step: int | None) -> TrainingEvent:
            return TrainingEvent(
                kind,
                at,
                inc.inc_id,
                step=step,
                received=now,
                rank=0,
                pid=1000 + inc.number,
                host="simulated",
                restart_count=inc.number,
            )

        if not inc.start_emitted and inc.start <= end:
            inc.start_emitted = True
            if self.start_events:
                out.append(event(TrainingEventKind.START, inc.start, None))
                self._print(
                    0,
                    wire.format_start(
                        inc.start,
                        inc.inc_id,
                        pid=1000 + inc.number,
                        host="simulated",
                        rank=0,
                        restart=inc.number,
                    ),
                )
            for rank in range(self.workers):
                self._print(rank, f"[fake job] incarnation {inc.number} started\n")
        load_at = inc.first_step_at - 0.01
        if inc.resume_step > 0 and not inc.load_emitted and load_at <= end:
            inc.load_emitted = True
            if self.loaded_events:
                out.append(event(TrainingEventKind.CHECKPOINT_LOADED, load_at, inc.resume_step))
                self._print(
                    0,
                    wire.format_step(
                        "checkpoint_loaded", load_at, inc.inc_id, inc.resume_step, rank=0
                    ),
                )
        while True:
            step = inc.next_step
            at = inc.first_step_at + (step - inc.resume_step) / self.steps_per_second
            if at > end:
                break
            reported = step - 1 if self.progress_before_step else step
            out.append(event(TrainingEventKind.PROGRESS, at, reported))
            if step % self.checkpoint_every == 0:
                out.append(event(TrainingEventKind.CHECKPOINT_COMPLETED, at + 1e-4, step))
                self._checkpoints.append(step)
                self._print(
                    0, wire.format_step("checkpoint_completed", at + 1e-4, inc.inc_id, step, rank=0)
                )
            inc.next_step += 1
        return out


def _create(workload: FakeWorkload, failure: InjectFailure, clock: Clock) -> FakeOrchestrator:
    spec = workload.fake
    return FakeOrchestrator(
        clock=clock,
        workers=spec.workers,
        steps_per_second=spec.steps_per_second,
        checkpoint_every=spec.checkpoint_every,
        restart_delay=spec.restart_delay,
        resume=spec.resume,
        startup_delay=spec.startup_delay,
    )


#: The fake backend: its job lives inside one orchestrator object, so no other drill can
#: reach it and it needs no drill lock (fake drills may run side by side in one process).
BACKEND: Backend[FakeWorkload] = Backend(
    name="fake",
    workload=FakeWorkload,
    create=_create,
    faults=frozenset({"KillWorker"}),
    lock_scope=lambda workload, target: None,
    summary="an in-memory simulated job, on any clock",
)
