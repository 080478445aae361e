"""Random faults for the fake API server, a controller that replaces pods at once, and the
exactly-one-kill check read from the server's own request log.

Shared by the fault-injection tests; kept apart so each test module stays readable. They
run on the fake API server because the real one cannot be made to misbehave on cue (a
chosen request answered with a 500 or 429, reset before or after acting, a watch dropped
or ended with 410 Gone, a log stream cut) and keeps no log of the requests it got.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.kubernetes.fake_apiserver import RBAC_DRILL_RULES, FakeApiServer, Fault, RequestInfo
from tests.kubernetes.fake_cluster import pytorchjob_pod, trainjob_pod
from tests.patience import PROMPT, within

Pod = dict[str, Any]

#: Faults that fit every request, by name (the read timeout is added per plan).
COMMON_FAULTS: dict[str, Fault] = {
    "500": Fault(status=500),
    "503+Retry-After": Fault(status=503, retry_after=1),
    "504": Fault(status=504),
    "429+Retry-After": Fault(status=429, retry_after=1),
    "reset-before-acting": Fault(reset_before=True),
    "reset-after-acting": Fault(reset_after=True),
}
#: Faults only streams get: a watch or log stream cut after a few lines, a 410 on a watch.
STREAM_FAULTS = ("drop-after-lines",)
WATCH_FAULTS = ("410",)


@dataclass
class FaultPlan:
    """Random faults on the requests of one namespace, reproducible from ``seed``."""

    namespace: str
    seed: int
    probability: float
    read_timeout: float  # the client's read timeout: a "read-timeout" fault waits longer
    active: bool = False
    injected: Counter[str] = field(default_factory=Counter)
    compactions: int = 0
    delete_guards: list[str | None] = field(default_factory=list)  # preconditions.uid sent
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def decide(self, info: RequestInfo, server: FakeApiServer) -> Fault | None:
        with self._lock:
            if info.method == "DELETE":  # seen here even when a fault cuts the request short
                guard = ((info.body or {}).get("preconditions") or {}).get("uid")
                self.delete_guards.append(guard)
            if not self.active or self._rng.random() >= self.probability:
                return None
            names = list(COMMON_FAULTS) + (["read-timeout"] if self._rng.random() < 0.5 else [])
            if info.verb == "watch" or info.resource == "pods/log":
                names += list(STREAM_FAULTS)
            if info.verb == "watch":
                names += [*WATCH_FAULTS, "compact"]
            name = self._rng.choice(names)
            lines = self._rng.randint(0, 3)
            self.injected[name] += 1
        if name == "read-timeout":
            return Fault(delay=self.read_timeout * 1.5)
        if name == "drop-after-lines":
            return Fault(drop_after_lines=lines)
        if name == "410":
            return Fault(status=410, message="too old resource version")
        if name == "compact":  # the watch itself goes on, from a resourceVersion now too old
            server.compact()
            with self._lock:
                self.compactions += 1
            return None
        return COMMON_FAULTS[name]


class Heartbeat:
    """Rank 0 of a job prints a line every ``interval``, as a training job does.

    A silent reporting pod would leave the adapter's log thread blocked on its stream;
    see test_cleanup_stops_the_log_thread_even_when_the_pod_is_silent for that case.
    """

    def __init__(
        self, server: FakeApiServer, namespace: str, pod: str, interval: float = 0.05
    ) -> None:
        self.server, self.namespace, self.pod, self.interval = server, namespace, pod, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{namespace}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=within(PROMPT))

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self.interval):
            n += 1
            self.server.append_log(self.namespace, self.pod, f"heartbeat {n}")


class FaultRouter:
    """The server's one fault hook and one subscriber, dispatching by namespace.

    (One subscriber per scenario would make every change cost a deep copy per scenario.)
    """

    def __init__(self, server: FakeApiServer) -> None:
        self.server = server
        self.plans: dict[str, FaultPlan] = {}
        self.controllers: dict[str, Callable[[str, Pod], None]] = {}
        self._lock = threading.Lock()
        server.fault_hook = self._hook
        server.subscribe(self._on_change)

    def add(self, plan: FaultPlan, controller: Callable[[str, Pod], None] | None = None) -> None:
        with self._lock:
            self.plans[plan.namespace] = plan
            if controller is not None:
                self.controllers[plan.namespace] = controller

    def _hook(self, info: RequestInfo) -> Fault | None:
        with self._lock:
            plan = self.plans.get(info.namespace)
        return plan.decide(info, self.server) if plan is not None else None

    def _on_change(self, event: str, pod: Pod) -> None:
        with self._lock:
            controller = self.controllers.get(pod["metadata"].get("namespace", ""))
        if controller is not None:
            controller(event, pod)


class InstantController:
    """Plays the operator with no delay: the replacement exists before the DELETE returns.

    That is the worst case for a retried kill: a second DELETE by name would find a live
    pod (PyTorchJob: same name, new uid) or the still-Terminating victim (TrainJob: the
    finalizer keeps it), so only the uid precondition and "never re-send" keep it safe.
    """

    def __init__(self, server: FakeApiServer, namespace: str, kind: str, job: str) -> None:
        self.server, self.namespace, self.kind, self.job = server, namespace, kind, job
        self.rank_of: dict[str, int] = {}  # uid -> rank, every pod of the job
        self.replacements: set[str] = set()
        self._handled: set[str] = set()
        self._lock = threading.Lock()

    def template(self, rank: int) -> Pod:
        if self.kind == "pytorchjob":
            kind = "master" if rank == 0 else "worker"
            return pytorchjob_pod(self.job, kind, max(rank - 1, 0), namespace=self.namespace)
        return trainjob_pod(self.job, rank, namespace=self.namespace)

    def create(self, rank: int, *, replacement: bool = False) -> Pod:
        pod = self.server.create_pod(self.template(rank))
        uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
        with self._lock:
            self.rank_of[uid] = rank
            if replacement:
                self.replacements.add(uid)
        self.server.start_container(self.namespace, name)
        return pod

    def __call__(self, event: str, pod: Pod) -> None:
        uid = pod["metadata"]["uid"]
        gone = (
            event == "DELETED"
            if self.kind == "pytorchjob"
            else bool(pod["metadata"].get("deletionTimestamp"))
        )
        with self._lock:
            rank = self.rank_of.get(uid)
            if rank is None or not gone or uid in self._handled:
                return
            self._handled.add(uid)
        self.create(rank, replacement=True)


@dataclass
class KillAudit:
    """What the request log says about one namespace's deletes."""

    deletes: int
    acted: int
    targets: list[str | None]
    dry_run_acted: int
    after_acting: int  # DELETEs sent after one had acted (a re-send, whatever its answer)
    outside_rbac: int


def audit(server: FakeApiServer, namespace: str) -> KillAudit:
    requests = [r for r in server.requests if r.namespace == namespace]
    deletes = [r for r in requests if r.method == "DELETE"]
    acted = [r for r in deletes if r.acted]
    first_acted = min((r.seq for r in acted), default=None)
    after = [r for r in deletes if first_acted is not None and r.seq > first_acted]
    outside = [r for r in server.requests_outside(RBAC_DRILL_RULES) if r.namespace == namespace]
    return KillAudit(
        deletes=len(deletes),
        acted=len(acted),
        targets=[r.target_uid for r in acted],
        dry_run_acted=sum(1 for r in acted if r.dry_run),
        after_acting=len(after),
        outside_rbac=len(outside),
    )


def request_trace(server: FakeApiServer, namespace: str) -> str:
    """The namespace's requests, one line each, for assertion messages."""
    start = server.requests[0].time if server.requests else 0.0
    return "\n".join(
        f"  {r.time - start:8.3f} {r.method:6} {r.verb:6} {r.resource:8} {r.name} "
        f"status={r.status} acted={r.acted} fault={r.fault or '-'} lines={r.lines_sent} "
        f"query={ {k: v for k, v in r.query.items() if k != 'labelSelector'} }"
        for r in list(server.requests)
        if r.namespace == namespace
    )
