"""A process without a rank never stands for the reporting rank (issue 41, item 6).

Ray's driver prints every line of its workers; before issue 41 the evidence hook matched
those lines in the driver too, which reported them as its own, without a rank. Read
from the driver's output (the Ray backend's fallback for a cluster on other hosts), the
engine then saw each worker line twice: once from the worker (rank 0) and once from the
driver (no rank), the driver's copy stamped a little later and going on after the kill
with the replacement's lines. We test these aspects on that stream, engine only:

- a good resume with ``replay: exact`` PASSes (it was ERROR: the driver, whose last line
  was the newest, was taken for the killed run, its steps reported twice);
- the driver's lines are counted and noted, not evidence; a job whose processes all lack
  a rank (a plain ``python train.py``) is judged on them as before;
- the replay reference is the rank's process whose last line *before the kill* is the
  newest, not one that kept printing after it.
"""

from __future__ import annotations

from pytest_recoverygate.engine.machine import DrillEngine, Finish
from pytest_recoverygate.engine.model import TrainingEvent
from pytest_recoverygate.engine.rules.replay import reference
from pytest_recoverygate.engine.spec import ReplaySpec
from pytest_recoverygate.engine.verdict import DrillResult, Verdict
from tests.engine_events import T0, C, L, P, S, ev
from tests.test_engine_patterns import drive, engine_for

EXACT = ReplaySpec("exact")
KILL = 2.6  # seconds after T0: the first run printed step 25 at 2.55
RELAY_LAG = 0.02  # the driver prints a worker's line that much later


def loss(step: int) -> float:
    return 1.0 / step  # a deterministic job: the same loss at the same step


def worker(inc: str, t0: float, steps: range, *, loaded: int | None = None) -> list[TrainingEvent]:
    events = [ev(S, t0, inc, rank=0)]
    t = t0 + 0.05
    if loaded is not None:
        events.append(ev(L, t, inc, loaded, rank=0))
    for step in steps:
        t += 0.1
        events.append(ev(P, t, inc, step, rank=0, loss=loss(step)))
        if step % 10 == 0:
            events.append(ev(C, t + 0.001, inc, step, rank=0))
    return events


def relayed(events: list[TrainingEvent], inc: str = "driver") -> list[TrainingEvent]:
    """The driver's copy: the same lines, no rank, a little later."""
    return [
        TrainingEvent(
            e.kind,
            e.timestamp + RELAY_LAG,
            inc,
            step=e.step,
            rank=None,
            loss=e.loss,
        )
        for e in events
    ]


def judged(engine: DrillEngine, events: list[TrainingEvent]) -> DrillResult:
    """The verdict, the kill landing at ``KILL`` (the trigger is checkpoint 20)."""
    finishes = drive(engine, events, kill_at=KILL)
    if not finishes:
        finishes = [a for a in engine.tick(T0 + 10_000.0) if isinstance(a, Finish)]
    assert len(finishes) == 1, finishes
    return finishes[0].result


def ray_stream() -> list[TrainingEvent]:
    old = worker("w0", 0.0, range(1, 26))  # steps 1-25, checkpoints 10 and 20; killed at 3.0
    new = worker("w0b", 4.0, range(21, 36), loaded=20)  # the new group redoes 21-25
    both = old + relayed(old) + new + relayed(new)
    return sorted(both, key=lambda e: e.timestamp)


def test_a_good_resume_passes_replay_exact_when_the_driver_relays_every_line() -> None:
    result = judged(engine_for(replay=EXACT), ray_stream())

    assert result.verdict is Verdict.PASS, result.summary
    checks = {c.name: c for c in result.checks}
    assert checks["replay_matches"].passed is True, checks["replay_matches"].message
    assert any("without a rank were ignored" in note for note in result.notes), result.notes


def test_a_job_without_any_rank_is_judged_on_its_lines_as_before() -> None:
    plain = [
        TrainingEvent(e.kind, e.timestamp, e.incarnation, step=e.step, rank=None, loss=e.loss)
        for e in worker("p", 0.0, range(1, 26)) + worker("p2", 4.0, range(21, 36), loaded=20)
    ]
    result = judged(engine_for(replay=EXACT), plain)

    assert result.verdict is Verdict.PASS, result.summary
    assert not any("without a rank" in note for note in result.notes)


def test_the_reference_is_the_newest_line_before_the_kill_not_after() -> None:
    """Two processes of rank 0 before the kill: ``a`` trained up to it; ``x`` printed a few
    early lines, then one after the kill. The killed run is ``a``; ``x`` was taken
    (the newest line of all), and the replay compared the replacement with it."""
    killed = worker("a", 0.0, range(1, 26))
    other = [ev(S, 0.0, "x", rank=0)]
    other += [ev(P, 0.1 * n, "x", n, rank=0, loss=9.0) for n in range(1, 6)]
    other.append(ev(P, 3.5, "x", 26, rank=0, loss=9.0))
    new = worker("b", 4.0, range(21, 36), loaded=20)
    engine = engine_for(replay=EXACT)

    judged(engine, sorted(killed + other + new, key=lambda e: e.timestamp))

    ledger = engine.ledger
    assert reference(ledger, 1, T0 + KILL, ledger.incs["b"]) is ledger.incs["a"]
