"""``__all__`` is complete: every public class and function a module defines is exported,
and everything exported exists (the habit of httpx's tests/test_exported_members.py)."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "recoverygate",
    "recoverygate.reporter",
    "recoverygate.wire",
    "pytest_recoverygate",
    "pytest_recoverygate.cli",
    "pytest_recoverygate.config",
    "pytest_recoverygate.diagnosis",
    "pytest_recoverygate.durations",
    "pytest_recoverygate.engine",
    "pytest_recoverygate.errors",
    "pytest_recoverygate.evidence",
    "pytest_recoverygate.joboutput",
    "pytest_recoverygate.events",
    "pytest_recoverygate.lock",
    "pytest_recoverygate.model",
    "pytest_recoverygate.plugin",
    "pytest_recoverygate.report",
    "pytest_recoverygate.runner",
    "pytest_recoverygate.timeline",
    "pytest_recoverygate.orchestrators",
    "pytest_recoverygate.orchestrators.base",
    "pytest_recoverygate.orchestrators.fake",
    "pytest_recoverygate.orchestrators.local",
    "pytest_recoverygate.orchestrators.kubernetes",
    "pytest_recoverygate.orchestrators.slurm",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_complete_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    for member in exported:
        assert hasattr(module, member), f"{name}.__all__ names {member}, which does not exist"
    defined = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == name
        and not attr.startswith("pytest_")  # pytest hooks are found by name, not imported
    }
    missing = sorted(defined - set(exported))
    assert not missing, f"{name}: public but not in __all__: {missing}"
