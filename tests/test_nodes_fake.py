"""Node faults on the fake backend's simulated nodes, through the runner, in milliseconds.

We test these aspects:
- the node seam: discovery names each node (index, name, identity, its ranks); a KillNode
  hits every instance of the target node and nothing of another node; a stale node
  identity is ALREADY_GONE and kills nothing; a dry run touches nothing;
- KillNode: with ``replace`` the replacement node (same index, new identity) is
  re-admitted and the group is judged as any other (PASS from the latest checkpoint,
  FAIL from scratch); ``replace: false`` on an elastic job carries on with fewer ranks,
  and fails on a job that is not elastic;
- the world size before and after a node fault: the WORLD_SIZE on the start lines of the
  group at the kill and of the group that came back, else the backend's, and which;
- PartitionNode: detection is the first worker gone after the cut, checked against
  maxDetectionTime; recovery counts from the cut; the link is restored after
  ``duration``, or when the job noticed; the report says how long the link was cut and
  that the node rejoined;
- decided when proven: a partition or a hang nobody notices FAILs at
  maxDetectionTime + recoveryGrace after the cut or the stop, not at the recovery deadline;
- bad input: nodes 0, targetNode beyond the nodes, a node fault on one node, keys that
  belong to another fault or another backend: validation errors with file:line:key.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.config.schema import DrillConfig
from pytest_recoverygate.engine.machine import FailureReason, KillTarget, Verdict
from pytest_recoverygate.engine.model import KILL, Fault, GroupEvent, GroupEventKind, KillOutcome
from pytest_recoverygate.engine.verdict import DrillResult
from pytest_recoverygate.errors import ConfigError
from pytest_recoverygate.orchestrators.fake import FakeOrchestrator
from pytest_recoverygate.registry import get_backend
from pytest_recoverygate.registry.seams import NodeFaults, Orchestrator, SimulatedClock
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.engine_events import T0
from tests.test_engine_faults import Drill, Life, SimJob

BASE = """\
workload:
  orchestrator: fake
  nodes: {nodes}
  fake: {{workers: 4, stepsPerSecond: 50, checkpointEvery: 20, restartDelay: 2s{fake}}}
injectFailure:
  type: {fault}
  afterCheckpoint: step-40
{failure}expectations:
  resumeFromCheckpoint: latest
  maxRecoveryTime: 2m
{expect}safety:
  requireConfirm: false
"""


def config_of(
    tmp_path: Path,
    fault: str = "KillNode",
    *,
    nodes: int = 2,
    fake: str = "",
    failure: str = "",
    expect: str = "",
    extra: str = "",
) -> DrillConfig:
    text = BASE.format(nodes=nodes, fault=fault, fake=fake, failure=failure, expect=expect)
    return parse_config(text + extra, tmp_path / "drill.yaml")


def drill(config: DrillConfig) -> tuple[DrillResult, FakeOrchestrator, SimulatedClock]:
    clock = SimulatedClock()
    orchestrator = get_backend("fake").create(config.workload, config.inject_failure, clock)
    assert isinstance(orchestrator, FakeOrchestrator)
    result = run_drill(
        config,
        RunOptions(confirmed=True, handle_signals=False),
        clock=clock,
        orchestrator=orchestrator,
    )
    return result, orchestrator, clock


def failed(result: DrillResult) -> list[FailureReason | None]:
    return [c.reason for c in result.checks if c.passed is False]


def details(result: DrillResult) -> dict[str, Any]:
    assert result.recoveries, result.summary
    return dict(result.recoveries[-1].fault_details)


# ------------------------------------------------------------------- the node seam


def test_discovery_names_each_node_with_its_ranks_and_an_identity() -> None:
    job = FakeOrchestrator(clock=SimulatedClock(), workers=4, nodes=2)
    _: Orchestrator = job
    assert isinstance(job, NodeFaults)
    workload = job.discover(deadline=0.0)
    assert [(n.index, n.name, [w.rank for w in n.workers]) for n in workload.nodes] == [
        (0, "fake-node-0", [0, 1]),
        (1, "fake-node-1", [2, 3]),
    ]
    assert len({n.identity for n in workload.nodes}) == 2
    assert all(w.node == n.name for n in workload.nodes for w in n.workers)
    assert workload.node_of(workload.workers[3]) == workload.nodes[1]


def test_a_node_kill_with_a_stale_identity_or_a_dry_run_touches_nothing() -> None:
    clock = SimulatedClock()
    job = FakeOrchestrator(clock=clock, workers=4, nodes=2)
    node = job.discover(deadline=0.0).nodes[1]
    clock.advance(1.0)
    dry = job.kill_node(node, dry_run=True, fault=Fault("KillNode"))
    stale = job.kill_node(
        type(node)(node.index, node.name, node.identity + "-old", node.workers),
        dry_run=False,
        fault=Fault("KillNode"),
    )
    assert dry.outcome is KillOutcome.DRY_RUN
    assert stale.outcome is KillOutcome.ALREADY_GONE
    assert job.current_node(1) == node  # still running, same instances
    assert job.restore_node(node).outcome is KillOutcome.ALREADY_GONE  # nothing was cut


def test_a_node_kill_ends_every_rank_of_that_node_and_a_replacement_node_comes_up() -> None:
    clock = SimulatedClock()
    job = FakeOrchestrator(clock=clock, workers=4, nodes=2, restart_delay=2.0)
    node = job.discover(deadline=0.0).nodes[1]
    clock.advance(1.0)

    result = job.kill_node(node, dry_run=False, fault=Fault("KillNode"))

    assert result.outcome is KillOutcome.KILLED
    assert [w.rank for w, _ in job.kills] == [2, 3]  # the node's instances, no other
    assert job.current_node(1) is None  # the group is down
    clock.advance(2.5)
    kinds = [e.kind for e in job.watch_group()]
    assert GroupEventKind.NODE_GONE in kinds
    assert GroupEventKind.NODE_REPLACEMENT_STARTED in kinds
    replacement = job.current_node(1)
    assert replacement is not None
    assert replacement.identity != node.identity
    assert {w.instance_id for w in replacement.workers}.isdisjoint(
        {w.instance_id for w in node.workers}
    )
    again = job.kill_node(node, dry_run=False, fault=Fault("KillNode"))
    assert again.outcome is KillOutcome.ALREADY_GONE  # never the replacement
    assert job.kill(node.workers[0], dry_run=False, fault=KILL).outcome is (
        KillOutcome.ALREADY_GONE
    )


# ------------------------------------------------------------------------ KillNode


def test_a_killed_node_replaced_resumes_from_the_latest_checkpoint_and_passes(
    tmp_path: Path,
) -> None:
    result, job, _ = drill(config_of(tmp_path, failure="  targetNode: 1\n  replace: true\n"))

    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == 40
    assert [w.rank for w, _ in job.kills] == [2, 3]
    figures = details(result)
    assert figures["replaceNode"] is True
    assert 0 < figures["replacementNodeStartedSeconds"] < result.recovery_time_seconds
    assert (figures["worldSizeBefore"], figures["worldSizeAfter"]) == (4, 4)
    assert (figures["worldSizeBeforeFrom"], figures["worldSizeAfterFrom"]) == (
        "startLines",
        "startLines",
    )


def test_a_killed_node_whose_job_restarts_from_scratch_fails(tmp_path: Path) -> None:
    result, _, _ = drill(config_of(tmp_path, fake=", resume: zero"))

    assert result.verdict is Verdict.FAIL
    assert FailureReason.RESTARTED_FROM_SCRATCH in failed(result)


def test_the_default_target_node_is_the_one_hosting_target_rank(tmp_path: Path) -> None:
    result, job, _ = drill(config_of(tmp_path, failure="  targetRank: 1\n"))

    assert result.verdict is Verdict.PASS, result.summary
    assert [w.rank for w, _ in job.kills] == [0, 1]  # node 0 hosts rank 1


def test_an_elastic_job_carries_on_with_fewer_ranks_after_a_node_stays_dead(
    tmp_path: Path,
) -> None:
    result, job, _ = drill(config_of(tmp_path, failure="  replace: false\n"))

    assert result.verdict is Verdict.PASS, result.summary
    assert details(result)["replaceNode"] is False
    assert (details(result)["worldSizeBefore"], details(result)["worldSizeAfter"]) == (4, 2)
    assert details(result)["worldSizeAfterFrom"] == "startLines"
    assert [n.index for n in job.discover(0.0).nodes] == [1]  # node 0 hosted rank 1
    assert len(job.discover(0.0).workers) == 2


def test_the_world_size_comes_from_the_backend_when_the_job_prints_no_start_lines(
    tmp_path: Path,
) -> None:
    config = config_of(tmp_path, failure="  replace: false\n")
    clock = SimulatedClock()
    job = FakeOrchestrator(
        clock=clock, workers=4, nodes=2, restart_delay=2.0, checkpoint_every=20, start_events=False
    )
    result = run_drill(
        config, RunOptions(confirmed=True, handle_signals=False), clock=clock, orchestrator=job
    )

    assert result.verdict is Verdict.PASS, result.summary
    figures = details(result)
    assert (figures["worldSizeBefore"], figures["worldSizeAfter"]) == (4, 2)
    assert (figures["worldSizeBeforeFrom"], figures["worldSizeAfterFrom"]) == ("backend", "backend")


class SizedJob(SimJob):
    """A job whose start lines carry WORLD_SIZE ``sizes[i]`` (incarnation i; None: absent)
    and whose backend reports ``backend`` workers after the kill."""

    def __init__(self, sizes: tuple[int | None, ...], backend: int) -> None:
        self.sizes, self.backend = sizes, backend
        super().__init__()

    def _life(self, start: float, resume: int, loaded: int | None) -> Life:
        life = super()._life(start, resume, loaded)
        size = self.sizes[min(len(getattr(self, "lives", [])), len(self.sizes) - 1)]
        life.events[0] = dataclasses.replace(life.events[0], world_size=size)
        return life

    def kill(self, target: KillTarget, at: float) -> None:
        super().kill(target, at)
        running = GroupEventKind.REPLACEMENT_RUNNING
        self.group.append(GroupEvent(running, T0 + at + 1.0, world_size=self.backend))


@pytest.mark.parametrize(
    ("sizes", "expected", "sources"),
    [
        ((2, 1), (2, 1), ("startLines", "startLines")),  # the lines win over the backend
        ((2, None), (2, 3), ("startLines", "backend")),  # the replacement printed none
        ((None, None), (4, 3), ("backend", "backend")),
    ],
)
def test_the_world_size_before_and_after_is_the_start_lines_else_the_backends(
    sizes: tuple[int | None, ...], expected: tuple[int, int], sources: tuple[str, str]
) -> None:
    engine_drill = Drill(SizedJob(sizes, backend=3), fault="KillNode")
    engine_drill.engine.discovered(T0, "test", world_size=4)  # the backend found 4 workers

    result = engine_drill.run()

    assert result.verdict is Verdict.PASS, result.summary
    figures = dict(result.recoveries[0].fault_details)
    assert (figures["worldSizeBefore"], figures["worldSizeAfter"]) == expected
    assert (figures["worldSizeBeforeFrom"], figures["worldSizeAfterFrom"]) == sources


def test_a_job_that_is_not_elastic_fails_when_a_node_stays_dead(tmp_path: Path) -> None:
    result, _, _ = drill(config_of(tmp_path, fake=", elastic: false", failure="  replace: false\n"))

    assert result.verdict is Verdict.FAIL
    assert FailureReason.NEVER_CAME_BACK in failed(result)


# ------------------------------------------------------------------- PartitionNode


def test_a_partition_noticed_by_the_collective_timeout_rejoins_and_passes(
    tmp_path: Path,
) -> None:
    config = config_of(
        tmp_path, "PartitionNode", fake=", hangTimeout: 10s", expect="  maxDetectionTime: 30s\n"
    )
    result, job, _ = drill(config)

    assert result.verdict is Verdict.PASS, result.summary
    figures = details(result)
    assert figures["detectionSeconds"] == pytest.approx(10.0, abs=0.1)
    assert figures["partitionSeconds"] == pytest.approx(10.0, abs=0.1)  # restored once noticed
    assert figures["nodeOutcome"] == "rejoined"
    assert result.recovery_time_seconds is not None
    assert result.recovery_time_seconds > 12.0  # from the cut: noticed 10 s + restart 2 s
    assert len(job.restores) == 1


def test_a_partition_with_a_duration_stays_cut_that_long(tmp_path: Path) -> None:
    config = config_of(
        tmp_path,
        "PartitionNode",
        fake=", hangTimeout: 10s",
        failure="  duration: 20s\n",
        expect="  maxDetectionTime: 30s\n",
    )
    result, _, _ = drill(config)

    assert result.verdict is Verdict.PASS, result.summary
    figures = details(result)
    assert figures["detectionSeconds"] == pytest.approx(10.0, abs=0.1)
    assert figures["partitionSeconds"] == pytest.approx(20.0, abs=0.1)
    assert result.recovery_time_seconds is not None
    assert result.recovery_time_seconds > 22.0  # the agents re-rendezvous once it is back


@pytest.mark.parametrize("fault", ["PartitionNode", "HangWorker"])
def test_nobody_noticing_fails_at_max_detection_time_plus_grace(fault: str, tmp_path: Path) -> None:
    config = config_of(
        tmp_path,
        fault,
        expect="  maxDetectionTime: 30s\n",
        extra="timeouts: {recoveryGrace: 30s}\n",
    )  # fake.hangTimeout left at 30 minutes: nothing times out
    result, _, _ = drill(config)

    assert result.verdict is Verdict.FAIL
    assert failed(result)[0] is FailureReason.HANG_NOT_DETECTED
    assert result.kill_time is not None
    assert result.finished_at is not None
    assert result.finished_at - result.kill_time == pytest.approx(60.0, abs=0.2)  # not 150 s


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("kwargs", "line", "key", "says"),
    [
        ({"nodes": 0}, 3, "workload.nodes", "1 to 64"),
        ({"nodes": 3}, 3, "workload.nodes", "does not divide the job's 4 workers"),
        ({"nodes": 1}, 6, "injectFailure.type", "needs a job on two nodes or more"),
        (
            {"failure": "  targetNode: 2\n"},
            8,
            "injectFailure.targetNode",
            "node 2 does not exist in a job of 2 node(s)",
        ),
        (
            {"fault": "KillWorker", "failure": "  targetNode: 1\n"},
            8,
            "injectFailure.targetNode",
            "applies to type: KillNode, PartitionNode, DrainNode or StickyFault only",
        ),
        (
            {"failure": "  duration: 20s\n"},
            8,
            "injectFailure.duration",
            "applies to type: PartitionNode or StorageFault only",
        ),
        (
            {"fault": "PartitionNode", "failure": "  replace: true\n"},
            8,
            "injectFailure.replace",
            "applies to type: KillNode only",
        ),
        ({"failure": "  drainNode: true\n"}, 8, "injectFailure.drainNode", "needs orchestrator"),
        ({"failure": "  cordon: true\n"}, 8, "injectFailure.cordon", "needs orchestrator"),
        (
            {"expect": "  maxDetectionTime: 30s\n"},
            11,
            "expectations.maxDetectionTime",
            "HangWorker or PartitionNode only",
        ),
    ],
)
def test_bad_node_input_is_a_validation_error_with_file_line_and_key(
    kwargs: dict[str, Any], line: int, key: str, says: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        config_of(tmp_path, **kwargs)
    message = str(caught.value)
    assert f"drill.yaml:{line}: {key}:" in message, message
    assert says in message, message


# ------------------------------------------------------------------ local placeholders


def test_the_local_node_placeholders_expand_and_other_braces_stay() -> None:
    from pytest_recoverygate.orchestrators.local.nodes import PLACEHOLDERS, expand

    values = {name: f"<{name}>" for name in PLACEHOLDERS}
    text = "--rank={nodeRank} --of={nnodes} {rdzvEndpoint} {sharedDir}/c {nodeDir} {tmpdir} {x}"
    assert expand(text, values) == (
        "--rank=<nodeRank> --of=<nnodes> <rdzvEndpoint> <sharedDir>/c <nodeDir> {tmpdir} {x}"
    )


def test_a_local_multi_node_workload_refuses_attach_pid(tmp_path: Path) -> None:
    text = f"""\
workload:
  orchestrator: local
  nodes: 2
  attachPid: 1234
  workdir: {tmp_path}
injectFailure: {{type: KillNode, afterCheckpoint: next}}
expectations: {{maxRecoveryTime: 1m}}
"""
    with pytest.raises(ConfigError, match=r"drill.yaml:3: workload.nodes: cannot be combined"):
        parse_config(text, tmp_path / "drill.yaml")


def test_a_dry_run_node_fault_reaches_the_trigger_and_touches_nothing(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    config = config.model_copy(
        update={"safety": config.safety.model_copy(update={"dry_run": True})}
    )
    result, job, _ = drill(config)

    assert result.verdict is Verdict.DRY_RUN, result.summary
    assert [(w.rank, dry) for w, dry in job.kills] == [(0, True), (1, True)]  # node 0, checked
    assert [f.type for f in job.faults] == ["KillNode"]
    assert job.restores == []
