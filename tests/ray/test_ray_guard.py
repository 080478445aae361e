"""What the Ray drill takes from Train's state, and what it checks against the GCS (no Ray).

Train's run state is job input (issue 41): the workers describe themselves, and the
detached actor that holds it takes updates from any driver of the cluster. We test
these aspects, on answers captured from a real Ray 2.60 run (tests/ray/data:
``train-runs-running.json``, Train's state of two running workers, and
``gcs-answer-running.json``, the helper's ``gcs`` answer for them at the same moment):

- the honest state agrees with the GCS; a state that names another pid, node, job or
  class, or an actor the GCS does not know, is refused, naming what differs;
- the guard refuses at discovery before any probe, and when the node's probe says the
  pid is no Train worker of its raylet; it takes the start ticks the node read; in a
  cluster the drill started, the drill's jobs are those whose driver carries its marker;
- KillNode: only a node hosting a worker the GCS vouches for, never the head, and a GCS
  that names no head (or cannot be read) is a refusal (it failed open);
- the logs folder is the session the GCS names (under the drill's own ``RAY_TMPDIR``
  for a cluster it started), and only the file of that actor's worker id and pid;
- the kill server matches answers to requests (a late answer to a timed-out SIGSTOP is
  not cleanup's SIGCONT's answer);
- ``submissionId`` is quoted into the Jobs API's URL.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError
from pytest_recoverygate.orchestrators.ray import server as server_module
from pytest_recoverygate.orchestrators.ray.guard import WorkerGuard
from pytest_recoverygate.orchestrators.ray.orchestrator import RayOrchestrator
from pytest_recoverygate.orchestrators.ray.server import KillServer
from pytest_recoverygate.orchestrators.ray.state import TrainRun, TrainWorker, parse_runs
from pytest_recoverygate.orchestrators.ray.verify import (
    driver_job,
    head_node,
    logs_folder,
    parse_gcs,
    refusal,
)
from pytest_recoverygate.orchestrators.ray.workers import nodes_of
from pytest_recoverygate.registry.seams import RealClock
from pytest_recoverygate.shared.procs import JobLaunch
from tests.patience import PROMPT, within

DATA = Path(__file__).resolve().parent / "data"
LOCAL = {"127.0.0.1", "192.0.2.2"}  # the machine the answers were captured on
DRIVER_PID = 20074  # the driver of that run (job 01000000)


def captured_run() -> TrainRun:
    (run,) = parse_runs(json.loads((DATA / "train-runs-running.json").read_text()))
    return run


def captured_gcs() -> dict[str, Any]:
    answer: dict[str, Any] = json.loads((DATA / "gcs-answer-running.json").read_text())
    return answer


def workers() -> tuple[TrainWorker, ...]:
    current = captured_run().current
    assert current is not None and current.running
    return current.workers


# ---------------------------------------------------------------------------- the GCS


def test_the_honest_state_agrees_with_the_gcs() -> None:
    view = parse_gcs(captured_gcs())
    job = driver_job(view, DRIVER_PID, LOCAL)
    assert job == "01000000"
    assert job == "01000000"
    assert [refusal(w, view, {job}) for w in workers()] == [None, None]
    assert head_node(view) == next(iter(view.nodes))


@pytest.mark.parametrize(
    ("forged", "said"),
    [
        ({"pid": 4242}, "Train's state names pid 4242 for rank 1"),
        ({"node_id": "f" * 56}, "the GCS on node 4c892f9cc195"),
        ({"actor_id": "0" * 32}, "the GCS has no actor"),
    ],
)
def test_a_forged_worker_is_refused_naming_what_differs(forged: dict[str, Any], said: str) -> None:
    view = parse_gcs(captured_gcs())
    rank1 = replace(workers()[1], **forged)

    why = refusal(rank1, view, {"01000000"})

    assert why is not None and said in why, why


def test_an_actor_of_another_job_or_class_is_refused() -> None:
    answer = captured_gcs()
    rank1 = workers()[1]
    other = copy.deepcopy(answer)
    other["actors"][rank1.actor_id]["job"] = "02000000"
    assert "belongs to job 02000000, not to the drill's job 01000000" in str(
        refusal(rank1, parse_gcs(other), {"01000000"})
    )
    other = copy.deepcopy(answer)
    other["actors"][rank1.actor_id]["class"] = "TrainController"
    assert "not a RayTrainWorker" in str(refusal(rank1, parse_gcs(other), {"01000000"}))
    assert "job is unknown" in str(refusal(rank1, parse_gcs(answer), ()))


def test_a_dead_actor_is_gone_not_refused_when_the_caller_allows() -> None:
    answer = captured_gcs()
    rank1 = workers()[1]
    answer["actors"][rank1.actor_id]["state"] = "DEAD"
    view = parse_gcs(answer)
    assert refusal(rank1, view, {"01000000"}, gone_ok=True) is None
    assert "as DEAD" in str(refusal(rank1, view, {"01000000"}))


def test_a_driver_on_another_machine_or_twice_listed_is_no_job_of_the_drill() -> None:
    view = parse_gcs(captured_gcs())
    assert driver_job(view, DRIVER_PID, {"10.9.9.9"}) is None
    assert driver_job(view, 1, LOCAL) is None


def test_a_malformed_gcs_answer_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match="malformed"):
        parse_gcs({"actors": {"a": {"class": "RayTrainWorker"}}})


# ---------------------------------------------------------------------------- the guard


class Cluster:
    """Answers the guard's requests as the helper would, from the captured answer."""

    def __init__(self, gcs: dict[str, Any] | None = None, probe: str = "ok") -> None:
        self.gcs = gcs if gcs is not None else captured_gcs()
        self.probe = probe
        self.asked: list[dict[str, Any]] = []

    def __call__(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.asked.append(request)
        if request["op"] == "gcs":
            return self.gcs
        if request["op"] == "probe":
            if self.probe != "ok":
                return {"outcome": "refused", "detail": self.probe}
            return {"outcome": "ok", "ticks": f"t{request['pid']}", "raylet": 20426}
        raise AssertionError(f"the guard sent {request}")


def test_the_guard_takes_the_ticks_its_probe_read_on_the_node() -> None:
    cluster = Cluster()
    guard = WorkerGuard(cluster, local=LOCAL)

    guard.verify(workers(), driver_pid=DRIVER_PID, job=None)

    assert guard.jobs == {"01000000"}
    assert [guard.ticks(w.actor_id) for w in workers()] == ["t20832", "t20878"]
    assert [r["op"] for r in cluster.asked] == ["gcs", "probe", "probe"]
    target = guard.target(workers()[1], guard.ticks(workers()[1].actor_id))
    assert target is not None and target.raylet == 20426 and target.local


def test_the_guard_refuses_a_forged_state_before_it_probes_anything() -> None:
    cluster = Cluster()
    guard = WorkerGuard(cluster, local=LOCAL)
    forged = (workers()[0], replace(workers()[1], pid=4242))

    with pytest.raises(DiscoveryError, match="registered pid 20878"):
        guard.verify(forged, driver_pid=DRIVER_PID, job=None)

    assert [r["op"] for r in cluster.asked] == ["gcs"]
    with pytest.raises(BackendError, match="refusing to signal 4242"):
        guard.target(forged[1], "123")


def test_the_guard_refuses_what_the_node_says_is_no_worker_of_its_raylet() -> None:
    guard = WorkerGuard(Cluster(probe="pid 20878 is no Ray worker of this node"), local=LOCAL)

    with pytest.raises(DiscoveryError, match="no Ray worker of this node"):
        guard.verify(workers(), driver_pid=DRIVER_PID, job=None)


def test_a_gcs_that_cannot_be_read_refuses_discovery() -> None:
    def down(request: dict[str, Any], timeout: float) -> dict[str, Any]:
        raise BackendError("the kill server gave no answer within 90s")

    with pytest.raises(DiscoveryError, match="could not read the GCS"):
        WorkerGuard(down, local=LOCAL).verify(workers(), driver_pid=DRIVER_PID, job=None)


def test_in_its_own_cluster_the_drill_takes_the_jobs_whose_drivers_carry_its_marker() -> None:
    """A driver behind a wrapper (``entrypoint: [bash, run.sh]``): the process the drill
    launched is not the driver; in a cluster the drill started, the jobs whose driver on
    this machine carries the drill's marker are its own, and no other."""
    marker = ("RECOVERYGATE_DRILL_ID", "0123456789abcdef")
    ours = subprocess.Popen(["sleep", "60"], env={**os.environ, marker[0]: marker[1]})
    other = subprocess.Popen(["sleep", "60"])
    try:
        answer = captured_gcs()
        answer["jobs"] = [
            {"job": "01000000", "driverPid": ours.pid, "driverIp": "192.0.2.2", "dead": False},
            {"job": "02000000", "driverPid": other.pid, "driverIp": "192.0.2.2", "dead": False},
        ]
        guard = WorkerGuard(Cluster(answer), local=LOCAL, marker=marker)

        guard.verify(workers(), driver_pid=ours.pid + 100_000, job=None)

        assert guard.jobs == {"01000000"}
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait(timeout=within(PROMPT))


def test_kill_node_is_refused_on_the_head_and_when_no_head_is_named() -> None:
    node = workers()[1].node_id
    guard = WorkerGuard(Cluster(), local=LOCAL)
    guard.verify(workers(), driver_pid=DRIVER_PID, job=None)
    with pytest.raises(BackendError, match="is the Ray head"):
        guard.check_node(node, workers())

    headless = captured_gcs()
    headless["nodes"][node]["head"] = False
    guard = WorkerGuard(Cluster(headless), local=LOCAL)
    guard.verify(workers(), driver_pid=DRIVER_PID, job=None)
    with pytest.raises(BackendError, match="names no head node"):
        guard.check_node(node, workers())


def test_kill_node_is_refused_on_a_node_with_no_worker_the_gcs_vouches_for() -> None:
    guard = WorkerGuard(Cluster(), local=LOCAL)
    guard.verify(workers(), driver_pid=DRIVER_PID, job=None)
    forged = [replace(w, pid=w.pid + 1) for w in workers()]

    with pytest.raises(BackendError, match="hosts no worker the GCS lists as the job's"):
        guard.check_node(workers()[0].node_id, forged)


def test_kill_node_fails_closed_when_the_head_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the orchestrator, as a drill calls it (a dry run: nothing could be sent
    anyway): the state API and the GCS both unreadable. It allowed the kill."""
    orchestrator = RayOrchestrator(
        JobLaunch(["python", "t.py"], Path("."), {}),
        address=None,
        submission_id=None,
        clock=RealClock(),
    )
    run = captured_run()

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise OSError("connection refused")

    def no_answer(*args: Any, **kwargs: Any) -> Any:
        raise BackendError("the kill server gave no answer within 90s")

    monkeypatch.setattr(orchestrator._runs, "fetch", lambda: run)
    monkeypatch.setattr(orchestrator._cluster, "get", unreadable)
    monkeypatch.setattr(orchestrator._cluster, "ask", no_answer)
    current = run.current
    assert current is not None
    node = nodes_of(orchestrator._guard, current)[0]
    try:
        with pytest.raises(BackendError):
            orchestrator.kill_node(node, dry_run=True, fault=model.Fault("KillNode"))
    finally:
        orchestrator.cleanup()


# ---------------------------------------------------------------------------- the logs


def test_the_logs_are_the_sessions_the_gcs_names_and_one_file_per_actor(tmp_path: Path) -> None:
    answer = captured_gcs()
    node = workers()[1].node_id
    session = tmp_path / "ray" / "session_x"
    answer["nodes"][node]["raylet"] = str(session / "sockets" / "raylet")
    logs = session / "logs"
    logs.mkdir(parents=True)
    rank1 = workers()[1]
    worker_id = answer["actors"][rank1.actor_id]["worker"]
    own = logs / f"worker-{worker_id}-01000000-{rank1.pid}.out"
    own.write_text("")
    (logs / f"worker-{'ab' * 28}-02000000-{rank1.pid}.out").write_text("")  # same pid, not it
    guard = WorkerGuard(Cluster(answer), local=LOCAL, within=tmp_path)
    guard.verify(workers(), driver_pid=DRIVER_PID, job=None)

    assert guard.logs_folder(node) == logs
    assert guard.log_files(rank1) == [own]
    # the file of the pid its raylet registered, whatever pid the state names
    assert guard.log_files(replace(rank1, pid=4242)) == [own]
    assert guard.log_files(replace(rank1, actor_id="0" * 32)) == []  # no actor of the GCS

    view = parse_gcs(answer)
    assert logs_folder(view, node, within=tmp_path / "elsewhere") is None
    answer["nodes"][node]["raylet"] = "/tmp/../etc/sockets/raylet"
    assert logs_folder(parse_gcs(answer), node) is None


# ---------------------------------------------------------------------------- the server

#: A stand-in for ``helper serve``: ready at once, then it answers each request with the
#: signal it asked for, the first one two seconds late (a task on a busy node).
STAND_IN = r"""
import json, sys, time
MARK = "RECOVERYGATE-RAY "
print("\n" + MARK + json.dumps({"ready": True}), flush=True)
for n, line in enumerate(sys.stdin):
    request = json.loads(line)
    if n == 0:
        time.sleep(2.0)
    answer = {"outcome": "killed", "detail": "SIG" + request.get("signal", "?")}
    print("\n" + MARK + json.dumps({**answer, "id": request.get("id")}), flush=True)
"""


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[KillServer]:
    monkeypatch.setattr(
        server_module, "helper_command", lambda *args: [sys.executable, "-c", STAND_IN]
    )
    server = KillServer({}, "127.0.0.1:1")
    assert server.ready(30)
    try:
        yield server
    finally:
        server.close()


def test_a_late_answer_is_never_taken_for_the_next_requests(stand_in: KillServer) -> None:
    with pytest.raises(BackendError, match="no answer"):
        stand_in.kill("node", 42, "100", 0.5, "STOP")

    answer = stand_in.kill("node", 42, "100", 10.0, "CONT")  # cleanup's SIGCONT

    assert answer["detail"] == "SIGCONT", answer


# ---------------------------------------------------------------------------- the Jobs API


class _Jobs(BaseHTTPRequestHandler):
    paths: list[str] = []  # noqa: RUF012 - the test reads what the server was asked

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        body = json.dumps({"status": "RUNNING", "job_id": "02000000"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_the_submission_id_is_quoted_into_the_jobs_url() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Jobs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Jobs.paths.clear()
    submission = "raysubmit_1/../../api/evil?x=1#y"
    orchestrator = RayOrchestrator(
        JobLaunch([], Path("."), {}),
        address="127.0.0.1:6379",
        submission_id=submission,
        clock=RealClock(),
    )
    try:
        orchestrator._cluster.dashboard = f"http://127.0.0.1:{server.server_address[1]}"
        orchestrator._runs.check_job()
    finally:
        server.shutdown()
        server.server_close()
        orchestrator.cleanup()

    assert _Jobs.paths == ["/api/jobs/raysubmit_1%2F..%2F..%2Fapi%2Fevil%3Fx%3D1%23y"]
