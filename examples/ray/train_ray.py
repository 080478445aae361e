"""A Ray Train job for the drills: TorchTrainer, 2 CPU workers (gloo), a checkpoint every
``--ckpt-every`` steps through ``ray.train.report``, a resume from ``get_checkpoint()``.

Its checkpointing is stock Ray Train: the drill sets ``RECOVERYGATE_AUTO=1``
(recovery-test.yaml's ``env``), and the reporter's start-up hook patches
``ray.train.report`` / ``get_checkpoint`` in every worker: each report says
``progress(step)``, a report with a checkpoint says ``checkpoint_started(step)`` on every
rank that reports one, the checkpoint is reported completed once Ray's controller
registered it, and a resume says which step it loaded (docs/ray.md). The one
RecoveryGate line is ``reporter.progress(step)`` on every step: ``ray.train.report`` is a
synchronisation through Train's controller (measured here: about 2 s per call on a busy
2-core machine), so the job reports to Ray only when it checkpoints.

``--no-resume`` is its broken twin: it never calls ``get_checkpoint()``, so after a
worker dies Train restarts the group and training starts from scratch.

The faults' options:

- ``--shards --save-seconds=S`` (KillDuringCheckpoint): every rank saves its own shard,
  and the upload to the storage takes about ``S`` seconds (a slow storage), so a kill can
  land inside it. ``--resume-from-newest-folder`` is the broken twin: it resumes from the
  newest checkpoint folder on disk instead of the last one Ray *registered*, and loads a
  torn shard;
- ``--save-on-sigterm`` (Preempt): a SIGTERM sets a flag (its handler is installed on the
  worker's main thread through the actor: ``recoverygate.integrations.ray.sigterm_event``,
  Ray's own handler would end the worker at once), the ranks agree on it at the next
  step, every rank reports a checkpoint of that step, and the preempted rank leaves the
  train function once Ray registered it;
- ``--gloo-timeout=S`` (HangWorker): the process group's collective timeout
  (``TorchConfig(timeout_s=S)``; Ray's default is 1800 s): a peer of a stopped rank fails
  its next all-reduce after ``S`` seconds, and Train restarts the group.

``--no-step`` is Ray's shipped ``torch_linear_example.py`` shape: metrics without a step
(``{"loss": ...}``) and no ``reporter.progress`` line, so nothing reaches the drill but
the integration's own warning (Ray still registers every checkpoint in ``--storage``).

``--storage=DIR`` is the run's ``storage_path`` (default ``$RAY_TMPDIR/storage``): the
folder a StorageFault covers (recovery-test-storage-enospc.yaml). With
``RECOVERYGATE_GROUND_TRUTH=<base>`` every worker appends its own records to
``<base>.<rank>.<pid>.jsonl``: the step it loaded, each step, each save started, each
``ray.train.report`` with a checkpoint that returned (Ray persisted it) or raised (its
error): the truth a drill's verdict is held to.

``--nodes=2`` starts a two-node cluster on this machine (``ray.cluster_utils.Cluster``: a
head with 2 CPUs and a second node with 1) and spreads the workers over both: for the
``KillNode`` drill, which ends the raylet of the second node.
"""

import argparse
import json
import os
import tempfile
import time

import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from recoverygate import reporter
from recoverygate.integrations import ray as rg

SHARD_PAD = 1 << 19  # floats of padding in a shard (2 MB): a save worth uploading slowly


def slow_upload(seconds):
    """Ray's upload, ``seconds`` long: each file copied in place, chunk by chunk."""

    def upload(checkpoint, dir_name):
        storage = ray.train.get_context().get_storage()
        dest = os.path.join(storage.experiment_fs_path, dir_name)
        os.makedirs(dest, exist_ok=True)
        for name in sorted(os.listdir(checkpoint.path)):
            with open(os.path.join(checkpoint.path, name), "rb") as src:
                data = src.read()
            chunks = 20 if len(data) > 65536 else 1  # the shard slowly, its metadata at once
            size = len(data) // chunks + 1
            with open(os.path.join(dest, name), "wb") as out:
                for i in range(chunks):
                    out.write(data[i * size : (i + 1) * size])
                    out.flush()
                    if chunks > 1:
                        time.sleep(seconds / chunks)
        return Checkpoint(dest, filesystem=storage.storage_filesystem)

    return upload


def truth(event, step, **extra):
    """One record of this worker's (RECOVERYGATE_GROUND_TRUTH), flushed."""
    base = os.environ.get("RECOVERYGATE_GROUND_TRUTH")
    if not base:
        return
    rank = ray.train.get_context().get_world_rank()
    row = {"t": round(time.time(), 6), "rank": rank, "pid": os.getpid(), "step": step}
    row.update(event=event, **extra)
    with open(f"{base}.{rank}.{os.getpid()}.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")


def newest_folder():
    """The newest checkpoint folder on disk (the broken twin's resume): registered or not."""
    root = ray.train.get_context().get_storage().experiment_fs_path
    folders = (
        sorted(d for d in os.listdir(root) if d.startswith("step-")) if os.path.isdir(root) else []
    )
    return os.path.join(root, folders[-1]) if folders else None


def load(config, rank):
    """The state to resume from: (model state, optimizer state, step), or None."""
    if config["resume"] == "none":
        return None
    shard = f"rank-{rank}.pt" if config["shards"] else "state.pt"
    if config["resume"] == "newest-folder":
        folder = newest_folder()
        if folder is None:
            return None
        state = torch.load(os.path.join(folder, shard))  # a torn shard raises here
        reporter.checkpoint_loaded(state["step"])
    else:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, shard))
    return state


def save(config, rank, step, metrics, model, optim):
    """One checkpoint of ``step``: every rank's shard (``--shards``), else rank 0's copy."""
    with tempfile.TemporaryDirectory() as folder:
        if config["shards"] or rank == 0:
            state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step}
            if config["shards"]:
                state["pad"] = torch.zeros(SHARD_PAD)
            name = f"rank-{rank}.pt" if config["shards"] else "state.pt"
            torch.save(state, os.path.join(folder, name))
            extra = {}
            if config["save_seconds"]:
                extra["checkpoint_upload_fn"] = slow_upload(config["save_seconds"])
            truth("save_started", step)
            try:
                ray.train.report(
                    metrics,
                    checkpoint=Checkpoint.from_directory(folder),
                    checkpoint_dir_name=f"step-{step:06d}",
                    **extra,
                )
            except Exception as exc:
                truth("save_failed", step, error=f"{type(exc).__name__}: {exc}"[:300])
                raise
            truth("reported", step)
        else:
            ray.train.report(metrics, checkpoint_dir_name=f"step-{step:06d}")


def train_func(config):
    model = torch.nn.Linear(8, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    rank = ray.train.get_context().get_world_rank()
    step = 0
    state = load(config, rank)
    if state is not None:
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        step = state["step"]
    truth("loaded", step)
    sigterm = rg.sigterm_event() if config["save_on_sigterm"] else None
    while step < config["steps"]:
        time.sleep(config["step_time"])  # the forward/backward of a real model
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        for p in model.parameters():  # the gradient all-reduce of DDP, by hand
            dist.all_reduce(p.grad)
        optim.step()
        step += 1
        truth("step", step)
        if not config["no_step"]:
            reporter.progress(step)
        metrics = (
            {"loss": float(loss)} if config["no_step"] else {"step": step, "loss": float(loss)}
        )
        preempted = sigterm is not None and agree(sigterm.is_set())
        if preempted or step % config["ckpt_every"] == 0:
            save(config, rank, step, metrics, model, optim)
        if preempted and sigterm.is_set():
            # Leave once Ray registered it: Train restarts the group from it.
            ray.train.get_all_reported_checkpoints(
                consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
            )
            raise RuntimeError(f"preempted: saved the checkpoint of step {step}")


def agree(flag):
    """Whether any rank has the flag (one tiny all-reduce)."""
    value = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(value)
    return bool(value.item())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--max-failures", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-resume", action="store_true")
    parser.add_argument("--resume-from-newest-folder", action="store_true")
    parser.add_argument("--shards", action="store_true", help="every rank saves a shard")
    parser.add_argument("--save-seconds", type=float, default=0.0)
    parser.add_argument("--save-on-sigterm", action="store_true")
    parser.add_argument("--gloo-timeout", type=int, default=None, help="seconds (Ray: 1800)")
    parser.add_argument("--no-step", action="store_true", help="report metrics without a step")
    parser.add_argument("--storage", default=None, help="default: $RAY_TMPDIR/storage")
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 2))
    args = parser.parse_args()
    storage = os.path.abspath(
        args.storage or os.path.join(os.environ.get("RAY_TMPDIR", tempfile.gettempdir()), "storage")
    )
    started = time.time()
    placement = "PACK"
    if args.nodes == 2:
        from ray.cluster_utils import Cluster

        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": args.workers, "include_dashboard": True},
        )
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        placement = "SPREAD"  # one worker per node; after a node is lost, both on the head
    elif not ray.is_initialized():
        ray.init(num_cpus=args.workers, include_dashboard=True)
    print(f"ray.init took {time.time() - started:.1f}s", flush=True)
    trainer = TorchTrainer(
        train_func,
        train_loop_config={
            "steps": args.steps,
            "ckpt_every": args.ckpt_every,
            "step_time": args.step_time,
            "resume": "none"
            if args.no_resume
            else "newest-folder"
            if args.resume_from_newest_folder
            else "registered",
            "shards": args.shards,
            "save_seconds": args.save_seconds,
            "save_on_sigterm": args.save_on_sigterm,
            "no_step": args.no_step,
        },
        torch_config=TorchConfig(timeout_s=args.gloo_timeout) if args.gloo_timeout else None,
        scaling_config=ScalingConfig(
            num_workers=args.workers, use_gpu=False, placement_strategy=placement
        ),
        run_config=RunConfig(
            name="recoverygate-example",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=args.max_failures),
        ),
    )
    result = trainer.fit()
    print(f"finished: {result.metrics}", flush=True)


if __name__ == "__main__":
    main()
