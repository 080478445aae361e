"""The real Kubernetes cluster of scripts/kube-cluster, brought up once per test session.

``kube_cluster`` (session scope) is a two-node cluster (``up --nodes 2``): the real
kube-apiserver, controllers, scheduler, kubelets, the Kubeflow training operator, JobSet
and Trainer; ``down`` at the end of the session, and then nothing of it may be left on
the machine (no process, network namespace, link, mount or cgroup: the teardown fails
the session otherwise). Every test that uses it carries the ``kube_cluster`` marker
(added at collection for tests that name the fixture): under ``pytest -n`` they all run
in one worker (tests/conftest.py), so one session brings up one cluster, and they are
``slow`` (the quick lane starts no cluster).

``RECOVERYGATE_KUBE_CLUSTER=DIR`` uses the cluster already up in DIR (``scripts/kube-cluster
up --nodes 2 DIR``) and leaves it up: scripts/test brings one up for all of its pytest
runs. Where the cluster cannot run (not root, containerd or runc missing, the binaries not
built: ``scripts/kube-cluster install``), the tests skip and say why.

Each test's jobs live in a namespace of their own (:meth:`KubeCluster.namespace`),
deleted with everything in it afterwards, so tests never see each other's pods and a
reused cluster is left as it was found.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests import patience

__all__ = [
    "KubeCluster",
    "cluster_missing",
    "eventually",
    "kube_cluster",
    "leftovers",
]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kube-cluster"
REUSE_ENV = "RECOVERYGATE_KUBE_CLUSTER"
#: A warm up takes 25-110 s (idle / a load of 14 on 2 cores); stretched by the slack.
UP_TIMEOUT = 2 * patience.CLUSTER
#: How long the tests wait for the cluster to do something (a pod Running, a namespace
#: gone), scaled like scripts/kube-cluster's own waits (RG_KUBE_PATIENCE).
PATIENCE = 120.0 * float(os.environ.get("RG_KUBE_PATIENCE", "1") or 1)

T = TypeVar("T")


def cluster_missing() -> str | None:
    """Why the test cluster cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "the test cluster needs root (network namespaces, cgroups, mounts)"
    for tool in ("containerd", "runc", "ip", "nsenter", "openssl"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} is not installed; run 'scripts/kube-cluster install' (apt-get install containerd runc)"
    check = subprocess.run(
        [str(SCRIPT), "install", "--check"], capture_output=True, text=True, check=False
    )
    if check.returncode != 0:
        return (
            "the cluster's binaries are not built on this machine "
            f"({check.stderr.strip()}); run 'scripts/kube-cluster install' once"
        )
    return None


def eventually(check: Callable[[], T | None], what: str, patience_s: float = PATIENCE) -> T:
    """``check()``'s first answer that is not None (falsy answers count), asked every
    0.5 s; fails the test naming ``what`` after ``patience_s`` seconds stretched by the
    suite's slack (tests/patience.py)."""

    def boxed() -> tuple[T] | None:
        found = check()
        return None if found is None else (found,)

    return patience.eventually(boxed, what, patience_s, interval=0.5)[0]


def leftovers(folder: Path, mark: str) -> list[str]:
    """Everything of the cluster in ``folder`` still on the machine."""
    found: list[str] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"{folder}/" in cmdline:
            found.append(f"process {proc.name}: {cmdline[:120]}")
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    found += [f"link {line[:80]}" for line in links.stdout.splitlines() if mark in line]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    bridge = _bridge_of(links.stdout, mark)
    if bridge:
        found += [
            f"netns {line}" for line in netns.stdout.splitlines() if line.startswith(f"{bridge}-")
        ]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [
        f"mount {line.split()[4]}" for line in mounts.splitlines() if str(folder) in line.split()[4]
    ]
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        found += [f"cgroup {c}" for c in hierarchy.glob(f"{mark}-n*")]
    return found


def _bridge_of(links: str, mark: str) -> str | None:
    for line in links.splitlines():
        if f"alias {mark}" in line:
            return line.split(":")[1].strip()
    return None


@dataclass
class KubeCluster:
    """A running test cluster: its folder, the admin kubeconfig, the pod image."""

    folder: Path
    kubeconfig: Path
    image: str
    up_seconds: float | None  # None: reused (RECOVERYGATE_KUBE_CLUSTER)
    kubectl_path: str  # the kubectl built with the cluster (the API server's version)
    deleted: list[str] = field(default_factory=list)  # namespaces the tests deleted

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        timeout: float = PATIENCE,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the cluster (as its admin unless ``kubeconfig``)."""
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.kubeconfig)}
        proc = subprocess.run(
            [self.kubectl_path, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
        if check and proc.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def apply(self, namespace: str, *documents: dict[str, Any]) -> None:
        """``kubectl apply`` the documents in ``namespace``."""
        text = yaml.safe_dump_all(documents, sort_keys=False)
        self.kubectl("apply", "-n", namespace, "-f", "-", stdin=text)

    def get(self, namespace: str, kind: str, name: str = "", *selector: str) -> Any:
        """``kubectl get -o json``: one object, or a list's items."""
        args = ["get", "-n", namespace, kind, *([name] if name else []), *selector, "-o", "json"]
        data = json.loads(self.kubectl(*args).stdout)
        return data if name else data["items"]

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return list(self.get(namespace, "pods", "", "-l", selector))

    def core_api(self, kubeconfig: Path | None = None) -> Any:
        """A CoreV1Api of the real client (closed with the session)."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(
            config_file=str(kubeconfig or self.kubeconfig),
            client_configuration=configuration,
            persist_config=False,
        )
        return client.CoreV1Api(client.ApiClient(configuration))

    @contextlib.contextmanager
    def namespace(self, prefix: str) -> Iterator[str]:
        """A new namespace for one test's jobs; afterwards it is deleted with everything
        in it (its pods killed at once). The namespace controller finishes that in 5-10
        s; :meth:`wait_namespaces_gone` (at the end of the session) waits for it."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"[:63]
        self.kubectl("create", "namespace", name)
        try:
            yield name
        finally:
            self.delete_namespace(name)

    def wait_namespaces_gone(self) -> None:
        """Every namespace the tests made is gone (nothing of theirs is left running)."""

        def gone() -> bool | None:
            left = [
                n
                for n in self.deleted
                if self.kubectl("get", "namespace", n, check=False).returncode == 0
            ]
            return True if not left else None

        eventually(gone, f"deletion of namespaces {self.deleted}")

    def delete_namespace(self, name: str) -> None:
        # The jobs first, so that no controller makes a pod again; then the pods with
        # grace 0 (the namespace's own deletion would wait out their grace periods).
        for kind in ("trainjobs.trainer.kubeflow.org", "pytorchjobs.kubeflow.org"):
            self.kubectl("delete", "-n", name, kind, "--all", "--wait=false", check=False)
        self.kubectl("delete", "namespace", name, "--wait=false", check=False)
        self.kubectl(
            "delete", "-n", name, "pods", "--all", "--grace-period=0", "--force", check=False
        )
        for kind in ("clusterrolebindings", "clusterroles"):
            self.kubectl("delete", kind, "-l", f"recoverygate-test={name}", check=False)
        self.deleted.append(name)

    def token_kubeconfig(
        self, namespace: str, service_account: str, path: Path, duration: str = "2h"
    ) -> Path:
        """A kubeconfig that authenticates as ``service_account`` of ``namespace`` with a
        bound token (TokenRequest), as a drill run from a pod or CI job would."""
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()
        admin = yaml.safe_load(self.kubeconfig.read_text())
        cluster = admin["clusters"][0]["cluster"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": cluster}],
            "users": [{"name": service_account, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "test",
                    "context": {"cluster": "test", "user": service_account, "namespace": namespace},
                }
            ],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def pod_log(self, namespace: str, pod: str, *, previous: bool = False) -> str:
        args = ["logs", "-n", namespace, pod, *(["--previous"] if previous else [])]
        return self.kubectl(*args, check=False).stdout


def _up(folder: Path) -> tuple[float, str | None]:
    """``up --nodes 2 folder``: (seconds, None), or (seconds, why it failed)."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [str(SCRIPT), "up", "--nodes", "2", str(folder)],
            capture_output=True,
            text=True,
            timeout=patience.within(UP_TIMEOUT),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return time.monotonic() - started, f"it did not finish within {UP_TIMEOUT:.0f} s: {exc}"
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        return seconds, f"exit {proc.returncode}:\n{proc.stderr[-4000:]}"
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if last != f"export KUBECONFIG={folder}/kubeconfig":
        return seconds, f"its last line is not the export: {proc.stdout[-2000:]}"
    return seconds, None


def _down(folder: Path) -> None:
    subprocess.run(
        [str(SCRIPT), "down", str(folder)],
        capture_output=True,
        timeout=patience.within(patience.CLUSTER),
        check=False,
    )


@contextlib.contextmanager
def kube_up(reuse: str | None = None) -> Iterator[KubeCluster]:
    """A two-node cluster in a new folder, ``down`` afterwards with nothing left behind;
    with ``reuse``, the cluster already up in that folder, left up."""
    image, kubectl = (
        subprocess.run(
            [str(SCRIPT), "install", option], capture_output=True, text=True, check=True
        ).stdout.strip()
        for option in ("--print-image", "--print-kubectl")
    )
    if reuse:
        folder = Path(reuse)
        status = subprocess.run(
            [str(SCRIPT), "status", str(folder)], capture_output=True, text=True, check=False
        )
        if status.returncode != 0:
            pytest.fail(
                f"{REUSE_ENV}={reuse}: no usable cluster there (scripts/kube-cluster status "
                f"exited {status.returncode}: {status.stdout[-1000:]}{status.stderr[-1000:]})"
            )
        cluster = KubeCluster(folder, folder / "kubeconfig", image, None, kubectl)
        yield cluster
        cluster.wait_namespaces_gone()  # left up, as it was found
        return
    # Short: containerd's socket path under it must fit a unix socket's 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="rgk-"))
    try:
        # On two busy cores one up in a few fails a wait of its own (docs/kubernetes.md);
        # it cleaned up after itself, and a second one is tried.
        seconds, failed = _up(folder)
        if failed is not None:
            logs = Path(tempfile.mkdtemp(prefix="kube-cluster-logs-"))
            shutil.copytree(folder / "log", logs, dirs_exist_ok=True)
            _down(folder)
            first = failed
            seconds, failed = _up(folder)
            if failed is not None:
                pytest.fail(
                    f"scripts/kube-cluster up failed twice (logs in {logs}):\n{first}\n{failed}"
                )
        yield KubeCluster(folder, folder / "kubeconfig", image, seconds, kubectl)
    finally:
        _down(folder)
        mark_file = folder / ".kube-cluster"
        mark = mark_file.read_text().strip() if mark_file.exists() else "rgk-none"
        left = leftovers(folder, mark)
        shutil.rmtree(folder, ignore_errors=True)
        assert not left, f"scripts/kube-cluster down left: {left}"


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    """The session's two-node test cluster (see the module docstring)."""
    pytest.importorskip("kubernetes")
    reason = cluster_missing()
    if reason:
        pytest.skip(reason)
    with kube_up(os.environ.get(REUSE_ENV) or None) as cluster:
        yield cluster
