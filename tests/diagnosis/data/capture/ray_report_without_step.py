"""A Ray Train run whose workers report metrics without a step, as Ray's shipped
``torch_linear_example.py`` does (``{"loss": ...}``), through the RecoveryGate wrapper:
each worker warns once, on stderr, that nothing is reported. Prints the run's merged
output (the driver streams the workers' stderr)."""

from __future__ import annotations

import sys
import tempfile

import ray
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from recoverygate.integrations import ray as rg


def loop(config: dict[str, int]) -> None:
    for epoch in range(config["epochs"]):
        with tempfile.TemporaryDirectory() as folder:
            rg.report({"loss": 1.0 / (epoch + 1)}, checkpoint=Checkpoint.from_directory(folder))


def main() -> int:
    ray.init(num_cpus=2, include_dashboard=False)
    trainer = TorchTrainer(
        loop,
        train_loop_config={"epochs": 3},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=sys.argv[1], name="no-step"),
    )
    trainer.fit()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
