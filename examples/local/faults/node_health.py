"""A lemon-node health check in front of a training script, for the StickyFault
``scope: node`` examples (node-bad-excluded.yaml, node-bad-rejoins.yaml).

Run by torchrun in place of the training script (standard library only: it runs before
torch is imported, so before a bad node's ``after`` runs out)::

    torchrun ... node_health.py --leave-after=2 --state-dir={nodeDir} -- ../train.py ARGS

Each worker that starts on a node first reads the last word of the worker before it on
that node (per local rank, in ``--state-dir``). A predecessor that left none vanished by a
signal it could not catch (SIGKILL: a lost GPU, an Xid, the OOM killer; here the drill's
bad node): a strike against the node. At ``--leave-after`` strikes (0: never) the worker
takes its node out of the job: it stops its node's torchrun agent (its parent) with
SIGTERM and waits for the agent to end it. torchrun leaves the rendezvous open for the
other nodes only when its agent ends by a signal; an agent that gives up on its own after
``--max-restarts`` closes the rendezvous, and the whole job ends with it (docs/faults.md).
Otherwise the worker records itself as running and runs the training script in this very
process (runpy), leaving its last word on every orderly way out: a normal end, an
exception, SIGTERM from its agent.

With ``RECOVERYGATE_GROUND_TRUTH=<base>`` each worker appends JSON lines to
``<base>.node.<host>.<pid>.jsonl``: ``started`` (host, rank, world size, restart count,
strikes), then ``left`` (it took its node out) or ``ended`` (an orderly end): the job's
own record of every placement on every node.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import runpy
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

LEAVE_WAIT = 60.0  # seconds a leaving worker waits for its agent to end it


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: node_health.py [--leave-after N] --state-dir DIR -- SCRIPT ARGS")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leave-after", type=int, default=0, help="strikes to leave (0: never)")
    parser.add_argument("--state-dir", required=True, help="this node's own folder ({nodeDir})")
    return parser.parse_args(argv[:split]), argv[split + 1 :]


class Truth:
    """The job's own record of this placement (``RECOVERYGATE_GROUND_TRUTH``)."""

    def __init__(self) -> None:
        base = os.environ.get("RECOVERYGATE_GROUND_TRUTH")
        host = socket.gethostname()
        self.path = Path(f"{base}.node.{host}.{os.getpid()}.jsonl") if base else None
        self.fields = {
            "host": host,
            "pid": os.getpid(),
            "rank": int(os.environ.get("RANK", "-1")),
            "world": int(os.environ.get("WORLD_SIZE", "0")),
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        }

    def record(self, event: str, **more: Any) -> None:
        if self.path is None:
            return
        row = {"t": round(time.time(), 6), "event": event, **self.fields, **more}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row, separators=(",", ":")) + "\n")


class NodeState:
    """This local rank's state on this node: who runs now, and the node's strikes."""

    def __init__(self, folder: str) -> None:
        self.path = Path(folder) / f"health-{os.environ.get('LOCAL_RANK', '0')}.json"

    def read(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {"running": None, "strikes": 0}
        return state

    def write(self, running: int | None, strikes: int) -> None:
        draft = self.path.with_suffix(f".{os.getpid()}.tmp")
        draft.write_text(json.dumps({"running": running, "strikes": strikes}), encoding="utf-8")
        os.replace(draft, self.path)  # a reader sees the old state or the new one


def leave(truth: Truth, strikes: int) -> None:
    """Take this node out of the job: SIGTERM to its agent, then wait to be ended."""
    truth.record("left", strikes=strikes)
    print(
        f"node_health: {strikes} worker(s) of this node vanished without a word; taking "
        f"node {socket.gethostname()} out of the job (SIGTERM to its agent)",
        flush=True,
    )
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(LEAVE_WAIT)
    raise SystemExit(1)


def main(argv: list[str]) -> None:
    args, script = parse_args(argv)
    truth, state = Truth(), NodeState(args.state_dir)
    before = state.read()
    strikes = int(before.get("strikes", 0)) + (before.get("running") is not None)
    truth.record("started", strikes=strikes)

    def last_word(*_: object) -> None:
        state.write(None, strikes)
        truth.record("ended")

    if args.leave_after and strikes >= args.leave_after:
        state.write(None, strikes)
        signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
        leave(truth, strikes)
    state.write(os.getpid(), strikes)
    atexit.register(last_word)

    def terminated(*_: object) -> None:
        last_word()
        os._exit(143)

    signal.signal(signal.SIGTERM, terminated)
    sys.argv = script
    sys.path[0] = str(Path(script[0]).resolve().parent)
    runpy.run_path(script[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
