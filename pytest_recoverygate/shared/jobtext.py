"""Text that came from a job, made safe to show and to keep.

A job controls what it prints, its process names, its paths. Shown on a terminal, an
escape sequence in them could move the cursor, rewrite the verdict line, set the window
title or (OSC 8) plant a link; kept in a report, its output may hold credentials.

- :func:`printable` replaces C0 and C1 control characters (``ESC``, ``CSI``, ``BEL``,
  ``CR``, ``DEL``, ...) except line feed and tab, the Unicode bidirectional
  overrides and lone surrogates, with a visible ``\\xNN`` / ``\\uNNNN``: everything a
  terminal, a prompt or a CI log shows of a job's text goes through it.
- :func:`markdown_text` makes text literal markdown on one line (a table cell, a CI
  comment): every character markdown gives a meaning to mid-line is escaped, so a report's
  text can make no link, image, autolink, HTML or code span.
- :func:`mask_secrets` replaces the values of common credential patterns (Hugging Face,
  GitHub, AWS, Slack, OpenAI-style keys, ``Bearer`` tokens, ``password=``/``token=``
  values) with ``[masked]``: the job output a report keeps goes through it. Every pattern
  is linear (no nested repetition), so a hostile line costs time in proportion to its
  length.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "markdown_text", "mask_secrets", "printable"]

MASK = "[masked]"

# C0 except \t (09) and \n (0a); DEL; C1; bidi embeddings/overrides/isolates; lone
# surrogates (JSON's "\ud800" decodes to one: no encoding can write it).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character but ``\\n`` and ``\\t`` made visible."""
    return _CONTROL.sub(_escape, text.replace("\r\n", "\n"))


_MARKDOWN_SPECIAL = frozenset("\\`*_[]<>|~!")  # what means something mid-line


def markdown_text(text: str) -> str:
    """``text`` as literal markdown on one line: control characters made visible, line
    breaks as spaces, ``&`` as an entity, every character markdown gives a meaning to
    mid-line backslash-escaped (links, images, HTML, code, emphasis, table cells), and
    no autolink (``://``, ``www.``)."""
    text = printable(text).replace("\n", " ").replace("\t", " ").replace("&", "&amp;")
    text = "".join(f"\\{c}" if c in _MARKDOWN_SPECIAL else c for c in text)
    return text.replace("://", "\\://").replace("www.", "www\\.")


# (pattern, replacement): the prefix that names the kind of secret is kept.
_SECRETS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b(hf_)[A-Za-z0-9]{20,}"), rf"\1{MASK}"),
    (re.compile(r"\b(gh[pousr]_)[A-Za-z0-9]{20,}"), rf"\1{MASK}"),
    (re.compile(r"\b(github_pat_)[A-Za-z0-9_]{20,}"), rf"\1{MASK}"),
    (re.compile(r"\b((?:AKIA|ASIA)[0-9A-Z]{4})[0-9A-Z]{12}\b"), rf"\1{MASK}"),
    (re.compile(r"\b(xox[abeoprs]-)[A-Za-z0-9-]{8,}"), rf"\1{MASK}"),
    (re.compile(r"\b(sk-)[A-Za-z0-9_-]{20,}"), rf"\1{MASK}"),
    (re.compile(r"\b(Bearer[ \t]+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE), rf"\1{MASK}"),
    (
        re.compile(
            r"""(?i)(?<![A-Za-z0-9])((?:password|passwd|token|secret|api[_-]?key"""
            r"""|access[_-]?key|secret[_-]?key)["']?[ \t]*[=:][ \t]*["']?)[^\s"',;&]{1,4096}"""
        ),
        rf"\1{MASK}",
    ),
)


def mask_secrets(text: str) -> str:
    """``text`` with the values of common credential patterns replaced by ``[masked]``."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text
