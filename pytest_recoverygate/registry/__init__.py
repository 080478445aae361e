"""The backend registry: a lazy name -> module map, plus the ``recoverygate.backends``
entry-point group.

Each backend is a module (or package) exporting one
:class:`~pytest_recoverygate.registry.seams.Backend` object named ``BACKEND``. The
built-in ones are listed here by module path and imported only when a config names them
(or when an error message needs every backend's keys), so ``recoverygate --help`` and the
unit tests never pay for ``kubernetes`` or ``psutil``. A third-party backend installs like
a pytest plugin: its distribution declares ::

    [project.entry-points."recoverygate.backends"]
    mybackend = "my_backend:BACKEND"

and ``orchestrator: mybackend`` works, with its keys validated and its errors worded like
a built-in backend's (docs/backends.md). Nothing else names a backend: the config schema,
the runner and the drill lock ask the registry.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import warnings
from types import ModuleType
from typing import Any

from pytest_recoverygate.errors import UsageError
from pytest_recoverygate.links import docs_link
from pytest_recoverygate.registry import seams
from pytest_recoverygate.registry.seams import *  # noqa: F403
from pytest_recoverygate.registry.seams import Backend

__all__ = [  # noqa: PLE0604
    *seams.__all__,
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "all_backends",
    "backend_names",
    "get_backend",
]

#: The built-in backends: name -> the module whose ``BACKEND`` it is (imported lazily).
BUILTIN: dict[str, str] = {
    "fake": "pytest_recoverygate.orchestrators.fake",
    "local": "pytest_recoverygate.orchestrators.local",
    "kubernetes": "pytest_recoverygate.orchestrators.kubernetes",
    "slurm": "pytest_recoverygate.orchestrators.slurm",
    "ray": "pytest_recoverygate.orchestrators.ray",
}
#: The entry-point group third-party backends register under.
ENTRY_POINT_GROUP = "recoverygate.backends"


def _where(entry: importlib.metadata.EntryPoint) -> str:
    dist = entry.dist
    origin = f"distribution {dist.name} {dist.version}" if dist is not None else "an entry point"
    return f"{entry.name} = {entry.value!r} of {origin}"


@functools.cache
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The third-party backends installed, by name (not imported)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for entry in sorted(
        importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name
    ):
        taken = "a built-in backend" if entry.name in BUILTIN else None
        if entry.name in found:
            taken = _where(found[entry.name])
        if taken is not None:
            warnings.warn(
                f"recoverygate: the backend {_where(entry)} is ignored: {entry.name!r} is "
                f"already {taken}; rename its entry point or uninstall one of them",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        found[entry.name] = entry
    return found


def backend_names() -> tuple[str, ...]:
    """Every backend a config may name: the built-in ones, then the installed ones by name."""
    return (*BUILTIN, *_entry_points())


@functools.cache
def get_backend(name: str) -> Backend[Any]:
    """The backend called ``name``, imported now; UsageError saying why it cannot be had."""
    if name in BUILTIN:
        found: Any = importlib.import_module(BUILTIN[name])
        where = f"the built-in module {BUILTIN[name]}"
    else:
        entry = _entry_points().get(name)
        if entry is None:
            raise UsageError(
                f"no backend is called {name!r}; installed: {', '.join(backend_names())}"
            )
        where = f"the entry point {_where(entry)}"
        try:
            found = entry.load()
        except Exception as exc:  # a broken plugin: say which one, and what it raised
            raise UsageError(
                f"the backend {name!r} could not be loaded from {where}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
    if isinstance(found, ModuleType):
        found = getattr(found, "BACKEND", None)
    if not isinstance(found, Backend) or found.name != name:
        raise UsageError(
            f"{where} does not give a Backend named {name!r} (it gives {found!r}); "
            f"export BACKEND = Backend(name=..., ...) as {docs_link('backends.md')} shows"
        )
    return found


def all_backends() -> dict[str, Backend[Any]]:
    """Every backend that can be loaded, by name (error messages and docs list them all)."""
    loaded: dict[str, Backend[Any]] = {}
    for name in backend_names():
        try:
            loaded[name] = get_backend(name)
        except UsageError:
            continue  # said when a config names it
    return loaded
