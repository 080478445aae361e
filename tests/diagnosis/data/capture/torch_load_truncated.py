"""Capture what ``torch.load`` raises on truncated checkpoint files (no torchrun needed).

    python torch_load_truncated.py

Saves a small model state in torch's zip format and in the legacy pickle format,
truncates copies (to half, and to zero bytes) and prints each traceback of
``torch.load`` as Python prints an uncaught one. Then the same for a zip checkpoint of
more than a few KiB cut to half: torch 2.13's zip reader fails on it with a bare
``OSError: [Errno 22] Invalid argument`` (the common case: real checkpoints are big).
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback

import torch

small = {"step": 60, "model": torch.nn.Linear(16, 32).state_dict()}
large = {"step": 60, "model": torch.nn.Linear(64, 64).state_dict()}
# (file name, format, state, zip format, cut to half only)
CASES = (
    ("zip", "zip", small, True, False),
    ("legacy", "legacy", small, False, False),
    ("zip-large", "zip", large, True, True),
)
with tempfile.TemporaryDirectory() as folder:
    for name, fmt, state, zipped, half_only in CASES:
        whole = os.path.join(folder, f"whole-{name}.pt")
        torch.save(state, whole, _use_new_zipfile_serialization=zipped)
        size = os.path.getsize(whole)
        for cut in (size // 2,) if half_only else (size // 2, 0):
            path = os.path.join(folder, f"step-00000060-{name}-{cut}.pt")
            with open(whole, "rb") as src, open(path, "wb") as dst:
                dst.write(src.read(cut))
            print(f"# torch.load of a {fmt} checkpoint truncated from {size} to {cut} bytes")
            try:
                torch.load(path, map_location="cpu")
            except Exception:
                traceback.print_exc(file=sys.stdout)
            print()
