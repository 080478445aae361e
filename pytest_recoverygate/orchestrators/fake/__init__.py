"""The fake backend: an in-memory simulated training job (``orchestrator: fake``).

- :mod:`.spec`: its config section (``workload.fake``, the ``workload``);
- :mod:`.job`: the job's shape, what both orchestrators simulate alike;
- :mod:`.world`: discovery (what runs now, on which nodes);
- :mod:`.kill`: the faults, one function per fault;
- :mod:`.restart`: what follows a kill (the restart by ``resume``, the crash loop);
- :mod:`.lines`: what the job prints (reporter lines as events, output per rank);
- :mod:`.losses`: its per-step losses and batches (``fake.replay``);
- :mod:`.orchestrator`: :class:`FakeOrchestrator`, the drill's methods, composed
  (its docstring tells what the simulated job does);
- :mod:`.live`: :class:`FakeLiveOrchestrator`, replica groups (``recovery: live``).

This module is the backend's registry entry (:data:`BACKEND`) and re-exports what other
code imports from it.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from pytest_recoverygate.orchestrators.fake.job import SimulatedJob
from pytest_recoverygate.orchestrators.fake.lines import FakeEventSource
from pytest_recoverygate.orchestrators.fake.orchestrator import FakeOrchestrator
from pytest_recoverygate.orchestrators.fake.spec import FakeJobSpec, FakeWorkload
from pytest_recoverygate.registry.seams import Backend

if TYPE_CHECKING:
    from pytest_recoverygate.config.schema import InjectFailure
    from pytest_recoverygate.orchestrators.fake.live import FakeLiveOrchestrator
    from pytest_recoverygate.registry.seams import Clock

__all__ = [
    "BACKEND",
    "FakeEventSource",
    "FakeJobSpec",
    "FakeOrchestrator",
    "FakeWorkload",
    "SimulatedJob",
]


#: The keys of ``workload.fake`` each fake orchestrator takes as keywords of the same name:
#: the replica groups' own go to the live one only, every other key to the solo one, and
#: the live one takes those of the job both simulate (SimulatedJob's) too.
_LIVE_ONLY = {"replicas", "min_replicas", "heal", "heartbeat_timeout"}
_SOLO_KEYS = set(FakeJobSpec.model_fields) - _LIVE_ONLY
_LIVE_KEYS = _LIVE_ONLY | {f.name for f in fields(SimulatedJob)} - {"clock"}


def _create(
    workload: FakeWorkload, failure: InjectFailure, clock: Clock
) -> FakeOrchestrator | FakeLiveOrchestrator:
    spec = workload.fake
    if spec.replicas is not None:
        from pytest_recoverygate.orchestrators.fake.live import FakeLiveOrchestrator

        return FakeLiveOrchestrator(
            clock=clock,
            target_replica=failure.target_replica if failure.target_replica is not None else 1,
            **spec.model_dump(include=_LIVE_KEYS),
        )
    return FakeOrchestrator(
        clock=clock, nodes=workload.nodes, **spec.model_dump(include=_SOLO_KEYS)
    )


#: The fake backend: its job lives inside one orchestrator object, so no other drill can
#: reach it and it needs no drill lock (fake drills may run side by side in one process).
BACKEND: Backend[FakeWorkload] = Backend(
    name="fake",
    workload=FakeWorkload,
    create=_create,
    faults=frozenset(
        {
            "KillWorker",
            "KillDuringCheckpoint",
            "Preempt",
            "HangWorker",
            "KillNode",
            "PartitionNode",
        }
    ),
    failure_keys=frozenset({"targetReplica"}),
    lock_scope=lambda workload, target: None,
    restart_budget=lambda workload: workload.fake.max_restarts,
    summary="an in-memory simulated job, on any clock",
)
