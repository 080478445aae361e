"""The faults that hit a Slurm job, one function each: a signal to one rank by the
identity-checked kill step (with the SIGCONT and the Preempt's SIGKILL still owed), and
KillStep and Requeue on the controller, each sent at most once."""

from __future__ import annotations

import threading
from typing import Protocol

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, PermissionDeniedError
from pytest_recoverygate.orchestrators.slurm.commands import (
    JobGone,
    SlurmCommands,
    failed_destructive,
)
from pytest_recoverygate.orchestrators.slurm.discovery import INSTANCE_ID, training_steps
from pytest_recoverygate.orchestrators.slurm.nodes import signal_time
from pytest_recoverygate.orchestrators.slurm.parsing import (
    KILL_SCRIPT,
    KILL_SIGNALS,
    KILL_STEP_NAME,
    int_or_zero,
)
from pytest_recoverygate.registry.seams import Clock

__all__ = ["SIGNAL_OF", "RankSignals", "Send", "kill_job_level", "not_discovered", "signal"]

#: The signal of each fault that hits one rank through the kill step; the others
#: (KillStep, Requeue) act on the controller.
SIGNAL_OF = {
    "KillWorker": "KILL",
    "KillDuringCheckpoint": "KILL",
    "Preempt": "TERM",
    "HangWorker": "STOP",
    "KillDuringRecovery": "KILL",  # both kills; the second hits the replacement
    "StickyFault": "KILL",  # scope checkpoint: the kill after the damage
}


def not_discovered(now: float, worker: model.Worker) -> model.KillResult:
    """ALREADY_GONE for an instance id that is not one discovery issued."""
    return model.KillResult(
        model.KillOutcome.ALREADY_GONE,
        now,
        f"{worker.instance_id!r} is not a SLURM worker instance this drill "
        "discovered; nothing was touched",
    )


def signal(
    commands: SlurmCommands,
    worker: model.Worker,
    sig: str,
    *,
    dry_run: bool = False,
    destructive: bool = True,
) -> list[str]:
    """Run the kill step for ``worker`` (job, step, pid + start time from its instance
    id); its ``RGKILL`` answer as words (``killed TIME``, ``gone``, ``replaced START``,
    ``unlisted``: the pid is not one scontrol listpids lists for that step there, …)."""
    assert sig in KILL_SIGNALS
    match = INSTANCE_ID.fullmatch(worker.instance_id)
    assert match is not None
    out = commands.srun_on_node(
        match["job"],
        worker.node,
        KILL_STEP_NAME,
        KILL_SCRIPT,
        match["job"],
        match["step"],
        match["pid"],
        match["start"],
        "check" if dry_run else "kill",
        sig,
        destructive=destructive,
    )
    answer = next((line for line in out.splitlines() if line.startswith("RGKILL ")), "")
    return answer.split()[1:] if answer else ([out.strip()] if out.strip() else [])


class Send(Protocol):
    """:func:`signal` with the orchestrator's commands: the kill step for one worker."""

    def __call__(
        self, worker: model.Worker, sig: str, *, dry_run: bool = False, destructive: bool = True
    ) -> list[str]: ...


class RankSignals:
    """One signal per kill, to exactly one rank; the stops and escalations still owed.

    ``lock`` and ``stop`` are the orchestrator's: cleanup sets ``stop`` to end every wait
    for a grace period.
    """

    def __init__(
        self, send: Send, clock: Clock, *, lock: threading.Lock, stop: threading.Event
    ) -> None:
        self.send = send
        self.clock = clock
        self.lock = lock
        self.stop = stop
        self.stopped: dict[str, model.Worker] = {}  # SIGSTOPped by a HangWorker: continued first
        self.threads: list[threading.Thread] = []
        #: What each Preempt's escalation did (``kill -KILL …`` answered, or why not sent).
        self.escalations: list[str] = []

    def kill(self, worker: model.Worker, dry_run: bool, fault: model.Fault) -> model.KillResult:
        """One signal to one rank on its node, through the kill step, once.

        The instance id is the identity: job.step/pid@start, as discovery issued it.
        Details are for display only, so a stale Worker can never aim at a live pid.

        The kill step runs through ``run_destructive``: it is sent again only when it is
        certain it never started (no connection to slurmctld, no step created). Once it
        may have run -- a timeout, a lost answer, srun failing after the step started --
        its outcome is unknown, and asking again would find the victim gone and wrongly
        report "nothing was killed", so the result is UNCONFIRMED (the drill ends in ERROR).

        ``Preempt``: SIGTERM, then a second, identity-checked kill step SIGKILLs that same
        instance after the grace period if it still runs (:meth:`escalate_later`).
        ``HangWorker``: SIGSTOP, remembered *before* the step is sent, so cleanup always
        SIGCONTs it (identity-checked) whatever the answer was.
        """
        match = INSTANCE_ID.fullmatch(worker.instance_id)
        if match is None:
            return not_discovered(self.clock.now(), worker)
        details = dict(worker.details)
        details.update(match.groupdict())
        sig = SIGNAL_OF[fault.type]
        job_id, pid, start = details["job"], details["pid"], details["start"]
        target = f"{worker.describe()} (pid {pid} on {worker.node})"
        if not dry_run and sig == "STOP":
            with self.lock:
                self.stopped[worker.instance_id] = worker
        sent_at = self.clock.now()  # the signal lands no earlier than this
        try:
            verdict = self.send(worker, sig, dry_run=dry_run, destructive=not dry_run)
        except (JobGone, BackendError) as exc:
            return failed_destructive(
                self.clock.now(),
                exc,
                job_id,
                not_started=lambda e: (
                    f"the kill step for {target} never started ({e}); nothing was killed"
                ),
                unknown=lambda e: (
                    f"the kill step for {target} may have run, its outcome is unknown: {e}"
                ),
            )
        now = self.clock.now()
        what = verdict[0] if verdict else "no answer"
        if what == "killed":
            killed_at = signal_time(verdict, sent_at)
            detail = f"kill -{sig} {target}"
            if sig == "TERM":
                self.escalate_later(worker, fault.grace_period)
                detail += (
                    f"; SIGKILL after the {fault.grace_period:g} s grace period if that same "
                    f"instance (pid {pid}, start {start}) still runs"
                )
            elif sig == "STOP":
                detail += "; cleanup sends SIGCONT if that same instance is still there"
            return model.KillResult(model.KillOutcome.KILLED, killed_at, detail)
        if not dry_run and sig == "STOP":
            with self.lock:
                self.stopped.pop(worker.instance_id, None)  # never stopped: nothing to undo
        if what == "alive":
            return model.KillResult(
                model.KillOutcome.DRY_RUN, now, f"would kill -{sig} {target}; it is running"
            )
        if what in ("gone", "replaced"):
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                now,
                f"{target} no longer exists; nothing was killed",
            )
        if what == "unlisted":
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE,
                now,
                f"pid {pid} on {worker.node} is not one scontrol listpids lists for step "
                f"{job_id}.{details['step']} there; nothing was signalled",
            )
        return model.KillResult(
            model.KillOutcome.UNCONFIRMED, now, f"kill step answered {' '.join(verdict) or what!r}"
        )

    def escalate_later(self, worker: model.Worker, grace: float) -> None:
        """Preempt: SIGKILL that same instance after ``grace`` if it still runs.

        A second kill step, identity-checked by pid + start time on the node like the
        first: a replacement (the rank restarted, even on the same pid) is never hit.
        Cleanup stops the wait and joins the thread: a drill that ended before the grace
        period sends no SIGKILL (the job is the user's; its own scheduler would).
        """

        def escalate() -> None:
            if self.stop.wait(grace):
                self.escalations.append("not sent: the drill ended within the grace period")
                return
            try:
                verdict = self.send(worker, "KILL")
            except Exception as exc:  # recorded, never raised in a thread (JobGone: ended)
                self.escalations.append(f"kill -KILL {worker.instance_id} failed: {exc!r}")
                return
            what = " ".join(verdict) or "no answer"
            self.escalations.append(f"kill -KILL {worker.instance_id}: {what}")

        thread = threading.Thread(target=escalate, name="recoverygate-slurm-preempt", daemon=True)
        with self.lock:
            self.threads.append(thread)
        thread.start()

    def continue_all(self, job_id: str | None) -> list[str]:
        """SIGCONT what a HangWorker stopped, through the kill step, identity-checked like
        every signal: an instance that is gone (torchrun or Slurm killed it) or replaced is
        not touched. One that could not be continued is named, with the command to do it."""
        with self.lock:
            stopped, self.stopped = list(self.stopped.values()), {}
        stuck: list[str] = []
        for worker in stopped:
            try:
                answer = self.send(worker, "CONT", destructive=False)
            except JobGone:
                continue  # the job ended: Slurm killed its processes, nothing stays stopped
            except (BackendError, PermissionDeniedError) as exc:
                answer = [str(exc)]
            if answer[:1] not in (["killed"], ["gone"], ["replaced"]):
                pid = dict(worker.details).get("pid", "?")
                job = dict(worker.details).get("job", job_id)
                stuck.append(
                    f"{worker.describe()}: {' '.join(answer) or 'no answer'} (continue it: "
                    f"srun --jobid={job} --overlap -w {worker.node} kill -CONT {pid})"
                )
        return stuck

    def pending(self) -> list[threading.Thread]:
        """The escalation threads started so far (cleanup joins them)."""
        with self.lock:
            return list(self.threads)


def kill_job_level(
    commands: SlurmCommands,
    clock: Clock,
    worker: model.Worker,
    *,
    job_id: str,
    dry_run: bool,
    fault: str,
    step_name: str | None,
) -> model.KillResult:
    """``scancel --signal=KILL J.S`` or ``scontrol requeue J``, sent at most once.

    Both act on the controller; a timeout or a lost answer may come after they acted
    (a requeue re-sent after that would requeue the replacement run), so they go
    through ``run_destructive`` and any failure past "never sent" is UNCONFIRMED.
    """
    details = dict(worker.details)
    step = details.get("step", "")
    try:
        job = commands.show_job(job_id)
    except JobGone:
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE, clock.now(), f"job {job_id} is gone"
        )
    if job.restarts != int_or_zero(details.get("restarts", "0")) or job.state != "RUNNING":
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE,
            clock.now(),
            f"job {job_id} is no longer the run discovered "
            f"(state {job.state}, Restarts {job.restarts})",
        )
    if fault == "KillStep":
        args = ["scancel", "--signal=KILL", f"{job_id}.{step}"]
        if step not in {s.step for s in training_steps(commands, job_id, step_name)}:
            return model.KillResult(
                model.KillOutcome.ALREADY_GONE, clock.now(), f"step {job_id}.{step} ended"
            )
    else:
        args = ["scontrol", "requeue", job_id]
    if dry_run:
        return model.KillResult(
            model.KillOutcome.DRY_RUN, clock.now(), f"would run: {' '.join(args)}"
        )
    sent_at = clock.now()  # it acts no earlier than this
    try:
        commands.run_destructive(args)
    except (JobGone, BackendError) as exc:
        command = " ".join(args)
        return failed_destructive(
            clock.now(),
            exc,
            job_id,
            not_started=lambda e: f"{command} never reached slurmctld ({e}); nothing was done",
            unknown=lambda e: f"{command} failed; whether it acted is unknown: {e}",
        )
    return model.KillResult(model.KillOutcome.KILLED, sent_at, " ".join(args))
