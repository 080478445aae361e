"""HF ``Trainer``: ``trainer.add_callback(RecoveryGateCallback())`` and the job is drillable.

What the callback reports, and the Trainer internals each report rests on (checked
against transformers 5.x and 4.x; docs/frameworks.md):

- ``progress(state.global_step)`` in ``on_step_end``: the Trainer increments
  ``global_step`` right *before* ``on_step_end``, once per optimizer step, so gradient
  accumulation is counted right (micro-batches end in ``on_substep_end``). On a step the
  Trainer logs (``control.should_log``, set by its flow callback before ours runs), the
  line waits for ``on_log`` and carries ``loss=logs["loss"]``: the loss the Trainer hands
  over, the mean over the ranks and the steps since the last log (with
  ``logging_steps=1``: that step's; docs/replay.md). A step whose log never came is
  reported without a loss at the next hook.
- ``checkpoint_started(step)`` in ``on_step_end``/``on_epoch_end`` when the flow callback
  has set ``control.should_save`` (the save follows right after those hooks).
- ``checkpoint_completed(step)`` in ``on_save``, which the Trainer calls on *every* rank
  right after *this* rank's part of ``checkpoint-N`` is written -- with no barrier,
  nothing fsynced and no rename: rank 0 writes the model, optimizer, scheduler and
  trainer state, every rank its ``rng_state_<rank>.pth``. So the callback (optionally
  fsyncs what this rank can see of the folder, then) waits at a barrier until every rank
  got there, rank 0 writes the ``.recoverygate-complete`` marker and reports it at once
  (the checkpoint is complete from that moment: a report after another barrier would let
  a kill in between make a complete checkpoint look cut), a second barrier, and then
  the other ranks ``RECOVERYGATE_RANKS`` selects report it.
- ``checkpoint_loaded(state.global_step)`` in ``on_train_begin`` of a resumed run: the
  Trainer restores the model, optimizer, scheduler and ``state`` before it.
- state digests of ``model``, ``optimizer`` and ``scheduler`` (``digest=True``), computed
  on the ranks that print (on every rank under FSDP or DeepSpeed, whose ``state_dict()``
  is a collective): at ``on_save``, before its barriers (nothing has changed since the
  save) and at
  ``on_train_begin`` of a resumed run (everything restored). The RNG states are not
  digested: the Trainer restores them only after ``on_train_begin``.

:func:`last_complete_checkpoint` is the resume-side half: ``get_last_checkpoint``
returns the newest ``checkpoint-N`` folder even when it is partial, and the restart then
crash-loops on it.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from typing import Any

from recoverygate import reporter
from recoverygate.integrations import _common

__all__ = ["RecoveryGateCallback", "callback_class", "last_complete_checkpoint"]

_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
_TRAINER_STATE = "trainer_state.json"
_class: type | None = None

TYPE_CHECKING = False
if TYPE_CHECKING:
    RecoveryGateCallback: type  # built on first use, as a subclass of TrainerCallback


def callback_class() -> type:
    """The callback class, a subclass of ``transformers.TrainerCallback`` (imported now)."""
    global _class  # noqa: PLW0603
    if _class is None:
        base = importlib.import_module("transformers").TrainerCallback
        _class = type(
            "RecoveryGateCallback",
            (_Hooks, base),
            {
                "__module__": __name__,
                "__qualname__": "RecoveryGateCallback",
                "__doc__": _Hooks.__doc__,
            },
        )
    return _class


def __getattr__(name: str) -> object:
    """``RecoveryGateCallback`` is built on first use, so importing this costs no transformers."""
    if name == "RecoveryGateCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Hooks:
    """The body of ``RecoveryGateCallback`` (the class is made with TrainerCallback as base).

    ``RecoveryGateCallback(digest=True, fsync=False, marker=True)``:

    - ``digest``: send state digests (model, optimizer, scheduler) with the checkpoint
      events, computed on the ranks that print (about 50 ms per GB of state on a CPU);
    - ``fsync``: fsync every file of the ``checkpoint-N`` folder this rank can see, the
      folder and its parent before the barrier, so "completed" also survives the loss of
      the node (a killed process loses nothing that was written, fsync or not);
    - ``marker``: write ``checkpoint-N/.recoverygate-complete`` once every rank's part is
      written, which :func:`last_complete_checkpoint` looks for.
    """

    def __init__(self, *, digest: bool = True, fsync: bool = False, marker: bool = True) -> None:
        self.digest = digest
        self.fsync = fsync
        self.marker = marker
        self._save_started: int | None = None
        self._pending: int | None = None  # a step whose progress waits for on_log's loss

    def __repr__(self) -> str:
        return (
            f"RecoveryGateCallback(digest={self.digest}, fsync={self.fsync}, marker={self.marker})"
        )

    def _digest(self, args: Any, kwargs: dict[str, Any], what: str) -> dict[str, str] | None:
        if not self.digest:
            return None
        # Under FSDP or DeepSpeed state_dict() is a collective: every rank must take part.
        sharded = bool(getattr(args, "fsdp", None)) or getattr(args, "deepspeed", None) is not None
        return _common.digest_of(
            {
                "model": kwargs.get("model"),
                "optimizer": kwargs.get("optimizer"),
                "scheduler": kwargs.get("lr_scheduler"),
            },
            what,
            everywhere=sharded,
        )

    @_common.safe("RecoveryGateCallback")
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        if step > 0:  # a resumed run: the state is restored before on_train_begin
            reporter.checkpoint_loaded(step, digest=self._digest(args, kwargs, "checkpoint_loaded"))

    @_common.safe("RecoveryGateCallback")
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        self._flush_pending()
        if getattr(control, "should_log", False):
            self._pending = step  # on_log follows with this step's loss
        else:
            reporter.progress(step)  # global_step was incremented right before this hook
        self._maybe_started(step, control)

    @_common.safe("RecoveryGateCallback")
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        step = int(state.global_step)
        if self._pending != step:
            return
        self._pending = None
        loss = logs.get("loss") if isinstance(logs, dict) else None
        reporter.progress(step, loss=loss)

    def _flush_pending(self) -> None:
        if self._pending is not None:
            step, self._pending = self._pending, None
            reporter.progress(step)

    @_common.safe("RecoveryGateCallback")
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush_pending()
        self._maybe_started(int(state.global_step), control)

    def _maybe_started(self, step: int, control: Any) -> None:
        if getattr(control, "should_save", False) and self._save_started != step:
            self._save_started = step
            reporter.checkpoint_started(step)

    @_common.safe("RecoveryGateCallback")
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        if self._save_started != step:  # a save no hook announced (save_strategy="best"):
            # announced late, after the files, but still before it is reported complete
            self._save_started = step
            reporter.checkpoint_started(step)
        folder = _checkpoint_folder(args, step)
        # Digested first (nothing changed since the save; a collective under FSDP), so the
        # completion line follows the marker with nothing in between.
        digest = self._digest(args, kwargs, "checkpoint_completed")
        if self.fsync and folder is not None and os.path.isdir(folder):
            _common.fsync_tree(folder)
        if not _common.barrier():  # every rank's part is written once all are here
            return
        if self.marker and folder is not None:
            writer = _common.global_rank() == 0
            if writer and os.path.isdir(folder):
                _common.write_marker(folder, step, fsync=self.fsync)
                # Complete from this moment: report it now, not after another barrier (a
                # kill in between would leave a complete checkpoint reported as cut).
                reporter.checkpoint_completed(step, digest=digest)
            if not _common.barrier():  # the others report once the marker is in place
                return
            if writer and os.path.isdir(folder):
                return
        reporter.checkpoint_completed(step, digest=digest)


def _checkpoint_folder(args: Any, step: int) -> str | None:
    """Where the Trainer just saved: ``<output_dir>/checkpoint-<step>`` (None if unknown)."""
    output_dir = getattr(args, "output_dir", None)
    if not output_dir:
        return None
    return os.path.join(str(output_dir), f"checkpoint-{step}")


def _trainer_state_step(folder: str) -> int | None:
    try:
        with open(os.path.join(folder, _TRAINER_STATE), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    step = data.get("global_step") if isinstance(data, dict) else None
    return step if isinstance(step, int) else None


def last_complete_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest *complete* ``checkpoint-N`` folder in ``output_dir``, or None.

    ``transformers.trainer_utils.get_last_checkpoint`` returns the newest folder, even one
    a killed save left partial (the folder is created before its files, and rank 1's RNG
    file may not be written yet); resuming from it crash-loops. A folder is complete here
    when it holds the ``.recoverygate-complete`` marker that ``RecoveryGateCallback``
    writes once every rank's part is in. In an output folder without any marker (a job
    that does not use the callback), a folder counts as complete when its
    ``trainer_state.json``, the last file rank 0 writes, reads back with ``global_step``
    N; that cannot see a missing ``rng_state_<rank>.pth`` of another rank, which only
    makes the resume non-reproducible (the Trainer warns and goes on).

    Use it as ``trainer.train(resume_from_checkpoint=last_complete_checkpoint(out))``:
    None starts from scratch.
    """
    root = os.fspath(output_dir)
    try:
        names = os.listdir(root)
    except OSError:
        return None
    found: list[tuple[int, str]] = []
    for name in names:
        match = _CHECKPOINT_DIR.match(name)
        path = os.path.join(root, name)
        if match and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    found.sort(reverse=True)
    marked = [path for step, path in found if _common.is_complete_marker(path, step)]
    if marked:
        return marked[0]
    if any(os.path.exists(os.path.join(path, _common.MARKER_NAME)) for _, path in found):
        return None  # markers, but none readable: nothing provably complete
    for step, path in found:
        if _trainer_state_step(path) == step:
            return path
    return None
