"""A Ray Train job for the drills: TorchTrainer, 2 CPU workers (gloo), a checkpoint every
``--ckpt-every`` steps through ``ray.train.report``, a resume from ``get_checkpoint()``.

Its checkpointing is stock Ray Train: the drill sets ``RECOVERYGATE_AUTO=1``
(recovery-test.yaml's ``env``), and the reporter's start-up hook patches
``ray.train.report`` / ``get_checkpoint`` in every worker: each report says
``progress(step)``, a checkpoint is reported once Ray's controller registered it, and a
resume says which step it loaded (docs/ray.md). The one RecoveryGate line is
``reporter.progress(step)`` on every step: ``ray.train.report`` is a synchronisation
through Train's controller (measured here: about 2 s per call on a busy 2-core machine),
so the job reports to Ray only when it checkpoints.

``--no-resume`` is its broken twin: it never calls ``get_checkpoint()``, so after a
worker dies Train restarts the group and training starts from scratch.

``--no-step`` is Ray's shipped ``torch_linear_example.py`` shape: metrics without a step
(``{"loss": ...}``) and no ``reporter.progress`` line, so nothing reaches the drill but
the integration's own warning (Ray still registers every checkpoint in ``--storage``).

``--nodes=2`` starts a two-node cluster on this machine (``ray.cluster_utils.Cluster``: a
head with 2 CPUs and a second node with 1) and spreads the workers over both: for the
``KillNode`` drill, which ends the raylet of the second node.
"""

import argparse
import os
import tempfile
import time

import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from recoverygate import reporter


def train_func(config):
    model = torch.nn.Linear(8, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    if config["resume"]:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as folder:
                state = torch.load(os.path.join(folder, "state.pt"))
            model.load_state_dict(state["model"])
            optim.load_state_dict(state["optim"])
            step = state["step"]
    rank = ray.train.get_context().get_world_rank()
    while step < config["steps"]:
        time.sleep(config["step_time"])  # the forward/backward of a real model
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        for p in model.parameters():  # the gradient all-reduce of DDP, by hand
            dist.all_reduce(p.grad)
        optim.step()
        step += 1
        if not config["no_step"]:
            reporter.progress(step)
        metrics = (
            {"loss": float(loss)} if config["no_step"] else {"step": step, "loss": float(loss)}
        )
        if step % config["ckpt_every"] == 0:
            with tempfile.TemporaryDirectory() as folder:
                if rank == 0:  # one copy of the replicated state
                    torch.save(
                        {"model": model.state_dict(), "optim": optim.state_dict(), "step": step},
                        os.path.join(folder, "state.pt"),
                    )
                    ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
                else:
                    ray.train.report(metrics)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--max-failures", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-resume", action="store_true")
    parser.add_argument("--no-step", action="store_true", help="report metrics without a step")
    parser.add_argument("--storage", default=None, help="default: $RAY_TMPDIR/storage")
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 2))
    args = parser.parse_args()
    storage = args.storage or os.path.join(
        os.environ.get("RAY_TMPDIR", tempfile.gettempdir()), "storage"
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
            "resume": not args.no_resume,
            "no_step": args.no_step,
        },
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
