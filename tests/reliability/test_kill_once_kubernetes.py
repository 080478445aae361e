"""Exactly one kill on Kubernetes, under random faults on every call, over real HTTP.

On the fake API server because the real one cannot be made to fail a chosen call on cue
(500, 503/429 with Retry-After, 504, a reset before or after it acted, a cut or 410'd
stream), nor replace a deleted pod before the DELETE returns, and keeps no log of the
requests it got, which is what "exactly one destructive DELETE" is read from.

We test these aspects:
- the fast tier: for each of ``KILL_SCENARIOS`` seeds, a fresh job (PyTorchJob or
  TrainJob, 3 ranks) in its own namespace, whose operator replaces a deleted pod before
  the DELETE even returns; the real adapter discovers it and kills rank 1 while every
  request may get a 500, 503/429 with Retry-After, a 504, a TCP reset before or after
  the server acted, a read timeout, and streams get cut or 410'd. The server's request
  log must show at most one destructive DELETE, to the discovered instance, carrying
  its uid precondition, never a DELETE after one acted, nothing outside the RBAC rules;
  the adapter's account must match the log (KILLED iff one acted; ALREADY_GONE never
  after acting; anything it cannot confirm is UNCONFIRMED, which the runner turns into
  ERROR). Backoff waits are shrunk a hundredfold in this tier (a subclass passes a
  scaled retry policy), so a thousand drills fit in CI; the decisions are the adapter's own.
- the full tier: ``FULL_DRILLS`` whole drills through ``run_drill`` with the real
  backoff, several at once on one server, each with a training job writing real
  RECOVERYGATE/v1 lines: the same log invariants, and the verdict is PASS only after a
  logged kill of the victim, ERROR whenever the kill was not confirmed, never FAIL
  (the job resumes correctly and the SLO is generous: faults must not change it).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.machine import Verdict
from pytest_recoverygate.engine.model import KillOutcome
from pytest_recoverygate.errors import DrillError
from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator
from pytest_recoverygate.orchestrators.kubernetes.api import RETRY
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.kubernetes.fake_cluster import FakeTrainingJob, job_drill_yaml
from tests.patience import PROMPT, deadline, eventually
from tests.reliability.conftest import Figures
from tests.reliability.kube_faults import (
    FaultPlan,
    FaultRouter,
    Heartbeat,
    InstantController,
    audit,
    request_trace,
)

pytestmark = pytest.mark.kubernetes

KILL_SCENARIOS = 1000
#: Where the seeds start (fast tier: SEED..SEED+999, full tier: SEED+100000...); set
#: RECOVERYGATE_RELIABILITY_SEED to run the same scenarios on other random faults.
SEED = int(os.environ.get("RECOVERYGATE_RELIABILITY_SEED", "0"))
KILL_SCENARIOS_AT_ONCE = 4
FULL_DRILLS = 200
FULL_DRILLS_AT_ONCE = 10
SLOW_CLEANUPS: list[str] = []
READ_TIMEOUT = 0.05  # not a wait: the client's read timeout under test (a fault waits 1.5x)


class FastBackoffOrchestrator(KubernetesOrchestrator):
    """The real adapter with its retry waits divided by 100 (only the waits)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(retry=RETRY.scaled(0.01), **kwargs)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeApiServer]:
    # Bookmarks every 0.1 s bound how long a watch thread that missed cleanup's stop signal
    # keeps cleanup waiting (see test_cleanup_stops_the_threads_even_mid_request).
    with FakeApiServer(bookmark_interval=0.1) as api:
        yield api


@pytest.fixture(scope="module")
def router(server: FakeApiServer) -> FaultRouter:
    return FaultRouter(server)


@pytest.fixture(scope="module")
def kubeconfig(server: FakeApiServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return server.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")


def one_scenario(
    server: FakeApiServer, router: FaultRouter, kubeconfig: Path, seed: int
) -> tuple[str, InstantController, FaultPlan, str]:
    """Discover and kill rank 1 of a fresh job under faults; returns the adapter's account."""
    rng = random.Random(seed)
    namespace = f"kill-{seed}"
    kind = rng.choice(["pytorchjob", "trainjob"])
    controller = InstantController(server, namespace, kind, job=f"job-{seed}")
    plan = FaultPlan(
        namespace, seed, probability=rng.choice([0.2, 0.4, 0.6]), read_timeout=READ_TIMEOUT
    )
    router.add(plan, controller)
    pods = [controller.create(rank) for rank in range(3)]
    victim = pods[1]["metadata"]["uid"]
    with Heartbeat(server, namespace, pods[0]["metadata"]["name"]):
        return attack(plan, controller, victim, kubeconfig, seed)


def attack(
    plan: FaultPlan, controller: InstantController, victim: str, kubeconfig: Path, seed: int
) -> tuple[str, InstantController, FaultPlan, str]:
    namespace = plan.namespace
    plan.active = True
    orchestrator = FastBackoffOrchestrator(
        selector=f"training-run=job-{seed}",
        namespace=namespace,
        kubeconfig=kubeconfig,
        target_rank=1,
        watch_timeout_seconds=2,
        request_timeout=READ_TIMEOUT,
    )
    try:
        try:
            workload = orchestrator.discover(deadline(PROMPT))
        except DrillError:
            return "no-discovery", controller, plan, victim
        target = workload.by_rank(1)
        assert target is not None
        assert target.instance_id == victim, "discovery under faults picked another pod"
        try:
            result = orchestrator.kill(target, dry_run=False)
        except DrillError:
            return "raised", controller, plan, victim
        return result.outcome.value, controller, plan, victim
    finally:
        started = time.monotonic()
        orchestrator.cleanup()
        plan.active = False
        SLOW_CLEANUPS.extend([namespace] if time.monotonic() - started > 3 else [])


@pytest.mark.slow  # a thousand drills: the full run counts them for RELIABILITY.md
def test_a_thousand_kills_under_random_faults_each_reach_at_most_the_victim(
    server: FakeApiServer, router: FaultRouter, kubeconfig: Path, figures: Figures
) -> None:
    outcomes: Counter[str] = Counter()
    runs = []
    with ThreadPoolExecutor(KILL_SCENARIOS_AT_ONCE) as pool:  # they mostly wait on sockets
        accounts = pool.map(
            lambda s: (s, *one_scenario(server, router, kubeconfig, s)),
            range(SEED, SEED + KILL_SCENARIOS),
        )
        for seed, outcome, controller, plan, victim in accounts:
            outcomes[outcome] += 1
            runs.append((seed, outcome, controller, plan, victim))
    # the server's own request log: every delayed handler (read-timeout faults) has acted
    eventually(lambda: not server.unfinished(), "handlers done", PROMPT, seen=server.unfinished)
    left = [t.name for t in threading.enumerate() if t.name.startswith("recoverygate-k8s")]
    injected: Counter[str] = Counter()
    kills = 0
    for seed, outcome, controller, plan, victim in runs:
        log = audit(server, plan.namespace)
        injected.update(plan.injected)
        where = f"seed {seed} ({controller.kind}, faults {dict(plan.injected)})"
        assert log.acted <= 1, f"{where}: {log.acted} destructive deletes"
        assert log.targets in ([], [victim]), f"{where}: a delete reached {log.targets}"
        assert not set(log.targets) & controller.replacements, f"{where}: hit a replacement"
        assert log.after_acting == 0, f"{where}: a DELETE was sent after one acted"
        assert set(plan.delete_guards) <= {victim}, f"{where}: a DELETE without the uid guard"
        assert log.dry_run_acted == 0 and log.outside_rbac == 0, where
        if outcome == KillOutcome.KILLED.value:
            assert log.acted == 1, f"{where}: KILLED but the server never deleted it"
        if outcome in (KillOutcome.ALREADY_GONE.value, "no-discovery"):
            assert log.acted == 0, f"{where}: {outcome} after a delete acted"
        kills += log.acted
    assert SLOW_CLEANUPS == [] and left == [], (SLOW_CLEANUPS, left)
    figures.add("k8s_kill_scenarios", KILL_SCENARIOS)
    figures.add("threads_left", len(left))
    figures.add("faults_injected", sum(injected.values()) + sum(r[3].compactions for r in runs))
    figures.add("kills_observed", kills)
    figures.add("double_kills", 0)
    # The suite must exercise the dangerous paths, not only the happy one.
    assert outcomes[KillOutcome.KILLED.value] > KILL_SCENARIOS // 2, outcomes
    assert outcomes[KillOutcome.UNCONFIRMED.value] > 0, outcomes
    for name in (
        "reset-after-acting",
        "reset-before-acting",
        "429+Retry-After",
        "read-timeout",
        "500",
        "drop-after-lines",
        "410",
    ):
        assert injected[name] > 0, f"no {name} fault was ever injected: {injected}"


# ---------------------------------------------------------------------- full drills


def drill_text(job: FakeTrainingJob, kubeconfig: Path) -> str:
    options = {"after": 10, "max_recovery": "20s", "max_lost_steps": 10000}
    return job_drill_yaml(job, kubeconfig, name="fault-drill", **options)


def one_full_drill(
    server: FakeApiServer, router: FaultRouter, kubeconfig: Path, seed: int, tmp: Path
) -> tuple[str, str, FaultPlan, str, set[str], str, int]:
    rng = random.Random(seed)
    namespace = f"drill-{seed}"
    kind = rng.choice(["pytorchjob", "trainjob"])
    job = FakeTrainingJob(
        server,
        kind=kind,
        name=f"job-{seed}",
        namespace=namespace,
        nodes=2,
        step_time=0.01,
        checkpoint_every=5,
        recreate_delay=0.02,
        start_delay=0.05,
        finalizer_delay=0.1,
    )
    plan = FaultPlan(namespace, seed, probability=rng.choice([0.1, 0.2, 0.3]), read_timeout=1.0)
    router.add(plan)
    try:
        job.start(wait_for_checkpoint=5)
        victim = job.pod(1)["metadata"]["uid"]
        plan.active = True
        path = tmp / f"drill-{seed}.yaml"
        text = drill_text(job, kubeconfig)
        path.write_text(text)
        result = run_drill(parse_config(text, path), RunOptions(handle_signals=False))
        plan.active = False
        kill_entries = [e.kind for e in result.timeline if e.kind.startswith("kill")]
        late = any(
            "so the delete took effect" in e.detail for e in result.timeline if e.kind == "kill"
        )
        kill_entries += ["late-confirm"] if late else []
        replacements = {uid for uid, rank in job.uids.items() if rank == 1} - {victim}
        return (
            result.verdict.value,
            result.summary,
            plan,
            victim,
            replacements,
            ",".join(kill_entries),
            len(job.incarnations),
        )
    finally:
        plan.active = False
        job.stop()


@pytest.mark.e2e
def test_hundreds_of_whole_drills_under_faults_kill_once_and_never_misjudge(
    server: FakeApiServer,
    router: FaultRouter,
    kubeconfig: Path,
    figures: Figures,
    tmp_path: Path,
) -> None:
    seeds = range(SEED + 100_000, SEED + 100_000 + FULL_DRILLS)
    with ThreadPoolExecutor(FULL_DRILLS_AT_ONCE) as pool:
        runs = list(
            pool.map(lambda s: one_full_drill(server, router, kubeconfig, s, tmp_path), seeds)
        )
    # the server's own request log: every delayed handler (read-timeout faults) has acted
    eventually(lambda: not server.unfinished(), "handlers done", PROMPT, seen=server.unfinished)
    verdicts: Counter[str] = Counter()
    injected: Counter[str] = Counter()
    kills = 0
    figures.add("k8s_full_drills", FULL_DRILLS)
    for run in runs:
        injected.update(run[2].injected)
        kills += audit(server, run[2].namespace).acted
    figures.add("faults_injected", sum(injected.values()))
    figures.add("kills_observed", kills)
    for verdict, summary, plan, victim, replacements, kill_entries, incarnations in runs:
        log = audit(server, plan.namespace)
        where = f"{plan.namespace} ({verdict}: {summary}; faults {dict(plan.injected)})"
        verdicts[verdict] += 1
        assert log.acted <= 1, where
        assert log.targets in ([], [victim]), where
        assert not set(log.targets) & replacements, where
        assert log.after_acting == 0 and log.outside_rbac == 0, where
        # The job always resumes from its latest checkpoint well within the SLO, so FAIL is
        # never right: it would mean faults changed the verdict (e.g. a kill confirmed late
        # stamped after the replacement started, which then counted as old).
        assert verdict != "FAIL", (
            f"faults changed the verdict ({incarnations} incarnations, kill {kill_entries}): "
            f"{where}\n{request_trace(server, plan.namespace)}"
        )
        if verdict == "PASS":
            assert log.acted == 1 and kill_entries.split(",")[0] == "kill", where
        if "kill:unconfirmed" in kill_entries or "kill:already_gone" in kill_entries:
            assert verdict == "ERROR", where
        if log.acted == 0:
            assert verdict == "ERROR", where
    assert verdicts["PASS"] > FULL_DRILLS // 2, verdicts
    assert Verdict.PASS.value in verdicts
