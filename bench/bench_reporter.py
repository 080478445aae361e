"""Benchmark 1: what the reporter costs inside a training loop.

Targets (issue 6, target 1), each against a limit measured in this run:

- ``progress()`` when it does not print <= 3x an empty function call (timeit, same
  signature, interleaved batches of 10,000 calls, hundreds of them, best of each): for
  the reporting rank between lines (the countdown, amortized clock reads) and for a rank
  that never prints.
- one emitted line <= 2 us (``progress`` with a zero interval, to /dev/null: the whole
  slow path, clock read, formatting and the ``os.write``).
- <= 1 progress line per 100 ms by default: a 2 s loop of back-to-back calls, lines
  counted in the file they went to (the replay window, the first 32 calls of a process,
  prints unthrottled by design).
- ``progress(step, loss=t)`` when it does not print <= 2x an empty call with the same
  arguments (issue 33), ``t`` a 0-d torch tensor when torch is installed; and the proof
  that ``float()`` runs only on the calls that print: a loss object counting its
  conversions, over 1 s of back-to-back calls, has exactly one per printed line.
- a training loop of 1M steps with a realistic tiny step (a numpy SGD step of a linear
  model: two 32x16 matmuls and three element-wise ops) <= 1 % slower with the reporter than
  without: runs of the two loops are interleaved in pairs, CPU time per run, the median of
  the paired ratios is the overhead and half their interquartile range is the noise.

For context (no target): the same loop with an empty call instead of ``progress()`` (the
floor of any call), a tiny numpy MLP step (~10 us), a pure-Python step of a few arithmetic ops,
the reference costs the issue quotes (f-string + os.write, json.dumps + print), and a
prototype of a larger countdown cap (``_MAX_SKIP``) to show what it would gain.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recoverygate import reporter

from bench._common import Result, info, main_for, median, percentile


def _noop(step: Any, loss: Any = None, data: Any = None) -> None:
    """The empty function call the reporter is compared with (same signature)."""


class _CountingLoss:
    """A loss that counts its ``float()`` conversions (a GPU tensor's is a device sync)."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.floats = 0

    def __float__(self) -> float:
        self.floats += 1
        return self.value


def _a_loss() -> tuple[Any, str]:
    try:
        import torch
    except ImportError:
        return 0.5, "a float"
    return torch.tensor(0.5), "a 0-d torch tensor"


@contextlib.contextmanager
def _configured(**kwargs: Any) -> Iterator[None]:
    os.environ.pop("RECOVERYGATE_PROGRESS_INTERVAL", None)
    os.environ.pop("RECOVERYGATE_RANKS", None)
    try:
        reporter.configure(**kwargs)
        yield
    finally:
        reporter.configure()


def _best_pair(
    stmt_a: str,
    stmt_b: str,
    env: dict[str, Any],
    number: int,
    repeat: int,
) -> tuple[float, float]:
    """Best per-call seconds of two statements, repetitions interleaved a, b, a, b ..."""
    ta, tb = timeit.Timer(stmt_a, globals=env), timeit.Timer(stmt_b, globals=env)
    best_a = best_b = float("inf")
    for _ in range(repeat):
        best_a = min(best_a, ta.timeit(number) / number)
        best_b = min(best_b, tb.timeit(number) / number)
    return best_a, best_b


#: Calls per timed batch of the not-emitting figures, and batches (quick, full): short
#: batches, many of them, interleaved: the best of each is a batch that no other process
#: interrupted, on a machine shared with other work (one long batch almost never is).
BATCH = 10_000
BATCHES = (40, 400)


def not_emitting(quick: bool) -> list[Result]:
    number, repeat = BATCH, BATCHES[0] if quick else BATCHES[1]
    out: list[Result] = []
    with open(os.devnull, "w") as devnull:
        for label, kwargs in (
            ("reporting rank, between lines", {"rank": 0}),
            ("non-reporting rank", {"rank": 1}),
        ):
            with _configured(stream=devnull, **kwargs):
                env = {"noop": _noop, "progress": reporter.progress}
                reporter.progress(0)  # start line and first lines out of the way
                reporter.progress(1)
                empty, prog = _best_pair("noop(7)", "progress(7)", env, number, repeat)
            out.append(
                Result(
                    f"progress() not emitting, {label}",
                    prog * 1e9,
                    3 * empty * 1e9,
                    "ns/call",
                    baseline=f"3x empty call ({empty * 1e9:.1f} ns)",
                    extra={"empty_call_ns": empty * 1e9, "x_empty": prog / empty},
                    note=f"{prog / empty:.2f}x the empty call",
                )
            )
        # Prototype (not the shipped value): a larger countdown cap reads the clock less.
        shipped = reporter._MAX_SKIP
        try:
            reporter._MAX_SKIP = 1024
            with _configured(stream=devnull, rank=0):
                env = {"noop": _noop, "progress": reporter.progress}
                reporter.progress(0)
                reporter.progress(1)
                empty, prog = _best_pair("noop(7)", "progress(7)", env, number, repeat)
        finally:
            reporter._MAX_SKIP = shipped
        out.append(
            info(
                "prototype: progress() with _MAX_SKIP=1024 (shipped 32)",
                prog * 1e9,
                "ns/call",
                note=f"{prog / empty:.2f}x the empty call ({empty * 1e9:.1f} ns)",
            )
        )
    return out


def emitting(quick: bool) -> list[Result]:
    number, repeat = (20_000, 5) if quick else (100_000, 9)
    out: list[Result] = []
    with open(os.devnull, "w") as devnull:
        with _configured(stream=devnull, rank=0, min_interval=0.0):
            env = {"progress": reporter.progress, "ckpt": reporter.checkpoint_completed}
            reporter.progress(0)
            line, ckpt = _best_pair("progress(123456)", "ckpt(123456)", env, number, repeat)
        fd = devnull.fileno()
        head = 'RECOVERYGATE/v1 {"event":"progress","time":'
        env2 = {"os": os, "fd": fd, "time": time, "head": head, "json": json, "devnull": devnull}
        fstring, jdump = _best_pair(
            'os.write(fd, f\'{head}{time.time():.6f},"inc":"0123456789abcdef","step":'
            "{123456}}}\\n'.encode())",
            "print('RECOVERYGATE/v1', json.dumps({'event': 'progress', 'time': time.time(), "
            "'inc': '0123456789abcdef', 'step': 123456}), file=devnull, flush=True)",
            env2,
            number,
            repeat,
        )
    out.append(
        Result(
            "one emitted line (progress, interval 0, /dev/null)",
            line * 1e6,
            2.0,
            "us/line",
            note=f"checkpoint_completed: {ckpt * 1e6:.2f} us; reference f-string + os.write "
            f"{fstring * 1e6:.2f} us, json.dumps + print(flush) {jdump * 1e6:.2f} us",
            extra={
                "checkpoint_us": ckpt * 1e6,
                "fstring_write_us": fstring * 1e6,
                "json_print_us": jdump * 1e6,
            },
        )
    )
    return out


def line_rate(quick: bool) -> list[Result]:
    duration = 0.5 if quick else 2.0
    with tempfile.TemporaryDirectory(prefix="rg-bench-") as tmp:
        path = Path(tmp) / "out.log"
        with open(path, "w") as handle, _configured(stream=handle, rank=0):
            progress = reporter.progress
            calls = 0
            end = time.monotonic() + duration
            while time.monotonic() < end:
                for step in range(calls, calls + 1000):
                    progress(step)
                calls += 1000
        times = []
        for raw in path.read_text().splitlines():
            doc = json.loads(raw.split(" ", 1)[1])
            if doc["event"] == "progress":
                times.append(doc["time"])
    lines = len(times)
    free = reporter.DEFAULT_REPLAY_WINDOW  # the replay window prints unthrottled (documented)
    per_100ms = max(lines - free, 0) / (duration / 0.1)
    gaps = [b - a for a, b in zip(times[free - 1 :], times[free:], strict=False)]
    return [
        Result(
            "progress lines per 100 ms (default interval, back-to-back calls)",
            per_100ms,
            1.0,
            "lines/100ms",
            note=f"{lines} lines from {calls:,} calls in {duration} s; smallest gap "
            f"{min(gaps) * 1e3:.1f} ms"
            if gaps
            else f"{lines} lines from {calls:,} calls",
            extra={"lines": lines, "calls": calls, "min_gap_s": min(gaps) if gaps else None},
        )
    ]


# ---------------------------------------------------------------------- training loop

Loop = Callable[[int], float]


def _numpy_loops(hook: Callable[[int], None]) -> tuple[Loop, Loop, str]:
    """The same numpy SGD loop without and with ``hook(step)`` after every step."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 16))
    y = rng.standard_normal(32)
    w = np.zeros(16)
    xt = x.T
    process_time = time.process_time

    def without(n: int) -> float:
        nonlocal w
        t0 = process_time()
        for _step in range(n):
            err = x @ w - y
            w -= 0.01 / 32 * (xt @ err)
        return process_time() - t0

    def with_hook(n: int) -> float:
        nonlocal w
        t0 = process_time()
        for step in range(n):
            err = x @ w - y
            w -= 0.01 / 32 * (xt @ err)
            hook(step)
        return process_time() - t0

    return without, with_hook, "numpy SGD step of a linear model (32x16)"


def _mlp_loops(hook: Callable[[int], None]) -> tuple[Loop, Loop, str]:
    """A tiny two-layer MLP trained with numpy: forward, backward and SGD (10 array ops)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 16))
    y = rng.standard_normal((32, 1))
    w1 = rng.standard_normal((16, 32)) * 0.1
    w2 = rng.standard_normal((32, 1)) * 0.1
    xt = x.T
    process_time = time.process_time

    def step() -> None:
        h = x @ w1
        np.maximum(h, 0.0, out=h)
        err = h @ w2 - y
        g2 = h.T @ err
        gh = err @ w2.T
        gh[h <= 0.0] = 0.0
        w1[...] -= 1e-3 * (xt @ gh)  # in place: w1 and w2 stay the closure's arrays
        w2[...] -= 1e-3 * g2

    def without(n: int) -> float:
        t0 = process_time()
        for _step in range(n):
            step()
        return process_time() - t0

    def with_hook(n: int) -> float:
        t0 = process_time()
        for i in range(n):
            step()
            hook(i)
        return process_time() - t0

    return without, with_hook, "numpy MLP step (16-32-1, batch 32)"


def _arith_loops(hook: Callable[[int], None]) -> tuple[Loop, Loop, str]:
    process_time = time.process_time

    def without(n: int) -> float:
        a, b = 1.0, 2.0
        t0 = process_time()
        for _step in range(n):
            a = a * 0.999 + b
            b = b * 0.999 - a * 1e-6
        return process_time() - t0

    def with_hook(n: int) -> float:
        a, b = 1.0, 2.0
        t0 = process_time()
        for step in range(n):
            a = a * 0.999 + b
            b = b * 0.999 - a * 1e-6
            hook(step)
        return process_time() - t0

    return without, with_hook, "pure-Python step of a few arithmetic ops"


def _paired(loops: dict[str, Loop], steps: int, rounds: int) -> dict[str, dict[str, float]]:
    """Run ``loops`` (``base`` first) in rotating order; ratios are paired within a round."""
    names = list(loops)
    for loop in loops.values():
        loop(max(steps // 20, 1))  # warm up
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            times[name].append(loops[name](steps))
    out: dict[str, dict[str, float]] = {}
    base = times["base"]
    for name in names[1:]:
        ratios = [t / b for t, b in zip(times[name], base, strict=True)]
        q1, q3 = percentile(ratios, 25), percentile(ratios, 75)
        out[name] = {
            "overhead_pct": (median(ratios) - 1) * 100,
            "noise_pct": (q3 - q1) / 2 * 100,
            "step_us": median(base) / steps * 1e6,
            "per_call_ns": (median(times[name]) - median(base)) / steps * 1e9,
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "rounds": rounds,
        }
    return out


def _loop_results(
    make: Callable[[Callable[[int], None]], tuple[Loop, Loop, str]],
    steps: int,
    rounds: int,
    *,
    c_call: bool = False,
) -> tuple[str, dict[str, dict[str, float]]]:
    base, with_progress, label = make(reporter.progress)
    _, with_noop, _ = make(_noop)
    loops = {"base": base, "progress": with_progress, "noop": with_noop}
    if c_call:  # prototype: the per-step call is a C method that only keeps the newest step
        newest: collections.deque[int] = collections.deque(maxlen=1)
        _, loops["c_append"], _ = make(newest.append)
    return label, _paired(loops, steps, rounds)


def training_loop(quick: bool) -> list[Result]:
    steps, rounds = (100_000, 6) if quick else (1_000_000, 9)
    out: list[Result] = []
    with open(os.devnull, "w") as devnull, _configured(stream=devnull, rank=0):
        label, m = _loop_results(_numpy_loops, steps, rounds, c_call=True)
        p, n, c = m["progress"], m["noop"], m["c_append"]
        breakeven = max(p["per_call_ns"], 0.0) / 0.01 / 1000
        out.append(
            Result(
                f"{steps:,}-step loop slowdown, {label}",
                p["overhead_pct"],
                1.0,
                "%",
                note=f"step {p['step_us']:.2f} us; +{p['per_call_ns']:.0f} ns/step; noise "
                f"+-{p['noise_pct']:.2f} % (half IQR of {rounds} paired ratios); an empty call "
                f"in the same place costs {n['overhead_pct']:+.2f} % "
                f"({n['per_call_ns']:.0f} ns); 1 % is met by steps >= {breakeven:.1f} us",
                extra={"progress": p, "empty_call": n, "breakeven_step_us": breakeven},
            )
        )
        out.append(
            info(
                "  same loop with an empty call instead of progress()",
                n["overhead_pct"],
                "%",
                note=f"{n['per_call_ns']:.0f} ns/step",
                extra=n,
            )
        )
        out.append(
            info(
                "  prototype: same loop with deque(maxlen=1).append(step)",
                c["overhead_pct"],
                "%",
                note=f"{c['per_call_ns']:.0f} ns/step: a C-level call that keeps the newest "
                "step, for a sampler thread to print (see RESULTS.md)",
                extra=c,
            )
        )
        label, m = _loop_results(_mlp_loops, steps // 10, rounds)
        p, n = m["progress"], m["noop"]
        out.append(
            info(
                f"{steps // 10:,}-step loop slowdown, {label}",
                p["overhead_pct"],
                "%",
                note=f"step {p['step_us']:.2f} us; +{p['per_call_ns']:.0f} ns/step; noise "
                f"+-{p['noise_pct']:.2f} %; an empty call costs {n['overhead_pct']:+.2f} %",
                extra={"progress": p, "empty_call": n},
            )
        )
        label, m = _loop_results(_arith_loops, steps, rounds)
        p, n = m["progress"], m["noop"]
        out.append(
            info(
                f"{steps:,}-step loop slowdown, {label}",
                p["overhead_pct"],
                "%",
                note=f"step {p['step_us'] * 1e3:.0f} ns; +{p['per_call_ns']:.0f} ns/step; an "
                f"empty call costs {n['overhead_pct']:+.1f} % here: any call is a large "
                "fraction of such a step",
                extra={"progress": p, "empty_call": n},
            )
        )
    return out


def with_loss(quick: bool) -> list[Result]:
    """issue 33: ``progress(step, loss=t)`` between lines, and no ``float()`` unprinted."""
    number, repeat = BATCH, BATCHES[0] if quick else BATCHES[1]
    loss, what = _a_loss()
    with open(os.devnull, "w") as devnull, _configured(stream=devnull, rank=0, replay_window=0):
        env = {"noop": _noop, "progress": reporter.progress, "t": loss}
        reporter.progress(0, loss=loss)
        reporter.progress(1, loss=loss)
        empty, prog = _best_pair("noop(7, loss=t)", "progress(7, loss=t)", env, number, repeat)
    out = [
        Result(
            "progress(step, loss=t) not emitting, reporting rank, between lines",
            prog * 1e9,
            2 * empty * 1e9,
            "ns/call",
            baseline=f"2x empty call with the same arguments ({empty * 1e9:.1f} ns)",
            extra={"empty_call_ns": empty * 1e9, "x_empty": prog / empty, "loss": what},
            note=f"{prog / empty:.2f}x the empty call; t is {what}",
        )
    ]
    counting = _CountingLoss(0.25)
    duration = 0.3 if quick else 1.0
    with tempfile.TemporaryDirectory(prefix="rg-bench-") as tmp:
        path = Path(tmp) / "out.log"
        with open(path, "w") as handle, _configured(stream=handle, rank=0):
            progress, calls = reporter.progress, 0
            end = time.monotonic() + duration
            while time.monotonic() < end:
                for step in range(calls, calls + 1000):
                    progress(step, loss=counting)
                calls += 1000
        printed = sum(1 for line in path.read_text().splitlines() if '"progress"' in line)
    out.append(
        Result(
            "float() calls per printed progress line (back-to-back calls, default interval)",
            counting.floats / max(printed, 1),
            1.0,
            "float()/line",
            note=f"{counting.floats} float() calls for {printed} printed lines out of "
            f"{calls:,} calls: none on the {calls - printed:,} throttled ones",
            extra={"calls": calls, "printed": printed, "floats": counting.floats},
        )
    )
    return out


def run(quick: bool) -> list[Result]:
    return (
        not_emitting(quick)
        + emitting(quick)
        + line_rate(quick)
        + with_loss(quick)
        + training_loop(quick)
    )


if __name__ == "__main__":
    main_for("reporter", run)
