"""torchft: report a ``Manager``'s committed steps and heals, with no line in the loop.

``instrument(manager)`` (or ``RECOVERYGATE_AUTO=1``, which instruments every
``torchft.Manager`` as it is built) wraps two methods of that one manager (and its
transport) instance:

- ``should_commit``: when it returns True, ``reporter.progress(manager.current_step())``
  -- only committed steps are progress (a step torchft discards is no progress);
- the checkpoint transport's ``recv_checkpoint(src_rank, metadata, step)``, which torchft
  calls on its quorum thread when this replica heals: once it returned the peer's state,
  ``reporter.checkpoint_loaded(step, source="peer", peer=src_rank)`` -- the step of the
  state it healed to (the quorum's max step) and the replica rank it came from. Reported
  there, not when ``should_commit`` applies the state: the survivors cannot commit the
  next step before this replica's transfer is done (their allreduce waits for it), so the
  line is stamped before any survivor step past the heal step;
- for ``stateDigestMatches`` (docs/torchft.md), the state digests of a heal, on the rank
  that prints: the transport's ``send_checkpoint(dst_ranks, step, state_dict, timeout)``
  on the survivor that serves the heal -- once it returned,
  ``reporter.checkpoint_completed(step, digest=...)`` of the user state it sent (torchft's
  in-memory checkpoint for the peer) -- and the manager's ``_apply_pending_state_dict``
  on the healed replica -- once the job's ``load_state_dict`` applied the state, the heal
  line again, ``checkpoint_loaded(step, source="peer", peer=..., digest=...)``, with the
  digest of the state the job's ``state_dict`` returns now. Equal digests: the heal
  applied what the survivor sent. The user state is read through the job's own
  ``state_dict`` callbacks, without torchft's lock. A heal reads the whole state once
  more on each side (cheap for small models; a large one pays a full read per heal).

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
from recoverygate.integrations._common import digest_of, warn_once

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


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], name: str, index: int) -> Any:
    return kwargs.get(name, args[index] if len(args) > index else None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _wrap(manager: Any) -> None:
    should_commit = manager.should_commit
    transport = manager._checkpoint_transport
    recv = transport.recv_checkpoint
    send = transport.send_checkpoint
    apply = manager._apply_pending_state_dict
    healing: list[tuple[int, int | None]] = []  # (step, peer) of the heal being applied

    @functools.wraps(recv)
    def recv_checkpoint(*args: Any, **kwargs: Any) -> Any:
        state = recv(*args, **kwargs)  # torchft's own errors propagate to torchft
        try:
            src = kwargs.get("src_rank", args[0] if args else None)
            step = kwargs.get("step", args[2] if len(args) > 2 else None)
            if isinstance(step, int) and not isinstance(step, bool):
                peer = src if isinstance(src, int) and not isinstance(src, bool) else None
                reporter.checkpoint_loaded(step, source="peer", peer=peer)
                healing[:] = [(step, peer)]
        except Exception as error:
            warn_once("torchft: a heal was not reported", error)
        return state

    @functools.wraps(send)
    def send_checkpoint(*args: Any, **kwargs: Any) -> Any:
        result = send(*args, **kwargs)
        try:
            step, state = _arg(args, kwargs, "step", 1), _arg(args, kwargs, "state_dict", 2)
            user = state.get("user") if isinstance(state, dict) else None
            if _is_int(step) and isinstance(user, dict):
                digest = digest_of(user, "torchft: the state sent to a healing peer")
                if digest is not None:
                    reporter.checkpoint_completed(step, digest=digest)
        except Exception as error:
            warn_once("torchft: the state sent to a peer was not reported", error)
        return result

    @functools.wraps(apply)
    def apply_pending_state_dict(*args: Any, **kwargs: Any) -> Any:
        result = apply(*args, **kwargs)
        try:
            if healing:
                (step, peer), healing[:] = healing[0], []
                user = {key: fn() for key, fn in manager._user_state_dicts.items()}
                digest = digest_of(user, "torchft: the healed state")
                if digest is not None:
                    reporter.checkpoint_loaded(step, digest=digest, source="peer", peer=peer)
        except Exception as error:
            warn_once("torchft: the healed state was not reported", error)
        return result

    @functools.wraps(should_commit)
    def wrapped_should_commit(*args: Any, **kwargs: Any) -> Any:
        committed = should_commit(*args, **kwargs)
        if committed is True:
            try:
                reporter.progress(manager.current_step())
            except Exception as error:
                warn_once("torchft: a committed step was not reported", error)
        return committed

    transport.recv_checkpoint = recv_checkpoint
    transport.send_checkpoint = send_checkpoint
    manager._apply_pending_state_dict = apply_pending_state_dict
    manager.should_commit = wrapped_should_commit
