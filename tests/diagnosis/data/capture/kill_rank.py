"""Run a torchrun command, SIGKILL one rank after a checkpoint, and keep its whole output.

    python kill_rank.py OUT.log --after-step 100 --rank 1 --wait 90 -- torchrun ... train.py ...

The output is the launcher's merged stdout/stderr, exactly as the local backend reads it.
``--kills N`` kills the same rank again after each later checkpoint (the bug shows on some
restarts, not all).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--after-step", type=int, default=100)
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--wait", type=float, default=90.0)
parser.add_argument("--kills", type=int, default=1)
split = sys.argv.index("--")
args = parser.parse_args(sys.argv[1:split])
command = sys.argv[split + 1 :]

out = open(args.out, "wb")
proc = subprocess.Popen(
    command,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    env={**os.environ, "PYTHONUNBUFFERED": "1"},
    start_new_session=True,
)
checkpoints: list[int] = []
last_line_at = [time.time()]


def pump() -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        out.write(line)
        out.flush()
        last_line_at[0] = time.time()
        match = re.search(rb'RECOVERYGATE/v1 (\{.*?"event":"checkpoint_completed".*?\})', line)
        if match:
            checkpoints.append(json.loads(match.group(1))["step"])


reader = threading.Thread(target=pump, daemon=True)
reader.start()


def rank_pid(rank: int) -> int | None:
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            env = child.environ()
        except psutil.Error:
            continue
        parent = child.parent()
        if env.get("RANK") == str(rank) and parent is not None and parent.pid == proc.pid:
            return child.pid
    return None


kills = 0
target = args.after_step
deadline = time.time() + 600
while proc.poll() is None and kills < args.kills and time.time() < deadline:
    if checkpoints and checkpoints[-1] >= target:
        pid = rank_pid(args.rank)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            kills += 1
            sys.stderr.write(f"killed rank {args.rank} (pid {pid}) after step {checkpoints[-1]}\n")
            target = checkpoints[-1] + 40
    time.sleep(0.05)
end = time.time() + args.wait
while proc.poll() is None and time.time() < end:
    time.sleep(0.2)
if proc.poll() is None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
reader.join(5)
sys.stderr.write(f"exit {proc.returncode}; checkpoints {checkpoints[-5:]}\n")
