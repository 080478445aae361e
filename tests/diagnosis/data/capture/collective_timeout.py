"""Capture a real gloo collective timeout: rank 1 hangs, rank 0 waits in all_reduce.

Run under torchrun (2 ranks on CPU)::

    torchrun --standalone --nproc-per-node=2 collective_timeout.py            # default timeout
    torchrun --standalone --nproc-per-node=2 collective_timeout.py --timeout 5

Without ``--timeout`` the process group keeps torch's default (30 minutes for gloo), so
rank 0 fails after 30 minutes: that is the ``collective-timeout-default`` sample.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--timeout", type=float, default=None, help="seconds; default: torch's")
args = parser.parse_args()
if args.timeout is None:
    dist.init_process_group("gloo")
else:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
rank = dist.get_rank()
print(f"rank {rank}: joined the group", flush=True)
if rank == 1:
    time.sleep(7200)  # a hung worker: alive, never joins the collective
    sys.exit(0)
tensor = torch.ones(4)
dist.all_reduce(tensor)
print("all_reduce returned", flush=True)
