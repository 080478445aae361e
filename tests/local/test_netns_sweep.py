"""``recoverygate sweep``: what a SIGKILLed multi-node drill left behind, found and removed.

We test these aspects, with real network namespaces and a real process inside one:
- a drill process (it makes its network and claims its owner record as the nodes backend
  does, then starts a process in node 0) SIGKILLed: ``sweep --dry-run`` names what it
  left and touches nothing; ``sweep`` ends the process in the namespace, deletes every
  namespace, the drill's folder and the record;
- while the drill runs, ``sweep`` leaves it all alone and says it is running;
- a record that names a folder which is not a drill's: the namespaces go, that folder
  stays, and the sweep says why;
- a namespace named like a drill's but named by no record is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from pytest_recoverygate.orchestrators.local.netns import NETNS_DIR, missing_capabilities
from pytest_recoverygate.orchestrators.local.sweep import RECORD_PREFIX
from tests.patience import JOB, PROMPT, eventually, within

pytestmark = [
    pytest.mark.local,
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(missing_capabilities()), reason="needs root: CAP_NET_ADMIN, CAP_SYS_ADMIN, ip"
    ),
]

ROOT = Path(__file__).resolve().parents[2]

# What the nodes backend does at discovery, then a process in node 0; then it waits to be
# killed. It prints its drill id, the process's pid and its folder.
DRILL = textwrap.dedent(
    """
    import subprocess, sys, tempfile, time
    from pathlib import Path
    from pytest_recoverygate.orchestrators.local.netns import Network, node_command
    from pytest_recoverygate.orchestrators.local.sweep import claim

    root = Path(tempfile.mkdtemp(prefix="recoverygate-nodes-"))
    net = Network(2, root / "hosts")
    claim(net.drill_id, root)
    nodes = net.open()
    proc = subprocess.Popen(node_command(nodes[0], root / "hosts", ["sleep", "600"]))
    print(net.drill_id, proc.pid, root, flush=True)
    time.sleep(600)
    """
)


@dataclass
class DeadDrill:
    process: subprocess.Popen[str]
    drill_id: str
    inner: int  # the pid of the process in node 0
    folder: Path
    locks: Path

    @property
    def record(self) -> Path:
        return self.locks / f"{RECORD_PREFIX}{self.drill_id}.json"

    def namespaces(self) -> list[str]:
        return sorted(
            p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"rg{self.drill_id}-")
        )

    def inner_alive(self) -> bool:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.inner, os.WNOHANG)  # ours when this process is a subreaper
        try:
            return psutil.Process(self.inner).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def sweep(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest_recoverygate.cli", "sweep", *args],
            env=_env(self.locks),
            capture_output=True,
            text=True,
            timeout=within(JOB),
            check=False,
        )


def _env(locks: Path) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "reporter")])
    return {**os.environ, "RECOVERYGATE_LOCK_DIR": str(locks), "PYTHONPATH": path}


@pytest.fixture
def drill(tmp_path: Path) -> Iterator[DeadDrill]:
    """A drill process with its network up and a process in node 0 (not yet killed)."""
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    process = subprocess.Popen(
        [sys.executable, "-c", DRILL], env=_env(locks), stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    try:
        ready, _, _ = select.select([process.stdout], [], [], 30)
        assert ready, "the drill process did not start its network in 30 s"
        drill_id, inner, folder = process.stdout.readline().split()
    except BaseException:
        process.kill()
        process.wait()
        process.stdout.close()
        raise
    dead = DeadDrill(process, drill_id, int(inner), Path(folder), locks)
    try:
        node0 = (NETNS_DIR / f"rg{drill_id}-n0").stat()

        def inside_node0() -> bool:  # nsenter, then the exec: the same pid
            with contextlib.suppress(OSError):
                inside = os.stat(f"/proc/{dead.inner}/ns/net")
                return (inside.st_dev, inside.st_ino) == (node0.st_dev, node0.st_ino)
            return False

        eventually(inside_node0, "the inner process in node 0's namespace", PROMPT)
        yield dead
    finally:  # whatever the test did: nothing of it left
        process.kill()
        process.wait()
        process.stdout.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(dead.inner, signal.SIGKILL)
        for name in dead.namespaces():
            subprocess.run(["ip", "netns", "delete", name], check=False)
        subprocess.run(["rm", "-rf", str(dead.folder)], check=False)
        dead.inner_alive()


def kill(drill: DeadDrill) -> None:
    drill.process.send_signal(signal.SIGKILL)  # no cleanup can run: what sweep is for
    drill.process.wait()


def test_a_sigkilled_drills_namespaces_processes_folder_and_record_are_swept(
    drill: DeadDrill,
) -> None:
    kill(drill)
    left = [f"rg{drill.drill_id}-n0", f"rg{drill.drill_id}-n1", f"rg{drill.drill_id}-sw"]
    assert drill.namespaces() == left
    assert drill.inner_alive() and drill.folder.is_dir() and drill.record.is_file()

    listed = drill.sweep("--dry-run")
    assert listed.returncode == 0, listed.stderr
    assert (
        f"drill rg{drill.drill_id} (no longer running; its record names pid {drill.process.pid})"
        in listed.stdout
    )
    assert "would remove namespaces " + ", ".join(left) in listed.stdout
    assert drill.namespaces() == left and drill.inner_alive() and drill.record.is_file()

    swept = drill.sweep()
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert f"removed namespaces {', '.join(left)}; removed its folder {drill.folder}" in (
        swept.stdout
    )
    assert drill.namespaces() == []
    eventually(lambda: not drill.inner_alive(), "the inner process gone", PROMPT)
    assert not drill.folder.exists() and not drill.record.exists()
    again = drill.sweep()
    # A namespace of a drill running beside this test (another worker's, another lock
    # folder's) is named and left alone (then "nothing to sweep" is not printed): nothing
    # of this drill is said again.
    said = [line for line in again.stdout.splitlines() if not line.startswith("namespace ")]
    assert again.returncode == 0 and all(s.startswith("nothing to sweep") for s in said), said
    assert f"rg{drill.drill_id}" not in again.stdout, again.stdout


def test_a_running_drill_is_left_alone(drill: DeadDrill) -> None:
    swept = drill.sweep()
    assert swept.returncode == 0, swept.stderr
    assert f"drill rg{drill.drill_id}: running (it holds its record); left alone" in swept.stdout
    assert len(drill.namespaces()) == 3 and drill.inner_alive() and drill.record.is_file()


def test_a_record_naming_another_folder_has_its_namespaces_swept_not_the_folder(
    drill: DeadDrill, tmp_path: Path
) -> None:
    kill(drill)
    precious = tmp_path / "precious"
    precious.mkdir()
    record = json.loads(drill.record.read_text())
    drill.record.write_text(json.dumps({**record, "folder": str(precious)}))
    swept = drill.sweep()
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert f"{precious} is not the folder the drill made" in swept.stdout
    assert precious.is_dir() and drill.namespaces() == []


def test_a_namespace_no_record_names_is_left_alone(drill: DeadDrill) -> None:
    kill(drill)
    drill.record.unlink()  # as if made by a drill from before records, or another tool
    swept = drill.sweep()
    assert swept.returncode == 0, swept.stderr
    assert f"namespace rg{drill.drill_id}-n0: named like a drill's, but no owner record" in (
        swept.stdout
    )
    assert len(drill.namespaces()) == 3 and drill.inner_alive()
