"""docs/architecture.md stays true: its layers are the import contract's, and every module
has its line there.

We test these aspects: the layer drawing lists, in order, exactly the layers of the
``layers`` contract that ``lint-imports`` enforces; every module of both packages is
named in the "one job per module" list; no module of the package is over 900 lines.
"""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import pytest
import recoverygate

import pytest_recoverygate

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def contract_layers() -> list[str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return list(contract["layers"])


def test_the_layers_drawn_are_the_layers_enforced() -> None:
    drawing = re.search(r"## The layers.*?```\n(.*?)```", DOC, re.S)
    assert drawing is not None
    drawn = [
        re.split(r"\s{2,}", line.strip())[0]
        for line in drawing.group(1).splitlines()
        if line and not line.startswith("      ")  # indented lines detail a layer
    ]
    assert drawn == contract_layers()


def modules() -> list[str]:
    names = []
    for package in (recoverygate, pytest_recoverygate):
        names += [
            info.name
            for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")
        ]
    return names


def test_every_module_has_its_line() -> None:
    listed = DOC.split("## One job per module", 1)[1].split("## Where a change goes", 1)[0]
    missing = [
        name
        for name in modules()
        if f"`{name.removeprefix('pytest_recoverygate.')}`" not in listed
        and f"`{name.rsplit('.', 1)[-1]}`" not in listed
    ]
    assert missing == []


def test_no_module_is_over_900_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in (ROOT / "pytest_recoverygate").rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > 900
    }
    assert long == {}
