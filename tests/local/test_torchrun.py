"""What the local backend reads from torchrun's command line and output (pure).

We test these aspects: the restart budget is torchrun's ``--max-restarts`` in either
spelling and form, and unknown (None) for a command that is not torchrun, that does not
say, or where the flag belongs to the training script; the root cause names torchrun's
error, the first failing rank and that rank's own exception.
"""

from __future__ import annotations

import pytest

from pytest_recoverygate.orchestrators.local.torchrun import max_restarts, root_cause


@pytest.mark.parametrize(
    ("command", "budget"),
    [
        (["torchrun", "--nproc-per-node=2", "--max-restarts=3", "train.py"], 3),
        (["torchrun", "--max-restarts", "2", "train.py"], 2),
        (["/venv/bin/torchrun", "--max_restarts=5", "train.py"], 5),
        (["python", "-m", "torch.distributed.run", "--max-restarts=1", "t.py"], 1),
        (["torchrun", "--nproc-per-node=2", "train.py"], None),
        (["torchrun", "train.py", "--max-restarts=9"], None),
        (["bash", "run.sh"], None),
        (["torchrun", "--max-restarts=lots", "train.py"], None),
    ],
)
def test_the_restart_budget_is_torchruns_max_restarts(
    command: list[str], budget: int | None
) -> None:
    assert max_restarts(command) == budget


def test_the_root_cause_names_the_failing_rank_and_its_own_error() -> None:
    output = (
        "[rank1]: Traceback (most recent call last):\n"
        "[rank1]: RuntimeError: the checkpoint is truncated\n"
        "[rank0]: RuntimeError: Connection closed by peer\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n  time      : 2026-01-01\n  host      : node\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : 1 (pid: 42)\n  error_file: <N/A>\n"
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
    )
    cause = root_cause(output)
    assert cause.startswith("ChildFailedError; root cause rank 1, exit code 1")
    assert cause.endswith("last worker error: RuntimeError: the checkpoint is truncated")
