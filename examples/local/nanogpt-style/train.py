"""A small training loop that prints exactly the lines nanoGPT's train.py prints.

It is *not* nanoGPT (whose code is not ours to copy) and it does not call RecoveryGate:
the drill reads only the lines below, through ``evidence: {preset: nanogpt}``.

The lines, in nanoGPT's formats and at nanoGPT's moments (rank 0 only, like its
``master_process``)::

    Initializing a new model from scratch          init_from='scratch', or no ckpt.pt yet
    Resuming training from OUT_DIR                 init_from='resume' and OUT_DIR/ckpt.pt
    step N: train loss X, val loss Y               every eval_interval, before step N+1
    saving checkpoint to OUT_DIR                   right after it (N > 0), then torch.save
    iter N: loss X, time Tms, mfu M%               after the step of index N (every log_interval)

Like nanoGPT it saves ``OUT_DIR/ckpt.pt`` synchronously with ``torch.save`` (no temporary
file) and ``always_save_checkpoint`` is on, so a resumed run re-saves at its resume step.
Two differences, for a drill: nanoGPT's ``init_from='resume'`` fails without a
checkpoint; here it starts from scratch then, so one command serves the first run and
torchrun's restarts. And ``{tmpdir}`` in ``--out_dir`` is the process's temporary folder
(the drill gives the job its own, shared by every rank and restart, removed afterwards).
``--init_from=scratch`` is the broken twin: every restart starts over.

With ``RECOVERYGATE_GROUND_TRUTH=<base>`` every rank also writes what it really did to
``<base>.<rank>.<pid>.jsonl`` (records as ``examples/local/train.py``'s: ``loaded``, and
``step`` / ``checkpoint`` with the steps completed), for the tests to hold a drill to; it
prints nothing more.

Run it under torchrun (2 ranks, gloo on CPU)::

    torchrun --standalone --nproc-per-node=2 --max-restarts=3 train.py --out_dir=out
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time
from pathlib import Path
from typing import IO

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

FEATURES = 8


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out_dir", default="out")
    parser.add_argument("--init_from", choices=["scratch", "resume"], default="resume")
    parser.add_argument("--eval_interval", type=int, default=10)
    parser.add_argument("--log_interval", type=int, default=1)
    parser.add_argument("--max_iters", type=int, default=100_000)
    parser.add_argument("--step_time", type=float, default=0.05, help="seconds per step")
    return parser.parse_args()


class GroundTruth:
    """One JSON record per event, for the tests (off without RECOVERYGATE_GROUND_TRUTH)."""

    def __init__(self, rank: int) -> None:
        self._rank = rank
        self._handle: IO[str] | None = None
        base = os.environ.get("RECOVERYGATE_GROUND_TRUTH")
        for n in range(1000) if base else ():
            suffix = f".{n}" if n else ""  # a container's restart brings a pid back
            try:
                self._handle = open(f"{base}.{rank}.{os.getpid()}{suffix}.jsonl", "x")  # noqa: SIM115
                break
            except FileExistsError:
                continue

    def record(self, event: str, step: int) -> None:
        if self._handle is not None:
            row = {"t": round(time.time(), 6), "rank": self._rank, "pid": os.getpid()}
            row.update({"restart": 0, "step": step, "event": event})
            self._handle.write(json.dumps(row, separators=(",", ":")) + "\n")
            self._handle.flush()


def batch(iter_num: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data, a pure function of the step: a resumed run sees what it would have."""
    gen = torch.Generator().manual_seed(iter_num * 100 + rank)
    x = torch.randn(16, FEATURES, generator=gen)
    return x, x.sum(dim=1, keepdim=True)


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    master = rank == 0
    truth = GroundTruth(rank)
    truth.record("start", 0)
    # {tmpdir}: the process's temporary folder (the drill's own, removed after it)
    out_dir = Path(args.out_dir.replace("{tmpdir}", tempfile.gettempdir()))
    ckpt_path = out_dir / "ckpt.pt"
    torch.manual_seed(1337)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    iter_num, best_val_loss = 0, 1e9
    if args.init_from == "resume" and ckpt_path.exists():
        if master:
            print(f"Resuming training from {out_dir}")
        checkpoint = torch.load(ckpt_path, map_location="cpu")
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        iter_num = checkpoint["iter_num"]
        best_val_loss = checkpoint["best_val_loss"]
    elif master:
        print("Initializing a new model from scratch")
    truth.record("loaded", iter_num)
    ddp = DistributedDataParallel(model)
    if master:
        out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    while iter_num <= args.max_iters:
        if iter_num % args.eval_interval == 0 and master:
            with torch.no_grad():
                x, y = batch(-1 - iter_num, rank)
                val = torch.nn.functional.mse_loss(model(x), y).item()
            print(f"step {iter_num}: train loss {val:.4f}, val loss {val:.4f}")
            best_val_loss = min(best_val_loss, val)  # always_save_checkpoint
            if iter_num > 0:
                checkpoint = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                }
                print(f"saving checkpoint to {out_dir}")
                torch.save(checkpoint, ckpt_path)
                truth.record("checkpoint", iter_num)
        x, y = batch(iter_num, rank)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        time.sleep(args.step_time)
        truth.record("step", iter_num + 1)  # steps completed
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % args.log_interval == 0 and master:
            print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms, mfu -100.00%")
        iter_num += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
