"""The backend registry: every backend is one entry, found by name, and nothing else names it.

We test these aspects:

- the built-in backends are listed in order, each entry's workload model answers to its
  name, and importing an entry costs neither ``kubernetes`` nor ``psutil``;
- a name nobody registered, a broken entry point, an entry point that gives something
  other than its Backend, and one that reuses a taken name are each refused or ignored
  with a message naming the entry point and the fix;
- faults: the types a drill may name come from what the installed backends declare; a
  refusal uses the backend's own words when it has them (Kubernetes and HangWorker), else
  names the backends that can (the message of SLURM-only faults, byte for byte);
- lock scopes and restart budgets as each backend declares them, and the runner handing
  the budget to the engine;
- the package names no backend outside its own folder (config, schema, runner, lock).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate import registry as orchestrators
from pytest_recoverygate.config.schema import (
    DrillConfig,
    Expectations,
    InjectFailure,
    fault_refusal,
    fault_types,
)
from pytest_recoverygate.engine.model import Worker, Workload
from pytest_recoverygate.errors import UsageError
from pytest_recoverygate.orchestrators.fake import FakeOrchestrator
from pytest_recoverygate.orchestrators.local import LocalWorkload
from pytest_recoverygate.registry import (
    BUILTIN,
    ENTRY_POINT_GROUP,
    Backend,
    all_backends,
    backend_names,
    get_backend,
)
from pytest_recoverygate.runner import RunOptions, run_drill
from pytest_recoverygate.shared.lock import LockScope
from tests.patience import JOB, within

ROOT = Path(__file__).resolve().parents[1]
NOT_A_BACKEND = object()


def test_the_builtin_backends_are_listed_in_order_and_answer_to_their_names() -> None:
    assert backend_names()[:4] == ("fake", "local", "kubernetes", "slurm")
    for name in BUILTIN:
        backend = get_backend(name)
        assert isinstance(backend, Backend)
        assert backend.name == name
        assert backend.workload.model_fields["orchestrator"].annotation is not str
        assert backend.workload(orchestrator=name, **_required(name)).orchestrator == name


def _required(name: str) -> dict[str, Any]:
    required: dict[str, dict[str, Any]] = {
        "fake": {},
        "local": {"command": ["torchrun", "t.py"]},
        "kubernetes": {"selector": "a=b"},
        "slurm": {"job_id": 1},
        "ray": {"entrypoint": ["python", "train_ray.py"]},
    }
    return required[name]


def test_importing_the_entries_imports_no_cluster_client_and_no_psutil() -> None:
    code = (
        "import sys\n"
        "from pytest_recoverygate.registry import get_backend\n"
        "for name in ('fake', 'local', 'kubernetes', 'slurm'): get_backend(name)\n"
        "print(sorted(m for m in ('kubernetes', 'psutil', 'urllib3') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=within(JOB),
    )
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_a_name_nobody_registered_is_refused_with_the_installed_ones() -> None:
    with pytest.raises(UsageError, match=r"no backend is called 'docker'; installed: fake, local"):
        get_backend("docker")


@pytest.fixture
def entry_points(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[importlib.metadata.EntryPoint]]:
    """Entry points of the ``recoverygate.backends`` group, as a test declares them."""
    declared: list[importlib.metadata.EntryPoint] = []

    def fake_entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        assert group == ENTRY_POINT_GROUP
        return declared

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    orchestrators._entry_points.cache_clear()
    get_backend.cache_clear()
    yield declared
    orchestrators._entry_points.cache_clear()
    get_backend.cache_clear()


def test_a_broken_entry_point_is_named_with_what_it_raised(
    entry_points: list[importlib.metadata.EntryPoint],
) -> None:
    entry_points.append(
        importlib.metadata.EntryPoint(
            "broken", "no_such_module_anywhere:BACKEND", ENTRY_POINT_GROUP
        )
    )
    assert "broken" in backend_names()
    with pytest.raises(UsageError) as caught:
        get_backend("broken")
    message = str(caught.value)
    assert "'no_such_module_anywhere:BACKEND'" in message
    assert "ModuleNotFoundError" in message
    assert "broken" not in all_backends()  # the others still load


def test_an_entry_point_that_gives_no_backend_says_what_to_export(
    entry_points: list[importlib.metadata.EntryPoint],
) -> None:
    entry_points.append(
        importlib.metadata.EntryPoint("odd", "tests.test_registry:NOT_A_BACKEND", ENTRY_POINT_GROUP)
    )
    with pytest.raises(UsageError, match=r"does not give a Backend named 'odd'.*BACKEND = Backend"):
        get_backend("odd")


def test_an_entry_point_that_takes_a_builtin_name_is_ignored_with_a_warning(
    entry_points: list[importlib.metadata.EntryPoint],
) -> None:
    entry_points.append(
        importlib.metadata.EntryPoint(
            "slurm", "tests.test_registry:NOT_A_BACKEND", ENTRY_POINT_GROUP
        )
    )
    with pytest.warns(RuntimeWarning, match="'slurm' is already a built-in backend"):
        names = backend_names()
    assert names == ("fake", "local", "kubernetes", "slurm", "ray")
    assert get_backend("slurm").workload.__name__ == "SlurmWorkload"


def test_a_config_naming_a_broken_backend_gets_a_file_line_error(
    entry_points: list[importlib.metadata.EntryPoint], tmp_path: Path
) -> None:
    from pytest_recoverygate.config.loading import parse_config
    from pytest_recoverygate.errors import ConfigError

    entry_points.append(
        importlib.metadata.EntryPoint(
            "broken", "no_such_module_anywhere:BACKEND", ENTRY_POINT_GROUP
        )
    )
    text = (
        "workload:\n  orchestrator: broken\n"
        "injectFailure: {afterCheckpoint: next}\nexpectations: {maxRecoveryTime: 5m}\n"
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(text, tmp_path / "drill.yaml")
    line = str(caught.value)
    assert line.startswith(f"{tmp_path / 'drill.yaml'}:2: workload.orchestrator: cannot be used: ")
    assert "— got broken; allowed: fake, local, kubernetes, slurm, ray, broken" in line


# ------------------------------------------------------------------ faults


def test_the_fault_types_a_drill_may_name_are_what_the_backends_declare() -> None:
    common = {"KillWorker", "KillDuringCheckpoint", "Preempt", "HangWorker"}
    node = {"KillNode", "PartitionNode"}
    assert set(fault_types()) >= common | {"KillStep", "Requeue"} | node | {"DrainNode"}
    storage = {"StorageFault"}
    at_rest = storage | {"KillDuringRecovery", "StickyFault"}
    assert get_backend("slurm").faults == common | {"KillStep", "Requeue", "KillNode"} | at_rest
    assert get_backend("fake").faults == common | node
    assert get_backend("local").faults == common | node | at_rest
    assert get_backend("ray").faults == common | {"KillNode"} | storage
    assert get_backend("kubernetes").faults == (common - {"HangWorker"}) | {
        "KillNode",
        "DrainNode",
        "KillDuringRecovery",
    }


ALLOWED = {
    "fake": "KillWorker, KillDuringCheckpoint, Preempt, HangWorker, KillNode or PartitionNode",
    "local": "KillWorker, KillDuringCheckpoint, Preempt, HangWorker, KillNode, PartitionNode, "
    "StorageFault, KillDuringRecovery or StickyFault",
    "kubernetes": "KillWorker, KillDuringCheckpoint, Preempt, KillNode, DrainNode or "
    "KillDuringRecovery",
}


@pytest.mark.parametrize("name", ["fake", "local", "kubernetes"])
@pytest.mark.parametrize("fault", ["KillStep", "Requeue"])
def test_a_slurm_only_fault_elsewhere_names_slurm(name: str, fault: str) -> None:
    assert fault_refusal(name, fault) == (
        f"{fault} needs orchestrator: slurm (this drill uses {name})",
        f"{ALLOWED[name]} with this orchestrator",
        "use type: KillWorker",
    )
    assert fault_refusal("slurm", fault) is None


def test_a_backend_refuses_a_fault_in_its_own_words() -> None:
    problem, allowed, hint = fault_refusal("kubernetes", "HangWorker") or ("", "", "")
    assert problem.startswith("HangWorker cannot be injected on kubernetes: ")
    assert "pods-only RBAC" in problem
    assert (allowed, hint) == (
        f"{ALLOWED['kubernetes']} with this orchestrator",
        "use type: KillWorker",
    )
    problem, _, _ = fault_refusal("kubernetes", "StorageFault") or ("", "", "")
    assert problem.startswith("StorageFault cannot be injected on kubernetes yet: ")
    assert "host folder (hostPath) of the node the drill runs on" in problem


# ------------------------------------------------------------------ locks and budgets


def test_each_backend_says_what_its_drill_lock_covers() -> None:
    workload = Workload("PyTorchJob/llama", (Worker(0, "p0", "u0"), Worker(1, "p1", "u1")))
    target = Worker(1, "p1", "u1", details=(("namespace", "ml"),))
    assert get_backend("fake").lock_scope(workload, target) is None
    assert get_backend("kubernetes").lock_scope(workload, target) == LockScope(
        "PyTorchJob/llama", namespace="ml"
    )
    for name in ("local", "slurm"):
        assert get_backend(name).lock_scope(workload, target) == LockScope("PyTorchJob/llama")


def test_only_the_local_backend_reads_the_jobs_restart_budget() -> None:
    local = get_backend("local")
    launched = LocalWorkload(
        orchestrator="local", command=["torchrun", "--max-restarts=3", "train.py"]
    )
    assert local.restart_budget(launched) == 3
    assert local.restart_budget(LocalWorkload(orchestrator="local", attach_pid=42)) is None
    kube = get_backend("kubernetes")
    assert kube.restart_budget(kube.workload(orchestrator="kubernetes", selector="a=b")) is None


def test_the_runner_hands_the_backends_restart_budget_to_the_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from pytest_recoverygate.engine.machine import DrillEngine
    from pytest_recoverygate.registry.seams import SimulatedClock

    seen: list[int | None] = []
    original = DrillEngine.discovered

    def discovered(self: DrillEngine, now: float, detail: str, **kwargs: Any) -> None:
        seen.append(kwargs.get("restart_budget"))
        original(self, now, detail, **kwargs)

    monkeypatch.setattr(DrillEngine, "discovered", discovered)
    config = DrillConfig(
        workload=LocalWorkload(
            orchestrator="local",
            command=["torchrun", "--max-restarts", "4", "t.py"],
            workdir=tmp_path,
        ),
        inject_failure=InjectFailure(after_checkpoint=40),
        expectations=Expectations(max_recovery_time=3),
        source_path=tmp_path / "drill.yaml",
    )
    clock = SimulatedClock()
    run_drill(
        config,
        RunOptions(confirmed=True, handle_signals=False),
        clock=clock,
        orchestrator=FakeOrchestrator(clock=clock),
    )
    assert seen == [4]


# ------------------------------------------------------------------ nothing else names one


def test_no_module_outside_a_backends_folder_names_a_backend() -> None:
    """The config, the schema, the runner and the lock ask the registry; the only list of
    built-in backends is the registry's lazy name -> module map."""
    names = re.compile(r"\b(fake|local|kubernetes|slurm)\b['\"]")
    package = ROOT / "pytest_recoverygate"
    offenders = []
    for module in (
        "config/loading.py",
        "config/schema.py",
        "runner.py",
        "shared/lock.py",
        "engine/machine.py",
        "cli.py",
    ):
        for number, line in enumerate((package / module).read_text().splitlines(), 1):
            example = "e.g. orchestrator:" in line or "{orchestrator: fake}" in line
            if names.search(line) and not example:  # examples in messages may name one
                offenders.append(f"{module}:{number}: {line.strip()}")
    assert offenders == []
