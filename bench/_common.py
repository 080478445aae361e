"""What every benchmark shares: the result record, the table, the JSON line, the machine.

Why ratios: absolute times drift on a shared 2-core machine, so each figure is reported
next to a limit measured in the same run (an empty call, ``grep -F``, ``python -c pass``)
or fixed by the issue, and the verdict is the ratio ``measured / limit``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPORTER_DIR = ROOT / "reporter"
for _path in (str(ROOT), str(REPORTER_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

#: The environment that makes subprocesses import this checkout (``recoverygate``, the tool).
PYTHONPATH = os.pathsep.join([str(ROOT), str(REPORTER_DIR)])

#: The fields every result carries in the JSON line (tests/test_bench_smoke.py checks them).
RESULT_FIELDS = ("name", "measured", "limit", "unit", "op", "ratio", "passed")


@dataclass
class Result:
    """One target: ``measured`` against ``limit`` (``op`` is ``<=`` or ``>=``).

    ``ratio`` is ``measured / limit``: a ``<=`` target passes at ratio <= 1, a ``>=`` target
    at ratio >= 1. ``passed`` is None for figures reported for information only.
    ``baseline`` names the same-run reference the limit was derived from, if any.
    """

    name: str
    measured: float
    limit: float | None
    unit: str
    op: str = "<="
    ratio: float | None = None
    passed: bool | None = None
    baseline: str = ""
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.limit is not None and self.ratio is None and self.limit != 0:
            self.ratio = self.measured / self.limit
        if self.limit is not None and self.passed is None:
            self.passed = (
                self.measured <= self.limit if self.op == "<=" else self.measured >= self.limit
            )


def info(
    name: str, measured: float, unit: str, note: str = "", *, extra: dict[str, Any] | None = None
) -> Result:
    """A figure shown for context, with no target of its own."""
    return Result(name, measured, None, unit, op="", note=note, extra=dict(extra or {}))


def machine() -> dict[str, Any]:
    """The machine and its load, recorded with every result."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.01:
        return f"{value:.3f}"
    return f"{value:.2e}"


def table(results: Sequence[Result]) -> str:
    """The results as a small fixed-width table."""
    rows = [("target", "measured", "limit", "unit", "ratio", "verdict")]
    for r in results:
        verdict = "info" if r.passed is None else ("pass" if r.passed else "MISS")
        limit = "-" if r.limit is None else f"{r.op} {_fmt(r.limit)}"
        rows.append((r.name, _fmt(r.measured), limit, r.unit, _fmt(r.ratio), verdict))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  * {r.name}: {r.note}" for r in results if r.note]
    return "\n".join(lines + notes)


def emit(bench: str, results: Sequence[Result], *, quick: bool, started: float) -> dict[str, Any]:
    """Print the table, then one JSON line (prefixed ``BENCH-JSON ``) and return the doc."""
    doc = {
        "bench": bench,
        "quick": quick,
        "seconds": round(time.monotonic() - started, 2),
        "machine": machine(),
        "results": [asdict(r) for r in results],
        "passed": all(r.passed is not False for r in results),
    }
    print(f"\n== {bench} ({'quick' if quick else 'full'}, {doc['seconds']} s) ==")
    print(table(results))
    print("BENCH-JSON " + json.dumps(doc, default=str), flush=True)
    return doc


def main_for(bench: str, run: Callable[[bool], list[Result]]) -> None:
    """The command line every benchmark module shares: ``--quick``."""
    parser = argparse.ArgumentParser(description=f"RecoveryGate benchmark: {bench}")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    args = parser.parse_args()
    started = time.monotonic()
    emit(bench, run(args.quick), quick=args.quick, started=started)


# ---------------------------------------------------------------------- measuring helpers


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between ranks."""
    data = sorted(values)
    if not data:
        return float("nan")
    k = (len(data) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def cpu_self() -> float:
    """User + system CPU seconds of this process (all threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def cpu_children() -> float:
    """User + system CPU seconds of waited-for children."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def maxrss_mib() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment plus a PYTHONPATH that imports the checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHONPATH + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env.update(extra)
    return env
