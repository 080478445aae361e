"""Attaching to a Ray cluster the drill did not start (``address`` + ``submissionId``).

We test these aspects on a real head node (``ray start --head``, 1 CPU, its own short
``--temp-dir`` and token, ended by its marker at the end of the module): a
``submissionId`` that is not running (the job SUCCEEDED) and one the cluster never had
are each an ERROR (exit 3) naming the id, before anything is killed, and the drill leaves
the cluster running (it never stops a cluster it did not start).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.cli_drill import run_cli_drill
from tests.patience import CLUSTER, JOB, PROCESS, PROMPT, Timeout, eventually, within

pytest.importorskip("ray", reason='the ray backend needs pip install "recoverygate[ray]"')

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

MARKER = "RECOVERYGATE_TEST_HEAD"


@dataclass(frozen=True)
class Head:
    address: str
    dashboard: str
    env: dict[str, str]

    def request(self, method: str, path: str, body: object = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.dashboard + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.env['RAY_AUTH_TOKEN']}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=within(PROCESS)) as answer:
            return json.loads(answer.read())

    def alive(self) -> bool:
        try:
            self.request("GET", "/api/version")
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def marked(value: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(MARKER) == value:
                found.append(proc)
    return found


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    folder = tempfile.mkdtemp(prefix="rg-head-", dir="/tmp")
    value = secrets.token_hex(6)
    port, dashboard = free_port(), free_port()
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        MARKER: value,
    }
    ray = str(Path(sys.executable).with_name("ray"))
    proc = subprocess.Popen(
        [
            ray,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=1",
            f"--temp-dir={folder}",
            "--include-dashboard=true",
            f"--dashboard-port={dashboard}",
            "--dashboard-host=127.0.0.1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    cluster = Head(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard}", env)
    try:

        def answers() -> bool:
            assert proc.poll() is None, f"ray start --head exited with {proc.returncode}"
            return cluster.alive()

        eventually(answers, "the head's dashboard", CLUSTER)
        yield cluster
    finally:
        # The test's own head, not the drill's: no graceful stop is under test here
        # (`ray start --block` sat out a 30 s wait on SIGTERM, measured), so SIGKILL.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=within(PROMPT))

        def none_left() -> bool:
            left = marked(value)
            for p in left:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            return not left

        with contextlib.suppress(Timeout):  # the assert below names what is left
            eventually(none_left, "the test head's processes gone")
        shutil.rmtree(folder, ignore_errors=True)
        assert not marked(value), "the test head left processes running"


def attach(submission: str, head: Head) -> dict[str, object]:
    return {
        "workload": {
            "orchestrator": "ray",
            "address": head.address,
            "submissionId": submission,
        },
        "injectFailure": {"type": "KillWorker", "afterCheckpoint": "step-20", "targetRank": 1},
        "expectations": {"maxRecoveryTime": "1m"},
        "safety": {"requireConfirm": False},
    }


def test_a_submission_that_is_not_running_is_an_error_naming_it(head: Head, tmp_path: Path) -> None:
    job = head.request("POST", "/api/jobs/", {"entrypoint": "python -c 'print(1)'"})
    submission = str(job["submission_id"])  # type: ignore[index]
    done = "SUCCEEDED"
    status = f"/api/jobs/{submission}"
    eventually(lambda: head.request("GET", status)["status"] == done, "the one-line job", JOB)  # type: ignore[index]

    run = run_cli_drill(
        attach(submission, head), tmp_path / "drill.yaml", timeout=within(CLUSTER), env=head.env
    )

    assert run.code == 3, run.output
    assert f"workload.submissionId {submission!r} is not running" in run.report["summary"]
    assert "SUCCEEDED" in run.report["summary"]
    assert head.alive(), "the drill stopped a cluster it did not start"


def test_a_submission_the_cluster_never_had_is_an_error_naming_it(
    head: Head, tmp_path: Path
) -> None:
    run = run_cli_drill(
        attach("raysubmit_nosuchjob", head),
        tmp_path / "drill.yaml",
        timeout=within(CLUSTER),
        env=head.env,
    )

    assert run.code == 3, run.output
    assert "'raysubmit_nosuchjob'" in run.report["summary"]
    assert "no such Ray Job" in run.report["summary"]
    assert head.alive()
