"""Kept for backends written against this path: everything here is
pytest_recoverygate.registry.seams's (docs/backends.md).
"""

from __future__ import annotations

from pytest_recoverygate.registry.seams import *  # noqa: F403
from pytest_recoverygate.registry.seams import __all__ as __all__  # noqa: PLC0414
