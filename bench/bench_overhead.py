"""Benchmark 5: what the tool itself adds: verdict latency, CLI start, reporter import.

Targets (issue 6, target 5), each against a limit measured in this run:

- the verdict arrives <= 100 ms after the deciding event: real local drills (1 with
  ``--quick``, 3 otherwise; see :mod:`bench._drills`), from the deciding progress line's
  emitter timestamp (``killTime + breakdown.firstStepAfterResume`` in the report) to the
  runner acting on the verdict (its ``cleanup()`` call);
- ``recoverygate --help`` <= 300 ms and <= 2x ``python -c "import yaml"`` (interpreter
  start plus the pyyaml import, our reading of "``python -c pass`` + pyyaml import");
  medians of interleaved runs of the installed console script and the same interpreter;
- ``import recoverygate.reporter`` <= 5 ms: ``python -X importtime`` (the package and the
  module, cumulative), and subprocess time minus ``python -c pass`` (medians).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import REPORTER_DIR, Result, info, main_for, median, subprocess_env


def _installed_env(pycache: str) -> dict[str, str]:
    """As after ``pip install``: bytecode cached (this shell sets PYTHONDONTWRITEBYTECODE=1,
    which would make every run compile the sources; the cache goes to a temporary folder)."""
    env = subprocess_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def _time(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def cli_start(quick: bool, pycache: str) -> list[Result]:
    reps = 5 if quick else 15
    exe = Path(sys.executable)
    script = exe.parent / "recoverygate"
    cli = (
        [str(script), "--help"]
        if script.exists()
        else ([shutil.which("recoverygate") or "recoverygate", "--help"])
    )
    env = _installed_env(pycache)
    cases = {
        "cli": cli,
        "pass": [str(exe), "-c", "pass"],
        "yaml": [str(exe), "-c", "import yaml"],
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for cmd in cases.values():
        _time(cmd, env)  # warm the page cache
    for _ in range(reps):
        for name, cmd in cases.items():
            times[name].append(_time(cmd, env))
    cli_s, pass_s, yaml_s = (median(times[k]) for k in ("cli", "pass", "yaml"))
    return [
        Result(
            "recoverygate --help, wall",
            cli_s * 1e3,
            300.0,
            "ms",
            note=f"median of {reps}; python -c pass {pass_s * 1e3:.1f} ms, "
            f"python -c 'import yaml' {yaml_s * 1e3:.1f} ms",
            extra={"cli_ms": [t * 1e3 for t in times["cli"]]},
        ),
        Result(
            "recoverygate --help vs python -c 'import yaml'",
            cli_s * 1e3,
            2 * yaml_s * 1e3,
            "ms",
            baseline=f"2x python -c 'import yaml' ({yaml_s * 1e3:.1f} ms)",
            note=f"{cli_s / yaml_s:.2f}x; {cli_s / pass_s:.2f}x python -c pass",
        ),
    ]


def _importtime(env: dict[str, str]) -> float:
    """Cumulative microseconds of the recoverygate package and recoverygate.reporter."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import recoverygate.reporter"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    total = 0
    for line in proc.stderr.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] in ("recoverygate", "recoverygate.reporter"):
            total += int(parts[1])
    return total


def reporter_import(quick: bool, pycache: str) -> list[Result]:
    reps = 7 if quick else 21
    env = _installed_env(pycache)
    env["PYTHONPATH"] = str(REPORTER_DIR)  # the reporter alone, as a training job has it
    exe = sys.executable
    imp = [exe, "-c", "import recoverygate.reporter"]
    bare = [exe, "-c", "pass"]
    _time(imp, env)  # writes the bytecode cache
    nocache = subprocess_env(PYTHONDONTWRITEBYTECODE="1")
    nocache["PYTHONPATH"] = str(REPORTER_DIR)
    compiling = median([_importtime(nocache) for _ in range(reps)]) / 1e3
    diffs = []
    for _ in range(reps):
        diffs.append(_time(imp, env) - _time(bare, env))
    importtime = median([_importtime(env) for _ in range(reps)]) / 1e3
    proc = subprocess.run(
        [
            exe,
            "-c",
            "import sys; before = set(sys.modules); import recoverygate.reporter; "
            "print(sorted(set(sys.modules) - before))",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return [
        Result(
            "import recoverygate.reporter (-X importtime, cumulative)",
            importtime,
            5.0,
            "ms",
            note=f"median of {reps}; new modules: {proc.stdout.strip()}",
        ),
        info(
            "  import recoverygate.reporter (subprocess minus python -c pass)",
            median(diffs) * 1e3,
            "ms",
            note=f"median of {reps} paired differences",
        ),
        info(
            "  import recoverygate.reporter without a bytecode cache (-X importtime)",
            compiling,
            "ms",
            note="PYTHONDONTWRITEBYTECODE=1: the sources are compiled "
            "at every start; an installed package has its .pyc",
        ),
    ]


def verdict_latency(quick: bool) -> list[Result]:
    from bench._drills import run_local_drill

    drills = 1 if quick else 3
    latencies = []
    for _ in range(drills):
        outcome = run_local_drill()
        if outcome.verdict_latency is not None:
            latencies.append(outcome.verdict_latency * 1e3)
    worst = max(latencies) if latencies else float("inf")
    return [
        Result(
            "verdict after the deciding event (local drill, worst)",
            worst,
            100.0,
            "ms",
            note=f"{len(latencies)} of {drills} real drills: "
            + ", ".join(f"{x:.2f}" for x in latencies)
            + " ms",
        ),
    ]


def run(quick: bool) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="rg-bench-pycache-") as pycache:
        return cli_start(quick, pycache) + reporter_import(quick, pycache) + verdict_latency(quick)


if __name__ == "__main__":
    main_for("overhead", run)
