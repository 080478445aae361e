"""The suite's patience (tests/patience.py): one slack factor, one wait, no other timeouts.

We test these aspects:
- the slack: ``RECOVERYGATE_TEST_SLACK`` wins and is checked (a number >= 1); without it,
  the load average per usable core, never below 1 and never above ``MAX_SLACK``;
- ``within`` and ``deadline`` stretch a budget by the slack now;
- ``eventually`` returns what the predicate found, asks once more at the deadline, fails
  naming what it waited for, the budget, the slack and what was seen, and stretches its
  budget when the load rises during the wait (on a simulated clock: no test here sleeps
  for a budget);
- ``stays`` passes while its predicate holds and fails the moment it does not;
- the suite itself: no test module outside patience.py carries a literal timeout, sleep
  or deadline (the job scripts the tests run, and the fake servers' own timers, are the
  world, not the tests' patience; a line that is not a wait says so: ``# not a wait``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from tests import patience


class FakeClock:
    """A clock that moves only when paused on."""

    def __init__(self) -> None:
        self.t = 0.0
        self.pauses = 0

    def now(self) -> float:
        return self.t

    def pause(self, seconds: float) -> None:
        self.pauses += 1
        self.t += seconds


@pytest.fixture
def no_slack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(patience.SLACK_ENV, "1")


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The one-minute load average the module reads (settable), on 2 usable cores."""
    monkeypatch.delenv(patience.SLACK_ENV, raising=False)
    value = [0.0]
    monkeypatch.setattr(os, "getloadavg", lambda: (value[0], 0.0, 0.0))
    monkeypatch.setattr(patience, "_cores", lambda: 2)
    return value


# --------------------------------------------------------------------------- slack


def test_the_slack_is_the_load_per_core_never_below_one_nor_above_the_cap(
    load: list[float],
) -> None:
    load[0] = 0.5
    assert patience.slack() == 1.0
    load[0] = 5.0
    assert patience.slack() == 2.5
    load[0] = 100.0
    assert patience.slack() == patience.MAX_SLACK


def test_the_environment_sets_the_slack(monkeypatch: pytest.MonkeyPatch, load: list[float]) -> None:
    load[0] = 9.0
    monkeypatch.setenv(patience.SLACK_ENV, "3")
    assert patience.slack() == 3.0
    assert patience.within(10) == 30.0
    monkeypatch.setenv(patience.SLACK_ENV, "1")
    assert patience.slack() == 1.0  # the load is then ignored


def test_the_header_says_where_the_slack_comes_from(
    monkeypatch: pytest.MonkeyPatch, load: list[float]
) -> None:
    load[0] = 3.0
    assert patience.describe() == (
        "slack 1.50 now (load 3.00 on 2 core(s); RECOVERYGATE_TEST_SLACK sets it)"
    )
    monkeypatch.setenv(patience.SLACK_ENV, "2.5")
    assert patience.describe() == "slack 2.5 (RECOVERYGATE_TEST_SLACK)"


@pytest.mark.parametrize("given", ["0.5", "fast", "nan", "inf", "-2"])
def test_a_slack_that_is_not_a_number_of_at_least_one_is_an_error(
    monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    monkeypatch.setenv(patience.SLACK_ENV, given)
    with pytest.raises(ValueError, match=f"RECOVERYGATE_TEST_SLACK={given!r}: expected a number"):
        patience.slack()


def test_a_deadline_is_the_stretched_budget_from_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(patience.SLACK_ENV, "2")
    before = time.time()
    got = patience.deadline(patience.PROCESS)
    assert before + 2 * patience.PROCESS <= got <= time.time() + 2 * patience.PROCESS


# --------------------------------------------------------------------------- eventually


def test_eventually_returns_what_the_predicate_found(no_slack: None) -> None:
    clock = FakeClock()
    answers = iter([None, [], ["found"]])
    got = patience.eventually(lambda: next(answers), "a thing", now=clock.now, pause=clock.pause)
    assert got == ["found"] and clock.pauses == 2


def test_eventually_fails_naming_the_wait_the_budget_the_slack_and_what_was_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(patience.SLACK_ENV, "2")
    clock = FakeClock()
    with pytest.raises(patience.Timeout) as caught:
        patience.eventually(
            lambda: False,
            "replacement worker",
            5,
            seen=lambda: ["gone"],
            now=clock.now,
            pause=clock.pause,
        )
    assert str(caught.value) == (
        "no replacement worker within 5 s x slack 2.00 = 10.0 s; seen: ['gone']"
    )
    assert clock.t == pytest.approx(10.0, abs=patience.POLL)
    assert isinstance(caught.value, AssertionError)  # pytest reads it as a failed assert


def test_eventually_asks_once_more_at_the_deadline(no_slack: None) -> None:
    clock = FakeClock()
    late: list[float] = []

    def arrives_in_the_last_pause() -> bool:
        if clock.t >= 1.0:
            late.append(clock.t)
        return len(late) == 2  # the second ask past the deadline: the one more

    found = patience.eventually(  # a pause of 1/8 s: the clock hits the deadline exactly
        arrives_in_the_last_pause, "x", 1.0, interval=0.125, now=clock.now, pause=clock.pause
    )
    assert found and late == [1.0, 1.0]


def test_a_load_that_rises_during_a_wait_stretches_it(load: list[float]) -> None:
    clock = FakeClock()

    def rising(done_at: float | None) -> bool:
        if clock.t >= 9.0:
            load[0] = 6.0  # slack 3 from here on
        return done_at is not None and clock.t >= done_at

    assert patience.eventually(lambda: rising(25.0), "x", 10, now=clock.now, pause=clock.pause)
    load[0], clock.t = 0.0, 0.0
    with pytest.raises(patience.Timeout, match="slack 3.00 = 30.0 s"):
        patience.eventually(lambda: rising(None), "y", 10, now=clock.now, pause=clock.pause)
    assert clock.t == pytest.approx(30.0, abs=patience.POLL)


def test_gather_collects_until_the_collection_is_enough(no_slack: None) -> None:
    polls = iter([[1], [], [2, 3], [4]])
    assert patience.gather(lambda: next(polls), lambda got: 3 in got, "a 3") == [1, 2, 3]


def test_gather_fails_with_what_it_collected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(patience.SLACK_ENV, "1")
    monkeypatch.setattr(patience, "eventually", _on_a_fake_clock(patience.eventually))
    with pytest.raises(patience.Timeout, match=r"no a 3 within .*; seen: \[1, 2\]"):
        patience.gather(iter([[1], [2]] + [[]] * 10_000).__next__, lambda got: 3 in got, "a 3")


def _on_a_fake_clock(wait: Any) -> Any:
    clock = FakeClock()
    return lambda *a, **k: wait(*a, **k, now=clock.now, pause=clock.pause)


# --------------------------------------------------------------------------- stays


def test_stays_passes_while_the_predicate_holds(no_slack: None) -> None:
    asked: list[int] = []

    def holds() -> bool:
        asked.append(1)
        return True

    patience.stays(holds, "alive", during=0.02)
    assert len(asked) >= 2


def test_stays_fails_the_moment_the_predicate_does_not_hold(no_slack: None) -> None:
    answers = iter([True, False])
    with pytest.raises(AssertionError, match="the victim runs: no longer so"):
        patience.stays(lambda: next(answers), "the victim runs", during=60)
