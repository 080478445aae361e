"""RecoveryGate's training-side package: ``from recoverygate import reporter``.

Kept empty on purpose: importing it must cost nothing inside a training job.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
