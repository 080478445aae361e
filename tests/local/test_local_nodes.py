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
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.durations import parse_duration
from pytest_recoverygate.orchestrators.local.netns import NETNS_DIR, missing_capabilities
from tests.cli_drill import with_drill_sustain
from tests.patience import DRILL, JOB, PROMPT, eventually, within

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


def finish(proc: subprocess.Popen[str], report: Path) -> dict[str, Any]:
    output, _ = proc.communicate(timeout=within(DRILL))
    assert report.exists(), f"no report (exit {proc.returncode}):\n{output[-3000:]}"
    doc: dict[str, Any] = json.loads(report.read_text())
    doc["exitCode"] = proc.returncode
    doc["output"] = output
    return doc


def assert_nothing_left(tag: str, *docs: dict[str, Any]) -> None:
    """No process carrying the test's tag, and no namespace of these drills (each drill's
    own id, from its nodes' hostnames ``rg<id>-node<r>``): another lane's node drill may
    make and remove its own meanwhile."""
    gone = "the drills' processes gone"
    eventually(lambda: not tagged_processes(tag), gone, PROMPT, seen=lambda: tagged_processes(tag))
    ids = {doc["target"]["node"].partition("-")[0] for doc in docs}
    assert all(re.fullmatch(r"rg[0-9a-f]{6}", i) for i in ids), ids
    left = {n for n in drill_namespaces() if n.partition("-")[0] in ids}
    assert left == set(), f"namespaces left: {left}"


def _config(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def expectation(config: Path, key: str) -> float:
    """A duration of the drill's expectations, in seconds, as its config gives it."""
    return parse_duration(_config(config)["expectations"][key])


def timeout_of(config: Path, key: str) -> float:
    return parse_duration(_config(config)["timeouts"][key])


def job_timeout(config: Path) -> float:
    """The job's gloo timeout (train.py ``--timeout=S``), from the drill's command."""
    command = _config(config)["workload"]["command"]
    [value] = [c.split("=", 1)[1] for c in command if str(c).startswith("--timeout=")]
    return float(value)


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
    assert_nothing_left(tag, passed, broken, shrunk)


def test_partition_noticed_in_time_passes_and_one_nobody_notices_fails_early(
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex
    short = example("two-nodes-partition.yaml", tmp_path, tag)
    default = example("two-nodes-partition-default-timeout.yaml", tmp_path, tag)
    noticed, unnoticed = start(short), start(default)

    passed = finish(*noticed)
    broken = finish(*unnoticed)

    assert passed["verdict"] == "PASS", passed["output"][-3000:]
    figures = details(passed)
    # noticed no sooner than the job's gloo timeout, within the drill's maxDetectionTime
    gloo, limit = job_timeout(short), expectation(short, "maxDetectionTime")
    assert gloo <= figures["detectionSeconds"] <= limit, figures
    assert figures["partitionSeconds"] == pytest.approx(figures["detectionSeconds"], abs=1.0)
    assert figures["nodeOutcome"] == "rejoined"
    assert passed["recoveryTimeSeconds"] > figures["detectionSeconds"]
    assert broken["verdict"] == "FAIL", broken["output"][-3000:]
    assert failed_reasons(broken)[0] == "HANG_NOT_DETECTED"
    # decided as soon as maxDetectionTime + recoveryGrace passed, not at a later deadline
    given_up = expectation(default, "maxDetectionTime") + timeout_of(default, "recoveryGrace")
    decided = broken["finishedAt"] - broken["killTime"]
    assert given_up <= decided < given_up + within(PROMPT), decided
    partition = details(broken)["partitionSeconds"]
    assert partition == pytest.approx(expectation(default, "maxDetectionTime"), abs=1.0)
    assert_nothing_left(tag, passed, broken)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_without_the_capabilities_it_is_an_error_before_anything_starts(
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex
    config = example("two-nodes.yaml", tmp_path, tag)
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-net_admin,-sys_admin", "--"]
    command = [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(config)]
    done = subprocess.run(
        [*drop, *command, "--yes", "-q"],
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
        env={**os.environ},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 3, output
    assert "CAP_NET_ADMIN" in output, output
    assert "nothing was started" in output, output
    # nothing was made: no process carries the drill's tag (without CAP_SYS_ADMIN no
    # namespace can be made; another lane's node drill may make its own meanwhile)
    assert tagged_processes(tag) == []
