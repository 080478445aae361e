"""KubernetesOrchestrator against a server that misbehaves on cue: the fake API server.

The real API server (the session's cluster: test_kubernetes_adapter.py,
test_kubernetes_drills.py, test_kubernetes_rbac.py, the contract suite) cannot be made to
answer one request with a 500 or a 429, to reset a connection before or after it acted,
to answer a list slowly, to drop a watch or end it with 410 Gone, or to cut a log stream;
nor does it keep a log of the requests it got, which is how a test sees that a request
was never sent. Those tests are here, over real HTTP with the real client. We test these
aspects:

- discovery: an empty selector is refused before any request; a list retried through a
  500, a 429 and a reset;
- the kill: grace period 0 in the DELETE's body; a reset before or after the server
  acted, a 500 and a 429 never lead to a second destructive delete; a kill confirmed by
  a slow list is stamped when its DELETE was sent;
- the group watch: resumed after drops and re-listed after 410; a replacement held in
  CrashLoopBackOff (the test cluster's kubelets restart a container within 1 s, so the
  state never lasts there) is a job failure; a replacement held Pending never counts as
  running;
- the events: a dropped log stream resumed without duplicates;
- an unknown kubeconfig context is a usage error before any request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_recoverygate.engine.model import (
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    TrainingEventKind,
)
from pytest_recoverygate.errors import DiscoveryError
from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator
from tests.kubernetes.fake_apiserver import (
    FakeApiServer,
    Fault,
    LoggedRequest,
    RequestInfo,
)
from tests.kubernetes.fake_cluster import NAMESPACE, FakeTrainingJob
from tests.patience import PROCESS, PROMPT, deadline, eventually, gather, stays

pytestmark = pytest.mark.kubernetes

MakeJob = Callable[..., FakeTrainingJob]
MakeOrchestrator = Callable[..., KubernetesOrchestrator]


def has(kind: GroupEventKind) -> Callable[[list[GroupEvent]], bool]:
    return lambda seen: any(e.kind is kind for e in seen)


def watches(server: FakeApiServer) -> list[LoggedRequest]:
    """The watch requests the server logged, in order."""
    return [r for r in server.requests if r.verb == "watch"]


def delete_requests(server: FakeApiServer) -> list[tuple[str, str | None, bool, bool]]:
    return [(r.name, r.precondition_uid, r.dry_run, r.acted) for r in server.deletes()]


def faults_on(method: str, fault: Fault, times: int = 1) -> Callable[[RequestInfo], Fault | None]:
    left = [times]

    def hook(info: RequestInfo) -> Fault | None:
        if info.method == method and left[0] > 0:
            left[0] -= 1
            return fault
        return None

    return hook


# ---------------------------------------------------------------------- discovery


def test_it_refuses_an_empty_selector_before_any_request(
    apiserver: FakeApiServer, make_orchestrator: MakeOrchestrator
) -> None:
    with pytest.raises(DiscoveryError, match="empty label selector"):
        make_orchestrator(selector="  ").discover(deadline(PROCESS))
    assert apiserver.requests == []


def test_it_retries_transient_errors_while_listing(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2).start()
    faults = iter([Fault(status=500), Fault(status=429, retry_after=0), Fault(reset_before=True)])
    apiserver.fault_hook = lambda info: next(faults, None) if info.verb == "list" else None
    workload = make_orchestrator(selector=job.selector).discover(deadline(PROCESS))
    assert len(workload.workers) == 2
    assert [r.status for r in apiserver.requests if r.verb == "list"] == [500, 429, None, 200]


# ---------------------------------------------------------------------- the kill


def test_it_sends_grace_period_zero_in_the_delete_options(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    bodies: list[object] = []
    apiserver.fault_hook = lambda info: (
        bodies.append(info.body) if info.method == "DELETE" else None
    )
    job = make_job(nodes=2).start()
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    orchestrator.kill(victim, dry_run=False)
    assert len(bodies) == 1
    assert bodies[0]["gracePeriodSeconds"] == 0  # type: ignore[index]
    assert bodies[0]["preconditions"] == {"uid": victim.instance_id}  # type: ignore[index]


def test_a_reset_before_the_server_acted_is_unconfirmed_and_not_resent(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2).start()
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    apiserver.fault_hook = faults_on("DELETE", Fault(reset_before=True))
    result = orchestrator.kill(victim, dry_run=False)
    assert result.outcome is KillOutcome.UNCONFIRMED
    assert "not sent again" in result.detail
    assert len(apiserver.deletes()) == 1
    assert job.pod(1)["metadata"]["uid"] == victim.instance_id


def test_a_reset_after_the_server_acted_is_confirmed_by_listing(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2, recreate_delay=1.0).start()
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    apiserver.fault_hook = faults_on("DELETE", Fault(reset_after=True))
    result = orchestrator.kill(victim, dry_run=False)
    assert result.outcome is KillOutcome.KILLED
    assert "took effect" in result.detail
    assert delete_requests(apiserver) == [(victim.name, victim.instance_id, False, True)]


def test_a_kill_confirmed_late_is_stamped_when_the_delete_was_sent(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    # The replacement starts while the confirming list is slow: its lines must come after
    # the kill, or the engine takes the new incarnation for the old one ("never came back").
    job = make_job(nodes=2, recreate_delay=0.02, start_delay=0.05).start(wait_for_checkpoint=5)
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    deleted: list[RequestInfo] = []

    def hook(info: RequestInfo) -> Fault | None:
        if info.method == "DELETE":
            deleted.append(info)
            return Fault(reset_after=True)
        return Fault(delay=1.0) if deleted and info.verb == "list" else None

    apiserver.fault_hook = hook
    result = orchestrator.kill(victim, dry_run=False)
    assert result.outcome is KillOutcome.KILLED and "took effect" in result.detail
    (delete,) = apiserver.deletes()
    assert result.timestamp <= delete.time, "stamped after the DELETE reached the server"
    assert job.replaced, "the replacement was created while the kill was being confirmed"
    assert time.time() - result.timestamp >= 1.0, "the confirmation did take a second"


def test_a_500_on_the_delete_is_checked_and_never_resent(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2).start()
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    apiserver.fault_hook = faults_on("DELETE", Fault(status=500))
    assert orchestrator.kill(victim, dry_run=False).outcome is KillOutcome.UNCONFIRMED
    assert len(apiserver.deletes()) == 1


def test_a_429_on_the_delete_is_resent_with_the_same_precondition(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2).start()
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    apiserver.fault_hook = faults_on("DELETE", Fault(status=429, retry_after=0))
    assert orchestrator.kill(victim, dry_run=False).outcome is KillOutcome.KILLED
    assert [(r.status, r.precondition_uid, r.acted) for r in apiserver.deletes()] == [
        (429, None, False),  # refused before reading the body: nothing acted
        (200, victim.instance_id, True),
    ]


# ---------------------------------------------------------------------- the watch


def test_it_resumes_the_watch_after_drops_and_relists_after_410(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2, recreate_delay=0.5, start_delay=0.5).start()
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    # The server's own request log says where the watch is at each point.
    eventually(lambda: watches(apiserver), "the first watch", PROMPT)
    apiserver.drop_streams()  # a plain drop: resume from the last resourceVersion
    eventually(lambda: len(watches(apiserver)) >= 2, "the resumed watch", PROMPT)
    # Hold the next watch request back (at a gate) while a change happens and the history
    # is compacted: it then asks for a resourceVersion the server has forgotten and gets
    # the 410 ERROR event.
    gate = threading.Event()
    held = iter([Fault(gate=gate)])
    apiserver.fault_hook = lambda info: next(held, None) if info.verb == "watch" else None
    apiserver.drop_streams()
    [held_watch] = eventually(
        lambda: [r for r in watches(apiserver) if r.fault], "the held watch", PROMPT
    )
    apiserver.update_pod(
        NAMESPACE, job.pod_name(0), lambda p: p["metadata"].update(annotations={"x": "1"})
    )
    apiserver.compact()
    gate.set()

    def relisted_and_watching() -> bool:
        relists = [r for r in apiserver.requests if r.verb == "list" and r.seq > held_watch.seq]
        return bool(relists) and any(r.seq > relists[0].seq for r in watches(apiserver))

    eventually(relisted_and_watching, "a re-list after the 410, then a new watch", PROMPT)
    orchestrator.kill(victim, dry_run=False)
    gather(orchestrator.watch_group, has(GroupEventKind.REPLACEMENT_RUNNING), "running", PROMPT)
    watch_log = watches(apiserver)
    assert all(r.query.get("allowWatchBookmarks") in ("true", "True") for r in watch_log)
    assert all(r.query.get("timeoutSeconds") == "5" for r in watch_log)
    assert all(r.query.get("resourceVersion") for r in watch_log)
    verbs = [
        r.verb for r in apiserver.requests if r.resource == "pods" and r.verb in ("list", "watch")
    ]
    assert verbs.count("list") >= 2, "a 410 must be followed by a re-list"
    assert held_watch.lines_sent == 1, "the held watch got only the ERROR"
    assert len(apiserver.deletes()) == 1


def test_it_reports_a_replacement_in_crashloopbackoff_as_job_failed(
    make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2, replacement="crashloop").start()
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    orchestrator.kill(victim, dry_run=False)
    events = gather(orchestrator.watch_group, has(GroupEventKind.JOB_FAILED), "job failed", PROMPT)
    assert "CrashLoopBackOff" in events[-1].detail


def test_a_replacement_that_never_runs_stays_pending(
    make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2, replacement="pending").start()
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    orchestrator.kill(victim, dry_run=False)
    events = gather(
        orchestrator.watch_group, has(GroupEventKind.REPLACEMENT_PENDING), "pending", PROMPT
    )
    assert GroupEventKind.REPLACEMENT_RUNNING not in [e.kind for e in events]
    stays(
        lambda: not has(GroupEventKind.REPLACEMENT_RUNNING)(orchestrator.watch_group()), "pending"
    )


# ---------------------------------------------------------------------- the events


def test_a_dropped_log_stream_is_resumed_without_duplicates(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2, checkpoint_every=5).start(wait_for_checkpoint=30)
    cuts = iter([Fault(drop_after_lines=7), Fault(drop_after_lines=3)])
    apiserver.fault_hook = lambda info: next(cuts, None) if info.resource == "pods/log" else None
    orchestrator = make_orchestrator(selector=job.selector)
    orchestrator.discover(deadline(PROCESS))
    events = gather(
        orchestrator.events().poll,
        lambda seen: sum(e.kind is TrainingEventKind.CHECKPOINT_COMPLETED for e in seen) >= 12,
        "12 checkpoints",
        PROMPT,
    )
    assert len([r for r in apiserver.requests if r.resource == "pods/log"]) >= 3
    progress = [e.step for e in events if e.kind is TrainingEventKind.PROGRESS]
    assert progress == list(range(1, len(progress) + 1)), "every step exactly once, in order"


# ---------------------------------------------------------------------- cleanup and config


def test_an_unknown_kubeconfig_context_is_a_usage_error(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    from pytest_recoverygate.errors import UsageError

    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kc")
    orchestrator = KubernetesOrchestrator(selector="a=b", kubeconfig=kubeconfig, context="prod")
    with pytest.raises(UsageError, match="context 'prod'"):
        orchestrator.discover(deadline(PROCESS))
    assert apiserver.requests == []
