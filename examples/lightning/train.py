"""A Lightning job for RecoveryGate drills: a tiny regression module on synthetic data, CPU.

Run it under torchrun (2 ranks, DDP over gloo)::

    torchrun --standalone --nproc-per-node=2 --max-restarts=3 train.py --ckpt-dir=./ckpt

What it shows:

- one line makes it drillable: ``callbacks=[RecoveryGateCallback()]`` (progress per
  optimizer step, a checkpoint reported once Lightning's save returned on every rank,
  the resume step and state digests). ``--no-callback`` leaves it out: the job is then
  an unmodified Lightning script, drillable with ``RECOVERYGATE_AUTO=1``;
- checkpoints: ``ModelCheckpoint(every_n_train_steps=N, save_last=True)``, resumed with
  ``trainer.fit(..., ckpt_path="last")``; ``--resume=none`` never resumes (the bug a
  drill must catch);
- ``--ckpt-dir`` may contain ``{tmpdir}`` and ``{pid}``: per-process storage, the
  node-local-checkpoint bug.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys
import tempfile
import time

import torch

# ``--package=pytorch_lightning`` runs the same job on the other package name (its own
# class tree); the drill tests use it to cover both.
PACKAGE = "pytorch_lightning" if "--package=pytorch_lightning" in sys.argv else "lightning.pytorch"
pl = importlib.import_module(PACKAGE)
ModelCheckpoint = importlib.import_module(f"{PACKAGE}.callbacks").ModelCheckpoint
DDPStrategy = importlib.import_module(f"{PACKAGE}.strategies").DDPStrategy

FEATURES = 16


class Regression(pl.LightningModule):  # type: ignore[name-defined,misc]
    def __init__(self, step_time: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )
        self.step_time = step_time

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
        if self.step_time > 0:
            time.sleep(self.step_time)  # so a drill has time to watch the run

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.9)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class Synthetic(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A pure function of the index: a resumed run sees the same data."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(FEATURES, generator=generator)
        return x, (x.sum() / FEATURES).unsqueeze(0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", default="./ckpt", help="{tmpdir} and {pid} expand")
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument(
        "--grad-accum",
        type=int,
        default=2,
        help="accumulate_grad_batches: micro-batches per optimizer step",
    )
    parser.add_argument(
        "--step-time", type=float, default=0.02, help="seconds of sleep after each micro-batch"
    )
    parser.add_argument("--resume", choices=("last", "none"), default="last")
    parser.add_argument(
        "--no-callback",
        action="store_true",
        help="leave the callback out (for RECOVERYGATE_AUTO=1)",
    )
    parser.add_argument(
        "--package",
        choices=("lightning", "pytorch_lightning"),
        default="lightning",
        help="import lightning.pytorch or pytorch_lightning",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ckpt_dir = args.ckpt_dir.format(tmpdir=tempfile.gettempdir(), pid=os.getpid())
    pl.seed_everything(0, verbose=False)
    callbacks: list[object] = [
        ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="{step}",
            every_n_train_steps=args.save_steps,
            save_top_k=-1,
            save_last=True,
        )
    ]
    if not args.no_callback:
        if PACKAGE == "pytorch_lightning":
            from recoverygate.integrations.pytorch_lightning import RecoveryGateCallback
        else:
            from recoverygate.integrations.lightning import RecoveryGateCallback

        callbacks.append(RecoveryGateCallback())
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")) if distributed else 1,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=datetime.timedelta(seconds=60))
        if distributed
        else "auto",
        max_steps=args.max_steps,
        accumulate_grad_batches=args.grad_accum,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    loader = torch.utils.data.DataLoader(Synthetic(), batch_size=8, num_workers=0)
    resume = (
        "last"
        if args.resume == "last" and os.path.exists(os.path.join(ckpt_dir, "last.ckpt"))
        else None
    )
    trainer.fit(Regression(args.step_time), train_dataloaders=loader, ckpt_path=resume)


if __name__ == "__main__":
    main()
