"""The shipped RBAC under the real authorizer: each verb it grants is needed, and a missing
one is a clear error, never a traceback.

On the session's PyTorchJob (tests/kubernetes/conftest.py), run as ServiceAccounts with
bound tokens: the drills of test_kubernetes_drills.py show that exactly
examples/kubernetes/rbac.yaml (and, for the node faults, rbac-nodes.yaml) is enough.
Here each verb of those files is taken out in turn (one account per variant, the rest of
the file as shipped), and the drill that needs it is run through the CLI. We test these
aspects, for every one of the seven (verb, resource) pairs:

- the drill ends in ERROR (exit 3), its summary names the verb and the resource that the
  API server refused and the file that grants it, and no Python traceback is printed;
- nothing was touched: every pod of the job keeps its uid, and no node is cordoned.

pods list/watch/delete and pods/log get are needed by every drill (KillWorker);
nodes get/patch by ``cordon: true`` and pods/eviction create by DrainNode, checked before
anything is touched.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kubernetes.kube_drills import Drilled, grant, run

pytestmark = [pytest.mark.kubernetes, pytest.mark.e2e, pytest.mark.kube_cluster]

#: (verb, resource, the fault that needs it, what the error must name, the file granting it)
VARIANTS = [
    ("list", "pods", "KillWorker", "refused to list pods", "rbac.yaml"),
    ("watch", "pods", "KillWorker", "refused to watch pods", "rbac.yaml"),
    ("delete", "pods", "KillWorker", "refused to delete pods", "rbac.yaml"),
    ("get", "pods/log", "KillWorker", "refused to get pods/log", "rbac.yaml"),
    ("get", "nodes", "KillNode", "needs nodes get", "rbac-nodes.yaml"),
    ("patch", "nodes", "KillNode", "needs nodes patch", "rbac-nodes.yaml"),
    ("create", "pods/eviction", "DrainNode", "needs pods/eviction create", "rbac-nodes.yaml"),
]


def account(verb: str, resource: str) -> str:
    return f"rg-no-{verb}-{resource.replace('/', '-')}"


@pytest.fixture(scope="module")
def accounts(
    pytorchjob_drilled: Drilled, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], Path]:
    """One account per variant, each granted the shipped files less one verb."""
    drilled = pytorchjob_drilled
    folder = tmp_path_factory.mktemp("k8s-rbac")
    made = {}
    for verb, resource, _, _, source in VARIANTS:
        made[verb, resource] = grant(
            drilled.cluster,
            drilled.job.namespace,
            folder,
            account=account(verb, resource),
            nodes=source == "rbac-nodes.yaml",
            drop=(verb, resource),
        )
    return made


@pytest.mark.parametrize(
    ("verb", "resource", "fault", "message", "source"),
    VARIANTS,
    ids=[f"{v}-{r}" for v, r, *_ in VARIANTS],
)
def test_a_missing_verb_is_an_error_naming_it_and_nothing_is_touched(
    pytorchjob_drilled: Drilled,
    accounts: dict[tuple[str, str], Path],
    tmp_path: Path,
    verb: str,
    resource: str,
    fault: str,
    message: str,
    source: str,
) -> None:
    drilled, job = pytorchjob_drilled, pytorchjob_drilled.job
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in job.pods()}
    failure = {"cordon": True} if fault == "KillNode" else {}
    result = run(
        drilled,
        tmp_path,
        f"rbac-no-{verb}-{resource.replace('/', '-')}",
        accounts[verb, resource],
        fault=fault,
        failure=failure,
    )
    summary = result.report["summary"]
    assert result.report["verdict"] == "ERROR", result.output
    assert result.code == 3, result.output
    assert message in summary, summary
    assert f"examples/kubernetes/{source}" in summary, summary
    assert "Traceback" not in result.output, result.output
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in job.pods()} == before
    nodes = drilled.cluster.get("default", "nodes")
    assert not any(n["spec"].get("unschedulable") for n in nodes)
