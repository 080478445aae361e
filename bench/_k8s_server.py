"""Child process of bench_scale: the fake Kubernetes API server with one big PyTorchJob.

``python _k8s_server.py NODES KUBECONFIG``: starts :class:`tests.kubernetes.fake_apiserver.
FakeApiServer` with a :class:`tests.kubernetes.fake_cluster.FakeTrainingJob` of NODES pods
(PyTorchJob: a master and NODES-1 workers; rank 0 writes RECOVERYGATE/v1 lines to its log,
a checkpoint every 10 steps of 20 ms), writes a kubeconfig for it, prints ``READY`` and
serves until its stdin closes. Running it in its own process keeps the server's CPU time
and memory out of the drill's figures.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "reporter")]

from tests.kubernetes.fake_apiserver import FakeApiServer  # noqa: E402
from tests.kubernetes.fake_cluster import NAMESPACE, FakeTrainingJob  # noqa: E402


def main() -> None:
    nodes = int(sys.argv[1])
    kubeconfig = Path(sys.argv[2])
    t0 = time.monotonic()
    with FakeApiServer(bookmark_interval=0.5) as server:
        server.write_kubeconfig(kubeconfig, namespace=NAMESPACE)
        job = FakeTrainingJob(server, nodes=nodes, step_time=0.02, checkpoint_every=10)
        job.start()
        setup = time.monotonic() - t0
        print(
            json.dumps(
                {
                    "ready": True,
                    "selector": job.selector,
                    "namespace": NAMESPACE,
                    "victim_uid": job.pod(1)["metadata"]["uid"],
                    "setup_s": setup,
                }
            ),
            flush=True,
        )
        sys.stdin.read()  # until the benchmark closes our stdin
        ru = resource.getrusage(resource.RUSAGE_SELF)
        deletes = len(server.deletes(acted_only=True))
        job.stop()
    print(json.dumps({"cpu_s": ru.ru_utime + ru.ru_stime, "deletes": deletes}), flush=True)


if __name__ == "__main__":
    main()
