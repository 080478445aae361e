"""A Ray driver whose Train state names a ``sleep`` as rank 1's worker (issue 41).

Train's run state is job input: the detached state actor that holds it takes updates from
any driver of the cluster. This driver starts its own cluster (``ray.init()``), two real
actors of a class named ``RayTrainWorker`` (what Train's worker actor is called), and a
``sleep`` of its own, in a session of its own (the drill's cleanup, which ends the
driver's session, does not end it: the test does). Then it writes, through Train's own
state manager, a RUNNING run whose attempt lists the two actors with their true ids and
nodes, but rank 1 with the sleep's pid. It writes the sleep's pid, rank 1's true pid and
its actor id to ``argv[1]``, and waits.

Run by tests/ray/test_ray_forged_state.py as the drill's entrypoint.
"""

import os
import subprocess
import sys
import time

import ray
from ray.train import DataConfig, RunConfig, ScalingConfig
from ray.train.backend import BackendConfig
from ray.train.v2._internal.state.schema import (
    ActorStatus,
    RunAttemptStatus,
    TrainResources,
    TrainRunAttempt,
    TrainWorker,
)
from ray.train.v2._internal.state.state_manager import TrainStateManager


@ray.remote(num_cpus=0)
class RayTrainWorker:
    def where(self):
        context = ray.get_runtime_context()
        return context.get_actor_id(), context.get_node_id(), os.getpid()


def main(pid_file, storage):
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    ray.init(num_cpus=1)
    actors = [RayTrainWorker.remote() for _ in range(2)]  # type: ignore[attr-defined]
    where = ray.get([a.where.remote() for a in actors])
    ip = ray.util.get_node_ip_address()
    manager = TrainStateManager()
    run_id = "forged-run"
    manager.create_train_run(
        id=run_id,
        name="forged",
        job_id=ray.get_runtime_context().get_job_id(),
        controller_actor_id=where[0][0],  # an actor that is alive: the run stays RUNNING
        controller_log_file_path="",
        run_config=RunConfig(name="forged", storage_path=storage),
        train_loop_config=None,
        scaling_config=ScalingConfig(num_workers=2),
        backend_config=BackendConfig(),
        datasets={},
        dataset_config=DataConfig(),
    )
    manager.update_train_run_running(run_id)
    workers = [
        TrainWorker(
            world_rank=rank,
            local_rank=rank,
            node_rank=0,
            actor_id=actor_id,
            node_id=node_id,
            node_ip=ip,
            pid=sleeper.pid if rank == 1 else pid,  # the forgery: rank 1 is the sleep
            gpu_ids=[],
            status=ActorStatus.ALIVE,
            resources=TrainResources(resources={"CPU": 0.0}),
            log_file_path=None,
        )
        for rank, (actor_id, node_id, pid) in enumerate(where)
    ]
    attempt = TrainRunAttempt(
        run_id=run_id,
        attempt_id="forged-attempt",
        status=RunAttemptStatus.RUNNING,
        start_time_ns=time.time_ns(),
        resources=[TrainResources(resources={"CPU": 0.0})] * 2,
        workers=workers,
    )
    manager._create_or_update_train_run_attempt(attempt)
    with open(pid_file + ".tmp", "w") as handle:
        handle.write(f"{sleeper.pid} {where[1][2]} {where[1][0]}")
    os.rename(pid_file + ".tmp", pid_file)
    print("forged: rank 1 is pid", sleeper.pid, "not", where[1][2], flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
