"""Secrets stay out of logs and reports; files are not world-writable; no shell, no unsafe YAML.

We test these aspects:
- a local drill whose job env holds RECOVERYGATE_TEST_SECRET: the value appears in none of
  report.json, events.jsonl, summary.md, nor the CLI's output; every file the report
  directory holds is not world-writable;
- a Kubernetes drill with a bearer token in the kubeconfig: the token appears in no
  report file and no output. On the fake API server, which answers 401 to any request
  without that exact token, so the drill's PASS shows the token was sent: nothing here
  needs a server that misbehaves on cue, it is on the fake only to run without a cluster;
- the source tree has no ``shell=True``, no ``os.system``/``os.popen`` and no
  ``yaml.load(`` without a safe loader.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.kubernetes.fake_cluster import FakeTrainingJob
from tests.patience import JOB, within
from tests.reliability.conftest import Figures
from tests.reliability.test_cleanup_local import drill_yaml as local_drill_yaml

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-value-7f3a9c1e"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.tok3n-b7c2d9"


def run_cli(config: Path, report_dir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "reporter")]))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_recoverygate.cli",
            "run",
            "-f",
            str(config),
            "--report-dir",
            str(report_dir),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=within(JOB),
        env=env,
        stdin=subprocess.DEVNULL,
    )


def assert_clean(report_dir: Path, proc: subprocess.CompletedProcess[str], secret: str) -> None:
    files = [p for p in report_dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"report.json", "events.jsonl", "summary.md"}
    for path in files:
        assert secret.encode() not in path.read_bytes(), f"{secret} leaked into {path.name}"
        mode = path.stat().st_mode
        assert not mode & stat.S_IWOTH, f"{path.name} is world-writable ({oct(mode)})"
    assert secret not in proc.stdout + proc.stderr


@pytest.mark.slow  # a drill on real local processes and its reports (about 4 s)
@pytest.mark.local
def test_job_env_secrets_reach_no_report_and_no_output(tmp_path: Path, figures: Figures) -> None:
    config = local_drill_yaml(tmp_path, extra_env={"RECOVERYGATE_TEST_SECRET": SECRET})
    proc = run_cli(config, tmp_path / "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_clean(tmp_path / "report", proc, SECRET)
    figures.add("drills_run")


@pytest.mark.slow  # a drill on the fake API server and its reports (about 6 s)
@pytest.mark.kubernetes
def test_a_kubeconfig_token_reaches_no_report_and_no_output(
    tmp_path: Path, figures: Figures
) -> None:
    with FakeApiServer(token=TOKEN) as server:
        job = FakeTrainingJob(server, name="llama", namespace="ns", nodes=2, step_time=0.01)
        job.start()
        try:
            kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
            doc = {
                "workload": {
                    "orchestrator": "kubernetes",
                    "selector": job.selector,
                    "namespace": "ns",
                    "kubeconfig": str(kubeconfig),
                },
                "injectFailure": {"type": "KillWorker", "afterCheckpoint": "step-10"},
                "expectations": {
                    "resumeFromCheckpoint": "latest",
                    "maxRecoveryTime": "10s",
                    "maxLostSteps": 100,
                    "sustain": "1s",
                },
                "safety": {"requireConfirm": False},
            }
            config = tmp_path / "recovery-test.yaml"
            config.write_text(yaml.safe_dump(doc))
            proc = run_cli(config, tmp_path / "report")
        finally:
            job.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_clean(tmp_path / "report", proc, TOKEN)
    figures.add("drills_run")


UNSAFE = [
    (re.compile(r"shell\s*=\s*True"), "shell=True"),
    (re.compile(r"\bos\.(system|popen)\s*\("), "os.system/os.popen"),
    (
        re.compile(r"\byaml\.load\((?![^)]*(SafeLoader|CSafeLoader))"),
        "yaml.load without SafeLoader",
    ),
    (re.compile(r"\byaml\.(unsafe_load|full_load)\s*\("), "yaml.unsafe_load/full_load"),
]


def test_the_source_tree_has_no_shell_and_no_unsafe_yaml() -> None:
    roots = [
        REPO / "pytest_recoverygate",
        REPO / "reporter" / "recoverygate",
        REPO / "scripts",
        REPO / "examples",
    ]
    me = Path(__file__).resolve()
    hits = []
    for root in roots:
        for path in root.rglob("*"):
            if not path.is_file() or path.resolve() == me or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            for pattern, what in UNSAFE:
                for match in pattern.finditer(text):
                    line = text.count("\n", 0, match.start()) + 1
                    hits.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert hits == []
