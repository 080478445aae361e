"""The Kubernetes orchestrator: the pods of one Kubeflow training job, through the client.

It needs exactly these permissions, in one namespace: pods list/watch/delete and
pods/log get (``examples/kubernetes/rbac.yaml``). How each promise of the drill maps onto
the API, and where each job is done:

- **discover**: ``list pods`` by label selector (:mod:`.api`); which pods are the job and
  which rank each runs, with every refusal of an ambiguous or unsafe target, is
  :mod:`.pods`. An empty selector, no pods, pods of two jobs, a rank claimed twice, or an
  absent target rank are refused before anything is touched.
- **kill**: one ``DELETE`` of exactly the discovered pod instance, never sent twice once
  it may have acted (:mod:`.kill`): grace period 0 for ``KillWorker``,
  ``KillDuringCheckpoint`` and both kills of ``KillDuringRecovery``, the fault's
  ``gracePeriod`` for ``Preempt``.
- **node faults** (:mod:`.nodes`): ``KillNode`` deletes every pod of the job on the
  target's node (grace 0, uid preconditions), ``DrainNode`` evicts them (policy/v1, as
  ``kubectl drain``); ``cordon`` cordons the node first and cleanup uncordons it. Both
  need opt-in rights beyond rbac.yaml (examples/kubernetes/rbac-nodes.yaml), checked
  before anything is touched. ``PartitionNode`` is refused.
- **current_worker**: the Running pod that holds a rank now, from the watch (for the
  second and later kills of ``count``, and a KillDuringRecovery's second kill: the
  target's replacement pod, once it runs).
- **watch_group**: a background thread watches the job's pods and turns what changes
  into group events (:mod:`.watch`).
- **events**: a background thread follows the reporting rank's log into training
  events, reopening it on each replacement (:mod:`.logs`).

The connection, the retries of reads, the threads and the streams cleanup must cut are
one :class:`~.api.ApiSession`, shared by all of them.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError, UsageError
from pytest_recoverygate.orchestrators.kubernetes import FAULT_TYPES
from pytest_recoverygate.orchestrators.kubernetes.api import RETRY, ApiSession, status_message
from pytest_recoverygate.orchestrators.kubernetes.kill import delete_instance
from pytest_recoverygate.orchestrators.kubernetes.logs import LogStream
from pytest_recoverygate.orchestrators.kubernetes.nodes import PARTITION_REFUSED, NodeOps
from pytest_recoverygate.orchestrators.kubernetes.pods import find_job, pod_phase, worker_of
from pytest_recoverygate.orchestrators.kubernetes.watch import GroupWatch
from pytest_recoverygate.registry.seams import (
    Clock,
    EventSource,
    RealClock,
    cleanup_once,
    node_moved,
)
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.joboutput import JobOutput
from pytest_recoverygate.shared.retry import RetryPolicy

if TYPE_CHECKING:
    from recoverygate.evidence import Spec

__all__ = ["KubernetesOrchestrator"]


class KubernetesOrchestrator:
    """The pods of one training job, found by label selector, in one namespace."""

    name = "kubernetes"

    def __init__(
        self,
        *,
        selector: str,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | Path | None = None,
        container: str | None = None,
        target_rank: int = 1,
        reporting_rank: int = 0,
        clock: Clock | None = None,
        api_client: Any = None,
        watch_timeout_seconds: int = 60,
        request_timeout: float = 30.0,
        retry: RetryPolicy = RETRY,
        fault: str = "KillWorker",
        cordon: bool = False,
        source: StreamEventSource | None = None,
    ) -> None:
        if fault == "PartitionNode":
            raise UsageError(PARTITION_REFUSED)
        self.selector = selector.strip()
        #: The drill's fault type and ``cordon``: what discovery checks the rights for.
        self.fault = fault
        self.cordon = cordon
        self.target_rank = target_rank
        self.reporting_rank = reporting_rank
        self.clock: Clock = clock if clock is not None else RealClock()
        self.session = ApiSession(
            selector=self.selector,
            namespace=namespace,
            context=context,
            kubeconfig=str(Path(kubeconfig).expanduser()) if kubeconfig else None,
            api_client=api_client,
            request_timeout=request_timeout,
            retry=retry,
            clock=self.clock,
        )
        self._watch = GroupWatch(self.session, watch_timeout_seconds=watch_timeout_seconds)
        self._logs = LogStream(
            self.session,
            reporting_rank=reporting_rank,
            container=container,
            reporting_pod=lambda: self._watch.pod_of_rank(reporting_rank),
            source=source,
        )
        self._main: Any = None
        self._job = ""
        self._nodes = NodeOps(self.session)

    @property
    def namespace(self) -> str | None:
        """The namespace (from the config, the kubeconfig's context, or ``default``)."""
        return self.session.namespace

    # ------------------------------------------------------------------ Orchestrator

    def discover(self, deadline: float) -> model.Workload:
        if not self.selector:
            raise DiscoveryError(
                "refusing an empty label selector: it would match every pod in the namespace. "
                "Fix: set workload.selector to one job, "
                'e.g. "training.kubeflow.org/job-name=my-job".'
            )
        session = self.session
        session.connect()  # first: it says how to install a missing client
        from kubernetes.client.exceptions import ApiException

        if self._main is None:
            self._main = session.new_api()
        try:
            pods, rv = session.list_pods(
                self._main, deadline=deadline, passthrough=frozenset({400})
            )
        except ApiException as exc:
            raise DiscoveryError(
                f"the API server rejected selector {self.selector!r}: {status_message(exc)}. "
                "Fix: use label selector syntax, e.g. 'app=x,tier in (a,b)'."
            ) from None
        job = find_job(
            pods, selector=self.selector, namespace=session.namespace, host=session.host()
        )
        workers = tuple(
            worker_of(pod, rank, namespace=session.namespace, job=job.name)
            for rank, pod in sorted(job.members.items())
        )
        workload = model.Workload(job=job.name, workers=workers, nodes=_nodes(workers))
        if workload.by_rank(self.target_rank) is None:
            raise DiscoveryError(
                f"target rank {self.target_rank} is not among the ranks of {workload.job} "
                f"({', '.join(str(w.rank) for w in workload.workers)}). "
                "Fix: set injectFailure.targetRank to one of them."
            )
        if workload.by_rank(self.reporting_rank) is None:
            raise DiscoveryError(
                f"reporting rank {self.reporting_rank} is not among the ranks of {workload.job} "
                f"({', '.join(str(w.rank) for w in workload.workers)}); its log carries the "
                "training events. Fix: set workload.reportingRank to the rank that reports."
            )
        target = workload.by_rank(self.target_rank)
        self._nodes.adopt(job, pods)
        if self.fault in ("KillNode", "DrainNode") and target is not None:
            if not target.node:
                raise DiscoveryError(
                    f"{self.fault}: pod {target.name!r} (rank {self.target_rank}) is not bound "
                    "to a node yet (no spec.nodeName); wait until it is scheduled"
                )
            self._nodes.job_pods_on(target.node, self.fault)  # another job there: refused
            self._nodes.check_rights(
                target.node,
                cordon=self.cordon,
                evict=target if self.fault == "DrainNode" else None,
            )
        self._job = job.name
        self._watch.adopt(job, pods, rv)
        if not session.started:
            session.start_thread(self._watch.run, "recoverygate-k8s-watch")
            session.start_thread(self._logs.run, "recoverygate-k8s-logs")
        return workload

    def kill(
        self, worker: model.Worker, *, dry_run: bool, fault: model.Fault = model.KILL
    ) -> model.KillResult:
        """One DELETE of exactly this pod instance (uid precondition).

        Its grace period is 0, or ``fault.grace_period`` for ``Preempt``, rounded up to
        whole seconds (the API counts seconds; rounding up never cuts the job's grace).
        """
        if fault.type == "PartitionNode":
            raise BackendError(PARTITION_REFUSED)
        if fault.type not in FAULT_TYPES:
            raise BackendError(
                f"{fault.type} cannot be injected on kubernetes; it can do {', '.join(FAULT_TYPES)}"
            )
        if fault.type in ("KillNode", "DrainNode"):
            if not worker.node:
                return model.KillResult(
                    model.KillOutcome.ALREADY_GONE,
                    self.clock.now(),
                    f"pod {worker.name!r} is bound to no node; nothing was touched",
                )
            cordon = fault.cordon or self.cordon
            if not dry_run:
                on_node = self._nodes.job_pods_on(worker.node, fault.type)
                self._watch.arm(
                    worker,
                    node=worker.node,
                    node_uids=frozenset(w.instance_id for w in on_node),
                )
            act = self._nodes.kill_node if fault.type == "KillNode" else self._nodes.drain_node
            return act(worker.node, worker, dry_run=dry_run, cordon=cordon)
        grace = math.ceil(fault.grace_period) if fault.type == "Preempt" else 0
        if not dry_run:
            self._watch.arm(worker)
        return delete_instance(self.session, worker, dry_run=dry_run, grace_seconds=grace)

    def current_node(self, index: int) -> model.Node | None:
        """Node ``index`` of the job now (its Running pods), or None."""
        workers = []
        for rank in sorted(set(self._watch.ranks())):
            worker = self.current_worker(rank)
            if worker is not None:
                workers.append(worker)
        nodes = _nodes(tuple(workers))
        return nodes[index] if 0 <= index < len(nodes) else None

    def kill_node(self, node: model.Node, *, dry_run: bool, fault: model.Fault) -> model.KillResult:
        """KillNode / DrainNode of every pod of the job on ``node`` (:mod:`.nodes`);
        ALREADY_GONE when the pods seen on it are no longer there."""
        now = self.current_node(node.index)
        moved = node_moved(node, now, self.clock, "no such node with Running pods")
        if moved is not None:
            return moved
        return self.kill(node.workers[0], dry_run=dry_run, fault=fault)

    def restore_node(self, node: model.Node) -> model.KillResult:
        """Nothing to restore: PartitionNode is refused on kubernetes."""
        return model.KillResult(
            model.KillOutcome.ALREADY_GONE, self.clock.now(), "nothing to restore"
        )

    def current_worker(self, rank: int) -> model.Worker | None:
        """The Running pod that holds ``rank`` now, as the watch sees it (None: none yet)."""
        pod = self._watch.pod_of_rank(rank)
        if pod is None or pod_phase(pod) != "Running":
            return None
        return worker_of(pod, rank, namespace=self.session.namespace, job=self._job)

    def watch_group(self) -> list[model.GroupEvent]:
        self.session.raise_fatal()
        return self._watch.drain()

    def events(self) -> EventSource:
        return self._logs.events

    def job_output(self) -> JobOutput:
        """The logs of the reporting rank's pods the drill followed, one file per pod."""
        return self._logs.job_output()

    @property
    def last_line_time(self) -> float | None:
        """The kubelet time of the newest log line streamed so far (None: none yet)."""
        return self._logs.last_line_time

    @property
    def uncordoned(self) -> list[str]:
        """The nodes cleanup uncordoned (the ones this drill cordoned)."""
        return list(self._nodes.uncordoned)

    def match_log_evidence(self, spec: Spec) -> None:
        """``evidence.podLogs``: match the reporting rank's pod log here, in the drill
        (for an image without the reporter; shared/logevidence.py says what that lacks)."""
        from pytest_recoverygate.shared.logevidence import LogEvidence

        self._logs.evidence = LogEvidence(spec, rank=self.reporting_rank)

    @cleanup_once
    def cleanup(self) -> None:
        """Uncordon what the drill cordoned first; stop the threads (cutting their
        streams), close the pools. Idempotent."""
        stuck = self._nodes.uncordon_all()
        self.session.stop_threads()
        self._logs.source.close()
        self.session.close_clients()
        if stuck:
            raise BackendError("cleanup could not uncordon: " + "; ".join(stuck))


def _nodes(workers: tuple[model.Worker, ...]) -> tuple[model.Node, ...]:
    """The job's nodes, sorted by name (``targetNode`` is the position), each with its
    pods; the identity is the node with the pod instances on it, so it changes when they
    are replaced (the drill needs no nodes get to tell)."""
    names = sorted({w.node for w in workers if w.node})
    nodes = []
    for index, name in enumerate(names):
        on = tuple(w for w in workers if w.node == name)
        digest = hashlib.sha256(",".join(sorted(w.instance_id for w in on)).encode())
        nodes.append(
            model.Node(
                index=index, name=name, identity=f"{name}#{digest.hexdigest()[:12]}", workers=on
            )
        )
    return tuple(nodes)
