"""The simulated job's per-step losses and batch fingerprints (``fake.replay``, issue 33).

The fake job reports ``progress(step, loss=, data=)`` when ``replay`` is not ``none``.
A first run's loss and batch are a fixed function of the step. A replacement (a run
after a kill) redoes the steps after the checkpoint it resumed from, the way a resume
that restores everything, or forgets one thing, would:

- ``exact``: the same losses and batches, bit for bit (everything restored);
- ``noise``: the same batches, each loss off by the relative ``replayNoise`` (a GPU's
  nondeterministic kernels);
- ``data``: the epoch's first batches again (the data position not restored), so both
  the fingerprints and the losses differ from the first replayed step on;
- ``spike``: the first ``replaySpikes`` replayed steps' losses are 50% higher, the rest
  equal (an allowance with ``maxDivergentSteps``).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["ReplayMode", "point"]

ReplayMode = Literal["none", "exact", "noise", "data", "spike"]


def _loss(batch: int) -> float:
    """A decreasing loss with a fixed wiggle per batch (any float; only equality matters)."""
    return 2.0 / (1.0 + 0.01 * batch) + ((batch * 2654435761) % 1000) / 100_000.0


def point(
    mode: ReplayMode,
    step: int,
    *,
    resumed_from: int | None,
    noise: float = 1e-6,
    spikes: int = 2,
) -> tuple[float | None, str | None]:
    """The (loss, data) the simulated job reports at ``step``; ``resumed_from`` is the
    checkpoint a replacement resumed from (None for the first run)."""
    if mode == "none":
        return None, None
    if resumed_from is None or mode == "exact":
        return _loss(step), f"e0/b{step}"
    replayed = step - resumed_from  # 1 for the first step the replacement redoes
    if mode == "noise":
        return _loss(step) * (1.0 + noise), f"e0/b{step}"
    if mode == "data":
        return _loss(replayed), f"e0/b{replayed}"
    # spike
    return (_loss(step) * 1.5 if 1 <= replayed <= spikes else _loss(step)), f"e0/b{step}"
