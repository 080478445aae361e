"""The local backend: a torchrun job on this machine, launched or attached to (docs/local.md).

- :mod:`.processes`: process instances by pid and start time, signals through pidfds;
- :mod:`.torchrun`: what torchrun's command line and output say (pure);
- :mod:`.orchestrator`: :class:`LocalOrchestrator`, the drill's four methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.local.orchestrator import (
        DRILL_MARKER,
        LocalOrchestrator,
    )

__all__ = ["DRILL_MARKER", "LocalOrchestrator"]


def __getattr__(name: str) -> Any:
    if name in __all__:  # imported on first use: it pulls in psutil
        from pytest_recoverygate.orchestrators.local import orchestrator

        return getattr(orchestrator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
