"""The engine's input values as plain JSON, and back, checked field by field.

Every value that crosses the door into the engine is a frozen dataclass of the engine's
model (:class:`~pytest_recoverygate.engine.model.TrainingEvent`, ``GroupEvent`` with its
``Worker``, ``KillResult``, ``StorageEvent``), the
:class:`~pytest_recoverygate.engine.spec.DrillSpec` with its parts, an enum or a plain
value. :func:`encode` writes each dataclass as an
object of *all* its fields (a default changed later must not change what a transcript
says), enums by their value, tuples as lists; floats keep their exact value (``repr``
round-trips; NaN and the infinities as Python's ``json`` writes them).

:func:`decode` is the way back, driven by the dataclass's own type hints, and refuses
anything that is not exactly such a value: an unknown or missing field, a string where an
int belongs, a bool for an int, an enum value that does not exist. A transcript is hostile
input; a :class:`ShapeError` names the field's path (``event.digest_parts[2][0]``).
An int where a float is declared stays an int (a spec written with ``maxRecoveryTime=5``
is replayed with 5, as it ran).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, Literal, TypeVar, Union

__all__ = ["ShapeError", "decode", "decode_value", "encode"]

_T = TypeVar("_T")

#: JSON nesting a value may have (a transcript's deepest: a call, its event, its worker,
#: the worker's details, one pair).
MAX_NESTING = 8


class ShapeError(ValueError):
    """A JSON value that is not the engine value it should be; ``path`` names where."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


def encode(value: Any) -> Any:
    """``value`` (a dataclass, enum, tuple, dict or scalar) as a JSON-able value."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: encode(getattr(value, name)) for name in _field_names(type(value))}
    if isinstance(value, enum.Enum):
        return encode(value.value)
    if isinstance(value, (tuple, list)):
        return [encode(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): encode(item) for key, item in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{type(value).__name__} is no engine value a transcript can hold")


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def decode(cls: type[_T], data: Any, path: str = "") -> _T:
    """The dataclass ``cls`` from its JSON object ``data``; :class:`ShapeError` if it is
    not one (a missing field with a default takes it: a shorter, older writer)."""
    value: _T = decode_value(cls, data, path)
    return value


def decode_value(kind: Any, data: Any, path: str = "", depth: int = 0) -> Any:
    """A value of the type ``kind`` (a type hint) from JSON ``data``."""
    if depth > MAX_NESTING:
        raise ShapeError(path, f"nested deeper than {MAX_NESTING} levels")
    if kind is Any:
        return _plain(data, path, depth)
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        options = typing.get_args(kind)
        if data is None and type(None) in options:
            return None
        others = [option for option in options if option is not type(None)]
        problems = []
        for option in others:
            try:
                return decode_value(option, data, path, depth)
            except ShapeError as exc:
                problems.append(exc.problem)
        raise ShapeError(path, " or ".join(dict.fromkeys(problems)))
    if origin is Literal:
        allowed = typing.get_args(kind)
        if data in allowed and isinstance(data, str):
            return data
        raise ShapeError(path, f"{_shown(data)} is not one of {', '.join(map(repr, allowed))}")
    if origin is tuple:
        return _tuple(kind, data, path, depth)
    if origin is dict:
        key_kind, item_kind = typing.get_args(kind)
        if not isinstance(data, dict):
            raise ShapeError(path, f"{_shown(data)} is not an object")
        return {
            decode_value(key_kind, key, f"{path}.{key}", depth + 1): decode_value(
                item_kind, item, f"{path}.{key}", depth + 1
            )
            for key, item in data.items()
        }
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        for member in kind:
            if member.value == data and type(member.value) is type(data):
                return member
        raise ShapeError(path, f"{_shown(data)} is no {kind.__name__}")
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _dataclass(kind, data, path, depth)
    return _scalar(kind, data, path)


def _tuple(kind: Any, data: Any, path: str, depth: int) -> tuple[Any, ...]:
    if not isinstance(data, list):
        raise ShapeError(path, f"{_shown(data)} is not a list")
    args = typing.get_args(kind)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(
            decode_value(args[0], item, f"{path}[{i}]", depth + 1) for i, item in enumerate(data)
        )
    if len(data) != len(args):
        raise ShapeError(path, f"a list of {len(data)} values, not {len(args)}")
    return tuple(
        decode_value(arg, item, f"{path}[{i}]", depth + 1)
        for i, (arg, item) in enumerate(zip(args, data, strict=True))
    )


def _dataclass(kind: type, data: Any, path: str, depth: int) -> Any:
    if not isinstance(data, dict):
        raise ShapeError(path, f"{_shown(data)} is not an object ({kind.__name__})")
    hints = _hints(kind)
    names = _field_names(kind)
    unknown = [key for key in data if key not in names]
    if unknown:
        raise ShapeError(path, f"unknown field {unknown[0]!r} of {kind.__name__}")
    values = {}
    for field in dataclasses.fields(kind):
        where = f"{path}.{field.name}" if path else field.name
        if field.name not in data:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise ShapeError(where, f"missing (a field of {kind.__name__})")
            continue
        values[field.name] = decode_value(hints[field.name], data[field.name], where, depth + 1)
    return kind(**values)


def _scalar(kind: Any, data: Any, path: str) -> Any:
    if kind is bool:
        if isinstance(data, bool):
            return data
    elif kind is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
    elif kind is float:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return data  # an int stays an int: the value as the drill had it
    elif kind is str:
        if isinstance(data, str):
            return data
    elif kind is type(None):
        if data is None:
            return None
    else:  # pragma: no cover - a hint this codec does not know is a bug here, not input
        raise TypeError(f"no decoder for {kind!r}")
    return _refuse(kind, data, path)


def _refuse(kind: Any, data: Any, path: str) -> Any:
    name = getattr(kind, "__name__", str(kind))
    raise ShapeError(path, f"{_shown(data)} is not {'an' if name == 'int' else 'a'} {name}")


def _plain(data: Any, path: str, depth: int) -> Any:
    """Any JSON value (a timeline note's data), nested at most :data:`MAX_NESTING`."""
    if depth > MAX_NESTING:
        raise ShapeError(path, f"nested deeper than {MAX_NESTING} levels")
    if isinstance(data, list):
        return [_plain(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(data)]
    if isinstance(data, dict):
        return {key: _plain(item, f"{path}.{key}", depth + 1) for key, item in data.items()}
    return data


def _shown(data: Any) -> str:
    """A JSON value in an error message, short."""
    if isinstance(data, dict):
        return "an object"
    if isinstance(data, list):
        return "a list"
    text = repr(data)
    return text if len(text) <= 40 else text[:37] + "..."
