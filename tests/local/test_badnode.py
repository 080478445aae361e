"""The local backend's bad node (StickyFault ``scope: node``), on a real network namespace
with real processes and no torch: :class:`~pytest_recoverygate.orchestrators.local.badnode.BadNode`.

We test these aspects:
- the work running in the node when it goes bad is hit at once, each later job process
  ``after`` seconds after it started (measured on the process's own start), each
  placement (the agent's worker group, by its restart count) reported once, its hit once;
- only the drill's job processes in that namespace are hit: the node's agent, a process
  there without the drill's marker (or with another drill's), and a marked worker outside
  the namespace all run on untouched;
- ``mode: hang`` stops the work instead; ``stop()`` ends the watcher thread and leaves no
  process stopped (each continued and killed).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from pytest_recoverygate.engine.model import GroupEventKind
from pytest_recoverygate.orchestrators.local.badnode import BadNode
from pytest_recoverygate.orchestrators.local.netns import (
    Network,
    NodeNet,
    missing_capabilities,
    node_command,
)
from pytest_recoverygate.orchestrators.local.orchestrator import DRILL_MARKER
from pytest_recoverygate.orchestrators.local.processes import Identity
from tests.patience import PROCESS, QUIET, eventually, stays

pytestmark = [
    pytest.mark.local,
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(missing_capabilities()), reason="needs root: CAP_NET_ADMIN, CAP_SYS_ADMIN, ip"
    ),
]

MARK = "0123456789abcdef"
#: The bad node's ``after`` in the first test: each later job process is hit that long
#: after it started (the fault's setting, not a wait).
AFTER = 1.0


#: A stand-in torchrun agent: starts a "worker" (RANK set), and a new one each time the
#: last one ends, with TORCHELASTIC_RESTART_COUNT counting up, ``RESTARTS`` times.
AGENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    for restart in range(int(sys.argv[1]) + 1):
        env = {**os.environ, "RANK": "1", "TORCHELASTIC_RESTART_COUNT": str(restart)}
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                  env=env)
        print("worker", worker.pid, flush=True)
        worker.wait()
    time.sleep(600)
    """
)


@dataclass
class Node:
    net: NodeNet
    hosts: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    events: list[tuple[GroupEventKind, str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, command: list[str], *, marker: str | None, rank: bool = False,
              inside: bool = True) -> subprocess.Popen[bytes]:  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", DRILL_MARKER)}
        if marker is not None:
            env[DRILL_MARKER] = marker
        if rank:
            env["RANK"] = "1"
        argv = node_command(self.net, self.hosts, command) if inside else command
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def emit(self, kind: GroupEventKind, detail: str, **extra: Any) -> None:
        with self.lock:
            self.events.append((kind, detail, extra))

    def of(self, kind: GroupEventKind) -> list[dict[str, Any]]:
        with self.lock:
            return [extra for k, _, extra in self.events if k is kind]

    def bad(self, agent: subprocess.Popen[bytes], mode: str, after: float) -> BadNode:
        return BadNode(
            netns=self.net.netns,
            hostname=self.net.hostname,
            marker=(DRILL_MARKER, MARK),
            agent=Identity.of(psutil.Process(agent.pid)),
            mode=mode,
            after=after,
            emit=self.emit,
            now=time.time,
        )


@pytest.fixture
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="recoverygate-badnode-test-"))
    network = Network(1, root / "hosts")
    try:
        (net,) = network.open()
        made = Node(net, root / "hosts")
        yield made
    finally:
        for proc in made.procs if "made" in locals() else []:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(ProcessLookupError, OSError):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
            proc.wait()
        assert network.close() == []
        subprocess.run(["rm", "-rf", str(root)], check=False)


def children(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(proc.pid).children(recursive=True)
    return []


def workers(agent: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The agent's workers that run their own program (``RANK`` in their environment), as
    the watcher sees them: never the node wrapper's ``hostname`` or ``mount`` (children of
    the wrapper's shell before it execs the agent), nor a worker forked but not exec'd."""
    found = []
    for child in children(agent):
        with contextlib.suppress(psutil.Error):
            if "RANK" in child.environ():
                found.append(child)
    return found


def alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def test_the_work_now_at_once_each_later_one_after_it_started_and_nothing_else(
    node: Node,
) -> None:
    agent = node.start([sys.executable, "-c", AGENT, "3"], marker=MARK)
    stranger = node.start(["sleep", "600"], marker=None, rank=True)  # no drill marker
    other = node.start(["sleep", "600"], marker="feedfacefeedface", rank=True)  # another's
    outside = node.start(["sleep", "600"], marker=MARK, rank=True, inside=False)
    eventually(lambda: len(workers(agent)) == 1, "the first worker", PROCESS)
    bad = node.bad(agent, "kill", after=AFTER)

    at, hits = bad.start()
    try:
        assert hits == 1  # the worker running when the node went bad
        eventually(lambda: len(node.of(GroupEventKind.BAD_NODE_HIT)) == 4, "4 hits", PROCESS)
        placed = node.of(GroupEventKind.BAD_NODE_PLACEMENT)
        hit = node.of(GroupEventKind.BAD_NODE_HIT)
        assert [p["placement"] for p in placed] == [1, 2, 3, 4]
        assert [h["placement"] for h in hit] == [1, 2, 3, 4]
        assert hit[0]["timestamp"] == pytest.approx(at, abs=0.5)
        with node.lock:
            ages = [float(d.rsplit(", ", 1)[1].split("s ")[0]) for k, d, _ in node.events
                    if k is GroupEventKind.BAD_NODE_HIT]  # fmt: skip
        assert all(AFTER <= age < 3.0 for age in ages[1:]), ages  # `after` on their own start
        # nothing more to hit: no fifth hit for longer than a later process's `after`
        stays(lambda: len(node.of(GroupEventKind.BAD_NODE_HIT)) == 4, "only 4 hits", AFTER + QUIET)
        assert all(alive(p) for p in (agent, stranger, other, outside))
    finally:
        assert bad.stop() == []
    assert not bad.running


def test_hang_stops_the_work_and_stop_leaves_nothing_stopped(node: Node) -> None:
    agent = node.start([sys.executable, "-c", AGENT, "0"], marker=MARK)
    eventually(lambda: len(workers(agent)) == 1, "the worker", PROCESS)
    (worker,) = workers(agent)
    bad = node.bad(agent, "hang", after=0.0)
    _, hits = bad.start()
    assert hits == 1
    eventually(lambda: worker.status() == psutil.STATUS_STOPPED, "the worker stopped", PROCESS)
    assert alive(agent)
    assert bad.stop() == []
    assert not bad.running
    eventually(lambda: not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE,
               "the stopped worker continued and killed", PROCESS)  # fmt: skip
