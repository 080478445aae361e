"""The pictures' common ground: whether matplotlib (the optional ``plot`` extra) is there,
and writing a figure as a PNG and an SVG (the timeline and the decision pictures)."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Any

from pytest_recoverygate.shared.safefiles import write_safely

__all__ = ["plotting_available", "save_pictures"]


def plotting_available() -> bool:
    """True when matplotlib can be imported (without importing it)."""
    return importlib.util.find_spec("matplotlib") is not None


def save_pictures(fig: Any, directory: Path, stem: str) -> list[Path]:
    """Write ``fig`` as ``stem.png`` and ``stem.svg`` in ``directory`` (made when missing),
    owner-only, through no link planted at their names (drawn into memory, then written by
    :func:`~pytest_recoverygate.shared.safefiles.write_safely`); the figure is closed
    whatever happens."""
    import matplotlib.pyplot as plt

    try:
        paths = []
        for suffix in ("png", "svg"):
            buffer = io.BytesIO()
            fig.savefig(buffer, format=suffix)
            paths.append(write_safely(directory, f"{stem}.{suffix}", buffer.getvalue()))
    finally:
        plt.close(fig)
    return paths
