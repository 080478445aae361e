"""scripts/kube-cluster: a real Kubernetes cluster brought up and down in a temporary folder.

We test these aspects:

- ``up --nodes 2`` starts the real control plane (etcd, kube-apiserver, controller-manager,
  scheduler, CoreDNS, the Kubeflow training operator, JobSet, Kubeflow Trainer) and two real
  kubelets (containerd + runc + CNI, each in its own network namespace), and prints
  ``export KUBECONFIG=...`` last; PyTorchJobs, JobSets and TrainJobs are served;
- both nodes are Ready and a pod the scheduler places runs, resolves a Service through the
  cluster DNS, and its log reaches the API server (pods/log, proxied to the kubelet);
- ``down`` leaves nothing: no process, network namespace, veth, bridge, mount or cgroup of
  the cluster;
- ``up`` refuses a folder that another user could write, and ``down`` a folder that ``up``
  did not mark, before either touches anything.

The binaries are built once per machine (``scripts/kube-cluster install``, about half an
hour on 2 cores); where they are not built, the tests skip and say so.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubernetes.kube_cluster import cluster_missing, leftovers
from tests.patience import CLUSTER, DRILL, JOB, eventually, slack, within

pytest.importorskip("kubernetes")

pytestmark = [pytest.mark.e2e, pytest.mark.kubernetes, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kube-cluster"
NAMESPACE = "default"


def _script_env() -> dict[str, str]:
    """The environment for scripts/kube-cluster: its own waits (RG_KUBE_PATIENCE, a whole
    number) stretched by the suite's slack, unless the caller set them."""
    env = dict(os.environ)
    env.setdefault("RG_KUBE_PATIENCE", str(min(99, math.ceil(slack()))))
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """A two-node cluster in a new folder: (folder, kubeconfig, mark); down after the module."""
    reason = cluster_missing()
    if reason:
        pytest.skip(reason)
    # Short: containerd's socket path under it must fit a unix socket's 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="rgk-"))
    try:
        # A warm up takes about 20 s; a whole drill's budget bounds a build-less failure.
        up = subprocess.run(
            [str(SCRIPT), "up", "--nodes", "2", str(folder)],
            capture_output=True,
            text=True,
            timeout=within(DRILL),
            env=_script_env(),
            check=False,
        )
        if up.returncode != 0:
            # up removed the cluster; its logs stay for a look, outside the folder.
            logs = tmp_path_factory.mktemp("kube-cluster-logs")
            shutil.copytree(folder / "log", logs, dirs_exist_ok=True)
            pytest.fail(f"up failed ({up.returncode}), logs in {logs}:\n{up.stderr[-4000:]}")
        last = up.stdout.strip().splitlines()[-1]
        assert last == f"export KUBECONFIG={folder}/kubeconfig", up.stdout
        mark = (folder / ".kube-cluster").read_text().strip()
        yield folder, str(folder / "kubeconfig"), mark
    finally:
        subprocess.run(
            [str(SCRIPT), "down", str(folder)],
            capture_output=True,
            timeout=within(CLUSTER),
            env=_script_env(),
            check=False,
        )
        mark_file = folder / ".kube-cluster"
        mark = mark_file.read_text().strip() if mark_file.exists() else "rgk-none"
        left = leftovers(folder, mark)
        shutil.rmtree(folder, ignore_errors=True)
        assert not left, f"down left: {left}"


@pytest.fixture
def core_api(cluster: tuple[Path, str, str]) -> Iterator[Any]:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(
        config_file=cluster[1], client_configuration=configuration, persist_config=False
    )
    api_client = client.ApiClient(configuration)
    yield client.CoreV1Api(api_client)
    api_client.close()


def test_both_nodes_are_ready(core_api: Any) -> None:
    nodes = core_api.list_node().items
    ready = {
        n.metadata.name
        for n in nodes
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    }
    assert ready == {"node1", "node2"}, [n.status.conditions for n in nodes]


def test_the_training_kinds_are_served(cluster: tuple[Path, str, str]) -> None:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(
        config_file=cluster[1], client_configuration=configuration, persist_config=False
    )
    with client.ApiClient(configuration) as api_client:
        custom: Any = client.CustomObjectsApi(api_client)
        for group, version, plural in (
            ("kubeflow.org", "v1", "pytorchjobs"),
            ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
            ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
        ):
            listed = custom.list_namespaced_custom_object(group, version, NAMESPACE, plural)
            assert listed["items"] == [], (plural, listed)
        runtimes = custom.list_cluster_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes"
        )
        assert "torch-distributed" in {r["metadata"]["name"] for r in runtimes["items"]}


def test_a_pod_runs_resolves_the_cluster_dns_and_logs(core_api: Any) -> None:
    from kubernetes import client

    image = subprocess.run(
        [str(SCRIPT), "install", "--print-image"], capture_output=True, text=True, check=True
    ).stdout.strip()
    script = (
        "import socket, time\n"
        "print('resolved', socket.gethostbyname('kubernetes.default.svc.cluster.local'), flush=True)\n"
        "print('hello from', socket.gethostname(), flush=True)\n"
        "time.sleep(3600)\n"
    )
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="smoke"),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(name="main", image=image, command=["python3", "-c", script])
            ],
            termination_grace_period_seconds=1,
        ),
    )
    core_api.create_namespaced_pod(NAMESPACE, pod)
    try:

        def running() -> Any:
            p = core_api.read_namespaced_pod("smoke", NAMESPACE)
            return p if p.status.phase == "Running" else None

        placed = eventually(running, "Running smoke pod", JOB)
        assert placed.spec.node_name in {"node1", "node2"}
        assert placed.status.pod_ip.startswith("10.")

        def logged() -> str | None:
            text: str = core_api.read_namespaced_pod_log("smoke", NAMESPACE, container="main")
            return text if "hello from smoke" in text else None

        log = eventually(logged, "'hello from smoke' in the pod's log", JOB)
        assert "resolved 10.96.0.1" in log, log
    finally:
        core_api.delete_namespaced_pod("smoke", NAMESPACE, grace_period_seconds=0)


@pytest.fixture
def short_folder() -> Iterator[Path]:
    """A new folder whose path is short enough for the script (a test's tmp_path under
    pytest-xdist is not: the script refuses it before anything else)."""
    folder = Path(tempfile.mkdtemp(prefix="rgk-t"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_up_refuses_a_folder_others_can_write(short_folder: Path) -> None:
    folder = short_folder / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    up = subprocess.run(
        [str(SCRIPT), "up", str(folder)], capture_output=True, text=True, check=False
    )
    assert up.returncode != 0
    assert "writable by others" in up.stderr, up.stderr
    assert not (folder / ".kube-cluster").exists()


def test_down_refuses_a_folder_up_did_not_mark(short_folder: Path) -> None:
    folder = short_folder / "not-a-cluster"
    folder.mkdir(mode=0o700)
    (folder / "cluster.env").write_text("NODES=1\nNET_INDEX=0\n")
    down = subprocess.run(
        [str(SCRIPT), "down", str(folder)], capture_output=True, text=True, check=False
    )
    assert down.returncode != 0
    assert "was not made by" in down.stderr, down.stderr
    assert (folder / "cluster.env").exists()
