"""Interlocks: every unsafe request is refused before anything is touched.

We test these aspects, each checked from the fake API server's request log (Kubernetes)
or the process table (local). The Kubernetes half is on the fake API server because what
it checks is that a request was never sent (no DELETE, not even a list), which only a
server that logs every request it got can show; the real one keeps no such log. The real
cluster's dry run is tests/kubernetes/test_kubernetes_drills.py's.
- an empty selector (config and adapter), a selector matching pods of two jobs, a target
  rank that does not exist: ERROR or exit 2, and no DELETE at all;
- requireConfirm without a terminal and without --yes: exit 2, not even a list request;
- a second drill against the same job while one runs: the drill lock refuses it with
  the holder's pid and config, and no DELETE is sent; a lock whose holder died is free;
- a kubeconfig whose current context points elsewhere: the context the config names is
  used; a context the kubeconfig lacks is a usage error before any request;
- ``--dry-run`` makes zero destructive calls: Kubernetes (request log: only
  ``dryRun=All`` deletes, none acted) and local (the target worker keeps running).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from pytest_recoverygate.cli import main
from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.engine.machine import Verdict
from pytest_recoverygate.engine.model import Fault, KillResult, Worker
from pytest_recoverygate.runner import RunOptions, run_drill
from pytest_recoverygate.shared.lock import DrillLock, lock_path
from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.kubernetes.fake_cluster import FakeTrainingJob
from tests.patience import JOB, PROMPT, deadline, within
from tests.reliability.conftest import Figures
from tests.reliability.kube_faults import InstantController
from tests.reliability.test_cleanup_local import drill_yaml as local_drill_yaml
from tests.reliability.test_cleanup_local import local_backend

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=0.2) as api:
        yield api


@pytest.fixture(autouse=True)
def private_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "locks"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("RECOVERYGATE_LOCK_DIR", str(folder))
    return folder


def k8s_yaml(
    tmp_path: Path,
    server: FakeApiServer,
    *,
    selector: str,
    namespace: str = "ns",
    target_rank: int = 1,
    confirm: bool = False,
    context: str | None = None,
    kubeconfig: Path | None = None,
) -> Path:
    kubeconfig = kubeconfig or server.write_kubeconfig(tmp_path / "kubeconfig")
    workload = {
        "orchestrator": "kubernetes",
        "selector": selector,
        "namespace": namespace,
        "kubeconfig": str(kubeconfig),
    }
    if context:
        workload["context"] = context
    doc = {
        "workload": workload,
        "injectFailure": {
            "type": "KillWorker",
            "afterCheckpoint": "step-10",
            "targetRank": target_rank,
        },
        "expectations": {
            "resumeFromCheckpoint": "latest",
            "maxRecoveryTime": "10s",
            "maxLostSteps": 100,
        },
        "safety": {"requireConfirm": confirm},
        "timeouts": {"discovery": "5s", "checkpoint": "10s", "recovery": "10s"},
    }
    path = tmp_path / "recovery-test.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def two_jobs(server: FakeApiServer) -> None:
    for job in ("a", "b"):
        controller = InstantController(server, "ns", "pytorchjob", job)
        for rank in range(2):
            pod = controller.template(rank)
            pod["metadata"]["labels"]["team"] = "ml"
            server.create_pod(pod)


def assert_untouched(server: FakeApiServer) -> None:
    assert server.deletes() == [], [(r.name, r.dry_run) for r in server.deletes()]


@pytest.mark.kubernetes
@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("two-jobs", "matches pods of 2 jobs"),
        ("no-such-rank", "target rank 7"),
        ("no-pods", "no pods match"),
    ],
)
def test_an_unsafe_target_is_refused_before_any_delete(
    server: FakeApiServer, tmp_path: Path, case: str, needle: str, figures: Figures
) -> None:
    two_jobs(server)
    selector = {
        "two-jobs": "team=ml",
        "no-such-rank": "training-run=a",
        "no-pods": "training-run=nope",
    }[case]
    config = load_config(
        k8s_yaml(
            tmp_path, server, selector=selector, target_rank=7 if case == "no-such-rank" else 1
        )
    )
    result = run_drill(config, RunOptions(handle_signals=False))
    assert result.verdict is Verdict.ERROR
    assert needle in result.summary
    assert_untouched(server)
    figures.add("interlock_refusals")


@pytest.mark.kubernetes
def test_an_empty_selector_is_refused_by_the_config_and_by_the_adapter(
    server: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], figures: Figures
) -> None:
    path = k8s_yaml(tmp_path, server, selector="  ")
    assert main(["run", "-f", str(path), "--yes"]) == 2
    assert "selector" in capsys.readouterr().err
    from pytest_recoverygate.errors import DiscoveryError
    from pytest_recoverygate.orchestrators.kubernetes import KubernetesOrchestrator

    adapter = KubernetesOrchestrator(
        selector=" ", namespace="ns", kubeconfig=server.write_kubeconfig(tmp_path / "kc")
    )
    with pytest.raises(DiscoveryError, match="empty label selector"):
        adapter.discover(deadline(PROMPT))
    adapter.cleanup()
    assert server.requests == []
    figures.add("interlock_refusals", 2)


@pytest.mark.kubernetes
def test_require_confirm_without_a_terminal_touches_nothing(
    server: FakeApiServer, tmp_path: Path, figures: Figures
) -> None:
    two_jobs(server)
    path = k8s_yaml(tmp_path, server, selector="training-run=a", confirm=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(path)],
        check=False,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=within(JOB),
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "reporter")])),
    )
    assert proc.returncode == 2, proc.stderr
    assert "--yes" in proc.stderr and "Traceback" not in proc.stderr
    assert server.requests == []  # refused before even listing pods
    figures.add("interlock_refusals")


@pytest.mark.kubernetes
def test_a_second_drill_against_the_same_job_is_refused_while_the_first_runs(
    server: FakeApiServer, tmp_path: Path, private_locks: Path, figures: Figures
) -> None:
    job = FakeTrainingJob(server, name="llama", namespace="ns", nodes=2, step_time=0.01)
    job.start()
    try:
        path = k8s_yaml(tmp_path, server, selector=job.selector)
        config = load_config(path)
        # The first drill: another live process holding the job's lock, as run_drill takes it.
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, time\nfrom pytest_recoverygate.shared.lock import DrillLock\n"
                "key = chr(0).join(sys.argv[1:4])\n"
                "lock = DrillLock(key, job='ns/PyTorchJob/llama', config_path=sys.argv[4])\n"
                "lock.acquire(); print('held', flush=True); time.sleep(60)",
                "kubernetes",
                "ns",
                "PyTorchJob/llama",
                "/first/recovery-test.yaml",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(REPO), RECOVERYGATE_LOCK_DIR=str(private_locks)),
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            result = run_drill(config, RunOptions(handle_signals=False))
            assert result.verdict is Verdict.ERROR
            assert (
                f"another drill (pid {holder.pid}, config /first/recovery-test.yaml)"
                in result.summary
            )
            assert "ns/PyTorchJob/llama" in result.summary
            assert_untouched(server)
        finally:
            holder.kill()
            holder.wait()
            assert holder.stdout is not None
            holder.stdout.close()
        # The holder died (SIGKILL): the kernel dropped its lock, the next drill may run.
        again = run_drill(config, RunOptions(handle_signals=False, dry_run=True))
        assert again.verdict is Verdict.DRY_RUN, again.summary
        assert server.deletes(acted_only=True) == []
        assert not any(private_locks.iterdir()), "the lock file outlived the drill"
    finally:
        job.stop()
    figures.add("interlock_refusals")


def test_the_lock_is_exclusive_and_released_on_every_path(private_locks: Path) -> None:
    from pytest_recoverygate.errors import DiscoveryError

    first = DrillLock("k", job="job", config_path="a.yaml")
    second = DrillLock("k", job="job", config_path="b.yaml")
    first.acquire()
    assert json.loads(lock_path("k").read_text())["config"] == "a.yaml"
    with pytest.raises(DiscoveryError, match=rf"pid {os.getpid()}, config a.yaml"):
        second.acquire()
    first.release()
    first.release()  # idempotent
    second.acquire()
    assert DrillLock("other", job="j2", config_path="c").path != second.path
    second.release()
    assert not lock_path("k").exists()


@pytest.mark.kubernetes
def test_the_context_named_in_the_config_is_the_one_used(
    server: FakeApiServer, tmp_path: Path, figures: Figures
) -> None:
    """A kubeconfig whose *current* context points at another cluster: the config's wins."""
    job = FakeTrainingJob(server, name="a", namespace="ns", nodes=2, step_time=0.01).start()
    good = json.loads(server.write_kubeconfig(tmp_path / "good").read_text())
    good["clusters"].append({"name": "prod", "cluster": {"server": "http://127.0.0.1:9"}})
    good["contexts"].append({"name": "prod", "context": {"cluster": "prod", "user": "fake-user"}})
    good["current-context"] = "prod"  # the user's shell points at production
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(good))
    config = load_config(
        k8s_yaml(tmp_path, server, selector="training-run=a", context="fake", kubeconfig=kubeconfig)
    )
    try:
        result = run_drill(config, RunOptions(handle_signals=False, dry_run=True))
    finally:
        job.stop()
    assert result.verdict is Verdict.DRY_RUN, result.summary
    assert server.deletes(acted_only=True) == []
    # A context the kubeconfig does not have: a usage error, nothing sent anywhere.
    requests = len(server.requests)
    missing = load_config(
        k8s_yaml(
            tmp_path, server, selector="training-run=a", context="staging", kubeconfig=kubeconfig
        )
    )
    from pytest_recoverygate.errors import UsageError

    with pytest.raises(UsageError, match="staging"):
        run_drill(missing, RunOptions(handle_signals=False))
    assert len(server.requests) == requests
    figures.add("interlock_refusals")


@pytest.mark.kubernetes
def test_a_dry_run_makes_no_destructive_call_on_kubernetes(
    server: FakeApiServer, tmp_path: Path, figures: Figures
) -> None:
    job = FakeTrainingJob(server, name="llama", namespace="ns", nodes=2, step_time=0.01)
    job.start()
    try:
        config = load_config(k8s_yaml(tmp_path, server, selector=job.selector))
        result = run_drill(config, RunOptions(handle_signals=False, dry_run=True))
    finally:
        job.stop()
    assert result.verdict is Verdict.DRY_RUN
    assert [(r.dry_run, r.acted) for r in server.deletes()] == [(True, False)]
    assert job.replaced == []
    figures.add("dry_runs_checked")


@pytest.mark.local
def test_a_dry_run_makes_no_destructive_call_on_the_local_backend(
    tmp_path: Path, figures: Figures
) -> None:
    config = load_config(local_drill_yaml(tmp_path))
    backend = local_backend(config)
    targets: list[psutil.Process] = []
    original_kill = backend.kill

    def kill(worker: Worker, *, dry_run: bool, fault: Fault = Fault()) -> KillResult:
        targets.append(psutil.Process(int(worker.instance_id.split("@")[0])))
        result = original_kill(worker, dry_run=dry_run, fault=fault)
        assert targets[0].is_running() and targets[0].status() != psutil.STATUS_ZOMBIE
        assert psutil.Process(backend.agent_pid or 0).is_running()
        return result

    backend.kill = kill  # type: ignore[method-assign]
    result = run_drill(config, RunOptions(dry_run=True), orchestrator=backend)
    assert result.verdict is Verdict.DRY_RUN, result.summary
    assert len(targets) == 1
    assert not [e for e in result.timeline if e.kind == "group:worker_gone"]
    figures.add("dry_runs_checked")


Check = Callable[[], None]
