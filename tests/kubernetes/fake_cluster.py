"""Test helpers that play the kubelet, the Kubeflow operator and the training processes
on the fake API server, for the tests that need faults on cue (the drills themselves run
on the real cluster: tests/kubernetes/kube_cluster.py, kube_jobs.py).

:class:`FakeTrainingJob` puts one job's pods into a :class:`FakeApiServer` and reacts to
deletes the way the real controllers do:

- PyTorchJob (Training Operator v1): the deleted pod is recreated under the *same name*
  with a new uid, Pending, then Running after ``start_delay``.
- TrainJob (Trainer v2, via JobSet and a batch Job): a new pod with a *new name* is
  created at once, while the Job's ``batch.kubernetes.io/job-tracking`` finalizer keeps the
  old pod Terminating for ``finalizer_delay``.

Meanwhile the reporting rank writes RECOVERYGATE/v1 lines (formatted by the real
``recoverygate.wire``) to its container log: start, progress every step, a checkpoint
every ``checkpoint_every`` steps. When a worker dies the group stops, and when the
replacement runs a new incarnation starts, ``rendezvous_time`` later (none when a member
is lost meanwhile: the group re-forms again), from the last checkpoint
(``resume="latest"``) or from step 0 (``resume="zero"``, the bug RecoveryGate exists to
catch).

A graceful delete (``gracePeriodSeconds`` > 0, a Preempt) of a PyTorchJob pod is the
kubelet's SIGTERM: with ``on_sigterm="save"`` the group stops, the reporting rank saves a
checkpoint of the step it reached (``checkpoint_started`` / ``checkpoint_completed``,
``save_time`` apart) and the containers exit 143, so the pod goes before its grace period
ends; with ``on_sigterm="ignore"`` training goes on until the kubelet's SIGKILL.

Cluster nodes (``hosts``: node names the server gets with ``add_node``): each pod is bound
to one (``spec.nodeName``, rank r on ``hosts[r % len(hosts)]``) and the scheduler places a
replacement on its pod's old node unless that node is cordoned, else on the schedulable
node with the fewest of the job's pods. Checkpoints are shared by every node (where a
checkpoint lives and what a lost pod takes with it is the real cluster's drill:
test_kubernetes_jobs.py's TrainJob with emptyDir checkpoints).
"""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path
from typing import Any

from recoverygate import wire

from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.patience import PROMPT, eventually, within

Pod = dict[str, Any]

NAMESPACE = "training"


def drill_yaml(
    selector: str,
    namespace: str,
    kubeconfig: Path | str,
    *,
    name: str,
    after: int = 20,
    max_recovery: str = "10s",
    max_lost_steps: int = 50,
    deadline: str = "20s",
    recovery: str | None = None,
    fault: str = "KillWorker",
    failure: dict[str, str] | None = None,
) -> str:
    """The one drill config every Kubernetes drill on the fake API server (and bench)
    runs: rank 1 hit by ``fault`` after checkpoint ``after``, a resume from the latest
    checkpoint expected; ``failure`` adds keys to injectFailure."""
    more_failure = "".join(f"\n  {key}: {value}" for key, value in (failure or {}).items())
    return f"""
name: {name}
workload:
  orchestrator: kubernetes
  selector: "{selector}"
  namespace: {namespace}
  kubeconfig: {kubeconfig}
injectFailure:
  type: {fault}
  afterCheckpoint: step-{after}
  targetRank: 1{more_failure}
expectations:
  resumeFromCheckpoint: latest
  maxRecoveryTime: {max_recovery}
  maxLostSteps: {max_lost_steps}
  sustain: 3 steps
safety:
  requireConfirm: false
timeouts:
  discovery: {deadline}
  checkpoint: {deadline}
  recovery: {recovery or max_recovery}
"""


def job_drill_yaml(job: FakeTrainingJob, kubeconfig: Path | str, **options: Any) -> str:
    """:func:`drill_yaml` for the pods of ``job``."""
    return drill_yaml(job.selector, job.namespace, kubeconfig, **options)


def _container(name: str) -> dict[str, Any]:
    return {"name": name, "image": "ghcr.io/example/train:1"}


def pytorchjob_pod(job: str, replica_type: str, index: int, *, namespace: str = NAMESPACE) -> Pod:
    """A pod as the Training Operator creates it for a PyTorchJob replica."""
    return {
        "metadata": {
            "name": f"{job}-{replica_type}-{index}",
            "namespace": namespace,
            "labels": {
                "training.kubeflow.org/job-name": job,
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-type": replica_type,
                "training.kubeflow.org/replica-index": str(index),
                **(
                    {"training.kubeflow.org/job-role": "master"} if replica_type == "master" else {}
                ),
                "training-run": job,
            },
        },
        "spec": {"containers": [_container("pytorch")], "restartPolicy": "OnFailure"},
    }


def trainjob_pod(
    job: str,
    index: int,
    *,
    namespace: str = NAMESPACE,
    replicated_job: str = "node",
    as_label: bool = True,
) -> Pod:
    """A pod as JobSet's batch Job creates it for a Trainer v2 TrainJob node."""
    labels = {
        "jobset.sigs.k8s.io/jobset-name": job,
        "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
        "jobset.sigs.k8s.io/job-index": "0",
        "batch.kubernetes.io/job-name": f"{job}-{replicated_job}-0",
        "training-run": job,
    }
    annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
    if as_label:
        labels["batch.kubernetes.io/job-completion-index"] = str(index)
    return {
        "metadata": {
            "generateName": f"{job}-{replicated_job}-0-{index}-",
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
            "finalizers": ["batch.kubernetes.io/job-tracking"],
        },
        "spec": {"containers": [_container(replicated_job)], "restartPolicy": "Never"},
    }


class FakeTrainingJob:
    """One training job on the fake cluster: its pods, its controller and its training loop."""

    #: the rank whose container log carries the training lines
    reporting_rank = 0
    #: checkpoint_started -> checkpoint_completed of the save on SIGTERM (``on_sigterm="save"``)
    save_time = 0.1

    def __init__(
        self,
        server: FakeApiServer,
        *,
        kind: str = "pytorchjob",
        name: str = "llama",
        namespace: str = NAMESPACE,
        nodes: int = 3,
        step_time: float = 0.01,
        checkpoint_every: int = 10,
        resume: str = "latest",
        replacement: str = "running",  # running | pending | crashloop
        recreate_delay: float = 0.1,
        start_delay: float = 0.3,
        finalizer_delay: float = 0.5,
        restart_reporter_container: bool = False,
        status_lag: float = 0.0,  # seconds the reporting pod's status trails its restart
        rendezvous_time: float = 0.05,  # group whole -> the new incarnation's first line
        on_sigterm: str = "ignore",  # ignore | save
        hosts: list[str] | None = None,
        lines: str = "wire",  # wire (the reporter's lines) | nanogpt (nanoGPT's, no reporter)
    ) -> None:
        self.server = server
        self.lines = lines
        self.kind = kind
        self.name = name
        self.namespace = namespace
        self.nodes = nodes
        self.step_time = step_time
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.replacement = replacement
        self.recreate_delay = recreate_delay
        self.start_delay = start_delay
        self.finalizer_delay = finalizer_delay
        self.restart_reporter_container = restart_reporter_container
        self.status_lag = status_lag
        self.rendezvous_time = rendezvous_time
        self.on_sigterm = on_sigterm
        self.hosts = list(hosts or [])
        self.node_of_rank: dict[int, str] = {}
        self.sigterms: list[tuple[float, str]] = []  # (time, pod name) of graceful deletes
        self._save_requested = False
        self._sigtermed: set[str] = set()
        self.pod_of_rank: dict[int, str] = {}
        self.uids: dict[str, int] = {}  # uid -> rank, for every pod this job created
        self.incarnations: list[str] = []
        self.resumed: dict[str, int] = {}  # incarnation -> the step it resumed from
        self.written: list[tuple[float, str]] = []  # (kubelet time, line) the log really got
        self.last_checkpoint = 0
        self.step = 0
        self.replaced: list[tuple[int, str]] = []  # (rank, new pod name)
        self._lock = threading.RLock()  # _on_change schedules (_later) while holding it
        self._stop = threading.Event()
        self._running = threading.Event()  # the group is whole and training
        self._losses = 0  # members the group lost so far; the loop restarts on a change
        self._thread: threading.Thread | None = None
        self._timers: list[threading.Timer] = []
        self._handled: set[str] = set()

    @property
    def selector(self) -> str:
        return f"training-run={self.name}"

    # ------------------------------------------------------------------ lifecycle

    def start(self, *, wait_for_checkpoint: int | None = None) -> FakeTrainingJob:
        for rank in range(self.nodes):
            pod = self._create(rank)
            self.server.start_container(self.namespace, pod["metadata"]["name"])
        self.server.subscribe(self._on_change)
        self._running.set()
        self._thread = threading.Thread(target=self._train, name=f"train-{self.name}", daemon=True)
        self._thread.start()
        if wait_for_checkpoint is not None:
            eventually(
                lambda: self.last_checkpoint >= wait_for_checkpoint,
                f"the job's checkpoint {wait_for_checkpoint}",
                PROMPT,
            )
        return self

    def stop(self) -> None:
        self._stop.set()
        self._running.set()
        with self._lock:
            timers = list(self._timers)
        for timer in timers:
            timer.cancel()
        if self._thread is not None:
            self._thread.join(timeout=within(PROMPT))

    def pod_name(self, rank: int) -> str:
        with self._lock:
            return self.pod_of_rank[rank]

    def pod(self, rank: int) -> Pod:
        pod = self.server.get_pod(self.namespace, self.pod_name(rank))
        assert pod is not None
        return pod

    # ------------------------------------------------------------------ the controller

    def _template(self, rank: int) -> Pod:
        if self.kind == "pytorchjob":
            return pytorchjob_pod(
                self.name,
                "master" if rank == 0 else "worker",
                max(rank - 1, 0) if rank else 0,
                namespace=self.namespace,
            )
        return trainjob_pod(self.name, rank, namespace=self.namespace)

    def _place(self, rank: int) -> str | None:
        """The node the scheduler binds rank's pod to (None: the cluster has no nodes)."""
        if not self.hosts:
            return None
        with self._lock:
            old = self.node_of_rank.get(rank, self.hosts[rank % len(self.hosts)])
            load = {h: list(self.node_of_rank.values()).count(h) for h in self.hosts}
        if not self.server.unschedulable(old):
            return old
        free = [h for h in self.hosts if not self.server.unschedulable(h)]
        if not free:
            return old  # nowhere else: it stays Pending on a real cluster; here, same node
        return min(free, key=lambda h: (load[h], h))

    def _save(self, step: int) -> None:
        self.last_checkpoint = step

    def _resume_step(self) -> int:
        return self.last_checkpoint if self.resume == "latest" else 0

    def _create(self, rank: int) -> Pod:
        template = self._template(rank)
        host = self._place(rank)
        if host is not None:
            template["spec"]["nodeName"] = host
            with self._lock:
                self.node_of_rank[rank] = host
        pod = self.server.create_pod(template)
        with self._lock:
            self.pod_of_rank[rank] = pod["metadata"]["name"]
            self.uids[pod["metadata"]["uid"]] = rank
        return pod

    def _later(self, delay: float, action: Any) -> None:
        def run() -> None:
            if not self._stop.is_set():
                action()

        timer = threading.Timer(delay, run)
        timer.daemon = True
        with self._lock:
            self._timers.append(timer)
        timer.start()

    def _on_change(self, event: str, pod: Pod) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            rank = self.uids.get(uid)
            if rank is None or uid in self._handled:
                return
            if self._sigterm_locked(event, pod):
                return
            gone = (
                event == "DELETED"
                if self.kind == "pytorchjob"
                else bool(pod["metadata"].get("deletionTimestamp"))
            )
            if not gone:
                return
            self._handled.add(uid)
            self._losses += 1  # counted first, so the loop cannot miss a whole pause
            self._running.clear()  # the group lost a member: training stops
        if self.restart_reporter_container and rank != self.reporting_rank:
            self.server.stop_container(
                self.namespace, self.pod_name(self.reporting_rank), exit_code=1
            )
        if self.kind == "pytorchjob":
            self._later(self.recreate_delay, lambda: self._replace(rank))
        else:
            self._replace(rank)
            name = pod["metadata"]["name"]
            self._later(
                self.finalizer_delay, lambda: self.server.remove_finalizers(self.namespace, name)
            )

    def _sigterm_locked(self, event: str, pod: Pod) -> bool:
        """A graceful delete of a PyTorchJob pod: the kubelet's SIGTERM (True if handled)."""
        meta = pod["metadata"]
        if (
            self.kind != "pytorchjob"
            or event != "MODIFIED"
            or not meta.get("deletionTimestamp")
            or not meta.get("deletionGracePeriodSeconds")
            or meta["uid"] in self._sigtermed
        ):
            return False
        self._sigtermed.add(meta["uid"])
        self.sigterms.append((time.time(), meta["name"]))
        if self.on_sigterm == "save":
            self._save_requested = True
            self._losses += 1
            self._running.clear()  # the stop flag: the group stops and rank 0 saves
            namespace, name, uid = self.namespace, meta["name"], meta["uid"]
            self._later(
                self.save_time + 0.1,
                lambda: self.server.containers_exited(namespace, name, uid, exit_code=143),
            )
        return True

    def _replace(self, rank: int) -> None:
        pod = self._create(rank)
        name = pod["metadata"]["name"]
        self.replaced.append((rank, name))
        if self.replacement == "pending":
            return
        self._later(self.start_delay, lambda: self._start_replacement(rank, name))

    def _start_replacement(self, rank: int, name: str) -> None:
        self.server.start_container(self.namespace, name)
        if self.replacement == "crashloop":
            self.server.stop_container(self.namespace, name, exit_code=1)
            self.server.set_waiting(self.namespace, name, "CrashLoopBackOff")
            return
        if self.restart_reporter_container and rank != self.reporting_rank:
            self.server.start_container(
                self.namespace, self.pod_name(self.reporting_rank), status_lag=self.status_lag
            )
        self._running.set()

    # ------------------------------------------------------------------ the training loop

    def _emit(self, line: str) -> None:
        text, now = line.rstrip("\n"), time.time()
        if self.server.append_log(self.namespace, self.pod_name(self.reporting_rank), text, ts=now):
            self.written.append((now, text))

    def _say(self, event: str, inc: str, step: int) -> None:
        """One event as the reporter writes it, or as nanoGPT prints it (``lines``)."""
        if self.lines == "wire":
            self._emit(wire.format_step(event, time.time(), inc, step, 0))
        elif event == "progress":
            self._emit(f"[rank0]:iter {step - 1}: loss 1.0000, time 10.00ms, mfu -100.00%")
        elif event == "checkpoint_loaded":
            self._emit("[rank0]:Resuming training from out")
            self._emit(f"[rank0]:step {step}: train loss 1.0000, val loss 1.0000")
        elif event == "checkpoint_started":
            self._emit(f"[rank0]:step {step}: train loss 1.0000, val loss 1.0000")
            self._emit("[rank0]:saving checkpoint to out")  # the next iter line completes it

    def _start_incarnation(self, restart: int) -> str:
        inc = secrets.token_hex(8)
        self.incarnations.append(inc)
        if self.lines == "nanogpt":
            if not restart:
                self._emit("[rank0]:Initializing a new model from scratch")
            return inc
        self._emit(
            "[default0]:"
            + wire.format_start(
                time.time(),
                inc,
                pid=1000 + restart,
                host=self.pod_name(self.reporting_rank),
                rank=0,
                restart=restart,
            )
        )
        return inc

    def _train(self) -> None:
        """Train, and start a new incarnation after every pause of the group.

        A pause is noticed by the loss counter, not by the running flag alone: under CPU
        load one step (emit + sleep) can outlast the whole pause -- member lost, replacement
        running, flag set again -- and a loop that only looked at the flag would go on as
        the old incarnation, as no real job does.
        """
        restart = 0
        with self._lock:
            seen = self._losses
        inc = self._start_incarnation(restart)
        while not self._stop.is_set():
            with self._lock:
                losses = self._losses
            if losses != seen or not self._running.is_set():
                if self._save_requested:  # SIGTERM: save the state reached, then exit
                    self._save_requested = False
                    self._emit(
                        wire.format_step("checkpoint_started", time.time(), inc, self.step, 0)
                    )
                    time.sleep(self.save_time)  # not a wait: the played job's pace
                    self._emit(
                        wire.format_step("checkpoint_completed", time.time(), inc, self.step, 0)
                    )
                    self._save(self.step)
                self._running.wait()
                if self._stop.is_set():
                    return
                with self._lock:  # losses during the pause make one restart, as in torchrun
                    seen = self._losses
                restart += 1
                time.sleep(self.rendezvous_time)  # not a wait: torchrun's rendezvous, played
                with self._lock:
                    if self._losses != seen:  # a member lost in the rendezvous: no group
                        continue
                inc = self._start_incarnation(restart)
                self.step = self.resumed[inc] = self._resume_step()
                if self.step:
                    self._say("checkpoint_loaded", inc, self.step)
            self.step += 1
            self._say("progress", inc, self.step)
            if self.step % self.checkpoint_every == 0:
                self._save(self.step)
                if self.lines == "wire":
                    self._say("checkpoint_completed", inc, self.step)
                else:
                    self._say("checkpoint_started", inc, self.step)
            time.sleep(self.step_time)  # not a wait: the played job's pace
