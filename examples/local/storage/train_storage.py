"""A 2-rank DDP job (gloo on CPU) with the checkpoint savers that real jobs get right and
wrong when the storage fails: RecoveryGate's StorageFault examples (docs/faults.md).

Run it under torchrun::

    torchrun --standalone --nproc-per-node=2 --max-restarts=3 train_storage.py \\
        --ckpt-dir=./checkpoints --saver atomic

Rank 0 saves every ``--ckpt-every`` steps, then every rank meets at a barrier (the
process group's ``--timeout``): a save that hangs holds rank 1 there. ``--saver``:

- ``atomic`` (right): write a temporary file, fsync it, rename it into place, fsync the
  folder; only then report ``checkpoint_completed`` and remove checkpoints older than
  the last two. A failed save is reported (``checkpoint_failed``) and, with
  ``--on-error raise`` (the default), fails the job: torchrun restarts it from the last
  durable checkpoint; ``--on-error skip`` trains on and saves again next time;
- ``swallow``: the save runs in a writer thread that catches the ``OSError`` and reports
  the checkpoint complete anyway (pytorch/pytorch#191391);
- ``latest-first``: the ``latest`` link is moved to the new checkpoint before it is
  written, straight to its final name (KempnerForge#102): a failed save leaves ``latest``
  naming a partial file;
- ``delete-first``: keep-last-1 retention that removes the old checkpoint before saving
  the new one (verl#4873, torchtitan#4197): a failed save leaves none.

A resume follows ``latest`` when it exists, else takes the newest ``step-N.pt``;
``--on-load`` says what it does with a checkpoint that is damaged at rest (StickyFault,
``scope: checkpoint``):

- ``trust`` (the default): load the newest; a file that no longer loads crashes the job
  (torchrun restarts it onto the same file), one that loads with damaged bytes is trained on;
- ``verify`` (right): the atomic saver writes ``step-N.pt.sha256`` (the file's SHA-256)
  after each checkpoint; a resume checks the newest against it and, when it differs, is
  missing or the file does not load, says so and falls back to the one before it;
- ``scratch``: a checkpoint that does not load is dropped and training starts again from
  step 0 (a fallback that throws away every older checkpoint).

Each checkpoint is reported with the state's digest (``reporter.state_digest``), and so
is each load: the drill can tell a damaged state that loaded from the state saved.

With ``RECOVERYGATE_GROUND_TRUTH=<base>`` every rank appends its own records to
``<base>.<rank>.<pid>.jsonl``: each step, each save started, failed (its error), durable
(the saver's own proof: renamed and the folder synced), reported complete, every file it
removed, and the step it loaded: the truth a drill's verdict is held to.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
from recoverygate import reporter
from torch.nn.parallel import DistributedDataParallel

NAME = re.compile(r"^step-(\d{8})\.pt$")
FEATURES = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", default="./checkpoints")
    parser.add_argument("--ckpt-every", type=int, default=20)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument(
        "--saver", choices=("atomic", "swallow", "latest-first", "delete-first"), default="atomic"
    )
    parser.add_argument("--on-error", choices=("raise", "skip"), default="raise")
    parser.add_argument("--timeout", type=float, default=30.0, help="process group timeout (s)")
    parser.add_argument("--pad", type=int, default=0, help="extra bytes in each checkpoint")
    parser.add_argument("--on-load", choices=("trust", "verify", "scratch"), default="trust")
    return parser.parse_args()


class Truth:
    """The job's own records (RECOVERYGATE_GROUND_TRUTH), one JSON line each, flushed."""

    def __init__(self, rank: int) -> None:
        base = os.environ.get("RECOVERYGATE_GROUND_TRUTH")
        self.rank = rank
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.handle: IO[str] | None = None
        if base:
            self.handle = open(f"{base}.{rank}.{os.getpid()}.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def __call__(self, event: str, step: int, **extra: Any) -> None:
        if self.handle is None:
            return
        row = {"t": round(time.time(), 6), "rank": self.rank, "pid": os.getpid()}
        row.update(restart=self.restart, step=step, event=event, **extra)
        self.handle.write(json.dumps(row) + "\n")
        self.handle.flush()


def checkpoints(folder: Path) -> list[tuple[int, Path]]:
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := NAME.match(p.name))]
    return sorted(found)


def resume_from(folder: Path) -> tuple[int, Path] | None:
    """``latest`` when it names a file that exists, else the newest checkpoint."""
    latest = folder / "latest"
    if latest.is_symlink():
        target = folder / os.readlink(latest)
        match = NAME.match(target.name)
        if match and target.exists():
            return int(match.group(1)), target
    found = checkpoints(folder)
    return found[-1] if found else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load(folder: Path, on_load: str, truth: Truth) -> tuple[int, dict[str, Any]] | None:
    """The checkpoint to resume from, as ``--on-load`` says (see the module docstring)."""
    found = resume_from(folder) if folder.is_dir() else None
    if found is None:
        return None
    candidates = [found] + [c for c in reversed(checkpoints(folder)) if c[0] < found[0]]
    for step, path in candidates if on_load == "verify" else candidates[:1]:
        try:
            if on_load == "verify":
                sidecar = path.with_name(path.name + ".sha256")
                want = sidecar.read_text().strip() if sidecar.exists() else None
                if want != sha256_of(path):
                    raise ValueError(f"{path} does not match its checksum {sidecar.name}")
            return step, torch.load(path, map_location="cpu")
        except (ValueError, RuntimeError, EOFError, OSError) as exc:
            if on_load == "trust":
                raise  # a file that no longer loads: the job dies, restarts, dies again
            truth("rejected", step, error=str(exc)[:200])
            print(f"checkpoint {path.name} is damaged ({exc}); falling back", flush=True)
            if on_load == "scratch":
                return None
    return None


def fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(
    folder: Path, step: int, state: dict[str, Any], saver: str, truth: Truth, checksum: bool
) -> bool:
    """One save by ``saver``; True when the job counts it (reports it complete)."""
    final = folder / f"step-{step:08d}.pt"
    if saver == "delete-first":  # retention first: make room, then save
        for old_step, old in checkpoints(folder):
            old.unlink()
            truth("deleted", old_step)
    if saver == "latest-first":  # the pointer moves before the checkpoint exists
        latest = folder / "latest"
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        os.symlink(final.name, latest)
        truth("pointer", step)
        torch.save(state, final)
        truth("durable", step)
        return True
    if saver == "swallow":
        errors: list[BaseException] = []

        def write() -> None:
            try:
                with open(final, "wb") as handle:
                    torch.save(state, handle)
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as exc:  # the bug: logged, never raised
                errors.append(exc)
                print(f"checkpoint writer: {exc}", flush=True)

        writer = threading.Thread(target=write)
        writer.start()
        writer.join()
        if errors:
            truth("save_failed", step, error=str(errors[0]))
        else:
            truth("durable", step)
        return True  # reported complete either way
    tmp = folder / f".step-{step:08d}.pt.tmp"
    try:
        with open(tmp, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
        if checksum:  # --on-load verify: the file's checksum beside it
            sidecar = folder / f".{final.name}.sha256.tmp"
            sidecar.write_text(sha256_of(final) + "\n")
            os.replace(sidecar, folder / f"{final.name}.sha256")
        fsync_folder(folder)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    truth("durable", step)
    if saver == "atomic":  # retention after the new one is durable: keep the last two
        for old_step, old in checkpoints(folder)[:-2]:
            old.unlink()
            with contextlib.suppress(FileNotFoundError):
                old.with_name(old.name + ".sha256").unlink()
            truth("deleted", old_step)
    return True


def digest_of(model: torch.nn.Module, opt: torch.optim.Optimizer) -> str:
    """The state's fingerprint, as the drill compares it (saved vs loaded)."""
    return str(reporter.state_digest({"model": model, "optimizer": opt}))


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    truth = Truth(rank)
    truth("start", 0)
    folder = Path(args.ckpt_dir)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = 0
    loaded = load(folder, args.on_load, truth)
    if loaded is not None:
        _, state = loaded
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
    start = torch.tensor([step], dtype=torch.int64)
    dist.broadcast(start, src=0)
    step = int(start.item())
    digest = digest_of(model, opt)
    truth("loaded", step, digest=digest)
    if step:
        reporter.checkpoint_loaded(step, digest=digest)
    ddp = DistributedDataParallel(model)
    loss_fn = torch.nn.MSELoss()
    while step < args.steps:
        generator = torch.Generator().manual_seed(step * 1009 + rank)
        x = torch.randn(32, FEATURES, generator=generator)
        y = x.sum(dim=1, keepdim=True) / FEATURES
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()
        step += 1
        truth("step", step)
        reporter.progress(step)
        if step % args.ckpt_every == 0:
            if rank == 0:
                state = {"step": step, "model": model.state_dict(), "opt": opt.state_dict()}
                if args.pad:
                    state["pad"] = torch.zeros(args.pad, dtype=torch.uint8)
                truth("save_started", step)
                reporter.checkpoint_started(step)
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                    verify = args.on_load == "verify"
                    counted = save(folder, step, state, args.saver, truth, verify)
                except (OSError, RuntimeError) as exc:  # torch.save to a path: RuntimeError
                    truth("save_failed", step, error=str(exc))
                    reporter.checkpoint_failed(step, exc)
                    if args.on_error == "raise":
                        raise
                else:
                    if counted:
                        digest = digest_of(model, opt)
                        truth("reported_complete", step, digest=digest)
                        reporter.checkpoint_completed(step, digest=digest)
            dist.barrier()  # every rank waits for the save (a hung save holds them all)
        if args.step_time > 0:
            time.sleep(args.step_time)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
