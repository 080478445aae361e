"""Live recovery's config, wire fields and members, without running a job.

We test these aspects:
- validation refuses before anything starts, with exit 2 and ``FILE:LINE: key: problem —
  got value``: a ``targetReplica`` not among the group's ``REPLICA_GROUP_ID`` /
  ``RECOVERYGATE_REPLICA`` values, ``recovery`` other than restart/live, ``rejoinFrom``
  other than peer/checkpoint, live keys in restart mode, afterStep with afterCheckpoint,
  a group with duplicate names or no member that trains;
- the example and its twins validate, and ``validate``'s effective config loads back;
- the wire: ``replica`` on the start line (from ``REPLICA_GROUP_ID`` or
  ``RECOVERYGATE_REPLICA``), ``source``/``peer`` on checkpoint_loaded, round trip;
- members: ``{port:NAME}`` is one free port per NAME, the same everywhere it appears.
"""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from recoverygate import reporter, wire

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.config.schema import spec_from_config
from pytest_recoverygate.orchestrators.local.members import (
    MemberSpec,
    allocate_ports,
    fill_ports,
    replica_of,
)
from pytest_recoverygate.shared.events import to_training_event
from tests.patience import JOB, within

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "local" / "torchft"

GROUP = """\
workload:
  orchestrator: local
  group:
    - name: lighthouse
      service: true
      command: [torchft_lighthouse, --bind, "[::]:{port:lighthouse}"]
    - name: replica-0
      command: [torchrun, train_ft.py]
      env: {REPLICA_GROUP_ID: "0"}
    - name: replica-1
      command: [torchrun, train_ft.py]
      env: {REPLICA_GROUP_ID: "1"}
injectFailure:
  afterStep: 50
  targetReplica: TARGET
  targetRank: 0
expectations:
  recovery: RECOVERY
  maxSurvivorStall: 10s
  rejoinFrom: FROM
"""


def drill(tmp_path: Path, target: str = "1", recovery: str = "live", source: str = "peer") -> Path:
    text = GROUP.replace("TARGET", target).replace("RECOVERY", recovery).replace("FROM", source)
    path = tmp_path / "drill.yaml"
    path.write_text(text)
    return path


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", "validate", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "line", "key", "got"),
    [
        ({"target": "2"}, 15, "injectFailure.targetReplica", "2"),
        ({"recovery": "heal"}, 18, "expectations.recovery", "heal"),
        ({"source": "disk"}, 20, "expectations.rejoinFrom", "disk"),
    ],
    ids=["target_replica_not_in_group", "recovery_unknown", "rejoin_from_unknown"],
)
def test_validation_refuses_with_exit_2_and_file_line_key_value(
    tmp_path: Path, args: dict[str, str], line: int, key: str, got: str
) -> None:
    path = drill(tmp_path, **args)
    proc = validate(path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{path}:{line}: {key}: " in proc.stderr, proc.stderr
    assert f"— got {got}" in proc.stderr, proc.stderr


def test_a_target_replica_error_names_the_values_the_group_has(tmp_path: Path) -> None:
    proc = validate(drill(tmp_path, target="7"))
    assert "REPLICA_GROUP_ID / RECOVERYGATE_REPLICA values (0, 1)" in proc.stderr, proc.stderr


def test_live_keys_in_restart_mode_are_refused(tmp_path: Path) -> None:
    path = drill(tmp_path, recovery="restart")
    path.write_text(path.read_text() + "  maxRecoveryTime: 5m\n")
    proc = validate(path)
    assert proc.returncode == 2
    assert "expectations.maxSurvivorStall: applies to recovery: live only" in proc.stderr


def test_after_step_and_after_checkpoint_together_are_refused(tmp_path: Path) -> None:
    path = drill(tmp_path)
    path.write_text(
        path.read_text().replace("  afterStep: 50\n", "  afterStep: 50\n  afterCheckpoint: next\n")
    )
    proc = validate(path)
    assert proc.returncode == 2
    assert (
        "injectFailure.afterStep: afterStep and afterCheckpoint cannot both be set" in proc.stderr
    )


def test_a_group_with_two_members_of_one_name_is_refused(tmp_path: Path) -> None:
    path = drill(tmp_path)
    path.write_text(path.read_text().replace("name: replica-1", "name: replica-0"))
    proc = validate(path)
    assert proc.returncode == 2
    assert "workload.group.2.name: is the name of another member too" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "name",
    ["recovery-test.yaml", "recovery-test-min-replicas-2.yaml", "recovery-test-no-heal.yaml"],
)
def test_the_examples_validate_and_their_effective_config_loads_back(
    tmp_path: Path, name: str
) -> None:
    config = load_config(EXAMPLES / name)
    spec = spec_from_config(config)
    assert (spec.recovery, spec.after_step, spec.target_replica) == ("live", 50, 1)
    assert spec.max_survivor_stall == 10.0
    assert spec.max_rejoin_time == 90.0
    proc = validate(EXAMPLES / name)
    assert proc.returncode == 0, proc.stderr
    again = tmp_path / "again.yaml"
    again.write_text(proc.stdout.replace("<redacted>", "x"))
    assert validate(again).returncode == 0


# ------------------------------------------------------------------ the wire


def emitted(env: dict[str, str], code: str) -> list[wire.Record]:
    script = textwrap.dedent(code)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=True,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    records, malformed = wire.parse_text(proc.stdout)
    assert malformed == 0
    return records


@pytest.mark.parametrize(
    ("env", "replica"),
    [
        ({"REPLICA_GROUP_ID": "3"}, 3),
        ({"RECOVERYGATE_REPLICA": "2", "REPLICA_GROUP_ID": "3"}, 2),
        ({"REPLICA_GROUP_ID": "train-a"}, None),
        ({}, None),
    ],
)
def test_the_start_line_carries_the_replica_group(env: dict[str, str], replica: int | None) -> None:
    start, _ = emitted(env, "from recoverygate import reporter; reporter.progress(1)")
    assert start.event == "start"
    assert start.replica == replica


def test_checkpoint_loaded_says_where_the_state_came_from() -> None:
    stream = io.StringIO()
    reporter.configure(stream=stream, rank=0)
    try:
        reporter.checkpoint_loaded(7)
        reporter.checkpoint_loaded(8, source="peer", peer=0)
        reporter.checkpoint_loaded(9, source="bogus")  # dropped: the line says checkpoint
    finally:
        reporter.configure()
    records, malformed = wire.parse_text(stream.getvalue())
    assert malformed == 0
    loads = [(r.step, r.source, r.peer) for r in records if r.event == "checkpoint_loaded"]
    assert loads == [(7, None, None), (8, "peer", 0), (9, None, None)]
    events = [to_training_event(r, None) for r in records if r.event == "checkpoint_loaded"]
    assert [e.source for e in events] == [None, "peer", None]


def test_a_source_outside_the_known_values_makes_the_line_malformed() -> None:
    line = '{"event":"checkpoint_loaded","time":1.0,"inc":"ab","step":3,"source":"disk"}'
    records, malformed = wire.parse_text(f"{wire.SENTINEL} {line}\n")
    assert (records, malformed) == ([], 1)


# ------------------------------------------------------------------ members


def test_each_port_name_is_one_free_port_the_same_everywhere() -> None:
    members = [
        MemberSpec("lighthouse", ("lh", "--bind", "[::]:{port:lh}"), {}, Path(), True),
        MemberSpec("r0", ("torchrun",), {"LH": "http://localhost:{port:lh}", "X": "{port:x}"}),
        MemberSpec("r1", ("torchrun",), {"LH": "http://localhost:{port:lh}"}),
    ]
    ports = allocate_ports(members)
    assert set(ports) == {"lh", "x"}
    assert ports["lh"] != ports["x"]
    filled = [fill_ports(m, ports) for m in members]
    assert filled[0].command[2] == f"[::]:{ports['lh']}"
    assert filled[1].env["LH"] == filled[2].env["LH"] == f"http://localhost:{ports['lh']}"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports["x"]))  # it was free


def test_a_member_s_replica_comes_from_its_environment() -> None:
    assert replica_of({"REPLICA_GROUP_ID": "1"}) == 1
    assert replica_of({"RECOVERYGATE_REPLICA": "4", "REPLICA_GROUP_ID": "1"}) == 4
    assert replica_of({"REPLICA_GROUP_ID": "x"}) is None
