"""Load ``recovery-test.yaml`` into a validated, typed :class:`DrillConfig`: the YAML
read with its line numbers, and every problem rewritten in our words.

A drill config points a destructive tool at an expensive job, so it is checked strictly
and every problem is reported at once, each on its own line, in the form::

    FILE:LINE: key.path: problem — got VALUE; allowed: … (fix hint)

How: :mod:`pytest_recoverygate.config.yamlfile` reads the YAML with the line of every value
(anchors, aliases, deep nesting and oversized files refused while composing). The schema
(:mod:`pytest_recoverygate.config.schema`, the ``workload`` section from the backend the file
names) validates the values, and pydantic's errors are rewritten here in our words with
those lines, using each field's :func:`~pytest_recoverygate.config.schema.meta`. Nothing here
touches the cluster or the job: checking a config is safe to run anywhere
(``recoverygate validate``).

In YAML the keys are camelCase (``injectFailure.afterCheckpoint``); in Python the
attributes are snake_case (``config.inject_failure.after_checkpoint``).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from pytest_recoverygate.config.schema import (
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
from pytest_recoverygate.config.sections import PATTERN_TAGS, REPLAY_TAGS
from pytest_recoverygate.config.yamlfile import (
    INVALID,
    MAX_CONFIG_BYTES,
    PathKey,
    Problem,
    Where,
    describe,
    format_path,
    is_text_slot,
    key_text,
    line_for,
    read_document,
)
from pytest_recoverygate.durations import format_duration, format_step_ref
from pytest_recoverygate.errors import ConfigError, UsageError
from pytest_recoverygate.registry import all_backends, backend_names, get_backend

__all__ = [
    "MAX_CONFIG_BYTES",
    "RUN_TIME_DEFAULTS",
    "DrillConfig",
    "Expectations",
    "InjectFailure",
    "Safety",
    "Timeouts",
    "dump_effective",
    "injection_defaults",
    "load_config",
    "parse_config",
    "schema_keys",
]

_ROOT_ONLY_IN_PYTHON = ("sourcePath", "source_path")


def _workload_model(tag: Any) -> type[WorkloadBase] | None:
    """The model of the backend ``tag`` names, when there is one that loads."""
    if not isinstance(tag, str) or tag not in backend_names():
        return None
    try:
        return get_backend(tag).workload
    except UsageError:
        return None


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


def _misspelt(value: Any, choices: Sequence[str]) -> str:
    """ "did you mean …?" for a text value close to one of ``choices`` (a value misspelt as
    keys are: case, ``_`` and ``-`` aside, or a letter or two off), else ""."""
    if not isinstance(value, str) or not choices or len(value) > 200:
        return ""
    return _did_you_mean(value.strip(), list(choices))


def _elsewhere(key: str) -> str:
    """Name the backends where an unknown workload key would be valid."""
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


def _untagged(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """``loc`` without the union tags of ``expectations.replay`` and of an
    ``evidence.patterns`` value (they are no keys)."""
    return tuple(
        key
        for i, key in enumerate(loc)
        if not (i > 0 and loc[i - 1] == "replay" and key in REPLAY_TAGS)
        and not (i > 1 and loc[i - 2] == "patterns" and key in PATTERN_TAGS)
    )


def _translate(
    error: Mapping[str, Any],
    where: dict[PathKey, Where],
    workload: type[WorkloadBase] | None,
) -> Problem:
    """One pydantic error, rewritten with its line, key path, value, what is allowed and a fix.

    ``workload`` is the model of the backend the file names (None when it names none).
    """
    kind = str(error["type"])
    loc = _untagged(tuple(error["loc"]))
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
    got = spot.text if spot is not None else describe(error.get("input"))
    quoted = spot is not None and spot.text.startswith(("'", '"'))

    if kind in ("union_tag_invalid", "union_tag_not_found"):
        names = list(backend_names())
        path = (*path, "orchestrator")
        spot = where.get(path)
        allowed = ", ".join(names)
        if kind == "union_tag_not_found":
            problem, got = "required key is missing", "nothing"
            hint = "say which backend runs the job, e.g. orchestrator: fake"
        else:
            problem = "is not a known orchestrator"
            got = spot.text if spot is not None else describe(ctx.get("tag"))
            hint = _did_you_mean(str(ctx.get("tag", "")), names) or "e.g. orchestrator: kubernetes"
    elif kind == "missing":
        got = "nothing"
        hint = f"add {example}" if example else ""
    elif kind == "extra_forbidden":
        key = str(loc[-1])
        candidates = _allowed_keys(parent) if parent is not None else []
        allowed = ", ".join(candidates)
        got = key_text(loc[-1])
        hint = _did_you_mean(key, candidates)
        if not hint and len(path) == 2 and path[0] == "workload":
            hint = _elsewhere(key)
        hint = hint or "remove it"
    elif kind == "invalid_key":
        got = describe(loc[-1] if loc else error.get("input"))
        hint = 'quote the key: "…": value'
    elif kind == "recoverygate":
        problem = str(ctx.get("problem", problem))
        allowed = str(ctx.get("allowed") or allowed)
        hint = str(ctx.get("hint") or hint)
        if "got" in ctx:
            got = str(ctx["got"])
        hint = _misspelt(error.get("input"), ctx.get("choices") or ()) or hint
    elif kind in ("literal_error",):
        allowed = allowed or str(ctx.get("expected", ""))
        words = re.findall(r"'([^'\n]{1,64})'", str(ctx.get("expected", "")))
        hint = _misspelt(error.get("input"), words) or hint
    elif kind == "string_type" and spot is not None and not quoted:
        key = path[-1] if path else "key"
        if is_text_slot(path):
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
    line = line_for(path, where)
    return Problem(line, format_path(path), problem, got, allowed, hint)


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
    data, where, problems = read_document(text, file)

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
        where[tuple(dotted.split("."))] = Where(0, describe(value))

    for reserved in _ROOT_ONLY_IN_PYTHON:
        if reserved in data:
            spot = where[(reserved,)]
            problems.append(
                Problem(
                    spot.line,
                    reserved,
                    "unknown key",
                    reserved,
                    ", ".join(_allowed_keys(DrillConfig)),
                    "the loader sets it; remove it",
                )
            )
            del data[reserved]

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
            if error.get("input") is not INVALID:
                problems.append(_translate(error, where, workload))
        problems.extend(_cross_checks(data, where, problems))
    if problems or config is None:
        unique = sorted(set(problems))
        if not unique:  # pragma: no cover - a failed validation always yields a problem
            unique = [Problem(1, "(top level)", "is not a valid drill config", "", "", "")]
        raise ConfigError("\n".join(p.render(file) for p in unique))
    return config


def _cross_checks(
    data: dict[Any, Any], where: dict[PathKey, Where], found: list[Problem]
) -> list[Problem]:
    """Checks across sections that pydantic skips when a section itself is invalid.

    The same checks run inside the models when everything else is valid; here they run on
    the raw values so that one run of ``validate`` lists every problem.
    """
    extra: list[Problem] = []
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
            Problem(
                line_for(("injectFailure", "type"), where),
                "injectFailure.type",
                problem,
                kind,
                allowed,
                hint,
            )
        )
    return extra


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
                Problem(
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
    (:attr:`~pytest_recoverygate.engine.spec.DrillSpec.effective_recovery_timeout`). Environment
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
    for member in (workload.get("group") or []) if isinstance(workload, dict) else []:
        if isinstance(member, dict) and isinstance(member.get("env"), dict):
            # the replica ids stay: they name the members (and targetReplica checks them)
            member["env"] = {
                k: v if k in _REPLICA_VARIABLES else "<redacted>" for k, v in member["env"].items()
            }
    for section, keys in _UNSET_IS_ABSENT.items():
        part = dumped.get(section) if section else dumped
        if isinstance(part, dict):
            for key in keys:
                if part.get(key, 0) is None:
                    del part[key]
    inject = dumped.get("injectFailure")
    if isinstance(inject, dict):  # the fault's fixed defaults, in the schema's key order
        filled = {**inject, **injection_defaults(config)}
        order = [info.alias or name for name, info in InjectFailure.model_fields.items()]
        dumped["injectFailure"] = {k: filled[k] for k in order if k in filled}
    return dumped


def injection_defaults(config: DrillConfig) -> dict[str, Any]:
    """The ``injectFailure`` keys the file left out whose default is a fixed value, in
    YAML form: ``targetRank: 1`` and ``delay: 0s`` (not for KillDuringCheckpoint, where
    both come from the run: the saving rank, half the measured save), ``gracePeriod: 30s``
    (Preempt), ``mode: kill`` and ``after: 0s`` (StickyFault ``scope: node``)."""
    failure = config.inject_failure
    filled: dict[str, Any] = {}
    if failure.type != "KillDuringCheckpoint":
        if failure.target_rank is None:
            filled["targetRank"] = failure.effective_target_rank
        if failure.delay is None:
            filled["delay"] = format_duration(0.0)
    if failure.type == "Preempt" and failure.grace_period is None:
        filled["gracePeriod"] = format_duration(spec_from_config(config).grace_period)
    if failure.type == "StickyFault" and failure.scope == "node":
        if failure.mode is None:
            filled["mode"] = "kill"
        if failure.after is None:
            filled["after"] = format_duration(0.0)
    return filled


#: What ``validate`` says of the ``injectFailure`` defaults only a run can fill in.
RUN_TIME_DEFAULTS = {
    "KillDuringCheckpoint": (
        "targetRank: the rank that reports the save (workload.reportingRank)",
        "delay: half the save time measured on the first checkpoint",
    ),
}

#: A workload.group member's replica id: shown by ``dump_effective`` (not a secret).
_REPLICA_VARIABLES = ("RECOVERYGATE_REPLICA", "REPLICA_GROUP_ID")

#: Optional keys whose "not set" shows as absent (a fault's own keys, the projection).
_UNSET_IS_ABSENT = {
    "injectFailure": (
        "targetRank",
        "delay",
        "gracePeriod",
        "targetNode",
        "replace",
        "duration",
        "drainNode",
        "cordon",
        "afterCheckpoint",
        "afterStep",
        "targetReplica",
        "mode",
        "during",
        "path",
        "latency",
        "killAfter",
        "phase",
        "secondTarget",
        "scope",
        "atStep",
        "damage",
        "after",
    ),
    "expectations": (
        "maxCrashLoop",
        "maxDetectionTime",
        "restartBudget",
        "maxSurvivorStall",
        "maxRejoinTime",
        "rejoinFrom",
    ),
    "": ("projection",),
}


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
    sections: list[tuple[str, type[BaseModel]]] = [("", DrillConfig)]
    for name, backend in all_backends().items():
        sections.append((f"workload ({name})", backend.workload))
        sections += _nested_sections("workload", backend.workload)
    sections += [
        (section, model)
        for section, model in _nested_sections("", DrillConfig)
        if section.partition(".")[0] != "workload"  # each backend's, above
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
            section = f"{prefix}.{info.alias or name}" if prefix else info.alias or name
            found += [(section, inner[0]), *_nested_sections(section, inner[0])]
    return found
