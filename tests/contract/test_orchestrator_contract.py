"""The Orchestrator contract, checked once against every backend.

Each test runs for fake (simulated clock), local (real torchrun), kubernetes (the real
client against the real cluster of scripts/kube-cluster) and slurm (a real one-node cluster); the harnesses
are in conftest.py. We test these aspects, as pytest_recoverygate/registry/seams.py
states them:

1. conformance: each adapter is an ``Orchestrator`` for mypy (``conforming: Orchestrator =
   <concrete adapter>`` in every builder) and for ``isinstance`` at run time;
2. discover: one worker per rank 0..n-1, in rank order, each with a name and a distinct
   instance id, and each really running;
3. a kill names an instance: a worker with the right rank and name but a stale instance id
   is ALREADY_GONE (or UNCONFIRMED) and nothing dies, whichever fault of one worker the
   backend offers (KillWorker, KillDuringCheckpoint, Preempt's SIGTERM, HangWorker's SIGSTOP);
4. a dry run is DRY_RUN and nothing dies, for each of those faults;
5. the real kill is KILLED, stamped by the orchestrator's clock; watch_group reports the
   target WORKER_GONE; repeating the kill with the old identity, as each of those faults,
   never hits the replacement;
6. events() is one EventSource whose poll() never blocks and yields TrainingEvents;
7. watch_group() never blocks;
8. cleanup() runs twice, leaves poll() working and no thread of the orchestrator's alive;
9. job_output() (the optional ``JobOutputSource``, implemented by every shipped backend)
   never blocks, holds what the job printed per worker under distinct labels, each
   within the per-worker bound, and still holds it after cleanup();
10. the node seam (``NodeFaults``), required of a backend offering a node fault: discover
   names each node (index, name, identity) with every worker on exactly one of them;
   current_node agrees; a node kill with a stale node identity, and a dry run, touch
   nothing; the real KillNode ends every instance of that node, no instance of another
   node, reports NODE_GONE, and repeated with the old identity hits nothing. They skip on
   a harness job with one node (node faults are refused there); local-nodes runs them on
   two real network namespaces.
"""

from __future__ import annotations

import time

import pytest

from pytest_recoverygate.engine.model import (
    NODE_FAULTS,
    Fault,
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    Node,
    TrainingEvent,
    Worker,
)
from pytest_recoverygate.registry import get_backend
from pytest_recoverygate.registry.seams import (
    EventSource,
    JobOutputSource,
    NodeFaults,
    Orchestrator,
)
from pytest_recoverygate.shared.joboutput import PER_WORKER_LIMIT, JobOutput
from tests.contract.harness import Harness, ThreadSpy
from tests.patience import QUIET, within

NON_BLOCKING = 0.5  # seconds a never-blocking call may take (stretched by the slack)
NOTHING_KILLED = {KillOutcome.ALREADY_GONE, KillOutcome.UNCONFIRMED}


def everyone_alive(backend: Harness) -> list[Worker]:
    """The discovered workers that are no longer running (empty when all are)."""
    return [w for w in backend.workload.workers if not backend.alive(w)]


def assert_nothing_died(backend: Harness, result: KillResult, expected: set[KillOutcome]) -> None:
    """After a kill that must touch nothing: the outcome says so and every worker still runs.

    A job that lost a worker here is marked spoiled, so the next test gets a new one.
    """
    backend.pause(within(QUIET))  # the world shows a kill that should not have happened
    dead = everyone_alive(backend)
    if dead or result.outcome is KillOutcome.KILLED:
        backend.spoiled = True
    assert result.outcome in expected, result
    assert dead == [], f"{result} but these workers died: {[w.describe() for w in dead]}"


def test_it_is_an_orchestrator_for_mypy_and_at_run_time(backend: Harness) -> None:
    orchestrator = backend.orchestrator
    assert isinstance(orchestrator, Orchestrator)
    assert isinstance(orchestrator.events(), EventSource)
    assert orchestrator.name == backend.kind  # the name workload.orchestrator uses


def test_discover_returns_each_rank_once_in_order_with_a_name_and_an_instance_id(
    backend: Harness,
) -> None:
    workload = backend.workload
    ranks = [w.rank for w in workload.workers]
    assert len(ranks) >= 2, workload
    assert ranks == list(range(len(ranks))), f"ranks must be 0..n-1 in order, got {ranks}"
    assert all(w.name.strip() for w in workload.workers), workload
    assert all(w.instance_id.strip() for w in workload.workers), workload
    ids = [w.instance_id for w in workload.workers]
    assert len(set(ids)) == len(ids), f"instance ids must be distinct, got {ids}"
    assert workload.job.strip()
    assert everyone_alive(backend) == [], "discover named workers that are not running"


#: The faults of one worker (each a signal to one instance: SIGKILL, SIGTERM, SIGSTOP).
WORKER_FAULTS = ("KillWorker", "KillDuringCheckpoint", "Preempt", "HangWorker")


def worker_faults(backend: Harness) -> list[Fault]:
    """The faults of one worker the backend offers, each as the kill's ``fault=``."""
    offered = get_backend(backend.kind).faults
    return [Fault(name, grace_period=1.0) for name in WORKER_FAULTS if name in offered]


def test_a_kill_with_a_stale_identity_kills_nothing(backend: Harness) -> None:
    stale = backend.stale(backend.target)

    for fault in worker_faults(backend):
        result = backend.orchestrator.kill(stale, dry_run=False, fault=fault)

        assert_nothing_died(backend, result, NOTHING_KILLED)


def test_a_dry_run_kill_kills_nothing(backend: Harness) -> None:
    for fault in worker_faults(backend):
        result = backend.orchestrator.kill(backend.target, dry_run=True, fault=fault)

        assert_nothing_died(backend, result, {KillOutcome.DRY_RUN})


def test_a_kill_ends_the_target_is_reported_gone_and_never_hits_the_replacement(
    disposable_backend: Harness,
) -> None:
    job = disposable_backend
    target = job.target

    before = job.clock.now()
    result = job.orchestrator.kill(target, dry_run=False)
    after = job.clock.now()

    assert result.outcome is KillOutcome.KILLED, result
    assert before <= result.timestamp <= after, (
        f"kill timestamp {result.timestamp} is not from the orchestrator's clock "
        f"(called between {before} and {after})"
    )
    seen: list[GroupEvent] = []

    def gone() -> GroupEvent | None:
        seen.extend(job.orchestrator.watch_group())
        return next((e for e in seen if e.kind is GroupEventKind.WORKER_GONE), None)

    reported = job.eventually(gone, "WORKER_GONE")
    assert reported.worker is not None, reported
    assert reported.worker.instance_id == target.instance_id, reported
    assert not job.alive(target)

    def replaced() -> Worker | None:
        worker = job.current(target.rank)
        if worker is None or worker.instance_id == target.instance_id:
            return None
        return worker if job.alive(worker) else None

    replacement = job.eventually(replaced, f"replacement of rank {target.rank}")
    for fault in worker_faults(job):  # SIGTERM, SIGSTOP too: never to the replacement
        again = job.orchestrator.kill(target, dry_run=False, fault=fault)

        assert again.outcome in NOTHING_KILLED, (fault.type, again)
    job.pause(within(QUIET))  # the world shows a kill that should not have happened
    assert job.alive(replacement), f"a repeated kill hit the replacement: {again}"


def test_events_is_one_source_whose_poll_never_blocks_and_yields_training_events(
    backend: Harness,
) -> None:
    source = backend.orchestrator.events()
    assert backend.orchestrator.events() is source
    polled: list[object] = []

    def poll() -> list[object] | None:
        started = time.monotonic()
        got = source.poll()
        took = time.monotonic() - started
        assert took < within(NON_BLOCKING), f"poll() blocked for {took:.2f} s"
        assert isinstance(got, list), got
        polled.extend(got)
        return polled or None

    backend.eventually(poll, "training event")
    assert all(isinstance(e, TrainingEvent) for e in polled), polled
    malformed = source.malformed_lines
    assert isinstance(malformed, int) and not isinstance(malformed, bool), malformed


def test_watch_group_never_blocks_and_returns_a_list(backend: Harness) -> None:
    for _ in range(5):
        started = time.monotonic()
        got = backend.orchestrator.watch_group()
        took = time.monotonic() - started
        assert took < within(NON_BLOCKING), f"watch_group() blocked for {took:.2f} s"
        assert isinstance(got, list), got
        assert all(isinstance(e, GroupEvent) for e in got), got
        backend.pause(0.05)


def node_faults_of(backend: Harness) -> NodeFaults:
    """The backend's node seam; skips a backend without node faults or a one-node job."""
    offered = get_backend(backend.kind).faults & set(NODE_FAULTS)
    orchestrator = backend.orchestrator
    if not offered:
        pytest.skip(f"{backend.kind} offers no node fault")
    if len(backend.workload.nodes) < 2:  # node faults are refused on one node
        pytest.skip(f"the {backend.kind} harness job runs on one node")
    assert isinstance(orchestrator, NodeFaults), (
        f"{backend.kind} offers {sorted(offered)} but implements no current_node/kill_node/"
        "restore_node"
    )
    return orchestrator


def test_discover_names_each_node_with_its_workers_and_current_node_agrees(
    backend: Harness,
) -> None:
    nodes = node_faults_of(backend)
    workload = backend.workload
    indexes = [n.index for n in workload.nodes]
    assert indexes == sorted(set(indexes)), indexes
    assert len({n.identity for n in workload.nodes}) == len(indexes), workload.nodes
    placed = [w.instance_id for n in workload.nodes for w in n.workers]
    assert sorted(placed) == sorted(w.instance_id for w in workload.workers), workload
    assert all(w.node == n.name for n in workload.nodes for w in n.workers), workload
    for node in workload.nodes:
        now = nodes.current_node(node.index)
        assert now is not None and now.identity == node.identity, (node, now)


def test_a_node_kill_with_a_stale_node_identity_or_a_dry_run_kills_nothing(
    backend: Harness,
) -> None:
    nodes = node_faults_of(backend)
    node = backend.workload.nodes[-1]
    stale = Node(node.index, node.name, f"{node.identity}-stale", node.workers)

    result = nodes.kill_node(stale, dry_run=False, fault=Fault("KillNode"))
    assert_nothing_died(backend, result, NOTHING_KILLED)
    result = nodes.kill_node(node, dry_run=True, fault=Fault("KillNode"))
    assert_nothing_died(backend, result, {KillOutcome.DRY_RUN})


def test_a_node_kill_ends_every_instance_of_that_node_and_none_of_another(
    disposable_backend: Harness,
) -> None:
    job = disposable_backend
    nodes = node_faults_of(job)
    node = nodes.current_node(job.workload.nodes[-1].index)
    assert node is not None
    others = [
        w
        for n in job.workload.nodes
        if n.index != node.index
        for w in (nodes.current_node(n.index) or n).workers
    ]
    seen: list[GroupEvent] = []

    result = nodes.kill_node(node, dry_run=False, fault=Fault("KillNode"))
    survivors = [w for w in others if job.alive(w)]  # looked at at once: before any restart

    assert result.outcome is KillOutcome.KILLED, result
    assert survivors == others, f"a node kill hit another node: {result}"

    def gone() -> GroupEvent | None:
        seen.extend(job.orchestrator.watch_group())
        return next((e for e in seen if e.kind is GroupEventKind.NODE_GONE), None)

    job.eventually(gone, "NODE_GONE")
    assert [w for w in node.workers if job.alive(w)] == []
    again = nodes.kill_node(node, dry_run=False, fault=Fault("KillNode"))
    assert again.outcome in NOTHING_KILLED, again
    job.spoiled = True  # the job may be down to fewer nodes now


def test_job_output_keeps_what_the_job_printed_per_worker_even_after_cleanup(
    disposable_backend: Harness,
) -> None:
    job = disposable_backend
    orchestrator = job.orchestrator
    assert isinstance(orchestrator, JobOutputSource)
    orchestrator.events().poll()

    def printed() -> JobOutput | None:
        started = time.monotonic()
        output = orchestrator.job_output()
        took = time.monotonic() - started
        assert took < within(NON_BLOCKING), f"job_output() blocked for {took:.2f} s"
        orchestrator.events().poll()
        return output if output.text.strip() else None

    output = job.eventually(printed, "output in job_output()")
    labels = [w.label for w in output.workers]
    assert labels and len(set(labels)) == len(labels), labels
    assert all(label.strip() for label in labels), labels
    assert all(len(w.text.encode()) <= PER_WORKER_LIMIT + 200 for w in output.workers)
    assert output.failing is None or output.failing in labels
    assert isinstance(output.note, str) and output.note

    job.cleaned = True
    orchestrator.cleanup()
    after = orchestrator.job_output()
    for before in output.workers:
        kept = after.get(before.label)
        assert kept is not None, f"{before.label} is gone from job_output() after cleanup()"
        assert kept.text.startswith(before.text[:200]), before.label


def test_cleanup_runs_twice_leaves_poll_working_and_stops_its_threads(
    ended_backend: Harness, thread_spy: ThreadSpy
) -> None:
    job = ended_backend  # the job the job_output check just cleaned up, or a new one
    orchestrator = job.orchestrator

    job.cleaned = True
    orchestrator.cleanup()
    orchestrator.cleanup()

    assert isinstance(orchestrator.events().poll(), list)
    leftover = [t.name for t in thread_spy.alive(job.label)]
    assert leftover == [], f"cleanup() left threads running: {leftover}"
