"""Report steps and checkpoints from training frameworks, without a hand-written callback.

One module per framework, each importing its framework only when it is used:

- :mod:`recoverygate.integrations.transformers`: ``RecoveryGateCallback`` for the HF
  ``Trainer``, and ``last_complete_checkpoint(output_dir)``, which skips a partial
  ``checkpoint-N`` folder;
- :mod:`recoverygate.integrations.lightning` (``import lightning``) and
  :mod:`recoverygate.integrations.pytorch_lightning` (``import pytorch_lightning``):
  ``RecoveryGateCallback`` for the Lightning ``Trainer``;
- :mod:`recoverygate.integrations.dcp`: ``save``, ``async_save`` and ``load`` around
  ``torch.distributed.checkpoint``.

With ``RECOVERYGATE_AUTO=1`` in a job's environment, the reporter distribution's
``recoverygate-auto.pth`` start-up hook adds the callbacks to every HF and Lightning
``Trainer`` by itself (:mod:`recoverygate.integrations.auto`; docs/frameworks.md).

Nothing here ever raises into training: a failure inside an integration is reported
once on stderr and the integration goes quiet.
"""

from __future__ import annotations

__all__: list[str] = []
