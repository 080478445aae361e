"""The rule of every rank: each rank of the replacement group loaded the expected step
(and, with ``stateDigestMatches``, the state it saved there)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_recoverygate.engine.records import Inc, save_loaded
from pytest_recoverygate.engine.rules.evidence import KillEvidence
from pytest_recoverygate.engine.verdict import Check, FailureReason

__all__ = ["all_ranks_resumed"]

R = FailureReason


@dataclass(slots=True)
class _Tally:
    """What the ranks showed, rank by rank."""

    states: list[dict[str, Any]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    unchecked: list[int] = field(default_factory=list)  # said nothing about its resume
    undigested: list[int] = field(default_factory=list)  # loaded; its digest never seen
    reason: FailureReason | None = None

    def fail(self, message: str, reason: FailureReason) -> None:
        self.failed.append(message)
        self.reason = self.reason or reason


def _wrong_step(loaded: int, expected: int) -> FailureReason:
    if loaded == 0:
        return R.RESTARTED_FROM_SCRATCH
    return (
        R.RESUMED_FROM_OLDER_CHECKPOINT
        if loaded < expected
        else R.RESUMED_FROM_UNEXPECTED_CHECKPOINT
    )


def _loaded(ev: KillEvidence, tally: _Tally, rank: int, o: Inc, state: dict[str, Any]) -> bool:
    """A rank that loaded a step: the step, then its shard's digest; False: unchecked."""
    expected, floor = ev.expected, None if ev.explicit else ev.floor
    assert expected is not None
    ledger, spec, kill = ev.ledger, ev.spec, ev.kill
    state["loaded"] = o.loaded
    # The judged rank's own check decides whether the step it loaded was right; a rank
    # that loaded that same step is consistent with it.
    same = kill.resume is not None and o.loaded == kill.resume.loaded
    ok = o.loaded == expected or same
    if not ok and floor is not None and o.loaded is not None and o.loaded_at is not None:
        durable = {c.step for c in ledger.checkpoints if c.time <= o.loaded_at}
        ok = o.loaded in durable and o.loaded >= floor
    if not ok:
        assert o.loaded is not None
        tally.fail(
            f"rank {rank} loaded step {o.loaded}, expected step {expected}",
            _wrong_step(o.loaded, expected),
        )
    elif spec.state_digest_matches:
        assert o.loaded is not None
        saved = save_loaded(ledger.rank_saves.get(rank, {}).get(o.loaded, []), o.loaded, o)
        if saved is None or saved.digest is None or o.loaded_digest is None:
            # Its shard's digest at that step was never seen before the load (the kill
            # came first, or no digest=; its own save after the load proves nothing):
            # the state cannot be compared.
            return False
        state["digestMatches"] = saved.digest == o.loaded_digest
        if saved.digest != o.loaded_digest:
            ok = False
            tally.fail(
                f"rank {rank} loaded checkpoint {o.loaded} but its state differs "
                "from the shard it saved at that step",
                R.STATE_DIFFERS,
            )
    state["status"] = "ok" if ok else "failed"
    return True


def _group_ranks(ev: KillEvidence, judged: Inc) -> set[int]:
    """The ranks of the replacement group: every rank seen, below the world size the
    judged replacement's start line gave (a group that shrank has no rank past it: an
    elastic job going on without a node)."""
    ledger = ev.ledger
    known = set(ev.ranks) | {o.rank for o in ledger.others.values() if o.rank is not None}
    size = judged.world_size
    return {rank for rank in known if size is None or rank < size}


def _tally(ev: KillEvidence, judged: Inc) -> _Tally:
    ledger, kill, expected = ev.ledger, ev.kill, ev.expected
    known = _group_ranks(ev, judged)
    known.discard(judged.rank if judged.rank is not None else -1)
    tally = _Tally()
    for rank in sorted(known):
        new = [
            o
            for o in ledger.others.values()
            if o.rank == rank and o.born == kill.index and not ledger.is_child(o)
        ]
        # The rank's newest process is its member of the group (an older one died).
        newest = max(new, key=lambda o: o.first_seen) if new else None
        state: dict[str, Any] = {"rank": rank, "expected": expected}
        if newest is not None and newest.loaded is not None:
            if not _loaded(ev, tally, rank, newest, state):
                state["status"] = "unchecked"
                tally.undigested.append(rank)
        elif newest is not None and newest.first_line is not None:
            state["status"] = "failed"
            tally.fail(
                f"rank {rank} loaded no checkpoint: its replacement saved again without "
                "reporting checkpoint_loaded (its state was re-initialised?)",
                R.RESTARTED_FROM_SCRATCH,
            )
        else:
            state["status"] = "unchecked"
            tally.unchecked.append(rank)
        tally.states.append(state)
    return tally


def _quiet(tally: _Tally) -> str:
    """Why the unchecked ranks are unchecked: silent, or their digest never seen."""
    parts = []
    if tally.unchecked:
        parts.append(
            f"rank(s) {', '.join(map(str, tally.unchecked))} reported no checkpoint_loaded "
            "after the kill, so their state is unchecked (report checkpoint_loaded on every "
            "rank: the reporter prints it on every rank)"
        )
    if tally.undigested:
        parts.append(
            f"rank(s) {', '.join(map(str, tally.undigested))} loaded a checkpoint whose saved "
            "or loaded digest was never seen, so their state is unchecked (pass digest= to "
            "checkpoint_completed and checkpoint_loaded on every rank)"
        )
    return "; ".join(parts)


def _loaded_text(
    states: Sequence[dict[str, Any]], expected: int, judged: int | None, floor: int | None
) -> str:
    """What the checked ranks loaded, from their entries: ``rank(s) 1, 2 loaded step 20``,
    with why a step other than the expected one was accepted ("" when none was checked)."""
    loaded_by: dict[int, list[int]] = {}
    for state in states:
        if state.get("status") == "ok":
            loaded_by.setdefault(state["loaded"], []).append(state["rank"])
    return "; ".join(
        f"rank(s) {', '.join(map(str, ranks))} loaded step {step}"
        + (
            ""
            if step == expected
            else " (the judged rank's step)"
            if step == judged
            else f" (a checkpoint durable before its load, no older than step {floor})"
        )
        for step, ranks in sorted(loaded_by.items())
    )


def all_ranks_resumed(ev: KillEvidence) -> Check | None:
    """Every other rank of the replacement group loaded the expected step (its own
    ``checkpoint_loaded``: its shard, its RNG or data-loader state), and with
    ``stateDigestMatches`` the digest it saved there; with ``latest`` a checkpoint durable
    before its own load and no older than the floor, or the judged rank's own step. A
    rank that loaded another step, or none before it saved again, fails with the rank
    named; a rank that says nothing, or whose saved or loaded digest was never seen, is
    unchecked (a FAIL with ``expectations.allRanks``). The message names the step each
    checked rank loaded, from its own entry; when no other rank said what it loaded the
    check verified nothing: *not checked* (``checked`` false; it neither passes nor fails
    the drill). Its observed value lists each rank's state (also the report's
    ``faultDetails.ranks``). A group that shrank (the replacement's start line gives a
    smaller world size) is held to the ranks it has."""
    inc, expected, spec = ev.inc, ev.expected, ev.spec
    if inc is None or len(_group_ranks(ev, inc)) <= 1 or expected is None:
        return None
    tally = _tally(ev, inc)
    states, failed = tally.states, tally.failed
    unchecked = tally.unchecked + tally.undigested
    if not states:
        return None
    quiet = _quiet(tally)
    if failed or (unchecked and spec.all_ranks):
        messages = failed + (
            [quiet + " and expectations.allRanks is set"] if unchecked and spec.all_ranks else []
        )
        return Check(
            "all_ranks_resumed",
            False,
            f"every rank loaded step {expected}",
            states,
            "; ".join(messages),
            tally.reason or R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
        )
    judged = ev.kill.resume.loaded if ev.kill.resume is not None else None
    said = _loaded_text(states, expected, judged, None if ev.explicit else ev.floor)
    return Check(
        "all_ranks_resumed",
        True,
        f"every rank loaded step {expected}",
        states,
        (said + (f"; {quiet}" if quiet else "")) if said else f"not checked: {quiet}",
        checked=bool(said),  # no other rank said what it loaded: nothing was verified
    )
