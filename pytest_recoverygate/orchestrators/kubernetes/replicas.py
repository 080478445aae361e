"""The replica groups of a torchft job on Kubernetes: one label selector per group.

``workload.replicas`` (recovery: live, docs/torchft.md) names each replica group's pods
by a selector of its own -- typically one PyTorchJob / TrainJob per replica group, as
torchft runs them. Each group is followed by its own :class:`KubernetesOrchestrator`
(discovery, pod table, log stream, all with that selector), every log feeding one shared
event source, so the survivors' committed steps and the target's replacement are one
stream of lines, each knowing its replica from its start line.

- The *target* group is ``injectFailure.targetReplica``'s: its workers come first in the
  workload (the runner's ``by_rank`` finds the target there), and the kill (one DELETE
  of the pod instance, uid precondition), ``current_worker`` and the group events (the
  pod gone, its replacement -- recreated by the job's controller -- Pending then
  Running) are its orchestrator's.
- A surviving group's orchestrator only reads: its pods' list, watch and logs. Its job
  failing ends the drill (JOB_FAILED, naming the group); a group whose pods cannot be
  found is refused at discovery, naming its selector.
- Discovery returns once every group's log stream is current (its newest line at most
  1 s old, waiting at most 15 s): a survivor's stream still replaying its backlog when
  the kill lands would read as a survivor that stalled.
- Cleanup cleans every group's orchestrator (threads, streams, clients).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.orchestrators.base import cleanup_once
from pytest_recoverygate.orchestrators.kubernetes.logs import PodLogEvents
from pytest_recoverygate.orchestrators.kubernetes.orchestrator import KubernetesOrchestrator
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.joboutput import JobOutput, WorkerOutput

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pytest_recoverygate.orchestrators.base import Clock

__all__ = ["CATCH_UP_WAIT", "CAUGHT_UP", "ReplicaGroupsOrchestrator"]

#: A log stream is current when its newest line is at most this old (seconds).
CAUGHT_UP = 1.0
#: The longest discovery waits for every group's stream to be current (seconds).
CATCH_UP_WAIT = 15.0


class ReplicaGroupsOrchestrator:
    """Every replica group's pods, each by its own selector; the kill goes to the target's."""

    name = "kubernetes"

    def __init__(
        self,
        selectors: Mapping[int, str],
        *,
        target_replica: int,
        target_rank: int = 0,
        reporting_rank: int = 0,
        clock: Clock,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | Path | None = None,
        container: str | None = None,
        api_client: object = None,
    ) -> None:
        if target_replica not in selectors:
            raise DiscoveryError(
                f"injectFailure.targetReplica {target_replica} is not among workload.replicas "
                f"({', '.join(map(str, sorted(selectors)))}); set it to one of them"
            )
        self.target_replica = target_replica
        self.selectors = dict(selectors)
        self._clock = clock
        self._source = StreamEventSource(wakeup=clock.wakeup, clock=clock.now)
        self.groups: dict[int, KubernetesOrchestrator] = {}
        for replica in [target_replica, *(r for r in sorted(selectors) if r != target_replica)]:
            self.groups[replica] = KubernetesOrchestrator(
                selector=selectors[replica],
                namespace=namespace,
                context=context,
                kubeconfig=kubeconfig,
                container=container,
                # a survivor is never hit: its "target" is only what discovery checks exists
                target_rank=target_rank if replica == target_replica else reporting_rank,
                reporting_rank=reporting_rank,
                clock=clock,
                api_client=api_client,
                source=self._source,
            )
        self._events = PodLogEvents(
            self._source, *(group.session for group in self.groups.values())
        )
        self._failed_reported = False

    @property
    def target(self) -> KubernetesOrchestrator:
        """The target replica group's orchestrator."""
        return self.groups[self.target_replica]

    @property
    def namespace(self) -> str | None:
        return self.target.namespace

    # ------------------------------------------------------------------ Orchestrator

    def discover(self, deadline: float) -> model.Workload:
        """Discover every group (the target's first: its workers lead the workload)."""
        found: dict[int, model.Workload] = {}
        for replica, group in self.groups.items():
            try:
                found[replica] = group.discover(deadline)
            except DiscoveryError as exc:
                raise DiscoveryError(
                    f"workload.replicas: replica {replica} "
                    f"(selector {self.selectors[replica]!r}): {exc}"
                ) from exc
        self._catch_up(deadline)
        uids = [w.instance_id for w in (w for wl in found.values() for w in wl.workers)]
        if len(set(uids)) != len(uids):
            raise DiscoveryError(
                "workload.replicas: two replica groups' selectors match the same pod; "
                "give each replica group a selector of its own pods (e.g. its job's name)"
            )
        workers = tuple(
            dataclasses.replace(w, details=(*w.details, ("replica", str(replica))))
            for replica, workload in found.items()
            for w in workload.workers
        )
        what = ", ".join(
            f"replica {r}: {wl.job} ({len(wl.workers)} pod(s))" for r, wl in found.items()
        )
        return model.Workload(
            job=f"{len(found)} replica groups ({what})",
            workers=workers,
            nodes=found[self.target_replica].nodes,
        )

    def _catch_up(self, deadline: float) -> None:
        """Wait until every group's log stream is current (its newest line at most
        :data:`CAUGHT_UP` seconds old), for at most :data:`CATCH_UP_WAIT`: a survivor's
        stream still replaying its backlog when the kill lands would look like a stall."""
        clock = self._clock
        until = min(deadline, clock.now() + CATCH_UP_WAIT)
        while True:
            now = clock.now()
            behind = [
                replica
                for replica, group in self.groups.items()
                if (last := group.last_line_time) is None or last < now - CAUGHT_UP
            ]
            if not behind or now >= until:
                return
            clock.wait(0.05)

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault = model.KILL
    ) -> model.KillResult:
        """One DELETE of the target group's pod instance (uid precondition)."""
        return self.target.kill(worker, dry_run=dry_run, fault=fault)

    def current_worker(self, rank: int) -> model.Worker | None:
        return self.target.current_worker(rank)

    def watch_group(self) -> list[model.GroupEvent]:
        """The target group's events; a surviving group's job failing is JOB_FAILED."""
        out = list(self.target.watch_group())
        for replica, group in self.groups.items():
            if replica == self.target_replica:
                continue
            for event in group.watch_group():
                if event.kind is model.GroupEventKind.JOB_FAILED and not self._failed_reported:
                    self._failed_reported = True
                    out.append(
                        dataclasses.replace(event, detail=f"replica {replica}: {event.detail}")
                    )
        return out

    def events(self) -> PodLogEvents:
        return self._events

    def job_output(self) -> JobOutput:
        """Every group's followed pod logs, each file named by its replica."""
        workers: list[WorkerOutput] = []
        failing: str | None = None
        for replica, group in self.groups.items():
            output = group.job_output()
            for w in output.workers:
                workers.append(WorkerOutput(f"replica {replica} {w.label}", w.text, w.cut_bytes))
            if output.failing is not None and (failing is None or replica == self.target_replica):
                failing = f"replica {replica} {output.failing}"
        return JobOutput(
            tuple(workers),
            failing,
            "the logs of each replica group's reporting-rank pods, as the drill streamed them",
        )

    @cleanup_once
    def cleanup(self) -> None:
        """Clean up every group's orchestrator; say which could not."""
        problems: list[str] = []
        for replica, group in self.groups.items():
            try:
                group.cleanup()
            except BackendError as exc:
                problems.append(f"replica {replica}: {exc}")
        self._source.close()
        if problems:
            raise BackendError("; ".join(problems))
