"""The pod-log reader drops lines it has seen in bounded memory, O(1) per line (issue 41, 9).

Every Kubernetes drill streams the reporting rank's pod log and reopens it with
``sinceSeconds`` overlapping what it read, so re-sent lines must be dropped. It kept
every line of the last 600 s (up to 1 MiB each) to do that, and rebuilt the whole set on
each new line past 10,000 entries: 3.8-8 ms per line at 12k-42k entries, 94 MiB for 15 s
of 64 KiB lines. We test these aspects, on :class:`LogStream`'s own line handler:

- memory: 12,000 distinct 1 KiB lines within the window leave the reader holding a
  fixed amount (the kept log's own 1 MiB cap aside), not the lines;
- work: what the reader holds to drop re-sent lines does not grow with the lines read
  (a constant number of digests, whatever the count);
- what is dropped: a reopened stream's overlap, the backlog sent again newest first, the
  same line at the same nanosecond sent again; what is not: distinct lines sharing a
  nanosecond, another pod's lines, a kubelet timestamp with its trailing zeros trimmed
  told apart from a later one.
"""

from __future__ import annotations

import gc
import tracemalloc
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any, cast

from pytest_recoverygate.orchestrators.kubernetes.api import ApiSession
from pytest_recoverygate.orchestrators.kubernetes.logs import LogStream, kubelet_ns
from pytest_recoverygate.shared.clock import SimulatedClock

BASE = datetime(2026, 11, 29, 11, 47, 14, tzinfo=timezone.utc).timestamp()
POD = ("pod-log", "uid-1")


def stamp(ns_after: int) -> str:
    """A kubelet timestamp ``ns_after`` nanoseconds after BASE, trailing zeros trimmed."""
    seconds, ns = divmod(ns_after, 1_000_000_000)
    whole = datetime.fromtimestamp(BASE + seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{ns:09d}".rstrip("0")
    return f"{whole}.{fraction}Z" if fraction else f"{whole}Z"


def line(ns_after: int, text: str) -> bytes:
    return f"{stamp(ns_after)} {text}".encode()


def reader() -> LogStream:
    session = cast(ApiSession, SimpleNamespace(clock=SimulatedClock()))
    return LogStream(session, reporting_rank=0, container=None, reporting_pod=lambda: None)


def feed(stream: LogStream, lines: list[bytes], key: Any = POD) -> list[bool]:
    return [stream._feed_line(raw, key) for raw in lines]


def test_twelve_thousand_lines_in_the_window_leave_bounded_memory() -> None:
    stream = reader()
    body = "x" * 1024
    lines = [line(n * 10_000_000, f"step {n} {body}") for n in range(12_000)]  # 120 s
    feed(stream, lines[:100])  # the kept log and the parser are warm
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert all(feed(stream, lines[100:]))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()

    # the kept log is capped at 1 MiB per pod; what drops re-sent lines is a few digests
    assert held < 3 * 1024 * 1024, f"{held / 2**20:.1f} MiB held for 12,000 lines of 1 KiB"


def test_what_drops_re_sent_lines_does_not_grow_with_the_lines_read() -> None:
    stream = reader()
    sizes = []
    for chunk in range(4):
        feed(stream, [line((chunk * 5_000 + n) * 1_000_000, f"l{n}") for n in range(5_000)])
        sizes.append(stream._seen.size())
    assert sizes == [1, 1, 1, 1]


def test_a_reopened_stream_drops_its_overlap_and_a_backwards_backlog() -> None:
    stream = reader()
    first = [line(n * 1_000_000, f"line {n}") for n in range(100)]
    assert all(feed(stream, first))

    overlap = first[60:] + [line((100 + n) * 1_000_000, f"line {100 + n}") for n in range(5)]
    assert feed(stream, overlap) == [False] * 40 + [True] * 5
    assert feed(stream, list(reversed(first[-10:]))) == [False] * 10


def test_one_nanosecond_holds_distinct_lines_and_drops_a_repeat() -> None:
    stream = reader()
    same = [line(5, "a"), line(5, "b"), line(5, "c")]
    assert feed(stream, same) == [True, True, True]
    assert feed(stream, same) == [False, False, False]
    assert feed(stream, [line(5, "d"), line(6, "a")]) == [True, True]


def test_another_pods_lines_are_its_own() -> None:
    stream = reader()
    assert all(feed(stream, [line(n * 1_000_000_000, f"old {n}") for n in range(10)]))
    # the replacement's clock is a little behind: its lines are new all the same
    replacement = [line(n * 1_000_000_000 + 1, f"new {n}") for n in range(5, 10)]
    assert all(feed(stream, replacement, key=("pod-log", "uid-2")))


def test_a_timestamp_with_trimmed_zeros_is_read_to_the_nanosecond() -> None:
    assert stamp(100_000_000) == "2026-11-29T11:47:14.1Z"
    assert kubelet_ns(stamp(100_000_000)) + 1 == kubelet_ns(stamp(100_000_001))
    stream = reader()
    assert feed(stream, [line(100_000_000, "a"), line(100_000_001, "a")]) == [True, True]
