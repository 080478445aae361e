"""Every link a message prints resolves to a file of the distribution.

We test these aspects:

- the links: every diagnosis's ``more:`` address and every ``docs_link(page, section)``
  the package calls (found in its source), each a page of ``docs/`` and, with a section,
  a heading of that page;
- no message names a page any other way (a bare ``docs/x.md`` or an ``https://`` address
  in a string of the package that is not a docstring);
- the wheel ships those pages inside the package (tests/test_install.py builds it), and a
  link points at the shipped copy;
- ``RECOVERYGATE_DOCS_URL`` points every link at a docs site instead.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from pytest_recoverygate.links import DOCS_URL_ENV, docs_folder, docs_link
from pytest_recoverygate.report.diagnosis import SIGNATURES, Diagnosis

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pytest_recoverygate"


def linked_pages() -> set[tuple[str, str | None]]:
    """(page, section) of every link the package prints."""
    found: set[tuple[str, str | None]] = {("troubleshooting.md", s.id) for s in SIGNATURES}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "docs_link"
                and path.name != "links.py"
            ):
                args = [a.value for a in node.args if isinstance(a, ast.Constant)]
                if len(args) < len(node.args):  # the diagnoses' links: the signatures above
                    assert path.name == "diagnosis.py", f"{path}: docs_link of a computed page"
                    continue
                found.add((str(args[0]), str(args[1]) if len(args) > 1 else None))
    return found


def anchors(page: Path) -> set[str]:
    """The section anchors of a page, as GitHub makes them from its headings."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_link_a_message_prints_resolves_to_a_page_and_its_section() -> None:
    pages = linked_pages()
    assert ("config.md", None) in pages, "the messages' own links were found"
    for page, section in sorted(pages, key=str):
        url = urlparse(docs_link(page, section))
        assert url.scheme == "file"
        path = Path(unquote(url.path))
        assert path.is_file(), f"{page} links to {path}, which does not exist"
        assert path.parent == docs_folder()
        assert (ROOT / "docs" / page).is_file(), f"{page} is not a page of docs/"
        if section is not None:
            assert url.fragment == section
            assert section in anchors(path), f"{page} has no section {section!r}"


def test_a_diagnosis_links_to_its_section_of_the_shipped_troubleshooting_page() -> None:
    diagnosis = Diagnosis("torch-load-truncated", "title", "text", "evidence")
    assert diagnosis.docs == docs_link("troubleshooting.md", "torch-load-truncated")
    assert "github.com" not in diagnosis.docs


def _message_strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and (body := node.body)
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_no_message_names_a_page_any_other_way() -> None:
    bare = re.compile(r"docs/[\w-]+\.md|https?://\w")  # a bare scheme is code, not a page
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in _message_strings(path)
        if bare.search(text) and path.name != "links.py"
    ]
    assert found == []


def test_a_docs_url_set_by_the_user_is_where_links_point(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DOCS_URL_ENV, "https://docs.example.internal/recoverygate/")
    assert (
        docs_link("troubleshooting.md", "torch-load-truncated")
        == "https://docs.example.internal/recoverygate/troubleshooting.md#torch-load-truncated"
    )
    diagnosis = Diagnosis("torch-load-truncated", "title", "text", "evidence")
    assert diagnosis.docs.startswith("https://docs.example.internal/recoverygate/")
