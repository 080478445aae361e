"""A tiny training job for the procgroup example: a step every 20 ms, a checkpoint every
10 steps (rank 0 writes it atomically), a resume from it after a restart.

``python train.py STEPS [FOLDER]``; the reporter (``recoverygate-reporter``) must be
importable where the job runs.
"""

import json
import os
import sys
import time
from pathlib import Path

from recoverygate import reporter

total = int(sys.argv[1]) if len(sys.argv) > 1 else 200
folder = Path(sys.argv[2]) if len(sys.argv) > 2 else Path()
checkpoint = folder / "checkpoint.json"
rank = int(os.environ.get("RANK", "0"))

step = 0
if checkpoint.exists():
    step = json.loads(checkpoint.read_text())["step"]
    reporter.checkpoint_loaded(step)
while step < total:
    time.sleep(0.02)  # one training step
    step += 1
    reporter.progress(step)
    if step % 10 == 0 and rank == 0:
        partial = checkpoint.with_suffix(".tmp")
        partial.write_text(json.dumps({"step": step}))
        os.replace(partial, checkpoint)  # durable enough for a drill on one machine
        reporter.checkpoint_completed(step)
