"""A torchft DDP job on CPU (gloo): two replica groups, one lighthouse, live recovery.

Each replica group is its own ``torchrun`` (``REPLICA_GROUP_ID`` 0 or 1). When one dies,
torchrun restarts it; the other keeps committing steps with a smaller world; the
replacement joins the next quorum and heals its state from the survivor (no checkpoint).
``recoverygate.integrations.torchft.instrument(manager)`` reports the committed steps and
the heal: the training loop has no RecoveryGate line.

Gradients are averaged with ``manager.allreduce`` per parameter, not torchft's DDP comm
hook: with torchft 0.2.0 the comm hook can crash the *survivor* when the killed peer
resets a connection inside the allreduce (``assert fut._fut`` in torchft/ddp.py; 1 run in
4 here with ``TRAIN_FT_DDP=1``, about 1 in 8 in the issue), while ``manager.allreduce``
turns that error into a discarded step (see docs/torchft.md).

Environment: ``MIN_REPLICA_SIZE`` (default 1; 2 makes the survivors wait for the dead
replica), ``ALLOW_HEAL`` (default 1; 0 makes a replacement start from scratch instead of
healing), ``TRAIN_STEPS`` (default 150), ``STEP_SECONDS`` (default 0.05), and
``PG_TIMEOUT_SECONDS`` (default 5: how long a collective waits for a dead peer), and
``RESTART_DELAY_SECONDS`` (default 0: a restarted process, TORCHELASTIC_RESTART_COUNT > 0,
waits this long before it joins -- a model that takes that long to load), and
``TRAIN_FT_INSTRUMENT`` (default 1; 0 leaves the reporting to ``RECOVERYGATE_AUTO=1``),
``TRAIN_FT_DDP`` (default 0; 1 averages through torchft's DDP comm hook instead, to
compare the two), ``HEAL_APPLIES_NOTHING`` (default 0; 1 makes ``load_state_dict`` load
into a copy of the model, so a heal applies nothing: the broken twin of
``stateDigestMatches``), ``HEAL_REPORTED_AFTER_COMMIT`` (default 0; 1 reports by hand, as
a hand-written loop may, instead of ``instrument``: every committed step, and a heal only
once the step's commit is decided -- after ``should_commit``, 0.2 s later (say, after
logging) -- so its heal line comes after the survivor's line of the same step).

With ``RECOVERYGATE_GROUND_TRUTH=<base>`` every process appends its own record to
``<base>.<replica>.<pid>.jsonl``: ``{"t", "replica", "pid", "restart", "event":
"heal"|"commit", "step"}`` -- a heal with the step of the state it applied (as it applies
it), a commit with the step committed (once ``should_commit`` decided it); with
``HEAL_REPORTED_AFTER_COMMIT=1`` both are written before the matching line.
"""

from __future__ import annotations

import copy
import json
import os
import time
from datetime import timedelta

import torch
from recoverygate import reporter
from recoverygate.integrations.torchft import instrument
from torch import nn
from torchft import DistributedDataParallel, Manager, ProcessGroupGloo

REPLICA = int(os.environ.get("REPLICA_GROUP_ID", "0"))
MIN_REPLICA_SIZE = int(os.environ.get("MIN_REPLICA_SIZE", "1"))
ALLOW_HEAL = os.environ.get("ALLOW_HEAL", "1") != "0"
STEPS = int(os.environ.get("TRAIN_STEPS", "150"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.05"))
PG_TIMEOUT = timedelta(seconds=float(os.environ.get("PG_TIMEOUT_SECONDS", "5")))
RESTART_DELAY = float(os.environ.get("RESTART_DELAY_SECONDS", "0"))
HEAL_APPLIES_NOTHING = os.environ.get("HEAL_APPLIES_NOTHING", "0") == "1"
HEAL_AFTER_COMMIT = os.environ.get("HEAL_REPORTED_AFTER_COMMIT", "0") == "1"
HEAL_REPORT_DELAY = 0.2  # seconds after the commit is decided before the heal is reported


def record(event: str, step: int) -> None:
    """This process's own record of a heal or commit (RECOVERYGATE_GROUND_TRUTH)."""
    base = os.environ.get("RECOVERYGATE_GROUND_TRUTH")
    if not base:
        return
    row = {
        "t": round(time.time(), 6),
        "replica": REPLICA,
        "pid": os.getpid(),
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "event": event,
        "step": step,
    }
    with open(f"{base}.{REPLICA}.{os.getpid()}.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")


def main() -> None:
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        time.sleep(RESTART_DELAY)  # a slow restart: loading a big model, say
    torch.manual_seed(0)  # the same initial weights everywhere (init_sync heals anyway)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    healed: list[int] = []  # HEAL_REPORTED_AFTER_COMMIT: the step of the state applied

    def load_state_dict(state: dict[str, object]) -> None:
        healed.append(manager.current_step())  # torchft's step is the heal's here
        if not HEAL_AFTER_COMMIT:
            record("heal", manager.current_step())
        if HEAL_APPLIES_NOTHING:  # the bug: the state goes into a copy, not the model
            copy.deepcopy(model).load_state_dict(state["model"])  # type: ignore[arg-type]
            return
        model.load_state_dict(state["model"])  # type: ignore[arg-type]
        optimizer.load_state_dict(state["optim"])  # type: ignore[arg-type]

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    manager = Manager(
        pg=ProcessGroupGloo(timeout=PG_TIMEOUT),
        min_replica_size=MIN_REPLICA_SIZE,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_ft_{REPLICA}",
        timeout=PG_TIMEOUT,
        quorum_timeout=timedelta(seconds=60),
        connect_timeout=timedelta(seconds=10),
    )
    if os.environ.get("TRAIN_FT_INSTRUMENT", "1") != "0" and not HEAL_AFTER_COMMIT:
        instrument(manager)  # with RECOVERYGATE_AUTO=1 it is instrumented already: a no-op
    ddp = os.environ.get("TRAIN_FT_DDP", "0") == "1"
    net = DistributedDataParallel(manager, model) if ddp else model
    data = torch.Generator().manual_seed(1000 + REPLICA)
    while manager.current_step() < STEPS:
        manager.start_quorum(allow_heal=ALLOW_HEAL)
        x = torch.randn(64, 32, generator=data)
        y = torch.randn(64, 4, generator=data)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()  # with TRAIN_FT_DDP=1 the comm hook averages inside backward
        if not ddp:
            works = [manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None]
            for work in works:
                work.wait()
        if manager.should_commit():
            optimizer.step()
            if HEAL_AFTER_COMMIT:
                report_by_hand(manager.current_step(), healed)
            else:
                record("commit", manager.current_step())
        time.sleep(STEP_SECONDS)
    manager.shutdown(wait=False)


def report_by_hand(committed: int, healed: list[int]) -> None:
    """A hand-written loop's reporting: the heal once the commit is decided, then the
    committed step (the commit is recorded first: it happened before the heal's line)."""
    record("commit", committed)
    if healed:
        step = healed.pop()
        healed.clear()
        time.sleep(HEAL_REPORT_DELAY)  # logging, metrics: the heal is reported late
        record("heal", step)
        reporter.checkpoint_loaded(step, source="peer")
    reporter.progress(committed)


if __name__ == "__main__":
    main()
