"""The replica groups of a live recovery (``recovery: live``), as the job's lines show them.

Pure: :class:`ReplicaLog` records each incarnation (process) of each replica group — its
committed steps, its heals and loads, the digests of the states it sent and applied —
and answers what the live rules ask of it (each replica's commits, the replacements of
the target, the rejoin, a survivor's stall). :class:`LiveEvidence` is the evidence of
one judgement of the kill, read once for every rule of scope ``live``
(``engine.rules.live``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pytest_recoverygate.engine.model import TrainingEvent, TrainingEventKind

__all__ = ["Heal", "LiveEvidence", "LiveSpec", "Proc", "ReplicaLog"]


class LiveSpec(Protocol):
    """What the live judgement reads of the engine's ``DrillSpec`` (a layer above)."""

    @property
    def max_recovery_time(self) -> float: ...
    @property
    def max_lost_steps(self) -> int | None: ...
    @property
    def target_replica(self) -> int | None: ...
    @property
    def max_survivor_stall(self) -> float | None: ...
    @property
    def max_rejoin_time(self) -> float | None: ...
    @property
    def rejoin_from(self) -> str: ...
    @property
    def state_digest_matches(self) -> bool: ...


@dataclass(slots=True)
class Proc:
    """One incarnation (process) of one replica group."""

    inc: str
    replica: int | None
    first_seen: float
    start_time: float | None = None
    commits: list[tuple[float, int]] = field(default_factory=list)  # (time, step)
    loads: list[tuple[float, int, str, int | None]] = field(default_factory=list)
    load_digests: dict[int, str] = field(default_factory=dict)  # step -> its newest digest
    served: dict[int, str] = field(default_factory=dict)  # step -> digest of the state sent
    last_line: float = 0.0


class ReplicaLog:
    """Every replica group's incarnations, and the views the live rules read."""

    def __init__(self, spec: LiveSpec) -> None:
        self.spec = spec
        self.procs: dict[str, Proc] = {}
        self.kill_time: float | None = None
        self.notes: list[tuple[float, str]] = []  # heals and firsts worth a timeline line

    # ------------------------------------------------------------------ inputs

    @property
    def target(self) -> int:
        return self.spec.target_replica if self.spec.target_replica is not None else 0

    @property
    def rejoin_limit(self) -> float:
        limit = self.spec.max_rejoin_time
        return limit if limit is not None else self.spec.max_recovery_time

    def target_committed(self) -> bool:
        """Whether the target replica committed a step (it is in the quorum)."""
        return any(p.commits for p in self.procs.values() if p.replica == self.target)

    def max_step(self) -> int | None:
        """The highest committed step any replica reported."""
        steps = [p.commits[-1][1] for p in self.procs.values() if p.commits]
        return max(steps) if steps else None

    def on_event(self, event: TrainingEvent, received: float) -> None:
        proc = self.procs.get(event.incarnation)
        if proc is None:
            proc = Proc(event.incarnation, event.replica, received)
            self.procs[event.incarnation] = proc
        if event.replica is not None:
            proc.replica = event.replica
        proc.last_line = max(proc.last_line, event.timestamp)
        if event.step is None:
            if event.kind is TrainingEventKind.START:
                proc.start_time = event.timestamp
            return
        if event.kind is TrainingEventKind.PROGRESS:
            proc.commits.append((event.timestamp, event.step))
        elif event.kind is TrainingEventKind.CHECKPOINT_COMPLETED and event.digest is not None:
            proc.served[event.step] = event.digest  # torchft: the state sent to a healing peer
        elif event.kind is TrainingEventKind.CHECKPOINT_LOADED:
            self._loaded(proc, event, event.step)

    def _loaded(self, proc: Proc, event: TrainingEvent, step: int) -> None:
        source = event.source or "checkpoint"
        if event.digest is not None:
            proc.load_digests[step] = event.digest
        if any(load[1] == step and load[2] == source for load in proc.loads):
            return  # the same heal again, now with the applied state's digest
        proc.loads.append((event.timestamp, step, source, event.peer))
        where = f" from replica {event.peer}" if event.peer is not None else ""
        self.notes.append(
            (
                event.timestamp,
                f"replica {proc.replica} ({proc.inc}) loaded step {step} "
                f"from {'a peer' if source == 'peer' else 'a checkpoint'}{where}",
            )
        )

    def killed(self, at: float) -> None:
        self.kill_time = at

    # ------------------------------------------------------------------ views

    def born_after_kill(self, proc: Proc) -> bool:
        kill = self.kill_time
        assert kill is not None
        born = proc.start_time if proc.start_time is not None else proc.first_seen
        return born >= kill

    def old(self, proc: Proc) -> bool:
        return not self.born_after_kill(proc)

    def replicas(self) -> list[int]:
        return sorted({p.replica for p in self.procs.values() if p.replica is not None})

    def commits(self, replica: int, *, old_only: bool = False) -> list[tuple[float, int]]:
        out = [
            c
            for p in self.procs.values()
            if p.replica == replica and (not old_only or self.old(p))
            for c in p.commits
        ]
        out.sort()
        return out

    def replacements(self) -> list[Proc]:
        return [
            p for p in self.procs.values() if p.replica == self.target and self.born_after_kill(p)
        ]

    def rejoin(self) -> tuple[Proc, float, int] | None:
        """The replacement that committed first: (it, when, its first committed step)."""
        firsts = [(p.commits[0], p) for p in self.replacements() if p.commits]
        if not firsts:
            return None
        (at, step), proc = min(firsts, key=lambda item: item[0][0])
        return proc, at, step

    def stall(self, replica: int, rejoin_at: float | None, now: float) -> tuple[float, bool]:
        """The replica's longest gap from the kill to the rejoin, and whether it is closed.

        An open gap (no commit after the rejoin yet, or no rejoin yet) counts up to ``now``.
        """
        kill = self.kill_time
        assert kill is not None
        times = [t for t, _ in self.commits(replica)]
        before = [t for t in times if t <= kill]
        after = [t for t in times if t > kill]
        previous = before[-1] if before else kill
        worst = 0.0
        for t in after:
            worst = max(worst, t - previous)
            previous = t
            if rejoin_at is not None and t >= rejoin_at:
                return worst, True
        return max(worst, now - previous), False

    def heal(self, rejoin: tuple[Proc, float, int] | None, survivors: list[int]) -> Heal:
        """How the replacement that rejoined took its state (see :class:`Heal`)."""
        if rejoin is None:
            return Heal()
        proc, at, first = rejoin
        source: str | None = None
        step: int | None = None
        peer: int | None = None
        heal_at: float | None = None
        loads = [load for load in proc.loads if load[0] <= at]
        if loads:
            heal_at, step, source, peer = loads[-1]
        elif first <= 1:
            source = "scratch"
        before_heal = heal_at if heal_at is not None else at
        # The quorum it joined: healed to S and first committed S + 1, the survivors'
        # commit of S + 1 is the same quorum's, whichever line was printed first (a
        # job that reports its heal after should_commit prints it after theirs).
        joined = first if step is not None and first == step + 1 else None
        steps = [
            s for r in survivors for t, s in self.commits(r) if t <= before_heal and s != joined
        ]
        return Heal(source, step, peer, heal_at, max(steps) if steps else None, joined)


@dataclass(frozen=True, slots=True)
class Heal:
    """How the replacement took its state before its first committed step: ``source``
    (``peer``, ``checkpoint``, ``scratch`` or None: unknown), the ``step`` and ``peer`` of
    its last heal or load line, when (``at``), the survivors' newest committed step by
    then (``survivors_step``), and ``joined``: the step of the quorum it joined when it
    healed to S and first committed S + 1 (S + 1; None otherwise), whose survivor commits
    are the same quorum's, not steps the survivors held before it (excluded from
    ``survivors_step``)."""

    source: str | None = None
    step: int | None = None
    peer: int | None = None
    at: float | None = None
    survivors_step: int | None = None
    joined: int | None = None


@dataclass(frozen=True, slots=True)
class LiveEvidence:
    """The evidence of one judgement of a live recovery: the replica log, the drill's
    clock, the surviving replicas, the rejoin (the replacement that committed first, when,
    its first step), each survivor's stall (seconds, closed) and the heal."""

    log: ReplicaLog
    now: float
    survivors: list[int]
    rejoin: tuple[Proc, float, int] | None
    stalls: dict[int, tuple[float, bool]]
    heal: Heal

    @property
    def kill(self) -> float:
        kill = self.log.kill_time
        assert kill is not None
        return kill

    @property
    def spec(self) -> LiveSpec:
        return self.log.spec
