"""The one retry helper and the one idempotent-cleanup helper every backend uses.

We test these aspects: a read is retried on a transient error with growing, jittered
waits, honours a Retry-After, gives up after its attempts or before a wait would pass the
deadline, and never retries what is not transient; a destructive action is sent again only
while its failure proves it never acted, and every other failure reaches the caller after
exactly one send; ``cleanup_once`` runs a cleanup once, however often and from however
many threads it is called.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from pytest_recoverygate.registry.seams import cleanup_once
from pytest_recoverygate.shared.retry import RetryPolicy, retry_after, retry_read, send_destructive


class Transient(Exception):
    pass


class Refused(Exception):
    """Stands in for a 429 or a refused connection: proof that nothing acted."""


class WithHeaders(Exception):
    def __init__(self, retry_after: str) -> None:
        super().__init__("slow down")
        self.headers = {"Retry-After": retry_after}


def failing(
    times: int, error: Exception, result: str = "ok"
) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return result

    return calls, call


def test_a_read_is_retried_until_it_answers() -> None:
    calls, call = failing(2, Transient("hiccup"))
    slept: list[float] = []

    got = retry_read(
        call,
        transient=lambda e: isinstance(e, Transient),
        policy=RetryPolicy(attempts=4, base=0.5, cap=4.0, jitter=False),
        sleep=slept.append,
    )

    assert got == "ok"
    assert len(calls) == 3
    assert slept == [0.5, 1.0]  # exponential from base


def test_a_read_gives_up_after_its_attempts_with_the_last_error() -> None:
    calls, call = failing(10, Transient("still down"))

    with pytest.raises(Transient, match="still down"):
        retry_read(
            call,
            transient=lambda e: isinstance(e, Transient),
            policy=RetryPolicy(attempts=3),
            sleep=lambda _: None,
        )
    assert len(calls) == 3


def test_an_error_that_is_not_transient_is_never_retried() -> None:
    calls, call = failing(1, ValueError("bad request"))

    with pytest.raises(ValueError, match="bad request"):
        retry_read(call, transient=lambda e: False, policy=RetryPolicy(), sleep=lambda _: None)
    assert len(calls) == 1


def test_a_read_never_waits_past_its_deadline() -> None:
    calls, call = failing(10, Transient("down"))

    with pytest.raises(Transient):
        retry_read(
            call,
            transient=lambda e: True,
            policy=RetryPolicy(attempts=10, base=5.0, jitter=False),
            deadline=103.0,
            now=lambda: 100.0,
            sleep=lambda _: pytest.fail("it waited past the deadline"),
        )
    assert len(calls) == 1


def test_waits_are_jittered_within_their_upper_half_and_capped() -> None:
    policy = RetryPolicy(base=1.0, cap=3.0)
    waits = [policy.wait(attempt) for attempt in (1, 2, 3, 4, 5) for _ in range(50)]
    assert all(0.5 <= w <= 3.0 for w in waits)
    assert max(policy.wait(9) for _ in range(50)) <= 3.0  # not a wait: attempt 9
    assert len({round(w, 6) for w in waits}) > 10  # not all in step


def test_a_retry_after_is_honoured_up_to_its_cap() -> None:
    policy = RetryPolicy(retry_after_cap=5.0)
    assert policy.wait(1, WithHeaders("2")) == 2.0
    assert policy.wait(1, WithHeaders("120")) == 5.0
    assert retry_after(WithHeaders("Wed, 21 Oct 2015 07:28:00 GMT")) is None
    assert retry_after(Transient()) is None
    assert policy.scaled(0.01).wait(1, WithHeaders("2")) == pytest.approx(0.02)


def test_a_destructive_action_is_sent_again_only_while_it_never_acted() -> None:
    calls, call = failing(2, Refused("429"))

    got = send_destructive(
        call,
        never_acted=lambda e: isinstance(e, Refused),
        policy=RetryPolicy(attempts=4),
        sleep=lambda _: None,
    )

    assert got == "ok"
    assert len(calls) == 3


def test_a_destructive_action_that_may_have_acted_is_sent_exactly_once() -> None:
    calls, call = failing(1, TimeoutError("no answer"))

    with pytest.raises(TimeoutError):
        send_destructive(
            call,
            never_acted=lambda e: isinstance(e, Refused),
            policy=RetryPolicy(attempts=4),
            sleep=lambda _: pytest.fail("a timeout must not be followed by a second send"),
        )
    assert len(calls) == 1


def test_refusals_stop_after_the_attempts_with_the_refusal() -> None:
    calls, call = failing(10, Refused("429"))

    with pytest.raises(Refused):
        send_destructive(
            call,
            never_acted=lambda e: True,
            policy=RetryPolicy(attempts=4),
            sleep=lambda _: None,
        )
    assert len(calls) == 4


def test_cleanup_once_runs_the_cleanup_once_from_any_number_of_threads() -> None:
    class Backend:
        def __init__(self) -> None:
            self.runs = 0

        @cleanup_once
        def cleanup(self) -> None:
            self.runs += 1

    backend, other = Backend(), Backend()
    threads = [threading.Thread(target=backend.cleanup) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    backend.cleanup()

    assert backend.runs == 1
    assert other.runs == 0  # the flag is per object
    other.cleanup()
    assert other.runs == 1


def test_cleanup_once_does_not_run_again_after_a_failure() -> None:
    class Backend:
        runs = 0

        @cleanup_once
        def cleanup(self) -> None:
            Backend.runs += 1
            raise RuntimeError("could not end pid 42")

    backend = Backend()
    with pytest.raises(RuntimeError):
        backend.cleanup()
    backend.cleanup()
    assert Backend.runs == 1
