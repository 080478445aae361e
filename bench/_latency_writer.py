"""Child process of bench_latency: emits checkpoint lines with the real reporter.

``python _latency_writer.py (pipe|FILE) COUNT MIN_GAP MAX_GAP TIMES_OUT``: after a short
start delay, calls ``reporter.checkpoint_completed(i)`` COUNT times (never rate-limited),
recording ``time.monotonic()`` (system-wide CLOCK_MONOTONIC on Linux) just before each
call, with a random gap in between; then writes the times as JSON to TIMES_OUT.
"""

from __future__ import annotations

import json
import random
import sys
import time

from recoverygate import reporter


def main() -> None:
    where, count, lo, hi, times_out = sys.argv[1:6]
    stream = sys.stdout if where == "pipe" else open(where, "a")  # noqa: SIM115
    reporter.configure(stream=stream, rank=0, min_interval=0.0)
    reporter.checkpoint_completed(0)  # the start line and the first import out of the way
    time.sleep(0.3)
    rng = random.Random(7)
    times = []
    for i in range(1, int(count) + 1):
        times.append(time.monotonic())
        reporter.checkpoint_completed(i)
        time.sleep(rng.uniform(float(lo), float(hi)))
    with open(times_out, "w") as out:
        json.dump(times, out)


if __name__ == "__main__":
    main()
