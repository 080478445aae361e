"""A DDP job that checkpoints with torch.distributed.checkpoint through recoverygate's wrapper.

Run under torchrun (2 ranks, gloo)::

    torchrun --standalone --nproc-per-node=2 dcp_job.py --ckpt-dir=./ckpt --mode=async

Every ``--ckpt-every`` steps it saves ``{"app": AppState(model, optimizer)}`` to
``<ckpt-dir>/step-<N>`` with ``recoverygate.integrations.dcp.save`` (``--mode=sync``) or
``async_save`` (``--mode=async``: on its own gloo group, the previous save awaited
before the next one starts, as DCP's docs recommend). At start it loads the newest
folder that holds ``.metadata`` (which DCP writes last, once every rank's writes are
in) with ``dcp.load``. State digests go with the checkpoint events (``digest=True``).
The files' own modification times are the ground truth of when each save happened.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist
from recoverygate import reporter
from recoverygate.integrations import dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel

FOLDER = re.compile(r"^step-(\d{8})$")


class AppState(Stateful):
    """Model and optimizer as one DCP Stateful (the pattern of DCP's own tutorial)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, object]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],  # type: ignore[arg-type]
            optim_state_dict=state_dict["optim"],  # type: ignore[arg-type]
        )


def newest_complete(folder: Path) -> tuple[int, Path] | None:
    if not folder.is_dir():
        return None
    found = []
    for path in folder.iterdir():
        match = FOLDER.match(path.name)
        if match and (path / ".metadata").exists():
            found.append((int(match.group(1)), path))
    return max(found) if found else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--step-time", type=float, default=0.03)
    parser.add_argument("--steps", type=int, default=1_000_000)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = {"app": AppState(model, optimizer)}
    folder = Path(args.ckpt_dir)
    step = 0
    newest = newest_complete(folder)
    found = torch.tensor([newest[0] if newest else 0])
    dist.broadcast(found, src=0)  # rank 0's view decides, as in the other examples
    if int(found.item()):
        step = int(found.item())
        dcp.load(state, step=step, digest=True, checkpoint_id=str(folder / f"step-{step:08d}"))
    save_group = dist.new_group(backend="gloo") if args.mode == "async" else None
    pending = None
    while step < args.steps:
        generator = torch.Generator().manual_seed(step * 1009 + rank)
        x = torch.randn(8, 16, generator=generator)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        reporter.progress(step)
        if step % args.ckpt_every == 0:
            checkpoint_id = str(folder / f"step-{step:08d}")
            if args.mode == "sync":
                dcp.save(state, step=step, digest=True, checkpoint_id=checkpoint_id)
            else:
                if pending is not None:
                    pending.result()  # one save in flight at a time
                pending = dcp.async_save(
                    state,
                    step=step,
                    digest=True,
                    checkpoint_id=checkpoint_id,
                    process_group=save_group,
                )
        time.sleep(args.step_time)
    if pending is not None:
        pending.result()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
