"""KillDuringRecovery in the state machine: a second kill inside the recovery of the first
(pure, like the rest).

The first kill is a KillWorker's. The second lands once the recovery it caused reaches
the phase the drill names, in the first sign of it the drill can see::

    startup          the backend saw the replacement's first process start (RESTARTING,
                     REPLACEMENT_PENDING), before it reported anything
    rendezvous       the backend saw the whole replacement group running
                     (REPLACEMENT_RUNNING): it is re-forming, nothing reported yet
    checkpointLoad   a replacement reported checkpoint_load_started (it is loading)
    firstInterval    the judged replacement reported its first step past its resume
                     (before its first new checkpoint completed)

The second target is ``secondTarget`` (default the first's rank), its *current*
instance: the replacement. A replacement not to be found yet (its process not started) is
looked for again at every look while the phase lasts. The recovery the second kill cut is
recorded as interrupted (never judged: it was cut on purpose); the second is judged by
the kill rules from the newest durable checkpoint, within ``maxRecoveryTime`` of the
second kill, plus :func:`~pytest_recoverygate.engine.rules.comeback.reentrant`: a job
the second failure leaves hung, crash-looping or needing a person FAILs
``RECOVERY_NOT_REENTRANT``, the phase named. A recovery that never showed the phase (a
job that reports no ``checkpoint_load_started``) is an ERROR saying what would show it.
"""

from __future__ import annotations

import dataclasses

from pytest_recoverygate.engine import model
from pytest_recoverygate.engine.faulted import FaultedPhase
from pytest_recoverygate.engine.records import Inc
from pytest_recoverygate.engine.recovery import KillRecord
from pytest_recoverygate.engine.state import Action, KillTarget, Phase, _Armed
from pytest_recoverygate.engine.verdict import Recovery, Verdict, format_seconds

__all__ = ["PHASE_SIGNS", "ReentryPhase"]

#: What shows each phase of a recovery, in words (messages, docs).
PHASE_SIGNS = {
    "startup": "the replacement's first process started (before it reported)",
    "rendezvous": "the whole replacement group was running (before it reported)",
    "checkpointLoad": "a replacement reported checkpoint_load_started",
    "firstInterval": "the replacement reported its first step past its resume",
}
_STARTUP = (model.GroupEventKind.RESTARTING, model.GroupEventKind.REPLACEMENT_PENDING)


class ReentryPhase(FaultedPhase):
    """The KillDuringRecovery part of the engine (see the module docstring)."""

    _second_owed_at: float | None = None  # the phase was reached then: the kill is owed
    _second_sent = False
    _second_tries = 0
    _sign: str | None = None  # what showed the phase
    _sign_inc: str | None = None  # the incarnation whose line showed it
    _first_kill_time: float | None = None

    @property
    def _reentry(self) -> str | None:
        """The phase a second kill lands in, while the first recovery is watched."""
        if self.spec.fault != "KillDuringRecovery" or self._second_sent:
            return None
        kill = self._kill
        if kill is None or kill.index != 1 or self.phase not in (Phase.RECOVERING, Phase.VERIFYING):
            return None
        return self.spec.recovery_phase

    def _reentry_group(self, event: model.GroupEvent) -> list[Action]:
        """A group change while the first recovery runs: the startup/rendezvous sign."""
        phase = self._reentry
        if phase is None:
            return []
        if (phase == "startup" and event.kind in _STARTUP) or (
            phase == "rendezvous" and event.kind is model.GroupEventKind.REPLACEMENT_RUNNING
        ):
            return self._second_due(event.timestamp, f"group: {event.kind.value}")
        return []

    def _reentry_line(self, inc: Inc | None, event: model.TrainingEvent) -> list[Action]:
        """A line (``inc``: the reporting rank's; None: another rank's) while the first
        recovery runs: the checkpointLoad/firstInterval sign."""
        phase, kill = self._reentry, self._kill
        if phase is None or kill is None:
            return []
        if self._second_owed_at is not None:
            return self._second_fire(event.received or event.timestamp)  # look again
        loading = event.kind is model.TrainingEventKind.CHECKPOINT_LOAD_STARTED
        target = self.spec.second_target if self.spec.second_target is not None else kill.rank
        # the target's own line where it reports its loads (every rank, by default)
        ranks = {i.rank for i in self.ledger.others.values()} | {i.rank for i in self.ledger.order}
        theirs = event.rank is None or target not in ranks or event.rank == target
        if phase == "checkpointLoad" and loading and theirs and event.timestamp > kill.time:
            sign = f"checkpoint_load_started({event.step})"
            return self._second_due(event.timestamp, sign, event.incarnation)
        if phase == "firstInterval" and kill.window is not None:
            return self._second_due(kill.window.start[1], f"first step {kill.window.start[0]}")
        return []

    def _second_due(self, at: float, sign: str, inc: str | None = None) -> list[Action]:
        kill = self._kill
        assert kill is not None
        if self._second_owed_at is None:
            self._second_owed_at = at
            self._sign, self._sign_inc = sign, inc
            kill.details["secondKillPhase"] = self.spec.recovery_phase
            kill.details["phaseSign"] = sign
            kill.details["phaseReachedSeconds"] = round(at - kill.time, 6)
            self.note(at, "note", f"the recovery reached its {self.spec.recovery_phase} phase "
                      f"({sign}); the second kill is due")  # fmt: skip
        return self._second_fire(at)

    def _second_fire(self, at: float) -> list[Action]:
        """Send the second kill (to the target's current instance)."""
        kill = self._kill
        assert kill is not None
        if self._second_owed_at is None or self.phase is Phase.KILLING:
            return []
        self._second_tries += 1
        rank = self.spec.second_target if self.spec.second_target is not None else kill.rank
        why = f"the {self.spec.recovery_phase} phase of recovery 1 ({kill.details['phaseSign']})"
        self._armed = _Armed(at, kill.step, at, rank, why)
        # the second kill: the runner takes the rank's current instance (the replacement)
        return [
            dataclasses.replace(a, index=kill.index + 1) if isinstance(a, KillTarget) else a
            for a in self._fire(at)
        ]

    def _reentry_retry(self, now: float) -> list[Action]:
        """At a look: a second kill owed but not landed (no replacement instance yet)."""
        if self._reentry is None or self._second_owed_at is None:
            return []
        return self._second_fire(now)

    def _reentry_kill_result(self, result: model.KillResult) -> list[Action] | None:
        """The second kill's result; None when it is not the second kill's."""
        if (
            self._second_owed_at is None
            or self._second_sent
            or self.spec.fault != "KillDuringRecovery"
        ):
            return None
        kill = self._kill
        assert kill is not None
        if result.outcome is model.KillOutcome.ALREADY_GONE:
            # The replacement's process is not there (yet): look again at the next input.
            self._armed = None
            self._move(Phase.RECOVERING)
            return []
        if result.outcome is not model.KillOutcome.KILLED:
            return None  # dry run, unconfirmed: as any kill
        self._second_sent = True
        self._first_kill_time = kill.time
        landed = result.timestamp - kill.time
        self._recoveries.append(
            Recovery(
                index=kill.index,
                fault=self.spec.fault,
                verdict=Verdict.INTERRUPTED,
                summary=(
                    f"interrupted by the second kill {format_seconds(landed)} after the first, "
                    f"in its {self.spec.recovery_phase} phase ({kill.details['phaseSign']}): "
                    "not judged"
                ),
                trigger_checkpoint=kill.step,
                kill_time=kill.time,
                restarts=kill.group_restarts,
                fault_details=dict(kill.details),
            )
        )
        return None  # its kill record is made as any kill's (the first recovery's lines old)

    def _fault_details_at_kill(self, kill: KillRecord, armed: _Armed) -> None:
        """The second kill's record says which phase it was aimed at, by which sign, and
        when after the first (the rule ``reentrant`` checks it landed inside the phase)."""
        super()._fault_details_at_kill(kill, armed)
        first = self._first_kill_time
        if self.spec.fault != "KillDuringRecovery" or not self._second_sent or first is None:
            return
        kill.details["secondKillPhase"] = self.spec.recovery_phase
        kill.details["phaseSign"] = self._sign
        kill.details["afterFirstKillSeconds"] = round(kill.time - first, 6)
        if self._second_owed_at is not None:
            kill.details["phaseReachedSeconds"] = round(self._second_owed_at - first, 6)
        if self._sign_inc is not None:
            kill.details["phaseIncarnation"] = self._sign_inc

    def _reentry_missed(self, now: float) -> list[Action] | None:
        """Judging the first recovery of a KillDuringRecovery that never reached its phase:
        an ERROR that says what would show it; None otherwise."""
        kill = self._kill
        if (
            self.spec.fault != "KillDuringRecovery"
            or kill is None
            or kill.index != 1
            or self._second_sent
        ):
            return None
        phase = self.spec.recovery_phase or "?"
        fix = {
            "checkpointLoad": "call reporter.checkpoint_load_started(step) before the load "
            "(a preset's or pattern's checkpointLoadStarted line for a job that prints it)",
            "firstInterval": "lengthen the run so the replacement trains past its resume",
        }.get(phase, "the backend saw no such group change; try checkpointLoad")
        tried = f" (the kill was tried {self._second_tries} time(s): no replacement instance)"
        return self._finish_error(
            now,
            f"the recovery never showed its {phase} phase ({PHASE_SIGNS.get(phase, phase)})"
            + (tried if self._second_tries else "")
            + f", so the second kill never landed: {fix}",
        )
