"""Where a message sends a user to read more: the docs that ship with the package.

``docs_link("troubleshooting.md", "torch-load-truncated")`` is the ``file://`` address of
that page as installed, with its section: the wheel ships ``docs/*.md`` inside the package
(``pytest_recoverygate/docs/``, by setup.py's ``build_py``), and a checkout (an editable
install) reads its own ``docs/`` folder. With ``RECOVERYGATE_DOCS_URL`` set (a docs site of
your own, an internal mirror of the pages), links are that base address joined with the
page and the section instead. Every message that names a page goes through here, and a
test checks that each such link resolves to a file of the distribution.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DOCS_URL_ENV", "docs_folder", "docs_link"]

#: The environment variable that points links at a docs site instead of the shipped files.
DOCS_URL_ENV = "RECOVERYGATE_DOCS_URL"

_HERE = Path(__file__).resolve().parent


def docs_folder() -> Path:
    """The folder of the docs pages: shipped in the package, else the checkout's."""
    shipped = _HERE / "docs"
    return shipped if shipped.is_dir() else _HERE.parent / "docs"


def docs_link(page: str, section: str | None = None) -> str:
    """The address of ``page`` (a file name in docs/, e.g. ``config.md``) and its section."""
    anchor = f"#{section}" if section else ""
    base = os.environ.get(DOCS_URL_ENV, "").strip()
    if base:
        return f"{base.rstrip('/')}/{page}{anchor}"
    return (docs_folder() / page).as_uri() + anchor
