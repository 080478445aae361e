"""A stress loop of one truth-corpus drill: the same job drilled N times, optionally beside
K busy loops, each run into a report folder of its own, each verdict held to the job's own
records; the folders of the runs that did not PASS are kept (issue 41, item 7).

A rare false verdict shows only in some runs on a loaded machine, and a test runs a drill
once. This loop runs it many times, one drill at a time, and keeps every run that did not
PASS: its report folder (``report.json``, ``transcript.jsonl``: ``recoverygate rejudge
FOLDER`` replays it through a fresh engine, so an engine bug reproduces there and a timing
does not), the config, and the job's ground-truth records (``tests/truth/job.py``, read by
``tests/truth/truth.py``)::

    .venv/bin/python bench/stress_drill.py --runs 20 --busy 3 --out /tmp/stress \\
        -- --progress-style=thread --heartbeat=0.005

Everything after ``--`` goes to ``job.py`` (by default the metrics-thread job of the
issue: a thread reporting the completed count every 0.1 s and once at its start, a
checkpoint every 20 steps, rank 0 reporting ``checkpoint_loaded``, every process writing a
heartbeat every 5 ms). The kill comes after checkpoint 40 (``--after``).

How the load is made: ``--busy K`` starts K processes that spin in a Python ``while
True: pass`` for the whole loop (each one keeps a core busy; 3 on 2 cores gave a load
average of 4-5 with a drill running), ended by their pids when the loop ends. The load
average is recorded before and after each run.

One JSON line per run goes to ``OUT/runs.jsonl``: the verdict, summary, reasons, the
figures, the truth (``Truth.describe``), the gap between the victim's last heartbeat and
the report's ``killTime``, the busy loops and the load average. The last line printed is
the tally of verdicts. ``touch OUT/stop`` ends the loop between two runs. ``--checkout
PATH`` runs the CLI and the job's reporter from another checkout (a worktree of main: the
figures before a change), with this checkout's ``job.py``. Not a test and not a benchmark
with a target: ``run_all.py`` does not run it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, subprocess_env
from tests.truth.truth import compute, last_beat

JOB = ROOT / "tests" / "truth" / "job.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
DEFAULT_JOB_ARGS = ("--progress-style=thread", "--thread-interval=0.1", "--heartbeat=0.005")
DRILL_TIMEOUT = 240  # seconds for one `recoverygate run`; every phase has its own deadline
SPIN = "while True:\n    pass\n"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, job = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :])
        if "--" in argv
        else (
            argv,
            list(DEFAULT_JOB_ARGS),
        )
    )
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="drills to run, one at a time")
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside the drills")
    parser.add_argument("--out", type=Path, required=True, help="folder for every run")
    parser.add_argument("--after", default="step-40", help="injectFailure.afterCheckpoint")
    parser.add_argument("--keep-all", action="store_true", help="keep every run's folder, PASS too")
    parser.add_argument(
        "--checkout",
        type=Path,
        default=ROOT,
        help="run the CLI and the job's reporter from this checkout (a worktree of main: the "
        "figures before a change); job.py and the truth are always this checkout's",
    )
    return parser.parse_args(own), job


def drill_config(run: Path, job_args: list[str], after: str) -> dict[str, Any]:
    """The truth corpus's drill (tests/truth/test_truth_corpus.py run_drill), for ``run``."""
    command = [
        str(TORCHRUN),
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=3",
        str(JOB),
        f"--ckpt-dir={run / 'ckpt'}",
        *job_args,
    ]
    return {
        "name": run.name,
        "workload": {
            "orchestrator": "local",
            "command": command,
            "workdir": str(JOB.parent),
            "env": {
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "RECOVERYGATE_GROUND_TRUTH": str(run / "truth"),
            },
        },
        "injectFailure": {"type": "KillWorker", "afterCheckpoint": after, "targetRank": 1},
        "expectations": {
            "resumeFromCheckpoint": "latest",
            "maxRecoveryTime": "60s",
            "sustain": "1s",
        },
        "safety": {"requireConfirm": False},
        "timeouts": {"discovery": "60s", "checkpoint": "60s", "recovery": "90s"},
    }


def victim_gap(run: Path, report: dict[str, Any]) -> float | None:
    """``killTime`` minus the victim's last heartbeat (None without both)."""
    target, kill = report.get("target") or {}, report.get("killTime")
    pid = str(target.get("instanceId", "")).partition("@")[0]
    if kill is None or not pid.isdigit():
        return None
    beat = last_beat(run / "truth", int(target.get("rank", 1)), int(pid))
    return None if beat is None else round(float(kill) - beat, 4)


def first_lines(report: dict[str, Any], count: int = 6) -> dict[str, list[int]]:
    """The first ``count`` progress steps of each incarnation, by incarnation id."""
    out: dict[str, list[int]] = {}
    for point in report.get("progress", []):
        steps = out.setdefault(str(point["inc"]), [])
        if len(steps) < count:
            steps.append(int(point["step"]))
    return out


def checkout_env(checkout: Path) -> dict[str, str]:
    """This environment, importing the tool and the reporter from ``checkout``."""
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), str(checkout / "reporter")])
    return env


def one_run(run: Path, job_args: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Drill once into ``run``; the row of ``runs.jsonl``."""
    run.mkdir(parents=True)
    config = run / "recovery-test.yaml"
    config.write_text(yaml.safe_dump(drill_config(run, job_args, args.after), sort_keys=False))
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    command = [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(config)]
    proc = subprocess.run(
        [*command, "--report-dir", str(run / "report"), "--yes", "-q"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=DRILL_TIMEOUT,
        check=False,
        env=checkout_env(args.checkout),
        cwd=args.checkout,  # python -m puts the working folder first on sys.path
    )
    (run / "output.txt").write_text(proc.stdout + proc.stderr)
    row: dict[str, Any] = {
        "run": run.name,
        "busy": args.busy,
        "checkout": str(args.checkout),
        "exit": proc.returncode,
        "wall": round(time.monotonic() - started, 2),
        "loadBefore": round(load_before, 2),
        "loadAfter": round(os.getloadavg()[0], 2),
    }
    report_path = run / "report" / "report.json"
    if not report_path.is_file():
        return {**row, "verdict": None, "summary": "no report"}
    report = json.loads(report_path.read_text())
    kill = report.get("killTime")
    truth = compute(run / "truth", float(kill)).describe() if kill is not None else None
    return {
        **row,
        "verdict": report.get("verdict"),
        "summary": report.get("summary"),
        "reasons": report.get("reasons"),
        "resumeStep": report.get("resumeStep"),
        "loadedStep": report.get("loadedStep"),
        "lostSteps": report.get("lostSteps"),
        "recoveryTimeSeconds": report.get("recoveryTimeSeconds"),
        "killAfterVictimBeat": victim_gap(run, report),
        "grid": (report.get("stepContract") or {}).get("grid"),
        "firstLineIsStep": (report.get("stepContract") or {}).get("firstLineIsStep"),
        "firstLines": first_lines(report),
        "truth": truth,
    }


def spin(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]


def main(argv: list[str]) -> int:
    args, job_args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "runs.jsonl"
    tally: Counter[str] = Counter()
    loops = spin(args.busy)
    try:
        for number in range(1, args.runs + 1):
            stamp = time.strftime("%H%M%S")
            run = args.out / f"run-{stamp}-{number:03d}"
            if (args.out / "stop").exists():  # touch OUT/stop to end the loop between runs
                print("stopped: OUT/stop exists", flush=True)
                break
            row = one_run(run, job_args, args)
            verdict = str(row.get("verdict"))
            tally[verdict] += 1
            kept = verdict != "PASS" or args.keep_all
            row["kept"] = str(run) if kept else None
            if not kept:
                shutil.rmtree(run, ignore_errors=True)
            with log.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
            lines = list(row.get("firstLines", {}).values())
            print(
                f"{number:3d}/{args.runs} {verdict:5s} load {row['loadBefore']:.1f} "
                f"beat gap {row.get('killAfterVictimBeat')} lines {lines} "
                f"{row.get('summary')}" + (f"  [kept {run}]" if kept and verdict != "PASS" else ""),
                flush=True,
            )
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    print(
        f"{sum(tally.values())} runs, {args.busy} busy loop(s): "
        + ", ".join(f"{v} {n}" for v, n in sorted(tally.items()))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
