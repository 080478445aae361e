"""StickyFault in the state machine: a failure that comes back (pure, like the rest).

``scope: step``: from the trigger checkpoint on, every incarnation of the target rank dies
when it reports step ``atStep`` (the reporter's own doing, armed by the drill: its
``poisoned`` line is the last the process prints), as a bad sample or a bug at that step
kills every retry. Nothing else is touched, and the poison ends with the drill::

    WAITING_FOR_CHECKPOINT --trigger--> KILLING --armed--> FAULTED
    FAULTED --more deaths at the step than maxCrashLoop--> DONE (CRASH_LOOP, when proven)
    FAULTED --the job failed for good, or trained past the step--> DONE

The verdict is the ``sticky`` rules' (:mod:`~pytest_recoverygate.engine.rules.sticky`):
PASS when the job stopped retrying the step within ``maxCrashLoop`` incarnations (it gave
up with a non-zero exit, or went past the step); FAIL ``CRASH_LOOP`` with what the retries
burned (incarnations, restarts, seconds); a poison never reached, or a job that neither
dies again, fails nor trains on, is judged at the deadline.

``scope: checkpoint``: at the trigger the drill damages the files of the trigger
checkpoint under the job's folder (:meth:`StickyPhase.sticky_damaged`: that checkpoint is
no longer durable, so the expected resume is the one before it), then kills the target
as a KillWorker does; the recovery is judged by the ``kill`` rules, the rule
``damage_handled`` first (loaded the damaged state, no fallback, a crash loop on it). A
crash loop is proven, and judged, at the restart past ``maxCrashLoop``.

``scope: node``: at the trigger the target's node goes bad (the backend's doing: every job
process that starts there dies, or hangs, ``after`` seconds after it starts, the work
running there now at once) and the recovery is judged by the ``kill`` rules from that
moment, the rule ``bad_node_avoided`` first (:mod:`~pytest_recoverygate.engine.badnode`
keeps each placement on the node and the node leaving). Each hit starts the sustain
window over (training counts only once the last placement there died), a PASS waits for
the node to leave the job (or the job to end), and a placement that dies past
``maxCrashLoop`` FAILs ``BAD_NODE_REUSED`` at once::

    KILLING --the node went bad--> RECOVERING --a placement dies past maxCrashLoop--> DONE
    RECOVERING/VERIFYING --the node left, then the job trained the sustain window--> DONE
"""

from __future__ import annotations

import itertools

from pytest_recoverygate.engine import model
from pytest_recoverygate.engine.badnode import BadNodeRecord
from pytest_recoverygate.engine.recovery import KillRecord, restarts
from pytest_recoverygate.engine.reentry import ReentryPhase
from pytest_recoverygate.engine.rules import TABLE, run
from pytest_recoverygate.engine.rules.evidence import StickyEvidence
from pytest_recoverygate.engine.rules.sticky import gpu_hours
from pytest_recoverygate.engine.state import Action, Phase, _Armed
from pytest_recoverygate.engine.verdict import Recovery, combine

__all__ = ["StickyPhase"]


class StickyPhase(ReentryPhase):
    """The StickyFault part of the engine (see the module docstring)."""

    _sticky_armed_at: float | None = None
    _sticky_deaths: tuple[tuple[str, float], ...] = ()  # (incarnation, when), distinct
    _sticky_restarts = 0
    _sticky_ended: tuple[float, str, bool] | None = None  # (when, detail, succeeded)
    _sticky_past: tuple[int, float] | None = None  # the first step past the poisoned one
    _sticky_last: float | None = None  # the newest sign of life after a death
    _sticky_damage: tuple[int, tuple[str, ...], float] | None = None  # (step, files, when)

    # ------------------------------------------------------------------ scope: checkpoint

    def sticky_save_window(self, step: int) -> tuple[float, float] | None:
        """When checkpoint ``step``'s save wrote its files, by the job's lines: from its
        ``checkpoint_started`` (else the previous checkpoint's completion) to its
        ``checkpoint_completed``, never before the previous checkpoint completed (a line
        stamped early must not reach an older checkpoint's files); None when no
        completion of it was seen."""
        done = [c.time for c in self.ledger.checkpoints if c.step == step]
        if not done:
            return None
        save = self.ledger.saves.get(step)
        before = [c.time for c in self.ledger.checkpoints if c.step < step and c.time < done[-1]]
        floor = max(before) if before else self.started_at
        start = save.started if save is not None and save.started <= done[-1] else floor
        return max(start, floor), done[-1]

    def sticky_damaged(self, step: int, files: tuple[str, ...], at: float) -> None:
        """The drill damaged checkpoint ``step`` (each file as described): it is no
        longer durable; the recovery's expected resume is the checkpoint before it."""
        self._sticky_damage = (step, files, at)
        self.ledger.not_durable.add(step)
        self.ledger.damaged[step] = files
        self.note(at, "sticky", f"checkpoint {step} damaged: " + "; ".join(files))

    def _fault_details_at_kill(self, kill: KillRecord, armed: _Armed) -> None:
        super()._fault_details_at_kill(kill, armed)
        spec, damage = self.spec.sticky, self._sticky_damage
        if spec is not None and spec.scope == "node":
            kill.bad_node = BadNodeRecord(spec.mode, spec.after, kill.time)
        if spec is not None and damage is not None:
            kill.details["damage"] = {
                "kind": spec.damage,
                "step": damage[0],
                "files": list(damage[1]),
                "damagedSecondsBeforeKill": round(kill.time - damage[2], 6),
            }

    def _sticky_loops(self, kill: KillRecord) -> bool:
        """``scope: checkpoint``: a restart past ``maxCrashLoop`` with no replacement
        trained proves a crash loop on the damaged checkpoint (the machine judges now)."""
        spec = self.spec.sticky
        return (
            spec is not None
            and spec.scope == "checkpoint"
            and kill.window is None
            and restarts(self.ledger, kill) > spec.max_crash_loop
        )

    # ------------------------------------------------------------------ scope: node

    def _judge(self, now: float, *, final: bool = True) -> list[Action]:
        """Judge the kill under judgement (the state machine's own, :class:`DrillEngine`)."""
        raise NotImplementedError

    def _bad_node(self) -> tuple[KillRecord, BadNodeRecord] | None:
        """The kill under judgement and its bad node (``scope: node``), or None."""
        kill = self._kill
        if kill is None or kill.bad_node is None or not self.ledger.open:
            return None
        return kill, kill.bad_node

    def _bad_node_group(self, event: model.GroupEvent) -> list[Action] | None:
        """A placement on the bad node, a hit, or the node leaving; None: not for the bad
        node (or the normal path should see it too)."""
        found = self._bad_node()
        spec = self.spec.sticky
        if found is None or spec is None:
            return None
        kill, bad = found
        kind = event.kind
        if kind is model.GroupEventKind.BAD_NODE_PLACEMENT:
            bad.placed(event)
            return []
        if kind is model.GroupEventKind.BAD_NODE_HIT:
            bad.hit(event)
            kill.window = None  # the job trains on without the node only after this
            if bad.deaths > spec.max_crash_loop:
                return self._judge(event.timestamp, final=False)  # BAD_NODE_REUSED, now
            return []
        if kind is model.GroupEventKind.NODE_GONE:
            bad.gone(event)
            kill.window = None
        return None

    def _bad_node_start(
        self, past: tuple[int, float] | None, step: int, at: float
    ) -> tuple[int, float] | None:
        """Where the sustain window opens (``past``, the replacement's first step past its
        resume): with a bad node, no earlier than the first step after its last hit and
        its leaving; None: not yet."""
        found = self._bad_node()
        if found is None or past is None:
            return past
        floor = found[1].floor()
        if past[1] > floor:
            return past
        return (step, at) if at > floor else None

    def _bad_node_holds(self) -> bool:
        """A held sustain window waits while the bad node's agent is still in the job."""
        found = self._bad_node()
        return found is not None and found[1].left is None and found[0].job_ended is None

    # ------------------------------------------------------------------ scope: step

    @property
    def _poisoning(self) -> bool:
        spec = self.spec.sticky
        return (
            spec is not None
            and spec.scope == "step"
            and self.phase is Phase.FAULTED
            and self._sticky_armed_at is not None
        )

    def _sticky_armed(self, result: model.KillResult) -> list[Action] | None:
        """The poison is armed (StickyFault scope step); None for any other kill."""
        spec = self.spec.sticky
        if spec is None or spec.scope != "step" or result.outcome is not model.KillOutcome.KILLED:
            return None
        self._sticky_armed_at = result.timestamp
        self._armed = None
        self.note(
            result.timestamp,
            "sticky",
            result.detail or f"step {spec.at_step} is poisoned on rank {self.spec.target_rank}",
        )
        self._move(Phase.FAULTED)
        return []

    def _sticky_line(self, event: model.TrainingEvent) -> list[Action]:
        """Any rank's line while the poison is armed: a death, a sign of life, a step past."""
        spec = self.spec.sticky
        if not self._poisoning or spec is None or spec.at_step is None:
            return []
        at = event.received or event.timestamp
        kind = event.kind
        if kind is model.TrainingEventKind.POISONED and event.step == spec.at_step:
            if all(inc != event.incarnation for inc, _ in self._sticky_deaths):
                self._sticky_deaths = (*self._sticky_deaths, (event.incarnation, event.timestamp))
                self.note(
                    event.timestamp,
                    "sticky",
                    f"death {len(self._sticky_deaths)} at step {spec.at_step} "
                    f"(incarnation {event.incarnation})",
                )
            self._sticky_last = at
            return self._sticky_judge(at, final=False)
        if event.timestamp <= (self._sticky_armed_at or 0.0):
            return []
        self._sticky_last = at
        reporting = event.rank is None or event.rank == self.spec.reporting_rank
        if (
            kind is model.TrainingEventKind.PROGRESS
            and reporting
            and event.step is not None
            and event.step > spec.at_step
            and self._sticky_deaths
            and self._sticky_past is None
        ):
            self._sticky_past = (event.step, event.timestamp)
            return self._sticky_judge(at, final=True)
        return []

    def _sticky_group(self, event: model.GroupEvent) -> list[Action] | None:
        """A group change while the poison is armed, or about the bad node; None when
        neither (the normal path takes it)."""
        node = self._bad_node_group(event)
        if node is not None or not self._poisoning:
            return node
        self._sticky_last = event.timestamp
        if event.kind is model.GroupEventKind.RESTARTING:
            self._sticky_restarts += 1
        if event.kind in (model.GroupEventKind.JOB_FAILED, model.GroupEventKind.JOB_SUCCEEDED):
            ok = event.kind is model.GroupEventKind.JOB_SUCCEEDED
            self._sticky_ended = (event.timestamp, event.detail, ok)
            return self._sticky_judge(event.timestamp, final=True)
        return []

    def _sticky_tick(self, now: float) -> list[Action] | None:
        if not self._poisoning:
            return None
        deadline = self._sticky_deadline()
        if deadline is not None and now >= deadline:
            return self._sticky_judge(now, final=True)
        return []

    def _sticky_deadline(self) -> float | None:
        """No death by the checkpoint timeout; no sign of life for the recovery timeout
        after one."""
        armed = self._sticky_armed_at
        if armed is None:
            return None
        if not self._sticky_deaths:
            return armed + self.spec.checkpoint_timeout
        last = max(self._sticky_last or 0.0, self._sticky_deaths[-1][1])
        return last + self.spec.effective_recovery_timeout

    @property
    def deadline(self) -> float | None:
        if self._poisoning:
            return self._sticky_deadline()
        return ReentryPhase.deadline.fget(self)  # type: ignore[attr-defined,no-any-return]

    def status(self, now: float) -> str:
        spec = self.spec.sticky
        found = self._bad_node()
        if found is not None and spec is not None:
            bad = found[1]
            placed = len(bad.placements) + bad.dropped
            left = "; it left the job" if bad.left is not None else ""
            return (
                f"{bad.node or 'the node'} stays bad: {placed} placement(s) there, "
                f"{bad.deaths} {bad.verb} (maxCrashLoop {spec.max_crash_loop}){left}; "
                + super().status(now)
            )
        if not self._poisoning or spec is None:
            return super().status(now)
        deaths = len(self._sticky_deaths)
        return (
            f"step {spec.at_step} is poisoned on rank {self.spec.target_rank}; {deaths} "
            f"death(s) there so far (maxCrashLoop {spec.max_crash_loop})"
        )

    def _sticky_restart_count(self) -> int:
        """The restarts while poisoned: the backend's RESTARTING group events, or the rise
        of the launcher's restart count (TORCHELASTIC_RESTART_COUNT) in the start lines
        of the job's processes, whichever says more (a backend that follows the group
        only after a kill of its own sees no restart: Slurm's torchrun in the step)."""
        armed = self._sticky_armed_at
        ledger = self.ledger
        counts = [
            (inc.first_seen, inc.restart)
            for inc in itertools.chain(ledger.order, ledger.others.values())
            if inc.restart is not None and not ledger.is_child(inc)
        ]
        before = [n for seen, n in counts if armed is None or seen <= armed]
        after = [n for seen, n in counts if armed is not None and seen > armed]
        rise = max(after) - max(before) if after and before else 0
        return max(self._sticky_restarts, rise)

    def _sticky_judge(self, now: float, *, final: bool) -> list[Action]:
        spec = self.spec.sticky
        assert spec is not None
        restarts = self._sticky_restart_count()
        ev = StickyEvidence(
            self.spec,
            spec,
            self._sticky_armed_at or now,
            self._sticky_deaths,
            restarts,
            self._sticky_ended,
            self._sticky_past,
            now,
            final,
        )
        checks = run(TABLE, "sticky", ev)
        failed = [c for c in checks if c.passed is False]
        if not failed and not final:
            return []
        verdict, summary = combine(checks)
        deaths = [round(t - (self._sticky_armed_at or t), 6) for _, t in self._sticky_deaths]
        cost = gpu_hours(ev)
        self._recoveries.append(
            Recovery(
                index=1,
                fault=self.spec.fault,
                verdict=verdict,
                summary=summary,
                checks=tuple(checks),
                trigger_checkpoint=self.trigger_step,
                kill_time=self._sticky_armed_at,
                restarts=restarts,
                fault_details={
                    "sticky": {
                        "scope": spec.scope,
                        "atStep": spec.at_step,
                        "targetRank": self.spec.target_rank,
                        "maxCrashLoop": spec.max_crash_loop,
                        "deaths": len(self._sticky_deaths),
                        "deathSeconds": deaths,
                        "restarts": restarts,
                        "stepPast": None if self._sticky_past is None else self._sticky_past[0],
                        "jobEnded": None if self._sticky_ended is None else self._sticky_ended[1],
                        "gpuHours": None if cost is None else round(cost[0], 3),
                    }
                },
            )
        )
        return self._finish_overall(now)
