"""Durations (``90s``, ``5m``, ``1h30m``, ``250ms``) and step references (``step-1000``).

These are the two small languages of ``recovery-test.yaml``. They live apart from the
config models so the engine, the CLI and the report can format figures the same way the
user wrote them, without importing pydantic.

A duration is one or more ``<number><unit>`` parts (units ``h``, ``m``, ``s``, ``ms``;
the number may have a fraction), summed: ``1h30m`` is 5400 seconds. A bare number is
refused on purpose: ``300`` could mean seconds or minutes, so we ask for ``300s``.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "DurationSyntaxError",
    "StepRefSyntaxError",
    "format_duration",
    "format_step_ref",
    "parse_duration",
    "parse_step_ref",
]

_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
# Bounded digit counts keep a hostile "99999…" from turning into a giant int or float.
_PART = re.compile(r"(\d{1,9}(?:\.\d{1,9})?)(ms|h|m|s)")
_WHOLE = re.compile(r"(?:\d{1,9}(?:\.\d{1,9})?(?:ms|h|m|s))+")
_STEP = re.compile(r"step-(\d{1,18})")


class DurationSyntaxError(ValueError):
    """The text is not a duration such as ``90s``, ``5m``, ``1h30m`` or ``250ms``."""


class StepRefSyntaxError(ValueError):
    """The text is not a step reference such as ``step-1000``."""


def parse_duration(text: str) -> float:
    """Return the duration ``text`` in seconds; raise :class:`DurationSyntaxError`.

    Whitespace around the value is ignored; inside it, it is not (``1h 30m`` is refused,
    so there is one way to write a value).
    """
    stripped = text.strip()
    if stripped.startswith("-"):
        raise DurationSyntaxError("a duration cannot be negative")
    if not stripped:
        raise DurationSyntaxError("a duration cannot be empty")
    if not _WHOLE.fullmatch(stripped):
        if re.fullmatch(r"\d+(?:\.\d+)?", stripped):
            raise DurationSyntaxError(f"a duration needs a unit: write {stripped}s")
        raise DurationSyntaxError("not a duration")
    total = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(stripped))
    seconds = round(total, 6)  # microseconds: "1.1m" is 66.0, not 66.00000000000001
    if not math.isfinite(seconds):  # pragma: no cover - bounded by the regex
        raise DurationSyntaxError("the duration is too large")
    return seconds


def format_duration(seconds: float) -> str:
    """Write ``seconds`` back in the config's language, shortest form first.

    ``format_duration(5400) == "1h30m"``, ``format_duration(0.25) == "250ms"``,
    ``format_duration(1.5) == "1.5s"``, ``format_duration(0.0001) == "0.0001s"``.
    Durations are kept to the microsecond, so for any duration a config accepts (up to
    30 days) the result parses back to the same float.
    """
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"cannot format {seconds!r} as a duration")
    micros = round(seconds * 1e6)
    if micros == 0:
        return "0s"
    if micros < 1_000_000 and micros % 1000 == 0:
        return f"{micros // 1000}ms"
    whole, frac = divmod(micros, 1_000_000)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = []
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    if frac:
        parts.append(f"{secs}.{frac:06d}".rstrip("0") + "s")
    elif secs:
        parts.append(f"{secs}s")
    return "".join(parts)


def parse_step_ref(text: str) -> int:
    """Return N for ``step-N``; raise :class:`StepRefSyntaxError` otherwise."""
    match = _STEP.fullmatch(text.strip())
    if match is None:
        raise StepRefSyntaxError("not a step reference")
    return int(match.group(1))


def format_step_ref(step: int) -> str:
    """Write a step number the way the config does: ``step-1000``."""
    return f"step-{step}"
