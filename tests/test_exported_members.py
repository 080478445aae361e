"""``__all__`` is complete: every public class and function a module defines is exported,
and everything exported exists (the habit of httpx's tests/test_exported_members.py)."""

from __future__ import annotations

import importlib
import inspect

import pytest


def _modules() -> list[str]:
    """Every module of both packages: a new module is covered without being listed."""
    import pkgutil

    import recoverygate

    import pytest_recoverygate

    names = []
    for package in (recoverygate, pytest_recoverygate):
        names.append(package.__name__)
        names += [
            info.name
            for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")
        ]
    return sorted(names)


MODULES = _modules()


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
