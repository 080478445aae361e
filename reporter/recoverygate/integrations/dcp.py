"""``torch.distributed.checkpoint`` with the checkpoint events: ``dcp.save(sd, step=n, ...)``.

Drop-in wrappers of ``save``, ``async_save`` and ``load`` that take the step as well::

    from recoverygate.integrations import dcp

    dcp.save({"model": model, "optim": optim}, step=step, checkpoint_id=f"ckpt/{step}")
    future = dcp.async_save(state, step=step, checkpoint_id=f"ckpt/{step}")
    dcp.load(state, step=step, checkpoint_id=f"ckpt/{step}")

- ``checkpoint_started(step)`` when the save begins (for ``async_save``: before the
  state is staged);
- ``checkpoint_completed(step)`` when the save is durable on every rank: DCP's save is
  collective, and it returns on a rank only after the coordinator wrote ``.metadata``
  once every rank's writes (fsynced by ``FileSystemWriter``'s default
  ``sync_files=True``) were gathered; for ``async_save``, when the future resolves --
  the upload future of an ``AsyncSaveResponse``, not its staging future -- and only if it
  resolved without an exception;
- ``checkpoint_loaded(step)`` after ``load`` returned.

``digest=True`` sends a state digest of ``state_dict`` (its keys are the part names)
with the completed and loaded events, computed on every rank (a ``Stateful``'s
``state_dict()`` may be a collective) and sent by the ranks that print: for a save,
right before it starts (so ``async_save`` pays it before returning); for a load, after
it. Every other argument goes to DCP unchanged, and DCP's own exceptions reach the
caller as they would without the wrapper; the reporting itself never raises.
"""

from __future__ import annotations

import importlib
from typing import Any

from recoverygate import reporter
from recoverygate.integrations import _common

__all__ = ["async_save", "load", "save"]


def _dcp() -> Any:
    return importlib.import_module("torch.distributed.checkpoint")


def _digest(state_dict: Any, enabled: bool, what: str) -> dict[str, str] | None:
    if not enabled:
        return None
    # Computed on every rank: a Stateful's state_dict() may be a collective (it gathers a
    # full state dict), which would hang if only the printing rank called it.
    if not isinstance(state_dict, dict):
        return _common.digest_of({"state": state_dict}, what, everywhere=True)
    return _common.digest_of(state_dict, what, everywhere=True)


@_common.safe("recoverygate.integrations.dcp")
def _started(step: int) -> None:
    reporter.checkpoint_started(step)


@_common.safe("recoverygate.integrations.dcp")
def _completed(step: int, digest: dict[str, str] | None) -> None:
    reporter.checkpoint_completed(step, digest=digest)


def save(state_dict: Any, *, step: int, digest: bool = False, **kwargs: Any) -> Any:
    """``torch.distributed.checkpoint.save(state_dict, **kwargs)``, reported for ``step``."""
    _started(step)
    fingerprint = _digest(state_dict, digest, "dcp.save")
    metadata = _dcp().save(state_dict, **kwargs)
    _completed(step, fingerprint)  # save returns once .metadata is written for every rank
    return metadata


def async_save(state_dict: Any, *, step: int, digest: bool = False, **kwargs: Any) -> Any:
    """``torch.distributed.checkpoint.async_save``, reported as completed when it resolves.

    Returns what DCP returns (a ``Future``, or an ``AsyncSaveResponse`` with a stager).
    """
    _started(step)
    fingerprint = _digest(state_dict, digest, "dcp.async_save")
    response = _dcp().async_save(state_dict, **kwargs)
    future = getattr(response, "upload_completion", response)

    def done(finished: Any) -> None:
        try:
            if finished.cancelled() or finished.exception() is not None:
                return  # a failed save is never reported as completed
        except Exception:
            return
        _completed(step, fingerprint)

    try:
        future.add_done_callback(done)
    except Exception as error:
        _common.warn_once("dcp.async_save: cannot watch the save's future", error)
    return response


def load(state_dict: Any, *, step: int, digest: bool = False, **kwargs: Any) -> None:
    """``torch.distributed.checkpoint.load(state_dict, **kwargs)``, reported for ``step``."""
    _dcp().load(state_dict, **kwargs)
    fingerprint = _digest(state_dict, digest, "dcp.load")
    _loaded(step, fingerprint)


@_common.safe("recoverygate.integrations.dcp")
def _loaded(step: int, digest: dict[str, str] | None) -> None:
    reporter.checkpoint_loaded(step, digest=digest)
