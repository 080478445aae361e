"""The new faults on Kubernetes, read from the fake API server's own request log.

On the fake API server because the real one cannot be made to answer a chosen request
with a 500, 503 or 429, reset a connection before or after it acted, time a read out, cut
a stream or end a watch with 410 Gone on cue, and keeps no log of every request it got (how
"never a second DELETE" is seen); Preempt and count on the real cluster without faults are
tests/kubernetes/test_kubernetes_drills.py's.

We test these aspects, on PyTorchJobs whose pods the fake operator recreates (the fake
kubelet: a graceful delete is the SIGTERM; the job saves on it, or ignores it until the
grace period ends):
- Preempt sends one DELETE, never a second target: for each of ``PREEMPT_DRILLS`` whole
  drills (half saving on SIGTERM, half ignoring it), a few without faults and the rest
  under the random faults of kube_faults.py (500s, 503/429, resets before and after
  acting, read timeouts, cut streams, 410s): at most one DELETE acted (exactly one
  without faults), to the discovered pod; every DELETE the adapter sent carries the
  configured ``gracePeriodSeconds`` and the victim's uid precondition; none was sent
  after one acted; PASS only after one acted;
- ``count: 3`` never has two destructive actions outstanding (KillWorker and Preempt):
  three acted DELETEs, each to a different pod of rank 1, each the replacement of the
  one before; DELETE k+1 came after the replacement incarnation's first progress line
  (the recovery the drill verified) and after pod k was gone from the server.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.machine import DrillResult, Verdict
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.kubernetes.fake_apiserver import FakeApiServer, Fault, RequestInfo
from tests.kubernetes.fake_cluster import FakeTrainingJob, job_drill_yaml
from tests.patience import PROMPT, eventually
from tests.reliability.conftest import Figures
from tests.reliability.kube_faults import FaultPlan, FaultRouter, audit, request_trace

pytestmark = pytest.mark.kubernetes

PREEMPT_DRILLS = 24
PREEMPT_CLEAN = 4  # the first drills run without faults: exactly one DELETE must act
PREEMPT_AT_ONCE = 8
GRACE = 2  # seconds: the drills' gracePeriod


@dataclass
class GracePlan(FaultPlan):
    """FaultPlan, also noting each DELETE's gracePeriodSeconds before any fault hits it."""

    graces: list[int | None] = field(default_factory=list)

    def decide(self, info: RequestInfo, server: FakeApiServer) -> Fault | None:
        if info.method == "DELETE":
            grace = info.query.get(
                "gracePeriodSeconds", (info.body or {}).get("gracePeriodSeconds")
            )
            with self._lock:
                self.graces.append(None if grace is None else int(grace))
        return super().decide(info, server)


class Removals:
    """When each pod (by uid) left the server: the end of its destructive action."""

    def __init__(self, server: FakeApiServer) -> None:
        self.at: dict[str, float] = {}
        self._lock = threading.Lock()
        server.subscribe(self._on_change)

    def _on_change(self, event: str, pod: dict[str, Any]) -> None:
        if event == "DELETED":
            with self._lock:
                self.at.setdefault(pod["metadata"]["uid"], time.time())


@pytest.fixture(scope="module")
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=0.1) as api:
        yield api


@pytest.fixture(scope="module")
def router(server: FakeApiServer) -> FaultRouter:
    return FaultRouter(server)


@pytest.fixture(scope="module")
def removals(server: FakeApiServer) -> Removals:
    return Removals(server)


@pytest.fixture(scope="module")
def kubeconfig(server: FakeApiServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return server.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")


def drill(job: FakeTrainingJob, kubeconfig: Path, path: Path, **options: Any) -> DrillResult:
    text = job_drill_yaml(job, kubeconfig, name="fault-drill", **options)
    path.write_text(text)
    return run_drill(parse_config(text, path), RunOptions(handle_signals=False))


# ---------------------------------------------------------------------- Preempt


def one_preempt(
    server: FakeApiServer, router: FaultRouter, kubeconfig: Path, seed: int, tmp: Path
) -> tuple[GracePlan, FakeTrainingJob, str, DrillResult]:
    rng = random.Random(seed)
    namespace = f"preempt-{seed}"
    job = FakeTrainingJob(
        server,
        name=f"job-{seed}",
        namespace=namespace,
        nodes=2,
        step_time=0.01,
        checkpoint_every=5,
        recreate_delay=0.02,
        start_delay=0.05,
        on_sigterm="save" if seed % 2 else "ignore",
    )
    probability = 0.0 if seed < PREEMPT_CLEAN else rng.choice([0.1, 0.2, 0.3])
    plan = GracePlan(namespace, seed, probability=probability, read_timeout=1.0)
    router.add(plan)
    try:
        job.start(wait_for_checkpoint=5)
        victim = job.pod(1)["metadata"]["uid"]
        plan.active = True
        result = drill(
            job,
            kubeconfig,
            tmp / f"preempt-{seed}.yaml",
            after=10,
            max_recovery="20s",
            max_lost_steps=10000,
            fault="Preempt",
            failure={"gracePeriod": f"{GRACE}s"},
        )
        plan.active = False
        return plan, job, victim, result
    finally:
        plan.active = False
        job.stop()


@pytest.mark.slow  # concurrent drills on the fake API server, a real grace period (about 8 s)
def test_a_preempt_sends_one_graceful_delete_to_the_victim_even_under_faults(
    server: FakeApiServer, router: FaultRouter, kubeconfig: Path, figures: Figures, tmp_path: Path
) -> None:
    with ThreadPoolExecutor(PREEMPT_AT_ONCE) as pool:
        runs = list(
            pool.map(
                lambda s: (s, *one_preempt(server, router, kubeconfig, s, tmp_path)),
                range(PREEMPT_DRILLS),
            )
        )
    # the server's own request log: every delayed handler (read-timeout faults) has acted
    eventually(lambda: not server.unfinished(), "handlers done", PROMPT, seen=server.unfinished)
    verdicts: dict[str, int] = {}
    for seed, plan, job, victim, result in runs:
        log = audit(server, plan.namespace)
        acted = [r for r in server.deletes(acted_only=True) if r.namespace == plan.namespace]
        where = (
            f"{plan.namespace} ({job.on_sigterm}; {result.verdict.value}: {result.summary}; "
            f"faults {dict(plan.injected)})\n{request_trace(server, plan.namespace)}"
        )
        wrong = (
            max(log.acted - 1, 0)
            + log.after_acting
            + sum(1 for t in log.targets if t != victim)
            + sum(1 for g in plan.graces if g != GRACE)
            + sum(1 for g in plan.delete_guards if g != victim)
        )
        figures.add("double_kills", max(log.acted - 1, 0) + log.after_acting)
        figures.add("double_signals", wrong)
        figures.add("preempt_drills")
        figures.add("kills_observed", log.acted)
        figures.add("faults_injected", sum(plan.injected.values()))
        verdicts[result.verdict.value] = verdicts.get(result.verdict.value, 0) + 1
        assert log.acted <= 1 and log.after_acting == 0, where
        assert log.targets in ([], [victim]), where
        assert plan.graces and set(plan.graces) == {GRACE}, f"gracePeriodSeconds sent: {where}"
        assert set(plan.delete_guards) == {victim}, f"uid preconditions sent: {where}"
        assert all(r.grace_period == GRACE and r.precondition_uid == victim for r in acted), where
        assert result.verdict is not Verdict.FAIL, where  # it resumes well within the SLO
        if result.verdict is Verdict.PASS:
            assert log.acted == 1, where
        if seed < PREEMPT_CLEAN:
            assert log.acted == 1 and result.verdict is Verdict.PASS, where
            assert [name for _, name in job.sigterms] == [job.pod_name(1)], where
    assert verdicts.get("PASS", 0) > PREEMPT_DRILLS // 2, verdicts


# ---------------------------------------------------------------------- count


def first_progress(job: FakeTrainingJob) -> dict[str, float]:
    """Each incarnation's first progress line, as the kubelet logged it."""
    out: dict[str, float] = {}
    for at, text in list(job.written):
        _, _, payload = text.partition("RECOVERYGATE/v1 ")
        if payload:
            rec = json.loads(payload)
            if rec["event"] == "progress":
                out.setdefault(rec["inc"], at)
    return out


@pytest.mark.slow  # three kills and recoveries on the fake API server under faults (2-3 s)
@pytest.mark.parametrize("fault", ["KillWorker", "Preempt"])
def test_count_three_deletes_one_current_pod_at_a_time(
    server: FakeApiServer,
    removals: Removals,
    kubeconfig: Path,
    figures: Figures,
    tmp_path: Path,
    fault: str,
) -> None:
    namespace = f"count-{fault.lower()}"
    job = FakeTrainingJob(
        server,
        name="count",
        namespace=namespace,
        nodes=2,
        step_time=0.02,
        checkpoint_every=10,
        on_sigterm="save",
    )
    try:
        job.start(wait_for_checkpoint=10)
        first = job.pod(1)["metadata"]["uid"]
        failure = {"count": "3", **({"gracePeriod": "1s"} if fault == "Preempt" else {})}
        result = drill(
            job,
            kubeconfig,
            tmp_path / "count.yaml",
            fault=fault,
            failure=failure,
            max_lost_steps=100,
        )
    finally:
        job.stop()
    acted = [r for r in server.deletes(acted_only=True) if r.namespace == namespace]
    where = f"{result.verdict.value}: {result.summary}\n{request_trace(server, namespace)}"
    assert result.verdict is Verdict.PASS, where
    assert len(result.recoveries) == 3 and len(acted) == 3, where
    targets = [r.target_uid or "" for r in acted]
    assert targets[0] == first, where
    assert all(job.uids.get(t) == 1 for t in targets), f"not all rank 1: {where}"
    assert all(r.precondition_uid == r.target_uid for r in acted), where
    firsts = first_progress(job)
    overlaps = 0
    for k in range(1, 3):
        at, before = acted[k].time, targets[k - 1]
        gone = removals.at.get(before)
        # the incarnation that started after delete k: its first progress line
        after = [t for inc, t in firsts.items() if t > acted[k - 1].time]
        ok = gone is not None and gone < at and bool(after) and min(after) < at
        overlaps += 0 if ok else 1
        assert gone is not None and gone < at, f"delete {k + 1} while pod {before} lived: {where}"
        assert after and min(after) < at, f"delete {k + 1} before recovery {k}: {where}"
    figures.add("double_signals", overlaps + len(targets) - len(set(targets)))
    figures.add("double_kills", len(targets) - len(set(targets)))
    figures.add("repeated_kills_checked", len(acted))
    figures.add("kills_observed", len(acted))
    figures.add("drills_run")
    assert len(set(targets)) == 3, f"a pod was deleted twice: {where}"
