"""Kept for backends written against this path: everything here is
pytest_recoverygate.registry's (docs/backends.md).
"""

from __future__ import annotations

from pytest_recoverygate.registry import *  # noqa: F403
from pytest_recoverygate.registry import __all__ as __all__
