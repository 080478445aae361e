"""The fake backend's replica groups: a simulated torchft job for ``recovery: live``.

Replica groups train together and commit each step; one is killed, restarted after
``restartDelay`` and heals from a peer (or a checkpoint, or from scratch: ``fake.heal``),
on any clock. Built by the fake backend's ``_create`` when ``fake.replicas`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_recoverygate.engine import model
from pytest_recoverygate.orchestrators.fake.job import SimulatedJob
from pytest_recoverygate.shared.joboutput import JobOutput, OutputSplitter

__all__ = ["FakeLiveOrchestrator"]


# ------------------------------------------------------------------ replica groups


@dataclass(slots=True)
class _LiveProc:
    """One incarnation of one replica group: the steps it commits, by formula."""

    replica: int
    number: int  # 0: the first of its group
    start: float
    killed_at: float | None = None
    heal: tuple[float, int] | None = None  # (when, step) of its load line
    heal_source: str | None = None
    heal_digest: str | None = None  # the digest of the state it applied (heal peer)
    served: tuple[float, int, str] | None = None  # (when, step, digest) of a state it sent
    served_sent: bool = False
    next_step: int = 1
    start_sent: bool = False
    heal_sent: bool = False

    @property
    def inc_id(self) -> str:
        return f"fake-replica-{self.replica}-{self.number}"


@dataclass(eq=False, kw_only=True)
class FakeLiveOrchestrator(SimulatedJob):
    """A simulated torchft job: replica groups training together, one killed and healed.

    Before the kill every group commits step n at ``t0 + n / steps_per_second``. After
    the kill of the target group at K (its last step s_K): the survivors commit s_K + 1
    at ``max(K + heartbeat_timeout, last + step)`` (or, with ``min_replicas`` more than
    the survivors, one step after the rejoin) and on each step after it; the replacement
    starts at ``K + restart_delay``, joins 0.2 s later and then heals by ``heal``.
    """

    replicas: int = 2
    min_replicas: int = 1
    heal: str = "peer"
    heartbeat_timeout: float = 2.0
    target_replica: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        self.dt = 1.0 / self.steps_per_second
        self.kills: list[tuple[model.Worker, bool]] = []
        self.cleanups = 0
        self._t0 = 0.0
        self._procs: list[_LiveProc] = []
        self._kill: tuple[float, int] | None = None  # (time, last step before it)
        self._resume_at = 0.0  # the survivors' first commit after the kill
        self._printed = OutputSplitter(lambda line: None, default="replica 0")
        self._running = False
        self._source = _LiveSource(self)

    # ---------------------------------------------------------------- protocol

    def discover(self, deadline: float) -> model.Workload:
        if not self._running:
            now = self.clock.now()
            self._t0 = now + self.startup_delay
            self._procs = [_LiveProc(r, 0, now) for r in range(self.replicas)]
            self._running = True
        return self._workload()

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault = model.KILL
    ) -> model.KillResult:
        self.kills.append((worker, dry_run))
        now = self.clock.now()
        self._generate()
        victim = self._current(self.target_replica)
        if victim is None or worker.instance_id not in {w.instance_id for w in self._workers()}:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE, now, f"{worker.instance_id} is not running"
            )
        if dry_run:
            return model.KillResult(
                model.KillOutcome.DRY_RUN, now, f"would kill {worker.describe()}"
            )
        if self._kill is not None:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE, now, "one kill per simulated live job"
            )
        victim.killed_at = now
        last = max(int((now - self._t0) / self.dt + 1e-9), 0)
        self._kill = (now, last)
        survivors = self.replicas - 1
        rejoin = now + self.restart_delay + 0.2
        if survivors >= self.min_replicas:
            self._resume_at = max(now + self.heartbeat_timeout, self._t0 + (last + 1) * self.dt)
        else:
            self._resume_at = rejoin + self.dt
        replacement = _LiveProc(self.target_replica, victim.number + 1, now + self.restart_delay)
        healed = self._survivor_step(rejoin)
        if self.heal in ("peer", "peer-unapplied"):
            replacement.heal, replacement.heal_source = (rejoin, healed), "peer"
            replacement.next_step = healed + 1
            sent = f"{healed:016x}"  # the survivors' state at the heal step, as a digest
            replacement.heal_digest = sent if self.heal == "peer" else f"{healed + 1:016x}"
            peer = self._current(0 if self.target_replica != 0 else 1)
            if peer is not None:
                peer.served = (rejoin, healed, sent)
        elif self.heal == "checkpoint":
            step = (last // self.checkpoint_every) * self.checkpoint_every
            replacement.heal, replacement.heal_source = (rejoin, step), None
            replacement.next_step = step + 1
        self._procs.append(replacement)
        self._printed.feed(
            f"[fake job] replica {self.target_replica} rank {worker.rank} was killed\n".encode(),
            label=f"replica {self.target_replica}",
        )
        self._group_events += [
            model.GroupEvent(
                model.GroupEventKind.WORKER_GONE, now + 0.1, f"{worker.name} exited", worker
            ),
            model.GroupEvent(
                model.GroupEventKind.RESTARTING, now + 0.15, "restarting the replica", None, 1
            ),
            model.GroupEvent(
                model.GroupEventKind.REPLACEMENT_RUNNING,
                now + self.restart_delay,
                "replica running",
            ),
        ]
        return model.KillResult(model.KillOutcome.KILLED, now, f"killed {worker.describe()}")

    def current_worker(self, rank: int) -> model.Worker | None:
        proc = self._current(self.target_replica)
        if proc is None or proc.start > self.clock.now():
            return None
        return next((w for w in self._workers() if w.rank == rank), None)

    def events(self) -> _LiveSource:
        return self._source

    def job_output(self) -> JobOutput:
        return self._printed.output(note="the fake live job's simulated output, per replica")

    def cleanup(self) -> None:
        self.cleanups += 1
        self._running = False
        self._source.closed = True

    # ---------------------------------------------------------------- simulation

    def _current(self, replica: int) -> _LiveProc | None:
        procs = [p for p in self._procs if p.replica == replica and p.killed_at is None]
        return procs[-1] if procs else None

    def _workers(self) -> list[model.Worker]:
        target = self._current(self.target_replica)
        number = target.number if target is not None else 0
        return [
            model.Worker(
                rank,
                f"fake-replica-{self.target_replica}-rank-{rank}",
                f"fake-{self.target_replica}-{rank}-{number}",
                node="simulated",
            )
            for rank in range(self.workers)
        ]

    def _workload(self) -> model.Workload:
        others = [
            model.Worker(
                rank, f"fake-replica-{r}-rank-{rank}", f"fake-{r}-{rank}-0", node="simulated"
            )
            for r in range(self.replicas)
            if r != self.target_replica
            for rank in range(self.workers)
        ]
        return model.Workload(
            job=f"fake-live-job ({self.replicas} replica groups)",
            workers=(*self._workers(), *others),
        )

    def _survivor_step(self, at: float) -> int:
        """The survivors' committed step at ``at`` (after the kill)."""
        assert self._kill is not None
        last = self._kill[1]
        if at < self._resume_at:
            return last
        return last + 1 + int((at - self._resume_at) / self.dt + 1e-9)

    def _time_of(self, proc: _LiveProc, step: int) -> float:
        kill = self._kill
        if proc.number == 0 and (kill is None or step <= kill[1]):
            return self._t0 + step * self.dt
        if proc.number > 0 and proc.heal_source != "peer" and proc.heal is None:
            return proc.start + 0.2 + step * self.dt  # from scratch: its own count
        if proc.number > 0 and proc.heal_source != "peer":
            assert proc.heal is not None
            return proc.heal[0] + (step - proc.heal[1]) * self.dt
        assert kill is not None
        return self._resume_at + (step - kill[1] - 1) * self.dt

    def _generate(self) -> list[model.TrainingEvent]:
        now = self.clock.now()
        out: list[model.TrainingEvent] = []
        for proc in self._procs:
            out += self._generate_for(proc, now)
        out.sort(key=lambda e: e.timestamp)
        return out

    def _generate_for(self, proc: _LiveProc, now: float) -> list[model.TrainingEvent]:
        end = now if proc.killed_at is None else min(now, proc.killed_at)
        out: list[model.TrainingEvent] = []

        def event(
            kind: model.TrainingEventKind,
            at: float,
            step: int | None,
            *,
            replica: int | None = None,
            source: str | None = None,
            peer: int | None = None,
            digest: str | None = None,
        ) -> None:
            out.append(
                model.TrainingEvent(
                    kind,
                    at,
                    proc.inc_id,
                    step=step,
                    received=now,
                    rank=0,
                    pid=2000 + 10 * proc.replica + proc.number,
                    host="simulated",
                    restart_count=proc.number,
                    replica=replica,
                    source=source,
                    peer=peer,
                    digest=digest,
                )
            )

        if not proc.start_sent and proc.start <= end:
            proc.start_sent = True
            event(model.TrainingEventKind.START, proc.start, None, replica=proc.replica)
        if proc.heal is not None and not proc.heal_sent and proc.heal[0] <= end:
            proc.heal_sent = True
            peer = 0 if proc.heal_source == "peer" else None
            event(
                model.TrainingEventKind.CHECKPOINT_LOADED,
                proc.heal[0],
                proc.heal[1],
                source=proc.heal_source,
                peer=peer,
                digest=proc.heal_digest,
            )
        if proc.served is not None and not proc.served_sent and proc.served[0] <= end:
            proc.served_sent = True
            event(
                model.TrainingEventKind.CHECKPOINT_COMPLETED,
                proc.served[0],
                proc.served[1],
                digest=proc.served[2],
            )
        while proc.start_sent:
            at = self._time_of(proc, proc.next_step)
            if at > end or at < proc.start:
                break
            event(model.TrainingEventKind.PROGRESS, at, proc.next_step)
            proc.next_step += 1
        return out


class _LiveSource:
    """The simulated live job's reporter lines, generated up to the clock's now."""

    def __init__(self, owner: FakeLiveOrchestrator) -> None:
        self._owner = owner
        self.closed = False

    def poll(self) -> list[model.TrainingEvent]:
        return [] if self.closed else self._owner._generate()

    @property
    def malformed_lines(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True
