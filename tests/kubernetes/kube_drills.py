"""Drilling the real cluster's jobs as a user would: ServiceAccounts with exactly the
shipped RBAC, the CLI, and the job's own records as the truth a verdict is held to.

- :func:`grant`: examples/kubernetes/rbac.yaml (and rbac-nodes.yaml) applied for one
  ServiceAccount of the test's namespace, as shipped (a verb may be taken out), and a
  kubeconfig holding a bound token of that account (TokenRequest);
- :class:`Drilled`: a running PyTorchJob and the kubeconfigs of its accounts (the session
  fixture ``pytorchjob_drilled`` of tests/kubernetes/conftest.py: one job serves the
  drills of test_kubernetes_drills.py and the permission checks of
  test_kubernetes_rbac.py);
- :func:`run`: one drill through ``recoverygate run`` (tests/cli_drill.py: the report, and
  the drill rejudged from its transcript), its wall time kept for the session's summary;
- :func:`assert_matches_truth`: each recovery's resume step and lost steps against the
  ground truth the job's ranks wrote (tests/truth/truth.py).
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cli_drill import CliRun, run_cli_drill
from tests.kubernetes.kube_cluster import KubeCluster
from tests.kubernetes.kube_jobs import EXAMPLES, KubeJob, drill_config
from tests.patience import DRILL, within
from tests.truth.truth import compute

__all__ = ["TIMES", "Drilled", "assert_matches_truth", "drilled_job", "grant", "killed_uids", "run"]

#: The wall time of each real-cluster drill of the session (printed at its end).
TIMES: dict[str, float] = {}
DEFAULT_ACCOUNT = "recoverygate"  # the ServiceAccount rbac.yaml names


def rbac_documents(
    namespace: str, account: str, *, nodes: bool, drop: tuple[str, str] | None = None
) -> list[dict[str, Any]]:
    """rbac.yaml (+ rbac-nodes.yaml) for ``account`` of ``namespace``: as shipped, but
    for the names (another account's Role gets its name as a suffix; the cluster-scoped
    ClusterRole and its binding carry the namespace and a label the namespace's cleanup
    deletes them by) and ``drop``, a (verb, resource) taken out of the rules."""
    documents = [d for d in yaml.safe_load_all((EXAMPLES / "rbac.yaml").read_text()) if d]
    if nodes:
        documents += [
            d for d in yaml.safe_load_all((EXAMPLES / "rbac-nodes.yaml").read_text()) if d
        ]
    suffix = "" if account == DEFAULT_ACCOUNT else f"-{account}"
    out = []
    for document in copy.deepcopy(documents):
        kind, meta = document["kind"], document["metadata"]
        if kind == "ServiceAccount":
            meta["name"] = account
        elif kind.startswith("Cluster"):
            meta["name"] = f"{meta['name']}-{namespace}{suffix}"
            meta.setdefault("labels", {})["recoverygate-test"] = namespace
        else:
            meta["name"] += suffix
        if "roleRef" in document:
            cluster_scoped = document["roleRef"]["kind"] == "ClusterRole"
            extra = f"-{namespace}{suffix}" if cluster_scoped else suffix
            document["roleRef"]["name"] += extra
        for subject in document.get("subjects", []):
            subject["name"], subject["namespace"] = account, namespace
        for rule in document.get("rules", []):
            if drop is not None and drop[1] in rule["resources"]:
                rule["verbs"] = [v for v in rule["verbs"] if v != drop[0]]
        if "rules" in document:  # a rule without verbs is invalid: it goes
            document["rules"] = [rule for rule in document["rules"] if rule["verbs"]]
        out.append(document)
    return out


def grant(
    cluster: KubeCluster,
    namespace: str,
    folder: Path,
    *,
    account: str = DEFAULT_ACCOUNT,
    nodes: bool = False,
    drop: tuple[str, str] | None = None,
) -> Path:
    """Apply the shipped RBAC for ``account`` (see :func:`rbac_documents`); its kubeconfig."""
    cluster.apply(namespace, *rbac_documents(namespace, account, nodes=nodes, drop=drop))
    return cluster.token_kubeconfig(namespace, account, folder / f"kubeconfig-{account}")


@dataclass
class Drilled:
    """A running PyTorchJob and the kubeconfigs of its ServiceAccounts."""

    cluster: KubeCluster
    job: KubeJob
    pods_only: Path  # exactly rbac.yaml
    with_nodes: Path  # rbac.yaml + rbac-nodes.yaml (another account)
    folder: Path


@contextlib.contextmanager
def drilled_job(cluster: KubeCluster, folder: Path) -> Iterator[Drilled]:
    """examples/kubernetes/pytorchjob-kube-cluster.yaml saving on SIGTERM, in a namespace
    of its own with its two accounts; deleted with the namespace afterwards."""
    with cluster.namespace("drills") as namespace:
        pods_only = grant(cluster, namespace, folder)
        with_nodes = grant(cluster, namespace, folder, account="recoverygate-nodes", nodes=True)
        job = KubeJob(cluster, namespace, folder / "job", extra_args=["--save-on-sigterm"])
        job.start()
        TIMES["PyTorchJob start"] = job.start_seconds
        yield Drilled(cluster, job, pods_only, with_nodes, folder)


def run(
    drilled: Drilled | KubeJob, tmp_path: Path, name: str, kubeconfig: Path, **options: Any
) -> CliRun:
    """One drill of the job through the CLI (see :func:`~tests.kubernetes.kube_jobs.drill_config`)."""
    job = drilled.job if isinstance(drilled, Drilled) else drilled
    config = drill_config(job, kubeconfig, name=name, **options)
    result = run_cli_drill(config, tmp_path / f"{name}.yaml", timeout=within(DRILL))
    TIMES[name] = result.wall
    return result


def assert_matches_truth(job: KubeJob, run: CliRun) -> None:
    """Each recovery's resume step and lost steps are what the job's records show, and
    the incarnation judged started after its kill."""
    for recovery in run.report["recoveries"]:
        truth = compute(job.truth_base, float(recovery["killTime"]))
        assert recovery["resumeStep"] == truth.resume_step, (recovery, truth.describe())
        assert truth.lost_steps is not None, truth.describe()
        lo, hi = recovery["lostSteps"], recovery["lostStepsUpperBound"]
        assert lo <= truth.lost_steps <= (hi if hi is not None else lo), (
            recovery,
            truth.describe(),
        )
        assert truth.judged is not None and truth.judged.started > float(recovery["killTime"])


def killed_uids(report: dict[str, Any]) -> list[str]:
    """The pod uids the drill's kills named, in order (its timeline's ``kill`` entries)."""
    return [
        match.group(1)
        for entry in report["timeline"]
        if entry.get("kind") == "kill"
        for match in re.finditer(r"\(uid ([0-9a-f-]+)\)", entry.get("detail", ""))
    ]
