"""Lightning ``Trainer``: ``Trainer(callbacks=[RecoveryGateCallback()])`` and the job is drillable.

This module is for ``import lightning`` (``lightning.pytorch``);
:mod:`recoverygate.integrations.pytorch_lightning` is the same callback for
``import pytorch_lightning``. What it reports, and the Lightning internals each report
rests on (checked against Lightning 2.x; docs/frameworks.md):

- ``progress(trainer.global_step, loss=...)`` in ``on_train_batch_end`` whenever
  ``global_step`` moved: ``global_step`` counts optimizer steps, so with
  ``accumulate_grad_batches`` the micro-batches that did not step report nothing, and
  manual optimization counts each ``optimizer.step()``. The loss is the one Lightning
  hands the hook (``outputs``, or ``outputs["loss"]``: the batch's loss as
  ``training_step`` returned it, divided by ``accumulate_grad_batches``), converted only
  on the lines the reporter prints (docs/replay.md).
- ``checkpoint_started(step)`` in ``on_save_checkpoint``, which Lightning calls on every
  rank while it builds the checkpoint dict, before anything is written.
- ``checkpoint_completed(step)`` at the next hook after the save (the next batch's
  ``on_train_batch_start``, an epoch or validation boundary, ``on_train_end``,
  ``teardown``): by then ``Trainer.save_checkpoint`` has returned on this rank, and it
  returns only after ``strategy.barrier()``, so every rank's part is written (the
  checkpoint IO writes a temporary file and renames it into place). One report covers
  every file ``ModelCheckpoint`` saved for that step (``last.ckpt`` included). With
  ``AsyncCheckpointIO`` the write happens in a thread after ``save_checkpoint`` returned:
  the report is queued behind it in the same single-thread executor, on the rank that
  writes (global rank 0 for DDP).
- ``checkpoint_loaded(step)`` in ``on_train_start`` of a resumed fit (``global_step``
  above 0): model, optimizers, schedulers and loops are restored before it.
- state digests of the module, its optimizers and schedulers (``digest=True``), on the
  ranks that print, at ``on_save_checkpoint`` and at ``on_train_start``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from recoverygate import reporter
from recoverygate.integrations import _common

__all__ = ["RecoveryGateCallback", "callback_class"]


def _loss_of(outputs: Any) -> Any:
    """The loss in what ``training_step`` returned (a tensor, or a mapping with ``loss``);
    None when there is none. Not converted here: the reporter calls ``float()`` only on
    the lines it prints."""
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    return outputs if hasattr(outputs, "__float__") else None


NAMESPACES = ("lightning.pytorch", "pytorch_lightning")
_classes: dict[str, type] = {}

TYPE_CHECKING = False
if TYPE_CHECKING:
    RecoveryGateCallback: type  # built on first use, as a subclass of lightning's Callback


def callback_class(namespace: str = "lightning.pytorch") -> type:
    """The callback class for ``namespace`` (``lightning.pytorch`` or ``pytorch_lightning``).

    A subclass of that namespace's ``Callback``, made (and the framework imported) now.
    """
    if namespace not in NAMESPACES:
        raise ValueError(f"namespace {namespace!r}: expected one of {', '.join(NAMESPACES)}")
    cls = _classes.get(namespace)
    if cls is None:
        base = importlib.import_module(namespace).Callback
        cls = type(
            "RecoveryGateCallback",
            (_Hooks, base),
            {
                "__module__": __name__,
                "__qualname__": "RecoveryGateCallback",
                "__doc__": _Hooks.__doc__,
            },
        )
        _classes[namespace] = cls
    return cls


def __getattr__(name: str) -> object:
    """``RecoveryGateCallback`` is built on first use, so importing this costs no lightning."""
    if name == "RecoveryGateCallback":
        return callback_class("lightning.pytorch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _async_executor(trainer: Any) -> tuple[bool, Any]:
    """(async checkpoint IO in use, its executor on this rank or None)."""
    io = getattr(getattr(trainer, "strategy", None), "checkpoint_io", None)
    while io is not None:
        if hasattr(io, "_executor"):  # lightning's AsyncCheckpointIO
            return True, io._executor
        io = getattr(io, "checkpoint_io", None) if hasattr(io, "_checkpoint_io") else None
    return False, None


def _saved_paths(trainer: Any) -> list[str]:
    """The files ``ModelCheckpoint`` callbacks saved last (for ``fsync``)."""
    paths = []
    for callback in getattr(trainer, "checkpoint_callbacks", []) or []:
        for attr in ("_last_checkpoint_saved", "last_model_path"):
            path = getattr(callback, attr, None)
            if path and os.path.exists(str(path)):
                paths.append(str(path))
    return sorted(set(paths))


class _Hooks:
    """The body of ``RecoveryGateCallback`` (the class is made with lightning's Callback as base).

    ``RecoveryGateCallback(digest=True, fsync=False)``:

    - ``digest``: send state digests (model, optimizer, scheduler) with the checkpoint
      events, computed on the ranks that print (about 50 ms per GB of state on a CPU);
    - ``fsync``: before reporting a checkpoint, global rank 0 fsyncs the files the
      ``ModelCheckpoint`` callbacks saved last and their folders, then every rank waits
      at a barrier (Lightning itself does not fsync: a killed process loses nothing it
      wrote, a lost node may).
    """

    def __init__(self, *, digest: bool = True, fsync: bool = False) -> None:
        self.digest = digest
        self.fsync = fsync
        self._last_step: int | None = None
        self._pending: int | None = None
        self._pending_digest: dict[str, str] | None = None

    def __repr__(self) -> str:
        return f"RecoveryGateCallback(digest={self.digest}, fsync={self.fsync})"

    def _digest(self, trainer: Any, pl_module: Any, what: str) -> dict[str, str] | None:
        if not self.digest:
            return None
        optimizers = list(getattr(trainer, "optimizers", []) or [])
        schedulers = [
            config.scheduler for config in getattr(trainer, "lr_scheduler_configs", []) or []
        ]
        # Under FSDP, DeepSpeed or model parallelism state_dict() is a collective.
        strategy = type(getattr(trainer, "strategy", None)).__name__
        sharded = any(kind in strategy for kind in ("FSDP", "DeepSpeed", "ModelParallel"))
        return _common.digest_of(
            {"model": pl_module, "optimizer": optimizers or None, "scheduler": schedulers or None},
            what,
            everywhere=sharded,
        )

    @_common.safe("RecoveryGateCallback")
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        step = int(trainer.global_step)
        self._last_step = step
        if step > 0:  # a resumed fit: everything is restored before on_train_start
            reporter.checkpoint_loaded(
                step, digest=self._digest(trainer, pl_module, "checkpoint_loaded")
            )

    @_common.safe("RecoveryGateCallback")
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, *args: Any
    ) -> None:
        self._flush(trainer)

    @_common.safe("RecoveryGateCallback")
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, *args: Any
    ) -> None:
        self._flush(trainer)
        step = int(trainer.global_step)
        if step != self._last_step:  # an optimizer step happened in this batch
            self._last_step = step
            reporter.progress(step, loss=_loss_of(outputs))

    @_common.safe("RecoveryGateCallback")
    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        step = int(trainer.global_step)
        if self._pending == step:  # another file of the same checkpoint (last.ckpt)
            return
        self._flush(trainer)
        self._pending = step
        reporter.checkpoint_started(step)
        self._pending_digest = self._digest(trainer, pl_module, "checkpoint_completed")

    @_common.safe("RecoveryGateCallback")
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._flush(trainer)

    @_common.safe("RecoveryGateCallback")
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._flush(trainer)

    @_common.safe("RecoveryGateCallback")
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._flush(trainer)

    @_common.safe("RecoveryGateCallback")
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._flush(trainer)

    @_common.safe("RecoveryGateCallback")
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._flush(trainer)

    @_common.safe("RecoveryGateCallback")
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._flush(trainer)

    def _flush(self, trainer: Any) -> None:
        """Report the checkpoint whose save has returned on this rank (see the module doc)."""
        step, digest = self._pending, self._pending_digest
        if step is None:
            return
        self._pending = self._pending_digest = None
        is_async, executor = _async_executor(trainer)
        if is_async:
            if executor is not None:  # the writing rank: report once the write is done
                executor.submit(_report_async, step, digest, self.fsync, _saved_paths(trainer))
            return
        if self.fsync:
            if _common.global_rank() == 0:
                for path in _saved_paths(trainer):
                    _common.fsync_tree(path)
            if not _common.barrier():
                return
        reporter.checkpoint_completed(step, digest=digest)


def _report_async(step: int, digest: dict[str, str] | None, fsync: bool, paths: list[str]) -> None:
    """Run in AsyncCheckpointIO's executor, after the save queued before it. Never raises."""
    try:
        if fsync:
            for path in paths:
                _common.fsync_tree(path)
        reporter.checkpoint_completed(step, digest=digest)
    except Exception as error:
        _common.warn_once("RecoveryGateCallback (async checkpoint)", error)
