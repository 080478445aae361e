"""The kill protocol: one DELETE of exactly one pod instance, never sent twice once it may
have acted.

- The DELETE carries ``preconditions.uid``, so it can only ever reach the discovered pod
  *instance*: a replacement has another uid and gets 409. Its ``gracePeriodSeconds`` is 0
  for a kill (the kubelet sends SIGKILL at once) and the fault's grace period for
  ``Preempt`` (the kubelet sends SIGTERM, then SIGKILL when the grace period ends: exactly
  what a node drain or a preemption does to a pod; the escalation is the kubelet's, so
  there is no second request to guard).
  Each kill gets a fresh connection pool, so it never rides a stale keep-alive socket.
- It is sent again only after a 429, which the API server's flow control answers before
  any handler runs (the shared :func:`~pytest_recoverygate.shared.retry.send_destructive`). Any
  other failure is *checked* by listing: the uid gone or terminating means KILLED, still
  there means UNCONFIRMED (the runner reports ERROR), and the DELETE is never re-sent.
- KILLED is stamped when the acting DELETE was *sent*, never when its answer or the
  confirming list came back: the pod died no earlier, and a later stamp would make a
  replacement that started meanwhile look like the old incarnation.
- A dry run sends the same DELETE with ``dryRun: [All]`` in its DeleteOptions body:
  authorisation and admission run, nothing is deleted (so the dry run also proves the
  kill would be allowed). In the body, not the query: the apiserver ignores the query of
  a DELETE that has a body (found on the real cluster; the fake server had honoured it).
"""

from __future__ import annotations

import dataclasses

from pytest_recoverygate.engine.model import KillOutcome, KillResult, Worker
from pytest_recoverygate.errors import BackendError, DrillError
from pytest_recoverygate.orchestrators.kubernetes.api import (
    ApiSession,
    is_transient,
    status_message,
)
from pytest_recoverygate.orchestrators.kubernetes.pods import is_terminating, pod_uid
from pytest_recoverygate.shared.retry import send_destructive

__all__ = ["REFUSALS_RESENT", "delete_instance"]

#: How often a 429 (nothing was deleted) is answered with the same DELETE again.
REFUSALS_RESENT = 3


def delete_instance(
    session: ApiSession, worker: Worker, *, dry_run: bool, grace_seconds: int = 0
) -> KillResult:
    """One DELETE of exactly this pod instance (uid precondition, ``grace_seconds``)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    clock = session.clock
    api = session.new_api()  # a fresh pool: the DELETE never rides a stale keep-alive socket
    # dryRun goes in the body: with a body, the apiserver reads the DeleteOptions from it
    # alone and ignores the query (k8s.io/apiserver's handlers/delete.go), so the client's
    # dry_run="All" query parameter beside this body would delete the pod for real.
    body = client.V1DeleteOptions(
        grace_period_seconds=grace_seconds,
        preconditions=client.V1Preconditions(uid=worker.instance_id),
        dry_run=["All"] if dry_run else None,
    )
    target = f"pod {worker.name!r} (uid {worker.instance_id}) in namespace {session.namespace!r}"

    def result(outcome: KillOutcome, detail: str, *, at: float | None = None) -> KillResult:
        """A kill result stamped ``at`` (when the acting DELETE was sent), else now."""
        return KillResult(
            outcome=outcome, timestamp=clock.now() if at is None else at, detail=detail
        )

    sent_at = clock.now()

    def delete() -> None:
        nonlocal sent_at
        # The pod cannot have died before this DELETE left: stamp the kill here, not when
        # the answer (or the confirming list) came back. The engine counts lines stamped
        # after the kill as the new incarnation, so an early stamp is the safe side; a
        # late one makes a replacement that started meanwhile look old ("never came back").
        sent_at = clock.now()
        resp = api.delete_namespaced_pod(
            worker.name,
            session.namespace,
            body=body,
            _preload_content=False,
            _request_timeout=(5, session.request_timeout),
        )
        resp.release_conn()

    if dry_run:
        try:  # a dry run changes nothing: safe to retry like a read
            session.read("delete", "pods", delete, passthrough=frozenset({404, 409}))
        except ApiException as exc:
            return result(
                KillOutcome.ALREADY_GONE,
                f"{target} no longer exists ({exc.status}: {status_message(exc)})",
            )
        return result(KillOutcome.DRY_RUN, f"the API server accepted a dry-run delete of {target}")

    try:
        # The apiserver's flow control answers 429 before any handler runs, so nothing was
        # deleted; the uid precondition guards the re-send anyway.
        send_destructive(
            delete,
            never_acted=lambda exc: isinstance(exc, ApiException) and exc.status == 429,
            policy=dataclasses.replace(session.retry, attempts=REFUSALS_RESENT + 1),
        )
    except ApiException as exc:
        if exc.status in (404, 409):
            return result(
                KillOutcome.ALREADY_GONE,
                f"{target} was already gone ({exc.status}: {status_message(exc)}); "
                "nothing else was deleted",
            )
        if exc.status == 403:
            raise session.forbidden("delete", "pods", exc) from None
        if exc.status is not None and 400 <= exc.status < 500:
            raise BackendError(
                f"the API server refused to delete {target}: {exc.status} {status_message(exc)}"
            ) from None
        return _confirm(
            session,
            worker,
            f"the delete of {target} got {exc.status} {status_message(exc)}",
            sent_at,
        )
    except Exception as exc:
        if not is_transient(exc):
            raise
        return _confirm(
            session,
            worker,
            f"the connection failed during the delete of {target} ({type(exc).__name__})",
            sent_at,
        )
    how = (
        "with grace period 0"
        if grace_seconds == 0
        else f"with grace period {grace_seconds}s (the kubelet sends SIGTERM, then SIGKILL "
        f"after {grace_seconds}s)"
    )
    return result(KillOutcome.KILLED, f"deleted {target} {how}", at=sent_at)


def _confirm(session: ApiSession, worker: Worker, why: str, sent_at: float) -> KillResult:
    """After an unanswered delete: look, never re-send. KILLED is stamped ``sent_at``."""
    now = session.clock.now
    try:
        pods, _ = session.list_pods(session.new_api())
    except DrillError as exc:
        return KillResult(
            KillOutcome.UNCONFIRMED, now(), f"{why}; checking afterwards failed too: {exc}"
        )
    pod = next((p for p in pods if pod_uid(p) == worker.instance_id), None)
    if pod is None:
        return KillResult(
            KillOutcome.KILLED,
            sent_at,
            f"{why}; the pod instance is gone, so the delete took effect",
        )
    if is_terminating(pod):
        return KillResult(
            KillOutcome.KILLED,
            sent_at,
            f"{why}; the pod instance is terminating, so the delete took effect",
        )
    return KillResult(
        KillOutcome.UNCONFIRMED,
        now(),
        f"{why}; the pod instance still exists and is not terminating. The delete was not "
        "sent again, so that nothing can be deleted twice",
    )
