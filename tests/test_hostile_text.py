"""A job's text that broke the drill's output: found by a hostile-input trial.

A job controls its lines, so what they carry must never crash, hang or inject. The trial
(a helper's, on the parser, rejudge and the report writers) found these; each test
failed before its fix:

- a lone surrogate (JSON's ``"\\ud800"``, in a host name, a target or the transcript's
  header) made the terminal print and the report files raise ``UnicodeEncodeError``:
  ``printable`` shows it escaped, and files are written with it escaped;
- a step of 401 digits passed the wire parser and overflowed the cost figures at the end
  of the drill (no verdict, no report): a step past :data:`MAX_STEP` is malformed;
- a custom pattern whose step group matched ``²`` (``str.isdigit`` is true, ``int``
  refuses it) raised from the evidence matcher, which ends a pod log's reader: only ASCII
  digits are a step;
- an incarnation id with ``$`` made matplotlib read the legend as maths and give up the
  picture, and the hint that said so went into summary.md unescaped (live markdown
  images and links): the label escapes it and the hint is literal markdown.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from recoverygate.evidence import Matcher, Spec
from recoverygate.wire import MAX_STEP, record_from_json

from pytest_recoverygate.report.files import markdown_summary
from pytest_recoverygate.shared.jobtext import printable
from pytest_recoverygate.shared.safefiles import write_safely


def test_a_lone_surrogate_is_shown_escaped_and_written_escaped(tmp_path: Path) -> None:
    text = json.loads('"host-\\ud800-x"')
    shown = printable(text)
    assert shown == "host-\\ud800-x"
    shown.encode("utf-8")  # printable: nothing an encoding refuses
    path = write_safely(tmp_path, "summary.md", f"node {text}\n")
    assert path.read_bytes() == b"node host-\\ud800-x\n"


def test_a_step_beyond_max_step_is_malformed() -> None:
    line = {"event": "progress", "time": 1.0, "inc": "ab", "step": MAX_STEP}
    assert record_from_json(line) is not None
    assert record_from_json({**line, "step": MAX_STEP + 1}) is None
    assert record_from_json({**line, "step": 10**400}) is None


def test_only_ascii_digits_are_a_step() -> None:
    matcher = Matcher(Spec({"patterns": {"progress": r"step (?P<step>\S+)"}}))
    assert matcher.feed("step ²") == []
    assert matcher.feed("step ١٢") == []
    assert matcher.feed("step 12") == [("progress", 12, None)]


def test_a_picture_hint_is_literal_markdown() -> None:
    hint = "could not draw: incarnation 1 (x$ <img src=x> ![p](https://e.example/p.png)$)"
    doc = {"verdict": "PASS", "summary": "ok", "checks": [], "timelinePictureHint": hint}
    summary = markdown_summary(doc)
    hinted = summary[summary.index("No timeline picture") :]
    assert re.search(r"(?<!\\)[<!\[]", hinted) is None, hinted  # each one escaped
    assert "\\<img src=x\\>" in hinted
