"""Fixtures shared by the unit tests: drill configs written to disk, fake backends."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.config.loading import DrillConfig, load_config
from tests import patience
from tests.recorded_drills import RECORD_ENV, TWINS, record

# One Slurm cluster and one Kubernetes cluster per session, for all folders.
pytest_plugins = ["tests.slurm.cluster_fixture", "tests.kubernetes.kube_cluster"]

#: Under ``pytest -n N`` (pytest-xdist, ``--dist loadgroup``: scripts/test) tests that
#: share one machine-wide thing run in one worker, one after another: the session's Slurm
#: cluster (one per worker process otherwise), the Ray clusters, torchft's lighthouses.
XDIST_GROUPS = ("slurm", "ray", "torchft")

#: Modules whose tests share something that takes seconds to make, by worker group: under
#: ``-n`` each group runs in one worker, so it is made once, not in every worker that gets
#: one of its tests. Module-scoped fixtures: report folders of real fake-backend drills, a
#: pip install; and the import of transformers' and Lightning's Trainers (torch and all).
ONE_WORKER = {
    "tests/test_compare.py": "compare-reports",
    "tests/test_history.py": "history-reports",
    "tests/test_html_report.py": "html-reports",
    "tests/test_plugin_baseline.py": "baseline-reports",
    "tests/backends/test_outoftree_backend.py": "outoftree-install",
    "tests/integrations/test_callbacks.py": "frameworks",
    "tests/integrations/test_exported.py": "frameworks",
}

ROOT = Path(__file__).resolve().parent.parent


def xdist_group(item: pytest.Item) -> str | None:
    """The worker group of a test (None: any worker). scripts/test runs the drills one at
    a time (no xdist); under ``-n`` every drill goes to the ``drills`` group all the same."""
    shared = next((g for g in XDIST_GROUPS if item.get_closest_marker(g) is not None), None)
    path = item.path.resolve()
    where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else ""
    if item.get_closest_marker("kube_cluster") is not None:
        return "kube_cluster"  # drills or not: one worker, one cluster per session
    if item.get_closest_marker("e2e") is not None:
        return "drills"
    if shared is None and where.startswith("tests/contract/"):
        return "contract"  # one worker builds each backend's jobs once (module scope)
    if shared is None and where in ONE_WORKER:
        return ONE_WORKER[where]
    return shared


def pytest_report_header() -> str:
    """How long this run's waits are stretched (tests/patience.py)."""
    return f"patience: {patience.describe()}"


def pytest_configure(config: pytest.Config) -> None:
    """Each xdist worker keeps its drill locks apart (RECOVERYGATE_LOCK_DIR, inherited by the
    drills it starts): the tests' jobs share names (the fake cluster's ``ns/llama``), and
    a drill in the other worker holding that job's lock is not what a test is about."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is not None and "RECOVERYGATE_LOCK_DIR" not in os.environ:
        folder = Path(tempfile.gettempdir()) / f"recoverygate-locks-{os.getpid()}-{worker}"
        folder.mkdir(mode=0o700, exist_ok=True)
        os.environ["RECOVERYGATE_LOCK_DIR"] = str(folder)
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Collect garbage after each drill (its fixtures are finalised by now): a pipe or file
    a drill or the code it drove left open is then reported on that drill, not on whichever
    later test the collector happened to run in. Only where processes run (e2e, slow): a
    collection per unit test would cost the quick lane a minute."""
    if item.get_closest_marker("e2e") or item.get_closest_marker("slow"):
        gc.collect()


#: Report folders of failed drills kept in this session (printed at its end).
KEPT_DRILLS: list[Path] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Each test starts with no drill folders of its own (tests/cli_drill.py: RAN)."""
    drills = sys.modules.get("tests.cli_drill")
    if drills is not None:
        drills.RAN.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A test that ran drills (tests/cli_drill.py) and failed keeps their report folders,
    transcript and all, and says where: ``recoverygate rejudge FOLDER`` then tells an
    engine bug (it reproduces) from timing (it does not). No test is run again."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    drills = sys.modules.get("tests.cli_drill")
    if drills is None or not drills.RAN:
        return
    if report.passed and report.when == "call" and os.environ.get(RECORD_ENV):
        if item.nodeid in TWINS:  # scripts/test --record-twins (tests/recorded_drills.py)
            record(item.nodeid, list(drills.RAN), report.duration)
        return
    if not report.failed or report.when == "teardown":
        return
    kept = drills.keep_folders(item.nodeid, ROOT)
    KEPT_DRILLS.extend(kept)
    if kept:
        report.sections.append(
            (
                "recoverygate: the report folders of this test's drills, kept",
                "\n".join(f"{path}\n  recoverygate rejudge {path}" for path in kept),
            )
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if KEPT_DRILLS:
        terminalreporter.section("recoverygate: failed drills kept")
        for path in KEPT_DRILLS:
            terminalreporter.write_line(f"{path}  (recoverygate rejudge {path})")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Add the marks that follow from where a test runs as it is collected, before any
    ``pytest_collection_modifyitems``: pytest-xdist's reads ``xdist_group`` there (in a
    worker it runs before this file's hooks, so the groups added there were never seen:
    each worker brought up a Slurm cluster of its own), and ``-m`` deselects there."""
    if "slurm_cluster" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("e2e"):
        # On the session's real Slurm cluster: its bring-up alone takes seconds (3-25 s on
        # 2 busy cores), and the quick lane starts no daemons (on a fresh clone it installs
        # no Slurm either); the whole suite runs these.
        item.add_marker(pytest.mark.slow)
    if "kube_cluster" in getattr(item, "fixturenames", ()):
        # On the session's real Kubernetes cluster (tests/kubernetes/kube_cluster.py): its
        # bring-up takes 25-110 s, and the quick lane starts no cluster.
        item.add_marker(pytest.mark.kube_cluster)
    if item.get_closest_marker("kube_cluster") is not None and not item.get_closest_marker("e2e"):
        # A test on the real cluster runs in the drill lanes, with the cluster's drills (one
        # cluster, brought up beside the tests before them: scripts/test).
        item.add_marker(pytest.mark.e2e)
    if item.nodeid in TWINS:
        # A twin: its verdict is re-decided from its recording in the quick lane
        # (tests/test_drill_recordings.py); the drill lanes leave its live run out.
        item.add_marker(pytest.mark.recorded)
    group = xdist_group(item)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker sends the ids it collected
def pytest_collection_finish(session: pytest.Session) -> None:
    """``--dist loadgroup``: pytest-xdist tells its controller a test's group by a suffix on
    the test's id (``...::test_it@slurm``), which its worker writes to ``item._nodeid``.
    pytest 9.2 keeps the id in ``item._id``, so that write changes nothing and no test was
    grouped (pytest-xdist issue 1386, open): carry the suffix over to the id. Without the
    worker's ``loadgroup`` option, or once xdist writes the id itself, this does nothing."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # before pytest 9.2 xdist's write is the id
        return
    for item in session.items:
        legacy = item.__dict__.get("_nodeid")
        if isinstance(legacy, str) and legacy != item.nodeid:
            item._id = NodeId.parse(legacy)


FAKE_DRILL: dict[str, Any] = {
    "workload": {
        "orchestrator": "fake",
        "fake": {
            "workers": 2,
            "stepsPerSecond": 100,
            "checkpointEvery": 20,
            "restartDelay": "500ms",
            "resume": "latest",
        },
    },
    "injectFailure": {"type": "KillWorker", "afterCheckpoint": "step-40"},
    # A sustain window of 3 progress lines, not the default 10 s: these drills are about
    # the verdict, the report and the plugin, not how long a job trains on (the fake job's
    # steps are steady), and each second of it held every real-clock drill of the quick
    # lane that much longer. The tests of the window set their own.
    "expectations": {
        "resumeFromCheckpoint": "latest",
        "maxRecoveryTime": "2s",
        "maxLostSteps": 40,
        "sustain": "3 steps",
    },
    "safety": {"requireConfirm": False},
    "timeouts": {"recovery": "5s"},
}


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


@pytest.fixture
def write_drill(tmp_path: Path) -> Callable[..., Path]:
    """Write a fake-backend drill YAML (with nested changes) and return its path."""

    def write(changes: dict[str, Any] | None = None, name: str = "recovery-test.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(merge(FAKE_DRILL, changes or {}), sort_keys=False))
        return path

    return write


@pytest.fixture
def fake_config(write_drill: Callable[..., Path]) -> Callable[..., DrillConfig]:
    """A loaded fake-backend drill config (with nested changes)."""

    def make(changes: dict[str, Any] | None = None) -> DrillConfig:
        return load_config(write_drill(changes))

    return make
