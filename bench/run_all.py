"""Run every RecoveryGate benchmark: ``python bench/run_all.py [--quick] [--only NAME]``.

Each benchmark runs in its own Python process (no shared imports, caches or peak RSS),
prints its table and its ``BENCH-JSON`` line; this script then prints one summary table
of every target and, with ``--json PATH``, writes all the documents to PATH. Exit code 0
when every target passed, 1 when one was missed, 2 when a benchmark crashed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if __package__ in (None, ""):
    sys.path.insert(0, str(HERE.parent))

from bench._common import machine, subprocess_env  # noqa: E402

#: Benchmarks in the order they run (the slow real drills last).
BENCHMARKS = (
    "reporter",
    "parser",
    "latency",
    "overhead",
    "scale",
    "digest",
    "auto",
    "evidence",
    "accuracy",
)


def run_one(name: str, quick: bool) -> dict[str, Any] | None:
    cmd = [sys.executable, str(HERE / f"bench_{name}.py")] + (["--quick"] if quick else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=subprocess_env(), text=True)
    assert proc.stdout is not None
    doc: dict[str, Any] | None = None
    for line in proc.stdout:
        if line.startswith("BENCH-JSON "):
            doc = json.loads(line[len("BENCH-JSON ") :])
        print(line, end="", flush=True)
    proc.wait()
    if proc.returncode != 0 or doc is None:
        print(f"!! bench_{name} failed (exit {proc.returncode})", file=sys.stderr)
        return None
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    parser.add_argument(
        "--only",
        action="append",
        choices=BENCHMARKS,
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument("--json", type=Path, help="write every benchmark's document here")
    args = parser.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    started = time.monotonic()
    print(f"machine: {json.dumps(machine())}", flush=True)
    docs, crashed = [], []
    for name in names:
        doc = run_one(name, args.quick)
        if doc is None:
            crashed.append(name)
        else:
            docs.append(doc)
    print(f"\n== summary ({time.monotonic() - started:.0f} s, load {os.getloadavg()[0]:.2f}) ==")
    for doc in docs:
        for r in doc["results"]:
            if r["passed"] is None:
                continue
            verdict = "pass" if r["passed"] else "MISS"
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
            print(
                f"{verdict:4}  {doc['bench']:9} {r['name']}: {r['measured']:.4g} "
                f"{r['op']} {r['limit']:.4g} {r['unit']} (ratio {ratio})"
            )
    for name in crashed:
        print(f"CRASH {name}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"machine": machine(), "quick": args.quick, "benchmarks": docs, "crashed": crashed},
                indent=1,
            )
        )
    if crashed:
        return 2
    return 0 if all(doc["passed"] for doc in docs) else 1


if __name__ == "__main__":
    sys.exit(main())
