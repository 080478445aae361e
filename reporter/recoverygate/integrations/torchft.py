"""torchft: report a ``Manager``'s committed steps and heals, with no line in the loop.

``instrument(manager)`` (or ``RECOVERYGATE_AUTO=1``, which instruments every
``torchft.Manager`` as it is built) wraps two methods of that one manager instance:

- ``should_commit``: when it returns True, ``reporter.progress(manager.current_step())``
  -- only committed steps are progress (a step torchft discards is no progress);
- ``_apply_pending_state_dict`` (torchft applies a peer's state here, on the training
  thread, inside ``should_commit``): ``reporter.checkpoint_loaded(step, source="peer",
  peer=R)`` -- the step of the state it healed to, and the replica rank it came from
  (read from the checkpoint transport's ``recv_checkpoint(src_rank=...)``).

The start line carries ``replica`` from torchft's ``REPLICA_GROUP_ID``. torchft's
initial sync at step 0 and a replica joining late also heal; they are reported like any
heal, and a drill judges only the heal of the replacement after its kill
(docs/torchft.md). Read against torchft 0.2.0 (manager.py). Never raises into training:
a problem is reported once on stderr and the manager is left as it was.
"""

from __future__ import annotations

import functools
from typing import Any

from recoverygate import reporter
from recoverygate.integrations._common import warn_once

__all__ = ["instrument", "instrumented"]

_MARK = "__recoverygate_instrumented__"


def instrumented(manager: Any) -> bool:
    """Whether ``manager`` reports to RecoveryGate already."""
    return bool(getattr(manager, _MARK, False))


def instrument(manager: Any) -> Any:
    """Make ``manager`` (a ``torchft.Manager``) report its committed steps and heals.

    Idempotent; returns ``manager``. Never raises.
    """
    try:
        if instrumented(manager):
            return manager
        _wrap(manager)
        setattr(manager, _MARK, True)
    except Exception as error:  # an unexpected torchft: leave it alone, say so once
        warn_once("torchft: the manager was not instrumented", error)
    return manager


def _wrap(manager: Any) -> None:
    should_commit = manager.should_commit
    apply_pending = manager._apply_pending_state_dict
    heal: dict[str, int | None] = {"peer": None}
    transport = getattr(manager, "_checkpoint_transport", None)
    recv = getattr(transport, "recv_checkpoint", None)

    if transport is not None and recv is not None:

        @functools.wraps(recv)
        def recv_checkpoint(*args: Any, **kwargs: Any) -> Any:
            src = kwargs.get("src_rank", args[0] if args else None)
            heal["peer"] = src if isinstance(src, int) and not isinstance(src, bool) else None
            return recv(*args, **kwargs)

        transport.recv_checkpoint = recv_checkpoint

    @functools.wraps(should_commit)
    def wrapped_should_commit(*args: Any, **kwargs: Any) -> Any:
        committed = should_commit(*args, **kwargs)
        if committed is True:
            try:
                reporter.progress(manager.current_step())
            except Exception as error:
                warn_once("torchft: a committed step was not reported", error)
        return committed

    @functools.wraps(apply_pending)
    def wrapped_apply(*args: Any, **kwargs: Any) -> Any:
        result = apply_pending(*args, **kwargs)
        try:
            # torchft set its step to the quorum's max_step before this ran; when the
            # transfer failed, nothing was staged and the manager reports an error.
            errored = getattr(manager, "errored", None)
            if errored is None or errored() is None:
                reporter.checkpoint_loaded(manager.current_step(), source="peer", peer=heal["peer"])
        except Exception as error:
            warn_once("torchft: a heal was not reported", error)
        return result

    manager.should_commit = wrapped_should_commit
    manager._apply_pending_state_dict = wrapped_apply
