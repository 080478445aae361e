"""Real two-node drills on this machine: torchrun agents in network namespaces (docs/nodes.md).

We test these aspects, each against the drill's report and the machine itself:
- KillNode with the checkpoint shards in ``{sharedDir}`` PASSes; its twin keeping them in
  ``{nodeDir}`` FAILs "restarted from scratch" (the replacement node's disk is empty); an
  elastic job (``--nnodes=1:2``) whose node stays dead (``replace: false``) carries on;
- PartitionNode with a 10 s gloo timeout is noticed, the node rejoins, and it PASSes; its
  twin left at the 30-minute default FAILs HANG_NOT_DETECTED as soon as
  maxDetectionTime + recoveryGrace passed;
- nothing is left behind after a PASS or a FAIL: no namespace of the drill, no process
  carrying the test's tag, no stopped process (SIGTERM, exceptions and the other ways
  out: tests/reliability/test_cleanup_nodes_local.py, on the stand-in job);
- without CAP_NET_ADMIN/CAP_SYS_ADMIN the drill is an ERROR (exit 3) that says so, and
  nothing was made.

Each pair runs its two drills at once (their networks are separate namespaces), so the
file takes about as long as its two slowest drills: 2.6–3.8 min here, by the load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.orchestrators.local.netns import NETNS_DIR, missing_capabilities
from tests.cli_drill import with_drill_sustain

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.local,
    pytest.mark.skipif(
        bool(missing_capabilities()), reason="needs root: CAP_NET_ADMIN, CAP_SYS_ADMIN, ip"
    ),
]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "local"
DRILL_NETNS = re.compile(r"^rg[0-9a-f]{6}-")


def drill_namespaces() -> set[str]:
    if not NETNS_DIR.is_dir():
        return set()
    return {p.name for p in NETNS_DIR.iterdir() if DRILL_NETNS.match(p.name)}


def tagged_processes(tag: str) -> list[str]:
    """Processes whose environment carries ``tag`` (the test's own), with their state."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag.encode() in environ and state != "Z":
            found.append(f"pid {entry.name} state {state}")
    return found


def example(name: str, tmp: Path, tag: str, **changes: Any) -> Path:
    """The shipped example, tagged (its env) and with ``changes`` to injectFailure etc."""
    config = yaml.safe_load((EXAMPLES / name).read_text())
    config["workload"]["workdir"] = str(EXAMPLES)
    config["workload"]["env"]["RG_TEST_TAG"] = tag
    for section, values in changes.items():
        config[section] = {**config.get(section, {}), **values}
    path = tmp / name
    path.write_text(yaml.safe_dump(with_drill_sustain(config), sort_keys=False))
    return path


def start(config: Path) -> tuple[subprocess.Popen[str], Path]:
    report = config.with_suffix(".json")
    command = [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(config)]
    proc = subprocess.Popen(
        [*command, "--report", str(report), "--yes", "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    return proc, report


def finish(proc: subprocess.Popen[str], report: Path, timeout: float = 420) -> dict[str, Any]:
    output, _ = proc.communicate(timeout=timeout)
    assert report.exists(), f"no report (exit {proc.returncode}):\n{output[-3000:]}"
    doc: dict[str, Any] = json.loads(report.read_text())
    doc["exitCode"] = proc.returncode
    doc["output"] = output
    return doc


def assert_nothing_left(tag: str, before: set[str]) -> None:
    deadline = time.monotonic() + 10
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tagged_processes(tag) == [], "processes of the drill are left"
    left = drill_namespaces() - before
    assert left == set(), f"namespaces left: {left}"


def details(doc: dict[str, Any]) -> dict[str, Any]:
    recoveries = doc["recoveries"]
    assert recoveries, doc["summary"]
    return dict(recoveries[-1]["faultDetails"])


def failed_reasons(doc: dict[str, Any]) -> list[str]:
    return [c["reason"] for c in doc["checks"] if c["passed"] is False]


def test_kill_node_passes_from_shared_storage_fails_from_node_local_disk_and_scales_down(
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex
    before = drill_namespaces()
    shared = start(example("two-nodes.yaml", tmp_path, tag))
    local = start(example("two-nodes-node-local.yaml", tmp_path, tag))
    elastic = start(example("two-nodes-scale-down.yaml", tmp_path, tag))

    passed = finish(*shared)
    broken = finish(*local)
    shrunk = finish(*elastic)

    assert passed["verdict"] == "PASS", passed["output"][-3000:]
    assert passed["exitCode"] == 0
    assert passed["resumeStep"] == passed["expectedResumeStep"] == 40
    figures = details(passed)
    assert figures["replaceNode"] is True
    assert (figures["worldSizeBefore"], figures["worldSizeAfter"]) == (2, 2)
    assert 0 < figures["nodeGoneSeconds"] < figures["replacementNodeStartedSeconds"]
    assert passed["recoveryTimeSeconds"] > figures["replacementNodeStartedSeconds"]
    assert passed["target"]["node"].endswith("-node1")  # the node's hostname
    assert broken["verdict"] == "FAIL", broken["output"][-3000:]
    assert broken["exitCode"] == 1
    assert failed_reasons(broken)[0] == "RESTARTED_FROM_SCRATCH"
    assert "restarted from scratch" in broken["summary"]
    assert shrunk["verdict"] == "PASS", shrunk["output"][-3000:]  # carried on, on node 0
    assert details(shrunk)["replaceNode"] is False
    assert "replacementNodeStartedSeconds" not in details(shrunk)
    assert (details(shrunk)["worldSizeBefore"], details(shrunk)["worldSizeAfter"]) == (2, 1)
    # from the workers' own start lines (WORLD_SIZE), not the backend's count
    assert details(shrunk)["worldSizeBeforeFrom"] == details(shrunk)["worldSizeAfterFrom"]
    assert details(shrunk)["worldSizeAfterFrom"] == "startLines"
    assert_nothing_left(tag, before)


def test_partition_noticed_in_time_passes_and_one_nobody_notices_fails_early(
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex
    before = drill_namespaces()
    noticed = start(example("two-nodes-partition.yaml", tmp_path, tag))
    unnoticed = start(example("two-nodes-partition-default-timeout.yaml", tmp_path, tag))

    passed = finish(*noticed)
    broken = finish(*unnoticed)

    assert passed["verdict"] == "PASS", passed["output"][-3000:]
    figures = details(passed)
    assert 10.0 <= figures["detectionSeconds"] <= 30.0  # gloo's 10 s timeout, under load
    assert figures["partitionSeconds"] == pytest.approx(figures["detectionSeconds"], abs=1.0)
    assert figures["nodeOutcome"] == "rejoined"
    assert passed["recoveryTimeSeconds"] > figures["detectionSeconds"]
    assert broken["verdict"] == "FAIL", broken["output"][-3000:]
    assert failed_reasons(broken)[0] == "HANG_NOT_DETECTED"
    decided = broken["finishedAt"] - broken["killTime"]
    assert 45.0 <= decided < 50.0, decided  # maxDetectionTime 30 s + recoveryGrace 15 s
    assert details(broken)["partitionSeconds"] == pytest.approx(30.0, abs=1.0)
    assert_nothing_left(tag, before)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_without_the_capabilities_it_is_an_error_before_anything_starts(
    tmp_path: Path,
) -> None:
    before = drill_namespaces()
    config = example("two-nodes.yaml", tmp_path, uuid.uuid4().hex)
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-net_admin,-sys_admin", "--"]
    command = [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(config)]
    done = subprocess.run(
        [*drop, *command, "--yes", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 3, output
    assert "CAP_NET_ADMIN" in output, output
    assert "nothing was started" in output, output
    assert drill_namespaces() - before == set()
