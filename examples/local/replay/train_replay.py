"""A real 2-rank DDP job (gloo, CPU) whose resume restores everything, for replay drills.

Run it under torchrun::

    torchrun --standalone --nproc-per-node=2 --max-restarts=3 train_replay.py \
        --ckpt-dir=./checkpoints

After a resume from checkpoint L the replacement redoes the steps L+1..K the killed run
had done; with everything restored it computes the same loss at each of them, bit for
bit on CPU. What that takes, and what each ``--forget`` twin leaves out:

- the model and the optimizer (AdamW moments): ``--forget optimizer`` re-creates it;
- the LR scheduler (a linear warm-up): ``--forget scheduler`` starts the warm-up over;
- every rank's RNG states (torch's, for dropout; python's, for the noise added to each
  batch): ``--forget rng`` keeps the fresh process's seeds;
- the data position mid-epoch: a ``DistributedSampler`` with ``set_epoch`` and the
  batches of the epoch already done skipped: ``--forget data`` starts the epoch over;
- the ``DataLoader``'s own generator (``generator=``, re-seeded per epoch): creating an
  iterator draws its base seed from that generator, or from the *global* RNG without one,
  which moves the dropout masks of a resumed run: ``--forget generator`` leaves it out.

Each step rank 0 reports ``progress(step, loss=loss, data=fingerprint)`` (the fingerprint:
the epoch and the batch's first and last sample index). With ``--losses FILE`` every rank
also appends one JSON line per step to ``FILE.<rank>.<pid>.jsonl`` (step, loss as
``float.hex``, fingerprint): the job's own record, which the tests hold the drill to.
Checkpoints: every rank writes its RNG states, then rank 0 the model, optimizer and
scheduler (temp file, fsync, rename), after a barrier, so a completed checkpoint always
has every rank's part.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
from recoverygate import reporter
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES = 16
SAMPLES = 2048  # 64 batches of 16 per rank and epoch: a resume at 40 is mid-epoch
BATCH = 16
WARMUP = 100
CHECKPOINT = re.compile(r"^step-(\d{8})\.pt$")
FORGETS = ("none", "data", "rng", "scheduler", "optimizer", "generator")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--ckpt-every", type=int, default=20)
    parser.add_argument("--ckpt-dir", default="./checkpoints", help="{tmpdir} expands")
    parser.add_argument("--step-time", type=float, default=0.05, help="seconds of sleep per step")
    parser.add_argument("--forget", choices=FORGETS, default="none", help="what resume leaves out")
    parser.add_argument("--losses", default=None, help="append the job's own per-step record")
    return parser.parse_args(argv)


def dataset() -> TensorDataset:
    """A fixed synthetic regression set (same on every rank and every run)."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    y = (x @ (torch.arange(FEATURES, dtype=torch.float32) / FEATURES)).unsqueeze(1)
    return TensorDataset(x, y, torch.arange(SAMPLES))


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def atomic_save(obj: Any, final: Path) -> None:
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, final)


def latest_step(folder: Path) -> int:
    steps = [int(m.group(1)) for p in folder.glob("step-*.pt") if (m := CHECKPOINT.match(p.name))]
    return max(steps, default=0)


class Record:
    """The job's own per-step record (``--losses``), one JSON line per step."""

    def __init__(self, base: str | None, rank: int) -> None:
        self._path = f"{base}.{rank}.{os.getpid()}.jsonl" if base else None
        self._handle: IO[str] | None = None

    def step(self, step: int, loss: float, data: str) -> None:
        if self._path is None:
            return
        if self._handle is None:  # opened at the first step: a process that never steps
            self._handle = open(self._path, "a", encoding="utf-8")  # noqa: SIM115
        row = {"step": step, "loss": loss.hex(), "data": data, "t": time.time()}
        self._handle.write(json.dumps(row) + "\n")
        self._handle.flush()


def build(forget: str) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(64, 1),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    return model, opt, sched


def resume(
    folder: Path, rank: int, forget: str, model: torch.nn.Module, opt: Any, sched: Any
) -> int:
    """Load the newest complete checkpoint (0: none) and restore what ``forget`` keeps."""
    step = latest_step(folder) if rank == 0 else 0
    agreed = torch.tensor([step], dtype=torch.int64)
    dist.broadcast(agreed, src=0)  # rank 0's folder is the authority
    step = int(agreed.item())
    if not step:
        return 0
    state = torch.load(folder / f"step-{step:08d}.pt", map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    if forget != "optimizer":
        opt.load_state_dict(state["opt"])
    if forget != "scheduler":
        sched.load_state_dict(state["sched"])
    if forget != "rng":
        rngs = torch.load(folder / f"rng-{rank}-{step:08d}.pt", weights_only=False)
        set_rng_state(rngs)
    return step


def save(folder: Path, step: int, rank: int, model: torch.nn.Module, opt: Any, sched: Any) -> None:
    atomic_save(rng_state(), folder / f"rng-{rank}-{step:08d}.pt")
    dist.barrier()  # every rank's RNG file is durable
    if rank == 0:
        reporter.checkpoint_started(step)
        state = {"step": step, "model": model.state_dict(), "opt": opt.state_dict()}
        state["sched"] = sched.state_dict()
        atomic_save(state, folder / f"step-{step:08d}.pt")
        reporter.checkpoint_completed(step)


def batches(loader: DataLoader[Any], sampler: Any, step: int, forget: str, seed: int) -> Any:
    """The batches from ``step`` on, epoch after epoch, the position restored."""
    per_epoch = len(loader)
    epoch, offset = divmod(step, per_epoch)
    if forget == "data":
        offset = 0  # the bug: the epoch starts over at its first batch
    while True:
        sampler.set_epoch(epoch)
        if loader.generator is not None:
            loader.generator.manual_seed(seed + epoch)
        it = iter(loader)  # draws a base seed: from generator=, or from the global RNG
        for _ in range(offset):
            next(it)
        for item in it:
            yield epoch, item
        epoch, offset = epoch + 1, 0


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt, sched = build(args.forget)
    torch.manual_seed(100 + rank)  # each rank's own dropout masks
    random.seed(200 + rank)
    folder = Path(args.ckpt_dir.format(tmpdir=tempfile.gettempdir()))
    folder.mkdir(parents=True, exist_ok=True)
    step = resume(folder, rank, args.forget, model, opt, sched)
    if step:
        reporter.checkpoint_loaded(step)
    data = dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    generator = None if args.forget == "generator" else torch.Generator()
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, generator=generator)
    ddp = DistributedDataParallel(model)
    record = Record(args.losses, rank)
    loss_fn = torch.nn.MSELoss()
    for epoch, (inputs, y, index) in batches(loader, sampler, step, args.forget, seed=5):
        if step >= args.steps:
            break
        x = inputs * (1.0 + 0.01 * random.random())  # a python-RNG augmentation
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        fingerprint = f"e{epoch}:{int(index[0])}-{int(index[-1])}"
        # the job's own record first: a step the drill saw is one the record holds, even
        # when the drill's verdict (decided at that line) stops the job right after it
        record.step(step, float(loss), fingerprint)
        reporter.progress(step, loss=loss.detach(), data=fingerprint)
        if step % args.ckpt_every == 0:
            save(folder, step, rank, model, opt, sched)
        if args.step_time > 0:
            time.sleep(args.step_time)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
