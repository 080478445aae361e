"""What ``pip install recoverygate`` gives a new user, and what a missing package says.

We test these aspects: the Kubernetes client is a dependency of the package (not an
extra), so ``kubectl recoverygate`` works after a plain install; the client is still
imported lazily (``--help`` never pays for it, see test_cli.py); a missing module, in the
Kubernetes backend or anywhere else a drill reaches, is named with the exact pip command
and never shows as a bare ``ModuleNotFoundError``; the two distributions
(``recoverygate-reporter`` ships the ``recoverygate`` package, ``recoverygate`` ships
``pytest_recoverygate`` and depends on the reporter at the same, single-sourced version)
share no file, install into a fresh environment in either order, import, and uninstall
without leaving anything behind; and, end to end (``e2e``), a fresh virtualenv with the
built wheels runs a Kubernetes drill against the fake API server. The README's "Try it"
says what ``scripts/demo`` does: how many drills it runs (and how many more as root), and
what its setup installs as root.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.engine.machine import Verdict
from pytest_recoverygate.errors import describe_exception, pip_command_for
from pytest_recoverygate.orchestrators.fake import FakeOrchestrator
from pytest_recoverygate.registry.seams import SimulatedClock
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.patience import CLUSTER, DRILL, JOB, within

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
        timeout=within(JOB),
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


# ------------------------------------------------------------------- two distributions


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two wheels, built from a copy of this checkout's files (no stale ``build/``
    folder can slip into them) without network (no build isolation)."""
    import shutil

    source = tmp_path_factory.mktemp("source")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True, timeout=within(JOB),
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    folder = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(folder), str(source), str(source / "reporter")],
        check=True, timeout=within(CLUSTER),
    )  # fmt: skip
    return {
        "recoverygate": next(folder.glob("recoverygate-[0-9]*.whl")),
        "recoverygate-reporter": next(folder.glob("recoverygate_reporter-*.whl")),
    }


def wheel_files(wheel: Path) -> set[str]:
    """The installed paths a wheel's RECORD lists (its own .dist-info left out)."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        rows = csv.reader(archive.read(record).decode().splitlines())
        return {row[0] for row in rows if ".dist-info/" not in row[0]}


@pytest.mark.slow  # builds the two wheels
def test_the_version_is_written_once_and_the_reporter_is_pinned_to_it(
    wheels: dict[str, Path],
) -> None:
    import recoverygate

    written = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "pyproject.toml", ROOT / "reporter" / "pyproject.toml",
                     ROOT / "setup.py", ROOT / "reporter" / "recoverygate" / "__init__.py")
        if re.search(r'^_*version_*\s*=\s*"\d', path.read_text(), re.M)
    ]  # fmt: skip
    assert written == ["reporter/recoverygate/__init__.py"]
    version = recoverygate.__version__
    assert importlib.metadata.version("recoverygate") == version
    assert importlib.metadata.version("recoverygate-reporter") == version
    pins = [r for r in importlib.metadata.requires("recoverygate") or [] if "reporter" in r]
    assert pins == [f"recoverygate-reporter=={version}"]
    assert f"-{version}-" in wheels["recoverygate"].name
    assert f"-{version}-" in wheels["recoverygate-reporter"].name


@pytest.mark.slow  # builds the two wheels
def test_the_two_distributions_share_no_file(wheels: dict[str, Path]) -> None:
    main, reporter = (
        wheel_files(wheels["recoverygate"]),
        wheel_files(wheels["recoverygate-reporter"]),
    )
    assert main & reporter == set()
    assert {p.split("/")[0] for p in main} == {"pytest_recoverygate"}
    # the reporter also ships its RECOVERYGATE_AUTO start-up hook, which must sit at the
    # root of site-packages to run (docs/frameworks.md)
    assert {p.split("/")[0] for p in reporter} == {"recoverygate", "recoverygate-auto.pth"}


@pytest.mark.slow  # builds the two wheels
def test_the_wheel_ships_every_docs_page_a_message_links_to(wheels: dict[str, Path]) -> None:
    from tests.test_links import linked_pages

    shipped = wheel_files(wheels["recoverygate"])
    pages = {page for page, _ in linked_pages()}
    assert pages, "the messages link to some page"
    missing = sorted(p for p in pages if f"pytest_recoverygate/docs/{p}" not in shipped)
    assert missing == [], f"linked but not in the wheel: {missing}"


@pytest.fixture
def fresh_env(tmp_path: Path) -> Path:
    """A new virtualenv without pip (this environment's pip installs into it)."""
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    return env_dir / "bin" / "python"


def pip(python: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "-q", *args],
        check=True, timeout=within(CLUSTER), env=env,
    )  # fmt: skip


def site_files(python: Path) -> set[str]:
    """What the environment's site-packages holds, apart from the pip/setuptools it came with."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                               check=True).stdout.strip())  # fmt: skip
    return {
        str(p.relative_to(site)) for p in site.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith("_distutils")
    }  # fmt: skip


@pytest.mark.slow  # two wheels into a fresh virtualenv, twice
@pytest.mark.parametrize(
    "order",
    [("recoverygate-reporter", "recoverygate"), ("recoverygate", "recoverygate-reporter")],
    ids=["reporter-first", "main-first"],
)
def test_both_wheels_install_in_either_order_import_and_uninstall_cleanly(
    wheels: dict[str, Path], fresh_env: Path, order: tuple[str, str]
) -> None:
    python = fresh_env
    before = site_files(python)
    for name in order:  # --no-deps: the point is the files, not the third-party deps
        pip(python, "install", "--no-deps", "--no-index", str(wheels[name]))
    probe = (
        "import recoverygate, recoverygate.reporter, pytest_recoverygate;"
        "print(recoverygate.__version__, pytest_recoverygate.__version__)"
    )
    proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True)
    import recoverygate

    assert proc.stdout.split() == [recoverygate.__version__] * 2
    installed = site_files(python) - before
    expected = wheel_files(wheels["recoverygate"]) | wheel_files(wheels["recoverygate-reporter"])
    assert expected <= installed

    pip(python, "uninstall", "-y", "recoverygate")
    still = subprocess.run([str(python), "-c", "import recoverygate.reporter, recoverygate.wire"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert still.returncode == 0, still.stderr  # the reporter keeps every file it shipped
    pip(python, "uninstall", "-y", "recoverygate-reporter")
    assert site_files(python) == before


# ------------------------------------------------------------------- a fresh venv


@pytest.mark.e2e
@pytest.mark.kubernetes
def test_a_fresh_venv_with_the_built_wheels_runs_a_kubernetes_drill(
    tmp_path: Path, wheels: dict[str, Path]
) -> None:
    """pip install recoverygate (the built wheels; their dependencies from the index), then
    a Kubernetes dry run against the fake API server: the client is there, and the drill
    reaches its verdict."""
    pytest.importorskip("kubernetes")
    from tests.kubernetes.fake_apiserver import FakeApiServer
    from tests.kubernetes.fake_cluster import NAMESPACE, FakeTrainingJob

    wheel = wheels["recoverygate"]
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # nothing of this environment may leak into the fresh one (PYTHONPATH, say)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    subprocess.run(  # recoverygate-reporter comes from the built wheels, the rest from the index
        [str(python), "-m", "pip", "install", "-q", "--find-links", str(wheel.parent), str(wheel)],
        check=True,
        timeout=within(DRILL),
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
                timeout=within(CLUSTER),
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


def _try_it() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("## Try it", 1)[1].split("\n## ", 1)[0]


def test_try_it_says_how_many_drills_the_demo_runs_and_what_it_installs_as_root() -> None:
    """issue 41: it said two drills; as root the demo runs four and installs Chromium."""
    demo = (ROOT / "scripts" / "demo").read_text(encoding="utf-8")
    setup = (ROOT / "scripts" / "setup").read_text(encoding="utf-8")
    drills = re.findall(r"recoverygate\"? run -f (\S+)", demo)
    blocks = demo.split('if [ "$EUID" -eq 0 ]; then')[1:]  # the as-root parts
    root_only = [
        d
        for b in blocks
        for d in re.findall(r"run -f (\S+)", b.split("\nelse", 1)[0].split("\nfi", 1)[0])
    ]
    always = len(drills) - len(root_only)
    assert (always, len(root_only)) == (2, 2), drills
    text = " ".join(_try_it().split())
    assert "**Two real drills**" in text
    assert "**As root, two more**" in text
    for example in root_only:
        assert Path(example).name in text, example
    assert "apt-get install" in setup and "chromium" in setup
    assert "As root** on a machine with `apt-get` and no `chromium`" in text
    assert "several GB" in text
