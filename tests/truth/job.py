"""A torch-free training job with one switch per recovery behaviour, for the truth corpus.

Launched under real torchrun, like any job a drill judges::

    torchrun --standalone --nproc-per-node=2 --max-restarts=3 tests/truth/job.py \\
        --ckpt-dir=/some/shared/folder [switches]

Standard library only (plus ``from recoverygate import reporter``), so a worker starts in
milliseconds and a drill costs a few seconds. The ranks never talk to each other (no
collectives): when rank 1 is killed, rank 0 keeps stepping until torchrun tears the group
down — a survivor that prints after the kill, as on a real cluster.

A step is ``--step-time`` seconds of "work" (a wait that torchrun's SIGTERM interrupts).
Rank 0 writes a checkpoint every ``--ckpt-every`` steps to the shared ``--ckpt-dir``,
atomically (temporary file, fsync, ``os.replace``, fsync of the folder), as JSON::

    {"step": <steps completed>, "epoch": <index of the last epoch finished>, ...}

and every rank resumes from the newest one. The reporter calls follow the step contract
(DESIGN.md): ``progress(n)`` after the n-th step, ``checkpoint_completed(n)`` once the
durable file holds the state after n steps, ``checkpoint_loaded(n)`` once the resumed
process holds it.

Ground truth: with ``RECOVERYGATE_GROUND_TRUTH=<base>`` every process appends JSON lines
to ``<base>.<rank>.<pid>.jsonl``, flushed per line, *before* the matching reporter call
(the drill may end the job as soon as it reads the reporter's line)::

    {"t": 1764416834.101544, "rank": 0, "pid": 4242, "restart": 1, "event": "step",
     "step": 21, "reported": true, "label": 21}

``event`` is ``start``, ``loaded``, ``step``, ``checkpoint`` or ``exit``; ``step`` is always
in true units (steps completed, whatever the job reports); ``label`` is the number the job
passed (or would have passed) to the reporter; ``reported`` says whether the reporter
call was made. Every completed step is recorded, reported or not. Checkpoint records carry
``kind`` (``regular``, ``async``, ``survivor``); exit records carry ``code`` and ``why``.

The switches, each one deliberate behaviour (the defaults are a correct job):

``--resume none``
    never loads: every restart trains from scratch.
``--die-after-load R``
    on restart R every rank loads the checkpoint (rank 0 reports ``checkpoint_loaded``),
    then the job "finds" the loaded state invalid (think: a post-load validation such as
    a shape or config check fails). Rank 0 quarantines the checkpoint folder — renames it
    to ``<ckpt-dir>.quarantine-r<R>`` — and every rank exits 1 before any step. The next
    restart finds no checkpoint and starts from step 1. Auto-quarantining a checkpoint
    that fails validation is a real pattern; here it turns one bad load into a silent
    restart from scratch.
``--reset-counter``
    loads checkpoint n and reports ``checkpoint_loaded(n)``, then counts from step 1
    again (a step counter or data loader that is not restored: the data is replayed).
``--progress-every K``
    calls ``progress`` only every K-th step (sparse progress; keep ``--ckpt-every`` a
    multiple of K).
``--zero-based``
    an epoch loop that reports the index of the epoch it just finished: ``progress(0)``
    after the first one (``progress(epoch)`` instead of ``progress(epoch + 1)``), and
    checkpoints and loads labelled the same way. Resumes correctly; only the labels break
    the contract.
``--off-by-one``
    an epoch loop that stores the index of the epoch just finished and resumes with
    ``range(stored, ...)``: it redoes one epoch on every restart. Its reports are right
    (``checkpoint_completed(epochs_done)``, ``checkpoint_loaded(epochs_done)``).
``--async-lag M``
    asynchronous checkpoints: the state of step n is snapshotted at step n and becomes
    durable (file written, ``checkpoint_completed(n)`` reported) M steps later.
``--steps S`` / ``--final-phase SECONDS``
    train S steps (a final checkpoint is always saved at step S), then spend SECONDS in
    a post-training phase (evaluation, export) and exit 0. The final phase keeps the
    first incarnation alive after its last checkpoint so a drill triggered on it can
    kill rank 1; a restarted job that loads the final checkpoint has nothing left to
    train, runs the final phase again and exits 0 — it finishes right after resuming.
``--first-ckpt-at-1``
    also checkpoint after step 1, so a checkpoint exists from the very first step.
``--survivor-ckpt printed|silent``
    rank 0 watches the other ranks of its restart (their pid files in the checkpoint
    folder, ``/proc/<pid>/stat``): when one is gone, or when torchrun's SIGTERM arrives,
    whichever comes first, it finishes the step in flight, writes an emergency
    checkpoint of it and stops training until it is torn down. ``printed`` reports
    ``checkpoint_completed`` for it; ``silent`` writes the file but never prints the line
    (the line a torn-down process never got out). The replacement loads that newest
    checkpoint like any other.
``--loaded no``
    never calls ``checkpoint_loaded`` (the drill must infer the resume step from progress).
``--term-grace SECONDS``
    on SIGTERM keep training (and reporting) for this long before exiting — a job that
    drains in-flight work on shutdown. Default 0: exit at once.

Everyday patterns (the verdict's second pass):

``--progress-style first-then-every``
    the logging idiom ``if step == start + 1 or step % K == 0``: the first step after a
    start, then every K-th (K = ``--progress-every``).
``--progress-style thread``
    a metrics thread reports the completed count every ``--thread-interval`` seconds,
    and once at start, before the first step (a line of the state the process holds);
    the training loop itself never calls ``progress``. Thread reports are recorded as
    ``report`` records.
``--thread-before-load SECONDS``
    with ``--progress-style thread``: the metrics thread starts before the resume (it
    ticks the counter's initial 0 meanwhile), and loading a checkpoint takes SECONDS.
``--warmup-subprocess``
    before training, every worker runs a warm-up subprocess (it inherits ``RANK``) that
    reports five progress steps of its own and exits.
``--eval-after-kill``
    rank 0, once a peer is gone, starts an evaluation subprocess (it inherits ``RANK``)
    that loads the newest checkpoint, reports ``checkpoint_loaded`` and evaluation
    "progress" in a session of its own, and runs until the drill's cleanup; rank 0 goes on
    once it has reported.
``--replay-log FILE``
    the first worker of rank 0 prints FILE at start-up: an earlier run's log, reporter
    lines included (a ``tee``'d log replayed).
``--sharded``
    every rank saves its own shard (``shard-r<rank>-<step>.json``) with each checkpoint
    and reports ``checkpoint_completed`` for it; on resume every rank loads its newest
    shard and reports ``checkpoint_loaded`` (with ``--digest``, each with its shard's
    digest).
``--shard-older R``
    rank R keeps only every second shard, so it resumes from an older one than the rest.
``--lose-shard R``
    rank R keeps its shard in a per-process folder (node-local): after a restart it finds
    none, re-initialises its shard and still reports ``checkpoint_loaded`` of the
    group's step (the model checkpoint's), with the digest of the state it now holds.
``--stall-after-resume N``
    a restarted process trains N steps, then blocks (a deadlock in the resumed data
    loader) until torn down.
``--fork-writer``
    rank 0 forks a child for each checkpoint; the child writes it and reports
    ``checkpoint_completed``, then exits (fork-based snapshots).
``--loss kept|lost``
    each step has a loss, ``(x - w) ** 2``, from a fixed input ``x`` of the step and a
    state ``w`` the step then moves towards it (a one-weight model); the step's record
    carries ``loss`` (``float.hex``) and ``progress`` gets ``loss=``. ``kept``: ``w`` is
    checkpointed and restored, so a resumed run redoes the killed run's losses bit for
    bit; ``lost``: the resume does not restore it (expectations.replay, docs/replay.md).

Third pass (issue 31):

``--tick-at-start``
    a metrics thread's first tick, emulated in line: ``progress(0)`` once at process
    start, before the load (the fresh state, no step yet); recorded as a ``report``.
``--held-ticks N``
    after loading a checkpoint, the first step is slow (a warm-up) and the metrics
    thread ticks the held count N times before it: ``progress(held)`` N times, recorded
    as ``report`` records (the loop then reports every step as usual).
``--loaded-label next``
    ``checkpoint_loaded`` names the next step to run (held + 1) instead of the step the
    loaded state holds: a load line naming a step no checkpoint was reported saved at.
``--announce-scratch``
    with ``--resume none``: print nanoGPT's own start-up line, "Initializing a new model
    from scratch", on every start (``init_from='scratch'``).

Issue 41 (item 7):

``--thread-warmup SECONDS``
    with ``--progress-style thread``: the metrics thread first spends SECONDS of CPU work
    (setting itself up) before its first tick, in every process. On an idle machine it
    still ticks before the loop's first step; on a loaded one its first tick may come
    after it, in one process and not in the next (the race of issue 41, item 7).
``--late-first-tick``
    with ``--progress-style thread``: in the first run (restart 0) the metrics thread's
    first tick waits until the loop has recorded its first step; in a restarted process
    the loop's first step waits until the thread has printed its first tick (the state it
    holds). The order a loaded machine gave the issue's job, made certain.
``--heartbeat SECONDS``
    every process runs a thread that writes ``time.time()`` every SECONDS to
    ``<base>.<rank>.<pid>.beat`` (in place, one line; with ``RECOVERYGATE_GROUND_TRUTH``
    only): the moment a killed process last ran, to hold the drill's ``killTime`` to.

Signals: SIGTERM is blocked and waited for inside each step's wait
(``signal.sigtimedwait``), so a process torn down by torchrun records an ``exit`` line
(``why: "SIGTERM"``) at a step boundary and exits 143, never in the middle of a save.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from recoverygate import reporter

CHECKPOINT_NAME = re.compile(r"^ckpt-(\d{8})\.json$")
KEEP_CHECKPOINTS = 5
SIGTERM_EXIT = 128 + signal.SIGTERM
TERM_WAIT_CEILING = 120.0  # a survivor that stopped training waits this long at most
EVAL_READY_CEILING = 10.0  # the survivor waits this long at most for its evaluation to report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--ckpt-dir", required=True, type=Path, help="shared checkpoint folder")
    parser.add_argument("--ckpt-every", type=int, default=20, help="checkpoint every N steps")
    parser.add_argument("--step-time", type=float, default=0.02, help="seconds per step")
    parser.add_argument("--steps", type=int, default=1_000_000, help="train this many steps")
    parser.add_argument(
        "--final-phase",
        type=float,
        default=0.0,
        help="seconds of post-training work after the last step",
    )
    parser.add_argument("--resume", choices=("latest", "none"), default="latest")
    parser.add_argument(
        "--die-after-load",
        type=int,
        default=None,
        metavar="RESTART",
        help="on this restart count: load, report, quarantine, exit 1",
    )
    parser.add_argument(
        "--reset-counter",
        action="store_true",
        help="load checkpoint n, then count from step 1 again",
    )
    parser.add_argument(
        "--progress-every",
        type=int,
        default=1,
        metavar="K",
        help="call progress only every K-th step",
    )
    parser.add_argument(
        "--zero-based",
        action="store_true",
        help="report the epoch index (0 first) instead of steps completed",
    )
    parser.add_argument(
        "--off-by-one",
        action="store_true",
        help="resume with range(stored_epoch_index, ...): redo one step",
    )
    parser.add_argument(
        "--async-lag",
        type=int,
        default=0,
        metavar="M",
        help="a checkpoint becomes durable (and is reported) M steps later",
    )
    parser.add_argument(
        "--first-ckpt-at-1", action="store_true", help="also checkpoint after step 1"
    )
    parser.add_argument(
        "--survivor-ckpt",
        choices=("off", "printed", "silent"),
        default="off",
        help="rank 0 saves an emergency checkpoint when a peer is gone",
    )
    parser.add_argument(
        "--loaded",
        choices=("yes", "no"),
        default="yes",
        help="whether checkpoint_loaded is reported",
    )
    parser.add_argument(
        "--term-grace", type=float, default=0.0, help="seconds to keep training after SIGTERM"
    )
    parser.add_argument(
        "--progress-style", choices=("every", "first-then-every", "thread"), default="every"
    )
    parser.add_argument("--thread-interval", type=float, default=0.1)
    parser.add_argument("--thread-before-load", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--warmup-subprocess", action="store_true")
    parser.add_argument("--eval-after-kill", action="store_true")
    parser.add_argument("--replay-log", type=Path, default=None)
    parser.add_argument("--sharded", action="store_true")
    parser.add_argument("--shard-older", type=int, default=None, metavar="RANK")
    parser.add_argument("--lose-shard", type=int, default=None, metavar="RANK")
    parser.add_argument("--digest", action="store_true", help="report shard digests")
    parser.add_argument("--stall-after-resume", type=int, default=None, metavar="N")
    parser.add_argument("--fork-writer", action="store_true")
    parser.add_argument("--loss", choices=("kept", "lost"), default=None)
    parser.add_argument("--tick-at-start", action="store_true")
    parser.add_argument("--held-ticks", type=int, default=0, metavar="N")
    parser.add_argument("--loaded-label", choices=("held", "next"), default="held")
    parser.add_argument("--announce-scratch", action="store_true")
    parser.add_argument("--thread-warmup", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--late-first-tick", action="store_true")
    parser.add_argument("--heartbeat", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--child", choices=("warmup", "eval"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ckpt_every < 1 or args.progress_every < 1 or args.async_lag < 0:
        parser.error("--ckpt-every and --progress-every must be >= 1, --async-lag >= 0")
    return args


class GroundTruth:
    """This process's own record of what it did, one flushed JSON line per event."""

    def __init__(self, base: str | None, rank: int, restart: int) -> None:
        self.rank = rank
        self.restart = restart
        self._handle: IO[str] | None = None
        if base:
            path = f"{base}.{rank}.{os.getpid()}.jsonl"
            self._handle = open(path, "a", encoding="utf-8")  # kept open: one line per step

    def record(self, event: str, step: int, *, reported: bool, **extra: Any) -> None:
        if self._handle is None:
            return
        row: dict[str, Any] = {
            "t": round(time.time(), 6),
            "rank": self.rank,
            "pid": os.getpid(),
            "restart": self.restart,
            "event": event,
            "step": step,
            "reported": reported,
            **extra,
        }
        self._handle.write(json.dumps(row, separators=(",", ":")) + "\n")
        self._handle.flush()


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """Completed checkpoints, oldest first (temporary and pid files never match)."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = CHECKPOINT_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs and is not a zombie (a SIGKILLed child is one until reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] not in ("Z", "X")


class Terminated(Exception):
    """torchrun (or the drill's cleanup) asked this process to stop."""


class Job:
    def __init__(self, args: argparse.Namespace, truth: GroundTruth, world_size: int) -> None:
        self.args = args
        self.truth = truth
        self.rank = truth.rank
        self.restart = truth.restart
        self.world_size = world_size
        self.folder: Path = args.ckpt_dir
        self.done = 0  # steps completed, in true units
        self.pending: list[tuple[int, int]] = []  # async: (durable at step, snapshot step)
        self.peer_pids: dict[int, int] = {}
        self.emergency_done = False
        self.term_deadline: float | None = None  # set once SIGTERM arrived with a grace
        self.start_done = 0  # the step counter when training started in this process
        self.eval_started = False
        self.writers: list[int] = []  # forked checkpoint writers not yet reaped
        self.w = 0.0  # --loss: the one-weight model's state
        # --late-first-tick: the loop's first step recorded / the metrics thread's first
        # tick printed (the two orders it makes certain)
        self.stepped = threading.Event()
        self.ticked = threading.Event()
        if args.lose_shard == self.rank:  # node-local: gone with the process
            self.shards = Path(tempfile.mkdtemp(prefix=f"shard-r{self.rank}-"))
        else:
            self.shards = self.folder / "shards"

    # ---------------------------------------------------------------- labels

    def train_loss(self, step: int) -> float | None:
        """``--loss``: the loss of step ``step`` and the update of ``w`` it makes."""
        if self.args.loss is None:
            return None
        x = (step * 2654435761 % 1000) / 1000.0
        loss = (x - self.w) ** 2
        self.w += 0.1 * (x - self.w)
        return loss

    def label(self, steps_done: int) -> int:
        """The number this job reports for the state after ``steps_done`` steps."""
        return steps_done - 1 if self.args.zero_based else steps_done

    # ---------------------------------------------------------------- checkpoints

    def save(self, step: int, kind: str, *, report: bool = True) -> None:
        """Durably write the state after ``step`` steps, record it, then report it.

        With ``--fork-writer`` a forked child does all of it and exits.
        """
        if self.args.fork_writer and kind == "regular":
            self.reap_writers()
            pid = os.fork()
            if pid:
                self.writers.append(pid)
                return
            try:
                self._save(step, kind, report=report)
            finally:
                os._exit(0)
        self._save(step, kind, report=report)

    def reap_writers(self) -> None:
        for pid in list(self.writers):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                self.writers.remove(pid)

    def _save(self, step: int, kind: str, *, report: bool = True) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"ckpt-{step:08d}.json"
        tmp = self.folder / f".ckpt-{step:08d}.json.tmp-{os.getpid()}"
        state = {
            "step": step,
            "epoch": step - 1,
            "pid": os.getpid(),
            "restart": self.restart,
            "kind": kind,
            "w": self.w,  # --loss: the model's state after ``step`` steps
        }
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
        fsync_dir(self.folder)
        for _, old in list_checkpoints(self.folder)[:-KEEP_CHECKPOINTS]:
            old.unlink(missing_ok=True)
        self.truth.record("checkpoint", step, reported=report, label=self.label(step), kind=kind)
        if report:
            digest = None
            if self.args.sharded and self.save_shard(step):
                digest = self.shard_digest(self.shard_state(step))
            reporter.checkpoint_completed(self.label(step), digest=digest)

    # ---------------------------------------------------------------- shards

    def shard_state(self, step: int | None) -> str:
        """This rank's shard of the state (optimizer state, RNG): fresh when ``step`` is None."""
        return f"rank{self.rank}-" + ("fresh" if step is None else f"step{step}")

    def shard_digest(self, state: str) -> str | None:
        if not self.args.digest:
            return None
        return hashlib.blake2b(state.encode(), digest_size=8).hexdigest()

    def save_shard(self, step: int) -> bool:
        """Write this rank's shard of checkpoint ``step``; with ``--shard-older``, rank R
        keeps only every second one. Returns whether it wrote one."""
        if self.args.shard_older == self.rank and step % (2 * self.args.ckpt_every):
            return False
        self.shards.mkdir(parents=True, exist_ok=True)
        path = self.shards / f"shard-r{self.rank}-{step:08d}.json"
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(
            json.dumps({"rank": self.rank, "step": step, "state": self.shard_state(step)})
        )
        os.replace(tmp, path)
        self.truth.record("shard", step, reported=True)
        return True

    def load_shard(self, group_step: int) -> None:
        """Every rank loads its newest shard and reports it (rank 0's is its checkpoint)."""
        found = (
            sorted(self.shards.glob(f"shard-r{self.rank}-*.json")) if self.shards.is_dir() else []
        )
        if found:
            shard = json.loads(found[-1].read_text())
            step, state = int(shard["step"]), str(shard["state"])
        else:  # lost: re-initialised, and the group's step reported all the same
            step, state = group_step, self.shard_state(None)
        self.truth.record("loaded_shard", step, reported=True, fresh=not found)
        if self.rank != 0:
            reporter.checkpoint_loaded(step, digest=self.shard_digest(state))

    def tick(self, count: int) -> None:
        """A metrics thread's tick of the count it sees (no step of it), in line."""
        self.truth.record("report", count, reported=True, label=count)
        reporter.progress(count)

    def resume(self) -> None:
        """Load the newest checkpoint (unless told not to) and set the step counter."""
        if self.args.resume == "none":
            if self.args.announce_scratch and self.rank == 0:
                print("Initializing a new model from scratch", flush=True)  # nanoGPT's line
            return
        found = list_checkpoints(self.folder)
        if not found:
            return
        state = json.loads(found[-1][1].read_text(encoding="utf-8"))
        held = int(state["step"])  # the state after this many steps
        if self.args.loss == "kept":
            self.w = float(state.get("w", 0.0))
        if self.args.thread_before_load is not None:
            time.sleep(self.args.thread_before_load)  # a slow load (a large checkpoint)
        report = self.args.loaded == "yes"
        # The zero-based job labels everything with the epoch index it stored.
        label = int(state["epoch"]) if self.args.zero_based else held
        self.truth.record("loaded", held, reported=report, label=label)
        if self.args.sharded:
            self.load_shard(held)
        if report and self.rank == 0 and self.args.sharded:
            reporter.checkpoint_loaded(label, digest=self.shard_digest(self.shard_state(held)))
        elif report and not self.args.sharded:
            reporter.checkpoint_loaded(label + 1 if self.args.loaded_label == "next" else label)
        if self.args.reset_counter:
            self.done = 0
        elif self.args.off_by_one:
            self.done = int(state["epoch"])  # range(stored_index, ...): one epoch redone
        else:
            self.done = held
        if self.rank == 0:
            for _ in range(self.args.held_ticks):  # the slow first step's wait, ticked
                time.sleep(self.args.step_time)
                self.tick(self.done)

    def quarantine_and_die(self) -> int:
        """The loaded state "fails validation": move the folder aside and exit 1."""
        if self.rank == 0 and self.folder.exists():
            self.folder.rename(
                self.folder.with_name(f"{self.folder.name}.quarantine-r{self.restart}")
            )
        self.truth.record(
            "exit", self.done, reported=False, code=1, why="checkpoint failed validation after load"
        )
        return 1

    # ---------------------------------------------------------------- peers

    def write_pid_file(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f".rank-{self.rank}.restart-{self.restart}.pid"
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, path)

    def peer_gone(self) -> bool:
        for rank in range(1, self.world_size):
            pid = self.peer_pids.get(rank)
            if pid is None:
                path = self.folder / f".rank-{rank}.restart-{self.restart}.pid"
                try:
                    pid = int(path.read_text())
                except (OSError, ValueError):
                    continue
                self.peer_pids[rank] = pid
            if not process_alive(pid):
                return True
        return False

    # ---------------------------------------------------------------- steps

    def wait(self, seconds: float) -> None:
        """``seconds`` of work; raises :class:`Terminated` when SIGTERM arrives."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            if self.term_deadline is not None:  # draining: SIGTERM already seen
                time.sleep(left)
                return
            if signal.sigtimedwait([signal.SIGTERM], left) is not None:
                raise Terminated

    def step(self, *, interruptible: bool = True) -> None:
        """One step of work, then the truth, then the reporter.

        An uninterruptible step (the survivor's step in flight) leaves a SIGTERM pending
        for the next wait.
        """
        if interruptible:
            self.wait(self.args.step_time)
        else:
            time.sleep(self.args.step_time)
        style = self.args.progress_style
        if style == "thread" and self.args.late_first_tick and self.restart > 0:
            self.ticked.wait()  # a restarted process: its thread's first tick comes first
        self.done += 1
        label = self.label(self.done)
        if style == "thread":
            reported = False  # the metrics thread reports
        elif style == "first-then-every":
            reported = self.done == self.start_done + 1 or self.done % self.args.progress_every == 0
        else:
            reported = self.done % self.args.progress_every == 0
        loss = self.train_loss(self.done)
        extra = {} if loss is None else {"loss": loss.hex()}
        self.truth.record("step", self.done, reported=reported, label=label, **extra)
        self.stepped.set()
        if reported:
            reporter.progress(label, loss=loss)
        if self.rank != 0:
            shard_due = self.args.sharded and self.done % self.args.ckpt_every == 0
            if shard_due and self.save_shard(self.done):
                digest = self.shard_digest(self.shard_state(self.done))
                reporter.checkpoint_completed(self.done, digest=digest)
            return
        a = self.args
        if (
            self.done % a.ckpt_every == 0
            or self.done == a.steps
            or (a.first_ckpt_at_1 and self.done == 1)
        ):
            if a.async_lag:
                self.pending.append((self.done + a.async_lag, self.done))
            else:
                self.save(self.done, "regular")
        while self.pending and self.pending[0][0] <= self.done:
            _, snapshot = self.pending.pop(0)
            self.save(snapshot, "async")

    def emergency_checkpoint(self) -> None:
        """Survivor mode: finish the step in flight, save it, stop training."""
        self.emergency_done = True
        self.step(interruptible=False)
        self.save(self.done, "survivor", report=self.args.survivor_ckpt == "printed")

    def metrics_thread(self) -> None:
        """Report the completed count now and every --thread-interval seconds."""
        busy_until = time.thread_time() + self.args.thread_warmup  # CPU work, not a sleep
        while time.thread_time() < busy_until:
            pass
        if self.args.late_first_tick and self.restart == 0:
            self.stepped.wait()  # the first run: its first tick after the first step
        while True:
            done = self.done
            self.truth.record("report", done, reported=True, label=self.label(done))
            reporter.progress(self.label(done))
            self.ticked.set()
            time.sleep(self.args.thread_interval)

    def start_eval(self) -> None:
        """The survivor's evaluation subprocess (it inherits RANK)."""
        self.eval_started = True
        ready = self.folder / ".eval-ready"
        subprocess.Popen(
            [sys.executable, __file__, f"--ckpt-dir={self.folder}", "--child=eval"],
            stdin=subprocess.DEVNULL,
            # its own session, as a detached evaluation is: torchrun's SIGTERM to the
            # worker's process group would otherwise end it before its first line (only
            # the drill's cleanup, by its marker, ends it)
            start_new_session=True,
        )
        # The evaluation has reported before the survivor goes on: on a loaded machine
        # its start-up would otherwise lose the race to the replacement (and a scenario
        # about an evaluation would hold none). A SIGTERM meanwhile stays pending.
        deadline = time.monotonic() + EVAL_READY_CEILING
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    def train(self) -> None:
        a = self.args
        watch = a.survivor_ckpt != "off" and self.rank == 0 and self.world_size > 1
        eval_watch = a.eval_after_kill and self.rank == 0 and self.world_size > 1
        while self.done < a.steps:
            if (
                a.stall_after_resume is not None
                and self.restart > 0
                and self.done - self.start_done >= a.stall_after_resume
            ):
                self.truth.record("stall", self.done, reported=False)
                self.wait(TERM_WAIT_CEILING)  # a deadlock: nothing moves until torn down
                raise Terminated
            if eval_watch and not self.eval_started and self.peer_gone():
                self.start_eval()
            if self.term_deadline is not None and time.monotonic() >= self.term_deadline:
                raise Terminated
            try:
                self.step()
            except Terminated:
                if watch and not self.emergency_done:
                    self.emergency_checkpoint()
                    raise
                if a.term_grace > 0 and self.term_deadline is None:
                    self.term_deadline = time.monotonic() + a.term_grace
                    continue
                raise
            if watch and not self.emergency_done and self.peer_gone():
                self.emergency_checkpoint()
                self.wait(TERM_WAIT_CEILING)  # stopped: wait to be torn down
                raise Terminated

    def run(self) -> int:
        a = self.args
        if a.replay_log is not None and self.rank == 0 and self.restart == 0:
            sys.stdout.write(a.replay_log.read_text())  # an earlier run's log, replayed
            sys.stdout.flush()
        if a.warmup_subprocess:
            subprocess.run(
                [sys.executable, __file__, f"--ckpt-dir={self.folder}", "--child=warmup"],
                check=True,
                stdin=subprocess.DEVNULL,
            )
        if self.rank != 0 or a.eval_after_kill:
            self.write_pid_file()
        if a.tick_at_start and self.rank == 0:
            self.tick(0)
        early = a.progress_style == "thread" and a.thread_before_load is not None
        if early:  # started before the load: it ticks 0 while the checkpoint loads
            threading.Thread(target=self.metrics_thread, daemon=True).start()
        self.resume()
        self.start_done = self.done
        if a.die_after_load is not None and self.restart == a.die_after_load:
            return self.quarantine_and_die()
        if a.progress_style == "thread" and not early:
            threading.Thread(target=self.metrics_thread, daemon=True).start()
        try:
            self.train()
            self.wait(self.args.final_phase)
        except Terminated:
            self.truth.record("exit", self.done, reported=False, code=SIGTERM_EXIT, why="SIGTERM")
            return SIGTERM_EXIT
        self.truth.record("exit", self.done, reported=False, code=0, why="finished")
        return 0


def heartbeat(path: str, seconds: float) -> None:
    """Write the time to ``path`` every ``seconds``, in place (the last write stays)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    while True:
        os.pwrite(fd, b"%.6f\n" % time.time(), 0)
        time.sleep(seconds)


def child(args: argparse.Namespace) -> int:
    """A worker's subprocess: warm-up steps, or an evaluation of the newest checkpoint."""
    if args.child == "warmup":
        for step in range(1, 6):
            time.sleep(0.01)
            reporter.progress(step)
        return 0
    found = list_checkpoints(args.ckpt_dir)
    step = int(json.loads(found[-1][1].read_text())["step"]) if found else 0
    reporter.checkpoint_loaded(step)
    for n in range(1, 100_000):  # evaluation batches, until the drill's cleanup
        time.sleep(0.05)
        reporter.progress(step + n)
        if n == 1:
            (args.ckpt_dir / ".eval-ready").touch()
    return 0


def main(argv: list[str] | None = None) -> int:
    # Blocked, and taken synchronously inside each step's wait: see the module docstring.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    args = parse_args(argv)
    if args.child is not None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        return child(args)
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    truth = GroundTruth(os.environ.get("RECOVERYGATE_GROUND_TRUTH"), rank, restart)
    truth.record("start", 0, reported=False)
    base = os.environ.get("RECOVERYGATE_GROUND_TRUTH")
    if args.heartbeat is not None and base:
        path = f"{base}.{rank}.{os.getpid()}.beat"
        threading.Thread(target=heartbeat, args=(path, args.heartbeat), daemon=True).start()
    return Job(args, truth, world_size).run()


if __name__ == "__main__":
    sys.exit(main())
