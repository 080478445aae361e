"""A replacement that saves the step it just loaded: what that save proves, and what not.

Many loops save at their top (``if step % N == 0: save(step)`` before the step is
trained), so a replacement that resumed from step 20 writes checkpoint 20 again from the
state it loaded. That save holds what was loaded, not what the killed run saved: held
against it, any loaded state matches. An independent adversarial review found two false
PASSes that way (the reporting rank's digest, another rank's shard) and a StickyFault that
took a damaged state saved again for an intact copy; and a wrong first reason for a
replacement that loaded a valid ``latest`` checkpoint and died before its first step.
We test these aspects, on the engine with the shared event builder:

- the loaded digest is held to the save of that step durable by the load, made by the
  run it resumes: a wrong optimizer state saved again by the replacement still FAILs
  ``STATE_DIFFERS`` (and a right one still PASSes);
- so is another rank's shard, whatever that rank's replacement saves afterwards;
- a damaged checkpoint loaded, saved again and loaded by the next replacement is a
  corrupt load, not an intact copy;
- a replacement that loaded a checkpoint durable by its load (``latest``: a save that
  became durable after it started was not there to load) and failed before a step
  stopped progressing; it did not resume from an older checkpoint;
- a named resume step (``step-25``) whose save the kill cut is no PASS when loaded: a
  torn file or a late report, undecided as under ``latest`` (a second review's find).
"""

from __future__ import annotations

from pytest_recoverygate.engine.machine import DrillEngine, Finish, Verdict
from pytest_recoverygate.engine.model import GroupEvent, TrainingEvent
from pytest_recoverygate.engine.verdict import DrillResult, FailureReason
from tests.engine_events import ST, T0, C, G, L, P, S, ev, group_ev
from tests.test_engine import drive, engine_for, old_run, spec
from tests.test_engine_sticky import comes_back, damaged_at_20

R = FailureReason
OPTIMIZER_LOST = (("model", "m20"), ("optimizer", "FRESH"))
Events = list[TrainingEvent | GroupEvent]


def judge(engine: DrillEngine, events: Events) -> DrillResult:
    """Feed the events (training and group), then the deadline: the one result."""
    finishes: list[Finish] = []
    for event in events:
        if isinstance(event, TrainingEvent):
            actions = engine.on_training_event(event)
        else:
            actions = engine.on_group_event(event)
        finishes += [a for a in actions if isinstance(a, Finish)]
    if not finishes:
        finishes = [a for a in engine.tick(T0 + 200.0) if isinstance(a, Finish)]
    assert len(finishes) == 1
    return finishes[0].result


def digested_run(engine: DrillEngine) -> None:
    """Steps 1..25, checkpoints 10 and 20 with their digests (parts model, optimizer);
    the kill at 2.5 s."""
    events = [
        ev(
            C,
            e.timestamp - T0,
            "old",
            e.step,
            digest=f"d{e.step}",
            digest_parts=(("model", f"m{e.step}"), ("optimizer", f"o{e.step}")),
        )
        if e.kind is C
        else e
        for e in old_run(25)
    ]
    drive(engine, events, kill_at=2.5)


def resumed(digest: str, parts: tuple[tuple[str, str], ...], *, saves_again: bool) -> Events:
    """The replacement loads 20 with ``digest``; it may save 20 again at its loop's top."""
    events: Events = [
        ev(S, 5.0, "new"),
        ev(L, 5.5, "new", 20, digest=digest, digest_parts=parts),
    ]
    if saves_again:
        events += [
            ev(ST, 5.55, "new", 20),
            ev(C, 5.6, "new", 20, digest=digest, digest_parts=parts),
        ]
    return events + [ev(P, 6.0 + 0.1 * i, "new", 21 + i) for i in range(4)]


def test_a_wrong_state_saved_again_by_the_replacement_still_differs() -> None:
    for saves_again in (False, True):
        engine = engine_for(state_digest_matches=True)
        digested_run(engine)
        result = judge(engine, resumed("d-lost", OPTIMIZER_LOST, saves_again=saves_again))
        assert result.verdict is Verdict.FAIL, result.summary
        assert result.reasons == (R.STATE_DIFFERS,), result.summary
        assert "optimizer state differs" in result.summary


def test_the_right_state_saved_again_passes() -> None:
    engine = engine_for(state_digest_matches=True)
    digested_run(engine)
    parts = (("model", "m20"), ("optimizer", "o20"))
    result = judge(engine, resumed("d20", parts, saves_again=True))
    assert result.verdict is Verdict.PASS, result.summary
    check = next(c for c in result.checks if c.name == "state_digest")
    assert check.passed is True and check.expected == "d20"


def test_another_rank_s_wrong_shard_saved_again_still_differs() -> None:
    engine = DrillEngine(spec(state_digest_matches=True, all_ranks=True), T0)
    engine.discovered(T0, "job", ranks=(0, 1))
    events = [ev(S, 0.0, "old"), ev(S, 0.0, "old1", rank=1)]
    for e in old_run(25, start=False):
        events.append(
            ev(C, e.timestamp - T0, "old", e.step, digest=f"r0-{e.step}") if e.kind is C else e
        )
        if e.kind is C:
            events.append(ev(C, e.timestamp - T0, "old1", e.step, rank=1, digest=f"r1-{e.step}"))
    drive(engine, events, kill_at=2.5)
    result = judge(
        engine,
        [
            ev(S, 5.0, "new"),
            ev(S, 5.0, "new1", rank=1),
            ev(L, 5.5, "new", 20, digest="r0-20"),
            ev(L, 5.5, "new1", 20, rank=1, digest="r1-wrong"),
            ev(C, 5.6, "new1", 20, rank=1, digest="r1-wrong"),  # rank 1 saves 20 again
            *[ev(P, 6.0 + 0.1 * i, "new", 21 + i) for i in range(4)],
        ],
    )
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.reasons == (R.STATE_DIFFERS,), result.summary
    assert "rank 1 loaded checkpoint 20 but its state differs" in result.summary


def test_a_damaged_state_saved_again_is_no_intact_copy() -> None:
    d, t = damaged_at_20()
    d.group(G.RESTARTING, t + 0.5)
    d.feed(S, t + 1.0, "b")
    d.feed(L, t + 1.1, "b", 20, digest="garbage")  # it read the damage ...
    d.feed(ST, t + 1.15, "b", 20)
    d.feed(C, t + 1.2, "b", 20, digest="garbage")  # ... saved it again, and died
    comes_back(d, t + 2.0, 20, "garbage", inc="c")  # the next one loads that save
    assert d.result is not None and d.result.verdict is Verdict.FAIL, d.engine.status(T0 + t)
    reasons = [c.reason for c in d.result.failed_checks]
    assert reasons[0] is R.LOADED_CORRUPT_CHECKPOINT, d.result.summary


def test_a_latest_load_that_dies_before_a_step_stopped_progressing() -> None:
    for trains in (True, False):
        engine = engine_for()
        drive(engine, [*old_run(25), ev(ST, 2.45, "old", 25)], kill_at=2.5)
        events: Events = [
            ev(S, 5.0, "new"),
            ev(C, 5.2, "old", 25),  # the survivor's async save of 25: durable after the start
            ev(L, 5.5, "new", 20),
        ]
        if trains:
            events += [ev(P, 6.0 + 0.1 * i, "new", 21 + i) for i in range(5)]
        else:
            events += [group_ev(G.JOB_FAILED, 7.0, "exit 1")]
        result = judge(engine, events)
        if trains:
            assert result.verdict is Verdict.PASS, result.summary
        else:
            assert result.verdict is Verdict.FAIL
            assert result.reasons == (R.STOPPED_PROGRESSING,), result.summary


def test_a_named_step_whose_save_the_kill_cut_is_undecided_when_loaded() -> None:
    for named in (25, None):
        engine = engine_for(expected_resume_step=named)
        drive(engine, [*old_run(25), ev(ST, 2.45, "old", 25)], kill_at=2.5)
        events: Events = [ev(S, 5.0, "new"), ev(L, 5.5, "new", 25)]
        events += [ev(P, 6.0 + 0.1 * i, "new", 26 + i) for i in range(5)]
        result = judge(engine, events)
        assert result.verdict is Verdict.ERROR, (named, result.summary)
        assert "was cut and never completed" in result.summary
