"""Load ``recovery-test.yaml`` into a validated, typed :class:`DrillConfig`: the YAML
read with its line numbers, and every problem rewritten in our words.

A drill config points a destructive tool at an expensive job, so it is checked strictly
and every problem is reported at once, each on its own line, in the form::

    FILE:LINE: key.path: problem — got VALUE; allowed: … (fix hint)

How: the YAML is *composed* (not loaded) with pyyaml's safe loader, so every key keeps
the line it was written on; anchors and aliases are refused while composing (a "billion
laughs" document never expands), nesting depth and file size are bounded. The node tree
is then turned into plain Python values by hand, which also catches duplicate keys,
complex keys and unknown tags. The schema (:mod:`pytest_recoverygate.schema`, the
``workload`` section from the backend the file names) validates the values, and pydantic's
errors are rewritten in our words with the line numbers found while composing, using
each field's :func:`~pytest_recoverygate.schema.meta`. Nothing here touches the cluster
or the job: checking a config is safe to run anywhere (``recoverygate validate``).

In YAML the keys are camelCase (``injectFailure.afterCheckpoint``); in Python the
attributes are snake_case (``config.inject_failure.after_checkpoint``).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from yaml.events import AliasEvent, CollectionStartEvent, Event, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from pytest_recoverygate.durations import format_duration, format_step_ref
from pytest_recoverygate.errors import ConfigError, UsageError
from pytest_recoverygate.schema import (
    MAX_DURATION,
    DrillConfig,
    Expectations,
    InjectFailure,
    Safety,
    Section,
    Timeouts,
    WorkloadBase,
    fault_refusal,
    fault_types,
    spec_from_config,
)

__all__ = [
    "MAX_CONFIG_BYTES",
    "DrillConfig",
    "Expectations",
    "InjectFailure",
    "Safety",
    "Timeouts",
    "dump_effective",
    "load_config",
    "parse_config",
    "schema_keys",
]

#: Bounds that turn absurd files into errors before anything is read.
MAX_CONFIG_BYTES = 256 * 1024
MAX_DEPTH = 32

_ROOT_ONLY_IN_PYTHON = ("sourcePath", "source_path")


def _workload_model(tag: Any) -> type[WorkloadBase] | None:
    """The model of the backend ``tag`` names, when there is one that loads."""
    from pytest_recoverygate.orchestrators import backend_names, get_backend

    if not isinstance(tag, str) or tag not in backend_names():
        return None
    try:
        return get_backend(tag).workload
    except UsageError:
        return None


# ------------------------------------------------------------------- YAML reading


class _Refused(Exception):
    """A YAML feature we refuse on purpose (anchors, aliases, deep nesting)."""

    def __init__(self, line: int, problem: str, hint: str) -> None:
        super().__init__(problem)
        self.line = line
        self.problem = problem
        self.hint = hint


class _Loader(yaml.SafeLoader):
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
            raise _Refused(
                line,
                f"YAML aliases (*{event.anchor}) are not allowed",
                "write the value out in full; anchors and aliases are refused so a config "
                "cannot expand into a YAML bomb",
            )
        if isinstance(event, (ScalarEvent, CollectionStartEvent)) and event.anchor is not None:
            raise _Refused(
                line,
                f"YAML anchors (&{event.anchor}) are not allowed",
                "remove the anchor and write values out in full; anchors and aliases are "
                "refused so a config cannot expand into a YAML bomb",
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(
                    line,
                    f"nesting is deeper than {MAX_DEPTH} levels",
                    "a drill config is a few levels deep",
                )
            node: Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1


@dataclass(frozen=True)
class _Where:
    """Where a value sits in the file, and how it was written."""

    line: int
    text: str  # the value as written (scalars), or a short description (collections)


@dataclass(frozen=True, order=True)
class _Problem:
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


_PathKey = tuple[Any, ...]
_INVALID = object()  # stands in for a value that could not be read (already reported)

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_SCALAR_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "timestamp")
)


def _shorten(text: str, limit: int = 80) -> str:
    """One line, printable, at most ``limit`` characters."""
    printable = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return printable if len(printable) <= limit else printable[: limit - 1] + "…"


def _scalar_text(node: ScalarNode) -> str:
    if node.style in ('"', "'"):
        return _shorten(f"{node.style}{node.value}{node.style}")
    if node.value == "" and node.tag == "tag:yaml.org,2002:null":
        return "nothing (empty value)"
    return _shorten(str(node.value))


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        keys = ", ".join(_shorten(str(k), 20) for k in list(value)[:4])
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
    return _shorten(repr(value) if isinstance(value, str) else str(value))


class _Reader:
    """Turns a composed YAML node tree into Python values, remembering where each was."""

    def __init__(self, loader: _Loader) -> None:
        self.loader = loader
        self.where: dict[_PathKey, _Where] = {}
        self.problems: list[_Problem] = []

    def _problem(
        self, line: int, path: _PathKey, problem: str, *, got: str, allowed: str, hint: str = ""
    ) -> None:
        self.problems.append(_Problem(line, _format_path(path), problem, got, allowed, hint))

    def read(self, node: Node, path: _PathKey) -> Any:
        line = node.start_mark.line + 1
        if isinstance(node, ScalarNode):
            if node.tag not in _SCALAR_TAGS:
                self._problem(
                    line,
                    path,
                    f"YAML tag {node.tag} is not supported",
                    got=_scalar_text(node),
                    allowed="plain YAML values (text, numbers, true/false)",
                    hint="remove the tag",
                )
                return _INVALID
            try:
                value = self.loader.construct_object(node)
            except (yaml.YAMLError, ValueError, OverflowError, TypeError) as exc:
                problem = getattr(exc, "problem", None) or str(exc)
                self._problem(
                    line,
                    path,
                    f"cannot be read ({_shorten(str(problem), 100)})",
                    got=_scalar_text(node),
                    allowed="plain YAML values (text, numbers, true/false)",
                    hint="remove the !!tag or quote the value",
                )
                return _INVALID
            if _is_text_slot(path) and _is_plain_decimal(node, value):
                return node.value  # a number in argv or env: its decimal text, as written
            return value
        if isinstance(node, MappingNode):
            if node.tag != _MAP_TAG:
                self._problem(
                    line,
                    path,
                    f"YAML tag {node.tag} is not supported",
                    got="a tagged mapping",
                    allowed="a plain mapping",
                    hint="remove the tag",
                )
                return _INVALID
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
                if key is _INVALID:
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
                value = self.read(value_node, child)
                text = (
                    _scalar_text(value_node)
                    if isinstance(value_node, ScalarNode)
                    else _describe(value)
                )
                self.where[child] = _Where(key_line, text)
                result[key] = value
            return result
        if isinstance(node, SequenceNode):
            if node.tag != _SEQ_TAG:
                self._problem(
                    line,
                    path,
                    f"YAML tag {node.tag} is not supported",
                    got="a tagged list",
                    allowed="a plain list",
                    hint="remove the tag",
                )
                return _INVALID
            items: list[Any] = []
            for index, item_node in enumerate(node.value):
                child = (*path, index)
                value = self.read(item_node, child)
                text = (
                    _scalar_text(item_node)
                    if isinstance(item_node, ScalarNode)
                    else _describe(value)
                )
                self.where[child] = _Where(item_node.start_mark.line + 1, text)
                items.append(value)
            return items
        raise AssertionError(f"unexpected YAML node {node!r}")  # pragma: no cover


_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")


def _is_text_slot(path: _PathKey) -> bool:
    """An argument of ``workload.command`` or a value of ``workload.env``: always text."""
    return len(path) == 3 and path[0] == "workload" and path[1] in ("command", "env")


def _is_plain_decimal(node: ScalarNode, value: Any) -> bool:
    """A bare number whose text reads the same to everyone: ``2``, ``-1``, ``0.02``.

    Not ``0x10``, ``010`` (octal in YAML 1.1), ``1_000``, ``1e3``, ``+5`` or ``.inf``: YAML
    turns those into a number whose decimal text differs from what was written, so which
    one was meant is a guess. Booleans (``yes``, ``on``) and null are never numbers here.
    """
    if node.style is not None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return _DECIMAL.fullmatch(node.value) is not None


def _key_text(key: Any) -> str:
    """A key as it reads in a message: quoted when it is blank or has spaces or dots."""
    text = str(key)
    if not text or any(c.isspace() or c == "." or not c.isprintable() for c in text):
        return _shorten(json.dumps(text, ensure_ascii=False), 40)
    return _shorten(text, 40)


def _format_path(path: _PathKey) -> str:
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            word = _key_text(part)
            out += f".{word}" if out else word
    return out or "(top level)"


def _syntax_problem(exc: yaml.YAMLError, text: str) -> _Problem:
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
    got = _shorten(repr(lines[line - 1])) if 0 < line <= len(lines) else "the end of the file"
    return _Problem(line, "(YAML syntax)", _shorten(what, 160), got, "well-formed YAML", hint)


def _compose(text: str) -> Node | None:
    loader = _Loader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


# ----------------------------------------------------------------- error wording

_TYPE_PROBLEMS = {
    "int_type": "must be a whole number",
    "float_type": "must be a number",
    "string_type": "must be text",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a mapping of keys",
    "model_type": "must be a mapping of keys",
    "model_attributes_type": "must be a mapping of keys",
    "literal_error": "is not one of the allowed values",
    "greater_than": "is too small",
    "greater_than_equal": "is too small",
    "less_than": "is too large",
    "less_than_equal": "is too large",
    "finite_number": "must be a finite number",
    "string_too_short": "must not be empty",
    "string_too_long": "is too long",
    "string_pattern_mismatch": "contains characters that are not allowed",
    "too_short": "must not be empty",
    "missing": "required key is missing",
    "extra_forbidden": "unknown key",
    "invalid_key": "a key must be a word (text)",
    "path_type": "must be a path (text)",
    "is_instance_of": "has the wrong type",
}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        found.extend(_models_in(arg))
    return found


def _field_named(model: type[BaseModel], key: Any) -> tuple[str, FieldInfo] | None:
    for name, info in model.model_fields.items():
        if key in (info.alias, name):
            return name, info
    return None


def _inner_model(
    model: type[BaseModel], name: str, field: FieldInfo, workload: type[WorkloadBase] | None
) -> type[BaseModel] | None:
    """The model a field's value is validated by: the backend's for ``workload``."""
    if model is DrillConfig and name == "workload":
        return workload
    inner = _models_in(field.annotation)
    return inner[0] if len(inner) == 1 else None


def _locate(
    loc: tuple[Any, ...], workload: type[WorkloadBase] | None
) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model holding the last key of ``loc`` and that key's field (None if unknown).

    ``workload`` is the model of the backend the file names (None when it names none).
    """
    model: type[BaseModel] | None = DrillConfig
    parent: type[BaseModel] | None = None
    field: FieldInfo | None = None
    for key in loc:
        if model is None:
            break
        parent = model
        found = _field_named(model, key)
        if found is None:
            return parent, None
        name, field = found
        model = _inner_model(model, name, field, workload)
    return parent, field


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return [
        info.alias or name for name, info in model.model_fields.items() if name != "source_path"
    ]


def _did_you_mean(key: str, candidates: list[str]) -> str:
    folded = {c.lower().replace("_", "").replace("-", ""): c for c in candidates}
    probe = key.lower().replace("_", "").replace("-", "")
    if probe in folded:
        return f"did you mean {folded[probe]}?"
    close = difflib.get_close_matches(probe, list(folded), n=1, cutoff=0.7)
    if close:
        return f"did you mean {folded[close[0]]}?"
    return ""


def _elsewhere(key: str) -> str:
    """Name the backends where an unknown workload key would be valid."""
    from pytest_recoverygate.orchestrators import all_backends

    owners = [
        name for name, backend in all_backends().items() if key in _allowed_keys(backend.workload)
    ]
    return f"{key} belongs to orchestrator: {' / '.join(owners)}" if owners else ""


def _allowed_text(meta: Mapping[str, Any]) -> str:
    """A field's ``allowed`` text (a function, where it depends on the installed backends)."""
    allowed = meta.get("allowed", "")
    return str(allowed() if callable(allowed) else allowed)


def _is_env_value(path: tuple[Any, ...]) -> bool:
    return len(path) == 3 and path[0] == "workload" and path[1] == "env"


def _translate(
    error: Mapping[str, Any],
    where: dict[_PathKey, _Where],
    workload: type[WorkloadBase] | None,
) -> _Problem:
    """One pydantic error, rewritten with its line, key path, value, what is allowed and a fix.

    ``workload`` is the model of the backend the file names (None when it names none).
    """
    kind = str(error["type"])
    loc = tuple(error["loc"])
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    if loc and loc[-1] == "[key]":
        loc = loc[:-1]
        kind = "invalid_key"
    if kind == "recoverygate":
        loc = (*loc, *ctx.get("key", ()))
    parent, field = _locate(loc, workload)
    path = loc
    meta: Mapping[str, Any] = (
        field.json_schema_extra
        if field is not None and isinstance(field.json_schema_extra, dict)
        else {}
    )
    allowed = _allowed_text(meta)
    example = str(meta.get("example", ""))
    hint = f"e.g. {example}" if example else ""
    problem = _TYPE_PROBLEMS.get(kind, str(error.get("msg", "is not valid")))

    spot = where.get(path)
    got = spot.text if spot is not None else _describe(error.get("input"))
    quoted = spot is not None and spot.text.startswith(("'", '"'))

    if kind in ("union_tag_invalid", "union_tag_not_found"):
        from pytest_recoverygate.orchestrators import backend_names

        names = list(backend_names())
        path = (*path, "orchestrator")
        spot = where.get(path)
        allowed = ", ".join(names)
        if kind == "union_tag_not_found":
            problem, got = "required key is missing", "nothing"
            hint = "say which backend runs the job, e.g. orchestrator: fake"
        else:
            problem = "is not a known orchestrator"
            got = spot.text if spot is not None else _describe(ctx.get("tag"))
            hint = _did_you_mean(str(ctx.get("tag", "")), names) or "e.g. orchestrator: kubernetes"
    elif kind == "missing":
        got = "nothing"
        hint = f"add {example}" if example else ""
    elif kind == "extra_forbidden":
        key = str(loc[-1])
        candidates = _allowed_keys(parent) if parent is not None else []
        allowed = ", ".join(candidates)
        got = _key_text(loc[-1])
        hint = _did_you_mean(key, candidates)
        if not hint and len(path) == 2 and path[0] == "workload":
            hint = _elsewhere(key)
        hint = hint or "remove it"
    elif kind == "invalid_key":
        got = _describe(loc[-1] if loc else error.get("input"))
        hint = 'quote the key: "…": value'
    elif kind == "recoverygate":
        problem = str(ctx.get("problem", problem))
        allowed = str(ctx.get("allowed") or allowed)
        hint = str(ctx.get("hint") or hint)
        if "got" in ctx:
            got = str(ctx["got"])
    elif kind in ("literal_error",):
        allowed = allowed or str(ctx.get("expected", ""))
    elif kind == "string_type" and spot is not None and not quoted:
        key = path[-1] if path else "key"
        if _is_text_slot(path):
            problem = _ambiguous_text(error.get("input"), spot.text, hidden=_is_env_value(path))
        if _is_env_value(path):
            hint = 'quote it: NAME: "value"'
        elif isinstance(key, int):
            hint = f'quote it: - "{spot.text}"'
        else:
            hint = f'quote it: {key}: "{spot.text}"'
    elif kind in ("int_type", "float_type") and isinstance(error.get("input"), bool):
        hint = (
            f"write a number, not true/false; {hint}" if hint else "write a number, not true/false"
        )
    elif kind in ("int_type", "float_type", "bool_type") and quoted:
        hint = f"remove the quotes; {hint}" if hint else "remove the quotes"

    names_the_value = kind in ("extra_forbidden", "invalid_key") or "got" in ctx
    if _is_env_value(path) and not names_the_value:
        got = "a value (hidden: env values may be secrets)"
    line = _line_for(path, where)
    return _Problem(line, _format_path(path), problem, got, allowed, hint)


def _ambiguous_text(value: Any, written: str, *, hidden: bool) -> str:
    """Why a bare YAML value cannot stand for argv or env text: what YAML made of it."""
    if isinstance(value, bool):
        made = "true/false"
    elif isinstance(value, (int, float)):
        made = "a number" if hidden else f"the number {value!r}"
    elif value is None:
        made = "null (nothing)"
    else:
        return "must be text"
    subject = "it" if hidden else written
    return f"must be text, and YAML reads {subject} as {made}, so what was meant is unclear"


def _line_for(path: tuple[Any, ...], where: dict[_PathKey, _Where]) -> int:
    """The line of ``path``, or of its nearest parent that exists (where a missing key goes)."""
    for end in range(len(path), 0, -1):
        spot = where.get(path[:end])
        if spot is not None:
            return spot.line
    root = where.get(())
    return root.line if root is not None else 1


# ------------------------------------------------------------------- public API


def parse_config(
    text: str | bytes, source: Path, overrides: Mapping[str, Any] | None = None
) -> DrillConfig:
    """Validate the YAML ``text`` of the config file at ``source``.

    ``overrides`` maps dotted YAML key paths (``expectations.maxRecoveryTime``) to values
    written as in YAML (``"30s"``, ``"step-100"``); they replace or add keys before
    validation (the pytest marker's ``overrides=``).

    ``source`` names the file in messages and anchors relative paths (its folder) and
    the default name (its stem); it need not exist. Raises :class:`ConfigError` listing
    every problem found, one per line.
    """
    source = Path(source)
    file = str(source)
    if len(text) > MAX_CONFIG_BYTES:
        unit = "bytes" if isinstance(text, bytes) else "characters"
        raise ConfigError(
            _Problem(
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
                _Problem(
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
    except _Refused as exc:
        raise ConfigError(
            _Problem(
                exc.line,
                "(YAML)",
                exc.problem,
                _source_line(text, exc.line),
                "plain YAML",
                exc.hint,
            ).render(file)
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(_syntax_problem(exc, text).render(file)) from None
    except RecursionError:  # pragma: no cover - depth is bounded while composing
        raise ConfigError(
            _Problem(1, "(YAML)", "is nested too deeply", "", "plain YAML", "").render(file)
        ) from None

    if node is None:
        raise ConfigError(
            _Problem(
                1,
                "(file)",
                "is empty",
                "no YAML content",
                "a mapping with workload, injectFailure and expectations",
                "see docs/config.md for a complete example",
            ).render(file)
        )

    reader = _Reader(_Loader(""))
    data = reader.read(node, ())
    if data is _INVALID:  # the whole document was refused (e.g. a tagged root)
        raise ConfigError("\n".join(p.render(file) for p in sorted(reader.problems)))
    reader.where[()] = _Where(node.start_mark.line + 1, _describe(data))
    if not isinstance(data, dict):
        raise ConfigError(
            "\n".join(
                p.render(file)
                for p in sorted(
                    [
                        *reader.problems,
                        _Problem(
                            node.start_mark.line + 1,
                            "(top level)",
                            "must be a mapping of keys",
                            _describe(data),
                            "a mapping with workload, injectFailure and expectations",
                            "start the file with workload:",
                        ),
                    ]
                )
            )
        )

    for dotted, value in (overrides or {}).items():
        node_data: Any = data
        *parents, last = dotted.split(".")
        for key in parents:
            child = node_data.get(key)
            if not isinstance(child, dict):
                child = {}
                node_data[key] = child
            node_data = child
        node_data[last] = value
        reader.where[tuple(dotted.split("."))] = _Where(0, _describe(value))

    for reserved in _ROOT_ONLY_IN_PYTHON:
        if reserved in data:
            where = reader.where[(reserved,)]
            reader.problems.append(
                _Problem(
                    where.line,
                    reserved,
                    "unknown key",
                    reserved,
                    ", ".join(_allowed_keys(DrillConfig)),
                    "the loader sets it; remove it",
                )
            )
            del data[reserved]

    problems = list(reader.problems)
    context = {"yaml": True, "source": source.absolute(), "base_dir": source.absolute().parent}
    config: DrillConfig | None = None
    try:
        config = DrillConfig.model_validate(data, context=context, by_alias=True, by_name=False)
    except ValidationError as exc:
        section = data.get("workload")
        workload = (
            _workload_model(section.get("orchestrator")) if isinstance(section, dict) else None
        )
        for error in exc.errors(include_url=False):
            if error.get("input") is not _INVALID:
                problems.append(_translate(error, reader.where, workload))
        problems.extend(_cross_checks(data, reader.where, problems))
    if problems or config is None:
        unique = sorted(set(problems))
        if not unique:  # pragma: no cover - a failed validation always yields a problem
            unique = [_Problem(1, "(top level)", "is not a valid drill config", "", "", "")]
        raise ConfigError("\n".join(p.render(file) for p in unique))
    return config


def _cross_checks(
    data: dict[Any, Any], where: dict[_PathKey, _Where], found: list[_Problem]
) -> list[_Problem]:
    """Checks across sections that pydantic skips when a section itself is invalid.

    The same checks run inside the models when everything else is valid; here they run on
    the raw values so that one run of ``validate`` lists every problem.
    """
    extra: list[_Problem] = []
    workload, failure = data.get("workload"), data.get("injectFailure")
    if not (isinstance(workload, dict) and isinstance(failure, dict)):
        return extra
    orchestrator, kind = workload.get("orchestrator"), failure.get("type")
    already = any(p.path == "injectFailure.type" for p in found)
    if already or not isinstance(kind, str) or kind not in fault_types():
        return extra
    if not isinstance(orchestrator, str) or _workload_model(orchestrator) is None:
        return extra  # reported at workload.orchestrator
    refused = fault_refusal(orchestrator, kind)
    if refused is not None:
        problem, allowed, hint = refused
        extra.append(
            _Problem(
                _line_for(("injectFailure", "type"), where),
                "injectFailure.type",
                problem,
                kind,
                allowed,
                hint,
            )
        )
    return extra


def _source_line(text: str, line: int) -> str:
    lines = text.splitlines()
    return _shorten(repr(lines[line - 1])) if 0 < line <= len(lines) else "the end of the file"


def load_config(
    path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None
) -> DrillConfig:
    """Read and validate the drill config file at ``path``; raise :class:`ConfigError`.

    ``overrides``: see :func:`parse_config`."""
    source = Path(path)
    file = str(source)
    try:
        if source.is_dir():
            found = sorted(p.name for p in source.iterdir() if p.suffix in (".yaml", ".yml"))[:5]
            hint = f"e.g. {source / found[0]}" if found else "pass the YAML file itself"
            raise ConfigError(
                _Problem(
                    0, "(file)", "is a folder, not a file", file, "a recovery-test.yaml file", hint
                )
                .render(file)
                .replace(f"{file} (override):", f"{file}:", 1)
            )
        with source.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)  # more is refused unread
    except FileNotFoundError:
        raise ConfigError(
            f"{file}: (file): does not exist — got {source.absolute()}; allowed: a path to a "
            f"YAML file (check the path; it is relative to {Path.cwd()})"
        ) from None
    except PermissionError:
        raise ConfigError(
            f"{file}: (file): cannot be read (permission denied) — got {source.absolute()}; "
            "allowed: a readable file (check its permissions)"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"{file}: (file): cannot be read ({exc.strerror or exc}) — got {source.absolute()}; "
            "allowed: a readable YAML file"
        ) from None
    return parse_config(data, source, overrides)


def dump_effective(config: DrillConfig) -> dict[str, Any]:
    """The normalized config in YAML key names, defaults filled in, for headers and ``validate``.

    Durations come back as ``5m``, step numbers as ``step-N``, paths as absolute strings;
    ``timeouts.recovery`` left out shows the deadline the drill derives from the SLO
    (:attr:`~pytest_recoverygate.engine.DrillSpec.effective_recovery_timeout`). Environment
    values of the job are never included (they may be secrets): each shows as
    ``<redacted>``.
    """
    dumped = config.model_dump(mode="json", by_alias=True, exclude={"source_path"})
    _rewrite(dumped, type(config), type(config.workload))
    timeouts = dumped.get("timeouts")
    if isinstance(timeouts, dict) and config.timeouts.recovery is None:
        effective = spec_from_config(config).effective_recovery_timeout
        timeouts["recovery"] = format_duration(min(effective, MAX_DURATION))  # loads back
    workload = dumped.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("env"), dict):
        workload["env"] = dict.fromkeys(workload["env"], "<redacted>")
    return dumped


def _format_step(value: Any) -> Any:
    return (
        format_step_ref(value) if isinstance(value, int) and not isinstance(value, bool) else value
    )


def _format_seconds(value: Any) -> Any:
    return (
        format_duration(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else value
    )


def _kind(info: FieldInfo) -> str | None:
    """``duration`` or ``step`` for a field validated by the schema's helpers of that name."""
    for item in info.metadata:
        kind = getattr(getattr(item, "func", None), "kind", None)
        if isinstance(kind, str):
            return kind
    return None


def _rewrite(
    dumped: dict[str, Any], model: type[BaseModel], workload: type[WorkloadBase] | None
) -> None:
    """Format durations and step numbers of a dumped model back into the YAML language."""
    for name, info in model.model_fields.items():
        key = info.alias or name
        if key not in dumped:
            continue
        value = dumped[key]
        kind = _kind(info)
        if kind == "duration":
            dumped[key] = _format_seconds(value)
        elif kind == "step":
            dumped[key] = _format_step(value)
        elif isinstance(value, dict):
            inner = (
                _inner_model(model, name, info, workload) if issubclass(model, Section) else None
            )
            if inner is not None:
                _rewrite(value, inner, None)


def schema_keys() -> list[tuple[str, str, str]]:
    """Every key of the schema as (section, YAML key, what is allowed), in schema order,
    with each installed backend's ``workload`` keys (and its nested sections).

    The reference in ``docs/config.md`` is checked against this list, so a key added to a
    model without documentation fails a test.
    """
    from pytest_recoverygate.orchestrators import all_backends

    sections: list[tuple[str, type[BaseModel]]] = [("", DrillConfig)]
    for name, backend in all_backends().items():
        sections.append((f"workload ({name})", backend.workload))
        sections += _nested_sections("workload", backend.workload)
    sections += [
        ("injectFailure", InjectFailure),
        ("expectations", Expectations),
        ("safety", Safety),
        ("timeouts", Timeouts),
    ]
    keys: list[tuple[str, str, str]] = []
    for section, model in sections:
        for name, info in model.model_fields.items():
            if name == "source_path":
                continue
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            keys.append((section, info.alias or name, _allowed_text(extra)))
    return keys


def _nested_sections(prefix: str, model: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    """A backend's own nested sections (``workload.fake``), depth first."""
    found: list[tuple[str, type[BaseModel]]] = []
    for name, info in model.model_fields.items():
        inner = _models_in(info.annotation)
        if len(inner) == 1 and issubclass(inner[0], Section):
            section = f"{prefix}.{info.alias or name}"
            found += [(section, inner[0]), *_nested_sections(section, inner[0])]
    return found
