"""Live recovery (``recovery: live``): judging a torchft-style recovery from the job's lines.

Pure, like the rest of the engine: events and the drill's clock go in, a judgement comes
out. In live mode the job is several replica groups training at once (each with its own
incarnations, told apart by the start line's ``replica``); the drill kills one rank of
the target replica; the survivors must keep committing steps, and a new instance of the
target replica must commit a step after healing its state from a peer.

The checks, as data (:data:`CHECKS`: name -> what it proves and the reason it fails with):

- ``target_killed``: no line of the killed replica's old incarnations is stamped after
  the kill (it died by the kill, not later);
- ``survivors_kept_training``: every surviving replica committed steps from the kill to
  the rejoin, its longest gap (the gaps spanning the kill and the rejoin included) within
  ``maxSurvivorStall``;
- ``rejoin_time``: a new instance of the target replica committed a step within
  ``maxRejoinTime`` of the kill;
- ``rejoin_source``: the replacement's state came from ``rejoinFrom`` (a heal line,
  ``checkpoint_loaded(source="peer")``, or a checkpoint load); a first committed step of
  1 with no load line is a start from scratch;
- ``heal_step``: it healed to a step at or after the survivors' step when it joined;
- ``lost_steps``: no committed step went backwards (``maxLostSteps``, 0 by default here);
- ``state_digest`` (``stateDigestMatches``): the healed replica's digest at its heal step
  (``checkpoint_loaded(step, source="peer", digest=...)``, the state it applied) equals a
  survivor's digest of the state it sent for that step (``checkpoint_completed(step,
  digest=...)``); a second heal line of the same step only adds its digest.

Heals that are not recoveries (torchft's initial sync at step 0, a replica joining late at
its first start, any heal before the kill) are recorded and never judged. Decided when
proven: a survivor's open gap longer than ``maxSurvivorStall`` is a FAIL at once, and so
is no rejoin by ``maxRejoinTime``; otherwise the judgement waits until every survivor
committed a step after the rejoin (its stall is known then) or the recovery deadline.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol

from pytest_recoverygate.engine.model import (
    LiveRecovery,
    ReplicaSteps,
    TrainingEvent,
    TrainingEventKind,
)
from pytest_recoverygate.engine.verdict import Check, FailureReason, Verdict, format_seconds


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


__all__ = ["CHECKS", "LiveJudge", "LiveJudgement", "LiveSpec"]

R = FailureReason

#: The live mode's checks: name -> (what passing proves, the reason a failure carries).
CHECKS: dict[str, tuple[str, FailureReason]] = {
    "target_killed": ("the target replica died by the kill", R.INCONCLUSIVE),
    "survivors_kept_training": (
        "every surviving replica kept committing steps within maxSurvivorStall",
        R.SURVIVORS_STALLED,
    ),
    "rejoin_time": (
        "a new instance of the target replica committed a step within maxRejoinTime",
        R.NEVER_REJOINED,
    ),
    "rejoin_source": ("the replacement's state came from rejoinFrom", R.REJOINED_FROM_SCRATCH),
    "heal_step": (
        "it healed to a step at or after the survivors' step when it joined",
        R.HEALED_TO_OLDER_STEP,
    ),
    "lost_steps": ("no committed step went backwards", R.LOST_TOO_MANY_STEPS),
    "state_digest": (
        "the healed replica's state digest at its heal step equals a survivor's there",
        R.STATE_DIFFERS,
    ),
}


@dataclass(slots=True)
class _Proc:
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


@dataclass(frozen=True, slots=True)
class LiveJudgement:
    """A verdict of the live mode, with its checks and figures."""

    verdict: Verdict
    summary: str
    checks: tuple[Check, ...]
    figures: LiveRecovery


class LiveJudge:
    """The live mode's record of the job and its judgement of the one kill."""

    def __init__(self, spec: LiveSpec) -> None:
        self.spec = spec
        self.procs: dict[str, _Proc] = {}
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
            proc = _Proc(event.incarnation, event.replica, received)
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
            source = event.source or "checkpoint"
            if event.digest is not None:
                proc.load_digests[event.step] = event.digest
            if any(load[1] == event.step and load[2] == source for load in proc.loads):
                return  # the same heal again, now with the applied state's digest
            proc.loads.append((event.timestamp, event.step, source, event.peer))
            where = f" from replica {event.peer}" if event.peer is not None else ""
            self.notes.append(
                (
                    event.timestamp,
                    f"replica {proc.replica} ({proc.inc}) loaded step {event.step} "
                    f"from {'a peer' if source == 'peer' else 'a checkpoint'}{where}",
                )
            )

    def killed(self, at: float) -> None:
        self.kill_time = at

    # ------------------------------------------------------------------ views

    def _born_after_kill(self, proc: _Proc) -> bool:
        kill = self.kill_time
        assert kill is not None
        born = proc.start_time if proc.start_time is not None else proc.first_seen
        return born >= kill

    def _old(self, proc: _Proc) -> bool:
        return not self._born_after_kill(proc)

    def replicas(self) -> list[int]:
        return sorted({p.replica for p in self.procs.values() if p.replica is not None})

    def _commits(self, replica: int, *, old_only: bool = False) -> list[tuple[float, int]]:
        out = [
            c
            for p in self.procs.values()
            if p.replica == replica and (not old_only or self._old(p))
            for c in p.commits
        ]
        out.sort()
        return out

    def _replacements(self) -> list[_Proc]:
        return [
            p for p in self.procs.values() if p.replica == self.target and self._born_after_kill(p)
        ]

    def _rejoin(self) -> tuple[_Proc, float, int] | None:
        """The replacement that committed first: (it, when, its first committed step)."""
        firsts = [(p.commits[0], p) for p in self._replacements() if p.commits]
        if not firsts:
            return None
        (at, step), proc = min(firsts, key=lambda item: item[0][0])
        return proc, at, step

    def _stall(self, replica: int, rejoin_at: float | None, now: float) -> tuple[float, bool]:
        """The replica's longest gap from the kill to the rejoin, and whether it is closed.

        An open gap (no commit after the rejoin yet, or no rejoin yet) counts up to ``now``.
        """
        kill = self.kill_time
        assert kill is not None
        times = [t for t, _ in self._commits(replica)]
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

    # ------------------------------------------------------------------ judging

    def decide(self, now: float, *, final: bool) -> LiveJudgement | None:
        """The judgement once the evidence decides it (or ``final``), else None."""
        kill = self.kill_time
        assert kill is not None
        spec = self.spec
        survivors = [r for r in self.replicas() if r != self.target]
        rejoin = self._rejoin()
        rejoin_at = rejoin[1] if rejoin is not None else None
        stalls = {r: self._stall(r, rejoin_at, now) for r in survivors}
        limit = spec.max_survivor_stall
        stalled = limit is not None and any(v > limit for v, _ in stalls.values())
        late = rejoin is None and now >= kill + self.rejoin_limit
        closed = rejoin is not None and all(done for _, done in stalls.values())
        if not (final or stalled or late or closed):
            return None
        return self._judge(now, survivors, rejoin, stalls)

    def _judge(
        self,
        now: float,
        survivors: list[int],
        rejoin: tuple[_Proc, float, int] | None,
        stalls: dict[int, tuple[float, bool]],
    ) -> LiveJudgement:
        kill = self.kill_time
        assert kill is not None
        spec = self.spec
        checks: list[Check] = []

        # target_killed
        victims = [p for p in self.procs.values() if p.replica == self.target and self._old(p)]
        late_lines = [p for p in victims if p.last_line > kill + 0.05]
        if not victims:
            checks.append(
                Check(
                    "target_killed",
                    None,
                    f"lines of replica {self.target} before the kill",
                    "none",
                    f"no line of replica {self.target} was seen before the kill, so the drill "
                    "cannot tell which process it killed: does its start line carry replica "
                    "(REPLICA_GROUP_ID or RECOVERYGATE_REPLICA)?",
                    R.INCONCLUSIVE,
                )
            )
        else:
            checks.append(
                Check(
                    "target_killed",
                    not late_lines,
                    "no line of the killed instance after the kill",
                    "none" if not late_lines else f"{len(late_lines)} incarnation(s) kept writing",
                    "the target replica died by the kill"
                    if not late_lines
                    else "the killed replica's old incarnation kept reporting after the kill: "
                    "the kill did not hit the process that reports",
                    None if not late_lines else R.INCONCLUSIVE,
                )
            )

        # survivors_kept_training
        stall_value = max((v for v, _ in stalls.values()), default=None)
        limit = spec.max_survivor_stall
        silent = [r for r in survivors if not any(t > kill for t, _ in self._commits(r))]
        kept_expected = f"<= {format_seconds(limit)}" if limit is not None else "training on"

        def kept_training(how: str) -> Check:
            return Check(
                "survivors_kept_training",
                True,
                kept_expected,
                format_seconds(stall_value or 0.0),
                f"the survivors kept training{how}; longest stall "
                f"{format_seconds(stall_value or 0)}",
            )

        if not survivors:
            checks.append(
                Check(
                    "survivors_kept_training",
                    None,
                    "committed steps from every surviving replica",
                    "no survivor reported a replica",
                    "no line of a replica other than the target was seen: every replica's "
                    "start line must carry replica (REPLICA_GROUP_ID)",
                    R.INCONCLUSIVE,
                )
            )
        elif limit is not None and stall_value is not None and stall_value > limit:
            worst = max(stalls, key=lambda r: stalls[r][0])
            restarted = [
                r
                for r in survivors
                if any(p.replica == r and self._born_after_kill(p) for p in self.procs.values())
            ]
            why = (
                f"replica(s) {restarted} restarted after the kill: a survivor crashed instead of "
                "training on (torchft's DDP comm hook does when the dead peer resets a "
                "connection inside the allreduce; use manager.allreduce on the gradients, as "
                "the torchft example does)"
                if restarted
                else "the survivors waited for the dead replica (min_replica_size > survivors?) "
                "instead of training on"
            )
            checks.append(
                Check(
                    "survivors_kept_training",
                    False,
                    f"<= {format_seconds(limit)}",
                    format_seconds(stall_value),
                    f"replica {worst} committed no step for {format_seconds(stall_value)} after "
                    f"the kill (maxSurvivorStall {format_seconds(limit)}): {why}",
                    R.SURVIVORS_STALLED,
                )
            )
        elif silent and all(not any(True for _ in self._commits(r)) for r in silent):
            checks.append(
                Check(
                    "survivors_kept_training",
                    None,
                    "committed steps from every surviving replica",
                    f"no committed-step line from replica(s) {silent}",
                    "the survivors reported no committed step at all: report them with "
                    "recoverygate.integrations.torchft.instrument(manager)",
                    R.INCONCLUSIVE,
                )
            )
        elif rejoin is None and not silent:
            checks.append(kept_training(" (no rejoin to wait for)"))
        elif rejoin is None or not all(done for _, done in stalls.values()):
            checks.append(
                Check(
                    "survivors_kept_training",
                    None,
                    kept_expected,
                    f">= {format_seconds(stall_value or 0.0)} so far",
                    "the survivors' stall is not closed: the replacement has not rejoined, or "
                    "a survivor committed nothing after the rejoin before the drill ended",
                    R.INCONCLUSIVE,
                )
            )
        else:
            checks.append(kept_training(""))

        # rejoin_time
        rejoin_seconds = rejoin[1] - kill if rejoin is not None else None
        if rejoin_seconds is None:
            proven = now >= kill + self.rejoin_limit
            replacements = self._replacements()
            seen = (
                f"{len(replacements)} new instance(s) started, none committed a step"
                if replacements
                else "no new instance of the replica reported"
            )
            checks.append(
                Check(
                    "rejoin_time",
                    False if proven else None,
                    f"<= {format_seconds(self.rejoin_limit)}",
                    f"none after {format_seconds(now - kill)}",
                    f"replica {self.target} never rejoined within "
                    f"{format_seconds(self.rejoin_limit)}: {seen}"
                    if proven
                    else f"replica {self.target} had not rejoined when the drill was decided, "
                    f"{format_seconds(now - kill)} after the kill: {seen}",
                    R.NEVER_REJOINED if proven else R.INCONCLUSIVE,
                )
            )
        else:
            ok = rejoin_seconds <= self.rejoin_limit
            checks.append(
                Check(
                    "rejoin_time",
                    ok,
                    f"<= {format_seconds(self.rejoin_limit)}",
                    format_seconds(rejoin_seconds),
                    f"the replacement committed its first step {format_seconds(rejoin_seconds)} "
                    "after the kill",
                    None if ok else R.NEVER_REJOINED,
                )
            )

        # rejoin_source and heal_step
        source: str | None = None
        heal_step: int | None = None
        peer: int | None = None
        heal_at: float | None = None
        survivors_step: int | None = None
        if rejoin is not None:
            proc, at, first = rejoin
            loads = [load for load in proc.loads if load[0] <= at]
            if loads:
                heal_at, heal_step, source, peer = loads[-1]
            elif first <= 1:
                source = "scratch"
            before_heal = heal_at if heal_at is not None else at
            # The quorum it joined: healed to S and first committed S + 1, the survivors'
            # commit of S + 1 is the same quorum's, whichever line was printed first (a
            # job that reports its heal after should_commit prints it after theirs).
            joined = first if heal_step is not None and first == heal_step + 1 else None
            steps = [
                s
                for r in survivors
                for t, s in self._commits(r)
                if t <= before_heal and s != joined
            ]
            survivors_step = max(steps) if steps else None
            wanted = spec.rejoin_from
            if source is None:
                checks.append(
                    Check(
                        "rejoin_source",
                        None,
                        wanted,
                        f"no load line; first committed step {first}",
                        "the replacement committed a step without a heal or load line: report "
                        "heals with recoverygate.integrations.torchft (or "
                        'checkpoint_loaded(step, source="peer"))',
                        R.INCONCLUSIVE,
                    )
                )
            else:
                ok = source == wanted
                reason = {
                    "scratch": R.REJOINED_FROM_SCRATCH,
                    "checkpoint": R.REJOINED_FROM_CHECKPOINT,
                    "peer": R.REJOINED_FROM_CHECKPOINT,  # wanted checkpoint, got a peer
                }[source]
                what = {
                    "scratch": f"started from scratch (first committed step {first}, no load line)",
                    "checkpoint": f"loaded checkpoint step {heal_step}",
                    "peer": f"healed from a peer at step {heal_step}",
                }[source]
                checks.append(
                    Check(
                        "rejoin_source",
                        ok,
                        wanted,
                        source,
                        f"the replacement {what}",
                        None if ok else reason,
                    )
                )
            if heal_step is not None:
                ok_step = survivors_step is None or heal_step >= survivors_step
                checks.append(
                    Check(
                        "heal_step",
                        ok_step if survivors_step is not None else None,
                        f">= {survivors_step}" if survivors_step is not None else "the survivors'",
                        heal_step,
                        f"it took state of step {heal_step}; the survivors were at step "
                        f"{survivors_step} when it joined"
                        + (
                            f" (it joined the quorum of step {joined} with them)"
                            if joined is not None and ok_step
                            else ""
                        )
                        if survivors_step is not None
                        else "no survivor step was reported before the heal",
                        None if ok_step else R.HEALED_TO_OLDER_STEP,
                    )
                )

        # lost_steps: the job's committed step never goes backwards
        lost: int | None = None
        if rejoin is not None:
            replacement, at, first = rejoin
            # the job's step when the replacement took its state (its heal, else its start)
            cutoff = heal_at
            if cutoff is None:
                born = replacement.start_time
                cutoff = born if born is not None else replacement.first_seen
            # A commit of the quorum it joined (its first step, right after its heal step)
            # is no step it lost, whenever its line was printed.
            joined_step = first if heal_step is not None and first == heal_step + 1 else None
            reference = [
                s
                for r in self.replicas()
                for t, s in self._commits(r, old_only=True)
                if t <= cutoff and s != joined_step
            ]
            if reference:
                lost = max(0, max(reference) - (first - 1))
            backwards = 0
            for r in survivors:
                steps = [s for _, s in self._commits(r)]
                for a, b in itertools.pairwise(steps):
                    backwards = max(backwards, a - b)
            lost = max(lost or 0, backwards)
            allowed = spec.max_lost_steps if spec.max_lost_steps is not None else 0
            checks.append(
                Check(
                    "lost_steps",
                    lost <= allowed,
                    f"<= {allowed}",
                    lost,
                    f"{lost} committed step(s) went backwards (the replacement's first committed "
                    f"step {first}; the job had reached step "
                    f"{max(reference) if reference else '?'})"
                    if lost
                    else "no committed step went backwards",
                    None if lost <= allowed else R.LOST_TOO_MANY_STEPS,
                )
            )

        if spec.state_digest_matches:
            checks.append(self._digest_check(survivors, rejoin, heal_step))

        figures = self._figures(survivors, rejoin, stalls, source, heal_step, peer, heal_at)
        failed = [c for c in checks if c.passed is False]
        undecided = [c for c in checks if c.passed is None]
        if failed:
            verdict = Verdict.FAIL
            summary = "; ".join(c.message for c in failed)
        elif undecided:
            verdict = Verdict.ERROR
            summary = "inconclusive: " + "; ".join(c.message for c in undecided)
        else:
            verdict = Verdict.PASS
            summary = (
                f"live recovery: the survivors kept training (longest stall "
                f"{format_seconds(figures.survivor_stall_seconds or 0.0)}); replica "
                f"{self.target} rejoined in {format_seconds(figures.rejoin_time_seconds or 0.0)}"
                f", healed from a peer at step {heal_step}"
            )
        return LiveJudgement(verdict, summary, tuple(checks), figures)

    def _digest_check(
        self, survivors: list[int], rejoin: tuple[_Proc, float, int] | None, heal_step: int | None
    ) -> Check:
        """``stateDigestMatches``: the healed replica's digest at its heal step (of the
        state it applied) against the survivors' digests of the state at that step."""
        wanted = "a survivor's digest at the heal step"
        if rejoin is None or heal_step is None:
            return Check(
                "state_digest",
                None,
                wanted,
                "no heal",
                "no heal of the replacement was seen, so there is no healed state to compare",
                R.INCONCLUSIVE,
            )
        healed = rejoin[0].load_digests.get(heal_step)
        theirs = {
            digest
            for p in self.procs.values()
            if p.replica in survivors
            for step, digest in p.served.items()
            if step == heal_step
        }
        if healed is None or not theirs:
            missing = "the healed replica's" if healed is None else "no survivor's"
            return Check(
                "state_digest",
                None,
                wanted,
                f"{missing} digest at step {heal_step}",
                f"{missing} state digest at heal step {heal_step} was reported: report heals "
                "with recoverygate.integrations.torchft (it sends both), or "
                "checkpoint_loaded(step, source='peer', digest=...) on the healed replica and "
                "checkpoint_completed(step, digest=...) on the survivor that sent the state",
                R.INCONCLUSIVE,
            )
        ok = healed in theirs
        return Check(
            "state_digest",
            ok,
            ", ".join(sorted(theirs)),
            healed,
            f"the healed replica's state at step {heal_step} is the survivors' (digest {healed})"
            if ok
            else f"the healed replica's state at step {heal_step} (digest {healed}) differs "
            f"from the state the survivors sent ({', '.join(sorted(theirs))}): the heal did not "
            "apply what it received (the job's load_state_dict?)",
            None if ok else R.STATE_DIFFERS,
        )

    def _figures(  # noqa: PLR0917 -- one private call site, the judgement's parts
        self,
        survivors: list[int],
        rejoin: tuple[_Proc, float, int] | None,
        stalls: dict[int, tuple[float, bool]],
        source: str | None,
        heal_step: int | None,
        peer: int | None,
        heal_at: float | None,
    ) -> LiveRecovery:
        kill = self.kill_time
        assert kill is not None
        rejoin_at = rejoin[1] if rejoin is not None else None
        replicas = []
        for r in self.replicas():
            commits = self._commits(r)
            before = [s for t, s in commits if t <= kill]
            at_rejoin = [s for t, s in commits if rejoin_at is None or t < rejoin_at]
            replicas.append(
                ReplicaSteps(
                    replica=r,
                    target=r == self.target,
                    before=before[-1] if before else None,
                    at_rejoin=at_rejoin[-1] if at_rejoin else None,
                    last=commits[-1][1] if commits else None,
                    stall_seconds=round(stalls[r][0], 6) if r in stalls else None,
                    incarnations=sum(1 for p in self.procs.values() if p.replica == r),
                    incs=tuple(
                        p.inc
                        for p in sorted(self.procs.values(), key=lambda p: p.first_seen)
                        if p.replica == r
                    ),
                )
            )
        stall = max((v for v, _ in stalls.values()), default=None)
        kept = None
        if self.spec.max_survivor_stall is not None and stall is not None:
            kept = stall <= self.spec.max_survivor_stall
        elif stall is not None and rejoin is not None:
            kept = all(done for _, done in stalls.values())
        replacement = rejoin[0] if rejoin is not None else None
        started = None
        if replacement is not None:
            born = replacement.start_time or replacement.first_seen
            started = round(born - kill, 6)
        phases: dict[str, float | None] = {
            "replica restarted": started,
            "healed": round(heal_at - kill, 6) if heal_at is not None else None,
            "first committed step": round(rejoin_at - kill, 6) if rejoin_at is not None else None,
        }
        lost_throughput = None
        if rejoin_at is not None and survivors:
            # while the world was smaller, each step carried fewer replicas' samples: the
            # missing replica's share of the steps the survivors made meanwhile
            world = len(self.replicas())
            made = [s for r in survivors for t, s in self._commits(r) if kill < t <= rejoin_at]
            steps = (max(made) - min(made) + 1) if made else 0
            lost_throughput = round(steps / world, 3) if world else None
        return LiveRecovery(
            target_replica=self.target,
            survivor_stall_seconds=round(stall, 6) if stall is not None else None,
            rejoin_time_seconds=round(rejoin_at - kill, 6) if rejoin_at is not None else None,
            rejoin_step=heal_step,
            rejoin_source=source,
            rejoin_peer=peer,
            survivors_kept_training=kept,
            replicas=tuple(replicas),
            phases=phases,
            lost_throughput_steps=lost_throughput,
        )
