"""A forged Train state never aims the drill (issue 41, security 8), on a real cluster.

Train's run state is job input: the detached actor that holds it takes updates from any
driver of the cluster, and each worker describes itself. We test this aspect with a real
driver (tests/ray/data/forged_state_driver.py: its own cluster, two real actors of a
class named ``RayTrainWorker``, a ``sleep`` of its own) whose Train state, written through
Train's own state manager, names the sleep as rank 1's pid:

- discovery refuses the run (ERROR), naming the pid the state gave and the one the raylet
  registered in the GCS;
- a kill aimed at that identity anyway (rank 1's actor, the sleep's pid and its true
  start ticks: what discovery used to hand the engine) is refused, nothing sent;
- the sleep is never signalled: still running, same start time, not stopped.

Before the fix the drill read the start ticks of the named pid itself, so the identity
check passed and the sleep was SIGKILLed "by the drill". One cluster (about a minute).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.orchestrators.ray.helper import process_ticks
from pytest_recoverygate.orchestrators.ray.orchestrator import RayOrchestrator
from pytest_recoverygate.registry.seams import RealClock
from pytest_recoverygate.shared.procs import JobLaunch
from tests.patience import CLUSTER, JOB, QUIET, deadline, eventually, stays

pytest.importorskip("ray", reason='the ray backend needs pip install "recoverygate[ray]"')

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

DRIVER = Path(__file__).resolve().parent / "data" / "forged_state_driver.py"


def state_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return None


def test_a_forged_state_naming_a_sleep_is_refused_and_the_sleep_is_never_signalled(
    tmp_path: Path,
) -> None:
    facts = tmp_path / "pids"
    job = JobLaunch(
        [sys.executable, str(DRIVER), str(facts), str(tmp_path / "storage")], tmp_path, {}
    )
    orchestrator = RayOrchestrator(
        job, address=None, submission_id=None, target_rank=1, clock=RealClock()
    )
    try:
        refused: str | None = None
        workload: model.Workload | None = None
        try:
            workload = orchestrator.discover(deadline(CLUSTER))
        except DiscoveryError as exc:
            refused = str(exc)
        eventually(facts.exists, "the driver's facts", JOB)
        sleep_pid, true_pid, actor = facts.read_text().split()
        sleep, ticks = int(sleep_pid), process_ticks(int(sleep_pid))
        assert ticks is not None and state_of(sleep) == "S"  # the premise: the sleep runs

        # Aim a kill at it anyway, as discovery used to: rank 1 of the forged state.
        aimed = workload.by_rank(1) if workload is not None else None
        target = aimed or model.Worker(1, "forged", f"{actor}:{sleep}@{ticks}")
        try:
            result = orchestrator.kill(target, dry_run=False, fault=model.KILL)
            outcome = f"{result.outcome.value}: {result.detail}"
        except BackendError as exc:
            outcome = f"refused: {exc}"
        untouched = f"the sleep not signalled (a kill: {outcome})"
        stays(lambda: state_of(sleep) == "S" and process_ticks(sleep) == ticks, untouched, QUIET)
        assert outcome.startswith("refused: refusing to signal"), outcome
        assert refused is not None, f"discovery took the forged state: {workload}"
        assert f"Train's state names pid {sleep} for rank 1" in refused, refused
        assert f"its raylet registered pid {true_pid}" in refused, refused
    finally:
        orchestrator.cleanup()
