"""Benchmark: what matching a job's own lines costs each line it prints (docs/evidence.md).

With an evidence spec in ``RECOVERYGATE_AUTO`` the start-up hook wraps ``sys.stdout`` and
``sys.stderr``; every ``print`` then also goes through the matcher. Targets, per printed
200-byte line, with the nanoGPT preset (three patterns and its neighbour line):

- a line that matches nothing (most of a job's output) <= 2 µs more than the print alone;
- a progress line that matches but is rate-limited (no event printed) <= 2 µs more;
- the worst case, a crafted line of 1 KiB (the most a pattern sees) <= WORST_GOAL_US more,
  with every preset: each made of a preset pattern's fixed texts, repeated or followed by
  a run of spaces, digits, letters or slashes (the shapes that make a regex backtrack or
  try every position), the slowest of them all;
- for context: the print itself (``print`` to a buffered file, as to a pipe or a log),
  the typical line of each preset (the mean over its trainer's own log,
  tests/data/evidence/<preset>.log), each preset's slowest crafted line, and a matched
  line that prints its event.

With the variable unset there is no wrapper at all: ``sys.stdout`` is the interpreter's
own (bench_auto.py measures the ``.pth`` line that decides it).
"""

from __future__ import annotations

import io
import os
import re
import sys
import time
import timeit
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Result, info, main_for

GOAL_US = 2.0
#: The worst a crafted 1 KiB line may cost the hook (µs).
WORST_GOAL_US = 50.0
SAMPLES = Path(__file__).resolve().parent.parent / "tests" / "data" / "evidence"
#: Characters of a crafted line: the most a pattern sees (evidence.MAX_LINE_CHARS).
CRAFTED_CHARS = 1024
#: What follows a pattern's fixed text in a crafted line, or repeats it: single
#: characters, and the words a checkpoint path names its step with (a path is searched
#: for them: evidence.step_from_path).
_FILLERS = (" ", "1", "x", "/", ".", " 1", "1 ", "step-1/", "step", "checkpoint-1", "iter_1")


def _lines() -> dict[str, str]:
    other = "val batch 17/250 | tokens/s 48211.6 | grad norm 0.8312 | lr 5.9998e-04 | "
    progress = "iter 4242: loss 2.3117, time 101.37ms, mfu 38.12%"
    return {
        "other": (other * 4)[:199],
        "progress": (progress + " " + other * 3)[:199],
        "long": ("x" * 2000)[:1023],
    }


def _per_line_us(stream: io.TextIOBase | object, line: str, number: int, repeat: int) -> float:
    """CPU µs of one ``print(line, file=stream)``, best of ``repeat`` batches. CPU time, not
    wall time: on a machine shared with other work a batch's wall time includes the
    other processes' turns, its CPU time does not (a lone print takes no syscall to wait
    on: the file is buffered)."""
    timer = timeit.Timer(
        "p(line, file=s)",
        globals={"p": print, "line": line, "s": stream},
        timer=time.process_time,
    )
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e6


def _log_us(stream: io.TextIOBase | object, lines: list[str], rounds: int) -> float:
    """CPU µs per line of printing ``lines`` one by one, best of 5 batches of ``rounds``."""
    timer = timeit.Timer(
        "for line in lines: p(line, file=s)",
        globals={"p": print, "lines": lines, "s": stream},
        timer=time.process_time,
    )
    return min(timer.repeat(repeat=5, number=rounds)) / rounds / len(lines) * 1e6


def _fixed_texts(pattern: str) -> list[str]:
    """The fixed texts of a pattern: its runs of literal characters (escapes as the
    characters they stand for), each with what precedes it in the run."""
    text = re.sub(r"\\([.|/()\[\]])", r"\1", pattern)  # \. -> .
    text = re.sub(r"\\[bBsSdDwWAZ]|\(\?P<\w+>|\(\?:|[()^$*+?{}\[\]|\\]", "\0", text)
    runs = [run for run in text.split("\0") if len(run.strip()) >= 3]
    joined = "".join(text.split("\0"))
    return [*runs, joined] if joined.strip() else runs


def _crafted(spec: Any) -> dict[str, str]:
    """Lines of CRAFTED_CHARS characters made to make a spec's patterns work hard."""
    sources = [p.pattern for p in spec.patterns.values() if p is not None]
    if spec.context is not None:
        sources.append(spec.context.pattern)
    lines: dict[str, str] = {}
    for source in sources:
        for fixed in _fixed_texts(source):
            for filler in ("", *_FILLERS):
                unit = fixed + filler
                lines[f"{unit!r} repeated"] = (unit * (CRAFTED_CHARS // len(unit) + 1))[
                    :CRAFTED_CHARS
                ]
                if filler:
                    lines[f"{fixed!r} + {filler!r}*"] = (fixed + filler * CRAFTED_CHARS)[
                        :CRAFTED_CHARS
                    ]
    every = "".join(sorted({f for s in sources for f in _fixed_texts(s)}))
    lines["every fixed text, repeated"] = (every * (CRAFTED_CHARS // len(every) + 1))[
        :CRAFTED_CHARS
    ]
    return lines


def _hook_us(tap: Any, devnull: Any, line: str, number: int, repeat: int) -> float:
    """What the hook adds to a print of ``line`` (interleaved, best of each)."""
    plain = tapped = float("inf")
    for _ in range(2):
        plain = min(plain, _per_line_us(devnull, line, number, repeat))
        tapped = min(tapped, _per_line_us(tap, line, number, repeat))
    return max(tapped - plain, 0.0)


def worst_case(quick: bool) -> list[Result]:
    """Each preset's typical line (its trainer's own log) and its slowest crafted line."""
    from recoverygate import evidence, reporter

    out: list[Result] = []
    worst: tuple[float, str, str] = (0.0, "", "")
    devnull = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        reporter.configure(stream=devnull, min_interval=3600.0, replay_window=0)
        for preset in evidence.PRESETS:
            spec = evidence.Spec({"preset": preset})
            tap = evidence._Tap(devnull, evidence._Emitter(evidence.Matcher(spec)).line)
            sample = [
                line
                for line in (SAMPLES / f"{preset}.log").read_text("utf-8").splitlines()
                if line.strip()
            ]
            rounds = 20 if quick else 200
            best_plain = best_tap = float("inf")
            for _ in range(2):  # interleaved
                best_plain = min(best_plain, _log_us(devnull, sample, rounds))
                best_tap = min(best_tap, _log_us(tap, sample, rounds))
            typical = max(best_tap - best_plain, 0.0)
            crafted = _crafted(spec)
            number, repeat = (10, 5) if quick else (50, 9)
            costs = {
                name: _hook_us(tap, devnull, line, number, repeat) for name, line in crafted.items()
            }
            name = max(costs, key=costs.__getitem__)
            if costs[name] > worst[0]:
                worst = (costs[name], preset, name)
            out.append(
                info(
                    f"hook, {preset}: typical line (its trainer's log, {len(sample)} lines)",
                    typical,
                    "µs",
                )
            )
            out.append(
                info(
                    f"hook, {preset}: slowest crafted 1 KiB line",
                    costs[name],
                    "µs",
                    note=f"{name}, of {len(crafted)} crafted lines",
                    extra={"line": crafted[name][:80]},
                )
            )
    finally:
        reporter.configure()
        devnull.close()
    return [
        Result(
            "hook: the worst crafted 1 KiB line, every preset",
            worst[0],
            WORST_GOAL_US,
            "µs",
            baseline=f"goal {WORST_GOAL_US:g} µs per line",
            note=f"{worst[1]}: {worst[2]}",
        ),
        *out,
    ]


def run(quick: bool) -> list[Result]:
    return typical_case(quick) + worst_case(quick)


def typical_case(quick: bool) -> list[Result]:
    from recoverygate import evidence, reporter

    devnull = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        # Events go nowhere; no replay window: the steady state between printed lines.
        reporter.configure(stream=devnull, min_interval=3600.0, replay_window=0)
        emitter = evidence._Emitter(evidence.Matcher(evidence.Spec({"preset": "nanogpt"})))
        tap = evidence._Tap(devnull, emitter.line)
        lines = _lines()
        number, repeat = (5_000, 5) if quick else (50_000, 9)
        tap.write(lines["progress"] + "\n")  # the first progress line always prints
        plain: dict[str, float] = {}
        tapped: dict[str, float] = {}
        for _ in range(3):  # interleaved: the machine's load drifts
            for name, line in lines.items():
                p = _per_line_us(devnull, line, number, repeat)
                t = _per_line_us(tap, line, number, repeat)
                plain[name] = min(plain.get(name, p), p)
                tapped[name] = min(tapped.get(name, t), t)
        reporter.configure(stream=devnull, min_interval=0.0)
        emitting = _per_line_us(tap, lines["progress"], number // 10, repeat)
    finally:
        reporter.configure()
        devnull.close()
    return [
        info("print of a 200-byte line, no hook (buffered file)", plain["other"], "µs"),
        Result(
            "hook: a 200-byte line that matches nothing",
            tapped["other"] - plain["other"],
            GOAL_US,
            "µs",
            baseline="goal 2 µs per line",
            note=f"print with the hook {tapped['other']:.2f} µs, without {plain['other']:.2f} µs",
        ),
        Result(
            "hook: a 200-byte progress line, matched, rate-limited",
            tapped["progress"] - plain["progress"],
            GOAL_US,
            "µs",
            baseline="goal 2 µs per line",
            note=f"print with the hook {tapped['progress']:.2f} µs, "
            f"without {plain['progress']:.2f} µs",
        ),
        info(
            "hook: a 1024-character line (the most a pattern sees)",
            tapped["long"] - plain["long"],
            "µs",
        ),
        info("hook: a matched progress line that prints its event", emitting, "µs"),
    ]


if __name__ == "__main__":
    main_for("evidence", run)
