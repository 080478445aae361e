"""Running the Slurm client commands: a timeout, a clean environment, one retry policy.

:meth:`SlurmCommands.run` is for commands that only read: a transient controller error
(a socket timeout, slurmctld restarting) is retried with
:func:`~pytest_recoverygate.shared.retry.retry_read`.
:meth:`SlurmCommands.run_destructive` is for commands that act (``scontrol requeue``,
``scancel``, the kill step): sent again only while it is certain they never started
(:class:`CommandNotStarted`), through :func:`~pytest_recoverygate.shared.retry.send_destructive`;
a timeout or any failure after that is :class:`CommandOutcomeUnknown`. A missing binary,
a missing ``SLURM_CONF`` or an unreachable controller is a :class:`BackendError` that says
what to fix. No command goes through a shell with user-provided text.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pytest_recoverygate.engine.model import KillOutcome, KillResult
from pytest_recoverygate.errors import BackendError, DiscoveryError, PermissionDeniedError
from pytest_recoverygate.orchestrators.slurm.parsing import (
    SQUEUE_FIELDS,
    JobInfo,
    StepInfo,
    parse_scontrol_records,
    parse_squeue_rows,
)
from pytest_recoverygate.shared.retry import RetryPolicy, retry_read, send_destructive

__all__ = [
    "RETRY",
    "CommandNotStarted",
    "CommandOutcomeUnknown",
    "JobGone",
    "SlurmCommands",
    "failed_destructive",
]

#: Retries of the Slurm clients: a controller restart takes a few seconds.
RETRY = RetryPolicy(attempts=4, base=0.5, cap=4.0)

TRANSIENT_ERRORS = (
    "Socket timed out",
    "Unable to contact slurm controller",
    "Zero Bytes were transmitted or received",
    "Connection refused",
    "Resource temporarily unavailable",
    "Transport endpoint is not connected",
)
#: Failures that prove a command never reached slurmctld (the connection itself failed):
#: only these allow sending a command that acts once more.
NOT_SENT_ERRORS = ("Connection refused", "connect failure")
#: srun refused to create its step: nothing ran on any node (only with no output at all).
STEP_NOT_CREATED_ERRORS = ("Unable to create step",)
PERMISSION_ERRORS = ("Access/permission denied", "Permission denied", "Invalid user")
MISSING_JOB_ERRORS = ("Invalid job id specified", "does not exist")


class _Transient(Exception):
    """A controller hiccup worth retrying for a read-only command (socket timeout, restart).

    ``sent`` is False only when the failure proves the command never reached slurmctld
    (the connection itself was refused); a timeout or a lost answer may have acted.
    """

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class JobGone(Exception):
    """slurmctld no longer knows the job (finished longer than MinJobAge ago, or a typo)."""


class CommandNotStarted(BackendError):
    """A command certainly did nothing (no connection to slurmctld, srun made no step)."""


class CommandOutcomeUnknown(BackendError):
    """A command that acts failed after it may have acted; it must not be sent again."""


def failed_destructive(
    now: float,
    exc: Exception,
    job_id: str,
    *,
    not_started: Callable[[Exception], str],
    unknown: Callable[[Exception], str],
) -> KillResult:
    """What a destructive command that raised means: the job is gone, the command
    certainly never started, or whether it acted is unknown (UNCONFIRMED either way,
    since only the first is proof that nothing else was hit)."""
    if isinstance(exc, JobGone):
        return KillResult(KillOutcome.ALREADY_GONE, now, f"job {job_id} is gone")
    if isinstance(exc, CommandNotStarted):
        return KillResult(KillOutcome.UNCONFIRMED, now, not_started(exc))
    return KillResult(KillOutcome.UNCONFIRMED, now, unknown(exc))


class SlurmCommands:
    """Runs the Slurm clients with a timeout, a clean environment and transient retries.

    :meth:`run` is for commands that only read: a transient failure is retried.
    :meth:`run_destructive` is for commands that act: retried only while it is certain
    the command never started, never after it may have acted.
    """

    def __init__(
        self,
        *,
        slurm_conf: str | None = None,
        timeout: float = 20.0,
        retry: RetryPolicy = RETRY,
        env: Mapping[str, str] | None = None,
    ) -> None:
        base = dict(os.environ if env is None else env)
        # Inside an allocation srun would inherit SLURM_JOB_ID & co. and target the wrong
        # job; the probe and kill steps name their job explicitly. A job the drill submits
        # (sbatch --export=ALL) never inherits the reporter's parent incarnation from a
        # drill process that loaded the reporter: its workers are nobody's children.
        clean = {
            k: v
            for k, v in base.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))
            and k != "RECOVERYGATE_PARENT_INC"
        }
        conf = slurm_conf or base.get("SLURM_CONF")
        if conf:
            clean["SLURM_CONF"] = conf
        self.slurm_conf = conf
        self.env = clean
        self.timeout = timeout
        #: How often and how patiently to retry (tests shrink its waits).
        self.retry = retry

    def check_setup(self) -> None:
        """Fail early and clearly when the clients or the configuration are missing."""
        for binary in ("squeue", "scontrol", "srun", "scancel"):
            if shutil.which(binary, path=self.env.get("PATH")) is None:
                raise BackendError(
                    f"the Slurm client '{binary}' is not on PATH; run RecoveryGate on a login "
                    "node, or install slurm-client (Debian/Ubuntu: apt-get install slurm-client)"
                )
        if self.slurm_conf:
            if not Path(self.slurm_conf).is_file():
                raise BackendError(
                    f"SLURM_CONF={self.slurm_conf} does not exist; point SLURM_CONF (or the "
                    "backend's slurm_conf) at the cluster's slurm.conf"
                )
            return
        defaults = (
            "/etc/slurm/slurm.conf",
            "/etc/slurm-llnl/slurm.conf",
            "/run/slurm/conf/slurm.conf",
        )
        if not any(Path(p).is_file() for p in defaults):
            raise BackendError(
                "no Slurm configuration: SLURM_CONF is not set and none of "
                f"{', '.join(defaults)} exists; export SLURM_CONF=/path/to/slurm.conf"
            )

    def run(
        self,
        args: Sequence[str],
        *,
        timeout: float | None = None,
        retry: bool = True,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Run one client command and return its stdout; raise JobGone / BackendError.
        ``cwd`` and ``env`` (instead of the clean environment) are sbatch's, for a job
        the drill submits.

        With ``retry=False`` the command runs exactly once, and a transient failure says
        whether the command may have acted: :class:`CommandNotStarted` (the connection to
        slurmctld failed) or :class:`CommandOutcomeUnknown` (it timed out, or the answer
        was lost after the request went out).
        """

        def once() -> str:
            return self._run_once(args, timeout or self.timeout, cwd=cwd, env=env)

        if not retry:
            try:
                return once()
            except _Transient as exc:
                what = f"'{' '.join(args[:3])}' failed: {exc}"
                if not exc.sent:
                    raise CommandNotStarted(f"{what}; it never reached slurmctld") from None
                raise CommandOutcomeUnknown(
                    f"{what}; it may have acted, so it is not sent again"
                ) from None
        try:
            return retry_read(
                once,
                transient=lambda exc: isinstance(exc, _Transient),
                policy=self.retry,
            )
        except _Transient as exc:
            raise BackendError(
                f"'{' '.join(args[:3])}' kept failing after {self.retry.attempts} attempts: "
                f"{exc}; check that slurmctld answers ('scontrol ping', "
                f"SLURM_CONF={self.slurm_conf or 'default'})"
            ) from None

    def run_destructive(
        self,
        args: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Run a command that acts: at most once past the point where it could have acted.

        Each attempt is ``run(args, retry=False)``. Only :class:`CommandNotStarted` is
        tried again (up to ``retry.attempts`` times); :class:`CommandOutcomeUnknown`,
        JobGone and every other error go straight to the caller.
        """
        return send_destructive(
            lambda: self.run(args, timeout=timeout, retry=False, cwd=cwd, env=env),
            never_acted=lambda exc: isinstance(exc, CommandNotStarted),
            policy=self.retry,
        )

    def _run_once(
        self,
        args: Sequence[str],
        timeout: float,
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        try:
            proc = subprocess.run(
                list(args),
                capture_output=True,
                text=True,
                timeout=timeout,
                env=dict(self.env if env is None else env),
                cwd=cwd,
                check=False,
            )
        except FileNotFoundError:
            raise BackendError(
                f"the Slurm client '{args[0]}' is not on PATH; install slurm-client "
                "or run RecoveryGate on a login node"
            ) from None
        except subprocess.TimeoutExpired:
            raise _Transient(f"'{' '.join(args[:3])}' timed out after {timeout:g} s") from None
        if proc.returncode == 0:
            return proc.stdout
        err = (proc.stderr or proc.stdout).strip()
        # Nothing on stdout: no script line ran on a node (the kill script always prints).
        silent = not proc.stdout.strip()
        if any(marker in err for marker in TRANSIENT_ERRORS):
            sent = not (silent and any(marker in err for marker in NOT_SENT_ERRORS))
            raise _Transient(err, sent=sent)
        if any(marker in err for marker in MISSING_JOB_ERRORS):
            raise JobGone(err)
        if any(marker in err for marker in PERMISSION_ERRORS):
            raise PermissionDeniedError(f"Slurm refused '{' '.join(args[:3])}': {err}")
        if silent and any(marker in err for marker in STEP_NOT_CREATED_ERRORS):
            raise CommandNotStarted(f"'{' '.join(args[:3])}' made no step: {err}")
        raise BackendError(
            f"'{' '.join(args)}' failed (exit {proc.returncode}): {err or 'no message'}"
        )

    # The few commands the backend needs ------------------------------------------------

    def show_job(self, job_id: str) -> JobInfo:
        records = parse_scontrol_records(self.run(["scontrol", "show", "job", "-o", job_id]))
        for record in records:
            if record.get("JobId") == job_id:
                return JobInfo.from_record(record)
        if records:
            return JobInfo.from_record(records[0])
        raise JobGone(f"scontrol printed no record for job {job_id}")

    def show_steps(self, job_id: str) -> list[StepInfo]:
        try:
            text = self.run(["scontrol", "show", "step", "-o", job_id])
        except JobGone:
            return []
        return [StepInfo.from_record(r) for r in parse_scontrol_records(text, id_key="StepId")]

    def current_user(self) -> str:
        """The user this drill runs as (the one Slurm sees)."""
        return pwd.getpwuid(os.geteuid()).pw_name

    def slurm_user(self) -> str:
        """The cluster's SlurmUser (``scontrol show config``), root when not printed."""
        for line in self.run(["scontrol", "show", "config"]).splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "SlurmUser":
                return value.strip().split("(")[0] or "root"
        return "root"

    def hostnames(self, nodelist: str) -> list[str]:
        if not nodelist:
            return []
        if re.fullmatch(r"[A-Za-z0-9_.\-]+", nodelist):
            return [nodelist]
        return self.run(["scontrol", "show", "hostnames", nodelist]).split()

    def find_jobs(self, name: str, user: str | None, partition: str | None) -> list[dict[str, str]]:
        args = ["squeue", "-h", "--name", name, "-O", ",".join(f"{f}:|" for f in SQUEUE_FIELDS)]
        if user:
            args += ["--user", user]
        if partition:
            args += ["--partition", partition]
        return parse_squeue_rows(self.run(args))

    def job_by_name(self, name: str, user: str | None, partition: str | None) -> str:
        """The id of the one pending or running job called ``name``: of the user running
        the drill unless ``user`` names another (a name alone never picks another user's
        job); :class:`DiscoveryError` for none or several."""
        owner = user or self.current_user()
        ids = sorted({r["JobID"] for r in self.find_jobs(name, owner, partition) if r.get("JobID")})
        where = f"name {name!r}, user {owner}"
        if not user:
            where += " (the user running the drill; set workload.user for another's job)"
        if not ids:
            raise DiscoveryError(f"no pending or running Slurm job with {where}; check 'squeue'")
        if len(ids) > 1:
            raise DiscoveryError(
                f"{len(ids)} Slurm jobs match {where} ({', '.join(ids)}); "
                "set workload.jobId to pick one"
            )
        return ids[0]

    def srun_on_node(
        self,
        job_id: str,
        node: str,
        step_name: str,
        script: str,
        *args: str,
        destructive: bool = False,
    ) -> str:
        """Run a constant sh script inside the job on one node (``--overlap``).

        ``destructive`` (the kill step) runs it through :meth:`run_destructive`.
        """
        command = [
            "srun",
            f"--jobid={job_id}",
            "--overlap",
            "-N1",
            "-n1",
            f"--nodelist={node}",
            f"--job-name={step_name}",
            "--quiet",
            "--wait=0",
            "sh",
            "-c",
            script,
            "recoverygate",
            *args,
        ]
        return self.run_destructive(command) if destructive else self.run(command)
