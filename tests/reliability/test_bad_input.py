"""Bad input never crashes a drill: log lines through the shared parser, configs via the CLI.

We test these aspects:
- random bytes, cut at random points, through ``recoverygate.wire.StreamParser`` and
  ``StreamEventSource``: never an exception, the same events whatever the chunking,
  bounded buffering, and every sentinel that is not a valid event counted as malformed;
- partial sentinels, NUL bytes, sentinels glued to each other, giant lines;
- a 1 GiB single line fed in 1 MiB chunks is never held whole: the traced memory peak
  stays a few MiB (tracemalloc), with and without a sentinel at its start;
- forged sentinels -- another rank's lines, late lines of the killed incarnation claiming
  a checkpoint -- do not change a drill's verdict or figures;
- malformed lines reach the report (``malformedLines``);
- the CLI answers a directory, non-UTF-8 bytes, a YAML bomb, huge numbers, negative
  durations and an empty selector with exit 2 and a message naming the problem, never a
  traceback.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recoverygate import wire

from pytest_recoverygate.cli import main
from pytest_recoverygate.config.loading import DrillConfig
from pytest_recoverygate.engine.machine import Verdict
from pytest_recoverygate.engine.model import TrainingEvent
from pytest_recoverygate.orchestrators.fake import FakeEventSource, FakeOrchestrator
from pytest_recoverygate.registry.seams import SimulatedClock
from pytest_recoverygate.runner import RunOptions, run_drill
from pytest_recoverygate.shared.events import StreamEventSource
from tests.reliability.conftest import Figures

FUZZ_EXAMPLES = 400
GIB = 1 << 30
MIB = 1 << 20

INC = "0123456789abcdef"
VALID = wire.format_step("progress", 1_800_000_000.123456, INC, 7, 0).rstrip("\n").encode()
PIECES = [
    VALID,
    b"\n",
    b"\r",
    b"\x00",
    b"RECOVERYGATE/v1",
    b"RECOVERYGATE/v",
    b"RECOVERYGATE/v1 {",
    b'{"event":"progress"',
    b"[default1]:",
    b"2026-11-29T11:47:14.123456789Z ",
    b"0: ",
    b"\xff\xfe",
    "é".encode(),
    b"}",
    b" ",
    b"x" * 5000,
]

byte_soup = st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=64)), max_size=40).map(
    b"".join
)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for point in [*points, len(data)]:
        out.append(data[last:point])
        last = point
    return out


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=byte_soup, cuts=st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=12))
def test_random_bytes_never_crash_the_parser_and_chunking_changes_nothing(
    data: bytes, cuts: list[int], figures: Figures
) -> None:
    whole, whole_bad = wire.parse_text(data)
    parser = wire.StreamParser()
    records: list[wire.Record] = []
    for piece in chunked(data, cuts):
        records += parser.feed(piece)
        assert parser.buffered <= wire.MAX_EVENT_BYTES + len(wire.SENTINEL_BYTES) + 64 * 1024
    records += parser.flush()
    assert records == whole
    assert parser.malformed == whole_bad
    sentinels = data.count(wire.SENTINEL_BYTES)
    assert len(records) + parser.malformed <= sentinels
    figures.add("fuzz_cases")


@settings(max_examples=FUZZ_EXAMPLES // 2, deadline=None)
@given(data=byte_soup)
def test_the_event_source_never_raises_and_counts_what_it_cannot_read(
    data: bytes, figures: Figures
) -> None:
    source = StreamEventSource(clock=lambda: 1.0)
    source.feed(data, stream="a")
    source.end_stream("a")
    events = source.poll()
    _, malformed = wire.parse_text(data)
    assert source.malformed_lines == malformed
    assert all(isinstance(e, TrainingEvent) for e in events)
    source.close()
    figures.add("fuzz_cases")


@pytest.mark.parametrize(
    ("text", "events", "malformed"),
    [
        (b"RECOVERYGATE/v\n", 0, 0),  # not a sentinel at all
        (b"RECOVERYGATE/v1\n", 0, 1),
        (b"RECOVERYGATE/v1 {\n", 0, 1),
        (b'RECOVERYGATE/v1 {"event":"progress"}\n', 0, 1),  # no time, no inc
        (VALID.replace(b"progress", b"progr\x00ss") + b"\n", 0, 1),
        (b"\x00" * 100 + VALID + b"\x00\n", 1, 0),
        (VALID[:-1] + VALID + b"\n", 1, 1),  # a line cut short, glued to the next
        (b"[default1]:" + VALID + b"\r[default0]:" + VALID + b"\n", 2, 0),
        (VALID.replace(b'"step":7', b'"step":-7') + b"\n", 0, 1),
        (VALID.replace(b'"step":7', b'"step":1e999') + b"\n", 0, 1),
        (VALID.replace(b'"step":7', b'"step":' + b"9" * 5000) + b"\n", 0, 1),
    ],
)
def test_partial_sentinels_and_nul_bytes_are_counted_not_fatal(
    text: bytes, events: int, malformed: int, figures: Figures
) -> None:
    records, bad = wire.parse_text(text)
    assert (len(records), bad) == (events, malformed)
    figures.add("fuzz_cases")


@pytest.mark.parametrize("with_sentinel", [False, True], ids=["plain", "after-a-sentinel"])
def test_a_one_gib_line_is_never_held_whole(with_sentinel: bool, figures: Figures) -> None:
    chunk = b"A" * MIB
    source = StreamEventSource(clock=lambda: 1.0)
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        if with_sentinel:
            source.feed(b'RECOVERYGATE/v1 {"event":', stream="giant")
        for _ in range(GIB // MIB):
            source.feed(chunk, stream="giant")
        source.feed(b"\n" + VALID + b"\n", stream="giant")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    events = source.poll()
    assert [e.step for e in events] == [7]  # the line after the giant one is read
    assert source.malformed_lines == (1 if with_sentinel else 0)
    assert peak - base < 8 * MIB, f"peak grew by {(peak - base) / MIB:.1f} MiB for 1 GiB fed"
    source.close()
    figures.add("giant_line_bytes", GIB)


# ---------------------------------------------------------------------- forged sentinels


def forged_source(
    backend: FakeOrchestrator,
    forge: Callable[[list[TrainingEvent]], list[bytes]],
    parsed: StreamEventSource,
) -> FakeEventSource:
    """The fake job's events, plus forged RECOVERYGATE/v1 lines parsed by the real parser."""
    real_poll = backend.events().poll

    def poll() -> list[TrainingEvent]:
        events = real_poll()
        for line in forge(events):
            parsed.feed(line + b"\n", stream="forged")
        return sorted(events + parsed.poll(), key=lambda e: e.timestamp)

    backend.events().poll = poll  # type: ignore[method-assign]
    return backend.events()


def another_rank(events: list[TrainingEvent]) -> list[bytes]:
    """Rank 3 claims huge steps and checkpoints, with incarnations of its own."""
    out = []
    for e in events:
        out.append(
            wire.format_step("progress", e.timestamp, "f" * 16, 10_000 + (e.step or 0), 3).encode()
        )
        out.append(
            wire.format_step("checkpoint_completed", e.timestamp, "e" * 16, 99_999, 3).encode()
        )
    return out


def old_incarnation(events: list[TrainingEvent]) -> list[bytes]:
    """Late lines of the first incarnation (the killed one), stamped after the kill."""
    late = [e for e in events if e.incarnation != "fake-incarnation-0"]
    return [
        wire.format_step(
            "checkpoint_loaded", e.timestamp + 0.001, "fake-incarnation-0", 0, 0
        ).encode()
        for e in late[:3]
    ]


@pytest.mark.parametrize("forge", [another_rank, old_incarnation])
def test_forged_sentinels_do_not_change_the_verdict(
    fake_config: Callable[..., DrillConfig],
    forge: Callable[[list[TrainingEvent]], list[bytes]],
    figures: Figures,
) -> None:
    config = fake_config()

    def drill(forged: bool) -> Any:
        clock = SimulatedClock()
        backend = FakeOrchestrator(
            clock=clock, workers=2, steps_per_second=100, checkpoint_every=20, restart_delay=0.5
        )
        if forged:
            forged_source(backend, forge, StreamEventSource(clock=clock.now))
        return run_drill(config, RunOptions(), clock=clock, orchestrator=backend)

    honest, forged = drill(False), drill(True)
    assert honest.verdict is Verdict.PASS
    assert (forged.verdict, forged.resume_step, forged.expected_resume_step) == (
        honest.verdict,
        honest.resume_step,
        honest.expected_resume_step,
    )
    figures.add("drills_run", 2)


def test_malformed_lines_are_counted_in_the_report(
    fake_config: Callable[..., DrillConfig], tmp_path: Path
) -> None:
    config = fake_config()
    clock = SimulatedClock()
    backend = FakeOrchestrator(
        clock=clock, workers=2, steps_per_second=100, checkpoint_every=20, restart_delay=0.5
    )
    parsed = StreamEventSource(clock=clock.now)
    bad = [b"RECOVERYGATE/v1 {broken", b"RECOVERYGATE/v1 " + b"x" * 10_000, b"RECOVERYGATE/v1"]
    sent: list[bytes] = []

    def forge(events: list[TrainingEvent]) -> list[bytes]:
        lines = bad[len(sent) : len(sent) + 1] if events else []
        sent.extend(lines)
        return lines

    source = forged_source(backend, forge, parsed)
    type(source).malformed_lines = property(  # type: ignore[assignment]
        lambda self: parsed.malformed_lines
    )
    try:
        result = run_drill(
            config,
            RunOptions(report_path=tmp_path / "report.json"),
            clock=clock,
            orchestrator=backend,
        )
    finally:
        type(source).malformed_lines = property(lambda self: 0)  # type: ignore[assignment]
    assert result.verdict is Verdict.PASS
    assert result.malformed_lines == 3
    assert json.loads((tmp_path / "report.json").read_text())["malformedLines"] == 3


# ---------------------------------------------------------------------- the CLI


GOOD = {
    "workload": {"orchestrator": "kubernetes", "selector": "training-run=x", "namespace": "ns"},
    "injectFailure": {"type": "KillWorker", "afterCheckpoint": "step-10"},
    "expectations": {"resumeFromCheckpoint": "latest", "maxRecoveryTime": "5m", "maxLostSteps": 10},
    "safety": {"requireConfirm": False},
}


def bad_config(tmp_path: Path, case: str) -> tuple[Path, str]:
    """A bad recovery-test.yaml and a word its error message must contain."""
    path = tmp_path / "recovery-test.yaml"
    if case == "a-directory":
        path.mkdir()
        return path, "folder"
    if case == "non-utf8":
        path.write_bytes(yaml.safe_dump(GOOD).encode() + b"name: \xff\xfe\xfa\n")
        return path, "UTF-8"
    if case == "yaml-bomb":
        lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
        lines += [
            f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},"
            f"*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]"
            for i in range(8)
        ]
        path.write_text("\n".join(lines) + "\n")
        return path, "alias"
    doc = json.loads(json.dumps(GOOD))
    if case == "huge-number":
        doc["expectations"]["maxLostSteps"] = 10**400
        needle = "maxLostSteps"
    elif case == "negative-duration":
        doc["expectations"]["maxRecoveryTime"] = "-5m"
        needle = "maxRecoveryTime"
    elif case == "empty-selector":
        doc["workload"]["selector"] = "  "
        needle = "selector"
    else:
        raise AssertionError(case)
    path.write_text(yaml.safe_dump(doc))
    return path, needle


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize(
    "case",
    ["a-directory", "non-utf8", "yaml-bomb", "huge-number", "negative-duration", "empty-selector"],
)
def test_the_cli_refuses_a_bad_config_with_exit_2_and_a_message(
    tmp_path: Path,
    case: str,
    command: str,
    capsys: pytest.CaptureFixture[str],
    figures: Figures,
) -> None:
    path, needle = bad_config(tmp_path, case)
    args = [command, "-f", str(path)] + (["--yes"] if command == "run" else [])
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert needle.lower() in err.lower(), err
    assert str(path) in err
    figures.add("fuzz_cases")
