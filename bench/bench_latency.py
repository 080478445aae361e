"""Benchmark 3: detection latency, from a line being written to the drill loop seeing it.

Each case runs a child process that emits ``checkpoint_completed`` lines with the real
reporter and records CLOCK_MONOTONIC just before each call; this process runs a loop
shaped like the runner's (``RealClock.wait(poll_interval)`` cut short by the source's
``wakeup``, then ``poll()``) and records when each event comes out of ``poll()``.

Targets (issue 6, target 3):

- local pipes (:meth:`StreamEventSource.attach_pipe`, what the local backend uses):
  p50 <= 5 ms;
- file tails: the SLURM adapter's :class:`OutputTail` is reusable standalone, so it is
  measured as is, at the interval the adapter uses (``min(poll_interval, 0.25)`` = 0.25 s
  by default): p99 <= the poll interval. It is woken by inotify where available (Linux);
  for context, the same tail with inotify off (what NFS/Lustre writes from other nodes
  get: the poll interval bounds the wait) is measured too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Result, info, main_for, percentile, subprocess_env
from pytest_recoverygate.registry.seams import RealClock
from pytest_recoverygate.shared.events import StreamEventSource

WRITER = Path(__file__).resolve().parent / "_latency_writer.py"
RUNNER_POLL = 0.05  # RunOptions.poll_interval, the runner's default


def _start_writer(
    where: str, count: int, lo: float, hi: float, times: Path, stdout: Any = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(WRITER), where, str(count), str(lo), str(hi), str(times)],
        stdout=stdout,
        env=subprocess_env(),
    )


def _drain(
    source: StreamEventSource,
    clock: RealClock,
    proc: subprocess.Popen[bytes],
    count: int,
    timeout: float,
) -> dict[int, float]:
    """The runner's loop: wait (woken early by the source), poll, note when each step shows."""
    seen: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < count + 1 and time.monotonic() < deadline:
        clock.wait(RUNNER_POLL)
        for event in source.poll():
            if event.step is not None and event.step not in seen:
                seen[event.step] = time.monotonic()
        if proc.poll() is not None and not seen.get(count):
            # the writer is done: give the reader one last chance, then stop
            clock.wait(RUNNER_POLL * 4)
            for event in source.poll():
                if event.step is not None:
                    seen.setdefault(event.step, time.monotonic())
            break
    return seen


def _latencies(times_file: Path, seen: dict[int, float]) -> tuple[list[float], int]:
    written = json.loads(times_file.read_text())
    lat = [seen[i + 1] - t for i, t in enumerate(written) if (i + 1) in seen]
    return lat, len(written) - len(lat)


def pipe_case(count: int, tmp: Path) -> list[float]:
    clock = RealClock()
    source = StreamEventSource(wakeup=clock.wakeup)
    times = tmp / "pipe-times.json"
    proc = _start_writer("pipe", count, 0.002, 0.008, times, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    source.attach_pipe(proc.stdout)
    try:
        seen = _drain(source, clock, proc, count, timeout=60)
        proc.wait(timeout=30)
    finally:
        source.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lat, missing = _latencies(times, seen)
    if missing:
        raise RuntimeError(f"pipe: {missing} events never arrived")
    return lat


def file_case(count: int, tmp: Path, interval: float, *, inotify: bool) -> list[float]:
    from pytest_recoverygate.shared.filetail import OutputTail

    clock = RealClock()
    source = StreamEventSource(wakeup=clock.wakeup)
    path = tmp / f"slurm-{'inotify' if inotify else 'poll'}.out"
    path.write_bytes(b"")
    tail = OutputTail(
        str(path), source.feed, clock, interval=interval, use_inotify=inotify, owner=os.geteuid()
    )
    tail.start()
    times = tmp / f"file-times-{inotify}.json"
    proc = _start_writer(str(path), count, 0.01, 0.03 if inotify else interval / 2, times)
    try:
        seen = _drain(source, clock, proc, count, timeout=120)
        proc.wait(timeout=30)
    finally:
        tail.stop()
        source.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lat, missing = _latencies(times, seen)
    if missing:
        raise RuntimeError(f"file tail: {missing} events never arrived")
    return lat


def _ms(values: list[float], q: float) -> float:
    return percentile(values, q) * 1e3


def run(quick: bool) -> list[Result]:
    n_pipe, n_file, n_inotify = (150, 30, 100) if quick else (1000, 150, 500)
    slurm_interval = 0.25
    out: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="rg-bench-latency-") as tmp_name:
        tmp = Path(tmp_name)
        lat = pipe_case(n_pipe, tmp)
        out.append(
            Result(
                "pipe -> StreamEventSource -> poll(), p50",
                _ms(lat, 50),
                5.0,
                "ms",
                note=f"{len(lat)} lines; p99 {_ms(lat, 99):.2f} ms, max {max(lat) * 1e3:.2f} ms",
                extra={"p50_ms": _ms(lat, 50), "p99_ms": _ms(lat, 99), "max_ms": max(lat) * 1e3},
            )
        )
        inotify = sys.platform.startswith("linux")
        lat = file_case(n_inotify if inotify else n_file, tmp, slurm_interval, inotify=inotify)
        out.append(
            Result(
                f"file tail (SLURM OutputTail, interval {slurm_interval} s"
                f"{', inotify' if inotify else ''}), p99",
                _ms(lat, 99),
                slurm_interval * 1e3,
                "ms",
                note=f"{len(lat)} lines; p50 {_ms(lat, 50):.2f} ms, max {max(lat) * 1e3:.2f} ms",
                extra={"p50_ms": _ms(lat, 50), "p99_ms": _ms(lat, 99), "max_ms": max(lat) * 1e3},
            )
        )
        lat = file_case(n_file, tmp, slurm_interval, inotify=False)
        out.append(
            info(
                "  the same tail without inotify (NFS/Lustre: polling only), p50",
                _ms(lat, 50),
                "ms",
                note=f"{len(lat)} lines; p99 {_ms(lat, 99):.1f} ms (about half the interval at "
                "p50; the interval bounds it)",
                extra={"p50_ms": _ms(lat, 50), "p99_ms": _ms(lat, 99)},
            )
        )
    return out


if __name__ == "__main__":
    main_for("latency", run)
