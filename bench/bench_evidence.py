"""Benchmark: what matching a job's own lines costs each line it prints (docs/evidence.md).

With an evidence spec in ``RECOVERYGATE_AUTO`` the start-up hook wraps ``sys.stdout`` and
``sys.stderr``; every ``print`` then also goes through the matcher. Targets, per printed
200-byte line, with the nanoGPT preset (three patterns and its neighbour line):

- a line that matches nothing (most of a job's output) <= 2 µs more than the print alone;
- a progress line that matches but is rate-limited (no event printed) <= 2 µs more;
- for context: the print itself (``print`` to a buffered file, as to a pipe or a log),
  the worst case the bounds allow (a 1024-character line, the most a pattern sees) and
  a matched line that prints its event.

With the variable unset there is no wrapper at all: ``sys.stdout`` is the interpreter's
own (bench_auto.py measures the ``.pth`` line that decides it).
"""

from __future__ import annotations

import io
import os
import sys
import timeit
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Result, info, main_for

GOAL_US = 2.0


def _lines() -> dict[str, str]:
    other = "val batch 17/250 | tokens/s 48211.6 | grad norm 0.8312 | lr 5.9998e-04 | "
    progress = "iter 4242: loss 2.3117, time 101.37ms, mfu 38.12%"
    return {
        "other": (other * 4)[:199],
        "progress": (progress + " " + other * 3)[:199],
        "long": ("x" * 2000)[:1023],
    }


def _per_line_us(stream: io.TextIOBase | object, line: str, number: int, repeat: int) -> float:
    timer = timeit.Timer("p(line, file=s)", globals={"p": print, "line": line, "s": stream})
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e6


def run(quick: bool) -> list[Result]:
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
