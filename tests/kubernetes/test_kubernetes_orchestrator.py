"""KubernetesOrchestrator against the fake API server, over real HTTP, with the real client.

We test these aspects:
- discovery: ranks of PyTorchJob (with and without a Master) and TrainJob pods, the
  fallbacks (``rank`` label, ``RANK`` env), and every refusal (empty selector, no pods,
  two jobs, a rank claimed twice, a pod without a rank, a bad selector, an absent target);
- the kill: exactly one DELETE, carrying the uid precondition and grace period 0; 409
  (replaced already) is ALREADY_GONE; a dry run sends only ``dryRun=All``; a reset before
  or after the server acted, a 500 and a 429 never lead to a second destructive delete;
  a kill confirmed by a slow list is stamped when its DELETE was sent;
- the group watch: worker gone, replacement Pending then Running, for both job kinds,
  across dropped watches and 410; job failures (CrashLoopBackOff, every pod Failed);
- the events: kubelet timestamps as receive times, a log stream reopened after the
  container restarts and on the replacement pod (400 while Pending), re-sent lines dropped;
- permissions: 403 gives a clear error naming the verb and rbac.yaml; a whole drill's
  requests stay within the RBAC allow-list.
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
from pytest_recoverygate.errors import DiscoveryError, PermissionDeniedError
from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator
from pytest_recoverygate.registry.seams import Orchestrator
from tests.kubernetes.fake_apiserver import (
    RBAC_DRILL_RULES,
    FakeApiServer,
    Fault,
    LoggedRequest,
    RequestInfo,
)
from tests.kubernetes.fake_cluster import NAMESPACE, FakeTrainingJob, pytorchjob_pod, trainjob_pod
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


# ---------------------------------------------------------------------- conformance


def test_it_satisfies_the_orchestrator_protocol(make_orchestrator: MakeOrchestrator) -> None:
    orchestrator: Orchestrator = make_orchestrator(selector="a=b")
    assert isinstance(orchestrator, Orchestrator)
    assert orchestrator.name == "kubernetes"


# ---------------------------------------------------------------------- discovery


def test_it_ranks_a_pytorchjob_master_as_zero_and_workers_from_one(
    make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(kind="pytorchjob", nodes=3).start()
    workload = make_orchestrator(selector=job.selector).discover(deadline(PROCESS))
    assert workload.job == "PyTorchJob/llama"
    assert [(w.rank, w.name) for w in workload.workers] == [
        (0, "llama-master-0"),
        (1, "llama-worker-0"),
        (2, "llama-worker-1"),
    ]
    assert workload.by_rank(1).instance_id == job.pod(1)["metadata"]["uid"]  # type: ignore[union-attr]


def test_it_ranks_pytorchjob_workers_from_zero_without_a_master(
    apiserver: FakeApiServer, make_orchestrator: MakeOrchestrator
) -> None:
    for index in range(2):
        apiserver.create_pod(pytorchjob_pod("elastic", "worker", index))
    workload = make_orchestrator(selector="training-run=elastic").discover(deadline(PROCESS))
    assert [(w.rank, w.name) for w in workload.workers] == [
        (0, "elastic-worker-0"),
        (1, "elastic-worker-1"),
    ]


@pytest.mark.parametrize("as_label", [True, False], ids=["label", "annotation"])
def test_it_ranks_trainjob_nodes_by_completion_index_and_skips_initializers(
    apiserver: FakeApiServer, make_orchestrator: MakeOrchestrator, as_label: bool
) -> None:
    apiserver.create_pod(trainjob_pod("tj", 0, replicated_job="dataset-initializer"))
    for index in (1, 0):
        apiserver.create_pod(trainjob_pod("tj", index, as_label=as_label))
    workload = make_orchestrator(selector="training-run=tj").discover(deadline(PROCESS))
    assert workload.job == "TrainJob/tj"
    assert [w.rank for w in workload.workers] == [0, 1]
    assert all(w.name.startswith(f"tj-node-0-{w.rank}-") for w in workload.workers)


def test_it_falls_back_to_a_rank_label_and_then_to_the_rank_env(
    apiserver: FakeApiServer, make_orchestrator: MakeOrchestrator
) -> None:
    apiserver.create_pod(
        {"metadata": {"name": "a", "namespace": NAMESPACE, "labels": {"app": "t", "rank": "1"}}}
    )
    apiserver.create_pod(
        {
            "metadata": {"name": "b", "namespace": NAMESPACE, "labels": {"app": "t"}},
            "spec": {"containers": [{"name": "c", "env": [{"name": "RANK", "value": "0"}]}]},
        }
    )
    workload = make_orchestrator(selector="app=t").discover(deadline(PROCESS))
    assert [(w.rank, w.name) for w in workload.workers] == [(0, "b"), (1, "a")]


def test_it_refuses_an_empty_selector_before_any_request(
    apiserver: FakeApiServer, make_orchestrator: MakeOrchestrator
) -> None:
    with pytest.raises(DiscoveryError, match="empty label selector"):
        make_orchestrator(selector="  ").discover(deadline(PROCESS))
    assert apiserver.requests == []


def test_it_refuses_when_no_pod_matches(make_orchestrator: MakeOrchestrator) -> None:
    with pytest.raises(
        DiscoveryError, match=r"no pods match selector 'training-run=nothing'.*kubectl get pods"
    ):
        make_orchestrator(selector="training-run=nothing").discover(deadline(PROCESS))


def test_it_refuses_a_selector_that_matches_two_jobs(
    apiserver: FakeApiServer, make_orchestrator: MakeOrchestrator
) -> None:
    apiserver.create_pod(pytorchjob_pod("one", "master", 0))
    apiserver.create_pod(pytorchjob_pod("two", "master", 0))
    with pytest.raises(
        DiscoveryError, match="matches pods of 2 jobs.*PyTorchJob/one, PyTorchJob/two"
    ):
        make_orchestrator(selector="training.kubeflow.org/replica-type=master").discover(
            deadline(PROCESS)
        )


def test_it_refuses_a_target_rank_that_does_not_exist(
    make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2).start()
    with pytest.raises(DiscoveryError, match=r"target rank 5 is not among the ranks .*\(0, 1\)"):
        make_orchestrator(selector=job.selector, target_rank=5).discover(deadline(PROCESS))


def test_it_refuses_two_live_pods_claiming_one_rank(
    apiserver: FakeApiServer, make_orchestrator: MakeOrchestrator
) -> None:
    for name in ("x", "y"):
        apiserver.create_pod(
            {
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "labels": {"app": "d", "rank": "1"},
                }
            }
        )
    with pytest.raises(DiscoveryError, match="2 pods claim rank 1"):
        make_orchestrator(selector="app=d").discover(deadline(PROCESS))


def test_it_refuses_a_pod_whose_rank_it_cannot_tell(
    apiserver: FakeApiServer, make_orchestrator: MakeOrchestrator
) -> None:
    apiserver.create_pod(
        {"metadata": {"name": "mystery", "namespace": NAMESPACE, "labels": {"app": "m"}}}
    )
    with pytest.raises(DiscoveryError, match="cannot tell the rank of pod 'mystery'"):
        make_orchestrator(selector="app=m").discover(deadline(PROCESS))


def test_it_reports_a_malformed_selector_as_a_discovery_error(
    make_orchestrator: MakeOrchestrator,
) -> None:
    with pytest.raises(DiscoveryError, match="rejected selector"):
        make_orchestrator(selector="app in (a,").discover(deadline(PROCESS))


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


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_it_kills_exactly_one_instance_and_sees_its_replacement_run(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator, kind: str
) -> None:
    job = make_job(kind=kind, nodes=3).start(wait_for_checkpoint=10)
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    result = orchestrator.kill(victim, dry_run=False)
    assert result.outcome is KillOutcome.KILLED
    events = gather(
        orchestrator.watch_group,
        has(GroupEventKind.REPLACEMENT_RUNNING),
        "replacement running",
        PROMPT,
    )
    kinds = [e.kind for e in events]
    assert kinds[0] is GroupEventKind.WORKER_GONE
    assert kinds.index(GroupEventKind.REPLACEMENT_PENDING) < kinds.index(
        GroupEventKind.REPLACEMENT_RUNNING
    )
    replacement = events[-1].worker
    assert replacement is not None
    assert replacement.rank == 1
    assert replacement.instance_id != victim.instance_id
    assert (replacement.name == victim.name) is (kind == "pytorchjob")
    assert delete_requests(apiserver) == [(victim.name, victim.instance_id, False, True)]
    delete = apiserver.deletes()[0]
    assert delete.target_uid == victim.instance_id
    assert apiserver.requests_outside(RBAC_DRILL_RULES) == []


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


def test_it_reports_already_gone_on_409_and_never_touches_the_replacement(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2, recreate_delay=0.0).start()
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    # someone else deletes the pod (no finalizer: it is gone at once) and the operator replaces it
    apiserver.update_pod(
        NAMESPACE,
        victim.name,
        lambda p: p["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"),
    )
    eventually(lambda: job.replaced, "the operator's replacement", PROMPT)
    replacement_uid = job.pod(1)["metadata"]["uid"]
    result = orchestrator.kill(victim, dry_run=False)
    assert result.outcome is KillOutcome.ALREADY_GONE
    assert "409" in result.detail
    assert delete_requests(apiserver) == [(victim.name, victim.instance_id, False, False)]
    assert job.pod(1)["metadata"]["uid"] == replacement_uid


def test_a_dry_run_sends_only_a_dry_run_delete_and_changes_nothing(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2).start()
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    result = orchestrator.kill(victim, dry_run=True)
    assert result.outcome is KillOutcome.DRY_RUN
    assert [(r.query.get("dryRun"), r.acted) for r in apiserver.deletes()] == [("All", False)]
    assert job.pod(1)["metadata"]["uid"] == victim.instance_id
    stays(lambda: orchestrator.watch_group() == [], "no change to the group")


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


def test_a_403_on_the_delete_names_the_verb_and_the_rbac_example(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2).start()
    apiserver.allowed = RBAC_DRILL_RULES - {("delete", "pods")}
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    with pytest.raises(
        PermissionDeniedError, match=r"refused to delete pods.*examples/kubernetes/rbac.yaml"
    ):
        orchestrator.kill(victim, dry_run=True)
    assert job.pod(1)["metadata"]["uid"] == victim.instance_id


def test_a_403_on_list_is_a_clear_error(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2).start()
    apiserver.allowed = frozenset()
    with pytest.raises(
        PermissionDeniedError, match=r"refused to list pods in namespace 'training'.*cannot list"
    ):
        make_orchestrator(selector=job.selector).discover(deadline(PROCESS))


def test_a_403_on_pods_log_surfaces_from_the_event_source(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2).start()
    apiserver.allowed = RBAC_DRILL_RULES - {("get", "pods/log")}
    orchestrator = make_orchestrator(selector=job.selector)
    orchestrator.discover(deadline(PROCESS))
    with pytest.raises(PermissionDeniedError, match="refused to get pods/log"):
        eventually(lambda: orchestrator.events().poll() and False, "the 403", PROMPT)


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


def test_it_reports_a_job_whose_pods_all_failed(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2).start()
    orchestrator = make_orchestrator(selector=job.selector)
    orchestrator.discover(deadline(PROCESS))
    for rank in range(2):
        apiserver.stop_container(NAMESPACE, job.pod_name(rank), exit_code=1, phase="Failed")
    events = gather(orchestrator.watch_group, has(GroupEventKind.JOB_FAILED), "job failed", PROMPT)
    assert "every pod of PyTorchJob/llama is Failed" in events[-1].detail


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


def test_events_carry_the_kubelet_timestamp_as_their_receive_time(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2).start(wait_for_checkpoint=10)
    orchestrator = make_orchestrator(selector=job.selector)
    orchestrator.discover(deadline(PROCESS))
    events = gather(
        orchestrator.events().poll,
        lambda seen: any(e.kind is TrainingEventKind.CHECKPOINT_COMPLETED for e in seen),
        "a checkpoint event",
        PROMPT,
    )
    assert events[0].kind is TrainingEventKind.START
    # the server's own records: each event's receive time is its line's kubelet timestamp,
    # and the lines written before the log was first asked for were received before it
    stamps = [ts for ts, text in apiserver.log_lines(NAMESPACE, job.pod_name(0))]
    assert all(
        e.received is not None and min(abs(e.received - ts) for ts in stamps) < 2e-6 for e in events
    )
    asked = min(r.time for r in apiserver.requests if r.resource == "pods/log")
    early = [e for e in events if e.timestamp < asked]
    assert early and all(e.received is not None and e.received < asked for e in early)
    steps = [e.step for e in events if e.kind is TrainingEventKind.PROGRESS and e.step is not None]
    assert steps == sorted(set(steps))


def test_a_restarted_reporter_container_is_followed_and_lines_are_not_repeated(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(nodes=2, restart_reporter_container=True).start(wait_for_checkpoint=10)
    orchestrator = make_orchestrator(selector=job.selector)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(1)
    assert victim is not None
    orchestrator.kill(victim, dry_run=False)
    events = gather(
        orchestrator.events().poll,
        lambda seen: (
            sum(e.kind is TrainingEventKind.START for e in seen) >= 2
            and any(e.kind is TrainingEventKind.CHECKPOINT_LOADED for e in seen)
        ),
        "the replacement's start and load",
        PROMPT,
    )
    logs = [r for r in apiserver.requests if r.resource == "pods/log"]
    assert len(logs) >= 2
    assert all(r.name == job.pod_name(0) for r in logs)
    keys = [(e.incarnation, e.kind, e.step) for e in events]
    assert len(keys) == len(set(keys))


def test_the_log_stream_moves_to_the_replacement_when_the_reporter_is_killed(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    job = make_job(kind="trainjob", nodes=2, start_delay=0.6).start(wait_for_checkpoint=10)
    orchestrator = make_orchestrator(selector=job.selector, target_rank=0, reporting_rank=0)
    victim = orchestrator.discover(deadline(PROCESS)).by_rank(0)
    assert victim is not None
    orchestrator.kill(victim, dry_run=False)
    events = gather(
        orchestrator.events().poll,
        lambda seen: sum(e.kind is TrainingEventKind.START for e in seen) >= 2,
        "the replacement's start",
        PROMPT,
    )
    new_pod = job.pod_name(0)
    assert new_pod != victim.name
    logs = [(r.name, r.status) for r in apiserver.requests if r.resource == "pods/log"]
    assert (new_pod, 400) in logs, "the replacement's log is asked for while it is Pending"
    assert (new_pod, 200) in logs
    assert events[-1].host == new_pod or any(e.host == new_pod for e in events)


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


def test_cleanup_stops_every_thread_and_may_run_twice(
    make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    import threading

    job = make_job(nodes=2).start()
    orchestrator = make_orchestrator(selector=job.selector)
    orchestrator.discover(deadline(PROCESS))
    orchestrator.cleanup()
    orchestrator.cleanup()
    assert not [t for t in threading.enumerate() if t.name.startswith("recoverygate-k8s")]


def test_it_takes_the_namespace_from_the_kubeconfig_context(
    apiserver: FakeApiServer, make_job: MakeJob, tmp_path: Path
) -> None:
    job = make_job(nodes=2).start()
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "other", namespace=NAMESPACE, context="lab")
    orchestrator = KubernetesOrchestrator(
        selector=job.selector, kubeconfig=kubeconfig, context="lab"
    )
    try:
        assert len(orchestrator.discover(deadline(PROCESS)).workers) == 2
        assert orchestrator.namespace == NAMESPACE
    finally:
        orchestrator.cleanup()


def test_an_unknown_kubeconfig_context_is_a_usage_error(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    from pytest_recoverygate.errors import UsageError

    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kc")
    orchestrator = KubernetesOrchestrator(selector="a=b", kubeconfig=kubeconfig, context="prod")
    with pytest.raises(UsageError, match="context 'prod'"):
        orchestrator.discover(deadline(PROCESS))
    assert apiserver.requests == []


def test_it_reports_a_job_whose_pods_all_succeeded(
    apiserver: FakeApiServer, make_job: MakeJob, make_orchestrator: MakeOrchestrator
) -> None:
    # A short job that recovered and finished: its end is a success (issue 31), not silence.
    job = make_job(nodes=2).start()
    orchestrator = make_orchestrator(selector=job.selector)
    orchestrator.discover(deadline(PROCESS))
    for rank in range(2):
        apiserver.stop_container(NAMESPACE, job.pod_name(rank), exit_code=0, phase="Succeeded")
    events = gather(
        orchestrator.watch_group, has(GroupEventKind.JOB_SUCCEEDED), "job succeeded", PROMPT
    )
    assert "every pod of PyTorchJob/llama is Succeeded" in events[-1].detail
    assert not any(e.kind is GroupEventKind.JOB_FAILED for e in events)
