"""A torchrun-like job without torch that, when a peer dies, replays a captured failure.

Why: the CLI tests of the job's output and of the diagnoses need a real local drill (the
local backend reading a launcher's merged output), but ``import torch`` costs seconds per
process on a small machine. This launcher starts ``--nproc`` workers the way torchrun
does where the local backend looks (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``TORCHELASTIC_RESTART_COUNT`` in their environment, every line
prefixed ``[defaultN]:`` as ``torchrun --tee=3`` does). Rank 0 reports through the real
reporter and checkpoints every ``--ckpt-every`` steps. When a worker dies, the launcher
stops the others; the ``--replay`` file (output captured from a real failure,
``tests/diagnosis/data/``) is printed as the restarted job's output, and the launcher
exits 1 like torchrun with no restart left. With ``--at-start`` the launcher prints the
replay and exits 1 before any worker starts (a job that fails on its first start). The
capture's own RECOVERYGATE/v1 lines are left out of the replay: their timestamps are
from the day of the capture, and the drill would read them as events.

Usage: ``python replay_job.py --nproc 2 --replay data/torch-load-truncated.log``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def worker(rank: int, ckpt_every: int) -> None:
    from recoverygate import reporter

    step = 0
    while True:
        time.sleep(0.01)
        step += 1
        reporter.progress(step)
        if rank == 0 and step % ckpt_every == 0:
            reporter.checkpoint_completed(step)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--replay", default=None, help="output to print once a worker died")
    parser.add_argument("--at-start", action="store_true", help="replay, exit 1 at once")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.ckpt_every)
        return 0
    if args.at_start:
        replay(args.replay)
        return 1
    procs = []
    for rank in range(args.nproc):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(args.nproc),
            "LOCAL_WORLD_SIZE": str(args.nproc),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "PYTHONUNBUFFERED": "1",
        }
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    str(rank),
                    "--ckpt-every",
                    str(args.ckpt_every),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    import threading

    def relay(rank: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.buffer.write(f"[default{rank}]:".encode() + line)
            sys.stdout.buffer.flush()

    relays = [threading.Thread(target=relay, args=(r, p), daemon=True) for r, p in enumerate(procs)]
    for thread in relays:
        thread.start()

    def stop(*_: object) -> None:
        for p in procs:
            p.terminate()
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    while all(p.poll() is None for p in procs):
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        proc.wait()
    for thread in relays:
        thread.join(2)
    replay(args.replay)
    return 1


def replay(path: str | None) -> None:
    if not path:
        return
    with open(path, "rb") as handle:
        for line in handle:
            if b"RECOVERYGATE/v1" not in line:
                sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    sys.exit(main())
