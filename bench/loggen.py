"""A noisy training log with planted RECOVERYGATE/v1 sentinels, for the parser benchmark.

What a real job's output looks like, mixed: tqdm progress bars (``\\r`` segments with
UTF-8 bar characters, hundreds per physical line), torchrun's ``[default0]:`` prefixes and
its C++ warnings, kubelet RFC 3339 timestamps with 9 fractional digits, loss lines,
NCCL/gloo info lines. Between the noise blocks the generator plants sentinels in every
shape the reader must handle: prefixed, after a tqdm ``\\r``, two glued on one physical
line, an extra unknown field (the JSON path), and truncated ones (counted as malformed).
It records exactly what it planted, so the benchmark checks the parser found exactly that.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

SENTINEL = "RECOVERYGATE/v1"
INC = "9f2c4e1a0b7d3c55"


@dataclass
class Planted:
    """What the generator wrote: the steps of every valid event in order, and the bad ones."""

    steps: list[int] = field(default_factory=list)
    malformed: int = 0
    size: int = 0


def _kubelet(rng: random.Random) -> str:
    return (
        f"2026-11-29T11:{rng.randrange(60):02d}:{rng.randrange(60):02d}."
        f"{rng.randrange(10**9):09d}Z "
    )


def _noise_line(rng: random.Random) -> str:
    rank = rng.randrange(8)
    prefix = f"[default{rank}]:"
    if rng.random() < 0.3:
        prefix = _kubelet(rng) + prefix
    kind = rng.random()
    if kind < 0.25:  # a tqdm bar: many \r segments on one physical line
        total = rng.choice((500, 1000, 10000))
        segs = []
        for i in range(rng.randrange(5, 60)):
            done = min(total, i * total // 50)
            pct = done * 100 // total
            bar = "\u2588" * (pct // 10) + "\u258c" * (pct % 10 > 4) + " " * (10 - pct // 10)
            segs.append(
                f"{pct:3d}%|{bar}| {done}/{total} [00:{i:02d}<01:{59 - i % 60:02d}, "
                f"{rng.uniform(1, 80):.2f}it/s, loss={rng.uniform(0, 3):.4f}]"
            )
        return prefix + "\r".join(segs) + "\n"
    if kind < 0.45:
        return (
            f"{prefix}[rank{rank}]:[W1129 11:47:{rng.randrange(60):02d}."
            f"{rng.randrange(10**6):06d} {rng.randrange(1000, 99999)} "
            "torch/csrc/distributed/c10d/ProcessGroupGloo.cpp:1011] Warning: "
            "something about the process group that nobody reads (function operator())\n"
        )
    if kind < 0.8:
        return (
            f"{prefix}epoch {rng.randrange(100)} step {rng.randrange(10**6)} "
            f"loss={rng.uniform(0, 5):.6f} lr={rng.uniform(1e-5, 1e-3):.3e} "
            f"grad_norm={rng.uniform(0, 10):.3f} tokens/s={rng.randrange(10**6)}\n"
        )
    if kind < 0.9:
        return (
            f"{prefix}NCCL INFO Channel {rng.randrange(32):02d}/0 : {rank}[{rank}] -> "
            f"{(rank + 1) % 8}[{(rank + 1) % 8}] via P2P/IPC/read\n"
        )
    return (
        f'{prefix}  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/'
        f'module.py", line {rng.randrange(2000)}, in _call_impl\n'
    )


def _event(event: str, step: int, extra: str = "") -> str:
    return (
        f'{SENTINEL} {{"event":"{event}","time":1764416834.{step % 10**6:06d},'
        f'"inc":"{INC}","rank":0,"step":{step}{extra}}}'
    )


def generate(path: Path, size: int, *, seed: int = 1, block: int = 16 * 1024) -> Planted:
    """Write about ``size`` bytes of noisy log to ``path`` and return what was planted."""
    rng = random.Random(seed)
    pool = []
    for _ in range(64):  # distinct noise blocks, reused so generating 1 GiB stays fast
        lines: list[str] = []
        length = 0
        while length < block:
            line = _noise_line(rng)
            lines.append(line)
            length += len(line)
        pool.append("".join(lines).encode("utf-8"))
    planted = Planted()
    step = 0
    written = 0
    with open(path, "wb", buffering=1024 * 1024) as out:
        while written < size:
            noise = pool[rng.randrange(len(pool))]
            out.write(noise)
            written += len(noise)
            step += 1
            shape = rng.random()
            if shape < 0.4:
                text = f"{_kubelet(rng)}[default0]:{_event('progress', step)}\n"
                planted.steps.append(step)
            elif shape < 0.55:
                text = (
                    f"[default0]: 42%|\u2588\u2588\u2588\u2588| 42/100 [00:01]\r"
                    f"{_event('progress', step)}\n"
                )
                planted.steps.append(step)
            elif shape < 0.7:  # torchrun glued two ranks' lines together
                text = (
                    f"[default0]:{_event('checkpoint_completed', step)}"
                    f"[default1]:{_event('progress', step + 1)}\n"
                )
                planted.steps += [step, step + 1]
                step += 1
            elif shape < 0.8:  # another emitter's layout: goes through json
                text = "0: " + _event("progress", step, ',"loss":0.25') + "\n"
                planted.steps.append(step)
            elif shape < 0.9:  # a crash cut the line short
                cut = rng.randrange(len(SENTINEL) + 3, 70)
                text = f"[default0]:{_event('progress', step)[:cut]}\n"
                planted.malformed += 1
            else:
                text = f"[default0]:{_event('checkpoint_loaded', step)}\n"
                planted.steps.append(step)
            data = text.encode("utf-8")
            out.write(data)
            written += len(data)
    planted.size = written
    return planted


def giant_line(path: Path, size: int) -> Planted:
    """One line of ``size`` bytes with no newline, between a valid event and a truncated one.

    Layout: a valid event line, then a sentinel whose event never ends followed by
    ``size`` bytes of noise without any newline or carriage return, then a valid event
    that closes the file with no newline after it.
    """
    planted = Planted()
    chunk = (b"x" * 1023 + b" ") * 1024  # 1 MiB of noise, no line end
    with open(path, "wb") as out:
        out.write((_event("progress", 1) + "\n").encode())
        planted.steps.append(1)
        out.write(b"[default0]:" + _event("progress", 2)[:40].encode())
        planted.malformed += 1
        left = size
        while left > 0:
            piece = chunk[: min(left, len(chunk))]
            out.write(piece)
            left -= len(piece)
        out.write(b" " + _event("checkpoint_completed", 3).encode())
        planted.steps.append(3)
    planted.size = path.stat().st_size
    return planted


if __name__ == "__main__":
    import sys

    target = Path(sys.argv[1])
    result = generate(target, int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20)
    print(
        json.dumps(
            {"size": result.size, "events": len(result.steps), "malformed": result.malformed}
        )
    )
