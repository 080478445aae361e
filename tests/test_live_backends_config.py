"""``recovery: live`` on Kubernetes and SLURM: the replica-group keys, validated before
anything starts (no cluster needed).

We test these aspects: ``workload.replicas`` (one selector / one job step per replica
group) validates and reaches the orchestrator; ``targetReplica`` that matches no
replica's id, ``targetReplica`` without ``replicas``, a replica id or selector / step
given twice, and ``selector`` together with ``replicas`` are refused with
file:line:key and the value (the CLI exits 2, no traceback); a backend without replica
targeting (ray) refuses ``targetReplica`` naming the backends that have it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.errors import ConfigError
from pytest_recoverygate.orchestrators.kubernetes import KubernetesWorkload
from pytest_recoverygate.orchestrators.slurm import SlurmWorkload
from tests.patience import JOB, within

EXPECT = """\
expectations:
  recovery: live
  maxSurvivorStall: 10s
  rejoinFrom: peer
"""

K8S = """\
workload:
  orchestrator: kubernetes
  namespace: training
  replicas:
    - replica: 0
      selector: "training.kubeflow.org/job-name=ft-0"
    - replica: 1
      selector: "training.kubeflow.org/job-name=ft-1"
injectFailure:
  type: KillWorker
  afterStep: 50
  targetReplica: TARGET
  targetRank: 0
"""

SLURM = """\
workload:
  orchestrator: slurm
  jobName: ft
  replicas:
    - replica: 0
      step: replica-0
    - replica: 1
      step: replica-1
injectFailure:
  type: KillWorker
  afterStep: 50
  targetReplica: TARGET
  targetRank: 0
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "drill.yaml"
    path.write_text(textwrap.dedent(text) + EXPECT)
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


def test_replica_groups_validate_on_kubernetes_and_slurm(tmp_path: Path) -> None:
    k8s = load_config(write(tmp_path, K8S.replace("TARGET", "1"))).workload
    assert isinstance(k8s, KubernetesWorkload)
    assert k8s.replica_ids() == [0, 1]
    slurm = load_config(write(tmp_path, SLURM.replace("TARGET", "1"))).workload
    assert isinstance(slurm, SlurmWorkload)
    assert slurm.step_of(1) == "replica-1"


@pytest.mark.parametrize(
    ("text", "line", "key", "got"),
    [
        (K8S.replace("TARGET", "2"), 12, "injectFailure.targetReplica", "2"),
        (SLURM.replace("TARGET", "7"), 12, "injectFailure.targetReplica", "7"),
        (
            K8S.replace("TARGET", "1").replace("replica: 1", "replica: 0"),
            4,  # the list's line: a refusal inside a list item names the list's line
            "workload.replicas.1.replica",
            "0",
        ),
        (
            SLURM.replace("TARGET", "1").replace("step: replica-1", "step: replica-0"),
            4,
            "workload.replicas.1.step",
            "replica-0",
        ),
        (
            K8S.replace("TARGET", "1").replace("  namespace: training", '  selector: "a=b"'),
            3,
            "workload.selector",
            "a=b",
        ),
    ],
    ids=[
        "k8s_unknown_replica",
        "slurm_unknown_replica",
        "k8s_replica_twice",
        "slurm_step_twice",
        "k8s_selector_and_replicas",
    ],
)
def test_bad_replica_keys_are_refused_with_file_line_key_value(
    tmp_path: Path, text: str, line: int, key: str, got: str
) -> None:
    path = write(tmp_path, text)
    message = error_of(path)
    found = [m for m in message.splitlines() if m.startswith(f"{path}:{line}: {key}: ")]
    assert found, message
    assert f"— got {got}" in found[0], message


def test_target_replica_without_replicas_is_refused_naming_the_key_to_add(
    tmp_path: Path,
) -> None:
    text = """\
    workload:
      orchestrator: kubernetes
      selector: "training-run=ft"
    injectFailure:
      type: KillWorker
      afterStep: 50
      targetReplica: 1
    """
    path = write(tmp_path, text)
    message = error_of(path)
    assert f"{path}:7: injectFailure.targetReplica: needs workload.replicas" in message, message


def test_a_backend_without_replica_targeting_refuses_target_replica_at_exit_2(
    tmp_path: Path,
) -> None:
    text = """\
    workload:
      orchestrator: ray
      entrypoint: [python, train_ray.py]
      workdir: .
    injectFailure:
      type: KillWorker
      afterStep: 50
      targetReplica: 1
    """
    path = write(tmp_path, text)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", "validate", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    line = next(
        (
            m
            for m in proc.stderr.splitlines()
            if m.startswith(f"{path}:8: injectFailure.targetReplica")
        ),
        "",
    )
    assert "kubernetes" in line and "slurm" in line and "local" in line, proc.stderr
