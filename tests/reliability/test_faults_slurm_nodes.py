"""SLURM KillNode on the real two-node cluster while the Slurm clients fail under it.

The backend's calls go through wrappers on PATH in front of the real clients (scontrol,
srun, squeue, scancel, sinfo): a rule makes the first ``times`` calls that match a
pattern fail in one way -- ``refused`` (never reached slurmctld: "Unable to contact
slurm controller (connect failure)"), ``lost`` (the real command ran, then its answer
was lost: "Socket timed out"), ``hang`` (the real command ran, then hung past the
timeout). The calls made inside the kill step on the node pass through the same
wrappers. We test these aspects, from /proc and sinfo, never from the backend's own
account:
- never a process of the other node is touched, whatever failed;
- a read that fails (``scontrol show job``) or a kill step that never started is sent
  again, and the node's processes die by exactly one kill step;
- a kill step whose answer was lost is not sent again: UNCONFIRMED (the drill ends
  ERROR), saying it may have run;
- a DRAIN whose outcome is unknown kills nothing (UNCONFIRMED, "no process was killed"),
  and cleanup RESUMEs the node; a RESUME refused once is sent again; a RESUME refused
  every time is cleanup's error naming the node and the command to run;
- nothing is left behind: after the job is cancelled no process of it (none stopped),
  no wrapper, and every node RESUMEd (none drain).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_recoverygate.engine.model import Fault, KillOutcome, Node
from pytest_recoverygate.errors import BackendError
from pytest_recoverygate.orchestrators.base import RealClock
from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator
from tests.patience import JOB, QUIET, deadline, eventually, stays
from tests.reliability.conftest import Figures
from tests.slurm.slurm_testcluster import SlurmCluster
from tests.slurm.test_slurm_nodes import PER_NODE, alive, node_state, step_processes

pytestmark = pytest.mark.slurm

WRAPPER = """#!/bin/sh
# In front of the real Slurm client: log the call, then apply the first rule of $RG_DIR/rules
# (lines "MODE TIMES PATTERN", PATTERN a shell pattern on "TOOL ARGS") it matches, for
# that rule's first TIMES matching calls.
tool=$(basename "$0")
real=/usr/bin/$tool
call="$tool $*"
line=$(printf '%s' "$call" | tr '\n' ' ')
echo "$line" >> "$RG_DIR/calls.log"
n=0
while read -r mode times pattern; do
  n=$((n + 1))
  case "$call" in
    $pattern)
      echo x >> "$RG_DIR/rule-$n.count"
      [ "$(wc -l < "$RG_DIR/rule-$n.count")" -le "$times" ] || break
      echo "$mode $tool $1 $2" >> "$RG_DIR/faults.log"
      case "$mode" in
        refused) echo "$tool: error: Unable to contact slurm controller (connect failure)" >&2
          exit 1 ;;
        lost) "$real" "$@" > /dev/null 2>&1
          echo "$tool: error: Socket timed out on send/recv operation" >&2; exit 1 ;;
        hang) "$real" "$@" > /dev/null 2>&1; exec sleep 60 ;;
      esac ;;
  esac
done < "$RG_DIR/rules"
exec "$real" "$@"
"""

KILL_STEP = "srun *--job-name=recoverygate-kill*"
DRAIN = "scontrol update NodeName=* State=DRAIN*"
RESUME = "scontrol update NodeName=* State=RESUME"


@dataclasses.dataclass
class Faulty:
    """The wrappers' folder: the rules they follow and what they saw."""

    folder: Path
    env: dict[str, str]

    def rules(self, *rules: tuple[str, int, str]) -> None:
        text = "".join(f"{mode} {times} {pattern}\n" for mode, times, pattern in rules)
        (self.folder / "rules").write_text(text)

    def calls(self, pattern: str) -> list[str]:
        path = self.folder / "calls.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return [line for line in lines if fnmatch.fnmatchcase(line, pattern)]

    def faults(self) -> list[str]:
        path = self.folder / "faults.log"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def faulty(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[Faulty]:
    if len(slurm_cluster.nodes) < 2:
        pytest.skip("needs two nodes or more (RECOVERYGATE_SLURM_NODES=3, the default)")
    folder = tmp_path / "wrap"
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("scontrol", "srun", "squeue", "scancel", "sinfo"):
        path = bin_dir / tool
        path.write_text(WRAPPER)
        path.chmod(0o755)
    (folder / "rules").write_text("")
    env = dict(slurm_cluster.env)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["RG_DIR"] = str(folder)
    yield Faulty(folder, env)
    slurm_cluster.cancel_all()
    slurm_cluster.resume_drained()  # never leave a node drained, whatever happened


def start(
    slurm: SlurmCluster, faulty: Faulty, tmp_path: Path, *, drain: bool = False
) -> tuple[str, SlurmOrchestrator, Node, dict[str, dict[int, str]]]:
    """A job with one task per node (three processes each), discovered through the
    wrappers with no fault yet; the node of rank 1 is the target."""
    job = slurm.submit(PER_NODE, "-N2", workdir=tmp_path)
    orch = SlurmOrchestrator(
        job_id=job,
        fault="KillNode",
        clock=RealClock(),
        env=faulty.env,
        poll_interval=0.3,
        command_timeout=8.0,
        drain_node=drain,
    )
    orch.commands.retry = dataclasses.replace(orch.commands.retry, base=0.05, cap=0.1)
    workload = orch.discover(deadline(JOB))
    target = workload.by_rank(1)
    assert target is not None
    node = next(n for n in workload.nodes if n.name == target.node)
    procs = {n.name: step_processes(slurm, job, n.name) for n in workload.nodes}
    assert len(procs) == 2 and all(len(p) == 3 for p in procs.values()), procs
    return job, orch, node, procs


#: The job states of a job that is not over yet (``scontrol show job``'s ``JobState``; a
#: job whose Epilog still runs is ``COMPLETING``).
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "COMPLETING", "REQUEUED")


def job_processes(job: str) -> list[tuple[int, str]]:
    """(pid, state) of every process whose environment says it is of Slurm job ``job``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(") ", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if f"SLURM_JOB_ID={job}".encode() in environ:
            found.append((int(entry.name), state))
    return found


def wrappers_left(faulty: Faulty) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-f", str(faulty.folder)], capture_output=True, text=True, check=False
    )
    return [int(p) for p in out.stdout.split()]


def assert_nothing_left(slurm: SlurmCluster, faulty: Faulty, job: str, figures: Figures) -> None:
    slurm.cancel_all()
    # Gone, and the job over in Slurm: its Epilog (slurmd's, as root, with the job's
    # SLURM_JOB_ID) runs after the job's processes end, while the job is COMPLETING; in CI
    # it was counted as one of them, seen between the two.
    eventually(
        lambda: not job_processes(job) and slurm.job_field(job, "JobState") not in ACTIVE,
        f"job {job}'s processes gone and the job over",
        seen=lambda: (slurm.job_field(job, "JobState"), job_processes(job)),
    )
    left = job_processes(job)
    stopped = [pid for pid, state in left if state == "T"]
    figures.add("leftovers_found", len(left))
    assert stopped == [], f"stopped processes of job {job} left: {stopped}"
    assert left == [], f"processes of job {job} left after it was cancelled: {left}"
    assert wrappers_left(faulty) == [], "a client wrapper (a hung call) is left"
    states = {node: node_state(slurm, node) for node in slurm.nodes}
    assert not any(s.startswith("drain") for s in states.values()), states


# rules, then: outcome, kill steps sent, the victim node's processes gone
CASES = [
    pytest.param(
        (("refused", 2, "scontrol show job*"), ("refused", 1, KILL_STEP)),
        KillOutcome.KILLED,
        2,
        True,
        id="read-and-step-refused",
    ),
    pytest.param((("lost", 1, KILL_STEP),), KillOutcome.UNCONFIRMED, 1, True, id="answer-lost"),
]


@pytest.mark.parametrize(("rules", "outcome", "steps", "victim_gone"), CASES)
def test_a_node_kill_under_failing_clients_hits_that_node_once_and_never_the_other(
    rules: tuple[tuple[str, int, str], ...],
    outcome: KillOutcome,
    steps: int,
    victim_gone: bool,
    slurm_cluster: SlurmCluster,
    faulty: Faulty,
    tmp_path: Path,
    figures: Figures,
) -> None:
    job, orch, node, procs = start(slurm_cluster, faulty, tmp_path)
    victim = procs[node.name]
    survivor = next(p for name, p in procs.items() if name != node.name)
    try:
        faulty.rules(*rules)
        result = orch.kill_node(node, dry_run=False, fault=Fault("KillNode"))
        figures.add("slurm_node_fault_cases")
        assert result.outcome is outcome, result.detail
        assert faulty.faults(), "the fault was injected"
        assert len(faulty.calls(KILL_STEP)) == steps, faulty.calls("srun*")
        if victim_gone:
            eventually(lambda: not alive(victim), "the victim node's processes gone")
        else:
            stays(lambda: alive(victim) == victim, "the victim node's processes run", QUIET)
        assert alive(survivor) == survivor, "a process of the other node was touched"
        if outcome is KillOutcome.UNCONFIRMED:
            assert "may have run" in result.detail, result.detail
    finally:
        orch.cleanup()
    assert alive(survivor) == survivor
    assert_nothing_left(slurm_cluster, faulty, job, figures)


def test_a_drain_whose_outcome_is_unknown_kills_nothing_and_cleanup_resumes_the_node(
    slurm_cluster: SlurmCluster, faulty: Faulty, tmp_path: Path, figures: Figures
) -> None:
    job, orch, node, procs = start(slurm_cluster, faulty, tmp_path, drain=True)
    try:
        faulty.rules(("hang", 1, DRAIN), ("refused", 1, RESUME))
        orch.commands.timeout = 3.0  # the hung DRAIN's wait (scontrol update answers at once)
        result = orch.kill_node(node, dry_run=False, fault=Fault("KillNode", drain_node=True))
        figures.add("slurm_node_fault_cases")
        assert result.outcome is KillOutcome.UNCONFIRMED, result.detail
        assert "no process was killed, cleanup RESUMEs the node" in result.detail
        assert node_state(slurm_cluster, node.name).startswith("drain")  # it acted, then hung
        assert faulty.calls(KILL_STEP) == [], "no kill step after a drain that did not answer"
        stays(lambda: all(alive(p) == p for p in procs.values()), "nothing killed", QUIET)
    finally:
        orch.cleanup()  # its first RESUME is refused: sent again
    assert orch.resumed == [f"node {node.name} RESUMEd"]
    assert len(faulty.calls(RESUME)) == 2, faulty.calls("scontrol update*")
    assert all(alive(p) == p for p in procs.values())
    assert_nothing_left(slurm_cluster, faulty, job, figures)


def test_a_resume_refused_every_time_is_cleanups_error_with_the_command(
    slurm_cluster: SlurmCluster, faulty: Faulty, tmp_path: Path, figures: Figures
) -> None:
    job, orch, node, procs = start(slurm_cluster, faulty, tmp_path, drain=True)
    survivor = next(p for name, p in procs.items() if name != node.name)
    try:
        faulty.rules(("refused", 100, RESUME))
        result = orch.kill_node(node, dry_run=False, fault=Fault("KillNode", drain_node=True))
        figures.add("slurm_node_fault_cases")
        assert result.outcome is KillOutcome.KILLED, result.detail
        eventually(lambda: not alive(procs[node.name]), "the node's processes gone")
        assert alive(survivor) == survivor
    finally:
        with pytest.raises(BackendError) as raised:
            orch.cleanup()
    message = str(raised.value)
    assert f"node {node.name}" in message, message
    assert f"scontrol update NodeName={node.name} State=RESUME" in message, message
    assert node_state(slurm_cluster, node.name).startswith("drain")  # as the error says
    slurm_cluster.run("scontrol", "update", f"NodeName={node.name}", "State=RESUME")  # the fix
    assert alive(survivor) == survivor
    assert_nothing_left(slurm_cluster, faulty, job, figures)
