"""Loading a drill config: YAML -> a validated DrillConfig, errors with file:line:key."""

from __future__ import annotations

__all__: list[str] = []
