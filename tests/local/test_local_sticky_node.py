"""StickyFault ``scope: node``: real two-node drills on this machine (torchrun agents in
network namespaces), each verdict held to the job's own records (docs/faults.md).

The twins' job writes, with ``RECOVERYGATE_GROUND_TRUTH=<base>``, its own record of every
placement on every node (examples/local/faults/node_health.py: host, pid, world size,
``started`` / ``ended`` / ``left``) and rank 0's steps, loads and checkpoints
(examples/local/train.py). We test these aspects:
- node-bad-excluded.yaml PASSes: every placement the report lists on the bad node is a
  process of node 1 in the job's records, each one hit died there without a word, the last
  is the one that took the node out (``left``); the job then trained on with one node (world
  size 1 in its records, none of node 1 after) from the newest checkpoint it had recorded
  before that load;
- node-bad-rejoins.yaml FAILs BAD_NODE_REUSED at the fourth death (decided then, not at a
  deadline), each of the four a node-1 process of the records that never ended;
- nothing is left: no namespace of the drill, no process of the test's tag, none stopped
  (the other ways out: tests/reliability/test_cleanup_sticky_node.py).

The drills run one after the other (the machine's two cores are shared): 3-5 min here.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.orchestrators.local.netns import missing_capabilities
from tests.cli_drill import CliRun, run_cli_drill
from tests.local.test_local_nodes import drill_namespaces, tagged_processes
from tests.patience import DRILL, PROMPT, eventually, within

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.local,
    pytest.mark.skipif(
        bool(missing_capabilities()), reason="needs root: CAP_NET_ADMIN, CAP_SYS_ADMIN, ip"
    ),
]

FAULTS = Path(__file__).resolve().parents[2] / "examples" / "local" / "faults"


def drill(name: str, tmp: Path, tag: str) -> tuple[CliRun, Path]:
    """Run examples/local/faults/<name>, tagged, with the job's records on; (run, base)."""
    config = yaml.safe_load((FAULTS / name).read_text())
    base = tmp / name.removesuffix(".yaml") / "truth"
    base.parent.mkdir(parents=True)
    config["workload"]["workdir"] = str(FAULTS)
    config["workload"]["env"].update({"RG_TEST_TAG": tag, "RECOVERYGATE_GROUND_TRUTH": str(base)})
    return run_cli_drill(config, tmp / name, timeout=within(DRILL)), base


def placements(base: Path) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """The job's records of its placements: host -> pid -> rows."""
    found: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(dict)
    for path in sorted(base.parent.glob(f"{base.name}.node.*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        found[rows[0]["host"]][rows[0]["pid"]] = rows
    return dict(found)


def rank0(base: Path) -> list[list[dict[str, Any]]]:
    """Rank 0's training processes (train.py's records), oldest first."""
    runs = []
    for path in base.parent.glob(f"{base.name}.0.*.jsonl"):
        runs.append([json.loads(line) for line in path.read_text().splitlines()])
    return sorted(runs, key=lambda rows: rows[0]["t"])


def bad_node(run: CliRun) -> dict[str, Any]:
    details: dict[str, Any] = run.report["recoveries"][-1]["faultDetails"]["badNode"]
    return details


def explain(run: CliRun) -> str:
    return f"\nexit {run.code}\n{run.report.get('summary')}\n" + run.output[-3000:]


def assert_nothing_left(tag: str, run: CliRun) -> None:
    """No process of the test's tag (none stopped either), no namespace of the drill (its
    own: other drills may run on this machine meanwhile)."""
    gone = "the drill's processes gone"
    eventually(lambda: not tagged_processes(tag), gone, PROMPT, seen=lambda: tagged_processes(tag))
    drill = bad_node(run)["node"].rsplit("-", 1)[0]  # rgID-node1: the drill's rgID
    assert {name for name in drill_namespaces() if name.startswith(f"{drill}-")} == set()


def hit_pids(figures: dict[str, Any]) -> list[int]:
    return [
        int(p["instance"].split("@")[0]) for p in figures["each"] if p["hitSeconds"] is not None
    ]


def test_a_job_that_takes_the_bad_node_out_passes_and_one_that_rejoins_it_fails(
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex

    passed, base = drill("node-bad-excluded.yaml", tmp_path, tag)
    assert passed.report["verdict"] == "PASS", explain(passed)
    assert passed.code == 0
    figures = bad_node(passed)
    node = figures["node"]
    records = placements(base)
    on_node = records[node]
    listed = [int(p["instance"].split("@")[0]) for p in figures["each"]]
    assert set(listed) <= set(on_node), (listed, sorted(on_node))
    assert (figures["placements"], figures["deaths"]) == (3, 2), figures
    for pid in hit_pids(figures):  # each one hit died there without a word
        assert [row["event"] for row in on_node[pid]] == ["started"], on_node[pid]
    last = on_node[listed[-1]]
    assert [row["event"] for row in last] == ["started", "left"], last
    assert last[-1]["strikes"] == 2
    kill = passed.report["killTime"]
    assert figures["leftSeconds"] >= last[-1]["t"] - kill  # it left after it said so
    # then the job went on with one node: nothing started on node 1 once it left, and
    # the process that trained on (rank 0's last) ran in a world of one
    gone = kill + figures["leftSeconds"]
    assert all(rows[0]["t"] < gone for rows in on_node.values())
    final = rank0(base)[-1]
    (trained_on,) = [rows for host in records.values() for pid, rows in host.items()
                     if pid == final[0]["pid"]]  # fmt: skip
    assert trained_on[0]["host"] != node and trained_on[0]["world"] == 1, trained_on
    assert passed.report["recoveries"][-1]["faultDetails"]["worldSizeAfter"] == 1
    # ... from the newest checkpoint it had recorded before that load
    loaded = next(row for row in final if row["event"] == "loaded")
    saved = [row["step"] for run in rank0(base) for row in run
             if row["event"] == "checkpoint" and row["t"] <= loaded["t"]]  # fmt: skip
    assert passed.report["resumeStep"] == loaded["step"] == max(saved)
    assert passed.report["resumeStep"] == passed.report["expectedResumeStep"]
    assert passed.report["recoveryTimeSeconds"] > figures["leftSeconds"]
    assert_nothing_left(tag, passed)

    failed, base = drill("node-bad-rejoins.yaml", tmp_path, tag)
    assert failed.report["verdict"] == "FAIL", explain(failed)
    assert failed.code == 1
    assert failed.report["reasons"] == ["BAD_NODE_REUSED"], explain(failed)
    figures = bad_node(failed)
    assert figures["deaths"] == 4 and figures["left"] is None, figures
    on_node = placements(base)[figures["node"]]
    for pid in hit_pids(figures):  # four workers of node 1 in the records, none ended
        assert [row["event"] for row in on_node[pid]] == ["started"], on_node[pid]
    fourth = figures["each"][3]["hitSeconds"]
    decided = failed.report["finishedAt"] - failed.report["killTime"]
    assert fourth - 1e-5 <= decided < fourth + 2.0, (fourth, decided)  # at the hit (figures
    # are rounded to the microsecond), not at a deadline
    assert_nothing_left(tag, failed)
