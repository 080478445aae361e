"""``recoverygate.integrations.ray`` outside a cluster: what it reads and what it patches.

We test these aspects: the step of a report (``step=``, ``metrics["step"]``,
``metrics["global_step"]``); ``RECOVERYGATE_AUTO=1`` patches ``ray.train.report`` and
``get_checkpoint`` in a fresh interpreter (through the start-up hook), ``uninstall``
restores them, and with the variable unset nothing is patched. The drills in
test_ray_drills.py run the wrappers inside real Train workers.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from recoverygate.integrations.ray import step_of

from tests.patience import JOB, within

pytest.importorskip("ray", reason='needs pip install "recoverygate[ray]"')

pytestmark = pytest.mark.ray

PROBE = (
    "import ray.train\n"
    "from recoverygate.integrations import auto\n"
    "print(auto.patched(), hasattr(ray.train.report, '__recoverygate_original__'))\n"
    "auto.uninstall()\n"
    "print(auto.patched(), hasattr(ray.train.report, '__recoverygate_original__'))\n"
)


def probe(value: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "RECOVERYGATE_AUTO"}
    if value is not None:
        env["RECOVERYGATE_AUTO"] = value
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_step_comes_from_the_argument_then_the_metrics() -> None:
    assert step_of({"step": 7, "global_step": 9}) == 7
    assert step_of({"global_step": 9}) == 9
    assert step_of({"step": 7}, 3) == 3
    assert step_of({"loss": 0.1}) is None
    assert step_of(None, "12") == 12
    assert step_of({"step": "seven"}) is None


@pytest.mark.slow  # two interpreters that import ray (seconds each)
def test_auto_patches_report_and_get_checkpoint_and_uninstall_restores_them() -> None:
    assert probe("1") == ["['ray.train'] True", "[] False"]
    assert probe("ray") == ["['ray.train'] True", "[] False"]


@pytest.mark.slow  # two interpreters that import ray (seconds each)
def test_without_auto_nothing_is_patched() -> None:
    assert probe(None) == ["[] False", "[] False"]
    assert probe("transformers") == ["[] False", "[] False"]
