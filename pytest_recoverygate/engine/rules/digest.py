"""The rule of the state digest (``stateDigestMatches``): the loaded state is the state
saved at that step."""

from __future__ import annotations

from pytest_recoverygate.engine.records import Checkpoint, Inc, save_loaded
from pytest_recoverygate.engine.rules.evidence import KillEvidence
from pytest_recoverygate.engine.verdict import Check, FailureReason

__all__ = ["state_digest"]

R = FailureReason


def state_digest(ev: KillEvidence) -> Check | None:
    """``stateDigestMatches``: the digest the replacement reported with
    ``checkpoint_loaded`` equals the digest saved with ``checkpoint_completed`` at that
    step by the run it resumes (the newest such save done by the load: not one of its own,
    :func:`~pytest_recoverygate.engine.records.save_loaded`); a part that differs or is
    missing is named. No load line, or a digest missing on either side, is undecided."""
    inc, resume = ev.inc, ev.settled
    if not ev.spec.state_digest_matches or not ev.trained or inc is None or resume is None:
        return None
    step = resume.loaded
    if step is None:
        return Check(
            "state_digest",
            None,
            "the saved state",
            None,
            "stateDigestMatches needs the replacement to report "
            "checkpoint_loaded(step, digest=…); it reported no checkpoint_loaded",
            R.INCONCLUSIVE,
        )
    saved = save_loaded(ev.ledger.checkpoints, step, inc)
    if inc.loaded_digest is None:
        return Check(
            "state_digest",
            None,
            saved.digest if saved else None,
            None,
            f"stateDigestMatches: the replacement loaded checkpoint {step} without a "
            "digest: pass digest=reporter.state_digest(...) to checkpoint_loaded",
            R.INCONCLUSIVE,
        )
    if saved is None:
        return Check(
            "state_digest",
            None,
            None,
            inc.loaded_digest,
            f"stateDigestMatches: checkpoint {step} was saved without a digest before the "
            "replacement loaded it (or that save was not seen; a save of it after the load "
            "holds the state loaded, so it proves nothing): pass digest= to "
            "checkpoint_completed",
            R.INCONCLUSIVE,
        )
    return _compared(step, saved, inc)


def _compared(step: int, want: Checkpoint, inc: Inc) -> Check:
    """The loaded digest against the saved one; the parts that differ or are missing."""
    if want.digest == inc.loaded_digest:
        return Check(
            "state_digest",
            True,
            want.digest,
            inc.loaded_digest,
            f"the loaded state equals the state saved at step {step}",
        )
    differ = [
        name for name, value in inc.loaded_parts if dict(want.parts).get(name) not in (None, value)
    ]
    missing = [name for name, _ in want.parts if name not in dict(inc.loaded_parts)]
    what = (
        ", ".join(
            [f"{name} state differs" for name in differ]
            + [f"{name} state missing" for name in missing]
        )
        or "the digests differ"
    )
    return Check(
        "state_digest",
        False,
        want.digest,
        inc.loaded_digest,
        f"loaded checkpoint {step} but the state differs from the one saved at step {step}: {what}",
        R.STATE_DIFFERS,
    )
