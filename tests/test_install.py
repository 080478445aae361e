"""What ``pip install recoverygate`` gives a new user, and what a missing package says.

We test these aspects: the Kubernetes client is a dependency of the package (not an
extra), so ``kubectl recoverygate`` works after a plain install; the client is still
imported lazily (``--help`` never pays for it, see test_cli.py); a missing module, in the
Kubernetes backend or anywhere else a drill reaches, is named with the exact pip command
and never shows as a bare ``ModuleNotFoundError``; and, end to end (``e2e``), a fresh
virtualenv with only the built wheel runs a Kubernetes drill against the fake API server.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from pytest_recoverygate.config import load_config
from pytest_recoverygate.engine import Verdict
from pytest_recoverygate.errors import describe_exception, pip_command_for
from pytest_recoverygate.orchestrators.base import SimulatedClock
from pytest_recoverygate.orchestrators.fake import FakeOrchestrator
from pytest_recoverygate.runner import RunOptions, run_drill

ROOT = Path(__file__).resolve().parents[1]
KUBE_DRILL = {
    "workload": {
        "orchestrator": "kubernetes",
        "selector": "training-run=llama",
        "namespace": "default",
    },
    "injectFailure": {"afterCheckpoint": "next"},
    "expectations": {"maxRecoveryTime": "1m"},
    "safety": {"requireConfirm": False},
    "timeouts": {"discovery": "10s"},
}


def test_kubernetes_is_a_dependency_of_recoverygate_not_an_extra() -> None:
    requirements = [Requirement(r) for r in importlib.metadata.requires("recoverygate") or []]
    plain = [r for r in requirements if r.name == "kubernetes" and r.marker is None]
    assert plain, f"kubernetes is not an unconditional dependency: {requirements}"
    assert "35" in str(plain[0].specifier)


def test_the_kubernetes_extra_still_installs_for_old_instructions() -> None:
    extras = importlib.metadata.metadata("recoverygate").get_all("Provides-Extra") or []
    assert "kubernetes" in extras


def test_a_kubernetes_drill_without_the_client_names_the_pip_command(tmp_path: Path) -> None:
    path = tmp_path / "k8s.yaml"
    path.write_text(yaml.safe_dump(KUBE_DRILL))
    blocked = (
        "import sys; sys.modules['kubernetes'] = None; "  # as if it were not installed
        "from pytest_recoverygate.cli import main; sys.exit(main(['run', '-f', sys.argv[1]]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", blocked, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert "pip install 'kubernetes>=35'" in output, output
    assert "ModuleNotFoundError" not in output, output
    assert proc.returncode in (2, 3), output


def test_any_module_missing_during_a_drill_is_named_with_the_pip_command(tmp_path: Path) -> None:
    missing = ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
    config_path = tmp_path / "drill.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "workload": {"orchestrator": "fake"},
                "injectFailure": {"afterCheckpoint": "next"},
                "expectations": {"maxRecoveryTime": "5s"},
                "safety": {"requireConfirm": False},
            }
        )
    )
    clock = SimulatedClock()
    fake = FakeOrchestrator(clock=clock, raise_in={"discover": missing})
    result = run_drill(
        load_config(config_path), RunOptions(handle_signals=False), clock=clock, orchestrator=fake
    )
    assert result.verdict is Verdict.ERROR
    assert "pip install 'recoverygate[plot]'" in result.summary, result.summary
    assert "ModuleNotFoundError" not in result.summary


@pytest.mark.parametrize(
    ("module", "command"),
    [
        ("kubernetes", "pip install 'kubernetes>=35'"),
        ("kubernetes.client.exceptions", "pip install 'kubernetes>=35'"),
        ("matplotlib.pyplot", "pip install 'recoverygate[plot]'"),
        ("yaml", "pip install pyyaml"),
        ("tenacity", "pip install tenacity"),
    ],
)
def test_each_missing_module_maps_to_its_pip_command(module: str, command: str) -> None:
    assert pip_command_for(module) == command
    text = describe_exception(ModuleNotFoundError(f"No module named {module!r}", name=module))
    assert text.endswith(command)
    assert "is not installed" in text


# ------------------------------------------------------------------- a fresh venv


@pytest.mark.e2e
@pytest.mark.kubernetes
def test_a_fresh_venv_with_the_built_wheel_runs_a_kubernetes_drill(tmp_path: Path) -> None:
    """pip install recoverygate (the built wheel, nothing else), then a Kubernetes dry run
    against the fake API server: the client is there, and the drill reaches its verdict."""
    pytest.importorskip("kubernetes")
    from tests.kube.fake_apiserver import FakeApiServer
    from tests.kube.fake_cluster import NAMESPACE, FakeTrainingJob

    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        timeout=300,
    )
    wheel = next(wheels.glob("recoverygate-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # nothing of this environment may leak into the fresh one (PYTHONPATH, say)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    cli = env_dir / "bin" / "kubectl-recoverygate"
    assert cli.exists()

    with FakeApiServer(bookmark_interval=0.5) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)
        job = FakeTrainingJob(server, nodes=2, step_time=0.02)
        try:
            job.start(wait_for_checkpoint=10)
            drill = {
                **KUBE_DRILL,
                "workload": {
                    "orchestrator": "kubernetes",
                    "selector": job.selector,
                    "namespace": NAMESPACE,
                    "kubeconfig": str(kubeconfig),
                },
            }
            path = tmp_path / "k8s.yaml"
            path.write_text(yaml.safe_dump(drill))
            report = tmp_path / "report.json"
            proc = subprocess.run(
                [str(cli), "run", "-f", str(path), "--dry-run", "-q", "--report", str(report)],
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
                env=env,
                cwd=tmp_path,
            )
        finally:
            job.stop()
    output = proc.stdout + proc.stderr
    assert "No module named" not in output, output
    assert proc.returncode == 0, output
    assert json.loads(report.read_text())["verdict"] == "DRY-RUN"
