"""Node faults on the local backend leave nothing behind, and never touch another node.

We test these aspects, with real network namespaces and the torchrun stand-in
(standin_job.py, one agent and one worker per node: a row costs seconds, not torch's
imports) run on two nodes:
- ways out: a PASS (KillNode, the replacement node resumes), a FAIL (PartitionNode that
  nothing notices, decided at maxDetectionTime + grace), an exception raised by the
  backend right after the node kill, one raised while restoring a cut link, and SIGTERM
  to the CLI in the middle of a node's recovery;
- after each: no network namespace of the drill (``ip netns list``), no process carrying
  the row's tag, none left stopped, the drill's folder and owner record gone;
- a KillNode never signals a process of another node: node 0's worker, found at
  discovery, is still the same running process when the drill ends (the stand-in's nodes
  do not rendezvous, so nothing else would have ended it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.durations import parse_duration
from pytest_recoverygate.engine.machine import Verdict
from pytest_recoverygate.engine.model import GroupEvent, GroupEventKind, KillResult, Node, Workload
from pytest_recoverygate.orchestrators.local.netns import missing_capabilities
from pytest_recoverygate.orchestrators.local.nodes import LocalNodesOrchestrator
from pytest_recoverygate.orchestrators.local.processes import Identity
from pytest_recoverygate.orchestrators.local.sweep import RECORD_PREFIX
from pytest_recoverygate.registry.seams import RealClock
from pytest_recoverygate.runner import RunOptions, run_drill
from pytest_recoverygate.shared.lock import lock_dir
from pytest_recoverygate.shared.procs import JobLaunch
from tests.local.test_local_nodes import drill_namespaces, tagged_processes
from tests.patience import JOB, PROMPT, deadline, eventually, within
from tests.reliability.conftest import Figures

# Every row is a two-node drill on real processes in network namespaces (2-5 s): slow.
pytestmark = [
    pytest.mark.local,
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(missing_capabilities()), reason="needs root: CAP_NET_ADMIN, CAP_SYS_ADMIN, ip"
    ),
]

ROOT = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).resolve().parent / "standin_job.py"
STANDIN_ARGS = (
    "--nproc 1 --node-rank {nodeRank} --ckpt {sharedDir}/ckpt{nodeRank} "
    "--ckpt-every 5 --step-time 0.02"
).split()


def drill_yaml(tmp: Path, tag: str, fault: str, **expect: Any) -> Path:
    config = {
        "name": f"nodes-{fault}",
        "workload": {
            "orchestrator": "local",
            "nodes": 2,
            "reportingRank": 1,
            "command": [sys.executable, str(STANDIN), *STANDIN_ARGS],
            "workdir": str(tmp),
            "env": {"RG_TEST_TAG": tag},
        },
        "injectFailure": {"type": fault, "afterCheckpoint": "step-10", "targetNode": 1},
        "expectations": {
            "resumeFromCheckpoint": "latest",
            "maxRecoveryTime": "30s",
            "sustain": "3 steps",
            **expect,
        },
        "safety": {"requireConfirm": False},
        "timeouts": {"discovery": "1m", "checkpoint": "1m", "recoveryGrace": "2s"},
    }
    path = tmp / "drill.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class Watched(LocalNodesOrchestrator):
    """The real multi-node orchestrator, plus eyes on node 0 and injected exceptions."""

    raise_after_node_gone = False
    raise_in_restore = False
    seen_id: str | None = None  # the drill's id: its namespaces are rg<id>-*

    def discover(self, deadline: float) -> Workload:
        workload = super().discover(deadline)
        node0 = workload.node(0)
        assert node0 is not None
        self.node0 = [Identity.parse(w.instance_id) for w in node0.workers]
        return workload

    def watch_group(self) -> list[GroupEvent]:
        events = super().watch_group()
        if self.raise_after_node_gone and any(e.kind is GroupEventKind.NODE_GONE for e in events):
            raise RuntimeError("injected: the backend failed right after the node kill")
        return events

    def restore_node(self, node: Node) -> KillResult:
        if self.raise_in_restore:
            raise RuntimeError("injected: restoring the link failed")
        return super().restore_node(node)

    def cleanup(self) -> None:
        self.node0_alive = all(i is not None and i.process() is not None for i in self.node0)
        with contextlib.suppress(AssertionError):  # the network exists until this cleanup
            self.seen_id = self.drill_id
        super().cleanup()


def build(path: Path) -> tuple[Any, Watched]:
    config = load_config(path)
    workload = config.workload
    env = {**workload.env, "RECOVERYGATE_RANKS": "1"}  # type: ignore[attr-defined]
    orch = Watched(
        JobLaunch(workload.command, workload.workdir, env),  # type: ignore[attr-defined]
        nodes=2,
        clock=RealClock(),
    )
    return config, orch


def cli(path: Path, locks: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "RECOVERYGATE_LOCK_DIR": str(locks),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "reporter")]),
    }
    command = [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(path), "--yes"]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def drill_id_in(locks: Path) -> str:
    """The id of the one drill whose owner record is in ``locks`` (the CLI's lock folder)."""
    (record,) = locks.glob(f"{RECORD_PREFIX}*.json")
    return record.name.removeprefix(RECORD_PREFIX).removesuffix(".json")


def assert_nothing_left(
    tag: str, before: set[str], figures: Figures, drill_id: str | None = None
) -> None:
    """No process of the drill (its tag), none stopped, no namespace of the drill: those
    named rg<drill_id>-*, or, without the id, any rg*- namespace that was not there
    before (other drills on the machine may make and remove theirs meanwhile); with the
    id, no owner record of the drill either."""
    eventually(
        lambda: not tagged_processes(tag),
        "the drill's processes gone",
        seen=lambda: tagged_processes(tag),
    )
    left = tagged_processes(tag)
    stopped = [p for p in left if " state T" in p]
    if drill_id is None:
        namespaces = drill_namespaces() - before
    else:
        namespaces = {n for n in drill_namespaces() if n.startswith(f"rg{drill_id}-")}
    figures.add("node_rows", 1)
    figures.add("leftovers_found", len(left) + len(namespaces))
    figures.add("stopped_left", len(stopped))
    assert stopped == [], f"processes left stopped: {stopped}"
    assert left == [], f"processes of the drill left: {left}"
    assert namespaces == set(), f"namespaces left: {namespaces}"
    if drill_id is not None:  # its owner record (what `recoverygate sweep` reads) went too
        record = lock_dir() / f"{RECORD_PREFIX}{drill_id}.json"
        assert not record.exists(), f"owner record left: {record}"


def test_a_node_kill_that_passes_leaves_nothing_and_never_touches_the_other_node(
    tmp_path: Path, figures: Figures
) -> None:
    tag, before = uuid.uuid4().hex, drill_namespaces()
    config, orch = build(drill_yaml(tmp_path, tag, "KillNode"))

    result = run_drill(config, RunOptions(confirmed=True), orchestrator=orch)

    assert result.verdict is Verdict.PASS, result.summary
    assert orch.node0_alive, "the KillNode of node 1 ended a process of node 0"
    assert_nothing_left(tag, before, figures, orch.seen_id)


def test_an_exception_right_after_the_node_kill_still_cleans_everything_up(
    tmp_path: Path, figures: Figures
) -> None:
    tag, before = uuid.uuid4().hex, drill_namespaces()
    config, orch = build(drill_yaml(tmp_path, tag, "KillNode"))
    orch.raise_after_node_gone = True

    result = run_drill(config, RunOptions(confirmed=True), orchestrator=orch)

    assert result.verdict is Verdict.ERROR, result.summary
    assert "injected" in result.summary
    assert orch.node0_alive
    assert_nothing_left(tag, before, figures, orch.seen_id)


@pytest.mark.parametrize("broken_restore", [False, True], ids=["fail", "restore-raises"])
def test_a_partition_nobody_notices_fails_early_and_its_link_and_namespaces_go(
    broken_restore: bool, tmp_path: Path, figures: Figures
) -> None:
    tag, before = uuid.uuid4().hex, drill_namespaces()
    path = drill_yaml(tmp_path, tag, "PartitionNode", maxDetectionTime="2s")
    config, orch = build(path)
    orch.raise_in_restore = broken_restore

    result = run_drill(config, RunOptions(confirmed=True), orchestrator=orch)

    assert result.verdict is (Verdict.ERROR if broken_restore else Verdict.FAIL), result.summary
    if not broken_restore:
        assert result.kill_time is not None
        assert result.finished_at is not None
        # decided once maxDetectionTime + recoveryGrace passed (the config's), not later
        doc = yaml.safe_load(path.read_text())
        limit = parse_duration(doc["expectations"]["maxDetectionTime"])
        limit += parse_duration(doc["timeouts"]["recoveryGrace"])
        decided = result.finished_at - result.kill_time
        assert limit <= decided < limit + within(PROMPT), decided
    assert_nothing_left(tag, before, figures, orch.seen_id)


def test_sigterm_to_the_cli_while_a_node_recovers_leaves_nothing(
    tmp_path: Path, figures: Figures
) -> None:
    tag, before = uuid.uuid4().hex, drill_namespaces()
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    proc = cli(drill_yaml(tmp_path, tag, "KillNode"), locks)
    assert proc.stdout is not None
    try:
        until = deadline(JOB)
        for line in proc.stdout:
            if "recovering" in line or time.time() > until:
                break
        # the drill's id, from its owner record in a folder of its own: another test's
        # drill may run beside it (CI: the other worker's rg<id>-* were counted as this one's)
        drill_id = drill_id_in(locks)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=within(JOB))
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    assert proc.returncode == 130, output
    assert_nothing_left(tag, before, figures, drill_id)
    assert list(locks.glob(f"{RECORD_PREFIX}*")) == []
    assert not [p for p in psutil.Process().children(recursive=True) if p.pid == proc.pid]
