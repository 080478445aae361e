"""RecoveryGate: chaos drills for distributed training, as a pytest plugin and a CLI.

The public API is small: :func:`run_drill` (what the CLI and the plugin call),
:func:`load_config`, the result types and the error tree. Importing this package is
cheap; the backends and pydantic load only when a drill runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recoverygate import __version__

__all__ = [
    "Check",
    "DrillResult",
    "FailureReason",
    "RunOptions",
    "Verdict",
    "__version__",
    "load_config",
    "run_drill",
]

if TYPE_CHECKING:
    from pytest_recoverygate.config.loading import load_config
    from pytest_recoverygate.engine.machine import Check, DrillResult, FailureReason, Verdict
    from pytest_recoverygate.runner import RunOptions, run_drill

_LAZY = {
    "Check": "pytest_recoverygate.engine.machine",
    "DrillResult": "pytest_recoverygate.engine.machine",
    "FailureReason": "pytest_recoverygate.engine.machine",
    "Verdict": "pytest_recoverygate.engine.machine",
    "RunOptions": "pytest_recoverygate.runner",
    "run_drill": "pytest_recoverygate.runner",
    "load_config": "pytest_recoverygate.config.loading",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_recoverygate' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
