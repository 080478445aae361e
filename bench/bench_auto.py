"""Benchmark: what ``recoverygate-auto.pth`` costs every Python start-up.

The reporter distribution puts one ``.pth`` file into site-packages, so its line runs in
*every* interpreter of that environment, training job or not. With
``RECOVERYGATE_AUTO`` unset it must cost one environment lookup and nothing else
(issue 16). Targets, each against a limit measured in the same run:

- the line's code, compiled once, with the variable unset <= 2x one
  ``os.environ.get("RECOVERYGATE_AUTO", "")`` (``import os`` of a loaded module and a
  tuple test are the only other work; ``timeit``, best of interleaved repetitions);
- the whole file at start-up (``site.addsitedir`` of a folder holding only it, minus the
  same call on an empty folder: open, read, compile, run) <= 1 % of ``python -c pass``
  (median of subprocess runs);
- with the variable unset nothing is imported (``sys.modules`` unchanged): shown, and
  checked by tests/test_bench_smoke.py.

For context: ``install()`` when the variable is set (import of the hook module and one
finder on ``sys.meta_path``), and what the finder adds to every later import of a
module it does not watch (one ``find_spec`` call that returns at a set lookup).
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import REPORTER_DIR, Result, info, main_for, median, subprocess_env

PTH = REPORTER_DIR / "recoverygate-auto.pth"


def _best(stmt: str, env: dict[str, object], number: int, repeat: int) -> float:
    """Best time per call, in ns."""
    timer = timeit.Timer(stmt, globals=env)
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e9


def line_cost(quick: bool) -> list[Result]:
    os.environ.pop("RECOVERYGATE_AUTO", None)
    text = PTH.read_text().strip()
    code = compile(text, str(PTH), "exec")
    number, repeat = (20_000, 5) if quick else (200_000, 15)
    env: dict[str, object] = {"code": code, "os": os, "text": text}
    line: list[float] = []
    lookup: list[float] = []
    compiled: list[float] = []
    for _ in range(3):  # interleaved: the machine's load drifts
        line.append(_best("exec(code, {})", env, number, repeat))
        lookup.append(_best('os.environ.get("RECOVERYGATE_AUTO", "")', env, number, repeat))
        compiled.append(_best("exec(text, {})", env, number // 10, repeat))
    empty = _best("exec(compile('pass', 'x', 'exec'), {})", env, number // 10, repeat)
    before = set(sys.modules)
    exec(code, {})
    imported = sorted(set(sys.modules) - before)
    return [
        Result(
            "the .pth line, variable unset (compiled once)",
            min(line),
            2 * min(lookup),
            "ns",
            baseline=f"2x os.environ.get ({min(lookup):.0f} ns)",
            note=f"{min(line) / min(lookup):.2f}x one environment lookup",
        ),
        info(
            "  as site runs it: compile + exec of the line",
            min(compiled),
            "ns",
            note=f"compile + exec of 'pass' alone: {empty:.0f} ns",
        ),
        info(
            "modules imported by the line, variable unset (must be 0)",
            float(len(imported)),
            "modules",
            note=", ".join(imported) or "none",
        ),
    ]


def startup_cost(quick: bool) -> list[Result]:
    os.environ.pop("RECOVERYGATE_AUTO", None)
    reps = 200 if quick else 2000
    with tempfile.TemporaryDirectory(prefix="rg-bench-pth-") as tmp:
        with_pth = Path(tmp, "with")
        without = Path(tmp, "without")
        with_pth.mkdir()
        without.mkdir()
        (with_pth / PTH.name).write_bytes(PTH.read_bytes())
        saved_path = list(sys.path)
        a: list[float] = []
        b: list[float] = []
        try:
            for _ in range(reps):
                for folder, out in ((with_pth, a), (without, b)):
                    sys.path[:] = saved_path
                    t0 = time.perf_counter_ns()
                    site.addsitedir(str(folder), set())
                    out.append(time.perf_counter_ns() - t0)
        finally:
            sys.path[:] = saved_path
    file_us = max(median(a) - median(b), 0.0) / 1e3
    runs = 5 if quick else 21
    env = subprocess_env()
    env.pop("RECOVERYGATE_AUTO", None)
    starts: list[float] = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        starts.append(time.perf_counter() - began)
    start_us = median(starts) * 1e6
    return [
        Result(
            "the .pth file at start-up, variable unset",
            file_us,
            0.01 * start_us,
            "µs",
            baseline=f"1% of python -c pass ({start_us / 1e3:.1f} ms)",
            note=f"site.addsitedir with it {median(a) / 1e3:.1f} µs, "
            f"without {median(b) / 1e3:.1f} µs (medians of {reps})",
        ),
    ]


def enabled_cost(quick: bool) -> list[Result]:
    code = (
        "import time; t0 = time.perf_counter(); "
        "import recoverygate.integrations.auto as a; t1 = time.perf_counter(); "
        "a.install('1'); t2 = time.perf_counter(); "
        "print((t1 - t0) * 1e6, (t2 - t1) * 1e6)"
    )
    with tempfile.TemporaryDirectory(prefix="rg-bench-pycache-") as pycache:
        env = subprocess_env(PYTHONPYCACHEPREFIX=pycache)  # bytecode cached, as installed
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.pop("RECOVERYGATE_AUTO", None)
        samples = []
        for _ in range(3 if quick else 11):
            out = subprocess.run(
                [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
            ).stdout.split()
            samples.append((float(out[0]), float(out[1])))
    import_us = median([s[0] for s in samples[1:]])
    install_us = median([s[1] for s in samples[1:]])
    from recoverygate.integrations import auto

    finder = auto._Finder(frozenset({"transformers.trainer"}))
    number = 20_000 if quick else 200_000
    miss = (
        min(timeit.repeat(lambda: finder.find_spec("json.decoder", None), number=number, repeat=5))
        / number
        * 1e9
    )
    return [
        info("RECOVERYGATE_AUTO=1: import of the hook module (bytecode cached)", import_us, "µs"),
        info("RECOVERYGATE_AUTO=1: install() (one finder on sys.meta_path)", install_us, "µs"),
        info(
            "RECOVERYGATE_AUTO=1: the finder on an import it does not watch",
            miss,
            "ns",
            note="one set lookup per import of a module not yet loaded",
        ),
    ]


def run(quick: bool) -> list[Result]:
    return line_cost(quick) + startup_cost(quick) + enabled_cost(quick)


if __name__ == "__main__":
    main_for("auto", run)
