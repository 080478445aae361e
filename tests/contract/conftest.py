"""Harnesses for the Orchestrator contract suite: a running job per backend, and eyes on it.

The contract tests (test_orchestrator_contract.py) are written once, against
:class:`Harness`. Each builder here starts one job on its backend the cheapest real way,
discovers it, and tells the tests how to look at the world *without asking the
orchestrator under test*:

- fake: :class:`FakeOrchestrator` on a :class:`SimulatedClock`. Its world is its own
  simulation, so there ``discover()`` (idempotent for the fake) is the view of the world;
- local: real torchrun with examples/local/train.py (built as tests/local/test_local_orchestrator
  builds it); processes are checked with psutil by ``pid`` + start time;
- kubernetes: the real client against the session's real cluster (scripts/kube-cluster,
  tests/kubernetes/kube_cluster.py), a PyTorchJob of three workers (the cluster image's
  python3 printing reporter lines: no torch) spread over its two nodes, each job in a
  namespace of its own; pods are checked with the admin's own API reads by uid;
- slurm: the one-node cluster of tests/slurm (its session fixture); ranks are checked in
  ``/proc`` by pid + start ticks, replacements found with ``scontrol listpids``;
- ray: examples/ray/train_ray.py on a Ray cluster its driver starts (2 CPUs); workers are
  checked in ``/proc`` by pid + start ticks, replacements found in Train's state as the
  dashboard serves it (the raw JSON, not the orchestrator's reading of it).

Per backend and module there are two jobs, started lazily: ``backend`` for the checks that
must kill nothing, and ``disposable_backend`` for the kill, the job output and the
cleanup checks. A disposable job is started again only when a test has cleaned it up
already, and the cleanup check (``ended_backend``) takes the job the job-output check
ended with its own cleanup(), so in file order the three share one job (two launches in
all; a Ray job takes about a minute to start). A job
that a check killed by mistake (a contract violation) is replaced for the next test, so
one violation fails one test, not every test after it.

Which threads did an orchestrator start? :class:`ThreadSpy` wraps ``Thread.start`` for
the module and labels each new thread with the label of the thread that started it: the
test thread carries the harness's label while its orchestrator is built and while a test
runs, the world (API server, training-job helpers) is built under another label. Threads
the API server starts to serve the orchestrator's requests are the server's, not the
orchestrator's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psutil
import pytest

from pytest_recoverygate.engine.model import Worker, Workload
from pytest_recoverygate.orchestrators.fake import FakeOrchestrator
from pytest_recoverygate.orchestrators.local.processes import Identity, start_time
from pytest_recoverygate.registry.seams import Clock, Orchestrator, RealClock, SimulatedClock
from pytest_recoverygate.shared.procs import JobLaunch
from tests.patience import CLUSTER, JOB, PROMPT, deadline, eventually, within

if TYPE_CHECKING:
    from tests.kubernetes.kube_cluster import KubeCluster
    from tests.slurm.slurm_testcluster import SlurmCluster

__all__ = ["Harness", "ThreadSpy"]

T = TypeVar("T")

SLURM_SHARED = (  # prints one RECOVERYGATE/v1 line, then two ranks that do nothing
    "#!/bin/bash\n"
    "python3 -c 'from recoverygate import reporter; reporter.checkpoint_completed(10)'\n"
    "srun --overcommit -n2 sleep 600\n"
)
SLURM_DISPOSABLE = (  # torchrun restarts the killed rank inside the step: a replacement
    "#!/bin/bash\n"
    "srun -n1 torchrun --standalone --nproc-per-node=2 --max-restarts=2 --monitor-interval=0.2 "
    "--no-python sleep 600\n"
)


# --------------------------------------------------------------------------- threads


class ThreadSpy:
    """Labels every thread started while installed with the label of its starter."""

    def __init__(self) -> None:
        self._labels: weakref.WeakKeyDictionary[threading.Thread, str] = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._original = threading.Thread.start

    def install(self) -> None:
        spy, original = self, self._original

        def start(thread: threading.Thread) -> None:
            label = spy.current_label()
            if label is not None:
                with spy._lock:
                    spy._labels[thread] = label
            original(thread)

        threading.Thread.start = start  # type: ignore[method-assign, assignment]

    def uninstall(self) -> None:
        threading.Thread.start = self._original  # type: ignore[method-assign]

    def current_label(self) -> str | None:
        own: str | None = getattr(self._local, "label", None)
        if own is not None:
            return own
        with self._lock:
            return self._labels.get(threading.current_thread())

    @contextlib.contextmanager
    def labelled(self, label: str) -> Iterator[None]:
        """Threads started by this thread (and by those threads) get ``label``."""
        previous = getattr(self._local, "label", None)
        self._local.label = label
        try:
            yield
        finally:
            self._local.label = previous

    def started(self, label: str) -> list[threading.Thread]:
        with self._lock:
            return [t for t, owner in list(self._labels.items()) if owner == label]

    def alive(self, label: str) -> list[threading.Thread]:
        return [t for t in self.started(label) if t.is_alive()]


# --------------------------------------------------------------------------- harness


@dataclass
class Harness:
    """One discovered job on one backend, and how a test checks the world around it.

    ``alive(worker)`` and ``current(rank)`` look at the world directly (processes, pods),
    never through the orchestrator; ``stale_id(worker)`` is a plausible instance id of an
    earlier instance of the same rank; ``pause`` lets the world move on (simulated time
    for the fake); ``patience`` bounds every wait, in clock seconds.
    """

    kind: str
    label: str
    orchestrator: Orchestrator
    clock: Clock
    workload: Workload
    alive: Callable[[Worker], bool]
    current: Callable[[int], Worker | None]
    stale_id: Callable[[Worker], str]
    pause: Callable[[float], None]
    patience: float
    exit_stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    cleaned: bool = False  # cleanup() ran: the next test gets a new job
    spoiled: bool = False  # a check killed a worker it must not have: the next test gets a new job

    @property
    def target(self) -> Worker:
        """Rank 1, the drill's default target."""
        worker = self.workload.by_rank(1)
        assert worker is not None, f"{self.kind}: no rank 1 in {self.workload}"
        return worker

    def stale(self, worker: Worker) -> Worker:
        """The same rank and name, but an instance that no longer exists."""
        return dataclasses.replace(worker, instance_id=self.stale_id(worker))

    def eventually(self, check: Callable[[], T | None], what: str) -> T:
        """:func:`tests.patience.eventually` on the harness's clock (simulated for the
        fake), for at most ``patience`` seconds (stretched by the slack)."""
        return eventually(
            check, f"{self.kind}: {what}", self.patience, now=self.clock.now, pause=self.pause
        )

    def close(self) -> None:
        self.exit_stack.close()


Builder = Callable[[str, str, Path], Harness]


def _build_fake(purpose: str, label: str, tmp: Path, spy: ThreadSpy) -> Harness:
    clock = SimulatedClock()
    with spy.labelled(label):
        orchestrator = FakeOrchestrator(clock=clock, workers=4, nodes=2)  # two nodes
        conforming: Orchestrator = orchestrator  # the static check (mypy)
        workload = conforming.discover(clock.now() + 60)

    def live_ids() -> dict[int, Worker]:
        return {w.rank: w for w in orchestrator.discover(clock.now() + 60).workers}

    harness = Harness(
        kind="fake",
        label=label,
        orchestrator=orchestrator,
        clock=clock,
        workload=workload,
        alive=lambda w: w.instance_id in orchestrator.running(),
        current=lambda rank: live_ids().get(rank),
        stale_id=lambda w: f"fake-{w.rank}-999",
        pause=clock.wait,
        patience=JOB,
    )
    harness.exit_stack.callback(orchestrator.cleanup)
    return harness


def _process_alive(pid: int, created: str) -> bool:
    """The process ``pid`` started at ``created`` (the local backend's start time) still runs."""
    try:
        proc = psutil.Process(pid)
        started = start_time(pid)
        alive = started is not None and f"{started:.3f}" == created
        return alive and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _build_local(purpose: str, label: str, tmp: Path, spy: ThreadSpy) -> Harness:
    from pytest_recoverygate.orchestrators.local import LocalOrchestrator
    from tests.local.test_local_orchestrator import job_env, torchrun

    clock = RealClock()
    harness_stack = contextlib.ExitStack()
    with spy.labelled(label):
        orchestrator = LocalOrchestrator(
            JobLaunch(torchrun(tmp, max_restarts=3), tmp, job_env()), clock=clock
        )
        harness_stack.callback(orchestrator.cleanup)
        conforming: Orchestrator = orchestrator  # the static check (mypy)
        try:
            workload = conforming.discover(deadline(JOB))
        except BaseException:
            harness_stack.close()
            raise
    agent = psutil.Process(int(workload.workers[0].instance_id.split("@")[0])).ppid()

    def alive(worker: Worker) -> bool:
        pid, _, created = worker.instance_id.partition("@")
        return pid.isdigit() and _process_alive(int(pid), created)

    def current(rank: int) -> Worker | None:
        """The agent's newest live child whose environment says RANK=rank."""
        best: psutil.Process | None = None
        try:
            children = psutil.Process(agent).children()
        except psutil.NoSuchProcess:
            return None
        for proc in children:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if proc.environ().get("RANK") != str(rank):
                    continue
                if best is None or proc.create_time() > best.create_time():
                    best = proc
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if best is None:
            return None
        try:
            return Worker(rank, f"pid {best.pid}", Identity.of(best).instance_id)
        except psutil.NoSuchProcess:
            return None

    def stale_id(worker: Worker) -> str:
        pid, _, created = worker.instance_id.partition("@")
        return f"{pid}@{float(created) - 60:.3f}"

    return Harness(
        kind="local",
        label=label,
        orchestrator=orchestrator,
        clock=clock,
        workload=workload,
        alive=alive,
        current=current,
        stale_id=stale_id,
        pause=time.sleep,
        patience=JOB,
        exit_stack=harness_stack,
    )


def _build_local_nodes(purpose: str, label: str, tmp: Path, spy: ThreadSpy) -> Harness:
    """Two real network namespaces, each node running the torchrun stand-in (2 ranks)."""
    import sys

    from pytest_recoverygate.orchestrators.local.netns import missing_capabilities
    from pytest_recoverygate.orchestrators.local.nodes import LocalNodesOrchestrator

    if missing_capabilities():
        pytest.skip("local nodes need root: CAP_NET_ADMIN, CAP_SYS_ADMIN, ip")
    standin = Path(__file__).resolve().parents[1] / "reliability" / "standin_job.py"
    tag = uuid.uuid4().hex
    command = [sys.executable, str(standin), *(
        "--nproc 2 --node-rank {nodeRank} --ckpt {sharedDir}/ckpt{nodeRank} "
        "--ckpt-every 5 --step-time 0.02"
    ).split()]  # fmt: skip
    clock = RealClock()
    harness_stack = contextlib.ExitStack()
    with spy.labelled(label):
        job = JobLaunch(command, tmp, {"RG_CONTRACT_TAG": tag})
        orchestrator = LocalNodesOrchestrator(job, nodes=2, clock=clock)
        harness_stack.callback(orchestrator.cleanup)
        conforming: Orchestrator = orchestrator  # the static check (mypy)
        try:
            workload = conforming.discover(deadline(JOB))
        except BaseException:
            harness_stack.close()
            raise

    def alive(worker: Worker) -> bool:
        pid, _, created = worker.instance_id.partition("@")
        return pid.isdigit() and _process_alive(int(pid), created)

    def current(rank: int) -> Worker | None:
        """The newest live process of this job (its tag) whose environment says RANK=rank."""
        best: psutil.Process | None = None
        for proc in psutil.process_iter():
            try:
                env = proc.environ()
                if env.get("RG_CONTRACT_TAG") != tag or env.get("RANK") != str(rank):
                    continue
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if best is None or proc.create_time() > best.create_time():
                    best = proc
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if best is None:
            return None
        try:
            return Worker(rank, f"pid {best.pid}", Identity.of(best).instance_id)
        except psutil.NoSuchProcess:
            return None

    def stale_id(worker: Worker) -> str:
        pid, _, created = worker.instance_id.partition("@")
        return f"{pid}@{float(created) - 60:.3f}"

    return Harness(
        kind="local",
        label=label,
        orchestrator=orchestrator,
        clock=clock,
        workload=workload,
        alive=alive,
        current=current,
        stale_id=stale_id,
        pause=time.sleep,
        patience=JOB,
        exit_stack=harness_stack,
    )


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


def _build_kubernetes(
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


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: state, ppid, ... ([19] = start ticks since boot,
    the start time Slurm's probe reads)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def _proc_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _build_slurm(
    purpose: str, label: str, tmp: Path, spy: ThreadSpy, cluster: SlurmCluster
) -> Harness:
    from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator

    script = SLURM_SHARED if purpose == "shared" else SLURM_DISPOSABLE
    args: tuple[str, ...] = ("-n2",) if purpose == "shared" else ("-n1",)
    if purpose == "shared" and len(cluster.nodes) > 1:
        # one rank per node: the node seam's checks run on the shared job
        script = script.replace(
            "srun --overcommit -n2", "srun --overcommit -N2 --ntasks-per-node=1"
        )
        args = ("-N2", "--ntasks-per-node=1")
    # --overcommit and --oversubscribe: both jobs fit the 2-CPU node at once.
    job_id = cluster.submit(script, *args, "--overcommit", "--oversubscribe", workdir=tmp)
    clock = RealClock()
    stack = contextlib.ExitStack()
    stack.callback(lambda: cluster.run("scancel", job_id, check=False))
    try:
        with spy.labelled(label):
            orchestrator = SlurmOrchestrator(
                job_id=job_id, clock=clock, env=cluster.env, poll_interval=0.5
            )
            stack.callback(orchestrator.cleanup)
            conforming: Orchestrator = orchestrator  # the static check (mypy)
            workload = conforming.discover(deadline(JOB))
    except BaseException:
        stack.close()
        raise

    def alive(worker: Worker) -> bool:
        pid, _, start = worker.instance_id.rpartition("/")[2].partition("@")
        stat = _proc_stat(int(pid)) if pid.isdigit() else None
        return stat is not None and stat[0] != "Z" and stat[19] == start

    def current(rank: int) -> Worker | None:
        """The job's live process that is rank ``rank`` (its RANK, else its task id)."""
        listing = cluster.listpids(job_id)
        rows = []
        for line in listing.splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[0].isdigit() and parts[2].isdigit():
                env = _proc_environ(int(parts[0]))
                rows.append((int(parts[0]), parts[2], parts[4], env.get("RANK")))
        by_rank_env = any(r[3] is not None for r in rows)
        pids = {r[0] for r in rows}
        for pid, step, global_id, rank_env in rows:
            own = rank_env if by_rank_env else global_id
            if own != str(rank):
                continue
            stat = _proc_stat(pid)
            if stat is None or stat[0] == "Z":
                continue
            parent = int(stat[1])
            if by_rank_env and parent in pids and _proc_environ(parent).get("RANK"):
                continue  # a rank's own child
            return Worker(rank, f"{job_id}.{step} rank {rank}", f"{job_id}.{step}/{pid}@{stat[19]}")
        return None

    def stale_id(worker: Worker) -> str:
        head, _, start = worker.instance_id.rpartition("@")
        return f"{head}@{int(start) - 1}"

    return Harness(
        kind="slurm",
        label=label,
        orchestrator=orchestrator,
        clock=clock,
        workload=workload,
        alive=alive,
        current=current,
        stale_id=stale_id,
        pause=time.sleep,
        patience=JOB,
        exit_stack=stack,
    )


def _build_ray(purpose: str, label: str, tmp: Path, spy: ThreadSpy) -> Harness:
    import json
    import sys
    import urllib.request

    from pytest_recoverygate.orchestrators.ray.orchestrator import RayOrchestrator

    examples = Path(__file__).resolve().parents[2] / "examples" / "ray"
    clock = RealClock()
    stack = contextlib.ExitStack()
    with spy.labelled(label):
        orchestrator = RayOrchestrator(
            JobLaunch(
                [sys.executable, "train_ray.py", "--steps=100000", "--ckpt-every=50"],
                examples,
                {"RECOVERYGATE_AUTO": "1"},
            ),
            address=None,
            submission_id=None,
            clock=clock,
        )
        stack.callback(orchestrator.cleanup)
        conforming: Orchestrator = orchestrator  # the static check (mypy)
        try:
            workload = conforming.discover(deadline(CLUSTER))
        except BaseException:
            stack.close()
            raise
    dashboard, token = orchestrator._cluster.dashboard, orchestrator._cluster.token

    def ticks(pid: int) -> str | None:
        stat = _proc_stat(pid)
        return stat[19] if stat is not None and stat[0] != "Z" else None

    def alive(worker: Worker) -> bool:
        head, _, start = worker.instance_id.partition("@")
        pid = head.rpartition(":")[2]
        return pid.isdigit() and ticks(int(pid)) == start

    def current(rank: int) -> Worker | None:
        """The rank's worker in the newest attempt of the newest run, when it runs."""
        request = urllib.request.Request(
            f"{dashboard}/api/train/v2/runs/v1", headers={"Authorization": f"Bearer {token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=within(PROMPT)) as answer:
                runs = json.loads(answer.read())["train_runs"]
        except OSError:
            return None
        if not runs:
            return None
        run = max(runs, key=lambda r: r["start_time_ns"])
        attempts = sorted(run["attempts"], key=lambda a: a["start_time_ns"])
        if not attempts or attempts[-1]["status"] != "RUNNING":
            return None
        for w in attempts[-1]["workers"]:
            start = ticks(int(w["pid"]))
            if w["world_rank"] == rank and w.get("status") == "ALIVE" and start is not None:
                return Worker(rank, f"pid {w['pid']}", f"{w['actor_id']}:{w['pid']}@{start}")
        return None

    def stale_id(worker: Worker) -> str:
        head, _, start = worker.instance_id.partition("@")
        return f"{head}@{int(start) - 100}"

    return Harness(
        kind="ray",
        label=label,
        orchestrator=orchestrator,
        clock=clock,
        workload=workload,
        alive=alive,
        current=current,
        stale_id=stale_id,
        pause=time.sleep,
        patience=CLUSTER,
        exit_stack=stack,
    )


# --------------------------------------------------------------------------- fixtures

BACKENDS = [
    pytest.param("fake", id="fake"),
    pytest.param("local", marks=(pytest.mark.local, pytest.mark.e2e), id="local"),
    pytest.param("local-nodes", marks=pytest.mark.local, id="local-nodes"),
    pytest.param(
        "kubernetes", marks=(pytest.mark.kubernetes, pytest.mark.kube_cluster), id="kubernetes"
    ),
    pytest.param("slurm", marks=(pytest.mark.slurm, pytest.mark.e2e), id="slurm"),
    pytest.param("ray", marks=(pytest.mark.ray, pytest.mark.e2e), id="ray"),
]


class Jobs:
    """One backend's jobs for one module, started on first use, closed at module end."""

    def __init__(self, kind: str, build: Builder, tmp: pytest.TempPathFactory) -> None:
        self.kind = kind
        self._build = build
        self._tmp = tmp
        self._made: dict[str, Harness] = {}
        self._all: list[Harness] = []

    def get(self, purpose: str, *, cleaned_ok: bool = False) -> Harness:
        """The job for ``purpose``; a new one when the last was spoiled, or cleaned up
        (unless ``cleaned_ok``: a check of cleanup() itself may take a cleaned job)."""
        harness = self._made.get(purpose)
        if harness is None or (harness.cleaned and not cleaned_ok) or harness.spoiled:
            label = f"{self.kind}-{purpose}-{len(self._all)}"
            harness = self._build(purpose, label, self._tmp.mktemp(label))
            self._made[purpose] = harness
            self._all.append(harness)
        return harness

    def close(self) -> None:
        errors: list[BaseException] = []
        for harness in reversed(self._all):
            try:
                harness.close()
            except Exception as exc:  # close every job; report the first failure
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture(scope="module")
def thread_spy() -> Iterator[ThreadSpy]:
    spy = ThreadSpy()
    spy.install()
    try:
        yield spy
    finally:
        spy.uninstall()


@pytest.fixture(scope="module", params=BACKENDS)
def jobs(
    request: pytest.FixtureRequest,
    thread_spy: ThreadSpy,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Jobs]:
    kind: str = request.param
    build: Builder
    if kind == "fake":
        build = functools.partial(_build_fake, spy=thread_spy)
    elif kind == "local":
        build = functools.partial(_build_local, spy=thread_spy)
    elif kind == "local-nodes":
        build = functools.partial(_build_local_nodes, spy=thread_spy)
    elif kind == "kubernetes":
        kube: Any = request.getfixturevalue("kube_cluster")  # skips where it cannot run
        build = functools.partial(_build_kubernetes, spy=thread_spy, cluster=kube)
    elif kind == "ray":
        pytest.importorskip("ray", reason='the ray backend needs pip install "recoverygate[ray]"')
        build = functools.partial(_build_ray, spy=thread_spy)
    else:
        cluster: Any = request.getfixturevalue("slurm_cluster")  # skips without Slurm
        build = functools.partial(_build_slurm, spy=thread_spy, cluster=cluster)
    pool = Jobs(kind, build, tmp_path_factory)
    try:
        yield pool
    finally:
        pool.close()


# Backends whose job is too dear to run twice side by side (a Ray cluster and its Train
# group take about a minute on 2 cores, two at once much longer): the checks that must kill
# nothing run on the disposable job too. They come before the kill in file order, and a
# check that killed by mistake still spoils the job for the next one.
ONE_JOB = {"ray"}


@pytest.fixture
def backend(jobs: Jobs, thread_spy: ThreadSpy) -> Iterator[Harness]:
    """A running job for checks that must kill nothing (shared by the module's tests)."""
    harness = jobs.get("disposable" if jobs.kind in ONE_JOB else "shared")
    with thread_spy.labelled(harness.label):
        yield harness


@pytest.fixture
def disposable_backend(jobs: Jobs, thread_spy: ThreadSpy) -> Iterator[Harness]:
    """A running job a test may kill or clean up (started again once cleaned up)."""
    harness = jobs.get("disposable")
    with thread_spy.labelled(harness.label):
        yield harness


@pytest.fixture
def ended_backend(jobs: Jobs, thread_spy: ThreadSpy) -> Iterator[Harness]:
    """The disposable job as the test before left it, cleaned up or not (cleanup() must
    hold either way; a Ray job takes a minute to start)."""
    harness = jobs.get("disposable", cleaned_ok=True)
    with thread_spy.labelled(harness.label):
        yield harness
