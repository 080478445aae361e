"""Retries, written once: reads retried with backoff, jitter and Retry-After; destructive
actions sent again only while their failure proves they never acted.

Two backends talk to a server that hiccups: slurmctld (through the Slurm clients) and the
Kubernetes API server. Both follow the same two rules, and this module is where they are:

- a **read** (``list pods``, ``scontrol show job``) that fails transiently is tried again
  (:func:`retry_read`): exponential backoff from :attr:`RetryPolicy.base` up to
  :attr:`RetryPolicy.cap`, each wait drawn from its upper half (jitter, so that drills on
  many machines do not retry in step), a server's ``Retry-After`` honoured up to
  :attr:`RetryPolicy.retry_after_cap`, at most :attr:`RetryPolicy.attempts` tries and
  never a wait past the caller's deadline;
- a **destructive action** (a pod ``DELETE``, ``scancel``, ``scontrol requeue``, the kill
  step) is sent again only while its failure *proves* it never acted
  (:func:`send_destructive`): the connection was refused before the request left, the API
  server's flow control answered 429 before any handler ran, ``srun`` created no step.
  Any other failure -- a timeout, an answer lost on the way back -- may have come after it
  acted, so it goes straight to the caller, which finds out what happened by looking,
  never by asking again.

Both helpers take the error classification from the caller (what is transient, what
proves "never sent" is the backend's knowledge) and do the counting, the waiting and the
giving up. Tests shrink every wait with :attr:`RetryPolicy.scale`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["RetryPolicy", "retry_after", "retry_read", "send_destructive"]

T = TypeVar("T")


def retry_after(error: BaseException | None) -> float | None:
    """The ``Retry-After`` seconds an error carries (HTTP headers, as the Kubernetes
    client's ``ApiException`` has them), or None."""
    headers = getattr(error, "headers", None)
    if not headers:
        return None
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        value = headers.get("Retry-After")
        if value is not None:
            return max(0.0, float(value))
    return None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to try again (see the module docstring)."""

    attempts: int = 4
    base: float = 0.5  # the wait before the second try, in seconds
    cap: float = 4.0  # no wait is longer
    jitter: bool = True  # each wait is drawn from [wait / 2, wait]
    retry_after_cap: float = 5.0  # a server's Retry-After is honoured up to this
    scale: float = 1.0  # multiplies every wait (tests make it small)

    def wait(self, attempt: int, error: BaseException | None = None) -> float:
        """Seconds to wait after failed try number ``attempt`` (1-based)."""
        after = retry_after(error)
        if after is not None:
            return min(after, self.retry_after_cap) * self.scale
        wait = min(self.base * 2.0 ** (attempt - 1), self.cap)
        if self.jitter:
            wait *= 0.5 + random.random() / 2
        return wait * self.scale

    def scaled(self, factor: float) -> RetryPolicy:
        """The same policy with every wait multiplied by ``factor``."""
        return dataclasses.replace(self, scale=self.scale * factor)


def retry_read(
    call: Callable[[], T],
    *,
    transient: Callable[[Exception], bool],
    policy: RetryPolicy,
    deadline: float | None = None,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()`` until it returns; a ``transient`` error is retried per ``policy``.

    Gives up -- re-raising the last error -- after ``policy.attempts`` tries, when the
    error is not transient, or when the next wait would end past ``deadline`` (on the
    ``now`` clock).
    """

    def again(attempt: int, exc: Exception) -> float | None:
        wait = policy.wait(attempt, exc)
        if not transient(exc) or (deadline is not None and now() + wait > deadline):
            return None
        return wait

    return _tries(call, again, policy.attempts, sleep)


def send_destructive(
    call: Callable[[], T],
    *,
    never_acted: Callable[[Exception], bool],
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Send a destructive action; send it again only while its failure proves it never
    acted (``never_acted``), at most ``policy.attempts`` times in all.

    Every other failure is re-raised at once: the action may have acted, and sending it
    again could act twice (requeue the replacement, delete what came after).
    """

    def again(attempt: int, exc: Exception) -> float | None:
        return policy.wait(attempt, exc) if never_acted(exc) else None

    return _tries(call, again, policy.attempts, sleep)


def _tries(
    call: Callable[[], T],
    again: Callable[[int, Exception], float | None],
    attempts: int,
    sleep: Callable[[float], None],
) -> T:
    """``call()`` up to ``attempts`` times; after a failure, ``again`` gives the wait
    before the next try, or None to re-raise it now."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except Exception as exc:
            wait = again(attempt, exc) if attempt < attempts else None
            if wait is None:
                raise
            sleep(wait)
