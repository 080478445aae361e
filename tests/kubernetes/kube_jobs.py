"""Training jobs on the real test cluster, made from the shipped examples.

A :class:`KubeJob` is ``examples/kubernetes/pytorchjob-kube-cluster.yaml`` or
``trainjob-kube-cluster.yaml`` as a user applies it (its ``$RG_*`` variables filled with
this checkout, its venv, the interpreter the venv was made from and a checkpoint folder
of the test's), with what a test changes on top:

- its name, and the ``training-run`` label the drill selects on;
- checkpoints every ``ckpt_every`` steps, extra arguments of the training script;
- ground truth: every rank writes its own records (``RECOVERYGATE_GROUND_TRUTH``, see
  examples/local/train.py) into a host folder mounted at ``/truth``, so a drill's
  figures are held to what the job really did (tests/truth/truth.py reads them);
- the pods of a job prefer different nodes (a preferred pod anti-affinity), as one
  worker per GPU node would be.

``script="nanogpt"`` runs examples/local/nanogpt-style/train.py instead: the job for
``evidence.podLogs`` (it prints nanoGPT's lines and never calls the reporter).
"""

from __future__ import annotations

import os
import string
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.kubernetes.kube_cluster import KubeCluster, eventually
from tests.truth.truth import Process, load_processes

__all__ = ["EXAMPLES", "KubeJob", "drill_config"]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kubernetes"
NANOGPT = ROOT / "examples" / "local" / "nanogpt-style" / "train.py"
TRAIN = ROOT / "examples" / "local" / "train.py"
ANTI_AFFINITY_WEIGHT = 100


def host_folders(checkpoints: Path) -> dict[str, str]:
    """The examples' variables: this checkout, the venv (its real folder: the pods see
    the paths its scripts' ``#!`` lines name), the interpreter it was made from."""
    return {
        "RG_CHECKOUT": str(ROOT),
        "RG_VENV": os.path.realpath(sys.prefix),
        "RG_PYTHON_HOME": os.path.realpath(sys.base_prefix),
        "RG_CHECKPOINTS": str(checkpoints),
    }


def render(example: str, variables: dict[str, str]) -> dict[str, Any]:
    """The example's one document with its ``$RG_*`` variables filled (as ``envsubst``)."""
    text = string.Template((EXAMPLES / example).read_text()).safe_substitute(variables)
    [document] = [d for d in yaml.safe_load_all(text) if d]
    return dict(document)


@dataclass
class KubeJob:
    """One training job of a test, in the test's namespace on the real cluster."""

    cluster: KubeCluster
    namespace: str
    folder: Path  # host folder: checkpoints/ and truth/ of this job
    kind: str = "pytorchjob"  # pytorchjob | trainjob
    name: str = "llama"
    ckpt_every: int = 20
    step_time: float = 0.05
    script: str = "train"  # train (examples/local/train.py) | nanogpt
    #: hostPath: the example's (a folder every node shares, as a ReadWriteMany volume);
    #: emptyDir: node-local, the pod's own, deleted with it (the misconfiguration)
    checkpoint_volume: str = "hostPath"
    extra_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in ("pytorchjob", "trainjob"):
            raise ValueError(f"kind must be pytorchjob or trainjob, got {self.kind!r}")
        if self.checkpoint_volume not in ("hostPath", "emptyDir"):
            raise ValueError(
                f"checkpoint_volume: hostPath or emptyDir, got {self.checkpoint_volume!r}"
            )
        self.checkpoints = self.folder / "checkpoints"
        self.truth_dir = self.folder / "truth"
        for folder in (self.checkpoints, self.truth_dir):
            folder.mkdir(parents=True, exist_ok=True)

    @property
    def selector(self) -> str:
        return f"training-run={self.name}"

    @property
    def truth_base(self) -> Path:
        """Host path of the ground truth's base name (``<base>.<rank>.<pid>.jsonl``)."""
        return self.truth_dir / "gt"

    # ------------------------------------------------------------------ the manifest

    def _command(self, command: list[str]) -> list[str]:
        if self.script == "nanogpt":
            launcher = command[: next(i for i, c in enumerate(command) if c.endswith("/train.py"))]
            return [
                *launcher,
                str(NANOGPT),
                "--out_dir=/checkpoints/out",
                f"--eval_interval={self.ckpt_every}",
                f"--step_time={self.step_time}",
            ]
        changed = [
            f"--ckpt-every={self.ckpt_every}"
            if c.startswith("--ckpt-every=")
            else f"--step-time={self.step_time}"
            if c.startswith("--step-time=")
            else c
            for c in command
        ]
        return [*changed, *self.extra_args]

    def _pod_spec(self, spec: dict[str, Any], labels: dict[str, str], container: str) -> None:
        """The test's additions to a pod template: truth folder, spread over nodes."""
        if self.checkpoint_volume == "emptyDir":
            for volume in spec.get("volumes", []):
                if volume["name"] == "checkpoints":
                    volume.pop("hostPath")
                    volume["emptyDir"] = {}
        spec.setdefault("volumes", []).append(
            {"name": "truth", "hostPath": {"path": str(self.truth_dir), "type": "Directory"}}
        )
        labels["training-run"] = self.name
        spec["affinity"] = {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": ANTI_AFFINITY_WEIGHT,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {"training-run": self.name}},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        }
        for item in spec.get("containers", []):
            if item["name"] == container:
                item.setdefault("volumeMounts", []).append({"name": "truth", "mountPath": "/truth"})

    def _env(self, env: list[dict[str, str]]) -> list[dict[str, str]]:
        out = [e for e in env if not (self.script == "nanogpt" and e["name"] == "PYTHONPATH")]
        return [*out, {"name": "RECOVERYGATE_GROUND_TRUTH", "value": "/truth/gt"}]

    def manifest(self) -> dict[str, Any]:
        variables = host_folders(self.checkpoints)
        if self.kind == "pytorchjob":
            job = render("pytorchjob-kube-cluster.yaml", variables)
            job["metadata"]["name"] = self.name
            template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
            [container] = template["spec"]["containers"]
            container["command"] = self._command(container["command"])
            container["env"] = self._env(container.get("env", []))
            self._pod_spec(template["spec"], template["metadata"]["labels"], "pytorch")
            return job
        job = render("trainjob-kube-cluster.yaml", variables)
        job["metadata"]["name"] = self.name
        trainer = job["spec"]["trainer"]
        trainer["command"] = self._command(trainer["command"])
        trainer["env"] = self._env(trainer.get("env", []))
        [patch] = job["spec"]["runtimePatches"]
        [node] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod = node["template"]["spec"]["template"]
        self._pod_spec(pod["spec"], pod["metadata"]["labels"], "node")
        return job

    # ------------------------------------------------------------------ running it

    def start(self) -> KubeJob:
        """:meth:`submit`, then :meth:`wait_training`."""
        return self.submit().wait_training()

    def submit(self) -> KubeJob:
        """Apply the manifest (as ``kubectl apply`` of the filled example)."""
        self.cluster.apply(self.namespace, self.manifest())
        self.submitted = time.monotonic()
        return self

    def wait_training(self) -> KubeJob:
        """Wait until rank 0 trained and saved a checkpoint (its ground truth says so)."""

        def training() -> bool | None:
            done = [p for p in self.processes(rank=0) if p.steps and p.checkpoints]
            return True if done else None

        eventually(training, f"{self.kind} {self.name} training (rank 0's ground truth)")
        self.start_seconds = time.monotonic() - self.submitted
        return self

    def processes(self, rank: int | None = None) -> list[Process]:
        procs = load_processes(self.truth_base)
        return [p for p in procs if rank is None or p.rank == rank]

    def pods(self) -> list[dict[str, Any]]:
        return self.cluster.pods(self.namespace, self.selector)

    def pod_of_rank(self, rank: int) -> dict[str, Any]:
        """The live pod of ``rank`` (PyTorchJob worker index, TrainJob completion index)."""
        for pod in self.pods():
            meta = pod["metadata"]
            labels = meta.get("labels", {})
            index = labels.get(
                "training.kubeflow.org/replica-index",
                labels.get("batch.kubernetes.io/job-completion-index"),
            )
            if index == str(rank) and not meta.get("deletionTimestamp"):
                return pod
        raise AssertionError(
            f"no live pod of rank {rank} in {[p['metadata']['name'] for p in self.pods()]}"
        )

    def describe(self) -> str:
        """What the pods and the job's records show, for a failing assertion."""
        lines = []
        for pod in self.pods():
            statuses = pod.get("status", {}).get("containerStatuses") or [{}]
            lines.append(
                f"{pod['metadata']['name']} uid {pod['metadata']['uid'][:8]} on "
                f"{pod['spec'].get('nodeName')}: {pod.get('status', {}).get('phase')}, "
                f"restarts {statuses[0].get('restartCount')}"
            )
        for proc in self.processes():
            lines.append(
                f"rank {proc.rank} pid {proc.pid}: started {proc.started:.1f}, steps "
                f"{[s.step for s in proc.steps[:1]]}..{[s.step for s in proc.steps[-1:]]}, "
                f"checkpoints {[c.step for c in proc.checkpoints][-3:]}"
            )
        return "\n".join(lines)


def drill_config(
    job: KubeJob,
    kubeconfig: Path,
    *,
    name: str,
    fault: str = "KillWorker",
    failure: dict[str, Any] | None = None,
    expect: dict[str, Any] | None = None,
    evidence: dict[str, Any] | None = None,
    max_recovery: str = "150s",
    dry_run: bool = False,
) -> dict[str, Any]:
    """The drill of the real-cluster tests: rank 1 of ``job`` hit by ``fault`` after its
    next checkpoint, a resume from the latest checkpoint expected within ``max_recovery``
    (generous: on two cores shared with other work a container's restart with torch's
    import takes 10-60 s; the figures are checked against the ground truth instead)."""
    config: dict[str, Any] = {
        "name": name,
        "workload": {
            "orchestrator": "kubernetes",
            "selector": job.selector,
            "namespace": job.namespace,
            "kubeconfig": str(kubeconfig),
        },
        "injectFailure": {
            "type": fault,
            "afterCheckpoint": "next",
            "targetRank": 1,
            **(failure or {}),
        },
        "expectations": {
            "resumeFromCheckpoint": "latest",
            "maxRecoveryTime": max_recovery,
            "maxLostSteps": job.ckpt_every * 3,
            **(expect or {}),
        },
        "safety": {"requireConfirm": False, "dryRun": dry_run},
        "timeouts": {"discovery": "60s", "checkpoint": "120s", "recovery": "240s"},
    }
    if evidence:
        config["evidence"] = evidence
    return config
