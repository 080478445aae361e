"""The session cluster scripts/slurm-cluster brought up is private to root (marker ``slurm``).

We test these aspects: the munge key is 0400 and root's; munged runs without ``--force``
(it accepted the folder's permissions as they are); no folder of the cluster is writable
by others (no 1777 node temp roots); a job's ``$SLURM_TMPDIR`` is made by root for the
job's user, 0700; the one-node cluster's slurmctld and slurmd listen on loopback only (where the
host name resolves to loopback, as here).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.patience import JOB, eventually
from tests.slurm.slurm_testcluster import SlurmCluster

pytestmark = pytest.mark.slurm


def listening(port: str) -> list[str]:
    """The local addresses (hex, /proc/net/tcp) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and local.endswith(f":{int(port):04X}"):
                found.append(local.rsplit(":", 1)[0])
    return found


def test_the_cluster_is_private_to_root(slurm: SlurmCluster, tmp_path: Path) -> None:
    key = slurm.folder / "munge" / "munge.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o400 and key.stat().st_uid == 0
    munged = (slurm.folder / "munge" / "munged.pid").read_text().strip()
    assert b"--force" not in Path(f"/proc/{munged}/cmdline").read_bytes()
    for path in [slurm.folder, *slurm.folder.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            assert not path.stat().st_mode & stat.S_IWOTH, f"{path} is writable by others"
    job = slurm.submit(
        "#!/bin/sh\nstat -c '%a %U' \"$SLURM_TMPDIR\"\n", "-n1", "-o", "out.txt", workdir=tmp_path
    )
    out = tmp_path / "out.txt"
    eventually(lambda: out.exists() and out.read_text().strip(), f"job {job}'s output", JOB)
    assert out.read_text().split() == ["700", "root"], f"job {job}"
    conf = Path(slurm.conf).read_text()
    if "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" in conf:  # (host name -> 127.x)
        assert slurm.nodes == ["localhost"]
        ports = [
            line.split("=", 1)[1]
            for line in conf.splitlines()
            if line.startswith(("SlurmctldPort=", "SlurmdPort="))
        ]
        for port in ports:
            assert set(listening(port)) == {"0100007F"}, f"port {port} listens beyond loopback"
