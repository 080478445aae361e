"""Harnesses for the Orchestrator contract suite: a running job per backend, and eyes on it.

The contract tests (test_orchestrator_contract.py) are written once, against
:class:`Harness`. Each builder starts one job on its backend the cheapest real way,
discovers it, and tells the tests how to look at the world *without asking the
orchestrator under test* (each in its backend's test folder: ``contract_harness.py``;
the fake's, with :class:`Harness` and :class:`ThreadSpy`, in tests/contract/harness.py):

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

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.contract.harness import Builder, Harness, ThreadSpy, build_fake

__all__ = ["BACKENDS", "Jobs"]


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
        build = functools.partial(build_fake, spy=thread_spy)
    elif kind in ("local", "local-nodes"):
        from tests.local.contract_harness import build_local, build_local_nodes

        build = functools.partial(
            build_local if kind == "local" else build_local_nodes, spy=thread_spy
        )
    elif kind == "kubernetes":
        from tests.kubernetes.contract_harness import build_kubernetes

        kube: Any = request.getfixturevalue("kube_cluster")  # skips where it cannot run
        build = functools.partial(build_kubernetes, spy=thread_spy, cluster=kube)
    elif kind == "ray":
        pytest.importorskip("ray", reason='the ray backend needs pip install "recoverygate[ray]"')
        from tests.ray.contract_harness import build_ray

        build = functools.partial(build_ray, spy=thread_spy)
    else:
        from tests.slurm.contract_harness import build_slurm

        cluster: Any = request.getfixturevalue("slurm_cluster")  # skips without Slurm
        build = functools.partial(build_slurm, spy=thread_spy, cluster=cluster)
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
