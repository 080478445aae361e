"""A StickyFault with ``scope: node`` leaves nothing behind on any way out: no process left
stopped, no watcher, no namespace, nothing of the job.

We test these aspects, with real network namespaces and the torchrun stand-in
(standin_job.py, one agent and one worker per node) on two nodes, node 1 bad with
``mode: hang`` (the bad node's work SIGSTOPped: the worst thing to leave behind):
- ways out: a FAIL decided at the hit that proves it (the stand-in's agent tears down a
  worker stopped for 1 s and places it again, so two placements hang past
  ``maxCrashLoop: 1``), an exception raised by the backend right after the first hit,
  SIGINT to the CLI while a placement is stopped, and the CLI SIGKILLed while one is
  stopped followed by ``recoverygate sweep``;
- after each: no process carrying the row's tag (none stopped), no namespace of the
  drill, no owner record; in-process, no watcher thread alive;
- node 0's worker, found at discovery, is the same running process at cleanup: the bad
  node's watcher never touched another node.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.engine.machine import Verdict
from pytest_recoverygate.engine.model import GroupEvent, GroupEventKind
from pytest_recoverygate.orchestrators.local.netns import missing_capabilities
from pytest_recoverygate.orchestrators.local.sweep import RECORD_PREFIX
from pytest_recoverygate.registry.seams import RealClock
from pytest_recoverygate.runner import RunOptions, run_drill
from pytest_recoverygate.shared.procs import JobLaunch
from tests.local.test_local_nodes import drill_namespaces, tagged_processes
from tests.patience import JOB, PROCESS, eventually, within
from tests.reliability.conftest import Figures
from tests.reliability.test_cleanup_nodes_local import (
    STANDIN,
    STANDIN_ARGS,
    Watched,
    assert_nothing_left,
    build,
    cli,
    drill_id_in,
)

pytestmark = [
    pytest.mark.local,
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(missing_capabilities()), reason="needs root: CAP_NET_ADMIN, CAP_SYS_ADMIN, ip"
    ),
]


def sticky_yaml(tmp: Path, tag: str, *extra: str, **expect: Any) -> Path:
    """Two stand-in nodes; node 1 stays bad (``mode: hang``, ``after: 0s``) from the
    checkpoint at step 10 on."""
    config = {
        "name": "sticky-node-hang",
        "workload": {
            "orchestrator": "local",
            "nodes": 2,
            "reportingRank": 1,  # node 1's worker; it alone reports (RECOVERYGATE_RANKS)
            "command": [sys.executable, str(STANDIN), *STANDIN_ARGS, *extra],
            "workdir": str(tmp),
            "env": {"RG_TEST_TAG": tag, "RECOVERYGATE_RANKS": "1"},
        },
        "injectFailure": {
            "type": "StickyFault",
            "scope": "node",
            "mode": "hang",
            "after": "0s",
            "targetNode": 1,
            "afterCheckpoint": "step-10",
        },
        "expectations": {"maxRecoveryTime": "30s", "sustain": "3 steps", **expect},
        "safety": {"requireConfirm": False},
        "timeouts": {"discovery": "1m", "checkpoint": "1m", "recoveryGrace": "2s"},
    }
    path = tmp / "drill.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class Raising(Watched):
    """The nodes backend, failing right after the bad node's first hit."""

    def watch_group(self) -> list[GroupEvent]:
        events = super().watch_group()
        if any(e.kind is GroupEventKind.BAD_NODE_HIT for e in events):
            raise RuntimeError("injected: the backend failed right after the first hit")
        return events


def watchers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("recoverygate-badnode")]


def until_stopped(tag: str) -> list[str]:
    """Wait until a process of the drill is stopped (a placement the bad node hung)."""

    def stopped() -> list[str]:
        return [p for p in tagged_processes(tag) if " state T" in p]

    what = "placement of the bad node stopped"
    return eventually(stopped, what, JOB, seen=lambda: tagged_processes(tag))


def build_as(cls: type[Watched], path: Path) -> tuple[Any, Watched]:
    """:func:`build`, with the orchestrator of class ``cls``."""
    config, orch = build(path)
    job = JobLaunch(orch.command, orch.workdir, orch.env)
    return config, cls(job, nodes=2, clock=RealClock())


def test_a_fail_decided_at_the_hit_leaves_nothing_stopped(tmp_path: Path, figures: Figures) -> None:
    tag, before = uuid.uuid4().hex, drill_namespaces()
    path = sticky_yaml(tmp_path, tag, "--hang-timeout", "1", maxCrashLoop=1)
    config, orch = build(path)

    result = run_drill(config, RunOptions(confirmed=True), orchestrator=orch)

    assert result.verdict is Verdict.FAIL, result.summary
    assert result.failed_checks[0].reason is not None
    assert result.failed_checks[0].reason.name == "BAD_NODE_REUSED"
    assert orch.node0_alive, "the bad node's watcher ended a process of node 0"
    assert watchers() == []
    assert_nothing_left(tag, before, figures, orch.seen_id)


def test_an_exception_after_the_first_hit_still_leaves_nothing(
    tmp_path: Path, figures: Figures
) -> None:
    tag, before = uuid.uuid4().hex, drill_namespaces()
    config, raising = build_as(Raising, sticky_yaml(tmp_path, tag))

    result = run_drill(config, RunOptions(confirmed=True), orchestrator=raising)

    assert result.verdict is Verdict.ERROR, result.summary
    assert "injected" in result.summary
    assert raising.node0_alive
    assert watchers() == []
    assert_nothing_left(tag, before, figures, raising.seen_id)


def test_sigint_while_a_placement_is_stopped_leaves_nothing(
    tmp_path: Path, figures: Figures
) -> None:
    tag, before = uuid.uuid4().hex, drill_namespaces()
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    proc = cli(sticky_yaml(tmp_path, tag), locks)
    try:
        until_stopped(tag)
        drill_id = drill_id_in(locks)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=within(JOB))
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    assert proc.returncode == 130, output
    # this drill's namespaces, by its id: another test's drill may run beside it (CI: the
    # other worker's rg<id>-* were counted here as this one's)
    assert_nothing_left(tag, before, figures, drill_id)
    assert {n for n in drill_namespaces() if n.startswith(f"rg{drill_id}-")} == set()
    assert list(locks.glob(f"{RECORD_PREFIX}*")) == []


def test_a_sigkilled_drill_with_a_stopped_placement_is_swept(
    tmp_path: Path, figures: Figures
) -> None:
    tag, before = uuid.uuid4().hex, drill_namespaces()
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    proc = cli(sticky_yaml(tmp_path, tag), locks)
    drill_id: str | None = None
    try:
        until_stopped(tag)
        drill_id = drill_id_in(locks)
        proc.send_signal(signal.SIGKILL)  # no cleanup can run: what the sweep is for
        proc.communicate(timeout=within(PROCESS))
        assert [p for p in tagged_processes(tag) if " state T" in p], "nothing left to sweep"
        assert {n for n in drill_namespaces() if n.startswith(f"rg{drill_id}-")}
        swept = subprocess.run(
            [sys.executable, "-m", "pytest_recoverygate.cli", "sweep"],
            env={**os.environ, "RECOVERYGATE_LOCK_DIR": str(locks)},
            capture_output=True,
            text=True,
            timeout=within(JOB),
            check=False,
        )
        assert swept.returncode == 0, swept.stdout + swept.stderr
        assert f"drill rg{drill_id}" in swept.stdout, swept.stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    # this drill's namespaces, by its id: another test's drill may run beside it (CI: the
    # other worker's rg<id>-* were counted here as this one's)
    assert_nothing_left(tag, before, figures, drill_id)
    assert {n for n in drill_namespaces() if n.startswith(f"rg{drill_id}-")} == set()
    assert list(locks.glob(f"{RECORD_PREFIX}*")) == []
