"""Live recovery (``recovery: live``): judging a torchft-style recovery from the job's lines.

Pure, like the rest of the engine: events and the drill's clock go in, a judgement comes
out. In live mode the job is several replica groups training at once (each with its own
incarnations, told apart by the start line's ``replica``); the drill kills one rank of
the target replica; the survivors must keep committing steps, and a new instance of the
target replica must commit a step after healing its state from a peer.

The checks (the ``live`` rules of :data:`pytest_recoverygate.engine.rules.TABLE`, in
``engine/rules/live.py``; the record they read is ``engine/replicas.py``):

Each rule's condition is its docstring, listed in docs/verdict-rules.md (generated from
the table).

Heals that are not recoveries (torchft's initial sync at step 0, a replica joining late at
its first start, any heal before the kill) are recorded and never judged. Decided when
proven: a survivor's open gap longer than ``maxSurvivorStall`` is a FAIL at once, and so
is no rejoin by ``maxRejoinTime``; otherwise the judgement waits until every survivor
committed a step after the rejoin (its stall is known then) or the recovery deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_recoverygate.engine.model import LiveRecovery, ReplicaSteps
from pytest_recoverygate.engine.replicas import Heal, LiveEvidence, LiveSpec, Proc, ReplicaLog
from pytest_recoverygate.engine.rules import TABLE, run
from pytest_recoverygate.engine.verdict import Check, Verdict, combine, format_seconds

__all__ = ["LiveJudge", "LiveJudgement", "LiveSpec"]


@dataclass(frozen=True, slots=True)
class LiveJudgement:
    """A verdict of the live mode, with its checks and figures."""

    verdict: Verdict
    summary: str
    checks: tuple[Check, ...]
    figures: LiveRecovery


class LiveJudge(ReplicaLog):
    """The live mode's record of the job (:class:`ReplicaLog`) and its judgement of the
    one kill: the ``live`` rules of the table over its evidence."""

    def decide(self, now: float, *, final: bool) -> LiveJudgement | None:
        """The judgement once the evidence decides it (or ``final``), else None."""
        kill = self.kill_time
        assert kill is not None
        spec = self.spec
        survivors = [r for r in self.replicas() if r != self.target]
        rejoin = self.rejoin()
        rejoin_at = rejoin[1] if rejoin is not None else None
        stalls = {r: self.stall(r, rejoin_at, now) for r in survivors}
        limit = spec.max_survivor_stall
        stalled = limit is not None and any(v > limit for v, _ in stalls.values())
        late = rejoin is None and now >= kill + self.rejoin_limit
        closed = rejoin is not None and all(done for _, done in stalls.values())
        if not (final or stalled or late or closed):
            return None
        heal = self.heal(rejoin, survivors)
        return self._judge(LiveEvidence(self, now, survivors, rejoin, stalls, heal))

    def _judge(self, ev: LiveEvidence) -> LiveJudgement:
        checks = run(TABLE, "live", ev)
        figures = self._figures(ev.survivors, ev.rejoin, ev.stalls, ev.heal)
        verdict, summary = combine(
            checks,
            f"live recovery: the survivors kept training (longest stall "
            f"{format_seconds(figures.survivor_stall_seconds or 0.0)}); replica "
            f"{self.target} rejoined in {format_seconds(figures.rejoin_time_seconds or 0.0)}"
            f", healed from a peer at step {ev.heal.step if ev.heal is not None else '?'}",
        )
        return LiveJudgement(verdict, summary, tuple(checks), figures)

    def _figures(
        self,
        survivors: list[int],
        rejoin: tuple[Proc, float, int] | None,
        stalls: dict[int, tuple[float, bool]],
        heal: Heal,
    ) -> LiveRecovery:
        heal_step, heal_at = heal.step, heal.at
        kill = self.kill_time
        assert kill is not None
        rejoin_at = rejoin[1] if rejoin is not None else None
        replicas = []
        for r in self.replicas():
            commits = self.commits(r)
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
            made = [s for r in survivors for t, s in self.commits(r) if kill < t <= rejoin_at]
            steps = (max(made) - min(made) + 1) if made else 0
            lost_throughput = round(steps / world, 3) if world else None
        return LiveRecovery(
            target_replica=self.target,
            survivor_stall_seconds=round(stall, 6) if stall is not None else None,
            rejoin_time_seconds=round(rejoin_at - kill, 6) if rejoin_at is not None else None,
            rejoin_step=heal_step,
            rejoin_source=heal.source,
            rejoin_peer=heal.peer,
            survivors_kept_training=kept,
            replicas=tuple(replicas),
            phases=phases,
            lost_throughput_steps=lost_throughput,
        )
