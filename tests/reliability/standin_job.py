"""A torchrun stand-in for cleanup tests: an elastic agent and workers, without torch.

Why: the cleanup table runs dozens of drills on real processes; ``import torch`` costs
2-5 s per process on a small machine, and torch is not what those rows test. This
script behaves like torchrun where the local backend looks: the agent starts
``--nproc`` workers, each in its own session, with ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and ``TORCHELASTIC_RESTART_COUNT`` in their
environment; when one dies the agent stops the others and restarts the group (up to
``--max-restarts``), else exits 1; SIGTERM is forwarded to the workers. Workers report
through the real ``recoverygate.reporter``, checkpoint to ``--ckpt`` and resume from it.

Like torchrun, the agent waits ``--restart-delay`` (0.1 s, torchrun's monitor interval)
between noticing a failed group and starting the next one. torchrun cannot be faster
(monitor interval plus a rendezvous round), and a stand-in that is (a few ms) starts the
replacement inside the 10 ms clock tick of the kill: the reporter's start line carries
the process start time, floored to a tick, so it could predate the kill and the drill
would take the replacement for a late line of the old incarnation.

Extra knobs for the tests: ``--spawn-grandchild`` makes every worker start a sleeping
child (a DataLoader-like subprocess that must be cleaned up too); ``--secret-env NAME``
makes rank 0 print that variable's *name* (never its value) so secrecy can be checked;
``--orphan-on-term`` and ``--die-mid-restart`` make an agent that leaves a worker behind
in a session of its own that the drill has never seen, ``--stop-mid-restart`` one that
freezes mid-restart (see their help).

For the fault rows (test_faults_local.py), ``--signal-log DIR`` makes every process write
its own account to ``DIR/<pid>.jsonl``, one JSON object a line: a worker its start (pid,
psutil start time, rank, restart), its first step, and every SIGTERM and SIGCONT it
receives *with the sender's pid* (a thread takes them with ``sigwaitinfo``); the agent how
each worker ended (its exit status, and whether the agent itself SIGKILLed it). SIGKILL and
SIGSTOP cannot be caught, so a SIGKILL from outside is what the agent sees as ``-9`` it
did not send. ``--on-sigterm`` says what a worker does with SIGTERM (``die``: the default
action; ``exit``: exit 143 at once, like a job that stops cleanly; ``ignore``: train on);
``--hang-timeout S`` makes the agent treat a worker stopped for S seconds as hung and tear
the group down, as a collective timeout makes torchrun do.

Usage: ``python standin_job.py --nproc 2 --ckpt DIR/ckpt [--max-restarts 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

RENDEZVOUS_CEILING = 10.0  # seconds a worker waits for its node's peers at start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--node-rank", type=int, default=0, help="RANK = node rank * nproc + local")
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--step-time", type=float, default=0.01)
    parser.add_argument("--resume", choices=["latest", "zero"], default="latest")
    parser.add_argument(
        "--resume-pause",
        type=float,
        default=0.0,
        help="after checkpoint_loaded, wait this long before the first step",
    )
    parser.add_argument(
        "--restart-delay",
        type=float,
        default=0.1,
        help="seconds between a failed group and the next one",
    )
    parser.add_argument("--spawn-grandchild", action="store_true")
    parser.add_argument(
        "--orphan-on-term",
        action="store_true",
        help="on SIGTERM, start one more worker in its own session and exit "
        "without stopping anything (an agent caught mid-restart)",
    )
    parser.add_argument(
        "--die-mid-restart",
        action="store_true",
        help="on the first restart, start the new group's workers, then "
        "SIGKILL the agent itself before it records or stops anything",
    )
    parser.add_argument(
        "--stop-mid-restart",
        action="store_true",
        help="on the first restart, start the new group's workers, then "
        "SIGSTOP the agent itself (a debugger, a frozen node, ^Z)",
    )
    parser.add_argument("--signal-log", type=Path, default=None)
    parser.add_argument("--on-sigterm", choices=["die", "exit", "ignore"], default="die")
    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=0.0,
        help="seconds a worker may stay stopped (state T) before the group is torn down",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=5.0,
        help="seconds the agent waits after SIGTERM to a worker before it SIGKILLs it",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def record(folder: Path | None, **fields: object) -> None:
    """One line of this process's own account (one write: lines never interleave)."""
    if folder is None:
        return
    line = json.dumps({"pid": os.getpid(), "t": time.time(), **fields}) + "\n"
    fd = os.open(folder / f"{os.getpid()}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def start_time(pid: int) -> float:
    """The process's start time as psutil has it (for the test's own accounting; the local
    backend's identity reads it from the start since boot, ``processes.start_time``)."""
    import psutil

    return float(psutil.Process(pid).create_time())


def take_signals(args: argparse.Namespace) -> None:
    """Record every SIGTERM and SIGCONT with its sender; act on SIGTERM per --on-sigterm.

    Both are blocked in every thread (the mask is set before this thread starts), so
    they reach this thread's ``sigwaitinfo`` only. A blocked SIGCONT still continues a
    stopped process: the kernel does that when it is sent.
    """
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM, signal.SIGCONT})
        name = signal.Signals(info.si_signo).name
        record(args.signal_log, event="signal", signal=name, sender=info.si_pid)
        if info.si_signo == signal.SIGTERM and args.on_sigterm == "exit":
            os._exit(143)
        if info.si_signo == signal.SIGTERM and args.on_sigterm == "die":
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)


def rendezvous(args: argparse.Namespace, rank: int) -> None:
    """Wait (at most RENDEZVOUS_CEILING s) until every worker of this restart on this node
    is up, before anyone reads the checkpoint: a real group's rendezvous. Without it, a
    rank that starts late on a loaded machine loads a checkpoint its faster peer wrote
    after the restart."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    base = rank - local
    folder = args.ckpt.parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f".up-{restart}-{rank}").touch()
    deadline = time.monotonic() + RENDEZVOUS_CEILING
    peers = [folder / f".up-{restart}-{base + r}" for r in range(args.nproc)]
    while not all(p.exists() for p in peers) and time.monotonic() < deadline:
        time.sleep(0.005)


def worker(args: argparse.Namespace) -> int:
    from recoverygate import reporter

    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # inherited from the agent
    rank = int(os.environ["RANK"])
    if args.signal_log is not None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGCONT})
        threading.Thread(target=take_signals, args=(args,), daemon=True).start()
        record(
            args.signal_log,
            event="start",
            create_time=start_time(os.getpid()),
            rank=rank,
            restart=int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
        )
    if args.spawn_grandchild:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    rendezvous(args, rank)
    step = 0
    if args.resume == "latest" and args.ckpt.exists():
        step = int(args.ckpt.read_text() or 0)
        if step:
            reporter.checkpoint_loaded(step)
            if args.resume_pause:  # loaded, then a slow first step: a visible VERIFYING
                time.sleep(args.resume_pause)
    first = True
    while True:
        step += 1
        time.sleep(args.step_time)
        reporter.progress(step)
        if first:
            first = False
            record(args.signal_log, event="first-step", step=step)
        if step % args.ckpt_every == 0 and int(os.environ.get("LOCAL_RANK", rank)) == 0:
            tmp = args.ckpt.with_suffix(".tmp")
            tmp.write_text(str(step))
            tmp.replace(args.ckpt)
            reporter.checkpoint_completed(step)


def agent(args: argparse.Namespace) -> int:
    procs: list[subprocess.Popen[bytes]] = []
    started: dict[int, float] = {}
    recorded: set[int] = set()
    killed_by_me: set[int] = set()

    def note_exits() -> None:
        for proc in procs:
            if proc.returncode is not None and proc.pid not in recorded:
                recorded.add(proc.pid)
                record(
                    args.signal_log,
                    event="worker-exit",
                    worker=proc.pid,
                    create_time=started.get(proc.pid),
                    returncode=proc.returncode,
                    killed_by_agent=proc.pid in killed_by_me,
                )

    def stop_workers(sig: int = signal.SIGTERM) -> None:
        note_exits()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(sig)
        for proc in procs:
            try:
                proc.wait(timeout=args.stop_timeout)
            except subprocess.TimeoutExpired:
                killed_by_me.add(proc.pid)
                proc.kill()
                proc.wait()
        note_exits()

    stopped_since: dict[int, float] = {}

    def hung() -> bool:
        """A worker stopped (state T) for longer than --hang-timeout."""
        if not args.hang_timeout:
            return False
        now = time.monotonic()
        for proc in procs:
            try:
                state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("T", "t"):
                stopped_since.pop(proc.pid, None)
            elif now - stopped_since.setdefault(proc.pid, now) > args.hang_timeout:
                print(f"[standin-agent] worker pid {proc.pid} hung", flush=True)
                return True
        return False

    def on_term(signum: int, frame: object) -> None:
        if args.orphan_on_term:
            subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(3600)"],
                env=dict(os.environ, RANK="0"),
                start_new_session=True,
            )
            os._exit(143)
        stop_workers()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    for restart in range(args.max_restarts + 1):
        procs = []
        for rank in range(args.nproc):
            env = dict(
                os.environ,
                RANK=str(args.node_rank * args.nproc + rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(args.nproc),
                LOCAL_WORLD_SIZE=str(args.nproc),
                TORCHELASTIC_RESTART_COUNT=str(restart),
            )
            # SIGTERM waits until the new worker is on the list it stops (a well-behaved
            # agent; see test_cleanup_local's orphan test for one that is not).
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            procs.append(
                subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--worker", *sys.argv[1:]],
                    env=env,
                    start_new_session=True,
                )
            )
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            if args.signal_log is not None:
                with contextlib.suppress(Exception):
                    started[procs[-1].pid] = start_time(procs[-1].pid)
        if restart and args.die_mid_restart:
            # The new workers are up, in sessions of their own, when the agent dies: a scan
            # of the agent's tree sees them only in the few ms it took to start them.
            os.kill(os.getpid(), signal.SIGKILL)
        if restart and args.stop_mid_restart:
            os.kill(os.getpid(), signal.SIGSTOP)
        while all(proc.poll() is None for proc in procs) and not hung():
            time.sleep(0.02)
        stop_workers()
        print(f"[standin-agent] worker group failed (restart {restart})", flush=True)
        time.sleep(args.restart_delay)
    print("[standin-agent] no restarts left; exiting", flush=True)
    return 1


def main() -> int:
    args = parse_args()
    return worker(args) if args.worker else agent(args)


if __name__ == "__main__":
    sys.exit(main())
