"""A small but real distributed training job for RecoveryGate's local drills.

Run it under torchrun (2 ranks, gloo on CPU)::

    torchrun --standalone --nproc-per-node=2 --max-restarts=3 train.py --ckpt-dir=./checkpoints

What it does, and why each piece is here:

- DDP over gloo on a tiny regression model with synthetic data that is a pure function
  of the step number, so a resumed run computes exactly what an uninterrupted one would.
- Rank 0 saves a checkpoint every ``--ckpt-every`` steps: write a temporary file, fsync,
  then ``os.replace`` it into place — a reader sees the old checkpoint or the new one,
  never half of one.
- At start every rank loads the latest checkpoint (``--resume latest``), so a worker
  group restarted by torchrun continues where it stopped. ``--resume previous`` and
  ``--resume none`` are deliberate bugs for drills that must FAIL (a resume that picks
  the wrong checkpoint, a resume path that never loads).
- ``--ckpt-dir`` may contain ``{tmpdir}`` (the process's temporary directory) and
  ``{pid}``: ``{tmpdir}/checkpoints-{pid}`` is per-process storage, the classic
  node-local-checkpoint bug — a restarted worker has a new pid and finds nothing.
- The reporter lines (``checkpoint_loaded``, ``progress``, ``checkpoint_started``,
  ``checkpoint_completed``) are how RecoveryGate sees training from the outside; the
  checkpoint lines carry a state digest (model, optimizer, LR scheduler, RNG) so a drill
  with ``stateDigestMatches: true`` proves the resumed job holds the state that was saved.
  ``--restore no-optimizer`` and ``--restore no-scheduler`` are the broken twins: the
  step and the weights come back, the optimizer moments or the LR schedule do not.
- ``--stage-dir`` copies the checkpoint to a per-rank staging folder before loading it
  (as a job copies it from an object store to local disk) and reports
  ``checkpoint_load_started`` first; ``--stage-mode direct`` is the KillDuringRecovery twin:
  a copy cut by a kill is reused by every later restart, which crashes on it.
- ``--save-mode direct`` is the torn-checkpoint twin: ``torch.save`` straight to the final
  path and a ``latest`` pointer written before the file is complete, so a kill during the
  save leaves a partial checkpoint that the restart then loads.
- torchrun's shared rendezvous TCP store keeps the previous attempt's keys; a restarted
  group can read the dead rank's old gloo address and hang or fail again (pytorch issue
  135712). The script gives every restart attempt its own key prefix (``--store-prefix
  attempt``, the default); ``--store-prefix none`` keeps torchrun's default to show the bug.
- With ``RECOVERYGATE_GROUND_TRUTH=<path>`` every rank appends one JSON record per step
  to ``<path>.<rank>.<pid>.jsonl`` (flushed each step; ``.<pid>.<n>.jsonl`` when a
  container's restart brings a pid back): the ground truth that measures how accurately
  a drill reports recovery time and lost steps.
- ``--save-seconds`` and ``--stage-seconds`` spread a save's (or a staged load's) writes
  over that long, as a big model on slow storage takes: a save a drill can cut. With
  ``RG_TEST_HOLD=<file>`` (the suite's barrier, tests/patience.py) the save or staged
  load named in the file parks after its first write while the file exists: a drill test
  aims its kill into it with no time window to hit.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
from recoverygate import reporter
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT_NAME = re.compile(r"^step-(\d{8})\.pt$")
KEEP_CHECKPOINTS = 3
FEATURES = 16
#: The test suite's barrier (see :func:`hold`): the file's path.
HOLD_ENV = "RG_TEST_HOLD"
#: The pieces a paced or held write goes out in.
PIECES = 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="train this many steps")
    parser.add_argument(
        "--ckpt-every",
        type=int,
        default=int(os.environ.get("CKPT_EVERY", "20")),
        help="checkpoint every N steps (env CKPT_EVERY)",
    )
    parser.add_argument(
        "--ckpt-dir",
        default="./checkpoints",
        help="checkpoint folder, relative to the working directory; {tmpdir} and {pid} expand",
    )
    parser.add_argument("--step-time", type=float, default=0.02, help="seconds of sleep per step")
    parser.add_argument(
        "--resume",
        choices=("latest", "previous", "none"),
        default="latest",
        help="which checkpoint to resume from (previous and none are deliberate bugs)",
    )
    parser.add_argument(
        "--store-prefix",
        choices=("attempt", "none"),
        default="attempt",
        help="give each restart attempt its own rendezvous key prefix (none shows the bug)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="gloo timeout in seconds")
    parser.add_argument(
        "--restore",
        choices=("all", "no-optimizer", "no-scheduler"),
        default="all",
        help="what a resume restores (the last two are deliberate bugs)",
    )
    parser.add_argument(
        "--save-mode",
        choices=("atomic", "direct"),
        default="atomic",
        help="atomic: temp file, fsync, rename; direct: torch.save to the final path (a bug)",
    )
    parser.add_argument(
        "--save-pad",
        type=int,
        default=0,
        help="extra bytes written into each checkpoint (makes saves slow enough to tear)",
    )
    parser.add_argument(
        "--save-seconds",
        type=float,
        default=0.0,
        help="spread each save's writes over this long (slow storage: a save a drill can cut)",
    )
    parser.add_argument(
        "--stage-seconds",
        type=float,
        default=0.0,
        help="spread each staged copy (--stage-dir) over this long (a slow download)",
    )
    parser.add_argument(
        "--save-on-sigterm",
        action="store_true",
        help="on SIGTERM, finish the current step, save a checkpoint and exit 0",
    )
    parser.add_argument(
        "--stage-dir",
        default=None,
        help="copy the checkpoint into this folder (+ /rank-R) before loading it; {tmpdir} expands",
    )
    parser.add_argument(
        "--stage-mode",
        choices=("atomic", "direct"),
        default="atomic",
        help="atomic: a temporary name, then rename; direct: the final name (a bug)",
    )
    parser.add_argument(
        "--shards",
        action="store_true",
        help="every rank saves its own shard under --ckpt-dir/rank-R and a resume loads the "
        "newest step every rank holds (node-local storage loses a replaced node's shards)",
    )
    return parser.parse_args(argv)


def checkpoint_dir(template: str) -> Path:
    """Expand ``{tmpdir}`` and ``{pid}`` so the broken twin can ask for per-process storage."""
    return Path(template.format(tmpdir=tempfile.gettempdir(), pid=os.getpid()))


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """Completed checkpoints, oldest first (temporary files never match the name).

    With a ``latest`` pointer (the direct-save twin writes one), the pointer decides.
    """
    if not folder.is_dir():
        return []
    pointer = folder / "latest"
    if pointer.exists():
        named = folder / pointer.read_text().strip()
        match = CHECKPOINT_NAME.match(named.name)
        if match and named.exists():
            return [(int(match.group(1)), named)]
    found = []
    for path in folder.iterdir():
        match = CHECKPOINT_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def training_state(
    step: int, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any, pad: int = 0
) -> dict[str, Any]:
    """Everything a resume must restore: weights, optimizer moments, LR schedule, RNG."""
    state: dict[str, Any] = {
        "step": step,
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "sched": sched.state_dict(),
        "rng": torch.get_rng_state(),
    }
    if pad:
        state["pad"] = torch.zeros(pad, dtype=torch.uint8)
    return state


def state_digest(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any) -> Any:
    """The state's fingerprint by part, as the drill compares it (saved vs loaded)."""
    return reporter.state_digest(
        {"model": model, "optimizer": opt, "scheduler": sched, "rng": torch.get_rng_state()},
        parts=True,
    )


def hold(what: str, step: int, started: Callable[[], None] | None = None) -> None:
    """The suite's barrier: with ``RG_TEST_HOLD=<file>`` and the file reading ``save N``
    (or ``load N``), the save (the staged load) of a step at or past N parks here, after
    its first write, for as long as the file exists; ``<file>.parked.<pid>`` says which
    process parked. A drill test aims its kill into that save this way and removes the
    file once the parked process is gone. Without the variable or the file: nothing.

    ``started`` (the save's or load's line) is called here: once the process has parked
    when it parks, so that a kill answering the line always finds it parked (called
    before, a kill on a busy machine landed before the first write: nothing parked, no
    partial copy, and the drill was not the one the test is about)."""
    path = os.environ.get(HOLD_ENV)
    try:
        kind, _, at = Path(path).read_text().strip().partition(" ") if path else ("", "", "0")
    except OSError:
        kind, at = "", "0"
    if not path or kind != what or step < int(at):
        if started is not None:
            started()
        return
    Path(f"{path}.parked.{os.getpid()}").write_text(f"{what} {step}\n")
    if started is not None:
        started()
    while os.path.exists(path):
        time.sleep(0.05)


def write_paced(
    handle: IO[bytes],
    data: bytes,
    what: str,
    step: int,
    seconds: float,
    started: Callable[[], None] | None = None,
) -> None:
    """``data`` into ``handle`` in :data:`PIECES` pieces spread over ``seconds``; the hold
    (:func:`hold`) and ``started`` after the first piece."""
    size = max(-(-len(data) // PIECES), 1)
    for index, at in enumerate(range(0, max(len(data), 1), size)):
        handle.write(data[at : at + size])
        handle.flush()
        if index == 0:
            hold(what, step, started)
        if seconds > 0:
            time.sleep(seconds / PIECES)


def write_state(
    handle: IO[bytes],
    state: dict[str, Any],
    step: int,
    seconds: float,
    started: Callable[[], None] | None = None,
) -> None:
    """``torch.save`` into ``handle``: at once, or paced and held (see :func:`write_paced`);
    ``started`` as the first write begins (paced: once the first piece is written)."""
    if seconds <= 0 and not os.environ.get(HOLD_ENV):
        if started is not None:
            started()
        torch.save(state, handle)
        return
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_paced(handle, buffer.getvalue(), "save", step, seconds, started)


def save_checkpoint(
    folder: Path,
    step: int,
    state: dict[str, Any],
    mode: str,
    started: Callable[[], None] | None = None,
    seconds: float = 0.0,
) -> None:
    """atomic: temp file, fsync, rename (a reader never sees a partial file).

    direct: the bug this example's torn-checkpoint twin shows — a ``latest`` pointer moved
    first and ``torch.save`` straight to the final path, so a kill mid-save leaves a
    partial file that the restart loads.

    ``started`` is called as the save's first write begins (see :func:`write_state`): in
    direct mode once the pointer has moved, so a kill that answers the
    ``checkpoint_started`` line always finds it moved (a kill that landed before it found
    step 40 still named, a correct resume, and a full CI run's broken twin passed).
    """
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step-{step:08d}.pt"
    if mode == "direct":
        (folder / "latest").write_text(final.name)
        with open(final, "wb") as handle:
            write_state(handle, state, step, seconds, started)
        return
    tmp = folder / f".step-{step:08d}.pt.tmp-{os.getpid()}"
    with open(tmp, "wb") as handle:
        write_state(handle, state, step, seconds, started)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, final)
    for _, old in list_checkpoints(folder)[:-KEEP_CHECKPOINTS]:
        old.unlink(missing_ok=True)


def load_shard(folder: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any) -> int:
    """Sharded resume: the newest step whose shard every rank holds (0: none)."""
    found = dict(list_checkpoints(folder))
    newest = torch.tensor([max(found, default=0)], dtype=torch.int64)
    dist.all_reduce(newest, op=dist.ReduceOp.MIN)
    step = int(newest.item())
    if step and step in found:
        state = torch.load(found[step], map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
    return step if step in found else 0


def save_shard(
    folder: Path,
    step: int,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    rank: int,
) -> None:
    """Every rank saves its shard; rank 0 reports the checkpoint once all are durable."""
    digest = state_digest(model, opt, sched)
    if rank == 0:
        reporter.checkpoint_started(step)
    save_checkpoint(folder, step, training_state(step, model, opt, sched), "atomic")
    done = torch.tensor([1], dtype=torch.int64)
    dist.all_reduce(done)  # every shard of this step is on disk
    if rank == 0:
        reporter.checkpoint_completed(step, digest=digest)


def load_checkpoint(
    folder: Path,
    which: str,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    restore: str = "all",
    stage: Path | None = None,
    stage_mode: str = "atomic",
    stage_seconds: float = 0.0,
) -> int:
    """Load the chosen checkpoint and return its step (0: start from scratch); with
    ``stage``, from a copy staged there first (see :func:`staged`)."""
    if which == "none":
        return 0
    found = list_checkpoints(folder)
    index = -1 if which == "latest" else -2
    if len(found) < -index:
        return 0
    step, path = found[index]

    def started() -> None:
        reporter.checkpoint_load_started(step)

    if stage is None:
        started()
    else:
        path = staged(path, stage, stage_mode, step, stage_seconds, started)
    state = torch.load(path, map_location="cpu")
    model.load_state_dict(state["model"])
    if restore != "no-optimizer":  # the bug: an optimizer re-created, its moments lost
        opt.load_state_dict(state["opt"])
    if restore != "no-scheduler" and "sched" in state:  # the bug: the schedule starts over
        sched.load_state_dict(state["sched"])
    if "rng" in state:
        torch.set_rng_state(state["rng"])
    return int(state["step"])


def staged(
    path: Path,
    stage: Path,
    mode: str,
    step: int = 0,
    seconds: float = 0.0,
    started: Callable[[], None] | None = None,
) -> Path:
    """The checkpoint copied to this rank's staging folder first (as a job copies it from
    an object store to local disk), reused when already there; ``started`` (the load's
    line) as the copy's first write begins (paced: once its first piece is written and,
    under the suite's hold, parked), or before a staged copy is reused.

    atomic: copied to a temporary name, then renamed: a copy cut by a kill is never taken
    for a staged checkpoint. direct: the bug this example's KillDuringRecovery twin shows:
    copied straight to its final name and reused without a check, so a restart killed
    while staging leaves a partial copy that every later restart loads and crashes on.
    """
    stage.mkdir(parents=True, exist_ok=True)
    final = stage / path.name
    if final.exists():
        if started is not None:
            started()
        return final
    target = final if mode == "direct" else stage / f".{path.name}.part-{os.getpid()}"
    if seconds > 0 or os.environ.get(HOLD_ENV):
        with open(target, "wb") as dst:
            write_paced(dst, path.read_bytes(), "load", step, seconds, started)
    else:
        if started is not None:
            started()
        with open(path, "rb") as src, open(target, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                time.sleep(0.005)  # a download from an object store takes its time
    if target != final:
        os.replace(target, final)
    return final


def init_distributed(store_prefix: str, timeout: float) -> None:
    """Join the process group; with ``attempt`` each restart gets fresh rendezvous keys.

    torchrun (c10d rendezvous) shares its own TCP store with the workers
    (TORCHELASTIC_USE_AGENT_STORE=True) and keeps it across restarts, so the keys gloo
    writes (every rank's address) survive the group they belonged to. A per-attempt
    PrefixStore keeps each attempt's keys apart. Setting TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    in torchrun's environment is the other fix (a new store per rendezvous round).
    """
    pg_timeout = datetime.timedelta(seconds=timeout)
    shared_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if store_prefix == "none" or not shared_store:
        dist.init_process_group("gloo", timeout=pg_timeout)
        return
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(  # type: ignore[attr-defined]
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=pg_timeout,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"train-attempt-{attempt}/"
    prefixed = dist.PrefixStore(prefix, store)  # type: ignore[attr-defined]
    dist.init_process_group(
        "gloo", store=prefixed, rank=rank, world_size=world_size, timeout=pg_timeout
    )


def install_sigterm_handler() -> threading.Event:
    """SIGTERM sets a flag; the loop finishes its step, saves and exits (a graceful job)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    return stop


def preempted(stop: threading.Event) -> bool:
    """Whether any rank got SIGTERM (agreed by all ranks, so rank 0 saves for a peer)."""
    flag = torch.tensor([1 if stop.is_set() else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def open_truth_file(base: str, rank: int) -> IO[str]:
    """``<base>.<rank>.<pid>.jsonl``, a file of this process alone: in a container every
    restart starts in a new pid namespace, so a pid comes back (the kubelet's restart of
    a pod's container runs the worker as the same pid): then ``.<pid>.<n>.jsonl``."""
    for n in range(1000):
        suffix = f".{n}" if n else ""
        try:
            return open(f"{base}.{rank}.{os.getpid()}{suffix}.jsonl", "x", encoding="utf-8")
        except FileExistsError:
            continue
    raise RuntimeError(f"no free ground-truth file name for {base}.{rank}.{os.getpid()}")


class GroundTruth:
    """Per-step records of what really happened, written by every rank for accuracy checks."""

    def __init__(self, base: str | None, rank: int) -> None:
        self._restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self._rank = rank
        self._handle: IO[str] | None = None
        if base:  # kept open for the whole run: one record per step must stay cheap
            self._handle = open_truth_file(base, rank)

    def record(self, event: str, step: int) -> None:
        if self._handle is None:
            return
        row: dict[str, Any] = {
            "t": round(time.time(), 6),
            "rank": self._rank,
            "pid": os.getpid(),
            "restart": self._restart,
            "step": step,
            "event": event,
        }
        self._handle.write(json.dumps(row, separators=(",", ":")) + "\n")
        self._handle.flush()


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data, a pure function of (step, rank): a resumed run sees the same batches."""
    generator = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(32, FEATURES, generator=generator)
    true_w = torch.arange(FEATURES, dtype=torch.float32) / FEATURES
    y = (x @ true_w).unsqueeze(1) + 0.01 * torch.randn(32, 1, generator=generator)
    return x, y


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    init_distributed(args.store_prefix, args.timeout)
    rank = dist.get_rank()
    truth = GroundTruth(os.environ.get("RECOVERYGATE_GROUND_TRUTH"), rank)
    truth.record("start", 0)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
    folder = checkpoint_dir(args.ckpt_dir)
    stop = install_sigterm_handler() if args.save_on_sigterm else None
    if args.shards:
        folder = folder / f"rank-{rank}"
        step = load_shard(folder, model, opt, sched)
    else:
        stage = checkpoint_dir(args.stage_dir) / f"rank-{rank}" if args.stage_dir else None
        loaded = load_checkpoint(
            folder,
            args.resume,
            model,
            opt,
            sched,
            args.restore,
            stage,
            args.stage_mode,
            args.stage_seconds,
        )
        # Every rank must run the same steps; rank 0's checkpoint is the authority.
        start = torch.tensor([loaded], dtype=torch.int64)
        dist.broadcast(start, src=0)
        step = int(start.item())
    # Ground truth first: the drill may end the job as soon as it reads the reporter's line.
    truth.record("loaded", step)
    if step:
        reporter.checkpoint_loaded(step, digest=state_digest(model, opt, sched))
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters

    loss_fn = torch.nn.MSELoss()
    while step < args.steps:
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        truth.record("step", step)
        reporter.progress(step)
        stopping = stop is not None and preempted(stop)
        if args.shards and step % args.ckpt_every == 0:
            save_shard(folder, step, model, opt, sched, rank)
        elif rank == 0 and (step % args.ckpt_every == 0 or stopping):
            digest = state_digest(model, opt, sched)
            state = training_state(step, model, opt, sched, args.save_pad)

            def started(step: int = step) -> None:
                truth.record("save_started", step)
                reporter.checkpoint_started(step)

            save_checkpoint(folder, step, state, args.save_mode, started, args.save_seconds)
            del state
            truth.record("checkpoint", step)
            reporter.checkpoint_completed(step, digest=digest)
        if stopping:
            truth.record("exit", step)
            # Saved on SIGTERM. Exit non-zero: torchrun restarts a group with a failed
            # worker, but a group whose workers all exit 0 counts as finished (see README).
            os._exit(143)
        if args.step_time > 0:
            time.sleep(args.step_time)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
