"""Capture what a first start without a checkpoint folder, or file, prints (three ways).

Run under torchrun (2 ranks on CPU), with a folder that does not exist::

    torchrun --standalone --nproc-per-node=2 first_start.py --ckpt-dir=/nonexistent/ckpt --mode=listdir
    torchrun --standalone --nproc-per-node=2 first_start.py --ckpt-dir=/nonexistent/ckpt --mode=save

``listdir``: the resume code lists the folder to find the latest checkpoint (and the
folder is only created by the first save). ``save``: the first save writes into a folder
nobody created. ``load`` (with a folder that exists and holds no ``ckpt.pt``): the resume
code loads ``ckpt.pt`` unconditionally, as nanoGPT's ``init_from='resume'`` does::

    mkdir -p /tmp/out && torchrun --standalone --nproc-per-node=2 first_start.py --ckpt-dir=/tmp/out --mode=load
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from recoverygate import reporter

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt-dir", required=True)
parser.add_argument("--mode", choices=("listdir", "save", "load"), required=True)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
step = 0
if args.mode == "load":  # nanoGPT: ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    step = torch.load(os.path.join(args.ckpt_dir, "ckpt.pt"), map_location="cpu")["step"]
elif args.mode == "listdir":
    names = sorted(n for n in os.listdir(args.ckpt_dir) if n.endswith(".pt"))
    if names:
        step = torch.load(os.path.join(args.ckpt_dir, names[-1]))["step"]
for step in range(step + 1, 21):
    reporter.progress(step)
    dist.barrier()
if rank == 0:
    torch.save({"step": step, "model": model.state_dict()}, f"{args.ckpt_dir}/step-{step}.pt")
    reporter.checkpoint_completed(step)
dist.barrier()
