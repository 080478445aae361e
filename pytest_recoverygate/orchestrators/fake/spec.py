"""The fake backend's config section: ``workload.fake`` (the simulated job's settings)
and the ``workload`` of ``orchestrator: fake``, with its refusals."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import model_validator

from pytest_recoverygate.config.fields import option
from pytest_recoverygate.config.schema import (
    MAX_STEP,
    InjectFailure,
    Section,
    WorkloadBase,
    duration,
    node_count_field,
    refuse,
)
from pytest_recoverygate.orchestrators.fake.losses import ReplayMode

__all__ = ["FakeJobSpec", "FakeWorkload", "ResumeMode"]

ResumeMode = Literal["latest", "zero", "older", "never", "fresh-optimizer"]


# ------------------------------------------------------------------ the config section


class FakeJobSpec(Section):
    """The simulated training job of ``orchestrator: fake`` (the whole block is optional)."""

    workers: int = option(2, "a whole number from 2 to 1024", "workers: 2", ge=2, le=1024)
    steps_per_second: float = option(
        50.0,
        "a number above 0 and at most 1000000",
        "stepsPerSecond: 50",
        gt=0,
        le=1_000_000,
        allow_inf_nan=False,
    )
    checkpoint_every: int = option(
        20, "a whole number >= 1 (steps)", "checkpointEvery: 20", ge=1, le=MAX_STEP
    )
    restart_delay: Annotated[float, duration()] = option(
        1.0, "a duration like 1s", "restartDelay: 1s"
    )
    resume: ResumeMode = option("latest", "latest, zero, older or never", "resume: latest")
    startup_delay: Annotated[float, duration()] = option(
        0.0, "a duration like 0s", "startupDelay: 0s"
    )
    save_time: Annotated[float, duration()] = option(
        0.0, "a duration: checkpoint_started -> completed", "saveTime: 0.2s"
    )
    atomic_saves: bool = option(
        True,
        "true or false (false: a torn save is loaded, and the restart crashes)",
        "atomicSaves: true",
    )
    saves_on_sigterm: bool = option(
        False, "true or false: save and exit on SIGTERM", "savesOnSigterm: true"
    )
    hang_timeout: Annotated[float, duration(zero_ok=False)] = option(
        1800.0,
        "a duration: when the other ranks notice a hung one (the collective timeout)",
        "hangTimeout: 10s",
    )
    max_restarts: int | None = option(
        None,
        "a whole number >= 0: the restarts the job survives (default: unlimited)",
        "maxRestarts: 3",
        ge=0,
        le=1000,
    )
    elastic: bool = option(
        True,
        "true or false: after a KillNode with replace: false, carry on with fewer nodes",
        "elastic: true",
    )
    replay: ReplayMode = option(
        "none",
        "none, exact, noise, data or spike: report each step's loss and batch, and how a "
        "replacement redoes them (fake/losses.py; expectations.replay)",
        "replay: exact",
    )
    replay_noise: float = option(
        1e-6, "a number >= 0 (replay: noise): relative", "replayNoise: 1e-6", ge=0, le=1
    )
    replay_spikes: int = option(
        2, "a whole number >= 0 (replay: spike)", "replaySpikes: 2", ge=0, le=1000
    )
    # replica groups (recovery: live): FakeLiveOrchestrator
    replicas: int | None = option(
        None,
        "a whole number from 2 to 64: torchft-style replica groups (recovery: live)",
        "replicas: 2",
        ge=2,
        le=64,
    )
    min_replicas: int = option(
        1,
        "a whole number >= 1 (replicas): the groups a step needs (torchft's min_replica_size)",
        "minReplicas: 1",
        ge=1,
        le=64,
    )
    heal: Literal["peer", "peer-unapplied", "checkpoint", "scratch"] = option(
        "peer",
        "peer, peer-unapplied, checkpoint or scratch (replicas): how the restarted group "
        "gets its state (peer-unapplied: healed, but its state digest is not the peer's)",
        "heal: peer",
    )
    heartbeat_timeout: Annotated[float, duration()] = option(
        2.0,
        "a duration (replicas): how long the survivors wait before training without "
        "the dead group (the lighthouse's heartbeat timeout)",
        "heartbeatTimeout: 2s",
    )


class FakeWorkload(WorkloadBase):
    """An in-memory simulated job: try the whole tool with no infrastructure."""

    orchestrator: Literal["fake"] = option(..., "fake", "orchestrator: fake")
    fake: FakeJobSpec = option(
        ...,
        "a mapping of the fake job's settings",
        "fake: {workers: 2}",
        default_factory=FakeJobSpec,
    )
    nodes: int = node_count_field()

    @model_validator(mode="after")
    def _reporting_rank_exists(self) -> FakeWorkload:
        self._rank_exists(self.reporting_rank, "reportingRank")
        if self.fake.workers % self.nodes:
            raise refuse(
                f"does not divide the job's {self.fake.workers} workers (fake.workers) "
                "evenly: every simulated node runs the same number of ranks",
                f"a divisor of {self.fake.workers}",
                f"set fake.workers to a multiple of {self.nodes}",
                key=("nodes",),
                got=str(self.nodes),
            )
        return self

    def node_count(self) -> int:
        return self.nodes

    def check_failure(self, failure: InjectFailure) -> None:
        if failure.target_rank is not None:
            self._rank_exists(failure.target_rank, "targetRank")

    def _rank_exists(self, rank: int, key: str) -> None:
        if rank >= self.fake.workers:
            raise refuse(
                f"rank {rank} does not exist in a job of {self.fake.workers} workers",
                f"a rank from 0 to {self.fake.workers - 1}",
                key=(key,),
                got=str(rank),
            )
