"""Train's run state as the dashboard serves it (``/api/train/v2/runs/v1``), read (pure).

A run is one ``TorchTrainer.fit()``; an attempt is one worker group Train started (again);
each attempt lists its workers with world rank, actor id, pid, node and status. The
canned answer in tests/ray/data was captured from a real Ray 2.60 run.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "TrainAttempt",
    "TrainRun",
    "TrainWorker",
    "failed_worker",
    "failure_of",
    "first_words",
    "parse_runs",
]


@dataclass(frozen=True)
class TrainWorker:
    """One worker of an attempt, as Train's state lists it."""

    rank: int
    actor_id: str
    pid: int
    node_id: str
    node_ip: str
    alive: bool
    log_file: str | None
    node_rank: int = 0

    @property
    def node(self) -> str:
        """The node as ``Worker.node`` names it: its address and its Ray node id (several
        nodes of one machine share the address)."""
        return f"{self.node_ip}/{self.node_id[:8]}"


@dataclass(frozen=True)
class TrainAttempt:
    """One attempt of a run: the worker group Train started (again)."""

    attempt_id: str
    status: str  # PENDING, RUNNING, FINISHED, ERRORED, ABORTED
    detail: str
    workers: tuple[TrainWorker, ...]

    @property
    def running(self) -> bool:
        return (
            self.status == "RUNNING" and bool(self.workers) and all(w.alive for w in self.workers)
        )


@dataclass(frozen=True)
class TrainRun:
    """A Train run (one ``fit()``) and its attempts, oldest first."""

    run_id: str
    name: str
    status: (
        str  # INITIALIZING, SCHEDULING, RUNNING, RESTARTING, RESIZING, FINISHED, ERRORED, ABORTED
    )
    detail: str
    start_ns: int
    driver_pid: int | None
    submission_id: str | None
    attempts: tuple[TrainAttempt, ...] = field(default=())

    @property
    def current(self) -> TrainAttempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def terminal(self) -> bool:
        return self.status in ("FINISHED", "ERRORED", "ABORTED")


def parse_runs(payload: dict[str, Any]) -> list[TrainRun]:
    """Train's ``/api/train/v2/runs/v1`` answer, as :class:`TrainRun` s (pure)."""
    runs = []
    for run in payload.get("train_runs") or []:
        attempts = []
        for attempt in sorted(run.get("attempts") or [], key=lambda a: a.get("start_time_ns", 0)):
            workers = tuple(
                TrainWorker(
                    rank=int(w["world_rank"]),
                    actor_id=str(w["actor_id"]),
                    pid=int(w["pid"]),
                    node_id=str(w.get("node_id", "")),
                    node_ip=str(w.get("node_ip", "")),
                    alive=w.get("status") == "ALIVE",
                    log_file=w.get("log_file_path"),
                    node_rank=int(w.get("node_rank") or 0),
                )
                for w in sorted(attempt.get("workers") or [], key=lambda w: w["world_rank"])
            )
            attempts.append(
                TrainAttempt(
                    str(attempt.get("attempt_id", "")),
                    str(attempt.get("status", "")),
                    str(attempt.get("status_detail") or ""),
                    workers,
                )
            )
        job = run.get("job_details") or {}
        driver = job.get("driver_info") or {}
        pid = driver.get("pid")
        runs.append(
            TrainRun(
                run_id=str(run.get("id", "")),
                name=str(run.get("name", "")),
                status=str(run.get("status", "")),
                detail=str(run.get("status_detail") or ""),
                start_ns=int(run.get("start_time_ns") or 0),
                driver_pid=int(pid) if pid not in (None, "") else None,
                submission_id=job.get("submission_id"),
                attempts=tuple(attempts),
            )
        )
    return runs


def failed_worker(
    attempt: TrainAttempt, dead: list[TrainWorker], killed: Collection[str] = ()
) -> TrainWorker | None:
    """The worker the drill killed (``killed``: actor ids) when it is among the dead, else
    the worker Train names in its error snippet (``[Rank 1 Error Snippet]``), else the
    first dead one.

    The drill's own victim comes first: Train's snippet may name another rank (a peer
    whose collective failed) or none, and a look that comes late (a loaded machine) finds
    the whole group dead, its other ranks ended by Train's shutdown; a CI run with Ray
    2.60 named rank 0 so, not the worker the drill had killed."""
    victim = next((w for w in dead if w.actor_id in killed), None)
    if victim is not None:
        return victim
    match = re.search(r"\[Rank (\d+) Error", attempt.detail)
    if match is not None:
        rank = int(match.group(1))
        named = next((w for w in attempt.workers if w.rank == rank), None)
        if named is not None:
            return named
    return dead[0] if dead else None


def first_words(detail: str, limit: int = 160) -> str:
    """Train's status detail in one line: its informative lines, up to ``limit`` characters."""
    words = []
    for raw in detail.splitlines():
        line = raw.strip()
        if not line or line.startswith("[Rank"):
            continue
        if line.startswith(("Worker info:", "actor=", "metadata=")):
            break  # the worker's description follows: the message is said
        words.append(line)
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: The run's states after Train decided to restart a group (RESTARTING lasts a millisecond).
RESTART_DECIDED = ("RESTARTING", "SCHEDULING", "RESIZING")


def failure_of(
    run: TrainRun,
    index: int,
    dead: list[TrainWorker],
    killed: Collection[str] = (),
    *,
    ran: bool = True,
) -> str | None:
    """What says that attempt ``index`` of ``run`` failed (None: nothing yet).

    A worker ``DEAD`` or the attempt ``ERRORED``; or Train's restart decision, the first
    sign of a failure that kills nobody (a stopped rank: its peer's collective times
    out). Measured with Ray 2.60: the run goes RUNNING -> RESTARTING -> SCHEDULING within
    a millisecond, and the attempt stays RUNNING until its group is shut down (30 s later
    for a stopped rank): the run *leaving* RUNNING while its newest attempt still runs is
    the decision. ``ran``: the run was seen RUNNING with this attempt. At a slow start the
    run is still SCHEDULING while its first attempt already runs (seen in CI, 10 s before
    any fault: it was read as a restart decision); that is no failure.
    """
    attempt = run.attempts[index]
    if dead or attempt.status == "ERRORED":
        who = failed_worker(attempt, dead, killed)
        said = first_words(attempt.detail) or (
            f"the actor of rank {who.rank} is DEAD" if who else attempt.status
        )
        return f"worker death detected: {said}"
    newest = index == len(run.attempts) - 1
    if newest and ran and attempt.status == "RUNNING" and run.status in RESTART_DECIDED:
        return (
            f"Train decided to restart the group (the run is {run.status}, its attempt "
            "still RUNNING with every worker alive)"
        )
    return None
