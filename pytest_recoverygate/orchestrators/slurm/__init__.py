"""The SLURM backend: a running SLURM job, three recovery layouts (docs/slurm.md).

- :mod:`.parsing`: what the Slurm clients and the node scripts print, read (pure);
- :mod:`.commands`: running the clients (timeouts, retries, destructive commands once);
- :mod:`.events`: the job's output file tailed into training events;
- :mod:`.orchestrator`: :class:`SlurmOrchestrator`, the drill's four methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.slurm.orchestrator import SlurmOrchestrator

__all__ = ["SlurmOrchestrator"]


def __getattr__(name: str) -> Any:
    if name == "SlurmOrchestrator":  # imported on first use: it pulls in subprocess & co.
        from pytest_recoverygate.orchestrators.slurm.orchestrator import SlurmOrchestrator

        return SlurmOrchestrator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
