"""The ray backend's ``workload`` section and its refusals (no Ray needed).

We test these aspects: the examples load with their keys; the registry lists the
backend without importing ray; bad input is a validation error at FILE:LINE naming the
key, the value and the fix (an unknown key, an address that is not host:port, a
submissionId without an address or with an entrypoint, a fault Ray cannot take); and
Train's state answer (canned from a real Ray 2.60 run) is read into runs, attempts and
workers; the port of the cluster a driver starts is read from the file its GCS wrote,
never from the temporary file it writes first.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.errors import ConfigError
from pytest_recoverygate.orchestrators.ray import RayWorkload
from pytest_recoverygate.orchestrators.ray.processes import gcs_port
from pytest_recoverygate.orchestrators.ray.state import failed_worker, failure_of, parse_runs
from pytest_recoverygate.registry import get_backend

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ray"
DATA = Path(__file__).resolve().parent / "data"

HEAD = """\
workload:
  orchestrator: ray
"""
TAIL = """\
injectFailure:
  type: KillWorker
  afterCheckpoint: step-40
  targetRank: 1
expectations:
  maxRecoveryTime: 2m
"""


def write(folder: Path, workload: str, tail: str = TAIL) -> Path:
    path = folder / "drill.yaml"
    path.write_text(HEAD + textwrap.indent(textwrap.dedent(workload), "  ") + tail)
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


@pytest.mark.parametrize(
    "name",
    [
        "recovery-test.yaml",
        "recovery-test-no-resume.yaml",
        "recovery-test-budget.yaml",
        "recovery-test-kill-node.yaml",
    ],
)
def test_the_examples_load_with_their_keys(name: str) -> None:
    config = load_config(EXAMPLES / name)
    workload = config.workload
    assert isinstance(workload, RayWorkload)
    assert workload.entrypoint is not None
    assert workload.entrypoint[:2] == ["python", "train_ray.py"]
    assert workload.workdir == EXAMPLES
    assert workload.env == {"RECOVERYGATE_AUTO": "1"}


def test_the_issue_keys_load_address_and_submission_id_included(tmp_path: Path) -> None:
    path = write(tmp_path, "address: 127.0.0.1:6379\nsubmissionId: raysubmit_abc\nenv: {}\n")
    workload = load_config(path).workload
    assert isinstance(workload, RayWorkload)
    assert (workload.address, workload.submission_id) == ("127.0.0.1:6379", "raysubmit_abc")
    auto = write(tmp_path, "entrypoint: [python, train_ray.py]\naddress: auto\n")
    assert load_config(auto).workload.address == "auto"  # type: ignore[attr-defined]


def test_the_backend_registers_without_importing_ray() -> None:
    code = (
        "import sys; from pytest_recoverygate.registry import get_backend;"
        "b = get_backend('ray'); print(b.name, sorted(b.faults), 'ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    faults = (
        "['HangWorker', 'KillDuringCheckpoint', 'KillNode', 'KillWorker', 'Preempt', "
        "'StorageFault']"
    )
    assert out.stdout.split() == ["ray", *faults.split(), "False"]
    assert get_backend("ray").workload is RayWorkload


def test_an_unknown_key_names_its_line_and_the_keys_allowed(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, "entrypoint: [python, train_ray.py]\nadress: auto\n"))
    assert f"{tmp_path / 'drill.yaml'}:4: workload.adress: unknown key" in message
    assert "did you mean address?" in message


def test_an_address_that_is_not_host_and_port_is_refused(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, "entrypoint: [python, t.py]\naddress: ray://head:10001\n"))
    assert ":4: workload.address: is not the address of a Ray cluster's head" in message
    assert "got ray://head:10001" in message
    assert "host:port" in message


def test_a_submission_id_needs_an_address_and_no_entrypoint(tmp_path: Path) -> None:
    alone = error_of(write(tmp_path, "submissionId: raysubmit_abc\n"))
    assert "workload.submissionId: submissionId needs the cluster it runs on" in alone
    both = error_of(
        write(tmp_path, "entrypoint: [python, t.py]\naddress: auto\nsubmissionId: raysubmit_a\n")
    )
    assert "submissionId and entrypoint cannot both be set" in both
    neither = error_of(write(tmp_path, "workdir: .\n"))
    assert "workload.entrypoint: required key is missing" in neither


def test_a_fault_ray_cannot_take_is_refused_naming_who_can(tmp_path: Path) -> None:
    tail = TAIL.replace("KillWorker", "PartitionNode")
    message = error_of(write(tmp_path, "entrypoint: [python, t.py]\n", tail))
    assert "injectFailure.type" in message
    assert "PartitionNode" in message
    assert "ray" in message


@pytest.mark.parametrize("fault", ["KillDuringCheckpoint", "Preempt", "HangWorker"])
def test_the_faults_of_one_worker_are_offered_on_ray(tmp_path: Path, fault: str) -> None:
    assert {"KillWorker", fault, "KillNode"} <= get_backend("ray").faults
    config = load_config(
        write(tmp_path, "entrypoint: [python, t.py]\n", TAIL.replace("KillWorker", fault))
    )
    assert config.inject_failure.type == fault


def test_trains_state_answer_is_read_into_runs_attempts_and_workers() -> None:
    # Captured from a real Ray 2.60 run (the budget example): two attempts ended by a
    # kill of rank 1, the third being placed.
    payload = json.loads((DATA / "train-runs-after-a-kill.json").read_text())
    (run,) = parse_runs(payload)
    assert run.status == "SCHEDULING"
    assert not run.terminal
    assert [a.status for a in run.attempts] == ["ERRORED", "ERRORED", "PENDING"]
    first, second, placing = run.attempts
    assert [w.rank for w in first.workers] == [0, 1]
    assert not any(w.alive for w in first.workers + second.workers)
    assert not placing.running and placing.workers == ()
    assert {w.actor_id for w in first.workers}.isdisjoint({w.actor_id for w in second.workers})
    assert "[Rank 1 Error Snippet]" in first.detail
    assert "Scheduling 2 workers" in placing.detail
    assert run.driver_pid == 11381
    assert run.current is placing


def _run(status: str, attempt_status: str, alive: bool = True) -> dict[str, object]:
    """Train's answer for one run of one attempt of two workers (its real shape)."""
    workers = [
        {
            "world_rank": r,
            "actor_id": f"a{r}",
            "pid": 100 + r,
            "status": "ALIVE" if alive else "DEAD",
        }
        for r in (0, 1)
    ]
    attempt = {"attempt_id": "x", "status": attempt_status, "start_time_ns": 1, "workers": workers}
    return {"train_runs": [{"id": "r", "name": "n", "status": status, "attempts": [attempt]}]}


@pytest.mark.parametrize("status", ["RESTARTING", "SCHEDULING"])
def test_trains_restart_decision_with_every_worker_alive_is_a_failure(status: str) -> None:
    # A stopped rank kills nobody: the run leaves RUNNING while its attempt still runs.
    (run,) = parse_runs(_run(status, "RUNNING"))
    said = failure_of(run, 0, [])
    assert said is not None and said.startswith("Train decided to restart the group")


def test_a_run_not_yet_seen_running_is_no_restart_decision() -> None:
    # CI, a slow start: the run was still SCHEDULING while its first attempt ran (every
    # worker alive), 10 s before the kill; read as Train's restart decision, it took the
    # place of the kill's own WORKER_GONE. Only a run seen RUNNING with the attempt can
    # leave RUNNING.
    (run,) = parse_runs(_run("SCHEDULING", "RUNNING"))
    assert failure_of(run, 0, [], ran=False) is None
    assert failure_of(run, 0, [], ran=True) is not None


def test_a_running_run_or_an_attempt_being_placed_is_no_failure() -> None:
    (running,) = parse_runs(_run("RUNNING", "RUNNING"))
    assert failure_of(running, 0, []) is None
    (placing,) = parse_runs(_run("SCHEDULING", "PENDING"))
    assert failure_of(placing, 0, []) is None


def test_a_dead_worker_or_an_errored_attempt_is_a_worker_death() -> None:
    payload = json.loads((DATA / "train-runs-after-a-kill.json").read_text())
    (run,) = parse_runs(payload)
    first = run.attempts[0]
    said = failure_of(run, 0, [w for w in first.workers if not w.alive])
    assert said is not None and said.startswith("worker death detected: ")
    assert failure_of(run, 2, []) is None  # the new attempt, being placed


def test_the_worker_gone_is_the_drills_victim_when_a_late_look_finds_the_whole_group_dead() -> None:
    # A CI run under load looked only after Train's shutdown had ended both ranks, and
    # WORKER_GONE named the rank the drill had not killed. Here the mirror case on a
    # captured state: the drill killed rank 0, and Train's snippet names rank 1.
    payload = json.loads((DATA / "train-runs-after-a-kill.json").read_text())
    (run,) = parse_runs(payload)
    first = run.attempts[0]
    dead = [w for w in first.workers if not w.alive]
    assert [w.rank for w in dead] == [0, 1]  # both dead when looked at
    assert failed_worker(first, dead) is first.workers[1]  # Train's snippet: rank 1
    victim = first.workers[0]
    assert failed_worker(first, dead, {victim.actor_id}) is victim
    said = failure_of(run, 0, dead, {victim.actor_id})
    assert said is not None and said.startswith("worker death detected: ")


def test_the_gcs_port_is_read_from_the_file_the_gcs_renamed_not_its_temporary(
    tmp_path: Path,
) -> None:
    session = tmp_path / "session_latest"
    assert gcs_port(session) == ""  # no session yet
    session.mkdir()
    node = "a2ce6e3f530a2c4791d5ebfb1233b8791aa813304db657e30b8e1941"
    # The GCS writes the port to a temporary file, then renames it (CI saw the look find
    # the temporary file and the read find it gone): the temporary file is not the answer.
    (session / f"gcs_server_port_{node}.tmp").write_text("6379")
    assert gcs_port(session) == ""
    (session / f"gcs_server_port_{node}.tmp").rename(session / f"gcs_server_port_{node}")
    assert gcs_port(session) == "6379"
