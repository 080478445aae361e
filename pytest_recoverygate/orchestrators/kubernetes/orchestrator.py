"""The Kubernetes orchestrator: the pods of one Kubeflow training job, through the client.

It needs exactly these permissions, in one namespace: pods list/watch/delete and
pods/log get (``examples/kubernetes/rbac.yaml``). How each promise of the drill maps onto
the API, and where each job is done:

- **discover**: ``list pods`` by label selector (:mod:`.api`); which pods are the job and
  which rank each runs, with every refusal of an ambiguous or unsafe target, is
  :mod:`.pods`. An empty selector, no pods, pods of two jobs, a rank claimed twice, or an
  absent target rank are refused before anything is touched.
- **kill**: one ``DELETE`` of exactly the discovered pod instance, never sent twice once
  it may have acted (:mod:`.kill`): grace period 0 for ``KillWorker`` and
  ``KillDuringCheckpoint``, the fault's ``gracePeriod`` for ``Preempt``.
- **current_worker**: the pod that holds a rank now, from the watch (for the second and
  later kills of ``count``).
- **watch_group**: a background thread watches the job's pods and turns what changes
  into group events (:mod:`.watch`).
- **events**: a background thread follows the reporting rank's log into training
  events, reopening it on each replacement (:mod:`.logs`).

The connection, the retries of reads, the threads and the streams cleanup must cut are
one :class:`~.api.ApiSession`, shared by all of them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.joboutput import JobOutput
from pytest_recoverygate.model import KILL, Fault, GroupEvent, KillResult, Worker, Workload
from pytest_recoverygate.orchestrators.base import Clock, EventSource, RealClock, cleanup_once
from pytest_recoverygate.orchestrators.kubernetes import FAULT_TYPES
from pytest_recoverygate.orchestrators.kubernetes.api import RETRY, ApiSession, status_message
from pytest_recoverygate.orchestrators.kubernetes.kill import delete_instance
from pytest_recoverygate.orchestrators.kubernetes.logs import LogStream
from pytest_recoverygate.orchestrators.kubernetes.pods import find_job, pod_phase, worker_of
from pytest_recoverygate.orchestrators.kubernetes.watch import GroupWatch
from pytest_recoverygate.retry import RetryPolicy

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
    ) -> None:
        self.selector = selector.strip()
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
        )
        self._main: Any = None
        self._job = ""

    @property
    def namespace(self) -> str | None:
        """The namespace (from the config, the kubeconfig's context, or ``default``)."""
        return self.session.namespace

    # ------------------------------------------------------------------ Orchestrator

    def discover(self, deadline: float) -> Workload:
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
        workload = Workload(
            job=job.name,
            workers=tuple(
                worker_of(pod, rank, namespace=session.namespace, job=job.name)
                for rank, pod in sorted(job.members.items())
            ),
        )
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
        self._job = job.name
        self._watch.adopt(job, pods, rv)
        if not session.started:
            session.start_thread(self._watch.run, "recoverygate-k8s-watch")
            session.start_thread(self._logs.run, "recoverygate-k8s-logs")
        return workload

    def kill(self, worker: Worker, *, dry_run: bool, fault: Fault = KILL) -> KillResult:
        """One DELETE of exactly this pod instance (uid precondition).

        Its grace period is 0, or ``fault.grace_period`` for ``Preempt``, rounded up to
        whole seconds (the API counts seconds; rounding up never cuts the job's grace).
        """
        if fault.type not in FAULT_TYPES:
            raise BackendError(
                f"{fault.type} cannot be injected on kubernetes; it can do {', '.join(FAULT_TYPES)}"
            )
        grace = math.ceil(fault.grace_period) if fault.type == "Preempt" else 0
        if not dry_run:
            self._watch.arm(worker)
        return delete_instance(self.session, worker, dry_run=dry_run, grace_seconds=grace)

    def current_worker(self, rank: int) -> Worker | None:
        """The Running pod that holds ``rank`` now, as the watch sees it (None: none yet)."""
        pod = self._watch.pod_of_rank(rank)
        if pod is None or pod_phase(pod) != "Running":
            return None
        return worker_of(pod, rank, namespace=self.session.namespace, job=self._job)

    def watch_group(self) -> list[GroupEvent]:
        self.session.raise_fatal()
        return self._watch.drain()

    def events(self) -> EventSource:
        return self._logs.events

    def job_output(self) -> JobOutput:
        """The logs of the reporting rank's pods the drill followed, one file per pod."""
        return self._logs.job_output()

    @cleanup_once
    def cleanup(self) -> None:
        """Stop the threads (cutting their streams), close the pools. Idempotent."""
        self.session.stop_threads()
        self._logs.source.close()
        self.session.close_clients()
