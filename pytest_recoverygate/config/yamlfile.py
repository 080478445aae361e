"""A drill config's YAML, read with the line of every value: what the error messages need.

The YAML is *composed* (not loaded) with pyyaml's safe loader, so every key keeps the line
it was written on; anchors and aliases are refused while composing (a "billion laughs"
document never expands), nesting depth and file size are bounded. :class:`Reader` then
turns the node tree into plain Python values by hand, which also catches duplicate keys,
complex keys and unknown tags, and remembers where each value was (:class:`Where`).
:class:`Problem` is one line of a config error, ``FILE:LINE: key.path: problem — got
VALUE; allowed: … (fix)``; :func:`read_document` is the whole reading step, every
problem of the file itself as a :class:`~pytest_recoverygate.errors.ConfigError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent, Event, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from pytest_recoverygate.errors import ConfigError
from pytest_recoverygate.links import docs_link

__all__ = [
    "INVALID",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "PathKey",
    "Problem",
    "Reader",
    "Refused",
    "Where",
    "YamlLoader",
    "describe",
    "format_path",
    "is_text_slot",
    "key_text",
    "line_for",
    "read_document",
    "shorten",
    "source_line",
]

#: Bounds that turn absurd files into errors before anything is read.
MAX_CONFIG_BYTES = 256 * 1024
MAX_DEPTH = 32


class Refused(Exception):
    """A YAML feature we refuse on purpose (anchors, aliases, deep nesting)."""

    def __init__(self, line: int, problem: str, hint: str) -> None:
        super().__init__(problem)
        self.line = line
        self.problem = problem
        self.hint = hint


class YamlLoader(yaml.SafeLoader):
    """pyyaml's safe loader that refuses anchors, aliases and deep nesting while composing.

    Refusing at compose time means a "billion laughs" document costs what its text costs:
    no alias is ever followed.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event: Event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark else 1
        if isinstance(event, AliasEvent):
            raise Refused(
                line,
                f"YAML aliases (*{event.anchor}) are not allowed",
                "write the value out in full; anchors and aliases are refused so a config "
                "cannot expand into a YAML bomb",
            )
        if isinstance(event, (ScalarEvent, CollectionStartEvent)) and event.anchor is not None:
            raise Refused(
                line,
                f"YAML anchors (&{event.anchor}) are not allowed",
                "remove the anchor and write values out in full; anchors and aliases are "
                "refused so a config cannot expand into a YAML bomb",
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise Refused(
                    line,
                    f"nesting is deeper than {MAX_DEPTH} levels",
                    "a drill config is a few levels deep",
                )
            node: Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1


# YAML 1.1 (pyyaml) reads a number with an exponent but no point, 2e-5, as a string; YAML
# 1.2 and every other reader a user checks with read it as a number, as we do.
YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


@dataclass(frozen=True)
class Where:
    """Where a value sits in the file, and how it was written."""

    line: int
    text: str  # the value as written (scalars), or a short description (collections)


@dataclass(frozen=True, order=True)
class Problem:
    line: int
    path: str
    problem: str
    got: str
    allowed: str
    hint: str

    def render(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line else f"{file} (override)"
        text = f"{where}: {self.path}: {self.problem} — got {self.got}"
        if self.allowed:
            text += f"; allowed: {self.allowed}"
        if self.hint:
            text += f" ({self.hint})"
        return text


PathKey = tuple[Any, ...]
INVALID = object()  # stands in for a value that could not be read (already reported)

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_SCALAR_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "timestamp")
)


def shorten(text: str, limit: int = 80) -> str:
    """One line, printable, at most ``limit`` characters."""
    printable = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return printable if len(printable) <= limit else printable[: limit - 1] + "…"


def _scalar_text(node: ScalarNode) -> str:
    if node.style in ('"', "'"):
        return shorten(f"{node.style}{node.value}{node.style}")
    if node.value == "" and node.tag == "tag:yaml.org,2002:null":
        return "nothing (empty value)"
    return shorten(str(node.value))


def describe(value: Any) -> str:
    if isinstance(value, dict):
        keys = ", ".join(shorten(str(k), 20) for k in list(value)[:4])
        return (
            f"a mapping ({keys}{', …' if len(value) > 4 else ''})" if value else "an empty mapping"
        )
    if isinstance(value, list):
        if not value:
            return "[] (an empty list)"
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return shorten(repr(value) if isinstance(value, str) else str(value))


class Reader:
    """Turns a composed YAML node tree into Python values, remembering where each was."""

    def __init__(self, loader: YamlLoader) -> None:
        self.loader = loader
        self.where: dict[PathKey, Where] = {}
        self.problems: list[Problem] = []

    def _problem(
        self, line: int, path: PathKey, problem: str, *, got: str, allowed: str, hint: str = ""
    ) -> None:
        self.problems.append(Problem(line, format_path(path), problem, got, allowed, hint))

    def _unsupported_tag(
        self, node: Node, line: int, path: PathKey, got: str, allowed: str
    ) -> object:
        """Report ``node``'s YAML tag as one not read; the value is INVALID."""
        self._problem(
            line,
            path,
            f"YAML tag {node.tag} is not supported",
            got=got,
            allowed=allowed,
            hint="remove the tag",
        )
        return INVALID

    def _read_child(self, node: Node, child: PathKey, line: int) -> Any:
        """Read a mapping's value or a list's item, remembering its line and its text as
        written (a scalar) or described (a mapping or list)."""
        value = self.read(node, child)
        text = _scalar_text(node) if isinstance(node, ScalarNode) else describe(value)
        self.where[child] = Where(line, text)
        return value

    def read(self, node: Node, path: PathKey) -> Any:
        line = node.start_mark.line + 1
        if isinstance(node, ScalarNode):
            if node.tag not in _SCALAR_TAGS:
                return self._unsupported_tag(
                    node,
                    line,
                    path,
                    _scalar_text(node),
                    "plain YAML values (text, numbers, true/false)",
                )
            try:
                value = self.loader.construct_object(node)
            except (yaml.YAMLError, ValueError, OverflowError, TypeError) as exc:
                problem = getattr(exc, "problem", None) or str(exc)
                self._problem(
                    line,
                    path,
                    f"cannot be read ({shorten(str(problem), 100)})",
                    got=_scalar_text(node),
                    allowed="plain YAML values (text, numbers, true/false)",
                    hint="remove the !!tag or quote the value",
                )
                return INVALID
            if is_text_slot(path) and _is_plain_decimal(node, value):
                return node.value  # a number in argv or env: its decimal text, as written
            return value
        if isinstance(node, MappingNode):
            if node.tag != _MAP_TAG:
                return self._unsupported_tag(
                    node, line, path, "a tagged mapping", "a plain mapping"
                )
            result: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key_line = key_node.start_mark.line + 1
                if not isinstance(key_node, ScalarNode):
                    self._problem(
                        key_line,
                        path,
                        "a key must be a plain word, not a list or mapping",
                        got="a complex key",
                        allowed="key: value pairs",
                        hint="write the key as a word",
                    )
                    continue
                key = self.read(key_node, (*path, key_node.value))
                if key is INVALID:
                    continue
                child = (*path, key)
                if key in result:
                    first = self.where[child].line
                    self._problem(
                        key_line,
                        child,
                        f"key appears twice (first on line {first})",
                        got=_scalar_text(key_node),
                        allowed="each key once",
                        hint="remove one of them",
                    )
                    continue
                result[key] = self._read_child(value_node, child, key_line)
            return result
        if isinstance(node, SequenceNode):
            if node.tag != _SEQ_TAG:
                return self._unsupported_tag(node, line, path, "a tagged list", "a plain list")
            items: list[Any] = []
            for index, item_node in enumerate(node.value):
                child = (*path, index)
                items.append(self._read_child(item_node, child, item_node.start_mark.line + 1))
            return items
        raise AssertionError(f"unexpected YAML node {node!r}")  # pragma: no cover


_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE]-?[0-9]+)?")


def is_text_slot(path: PathKey) -> bool:
    """An argument of ``workload.command`` or a value of ``workload.env``: always text."""
    return len(path) == 3 and path[0] == "workload" and path[1] in ("command", "env")


def _is_plain_decimal(node: ScalarNode, value: Any) -> bool:
    """A bare number whose text reads the same to everyone: ``2``, ``-1``, ``0.02``,
    ``1e-3`` (a learning rate in argv is meant as written).

    Not ``0x10``, ``010`` (octal in YAML 1.1), ``1_000``, ``+5`` or ``.inf``: YAML
    turns those into a number whose decimal text differs from what was written, so which
    one was meant is a guess. Booleans (``yes``, ``on``) and null are never numbers here.
    """
    if node.style is not None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return _DECIMAL.fullmatch(node.value) is not None


def key_text(key: Any) -> str:
    """A key as it reads in a message: quoted when it is blank or has spaces or dots."""
    text = str(key)
    if not text or any(c.isspace() or c == "." or not c.isprintable() for c in text):
        return shorten(json.dumps(text, ensure_ascii=False), 40)
    return shorten(text, 40)


def format_path(path: PathKey) -> str:
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            word = key_text(part)
            out += f".{word}" if out else word
    return out or "(top level)"


def _syntax_problem(exc: yaml.YAMLError, text: str) -> Problem:
    """A YAML syntax error as a problem line: where, what, and the line itself."""
    lines = text.splitlines()
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line, column = mark.line + 1, mark.column + 1
    elif isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
    else:  # pragma: no cover - every pyyaml error has a mark or a position
        line, column = 1, 1
    what = " ".join(
        str(p) for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p
    )
    if isinstance(exc, yaml.reader.ReaderError):
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        what = f"character {char!r} (U+{ord(char):04X}) is not allowed in YAML"
    what = what or str(exc)
    hint = f"fix the YAML near column {column}"
    if "\t" in what or "'\\t'" in what:
        hint = "YAML indents with spaces, not tabs"
    elif "expected a single document" in what:
        hint = "one drill per file: remove the extra '---' document"
    got = shorten(repr(lines[line - 1])) if 0 < line <= len(lines) else "the end of the file"
    return Problem(line, "(YAML syntax)", shorten(what, 160), got, "well-formed YAML", hint)


def _compose(text: str) -> Node | None:
    loader = YamlLoader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def line_for(path: tuple[Any, ...], where: dict[PathKey, Where]) -> int:
    """The line of ``path``, or of its nearest parent that exists (where a missing key goes)."""
    for end in range(len(path), 0, -1):
        spot = where.get(path[:end])
        if spot is not None:
            return spot.line
    root = where.get(())
    return root.line if root is not None else 1


def source_line(text: str, line: int) -> str:
    lines = text.splitlines()
    return shorten(repr(lines[line - 1])) if 0 < line <= len(lines) else "the end of the file"


def read_document(
    text: str | bytes, file: str
) -> tuple[dict[Any, Any], dict[PathKey, Where], list[Problem]]:
    """The top-level mapping of the config ``text`` (named ``file`` in messages), where
    each value was, and the problems found while reading it (duplicate keys, tags…).

    Raises :class:`ConfigError` when there is nothing to validate: a file too large,
    not UTF-8, not YAML, empty, or not a mapping.
    """
    if len(text) > MAX_CONFIG_BYTES:
        unit = "bytes" if isinstance(text, bytes) else "characters"
        raise ConfigError(
            Problem(
                1,
                "(file)",
                "is too large for a drill config",
                f"more than {MAX_CONFIG_BYTES} {unit}",
                f"at most {MAX_CONFIG_BYTES} {unit} (a drill config is a few hundred)",
                "is this the right file?",
            ).render(file)
        )
    if isinstance(text, bytes):
        raw = text
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise ConfigError(
                Problem(
                    line,
                    "(file)",
                    "is not UTF-8 text",
                    f"byte 0x{raw[exc.start]:02x} at offset {exc.start}",
                    "a UTF-8 encoded YAML file",
                    "save the file as UTF-8",
                ).render(file)
            ) from None
    text = text.removeprefix("\ufeff")

    try:
        node = _compose(text)
    except Refused as exc:
        raise ConfigError(
            Problem(
                exc.line,
                "(YAML)",
                exc.problem,
                source_line(text, exc.line),
                "plain YAML",
                exc.hint,
            ).render(file)
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(_syntax_problem(exc, text).render(file)) from None
    except RecursionError:  # pragma: no cover - depth is bounded while composing
        raise ConfigError(
            Problem(1, "(YAML)", "is nested too deeply", "", "plain YAML", "").render(file)
        ) from None

    if node is None:
        raise ConfigError(
            Problem(
                1,
                "(file)",
                "is empty",
                "no YAML content",
                "a mapping with workload, injectFailure and expectations",
                "see " + docs_link("config.md") + " for a complete example",
            ).render(file)
        )

    reader = Reader(YamlLoader(""))
    data = reader.read(node, ())
    if data is INVALID:  # the whole document was refused (e.g. a tagged root)
        raise ConfigError("\n".join(p.render(file) for p in sorted(reader.problems)))
    reader.where[()] = Where(node.start_mark.line + 1, describe(data))
    if not isinstance(data, dict):
        raise ConfigError(
            "\n".join(
                p.render(file)
                for p in sorted(
                    [
                        *reader.problems,
                        Problem(
                            node.start_mark.line + 1,
                            "(top level)",
                            "must be a mapping of keys",
                            describe(data),
                            "a mapping with workload, injectFailure and expectations",
                            "start the file with workload:",
                        ),
                    ]
                )
            )
        )

    return data, reader.where, reader.problems
