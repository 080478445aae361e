"""``compare`` and ``explain`` on reports that were crafted, not written by a drill (issue 41).

A baseline is often a file from elsewhere (a CI artifact, a pull request's folder), and
``--markdown`` goes into CI comments. We test these aspects:

- ``compare`` shows a report's own text (its verdict, the names of its figures, the
  drill and backend it names) as text: terminal escapes made visible; in ``--markdown``
  no link, image, autolink or HTML of its own, and no table cell of its own;
- ``explain`` and ``compare`` on JSON nested too deeply, or whose fields have another
  type (``checks`` a number, ``passed`` a list, a figure beyond a float): a message
  naming the file and exit 2, never a traceback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.cli import main

BASE = {
    "reportVersion": 3,
    "verdict": "PASS",
    "summary": "ok",
    "drill": "d",
    "orchestrator": "fake",
}
HOSTILE = "\x1b]8;;https://evil.example\x07click\x1b]8;;\x07\x1b[2J"
LINK = "[click](https://evil.example) ![x](https://evil.example/p.png) <img src=x> www.evil.example"


def write(folder: Path, name: str, doc: dict[str, Any] | str) -> Path:
    path = folder / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    base = write(tmp_path, "base.json", {**BASE, "recoveryTimeSeconds": 10.0})
    crafted = {
        **BASE,
        "verdict": f"PASS{HOSTILE} {LINK}",
        "drill": f"d{HOSTILE}",
        "recoveryTimeSeconds": 11.0,
        f"x{HOSTILE}|{LINK}Seconds": 3.0,  # any number ending in Seconds is a figure
    }
    return base, write(tmp_path, "new.json", crafted)


def test_a_terminal_gets_no_escape_of_a_report(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(pair[0]), str(pair[1])]) == 0
    captured = capsys.readouterr()
    for stream in (captured.out, captured.err):
        assert "\x1b" not in stream and "\x07" not in stream, stream
    assert "\\x1b]8;;https://evil.example\\x07click" in captured.out


def test_markdown_gets_no_link_image_or_html_of_a_report(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(pair[0]), str(pair[1]), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    for made in ("[click](", "![x](", "https://evil", "www.evil"):
        assert made not in out, (made, out)
    assert re.search(r"(?<!\\)<img", out) is None, out  # only as the text \<img
    table = [line for line in out.splitlines() if line.startswith("|")]
    cells = {line.count(" | ") for line in table}
    assert cells == {5}, table  # six cells a row: no '|' of the report made one more


@pytest.mark.parametrize(
    "crafted",
    [
        '{"reportVersion": 1, "verdict": "PASS", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        {**BASE, "checks": 5},
        {**BASE, "recoveries": 5},
        {**BASE, "checks": [{"name": "x", "passed": [1]}], "recoveries": [{"checks": 5}]},
        {**BASE, "breakdown": "fast", "costs": 7},
        {**BASE, "recoveryTimeSeconds": 10**400},
    ],
    ids=["nested", "checks", "recoveries", "passed", "breakdown", "huge"],
)
@pytest.mark.parametrize("command", ["explain", "compare"])
def test_a_crafted_report_is_bad_input_not_a_traceback(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    crafted: dict[str, Any] | str,
    command: str,
) -> None:
    path = write(tmp_path, "report.json", crafted)
    good = write(tmp_path, "good.json", BASE)
    args = [command, str(path)] if command == "explain" else [command, str(good), str(path)]

    code = main(args)

    err = capsys.readouterr().err
    assert "Traceback" not in err
    if code != 0:  # a report the command can read (a figure it ignores) is no error
        assert code == 2, err
        assert str(path) in err, err
