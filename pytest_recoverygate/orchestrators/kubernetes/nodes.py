"""Node faults on Kubernetes: every pod of the job on one node, as a node failure or a
``kubectl drain`` takes them.

- **KillNode**: one DELETE per pod of the job on the node, each with grace period 0 and
  its uid precondition (:func:`~.kill.delete_instance`): a pod of another node, of another
  job, or a replacement (another uid) is never hit. With ``cordon`` the node is cordoned
  first (``PATCH spec.unschedulable: true``), so the replacements land on other nodes; it
  is uncordoned at cleanup, and only if the drill cordoned it (a node that was already
  cordoned stays as it was).
- **DrainNode**: one ``policy/v1`` Eviction per pod of the job on the node, as ``kubectl
  drain`` does (the pod's own grace period; PodDisruptionBudgets are honoured by the
  apiserver). Every eviction is first sent as a dry run: a 429 from a
  PodDisruptionBudget on any of them is an ERROR "eviction blocked by PodDisruptionBudget
  NAME" with nothing evicted; a 429 on a real eviction stops there (the ones before it
  are named).
- **Rights**: the default Role (examples/kubernetes/rbac.yaml) is pods-only. Cordoning
  needs nodes get/patch (a ClusterRole: nodes are cluster-scoped) and draining needs
  pods/eviction create: examples/kubernetes/rbac-nodes.yaml, opt-in. They are checked
  with a read and a dry-run request before anything is touched (:func:`check_rights`).
- **Only the discovered job**: the node's pods are re-listed by the selector, and a pod is
  the job's only when it carries the discovered job's label (``PyTorchJob/NAME``,
  ``TrainJob/NAME``) -- for pods without a Kubeflow job label, the controller owner uid
  discovery saw, or (bare pods) a uid discovery listed. When a pod of *another* job that
  also matches the selector runs on the node, the fault is refused with nothing touched:
  a node fault there would take that job's pods too (issue 30, finding 4).
- **PartitionNode** is refused: the Kubernetes API has no operation that cuts a node's
  network while its pods keep running (that is a CNI or cloud network-policy matter).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_recoverygate.engine.model import KillOutcome, KillResult, Worker
from pytest_recoverygate.errors import BackendError, PermissionDeniedError
from pytest_recoverygate.orchestrators.kubernetes import PARTITION_REFUSED
from pytest_recoverygate.orchestrators.kubernetes.api import ApiSession, status_message
from pytest_recoverygate.orchestrators.kubernetes.kill import delete_instance
from pytest_recoverygate.orchestrators.kubernetes.pods import (
    Job,
    Pod,
    has_master,
    is_terminating,
    job_of,
    pod_name,
    pod_rank,
    pod_uid,
    worker_of,
)

__all__ = [
    "NODE_RBAC_EXAMPLE",
    "PARTITION_REFUSED",
    "JobIdentity",
    "NodeOps",
    "blocking_budget",
    "controller_uid",
]

NODE_RBAC_EXAMPLE = "examples/kubernetes/rbac-nodes.yaml"
_BUDGET = re.compile(r"disruption budget (\S+)")


def blocking_budget(exc: Any) -> str | None:
    """The PodDisruptionBudget a 429 eviction answer names, else None."""
    if getattr(exc, "status", None) != 429:
        return None
    body = getattr(exc, "body", None) or ""
    try:
        causes = (json.loads(body).get("details") or {}).get("causes") or []
    except (ValueError, TypeError, AttributeError):
        causes = []
    for cause in causes:
        match = _BUDGET.search(str(cause.get("message", "")))
        if match:
            return match.group(1)
    message = status_message(exc)
    if "disruption budget" in message:
        match = _BUDGET.search(message)
        return match.group(1) if match else "(unnamed)"
    return None


def controller_uid(pod: Pod) -> str:
    """The uid of the pod's controlling owner (its ReplicaSet, Job, ...), '' when none."""
    for ref in pod.get("metadata", {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return str(ref.get("uid") or "")
    return ""


@dataclass(frozen=True)
class JobIdentity:
    """What tells the discovered job's pods from another job's that match the selector."""

    key: str = ""  # job_of() of the job's pods ("" when they carry no Kubeflow job label)
    owners: frozenset[str] = frozenset()  # unlabelled pods: their controllers' uids
    uids: frozenset[str] = frozenset()  # unlabelled bare pods: the uids discovery listed

    @classmethod
    def of(cls, job: Job, pods: list[Pod]) -> JobIdentity:
        members = [p for p in pods if pod_uid(p) in job.ranks]
        owners = frozenset(o for o in map(controller_uid, members) if o)
        return cls(job.key, owners, frozenset(job.ranks))

    def owns(self, pod: Pod) -> bool:
        """Is ``pod`` one of the job's (a replacement included)?"""
        if job_of(pod) != self.key:
            return False
        if self.key:
            return True
        if self.owners:
            return controller_uid(pod) in self.owners
        return pod_uid(pod) in self.uids


@dataclass
class NodeOps:
    """The node faults of one drill, and the cordons cleanup must undo."""

    session: ApiSession
    job: JobIdentity = field(default_factory=JobIdentity)  # set by discovery (adopt)
    cordoned: list[str] = field(default_factory=list)  # by this drill: uncordoned at cleanup
    uncordoned: list[str] = field(default_factory=list)  # what cleanup did, for the report

    # ------------------------------------------------------------------ reads

    def _api(self) -> Any:
        return self.session.new_api()

    def _forbidden(self, verb: str, resource: str, why: str, exc: Any) -> PermissionDeniedError:
        return PermissionDeniedError(
            f"{why} needs {resource} {verb}, which Kubernetes refused (403 Forbidden: "
            f"{status_message(exc)}). The default RBAC (examples/kubernetes/rbac.yaml) is "
            f"pods-only on purpose. Fix: kubectl apply -f {NODE_RBAC_EXAMPLE} (opt-in: a "
            "ClusterRole with nodes get/patch and a Role with pods/eviction create), or drop "
            "cordon / use KillNode; nothing was touched"
        )

    def read_node(self, api: Any, node: str, why: str) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        def call() -> dict[str, Any]:
            resp = api.read_node(
                node, _preload_content=False, _request_timeout=(5, self.session.request_timeout)
            )
            try:
                return dict(json.loads(resp.data))
            finally:
                resp.release_conn()

        try:
            return self.session.read("get", "nodes", call, passthrough=frozenset({403, 404}))
        except ApiException as exc:
            if exc.status == 403:
                raise self._forbidden("get", "nodes", why, exc) from None
            raise BackendError(f"node {node!r} does not exist ({status_message(exc)})") from None

    def adopt(self, job: Job, pods: list[Pod]) -> None:
        """Remember what discovery found: the node faults act on this job only."""
        self.job = JobIdentity.of(job, pods)

    def job_pods_on(self, node: str, fault: str = "KillNode") -> list[Worker]:
        """The job's live pods on ``node`` now, as workers (rank, name, uid).

        Raises BackendError, before anything is touched, when a live pod of another job
        that matches the selector is on ``node``: the fault would take it too."""
        pods, _ = self.session.list_pods(self._api())
        here = [
            p
            for p in pods
            if (p.get("spec") or {}).get("nodeName") == node and not is_terminating(p)
        ]
        foreign = [p for p in here if not self.job.owns(p)]
        if foreign:
            raise BackendError(self._foreign_refusal(node, fault, foreign))
        ours = [p for p in pods if self.job.owns(p)]
        master = has_master(ours)
        found = []
        for pod in here:
            rank = pod_rank(pod, job_has_master=master)
            if rank is None:
                continue
            found.append(worker_of(pod, rank, namespace=self.session.namespace, job=""))
        return sorted(found, key=lambda w: w.rank)

    def _foreign_refusal(self, node: str, fault: str, foreign: list[Pod]) -> str:
        named = ", ".join(
            f"{pod_name(p)} ({job_of(p) or 'no Kubeflow job label'}, uid {pod_uid(p)})"
            for p in foreign[:5]
        )
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        mine = self.job.key or "the discovered pods"
        return (
            f"refusing {fault} on node {node}: pods of another job that also match selector "
            f"{self.session.selector!r} run there ({named}{more}); a node fault would take "
            f"them with {mine}. Nothing was touched. Fix: narrow workload.selector to one job "
            "(e.g. 'training.kubeflow.org/job-name=<name>'), or target a node only this job uses"
        )

    # ------------------------------------------------------------------ rights

    def check_rights(self, node: str, *, cordon: bool, evict: Worker | None) -> None:
        """Before anything is touched: may this drill cordon ``node`` (a read and a
        dry-run PATCH) and evict ``evict`` (a dry-run Eviction, which a blocking
        PodDisruptionBudget also refuses)? Raises the error that says what to grant."""
        if cordon:
            why = f"cordon: true (cordoning node {node!r})"
            api = self._api()
            self.read_node(api, node, why)
            self._patch(api, node, True, dry_run=True, why=why)
        if evict is not None:
            self._evict(evict, dry_run=True)

    # ------------------------------------------------------------------ cordon

    def _write(self, call: Callable[..., Any], *args: Any, dry_run: bool) -> None:
        """One write to the API server (``dry_run``: the server's own dry run of it)."""
        resp = call(
            *args,
            dry_run="All" if dry_run else None,
            _preload_content=False,
            _request_timeout=(5, self.session.request_timeout),
        )
        resp.release_conn()

    def _patch(self, api: Any, node: str, unschedulable: bool, *, dry_run: bool, why: str) -> None:
        from kubernetes.client.exceptions import ApiException

        body = {"spec": {"unschedulable": True if unschedulable else None}}
        try:
            self._write(api.patch_node, node, body, dry_run=dry_run)
        except ApiException as exc:
            if exc.status == 403:
                raise self._forbidden("patch", "nodes", why, exc) from None
            raise BackendError(
                f"the API server refused to {'cordon' if unschedulable else 'uncordon'} node "
                f"{node!r}: {exc.status} {status_message(exc)}"
            ) from None

    def cordon(self, node: str) -> str:
        """Cordon ``node`` (remembered first, so cleanup uncordons it); what was done."""
        api = self._api()
        current = self.read_node(api, node, f"cordon: true (cordoning node {node!r})")
        if (current.get("spec") or {}).get("unschedulable"):
            return f"node {node} was already cordoned (left so at cleanup)"
        self.cordoned.append(node)
        self._patch(api, node, True, dry_run=False, why=f"cordoning node {node!r}")
        return f"cordoned node {node} (uncordoned at cleanup)"

    def uncordon_all(self) -> list[str]:
        """Uncordon every node this drill cordoned; what could not be, with the fix."""
        nodes, self.cordoned = list(dict.fromkeys(self.cordoned)), []
        stuck = []
        for node in nodes:
            try:
                self._patch(self._api(), node, False, dry_run=False, why="uncordon at cleanup")
                self.uncordoned.append(node)
            except Exception as exc:  # every node gets its try; each failure is reported
                stuck.append(f"node {node}: {exc} (fix: kubectl uncordon {node})")
        return stuck

    # ------------------------------------------------------------------ the faults

    def _target_gone(self, node: str, target: Worker, victims: list[Worker]) -> KillResult | None:
        """ALREADY_GONE when ``target`` is not among the job's pods on ``node`` any more."""
        if target.instance_id in {w.instance_id for w in victims}:
            return None
        return KillResult(
            KillOutcome.ALREADY_GONE,
            self.session.clock.now(),
            f"pod {target.name!r} (uid {target.instance_id}) is no longer on node {node}; "
            "nothing was touched",
        )

    def kill_node(self, node: str, target: Worker, *, dry_run: bool, cordon: bool) -> KillResult:
        """KillNode: (cordon, then) delete every pod of the job on ``node``, grace 0."""
        now = self.session.clock.now
        victims = self.job_pods_on(node, "KillNode")
        gone = self._target_gone(node, target, victims)
        if gone is not None:
            return gone
        names = ", ".join(f"{w.name} (rank {w.rank})" for w in victims)
        if dry_run:
            if cordon:
                self.check_rights(node, cordon=True, evict=None)
            for worker in victims:
                result = delete_instance(self.session, worker, dry_run=True)
                if result.outcome is not KillOutcome.DRY_RUN:
                    return result
            more = ", after cordoning it" if cordon else ""
            return KillResult(
                KillOutcome.DRY_RUN,
                now(),
                f"would delete the job's pods on node {node}{more}: {names}",
            )
        done = [self.cordon(node)] if cordon else []
        first_sent: float | None = None
        outcomes = []
        for worker in victims:
            result = delete_instance(self.session, worker, dry_run=False)
            outcomes.append((worker, result))
            if result.outcome is KillOutcome.KILLED and first_sent is None:
                first_sent = result.timestamp
        deleted = [w.name for w, r in outcomes if r.outcome is KillOutcome.KILLED]
        unknown = [
            f"{w.name}: {r.detail}" for w, r in outcomes if r.outcome is KillOutcome.UNCONFIRMED
        ]
        detail = "; ".join(
            [
                *done,
                f"deleted {len(deleted)} pod(s) of the job on node {node} with grace period "
                f"0 and uid preconditions: {', '.join(deleted) or 'none'}",
            ]
        )
        if unknown:
            return KillResult(
                KillOutcome.UNCONFIRMED, now(), detail + "; unknown: " + "; ".join(unknown)
            )
        if first_sent is None:
            return KillResult(KillOutcome.ALREADY_GONE, now(), detail)
        return KillResult(KillOutcome.KILLED, first_sent, detail)

    def _evict(self, worker: Worker, *, dry_run: bool) -> None:
        """One policy/v1 Eviction of exactly this pod instance (uid precondition)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=worker.name, namespace=self.session.namespace),
            delete_options=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=worker.instance_id),
                dry_run=["All"] if dry_run else None,
            ),
        )
        try:
            self._write(
                self._api().create_namespaced_pod_eviction,
                worker.name,
                self.session.namespace,
                body,
                dry_run=dry_run,
            )
        except ApiException as exc:
            budget = blocking_budget(exc)
            if budget is not None:
                raise BackendError(
                    f"eviction blocked by PodDisruptionBudget {budget} (pod {worker.name!r}, "
                    f"{status_message(exc)}). DrainNode evicts as kubectl drain does and "
                    "honours the budget; raise its maxUnavailable for the drill, or use "
                    "KillNode"
                ) from None
            if exc.status == 403:
                raise self._forbidden(
                    "create", "pods/eviction", f"DrainNode (evicting pod {worker.name!r})", exc
                ) from None
            raise BackendError(
                f"the API server refused to evict pod {worker.name!r}: {exc.status} "
                f"{status_message(exc)}"
            ) from None

    def drain_node(self, node: str, target: Worker, *, dry_run: bool, cordon: bool) -> KillResult:
        """DrainNode: (cordon, then) evict every pod of the job on ``node``; all dry-run
        first, so a PodDisruptionBudget that blocks any of them stops it before any."""
        now = self.session.clock.now
        victims = self.job_pods_on(node, "DrainNode")
        gone = self._target_gone(node, target, victims)
        if gone is not None:
            return gone
        if cordon:
            self.check_rights(node, cordon=True, evict=None)
        for worker in victims:
            self._evict(worker, dry_run=True)
        names = ", ".join(f"{w.name} (rank {w.rank})" for w in victims)
        if dry_run:
            return KillResult(
                KillOutcome.DRY_RUN,
                now(),
                f"the API server accepted dry-run evictions of the "
                f"job's pods on node {node}: {names}",
            )
        done = [self.cordon(node)] if cordon else []
        sent_at = now()
        evicted: list[str] = []
        for worker in victims:
            try:
                self._evict(worker, dry_run=False)
            except BackendError as exc:
                if not evicted:
                    raise
                raise BackendError(f"{exc}; already evicted: {', '.join(evicted)}") from None
            evicted.append(worker.name)
        detail = "; ".join(
            [
                *done,
                f"evicted {len(evicted)} pod(s) of the job on node {node} (policy/v1 "
                f"Eviction, each pod's own grace period): {', '.join(evicted)}",
            ]
        )
        return KillResult(KillOutcome.KILLED, sent_at, detail)
