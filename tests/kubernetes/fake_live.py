"""A torchft job on the fake cluster: replica groups as PyTorchJobs of one pod each.

The fake cluster's pods are not processes (tests/kubernetes/fake_cluster.py plays the
kubelet and the operator), so this job plays torchft too: what its pods print are the
lines ``recoverygate.integrations.torchft`` prints for a real torchft job, formatted by
the real ``recoverygate.wire``: each replica's start line carries its ``replica``, each
committed step is a ``progress`` line of every replica in the quorum, and a healed
replacement prints ``checkpoint_loaded(step, source="peer", peer=...)`` before its
first committed step.

- Every replica group ``r`` is PyTorchJob ``ft-replica-r`` (one Master pod, rank 0),
  selector ``training.kubeflow.org/job-name=ft-replica-r``.
- The quorum commits a step every ``step_time``. When a pod is deleted the Training
  Operator recreates it under the same name (``recreate_delay``, then Running after
  ``start_delay``); its container starts a new incarnation, which joins the quorum after
  ``restart_delay``.
- The lighthouse: after a replica is lost the survivors commit nothing for
  ``heartbeat_timeout`` (``min_replicas`` above the live groups: until it is back).
- ``heal``: ``peer`` (torchft: the replacement loads the survivors' state at the step
  they reached) or ``scratch`` (the broken twin: no heal, its steps start at 1 again).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from recoverygate import wire

from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.kubernetes.fake_cluster import NAMESPACE, pytorchjob_pod
from tests.patience import PROMPT, eventually, within

Pod = dict[str, Any]

JOB_LABEL = "training.kubeflow.org/job-name"


@dataclass
class _Replica:
    replica: int
    job: str
    pod_name: str = ""
    uid: str = ""
    inc: str = ""
    joined: bool = False  # in the quorum: its lines are committed steps
    ready_at: float | None = None  # its new incarnation joins at this time
    step: int = 0  # its own committed step (heal scratch: counted from 0 again)
    incarnations: list[str] = field(default_factory=list)


class FakeLiveJob:
    """Replica groups of a torchft job, one PyTorchJob each, and the lighthouse's quorum."""

    def __init__(
        self,
        server: FakeApiServer,
        *,
        replicas: int = 2,
        namespace: str = NAMESPACE,
        step_time: float = 0.02,
        heartbeat_timeout: float = 0.5,  # not a wait: the lighthouse's, played
        restart_delay: float = 0.3,
        recreate_delay: float = 0.1,
        start_delay: float = 0.2,
        min_replicas: int = 1,
        heal: str = "peer",
    ) -> None:
        if heal not in ("peer", "scratch"):
            raise ValueError(f"heal must be peer or scratch, got {heal!r}")
        self.server = server
        self.namespace = namespace
        self.step_time = step_time
        self.heartbeat_timeout = heartbeat_timeout
        self.restart_delay = restart_delay
        self.recreate_delay = recreate_delay
        self.start_delay = start_delay
        self.min_replicas = min_replicas
        self.heal = heal
        self.replicas = [_Replica(r, f"ft-replica-{r}") for r in range(replicas)]
        self.step = 0  # the quorum's committed step
        self.lost_at: float | None = None  # when the quorum last lost a replica
        self.heals: list[tuple[int, int]] = []  # (replica, step) of each heal line
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._timers: list[threading.Timer] = []

    def selector(self, replica: int) -> str:
        return f"{JOB_LABEL}={self.replicas[replica].job}"

    def uid(self, replica: int) -> str:
        with self._lock:
            return self.replicas[replica].uid

    # ------------------------------------------------------------------ lifecycle

    def start(self, *, until_step: int = 0) -> FakeLiveJob:
        for rep in self.replicas:
            self._create(rep)
            self.server.start_container(self.namespace, rep.pod_name)
            self._incarnation(rep)
            rep.joined = True
        self.server.subscribe(self._on_change)
        self._thread = threading.Thread(target=self._train, name="fake-torchft", daemon=True)
        self._thread.start()
        if until_step:
            eventually(lambda: self.step >= until_step, f"the job's step {until_step}", PROMPT)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            timers = list(self._timers)
        for timer in timers:
            timer.cancel()
        if self._thread is not None:
            self._thread.join(timeout=within(PROMPT))

    # ------------------------------------------------------------------ the operator

    def _create(self, rep: _Replica) -> None:
        pod = self.server.create_pod(pytorchjob_pod(rep.job, "master", 0, namespace=self.namespace))
        with self._lock:
            rep.pod_name, rep.uid = pod["metadata"]["name"], pod["metadata"]["uid"]

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
        if event != "DELETED":
            return
        with self._lock:
            rep = next((r for r in self.replicas if r.uid == pod["metadata"]["uid"]), None)
            if rep is None:
                return
            rep.joined, rep.uid = False, ""
            self.lost_at = time.monotonic()
        self._later(self.recreate_delay, lambda: self._recreate(rep))

    def _recreate(self, rep: _Replica) -> None:
        self._create(rep)
        self._later(self.start_delay, lambda: self._run_replacement(rep))

    def _run_replacement(self, rep: _Replica) -> None:
        self.server.start_container(self.namespace, rep.pod_name)
        with self._lock:
            self._incarnation(rep)
            rep.ready_at = time.monotonic() + self.restart_delay

    # ------------------------------------------------------------------ torchft

    def _emit(self, rep: _Replica, line: str) -> None:
        self.server.append_log(
            self.namespace, rep.pod_name, "[default0]:" + line.rstrip("\n"), ts=time.time()
        )

    def _incarnation(self, rep: _Replica) -> None:
        rep.inc = secrets.token_hex(8)
        rep.incarnations.append(rep.inc)
        self._emit(
            rep,
            wire.format_start(
                time.time(),
                rep.inc,
                pid=1000 + len(rep.incarnations),
                host=rep.pod_name,
                rank=0,
                restart=0,
                replica=rep.replica,
            ),
        )

    def _train(self) -> None:
        while not self._stop.is_set():
            time.sleep(self.step_time)  # not a wait: the played job's pace
            now = time.monotonic()
            with self._lock:
                for rep in self.replicas:
                    if rep.ready_at is not None and now >= rep.ready_at:
                        rep.ready_at, rep.joined = None, True
                        if self.heal == "peer":
                            peer = next(r.replica for r in self.replicas if r is not rep)
                            rep.step = self.step
                            self.heals.append((rep.replica, self.step))
                            self._emit(
                                rep,
                                wire.format_step(
                                    "checkpoint_loaded",
                                    time.time(),
                                    rep.inc,
                                    self.step,
                                    0,
                                    source="peer",
                                    peer=peer,
                                ),
                            )
                        else:
                            rep.step = 0
                live = [r for r in self.replicas if r.joined]
                waiting = self.lost_at is not None and now - self.lost_at < self.heartbeat_timeout
                if waiting or len(live) < self.min_replicas:
                    continue  # the lighthouse has no quorum yet
                self.step += 1
                for rep in live:
                    rep.step = self.step if self.heal == "peer" else rep.step + 1
                    self._emit(rep, wire.format_step("progress", time.time(), rep.inc, rep.step, 0))
