"""KillNode on SLURM: every process of the job's training step on one node, by one
identity-checked kill step there; ``drainNode`` sets the node DRAIN first (operator
rights, checked at discovery) and cleanup RESUMEs it (docs/nodes-clusters.md)."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from pytest_recoverygate.engine.model import KillOutcome, KillResult, Node, Worker
from pytest_recoverygate.errors import BackendError, PermissionDeniedError
from pytest_recoverygate.orchestrators.slurm.commands import JobGone, SlurmCommands
from pytest_recoverygate.orchestrators.slurm.parsing import (
    KILL_STEP_NAME,
    NODE_KILL_SCRIPT,
    JobInfo,
)
from pytest_recoverygate.registry.seams import Clock

__all__ = [
    "Failed",
    "NodeKills",
    "Snapshot",
    "job_nodes",
    "rgkill",
    "rgnode",
    "rgnode_gone",
    "signal_time",
]


class Snapshot(Protocol):
    """What :func:`job_nodes` reads of the orchestrator's snapshot of the job."""

    @property
    def job(self) -> JobInfo: ...

    @property
    def step(self) -> str: ...

    @property
    def workers(self) -> Mapping[int, Worker]: ...


#: The orchestrator's reading of a destructive command that raised (``_failed_destructive``).
Failed = Callable[..., KillResult]


@dataclass
class NodeKills:
    """The node kills of one drill, and the drains cleanup must undo."""

    commands: SlurmCommands
    clock: Clock
    lock: threading.Lock = field(default_factory=threading.Lock)
    drained: list[str] = field(default_factory=list)  # a drain was sent: RESUMEd at cleanup
    #: What cleanup's RESUME of each drained node answered.
    resumed: list[str] = field(default_factory=list)

    def check_operator(self) -> None:
        """``drainNode`` sets a node's state: only root or the cluster's SlurmUser may
        (Slurm's operator rights). Refused with the reason before anything is touched."""
        user = self.commands.current_user()
        slurm_user = self.commands.slurm_user()
        if user in ("root", slurm_user):
            return
        raise PermissionDeniedError(
            f"drainNode: true sets the node DRAIN with 'scontrol update', which needs Slurm "
            f"operator rights (root or SlurmUser {slurm_user}); this drill runs as {user}. "
            "Run it as an operator, or drop drainNode (KillNode alone needs no rights beyond "
            "the job's own)"
        )

    def kill(
        self,
        worker: Worker,
        ids: dict[str, str],
        dry_run: bool,
        drain: bool,
        failed: Failed,
    ) -> KillResult:
        """KillNode: every process of the training step on ``worker.node`` SIGKILLed at
        once by one kill step on that node, which first checks that ``worker`` is still
        the instance discovered (else nothing is touched).

        With ``drain`` the node is set DRAIN first (remembered before it is sent, so
        cleanup always RESUMEs it), so a requeued job lands on another node. A drain that
        failed means nothing was killed.
        """
        job_id, step, pid, start = ids["job"], ids["step"], ids["pid"], ids["start"]
        node = worker.node
        target = f"every process of step {job_id}.{step} on node {node}"

        def run_kill(mode: str) -> str:
            return self.commands.srun_on_node(
                job_id,
                node,
                KILL_STEP_NAME,
                NODE_KILL_SCRIPT,
                job_id,
                step,
                pid,
                start,
                mode,
                destructive=mode == "kill",
            )

        if dry_run:
            try:
                answer = rgkill(run_kill("check"))
            except (JobGone, BackendError) as exc:
                return self._result(KillOutcome.ALREADY_GONE, str(exc))
            if answer[:1] == ["alive"]:
                more = " and set it DRAIN" if drain else ""
                return self._result(
                    KillOutcome.DRY_RUN,
                    f"would kill -KILL {target} ({answer[1]} processes: "
                    f"{' '.join(answer[2:])}){more}",
                )
            return self._result(
                KillOutcome.ALREADY_GONE,
                f"{worker.describe()} (pid {pid} on {node}) no longer exists; nothing touched",
            )
        drained = ""
        if drain:
            refused = self._drain(node, job_id)
            if refused is not None:
                return refused
            drained = f"; node {node} set DRAIN (cleanup RESUMEs it)"
        sent_at = self.clock.now()
        out_text = [""]
        try:
            out_text[0] = run_kill("kill")
            answer = rgkill(out_text[0])
        except (JobGone, BackendError) as exc:
            return failed(
                exc,
                job_id,
                not_started=lambda e: f"the node kill step on {node} never started ({e})" + drained,
                unknown=lambda e: f"the node kill step on {node} may have run: {e}" + drained,
            )
        what = answer[0] if answer else "no answer"
        if what == "killed":
            killed_at = signal_time(answer, sent_at)
            count = answer[2] if len(answer) > 2 else "?"
            after = rgnode(out_text[0])
            return KillResult(
                KillOutcome.KILLED,
                killed_at,
                f"kill -KILL {target}: {count} processes ({' '.join(answer[3:])}); "
                f"{after or 'no answer after the kill'}{drained}",
            )
        if what in ("gone", "replaced"):
            return self._result(
                KillOutcome.ALREADY_GONE,
                f"{worker.describe()} (pid {pid} on {node}) no longer exists; no process was "
                f"killed{drained}",
            )
        return self._result(
            KillOutcome.UNCONFIRMED,
            f"node kill step answered {' '.join(answer) or what!r}{drained}",
        )

    def _drain(self, node: str, job_id: str) -> KillResult | None:
        """Set ``node`` DRAIN (remembered first, so cleanup RESUMEs it); the result of a
        drain that failed (nothing was killed), else None."""
        with self.lock:
            self.drained.append(node)
        args = [
            "scontrol",
            "update",
            f"NodeName={node}",
            "State=DRAIN",
            f"Reason=recoverygate KillNode drill of job {job_id}",
        ]
        try:
            self.commands.run_destructive(args)
        except (JobGone, BackendError) as exc:
            return self._result(
                KillOutcome.UNCONFIRMED,
                f"'scontrol update NodeName={node} State=DRAIN' failed ({exc}); no process "
                "was killed, cleanup RESUMEs the node",
            )
        return None

    def _result(self, outcome: KillOutcome, detail: str) -> KillResult:
        """The kill's result, stamped now (a result without a signal time of its own)."""
        return KillResult(outcome, self.clock.now(), detail)

    def resume_drained(self) -> list[str]:
        """RESUME every node a KillNode drained; what could not be resumed, with the fix."""
        with self.lock:
            nodes, self.drained = list(dict.fromkeys(self.drained)), []
        stuck: list[str] = []
        for node in nodes:
            args = ["scontrol", "update", f"NodeName={node}", "State=RESUME"]
            try:
                self.commands.run(args)
                self.resumed.append(f"node {node} RESUMEd")
            except (JobGone, BackendError) as exc:
                self.resumed.append(f"node {node} not resumed: {exc}")
                stuck.append(f"node {node}: {exc} (resume it: {' '.join(args)})")
        return stuck


def rgkill(out: str) -> list[str]:
    """The words of a kill step's ``RGKILL`` answer (or its whole output when none)."""
    answer = next((line for line in out.splitlines() if line.startswith("RGKILL ")), "")
    return answer.split()[1:] if answer else ([out.strip()] if out.strip() else [])


def signal_time(answer: list[str], sent_at: float) -> float:
    """When a ``killed`` answer says the signal landed: the node's own time of it (the
    clock the job's lines are stamped with), else ``sent_at``, when the step was sent;
    never the time the answer came back, which would shorten the recovery time by the
    step's latency."""
    try:
        return float(answer[1])
    except (IndexError, ValueError):
        return sent_at


def rgnode(out: str) -> str:
    """What the node kill step saw after its kill (its ``RGNODE`` line), in words."""
    line = next((x for x in out.splitlines() if x.startswith("RGNODE ")), "")
    words = line.split()[1:]
    if words[:1] == ["gone"] and len(words) > 1:
        return f"every one dead at {words[1]} (node clock)"
    if words[:1] == ["alive"]:
        return f"still alive after 5 s: {' '.join(words[1:])}"
    return ""


def rgnode_gone(detail: str) -> float | None:
    """When the node kill step saw every process gone (from a KILLED detail), or None."""
    match = re.search(r"every one dead at (\d+(?:\.\d+)?)", detail)
    return float(match.group(1)) if match else None


def job_nodes(snapshot: Snapshot) -> tuple[Node, ...]:
    """The job's nodes in this snapshot: sorted by name (``targetNode`` is the position),
    each with its ranks; the identity is the node with these worker instances in this
    step of this run of the job, so a restart, a new step or a requeue makes a new one."""
    names = sorted({w.node for w in snapshot.workers.values() if w.node})
    run = f"{snapshot.job.job_id}.{snapshot.step} run {snapshot.job.restarts}"
    nodes = []
    for index, name in enumerate(names):
        on = tuple(
            snapshot.workers[rank]
            for rank in sorted(snapshot.workers)
            if snapshot.workers[rank].node == name
        )
        digest = hashlib.sha256(",".join(sorted(w.instance_id for w in on)).encode())
        identity = f"{name} in {run} #{digest.hexdigest()[:12]}"
        nodes.append(Node(index=index, name=name, identity=identity, workers=on))
    return tuple(nodes)
