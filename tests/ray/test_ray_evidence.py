"""Evidence from a Ray job's own lines: the driver relays, the workers report (issue 41, 6).

Ray's driver prints every line a worker prints, after a header in colour (Ray's default
unless ``RAY_COLOR_PREFIX=0``): ``\\x1b[36m(RayTrainWorker pid=N, ip=…)\\x1b[0m Epoch 5 | …``.
The evidence hook looked for the relay header before it took the colours off, so the
driver reported its workers' lines as its own, without a rank. We test these aspects,
with Ray's own print function (``ray._private.worker.print_worker_logs``) and a real
driver:

- the coloured header is a relay header: :func:`strip_relay` takes it off, and a process
  that prints such lines (a log collector, a shell) reports none of them;
- a Ray driver (connected with ``ray.init``) matches nothing, like a torchrun agent: on a
  real cluster, every RECOVERYGATE/v1 line in the driver's output is one its worker
  printed (relayed under the worker's header), none the driver's own, coloured or not;
  the worker (a Ray worker process) matched its own lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
from recoverygate.evidence import strip_relay

from pytest_recoverygate.orchestrators import AUTO_ENV
from tests.patience import CLUSTER, JOB, within

pytest.importorskip("ray", reason='the ray backend needs pip install "recoverygate[ray]"')

#: A user's pattern, as drills of the DDP tutorial write them: not anchored, so a line
#: behind a relay header matches it too (a preset's ``^iter`` would not).
SPEC = json.dumps({"evidence": {"patterns": {"progress": r"Epoch (?P<step>\d+) \| loss "}}})
LINES = ["[GPU1] Epoch 4 | loss 2.5000", "[GPU1] Epoch 5 | loss 2.4000"]

#: Ray's own print of relayed worker lines, as the driver does it.
RELAY = """
import json, sys
from ray._private.worker import print_worker_logs
data = {"pid": 4242, "actor_name": "RayTrainWorker", "ip": "10.0.0.2", "localhost": "10.0.0.1",
        "lines": json.loads(sys.argv[1])}
print_worker_logs(data, sys.stdout)
"""


def plain_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (AUTO_ENV, "RANK", "RAY_COLOR_PREFIX")}
    return {**env, **extra}


def rays_relay(lines: list[str], **env: str) -> str:
    """What Ray's driver prints for ``lines`` of a worker (Ray's function, run here)."""
    done = subprocess.run(
        [sys.executable, "-c", RELAY, json.dumps(lines)],
        env=plain_env(**env),
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=True,
    )
    return done.stdout


def sentinels(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if "RECOVERYGATE/v1 " in line]


@pytest.mark.slow
def test_rays_coloured_relay_header_is_a_relay_header() -> None:
    printed = rays_relay(LINES).splitlines()
    assert printed[0].startswith("\x1b[36m(RayTrainWorker pid=4242, ip=10.0.0.2)\x1b[0m ")

    assert [strip_relay(line) for line in printed] == [(line, None) for line in LINES]
    plain = rays_relay(LINES, RAY_COLOR_PREFIX="0").splitlines()
    assert [strip_relay(line) for line in plain] == [(line, None) for line in LINES]


@pytest.mark.slow
def test_a_process_printing_rays_coloured_relay_reports_none_of_it() -> None:
    """Before the fix such a process reported every relayed line as its own (no rank)."""
    printed = rays_relay(LINES)
    job = f"import sys\nsys.stdout.write({printed!r})\nprint('Epoch 9 | loss 1.0000')\n"

    done = subprocess.run(
        [sys.executable, "-c", job],
        env=plain_env(**{AUTO_ENV: SPEC}),
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=True,
    )

    steps = [json.loads(line.split(" ", 1)[1]) for line in sentinels(done.stdout)]
    assert [(e["event"], e.get("step")) for e in steps if e["event"] != "start"] == [
        ("progress", 9)  # its own line only
    ], done.stdout


DRIVER = """
import os, sys, time
import ray

@ray.remote(num_cpus=0)
class RayTrainWorker:
    def train(self, lines):
        for line in lines:
            print(line, flush=True)
        return os.getpid()

ray.init(num_cpus=1, include_dashboard=False)
print("Epoch 7 | loss 3.0000", flush=True)  # the driver's own
worker = RayTrainWorker.remote()
pid = ray.get(worker.train.remote(sys.argv[1:]))
time.sleep(4)  # Ray's log monitor relays the worker's lines to this driver
print("worker pid", pid, flush=True)
ray.shutdown()
"""


@pytest.mark.e2e
@pytest.mark.ray
@pytest.mark.parametrize("colour", ["1", "0"])
def test_a_real_ray_driver_reports_no_line_of_its_own(colour: str) -> None:
    with tempfile.TemporaryDirectory(prefix="rg-ev-", dir="/tmp") as folder:
        env = plain_env(**{AUTO_ENV: SPEC, "RAY_TMPDIR": folder, "RAY_AUTH_MODE": "disabled"})
        if colour == "0":
            env["RAY_COLOR_PREFIX"] = "0"
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, *LINES],
            env=env,
            capture_output=True,
            text=True,
            timeout=within(CLUSTER),
            check=False,
            cwd=folder,
        )
    why = f"{done.stdout}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, why
    relayed = [line for line in done.stdout.splitlines() if "RayTrainWorker pid=" in line]
    assert any("Epoch 4 | loss 2.5000" in line for line in relayed), why  # the premise
    if colour == "1":
        assert relayed[0].startswith("\x1b["), why  # Ray's default: a coloured header

    found = sentinels(done.stdout)
    own = [line for line in found if strip_relay(line)[0] == line]
    assert own == [], why
    worker = [json.loads(strip_relay(line)[0].split(" ", 1)[1]) for line in found]
    assert ("progress", 5) in [(e["event"], e.get("step")) for e in worker], why
