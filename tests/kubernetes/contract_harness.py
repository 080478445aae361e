"""The Orchestrator contract suite's harness for the Kubernetes backend
(tests/contract/harness.py): the real client against the session's real cluster
(scripts/kube-cluster, tests/kubernetes/kube_cluster.py), a PyTorchJob of three workers
(the cluster image's python3 printing reporter lines: no torch) spread over its two
nodes, each job in a namespace of its own; pods are checked with the admin's own API
reads by uid."""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_recoverygate.engine.model import Worker
from pytest_recoverygate.registry.seams import Orchestrator, RealClock
from tests.contract.harness import Harness, ThreadSpy
from tests.patience import CLUSTER, JOB, deadline, eventually

if TYPE_CHECKING:
    from tests.kubernetes.kube_cluster import KubeCluster

__all__ = ["KUBE_CONTRACT_SCRIPT", "build_kubernetes", "kube_contract_job"]


#: The contract's Kubernetes job: a PyTorchJob of three workers on the real cluster whose
#: containers are the cluster image's own python3 (no torch: seconds to start), printing
#: RECOVERYGATE/v1 lines with the checkout's reporter (rank 0 reports) and sleeping.
KUBE_CONTRACT_SCRIPT = (
    "import time\n"
    "from recoverygate import reporter\n"
    "step = 0\n"
    "while True:\n"
    "    step += 1\n"
    "    reporter.progress(step)\n"
    "    if step % 10 == 0:\n"
    "        reporter.checkpoint_completed(step)\n"
    "    time.sleep(0.1)\n"
)


def kube_contract_job(name: str, image: str, workers: int = 3) -> dict[str, Any]:
    checkout = str(Path(__file__).resolve().parents[2])
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": workers,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "metadata": {"labels": {"training-run": name}},
                        "spec": {
                            "terminationGracePeriodSeconds": 2,
                            # spread over the two nodes (2 + 1): the node seam's checks run
                            "affinity": {
                                "podAntiAffinity": {
                                    "preferredDuringSchedulingIgnoredDuringExecution": [
                                        {
                                            "weight": 100,
                                            "podAffinityTerm": {
                                                "labelSelector": {
                                                    "matchLabels": {"training-run": name}
                                                },
                                                "topologyKey": "kubernetes.io/hostname",
                                            },
                                        }
                                    ]
                                }
                            },
                            "containers": [
                                {
                                    "name": "pytorch",
                                    "image": image,
                                    "imagePullPolicy": "Never",
                                    "command": ["python3", "-u", "-c", KUBE_CONTRACT_SCRIPT],
                                    "env": [
                                        {"name": "PYTHONPATH", "value": f"{checkout}/reporter"}
                                    ],
                                    "volumeMounts": [
                                        {
                                            "name": "checkout",
                                            "mountPath": checkout,
                                            "readOnly": True,
                                        }
                                    ],
                                }
                            ],
                            "volumes": [
                                {
                                    "name": "checkout",
                                    "hostPath": {"path": checkout, "type": "Directory"},
                                }
                            ],
                        },
                    },
                }
            }
        },
    }


def build_kubernetes(
    purpose: str, label: str, tmp: Path, spy: ThreadSpy, cluster: KubeCluster
) -> Harness:
    """A PyTorchJob on the session's real cluster (tests/kubernetes/kube_cluster.py), in a
    namespace of its own; the world is looked at with the admin's own API reads."""
    from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator

    clock = RealClock()
    stack = contextlib.ExitStack()
    name = "contract"
    try:
        with spy.labelled(f"{label}-world"):
            namespace = stack.enter_context(cluster.namespace(f"contract-{purpose}"))
            cluster.apply(namespace, kube_contract_job(name, cluster.image))
            api = cluster.core_api()
            stack.callback(api.api_client.close)
            selector = f"training-run={name}"

            def running() -> bool | None:
                pods = api.list_namespaced_pod(namespace, label_selector=selector).items
                ok = len(pods) == 3 and all(p.status.phase == "Running" for p in pods)
                return True if ok else None

            eventually(
                running, f"kubernetes: the contract job's pods running in {namespace}", CLUSTER
            )
        with spy.labelled(label):
            orchestrator = KubernetesOrchestrator(
                selector=selector,
                namespace=namespace,
                kubeconfig=cluster.kubeconfig,
                clock=clock,
            )
            stack.callback(orchestrator.cleanup)
            conforming: Orchestrator = orchestrator  # the static check (mypy)
            workload = conforming.discover(deadline(JOB))
    except BaseException:
        stack.close()
        raise

    def pod_of(rank: int) -> Any:
        pods = api.list_namespaced_pod(
            namespace,
            label_selector=f"{selector},training.kubeflow.org/replica-index={rank}",
        ).items
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        return live[0] if live else None

    def alive(worker: Worker) -> bool:
        pods = api.list_namespaced_pod(namespace, label_selector=selector).items
        return any(
            p.metadata.uid == worker.instance_id
            and p.metadata.deletion_timestamp is None
            and p.status.phase in ("Pending", "Running")
            for p in pods
        )

    def current(rank: int) -> Worker | None:
        pod = pod_of(rank)
        if pod is None or pod.status.phase != "Running":
            return None
        return Worker(rank, pod.metadata.name, pod.metadata.uid)

    return Harness(
        kind="kubernetes",
        label=label,
        orchestrator=orchestrator,
        clock=clock,
        workload=workload,
        alive=alive,
        current=current,
        stale_id=lambda w: str(uuid.uuid4()),
        pause=time.sleep,
        patience=JOB,
        exit_stack=stack,
    )
