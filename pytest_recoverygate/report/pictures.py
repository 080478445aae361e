"""The pictures' common ground: whether matplotlib (the optional ``plot`` extra) is there,
and writing a figure as a PNG and an SVG (the timeline and the decision pictures)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["plotting_available", "save_pictures"]


def plotting_available() -> bool:
    """True when matplotlib can be imported (without importing it)."""
    return importlib.util.find_spec("matplotlib") is not None


def save_pictures(fig: Any, directory: Path, stem: str) -> list[Path]:
    """Write ``fig`` as ``stem.png`` and ``stem.svg`` in ``directory`` (made when missing),
    readable by all; the figure is closed whatever happens."""
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    try:
        paths = [directory / f"{stem}.png", directory / f"{stem}.svg"]
        for path in paths:
            fig.savefig(path)
            path.chmod(0o644)
    finally:
        plt.close(fig)
    return paths
