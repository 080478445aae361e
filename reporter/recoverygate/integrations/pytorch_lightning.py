"""``import pytorch_lightning``: ``Trainer(callbacks=[RecoveryGateCallback()])``.

The same callback as :mod:`recoverygate.integrations.lightning`, made a subclass of
``pytorch_lightning.Callback``: the two Lightning packages have separate class trees.
"""

from __future__ import annotations

from recoverygate.integrations import lightning as _lightning

__all__ = ["RecoveryGateCallback", "callback_class"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    RecoveryGateCallback: type  # built on first use, as a subclass of pytorch_lightning's Callback


def callback_class() -> type:
    """The callback class, a subclass of ``pytorch_lightning.Callback`` (imported now)."""
    return _lightning.callback_class("pytorch_lightning")


def __getattr__(name: str) -> object:
    """``RecoveryGateCallback`` is built on first use, so importing this costs no lightning."""
    if name == "RecoveryGateCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
