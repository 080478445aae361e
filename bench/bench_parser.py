"""Benchmark 2: the RECOVERYGATE/v1 parser against ``grep -F`` on a noisy log.

Targets (issue 6, target 2):

- throughput >= 0.7x ``LC_ALL=C grep -F RECOVERYGATE/v1 log > out`` in CPU seconds
  (``getrusage`` of the grep child vs this process), on a generated noisy log (1 GiB,
  ``--quick`` 64 MiB; see :mod:`bench.loggen`), read in 1 MiB chunks and fed to
  :class:`recoverygate.wire.StreamParser`; repetitions interleaved, medians;
- the parser finds exactly the events the generator planted (steps in order) and counts
  exactly the truncated ones as malformed;
- bounded memory whatever the line length: a 256 MiB line without a newline (after a
  truncated sentinel) is fed through the parser under ``tracemalloc``; the peak beyond
  the 1 MiB chunk must stay under 1 MiB. The SLURM adapter's file tail
  (``OutputTail``, which feeds the same parser) is measured on the same file.

For context: the floor (``bytes.find`` of every sentinel, no parsing), the cost per event,
and the shared :class:`StreamEventSource` (which also builds TrainingEvents).

The page cache is warmed first; the files live in a temporary folder that is removed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recoverygate.wire import SENTINEL_BYTES, StreamParser

from bench._common import Result, cpu_children, cpu_self, info, main_for, maxrss_mib, median
from bench.loggen import Planted, generate, giant_line

CHUNK = 1024 * 1024
GIANT = 256 * 1024 * 1024


def _grep(path: Path, out: Path) -> float:
    env = {**os.environ, "LC_ALL": "C"}
    before = cpu_children()
    with open(out, "wb") as sink:
        subprocess.run(
            ["grep", "-F", SENTINEL_BYTES.decode(), str(path)], stdout=sink, env=env, check=True
        )
    return cpu_children() - before


def _parse(
    path: Path,
    make: type[StreamParser] = StreamParser,
) -> tuple[float, list[int], int, int]:
    """CPU seconds, the steps found, the malformed count, the most bytes held between chunks."""
    before = cpu_self()
    parser = make()
    steps: list[int] = []
    held = 0
    with open(path, "rb", buffering=0) as handle:
        read = handle.read
        feed = parser.feed
        while True:
            chunk = read(CHUNK)
            if not chunk:
                break
            for record in feed(chunk):
                steps.append(record.step)  # type: ignore[arg-type]
            held = max(held, parser.buffered)
    for record in parser.flush():
        steps.append(record.step)  # type: ignore[arg-type]
    return cpu_self() - before, steps, parser.malformed, held


def _floor(path: Path) -> float:
    """CPU seconds to find every sentinel with bytes.find and do nothing else."""
    before = cpu_self()
    with open(path, "rb", buffering=0) as handle:
        while True:
            chunk = handle.read(CHUNK)
            if not chunk:
                break
            pos = chunk.find(SENTINEL_BYTES)
            while pos >= 0:
                pos = chunk.find(SENTINEL_BYTES, pos + 15)
    return cpu_self() - before


def _event_source(path: Path) -> tuple[float, int]:
    from pytest_recoverygate.shared.events import StreamEventSource

    source = StreamEventSource()
    before = cpu_self()
    count = 0
    with open(path, "rb", buffering=0) as handle:
        while True:
            chunk = handle.read(64 * 1024)  # what the pipe reader reads at a time
            if not chunk:
                break
            source.feed(chunk, 0.0)
            count += len(source.poll())
    source.end_stream()
    count += len(source.poll())
    return cpu_self() - before, count


def _warm(path: Path) -> None:
    with open(path, "rb", buffering=0) as handle:
        while handle.read(8 * CHUNK):
            pass


def throughput(quick: bool, tmp: Path) -> list[Result]:
    size = 64 * 1024 * 1024 if quick else 1024 * 1024 * 1024
    reps = 2 if quick else 3
    log = tmp / "noisy.log"
    t0 = time.monotonic()
    planted: Planted = generate(log, size)
    gen_s = time.monotonic() - t0
    _warm(log)
    rss_before = maxrss_mib()
    greps: list[float] = []
    parses: list[tuple[float, list[int], int, int]] = []
    steps: list[int] = []
    malformed = held = 0
    tools = ["grep", "shipped"]
    for i in range(reps):  # every tool once per round, the order rotating between rounds
        k = i % len(tools)
        for name in tools[k:] + tools[:k]:
            if name == "grep":
                greps.append(_grep(log, tmp / "grep.out"))
            else:
                parses.append(_parse(log))
    for _, found, bad, h in parses:
        held = max(held, h)
        if found != planted.steps or bad != planted.malformed:
            steps, malformed = found, bad  # show the run that was wrong
            break
        steps, malformed = found, bad
    rss_growth = maxrss_mib() - rss_before
    with open(tmp / "grep.out", "rb") as grepped:
        grep_lines = sum(1 for _ in grepped)
    g = median(greps)
    p = median([x[0] for x in parses])
    floor = _floor(log)
    es_cpu, es_count = _event_source(log)
    gbs = planted.size / 1e9
    events = len(planted.steps)
    exact = steps == planted.steps and malformed == planted.malformed
    return [
        Result(
            f"parser throughput vs grep -F ({planted.size / 2**20:,.0f} MiB noisy log)",
            (gbs / p) / (gbs / g),
            0.7,
            "x grep",
            op=">=",
            baseline=f"grep {gbs / g:.2f} GB/CPU-s",
            note=f"parser {gbs / p:.2f} GB/CPU-s ({p:.3f} s) vs grep {gbs / g:.2f} GB/CPU-s "
            f"({g:.3f} s), medians of {reps}; {events:,} events + {planted.malformed:,} "
            f"truncated = one per {planted.size / (events + planted.malformed) / 1024:.1f} KiB",
            extra={
                "parser_cpu_s": [x[0] for x in parses],
                "grep_cpu_s": greps,
                "bytes": planted.size,
                "events": events,
                "generate_s": gen_s,
            },
        ),
        Result(
            "events found exactly as planted (valid, in order; truncated counted)",
            1.0 if exact else 0.0,
            1.0,
            "bool",
            op=">=",
            note=f"found {len(steps):,} of {events:,} events, malformed {malformed:,} of "
            f"{planted.malformed:,}; grep printed {grep_lines:,} lines",
        ),
        Result(
            "parser memory held between chunks (1 GiB log)"
            if not quick
            else "parser memory held between chunks",
            held / 1024,
            4 + 15 / 1024,
            "KiB",
            note=f"process peak RSS grew {rss_growth:.1f} MiB while parsing (1 MiB chunks)",
            extra={"rss_growth_mib": rss_growth},
        ),
        info(
            "  floor: bytes.find of every sentinel, no parsing",
            (gbs / floor) / (gbs / g),
            "x grep",
            note=f"{gbs / floor:.2f} GB/CPU-s; the rest of the parser's time is per event: "
            f"{(p - floor) / max(events + planted.malformed, 1) * 1e6:.2f} us/event",
        ),
        info(
            "  StreamEventSource.feed (64 KiB chunks, TrainingEvents)",
            (gbs / es_cpu) / (gbs / g),
            "x grep",
            note=f"{gbs / es_cpu:.2f} GB/CPU-s, {es_count:,} events",
        ),
    ]


def giant(quick: bool, tmp: Path) -> list[Result]:
    path = tmp / "giant.log"
    planted = giant_line(path, GIANT)
    tracemalloc.start()
    parser = StreamParser()
    steps: list[int] = []
    baseline_peak = 0
    with open(path, "rb", buffering=0) as handle:
        while True:
            chunk = handle.read(CHUNK)
            if not chunk:
                break
            if not baseline_peak:
                tracemalloc.reset_peak()
                baseline_peak = 1
            steps += [r.step for r in parser.feed(chunk)]  # type: ignore[misc]
            del chunk
    steps += [r.step for r in parser.flush()]  # type: ignore[misc]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    beyond = max(peak - CHUNK, 0)
    ok = steps == planted.steps and parser.malformed == planted.malformed
    out = [
        Result(
            "parser peak memory beyond the chunk, 256 MiB line without newline",
            beyond / 1024,
            1024.0,
            "KiB",
            note=f"tracemalloc peak {peak / 2**20:.2f} MiB with 1 MiB chunks; events "
            f"{steps} (planted {planted.steps}), malformed {parser.malformed} "
            f"({'exact' if ok else 'NOT as planted'})",
            extra={"peak_bytes": peak, "exact": ok},
        )
    ]
    out.append(_slurm_tail(path))
    return out


def _slurm_tail(path: Path) -> Result:
    """The SLURM adapter's OutputTail (a file tail in front of the same parser), same file."""
    from pytest_recoverygate.registry.seams import RealClock
    from pytest_recoverygate.shared.events import StreamEventSource
    from pytest_recoverygate.shared.filetail import OutputTail

    source = StreamEventSource()
    tail = OutputTail(str(path), source.feed, RealClock(), interval=0.05, owner=os.geteuid())
    tracemalloc.start()
    try:
        while tail.poll_once():  # the backlog, in reads of at most 1 MiB
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        tail.stop()
    events = len(source.poll())
    return Result(
        "SLURM OutputTail peak memory, same 256 MiB line (file tail)",
        peak / 1024,
        1024.0 + 1024.0,
        "KiB",
        note=f"tracemalloc peak {peak / 2**20:.2f} MiB while tailing the whole file "
        f"({events} event(s) delivered); reads of at most 1 MiB go to the parser",
        extra={"peak_bytes": peak},
    )


def run(quick: bool) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="rg-bench-parser-") as tmp:
        results = throughput(quick, Path(tmp))
        results += giant(quick, Path(tmp))
    return results


if __name__ == "__main__":
    main_for("parser", run)
