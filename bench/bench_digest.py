"""Benchmark 7: what ``state_digest`` costs next to the checkpoint save it vouches for.

Target, against a limit measured in this run: ``state_digest(model, optimizer, scheduler,
parts=True)`` of a ~100M-parameter model with its Adam state (1.2 GB of float32: weights
and both moments) costs <= 5 % of a ``torch.save`` of the same state to a file in a
temporary folder. Saves and digests are interleaved (save, digest, save, digest, ...),
wall time (both block the training loop), median of the paired ratios.

Against its physical limit (target: at most the limit): the time to read the same bytes
once, measured in the same rounds. The limit is a ``memcpy`` of every tensor into a buffer
touched beforehand; for context, a plain 64-bit sum of every tensor (one read, nothing else:
the digest's reduction without its blocks) and one ``hashlib`` pass (SHA-1) over the bytes.

Third target: the planted changes (the last element of the largest tensor, one element
of an Adam moment, two elements swapped across blocks, a reset scheduler, a parameter's
Adam state dropped) are all seen by the shipped digest.

For context (no target), the designs it was chosen over, each as a fraction of the same
save and with the planted changes it sees: a full BLAKE2b of every byte, a full SHA-1
(SHA-NI on this CPU), CRC-32 of every byte on every core, float64 sum and abs-sum per
tensor, and a sampled digest (1,024 elements per tensor plus the first and last); also the
digest of the saved state dicts rather than the live objects, ``torch.save`` with
``fsync`` and without its CRC-32 pass.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Result, info, main_for, median, percentile


def _build(quick: bool) -> tuple[Any, Any, Any]:
    """A transformer-shaped model with a populated Adam state and a StepLR scheduler."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if quick:
        d, ff, layers, vocab = 256, 1024, 4, 8192
    else:  # 100.7M parameters: 24,576 x 1,024 embedding, 6 encoder layers, a final norm
        d, ff, layers, vocab = 1024, 4096, 6, 24576
    layer = nn.TransformerEncoderLayer(d, 16 if d >= 1024 else 8, ff, batch_first=True)
    model = nn.Sequential(
        nn.Embedding(vocab, d), nn.TransformerEncoder(layer, layers), nn.LayerNorm(d)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    for param in model.parameters():  # one step with random gradients: moments populated
        param.grad = torch.randn_like(param)
    optimizer.step()
    scheduler.step()
    for param in model.parameters():
        param.grad = None
    return model, optimizer, scheduler


def _tensors(obj: Any, out: list[Any]) -> list[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for value in obj.values():
            _tensors(value, out)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _tensors(value, out)
    return out


# ---------------------------------------------------------------------- the alternatives


def _bytes(tensor: Any) -> Any:
    import torch

    return memoryview(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy())


def full_hash(name: str) -> Callable[[list[Any]], str]:
    def digest(tensors: list[Any]) -> str:
        hasher = hashlib.new(name)
        for tensor in tensors:
            hasher.update(_bytes(tensor))
        return hasher.hexdigest()

    return digest


def crc32_all_cores(tensors: list[Any]) -> str:
    """CRC-32 of every tensor's bytes, tensors shared among threads (zlib drops the GIL)."""
    results: list[int] = [0] * len(tensors)
    order = iter(range(len(tensors)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                index = next(order, None)
            if index is None:
                return
            results[index] = zlib.crc32(_bytes(tensors[index]))

    threads = [threading.Thread(target=work) for _ in range(os.cpu_count() or 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return hashlib.blake2b(repr(results).encode(), digest_size=8).hexdigest()


def float_sums(tensors: list[Any]) -> str:
    """sum and abs-sum in float64 per tensor (the "exact reductions" alternative)."""
    import torch

    sums = [
        (float(t.sum(dtype=torch.float64)), float(t.abs().sum(dtype=torch.float64)))
        for t in tensors
    ]
    return hashlib.blake2b(repr(sums).encode(), digest_size=8).hexdigest()


def sampled(tensors: list[Any]) -> str:
    """1,024 elements per tensor at fixed pseudo-random places, plus the first and last."""
    import torch

    hasher = hashlib.blake2b(digest_size=8)
    generator = torch.Generator().manual_seed(0)
    for tensor in tensors:
        flat = tensor.detach().reshape(-1)
        count = flat.numel()
        if count <= 1026:
            hasher.update(_bytes(flat))
            continue
        where = torch.randint(1, count - 1, (1024,), generator=generator)
        picks = torch.cat([flat[:1], flat[where], flat[-1:]])
        hasher.update(_bytes(picks))
    return hasher.hexdigest()


# ---------------------------------------------------------------------- measuring


def _run_on_state(fn: Callable[[list[Any]], str], state: Callable[[], Any]) -> str:
    """One alternative design over the tensors of the current state."""
    return fn(_tensors(state(), []))


def _design(fn: Callable[[list[Any]], str], state: Callable[[], Any], scheduler: Any) -> str:
    """An alternative design's digest, with the scheduler read like the shipped digest."""
    from recoverygate.digest import state_digest

    return fn(_tensors(state(), [])) + str(state_digest(scheduler))


def _time(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _planted(model: Any, optimizer: Any, scheduler: Any) -> list[tuple[str, Callable[[], Any]]]:
    """(name, change) pairs; each change applies itself in place and returns an undo."""
    params = list(model.parameters())
    largest = max(params, key=lambda p: p.numel())
    adam = optimizer.state[params[len(params) // 2]]

    def last_element() -> Callable[[], None]:
        flat = largest.data.view(-1)
        old = flat[-1].item()
        flat[-1] = old + 1.0
        return lambda: flat.__setitem__(-1, old)

    def adam_moment() -> Callable[[], None]:
        flat = adam["exp_avg_sq"].view(-1)
        index = flat.numel() // 2 + 7
        old = flat[index].item()
        flat[index] = old * 2 + 1e-12
        return lambda: flat.__setitem__(index, old)

    def swap() -> Callable[[], None]:
        flat = largest.data.view(-1)
        i, j = 17, flat.numel() - 4097

        def undo() -> None:
            flat[[i, j]] = flat[[j, i]].clone()

        undo()
        return undo

    def scheduler_reset() -> Callable[[], None]:
        old = scheduler.last_epoch
        scheduler.last_epoch = 0
        return lambda: setattr(scheduler, "last_epoch", old)

    def state_dropped() -> Callable[[], None]:
        param = params[0]
        saved = optimizer.state.pop(param)
        return lambda: optimizer.state.__setitem__(param, saved)

    return [
        ("last element of the largest tensor +1", last_element),
        ("one element of an Adam moment", adam_moment),
        ("two elements swapped across blocks", swap),
        ("scheduler last_epoch reset to 0", scheduler_reset),
        ("one parameter's Adam state dropped", state_dropped),
    ]


def run(quick: bool) -> list[Result]:
    import numpy
    import torch
    from recoverygate.digest import state_digest

    rounds = 3 if quick else 7
    model, optimizer, scheduler = _build(quick)
    params = sum(p.numel() for p in model.parameters())

    def state() -> dict[str, Any]:
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        }

    tensors = _tensors(state(), [])
    size = sum(t.numel() * t.element_size() for t in tensors)
    out: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="rg-bench-digest-") as tmp:
        path = Path(tmp) / "checkpoint.pt"

        def save() -> None:
            torch.save(state(), path)

        def save_fsync() -> None:
            with open(path, "wb") as handle:
                torch.save(state(), handle)
                handle.flush()
                os.fsync(handle.fileno())

        def save_without_crc() -> None:
            torch.serialization.set_crc32_options(False)
            try:
                torch.save(state(), path)
            finally:
                torch.serialization.set_crc32_options(True)

        def shipped() -> object:
            return state_digest(model, optimizer, scheduler, parts=True)

        def shipped_on_state_dicts() -> object:
            return state_digest(state(), parts=True)

        # The physical limit: the time to read the same bytes once. A memcpy of every
        # tensor into a buffer touched beforehand (reads each byte once, writes it once),
        # a plain 64-bit sum of every tensor (reads each byte once, nothing else: the
        # digest's own reduction without its blocks), and one hashlib pass (SHA-1, the
        # fastest hashlib here with SHA-NI).
        arrays = [numpy.frombuffer(_bytes(t), dtype=numpy.uint8) for t in tensors]
        buffer = numpy.ones(max(a.size for a in arrays), dtype=numpy.uint8)

        def memcpy() -> None:
            for array in arrays:
                numpy.copyto(buffer[: array.size], array)

        def read_once() -> None:
            for array in arrays:
                whole = array.size - array.size % 8
                array[:whole].view(numpy.uint64).sum(dtype=numpy.uint64)

        def hash_pass() -> None:
            hasher = hashlib.sha1()
            for array in arrays:
                hasher.update(array.data)

        save()  # warm up: page cache, allocator, first-call imports
        shipped()
        memcpy()
        read_once()
        saves: list[float] = []
        digests: list[float] = []
        on_dicts: list[float] = []
        copies: list[float] = []
        reads: list[float] = []
        for i in range(rounds):
            order = [save, shipped, shipped_on_state_dicts, memcpy, read_once]
            order = order[i % 5 :] + order[: i % 5]
            times = {fn.__name__: _time(fn) for fn in order}
            saves.append(times["save"])
            digests.append(times["shipped"])
            on_dicts.append(times["shipped_on_state_dicts"])
            copies.append(times["memcpy"])
            reads.append(times["read_once"])
        hashes = [_time(hash_pass) for _ in range(2 if quick else 3)]
        ratios = [d / s for d, s in zip(digests, saves, strict=True)]
        save_s, digest_s = median(saves), median(digests)
        ratio = median(ratios)
        to_copy = [d / c for d, c in zip(digests, copies, strict=True)]
        to_read = [d / r for d, r in zip(digests, reads, strict=True)]
        copy_s, read_s, hash_s = median(copies), median(reads), median(hashes)
        out.append(
            Result(
                "state_digest vs its physical limit: a memcpy of the same bytes",
                median(to_copy),
                1.0,
                "x memcpy",
                baseline=f"memcpy of the same {size / 1e9:.2f} GB, median {copy_s * 1e3:.1f} ms",
                note=f"digest {digest_s * 1e3:.1f} ms, memcpy {copy_s * 1e3:.1f} ms "
                f"({size / copy_s / 1e9:.1f} GB/s read + written); paired ratios "
                f"{min(to_copy):.2f}-{max(to_copy):.2f} over {rounds} rounds",
                extra={"memcpy_s": copies, "ratios": to_copy},
            )
        )
        out.append(
            info(
                "  digest vs one read of the same bytes (a plain 64-bit sum per tensor)",
                median(to_read),
                "x read",
                note=f"read once {read_s * 1e3:.1f} ms ({size / read_s / 1e9:.1f} GB/s); "
                f"paired ratios {min(to_read):.2f}-{max(to_read):.2f}: what the blocks, "
                "the headers and the hash add to reading",
                extra={"read_s": reads, "ratios": to_read},
            )
        )
        out.append(
            info(
                "  digest vs one hashlib pass (SHA-1, SHA-NI) over the same bytes",
                digest_s / hash_s,
                "x sha1",
                note=f"SHA-1 pass {hash_s * 1e3:.0f} ms ({size / hash_s / 1e9:.2f} GB/s)",
                extra={"sha1_s": hashes},
            )
        )
        out.append(
            Result(
                "state_digest(model, optimizer, scheduler, parts=True) vs torch.save",
                ratio * 100,
                5.0,
                "% of save",
                baseline=f"torch.save of the same state, median {save_s:.3f} s",
                note=f"{params / 1e6:.1f}M parameters + Adam, {size / 1e9:.2f} GB in "
                f"{len(tensors)} tensors; digest median {digest_s * 1e3:.1f} ms "
                f"({size / digest_s / 1e9:.1f} GB/s), torch.save median {save_s:.3f} s; "
                f"paired ratios {min(ratios) * 100:.1f}-{max(ratios) * 100:.1f} % over "
                f"{rounds} rounds",
                extra={
                    "params": params,
                    "bytes": size,
                    "tensors": len(tensors),
                    "digest_s": digests,
                    "save_s": saves,
                    "ratios": ratios,
                    "ratio_iqr": [percentile(ratios, 25), percentile(ratios, 75)],
                },
            )
        )
        out.append(
            info(
                "  same digest of the state dicts (the saved side)",
                median(on_dicts) / save_s * 100,
                "% of save",
                note=f"median {median(on_dicts) * 1e3:.1f} ms",
            )
        )
        fsync_s = median([_time(save_fsync) for _ in range(2 if quick else 3)])
        no_crc_s = median([_time(save_without_crc) for _ in range(2 if quick else 3)])
        out.append(
            info("  torch.save + fsync", fsync_s, "s", note=f"{size / fsync_s / 1e9:.2f} GB/s")
        )
        out.append(
            info(
                "  torch.save without its CRC-32 (set_crc32_options(False))",
                no_crc_s,
                "s",
                note=f"{size / no_crc_s / 1e9:.2f} GB/s: the save's own CRC-32 pass costs "
                f"{(save_s - no_crc_s) / save_s * 100:.0f} % of it",
            )
        )

    alternatives: list[tuple[str, Callable[[list[Any]], str]]] = [
        ("prototype: full BLAKE2b of every byte", full_hash("blake2b")),
        ("prototype: full SHA-1 of every byte (SHA-NI)", full_hash("sha1")),
        (f"prototype: CRC-32 of every byte on {os.cpu_count()} threads", crc32_all_cores),
        ("prototype: float64 sum + abs-sum per tensor", float_sums),
        ("prototype: sampled, 1,024 elements per tensor", sampled),
    ]
    costs: dict[str, float] = {}
    for name, fn in alternatives:
        costs[name] = median(
            [_time(partial(_run_on_state, fn, state)) for _ in range(2 if quick else 3)]
        )

    # Planted changes: which designs see them (each change is undone right after). The
    # alternatives read the tensors their way and the scheduler like the shipped digest.
    designs: dict[str, Callable[[], str]] = {
        "shipped": lambda: state_digest(model, optimizer, scheduler)
    }
    for name, fn in alternatives:
        designs[name] = partial(_design, fn, state, scheduler)
    before = {name: fn() for name, fn in designs.items()}
    seen = dict.fromkeys(designs, 0)
    planted = _planted(model, optimizer, scheduler)
    missed: dict[str, list[str]] = {name: [] for name in designs}
    for label, change in planted:
        undo = change()
        try:
            for name, design in designs.items():
                if design() != before[name]:
                    seen[name] += 1
                else:
                    missed[name].append(label)
        finally:
            undo()
    assert designs["shipped"]() == before["shipped"], "a planted change was not undone"
    out.append(
        Result(
            "planted changes seen by the shipped digest",
            seen["shipped"],
            len(planted),
            "changes",
            op=">=",
            note="; ".join(label for label, _ in planted),
        )
    )
    for name, _ in alternatives:
        what = f"sees {seen[name]} of {len(planted)} planted changes"
        if missed[name]:
            what += f" (misses: {', '.join(missed[name])})"
        out.append(
            info(
                name,
                costs[name] / save_s * 100,
                "% of save",
                note=f"{costs[name] * 1e3:.0f} ms ({size / costs[name] / 1e9:.1f} GB/s); {what}",
                extra={"seconds": costs[name], "seen": seen[name], "missed": missed[name]},
            )
        )
    return out


if __name__ == "__main__":
    main_for("digest", run)
