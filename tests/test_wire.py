"""The RECOVERYGATE/v1 line format: writer and parser agree, and the parser survives real logs.

We test these aspects:

- round trip: every formatted record parses back to itself (examples and hypothesis);
- the optional state digest of checkpoint events: hex, bounded, parts sorted by name, and
  every way it can be wrong counted as malformed (elsewhere the fields are ignored);
- where sentinels hide: launcher prefixes, glued lines, ``\\r`` segments, several per line;
- what is ignored (text without a sentinel) and what is counted as malformed;
- streaming: events split at every byte boundary, sentinels split across chunks;
- bounded memory: 100 MB without a newline, with and without a sentinel in front;
- garbage: NUL bytes, invalid UTF-8, deep JSON nesting never raise.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from recoverygate import wire
from recoverygate.wire import (
    MAX_EVENT_BYTES,
    SENTINEL,
    SENTINEL_BYTES,
    Record,
    StreamParser,
    format_record,
    format_start,
    format_step,
    parse_text,
)

from tests.patience import PROCESS, within

INC = "0123456789abcdef"
PROGRESS = format_step("progress", 1800000000.25, INC, 42, rank=0)
CHECKPOINT = format_step("checkpoint_completed", 1800000001.5, INC, 40, rank=0)


def only(text: str | bytes) -> Record:
    records, malformed = parse_text(text)
    assert malformed == 0
    assert len(records) == 1
    return records[0]


def test_a_progress_line_is_the_sentinel_a_space_and_compact_json() -> None:
    assert PROGRESS.startswith(SENTINEL + " {")
    assert PROGRESS.endswith("}\n")
    payload = json.loads(PROGRESS[len(SENTINEL) + 1 :])
    assert payload == {
        "event": "progress",
        "time": 1800000000.25,
        "inc": INC,
        "rank": 0,
        "step": 42,
    }
    assert " " not in PROGRESS[len(SENTINEL) + 1 :]


def test_a_start_line_carries_pid_host_rank_and_restart_count() -> None:
    line = format_start(
        1800000000.0,
        INC,
        pid=4242,
        host='node-"7"\\\n',
        rank=3,
        restart=2,
        local_rank=1,
        run_id="job-1",
    )
    assert line.count("\n") == 1
    record = only(line)
    assert record == Record(
        event="start",
        time=1800000000.0,
        inc=INC,
        step=None,
        rank=3,
        pid=4242,
        host='node-"7"\\\n',
        restart=2,
        local_rank=1,
        run_id="job-1",
    )


def test_time_keeps_microseconds() -> None:
    line = format_step("progress", 1800000000.123456, INC, 1)
    assert '"time":1800000000.123456,' in line
    assert only(line).time == pytest.approx(1800000000.123456, abs=1e-6)


def test_a_checkpoint_started_line_round_trips_through_the_shortcut() -> None:
    line = format_step("checkpoint_started", 1.5, INC, 900, rank=0)
    assert wire._FAST(line.encode(), len(SENTINEL) + 1) is not None
    assert only(line) == Record("checkpoint_started", 1.5, INC, step=900, rank=0)


def test_a_thread_number_round_trips_through_the_shortcut_and_the_json_path() -> None:
    line = format_step("progress", 1.5, INC, 40, rank=0, thread=1)
    assert line.endswith(',"step":40,"thread":1}\n')
    assert wire._FAST(line.encode(), len(SENTINEL) + 1) is not None
    assert only(line) == Record("progress", 1.5, INC, step=40, rank=0, thread=1)
    reordered = line.replace('"event":"progress",', "").replace("{", '{"event":"progress",', 1)
    json_path = reordered.replace('"thread":1', '"thread":1,"extra":0')
    assert wire._FAST(json_path.encode(), len(SENTINEL) + 1) is None
    assert only(json_path).thread == 1


def test_thread_0_is_written_as_no_field_and_a_number_past_the_cap_is_malformed() -> None:
    assert '"thread"' not in format_step("progress", 1.5, INC, 40, thread=0)
    assert only(format_step("progress", 1.5, INC, 40).replace("}", ',"thread":0}')).thread is None
    for bad in (f"{wire.MAX_THREAD + 1}", "-1", '"1"', "true"):
        line = format_step("progress", 1.5, INC, 40).replace("}", f',"thread":{bad}}}')
        records, malformed = parse_text(line)
        assert (records, malformed) == ([], 1), bad
    with pytest.raises(ValueError, match="thread must be 0 to"):
        format_step("progress", 1.5, INC, 40, thread=wire.MAX_THREAD + 1)


def test_a_step_line_without_rank_omits_the_field() -> None:
    line = format_step("checkpoint_loaded", 1.0, INC, 7)
    assert '"rank"' not in line
    assert only(line) == Record("checkpoint_loaded", 1.0, INC, step=7)


@pytest.mark.parametrize(
    "prefix",
    [
        "[default1]:",
        "2026-11-29T11:47:14.123456789Z ",
        "0: ",
        "[rank0]: 2026-11-29 11:47:14,123 INFO ",
        "\x1b[32mINFO\x1b[0m ",
    ],
)
def test_the_sentinel_is_found_after_launcher_and_collector_prefixes(prefix: str) -> None:
    assert only(prefix + PROGRESS).step == 42


def test_two_lines_glued_by_torchrun_give_two_events() -> None:
    glued = PROGRESS.rstrip("\n") + "[default1]:" + CHECKPOINT
    records, malformed = parse_text(glued)
    assert malformed == 0
    assert [r.event for r in records] == ["progress", "checkpoint_completed"]
    directly = PROGRESS.rstrip("\n") + CHECKPOINT.rstrip("\n") + PROGRESS
    assert [r.step for r in parse_text(directly)[0]] == [42, 40, 42]


def test_tqdm_carriage_returns_end_events_too() -> None:
    text = "epoch 1:  10%|#  |\r" + PROGRESS.rstrip("\n") + "\repoch 1:  20%|## |\r"
    assert only(text).step == 42


def test_trailing_text_after_the_json_is_ignored() -> None:
    assert only(PROGRESS.rstrip("\n") + " (from rank 0)\n").step == 42


def test_text_without_a_sentinel_is_ignored_silently() -> None:
    noise = "loss=0.25 step=42\nRECOVERYGATE v1 {}\nrecoverygate/v1 lower case\n\x00\xff"
    assert parse_text(noise) == ([], 0)


# ---------------------------------------------------------------------------- digests

PARTS = (("model", "0123456789abcdef"), ("optimizer", "fedcba9876543210"))


def test_a_checkpoint_line_carries_a_digest_and_its_parts() -> None:
    digest = wire.combine_parts(PARTS)
    line = format_step("checkpoint_completed", 2.0, INC, 40, 0, digest=digest, parts=PARTS)
    assert json.loads(line[len(SENTINEL) + 1 :]) == {
        "event": "checkpoint_completed",
        "time": 2.0,
        "inc": INC,
        "rank": 0,
        "step": 40,
        "digest": digest,
        "parts": {"model": "0123456789abcdef", "optimizer": "fedcba9876543210"},
    }
    assert only(line) == Record(
        "checkpoint_completed", 2.0, INC, step=40, rank=0, digest=digest, parts=PARTS
    )


def test_a_digest_alone_or_parts_alone_are_both_valid() -> None:
    alone = SENTINEL + ' {"event":"checkpoint_loaded","time":1,"inc":"ab","step":3,"digest":"00ff"}'
    assert only(alone).digest == "00ff"
    assert only(alone).parts == ()
    parts = SENTINEL + (
        ' {"event":"checkpoint_loaded","time":1,"inc":"ab","step":3,'
        '"parts":{"rng":"02","model":"01"}}'
    )
    assert only(parts).digest is None
    assert only(parts).parts == (("model", "01"), ("rng", "02"))  # sorted by name


def test_upper_case_hex_is_read_as_lower_case() -> None:
    line = SENTINEL + (
        ' {"event":"checkpoint_completed","time":1,"inc":"ab","step":3,'
        '"digest":"00FFab","parts":{"model":"ABCDEF"}}'
    )
    record = only(line)
    assert (record.digest, record.parts) == ("00ffab", (("model", "abcdef"),))


def test_the_longest_digest_line_fits_well_within_the_event_limit() -> None:
    parts = tuple(
        (f"{i:02d}".ljust(wire.MAX_PART_NAME_CHARS, "x"), "f" * wire.MAX_DIGEST_CHARS)
        for i in range(wire.MAX_DIGEST_PARTS)
    )
    line = format_step("checkpoint_loaded", 4e9, INC, 2**63, 100_000, digest="a" * 128, parts=parts)
    assert len(line) < MAX_EVENT_BYTES
    assert only(line).parts == parts


def test_the_combined_digest_is_a_fixed_function_of_the_parts() -> None:
    # Pinned: a writer in another language may compute it too (see README).
    assert wire.combine_parts(PARTS) == wire.combine_parts(tuple(PARTS))
    assert len(wire.combine_parts(PARTS)) == 16
    import hashlib

    expected = hashlib.blake2b(
        b"model=0123456789abcdef\noptimizer=fedcba9876543210\n", digest_size=8
    ).hexdigest()
    assert wire.combine_parts(PARTS) == expected
    assert wire.combine_parts(PARTS[:1]) != expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("ABCdef01", ("abcdef01", ())),
        (
            {"rng": "2", "model": "1"},
            (wire.combine_parts((("model", "1"), ("rng", "2"))), (("model", "1"), ("rng", "2"))),
        ),
        ("", None),
        ("xyz", None),
        ("a" * 129, None),
        ("ab\n", None),
        (b"ab", None),
        (123, None),
        (None, None),
        (["ab"], None),
        ({}, None),
        ({"model": 1}, None),
        ({1: "ab"}, None),
        ({"a b": "ab"}, None),
        ({'a"b': "ab"}, None),
        ({"x" * 65: "ab"}, None),
        ({f"p{i}": "ab" for i in range(17)}, None),
    ],
)
def test_a_users_digest_is_normalized_or_refused(value: object, expected: object) -> None:
    assert wire.normalize_digest(value) == expected


def test_a_mapping_that_fails_while_read_is_refused_not_raised() -> None:
    class Hostile(dict[str, str]):
        def items(self):
            raise RuntimeError("boom")

    assert wire.normalize_digest(Hostile(model="ab")) is None


@pytest.mark.parametrize(
    "fields",
    [
        '"digest":""',
        '"digest":"xyz"',
        '"digest":"' + "a" * 129 + '"',
        '"digest":12',
        '"digest":["ab"]',
        '"parts":"ab"',
        '"parts":["ab"]',
        '"parts":{}',
        '"parts":{"model":1}',
        '"parts":{"model":"zz"}',
        '"parts":{"bad name":"ab"}',
        '"parts":{"":"ab"}',
        '"parts":{"' + "n" * 65 + '":"ab"}',
        '"parts":{' + ",".join(f'"p{i}":"ab"' for i in range(17)) + "}",
        '"digest":"ab","parts":{"model":{"x":"ab"}}',
    ],
)
def test_a_bad_digest_on_a_checkpoint_event_is_malformed(fields: str) -> None:
    for event in ("checkpoint_completed", "checkpoint_loaded"):
        payload = f'{{"event":"{event}","time":1,"inc":"ab","step":3,{fields}}}'
        assert parse_text(f"{SENTINEL} {payload}\n") == ([], 1), payload


@pytest.mark.parametrize("event", ["progress", "checkpoint_started"])
def test_digest_fields_on_other_events_are_unknown_fields_and_ignored(event: str) -> None:
    payload = f'{{"event":"{event}","time":1,"inc":"ab","step":3,"digest":7,"parts":"x"}}'
    assert only(f"{SENTINEL} {payload}") == Record(event, 1.0, "ab", step=3)


def test_unknown_fields_next_to_a_digest_are_still_ignored() -> None:
    line = SENTINEL + (
        ' {"event":"checkpoint_loaded","time":1,"inc":"ab","step":3,"digest":"01",'
        '"digest_algo":"rg1","parts":{"model":"01"},"extra":{"a":[1]}}'
    )
    assert only(line) == Record(
        "checkpoint_loaded", 1.0, "ab", step=3, digest="01", parts=(("model", "01"),)
    )


def test_only_checkpoint_events_can_be_formatted_with_a_digest() -> None:
    with pytest.raises(ValueError, match="progress"):
        format_step("progress", 1.0, INC, 1, digest="ab")
    with pytest.raises(ValueError, match="checkpoint_started"):
        format_step("checkpoint_started", 1.0, INC, 1, parts=(("model", "ab"),))


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    line = SENTINEL + ' {"event":"progress","time":1,"inc":"ab","step":3,"gpu":"H100","v":[1]}'
    assert only(line) == Record("progress", 1.0, "ab", step=3)


@pytest.mark.parametrize(
    "payload",
    [
        "",
        "not json",
        "{",
        '{"event":"progress","time":1,"inc":"ab"',  # truncated by a crash
        '["progress"]',
        '{"event":"resumed","time":1,"inc":"ab","step":1}',
        '{"event":"progress","time":"1","inc":"ab","step":1}',
        '{"event":"progress","time":1,"inc":"","step":1}',
        '{"event":"progress","time":1,"inc":7,"step":1}',
        '{"event":"progress","time":1,"inc":"ab"}',
        '{"event":"progress","time":1,"inc":"ab","step":1.5}',
        '{"event":"progress","time":1,"inc":"ab","step":true}',
        '{"event":"progress","time":1,"inc":"ab","step":-1}',
        '{"event":"progress","time":NaN,"inc":"ab","step":1}',
        '{"event":"progress","time":1,"inc":"ab","step":1,"rank":"0"}',
        '{"event":"start","time":1,"inc":"ab","host":5}',
        "[" * 3000,
        '{"event":"progress","time":1,"inc":"ab","step":' + "9" * 5000 + "}",
    ],
)
def test_a_sentinel_followed_by_anything_else_is_counted_as_malformed(payload: str) -> None:
    assert parse_text(f"[default0]:{SENTINEL} {payload}\n") == ([], 1)


def test_a_truncated_event_glued_to_a_good_one_loses_only_itself() -> None:
    text = SENTINEL + ' {"event":"prog' + PROGRESS
    records, malformed = parse_text(text)
    assert [r.step for r in records] == [42]
    assert malformed == 1


def test_garbage_bytes_never_raise() -> None:
    rng = random.Random(7)
    blob = bytes(rng.randrange(256) for _ in range(200_000))
    blob = blob.replace(b"R", SENTINEL_BYTES + b" {", 50)
    parser = StreamParser()
    for start in range(0, len(blob), 977):
        parser.feed(blob[start : start + 977])
    parser.feed(b"\x00" * 100 + PROGRESS.encode() + b"\xff\xfe\n")
    assert parser.flush() == []
    assert parser.malformed >= 50


def test_invalid_utf8_inside_a_string_field_still_parses() -> None:
    line = SENTINEL_BYTES + b' {"event":"start","time":1,"inc":"ab","host":"n\xff1","pid":1}\n'
    assert only(line).host == "n\ufffd1"


def test_an_event_split_at_every_byte_boundary_is_found_once() -> None:
    data = b"noise\n[default0]:" + PROGRESS.encode() + b"tail " + CHECKPOINT.encode()
    for cut in range(len(data) + 1):
        parser = StreamParser()
        records = parser.feed(data[:cut]) + parser.feed(data[cut:]) + parser.flush()
        assert [r.step for r in records] == [42, 40], cut
        assert parser.malformed == 0


def test_a_stream_fed_one_byte_at_a_time_gives_every_event() -> None:
    data = ("x" * 30 + PROGRESS + "\r" + CHECKPOINT) * 3
    parser = StreamParser()
    records: list[Record] = []
    for byte in data.encode():
        records += parser.feed(bytes([byte]))
    records += parser.flush()
    assert [r.step for r in records] == [42, 40] * 3
    assert parser.malformed == 0


def test_a_complete_event_is_delivered_before_its_newline_arrives() -> None:
    parser = StreamParser()
    assert [r.step for r in parser.feed(PROGRESS.rstrip("\n").encode())] == [42]
    assert parser.feed(b"\n") == []
    assert parser.flush() == []


def test_an_unfinished_event_at_end_of_stream_is_malformed() -> None:
    parser = StreamParser()
    assert parser.feed(SENTINEL_BYTES + b' {"event":"progress","ti') == []
    assert parser.flush() == []
    assert parser.malformed == 1


def test_an_event_longer_than_the_limit_is_skipped_as_malformed() -> None:
    huge = (
        SENTINEL + ' {"event":"progress","time":1,"inc":"' + "a" * MAX_EVENT_BYTES + '","step":1}\n'
    )
    records, malformed = parse_text(huge + PROGRESS)
    assert [r.step for r in records] == [42]
    assert malformed == 1


def test_100_mb_without_a_newline_keeps_the_buffer_small() -> None:
    chunk = b"0123456789abcdef" * 4096  # 64 KiB
    parser = StreamParser()
    largest = 0
    for _ in range(1600):  # 100 MiB of one endless line
        assert parser.feed(chunk) == []
        largest = max(largest, parser.buffered)
    assert largest < len(SENTINEL_BYTES)
    # An endless line right after a sentinel: bounded by MAX_EVENT_BYTES.
    parser.feed(b"[default0]:" + SENTINEL_BYTES + b' {"event":"progress","x":"')
    for _ in range(1600):
        parser.feed(chunk)
        largest = max(largest, parser.buffered)
    assert largest <= MAX_EVENT_BYTES + len(SENTINEL_BYTES)
    assert parser.malformed == 1
    assert [r.step for r in parser.feed(b"\n" + PROGRESS.encode())] == [42]


def test_a_sentinel_split_across_chunks_after_megabytes_of_noise_is_found() -> None:
    parser = StreamParser()
    noise = b"n" * 1_000_003
    line = PROGRESS.encode()
    assert parser.feed(noise + line[:7]) == []
    assert parser.buffered < len(SENTINEL_BYTES)
    assert [r.step for r in parser.feed(line[7:])] == [42]


hex_strategy = st.text(alphabet="0123456789abcdef", min_size=1, max_size=wire.MAX_DIGEST_CHARS)
parts_strategy = st.dictionaries(
    st.text(alphabet="abcXYZ019_.:/-", min_size=1, max_size=wire.MAX_PART_NAME_CHARS),
    st.text(alphabet="0123456789abcdef", min_size=1, max_size=32),
    min_size=1,
    max_size=wire.MAX_DIGEST_PARTS,
).map(lambda d: tuple(sorted(d.items())))


@st.composite
def records_strategy(draw: st.DrawFn) -> Record:
    event = draw(st.sampled_from(sorted(wire.EVENT_KINDS - {"start"})))
    digest: str | None = None
    parts: tuple[tuple[str, str], ...] = ()
    source: str | None = None
    peer: int | None = None
    if event in wire.DIGEST_EVENTS:
        digest = draw(st.none() | hex_strategy)
        parts = draw(st.just(()) | parts_strategy)
    if event == "checkpoint_loaded":
        source = draw(st.none() | st.sampled_from(sorted(wire.LOAD_SOURCES)))
        peer = draw(st.none() | st.integers(0, 1000))
    loss: float | None = None
    data: str | None = None
    decimals: int | None = None
    if event == "progress":  # NaN aside (never equal to itself), every float round-trips
        loss = draw(st.none() | st.floats(allow_nan=False))
        data = draw(st.none() | st.text(min_size=1, max_size=wire.MAX_DATA_CHARS))
        if loss is not None:
            decimals = draw(st.none() | st.integers(0, wire.MAX_LOSS_DECIMALS))
    error: str | None = None
    if event == "checkpoint_failed":
        error = draw(st.none() | st.text(max_size=wire.MAX_ERROR_CHARS))
    return Record(
        event,
        draw(st.integers(0, 4_000_000_000_000_000).map(lambda us: us / 1_000_000)),
        draw(st.text(alphabet="0123456789abcdef", min_size=16, max_size=16)),
        step=draw(st.integers(0, 2**63)),
        rank=draw(st.none() | st.integers(0, 100_000)),
        digest=digest,
        parts=parts,
        source=source,
        peer=peer,
        loss=loss,
        data=data,
        loss_decimals=decimals,
        error=error,
        thread=draw(st.none() | st.integers(1, wire.MAX_THREAD)),  # 0 is written as absent
    )


start_strategy = st.builds(
    Record,
    event=st.just("start"),
    time=st.integers(0, 4_000_000_000_000_000).map(lambda us: us / 1_000_000),
    inc=st.text(min_size=1, max_size=40),
    step=st.none(),
    rank=st.none() | st.integers(0, 100_000),
    pid=st.integers(1, 2**22),
    host=st.text(max_size=80),
    restart=st.none() | st.integers(0, 1000),
    local_rank=st.none() | st.integers(0, 64),
    run_id=st.none() | st.text(max_size=40),
    digest=st.none(),  # builds() would invent them
    parts=st.just(()),
    ppid=st.none() | st.integers(0, 2**22),
    parent=st.none() | st.text(alphabet="0123456789abcdef", min_size=16, max_size=16),
    world_size=st.none() | st.integers(1, 100_000),
    replica=st.none() | st.integers(0, 1000),
    source=st.none(),
    peer=st.none(),
    loss=st.none(),
    data=st.none(),
    loss_decimals=st.none(),
    error=st.none(),
    thread=st.none(),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(records_strategy() | start_strategy, min_size=1, max_size=8), st.data())
def test_random_records_round_trip_through_any_chunking(
    records: list[Record], data: st.DataObject
) -> None:
    text = "".join(
        data.draw(st.sampled_from(["", "[default3]:", "0: ", "junk "])) + format_record(r)
        for r in records
    )
    blob = text.encode("utf-8", "surrogatepass")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(blob)), max_size=6)))
    parser = StreamParser()
    parsed: list[Record] = []
    for start, end in zip([0, *cuts], [*cuts, len(blob)], strict=True):
        parsed += parser.feed(blob[start:end])
    parsed += parser.flush()
    assert parser.malformed == 0
    assert parsed == records


def test_a_string_field_holding_the_sentinel_never_splits_its_line() -> None:
    # Found by the property test above: a host "RECOVERYGATE/v1" read as a glued next line.
    line = wire.format_start(1.0, "abc", pid=1, host="RECOVERYGATE/v1", run_id="x/RECOVERYGATE/v1")
    assert SENTINEL not in line[len(SENTINEL) :]
    parser = StreamParser()
    [record] = parser.feed(line.encode()) + parser.flush()
    assert parser.malformed == 0
    assert (record.host, record.run_id) == ("RECOVERYGATE/v1", "x/RECOVERYGATE/v1")


DOCS = Path(__file__).resolve().parent.parent / "README.md"


def documented_block(language: str) -> str:
    text = DOCS.read_text()
    start = text.index(
        f"```{language}\nRECOVERYGATE/v1" if language == "text" else f"```{language}\ninc="
    )
    body = text[start:].split("\n", 1)[1]
    return body[: body.index("```")]


def test_the_documented_example_lines_parse() -> None:
    records, malformed = parse_text(documented_block("text"))
    assert malformed == 0
    assert [r.event for r in records] == [
        "start",
        "checkpoint_loaded",
        "progress",
        "checkpoint_started",
        "checkpoint_completed",
    ]
    loaded, completed = records[1], records[4]
    assert loaded.digest is not None
    assert {name for name, _ in completed.parts} == {"model", "optimizer", "scheduler", "rng"}
    assert completed.digest == wire.combine_parts(completed.parts)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_documented_shell_emitter_writes_valid_lines() -> None:
    result = subprocess.run(
        ["bash", "-c", documented_block("bash")],
        capture_output=True,
        text=True,
        timeout=within(PROCESS),
        check=True,
    )
    records, malformed = parse_text(result.stdout)
    assert malformed == 0
    assert [(r.event, r.step) for r in records] == [("start", None), ("checkpoint_completed", 1000)]
    assert len(records[0].inc) == 16


@settings(max_examples=200, deadline=None)
@given(records_strategy())
def test_the_shortcut_for_our_own_lines_agrees_with_json(record: Record) -> None:
    line = format_record(record)
    payload = json.loads(line[len(SENTINEL) + 1 :])
    assert parse_text(line) == ([wire.record_from_json(payload)], 0)
    # The same event with its fields in another order can only go through json.
    reordered = SENTINEL + " " + json.dumps(dict(reversed(payload.items()))) + "\n"
    assert parse_text(reordered) == ([record], 0)


# ---------------------------------------------------------------------------- loss and data


def test_a_progress_line_carries_its_loss_and_data_and_reads_them_back() -> None:
    line = format_step("progress", 1.0, INC, 41, rank=0, loss=0.1 + 0.2, data="e0/b41")
    assert '"loss":0.30000000000000004' in line
    assert only(line) == Record(
        "progress", 1.0, INC, step=41, rank=0, loss=0.1 + 0.2, data="e0/b41"
    )


def test_loss_and_data_on_another_event_are_unknown_fields_ignored() -> None:
    for body in (
        f'{{"event":"checkpoint_completed","time":1.0,"inc":"{INC}","step":40,"loss":0.5}}',
        f'{{"event":"checkpoint_loaded","time":1.0,"inc":"{INC}","step":40,"data":"x"}}',
    ):
        record = only(f"{SENTINEL} {body}")
        assert record.loss is None
        assert record.data is None
    with pytest.raises(ValueError, match="loss"):
        format_step("checkpoint_completed", 1.0, INC, 1, loss=0.5)


@pytest.mark.parametrize("line_end", ["}", ',"x":1}'])  # the shortcut, and the JSON path
def test_a_loss_read_from_a_printed_line_carries_its_decimals(line_end: str) -> None:
    line = format_step("progress", 1.0, INC, 41, rank=0, loss=2.3456, loss_decimals=4)
    assert line.endswith('"loss":2.3456,"loss_decimals":4}\n')
    record = only(line.replace("}\n", line_end))
    assert (record.loss, record.loss_decimals) == (2.3456, 4)
    for bad in ('"loss_decimals":25', '"loss_decimals":-1', '"loss_decimals":"4"'):
        body = f'{{"event":"progress","time":1,"inc":"ab","step":3,"loss":1.5,{bad}{line_end}'
        assert parse_text(f"{SENTINEL} {body}") == ([], 1), bad
    alone = f'{{"event":"progress","time":1,"inc":"ab","step":3,"loss_decimals":4{line_end}'
    assert parse_text(f"{SENTINEL} {alone}") == ([], 1)  # decimals of no loss
    with pytest.raises(ValueError, match="loss_decimals"):
        format_step("progress", 1.0, INC, 1, loss=0.5, loss_decimals=25)


@pytest.mark.parametrize(
    "field",
    ['"loss":true', '"loss":"0.5"', '"loss":[1]', '"data":7', '"data":""', f'"data":"{"x" * 129}"'],
)
def test_a_progress_line_with_a_bad_loss_or_data_is_malformed(field: str) -> None:
    line = f'{SENTINEL} {{"event":"progress","time":1,"inc":"ab","step":3,{field}}}'
    records, malformed = parse_text(line)
    assert records == []
    assert malformed == 1


@pytest.mark.parametrize(
    "loss",
    [
        "1" + "0" * 400,  # an int beyond the float range: float() raises OverflowError
        "-" + "9" * 320,
        "1e400",  # a number literal that reads as inf
        "-1e999999999",
        "NaN",  # JSON's non-standard literals: only the strings say non-finite
        "Infinity",
        "-Infinity",
    ],
)
def test_a_loss_that_is_no_finite_number_is_malformed_never_raised(loss: str) -> None:
    line = f'{SENTINEL} {{"event":"progress","time":1.5,"inc":"ab","step":3,"loss":{loss}}}\n'
    records, malformed = parse_text(line + line.replace('"step":3', '"step":4'))
    assert records == []
    assert malformed == 2
    parser = StreamParser()
    assert parser.feed(line.encode()) == []
    assert parser.malformed == 1


def test_the_non_finite_strings_are_the_loss_forms_that_read_back() -> None:
    for text, check in (('"nan"', math.isnan), ('"inf"', lambda v: v == math.inf)):
        record = only(
            f'{SENTINEL} {{"event":"progress","time":1,"inc":"ab","step":3,"loss":{text}}}'
        )
        assert record.loss is not None and check(record.loss)


@pytest.mark.parametrize("line_end", ["}", ',"x":1}'])  # the shortcut, and the JSON path
def test_minus_zero_written_as_an_integer_reads_the_same_on_both_paths(line_end: str) -> None:
    record = only(
        f'{SENTINEL} {{"event":"progress","time":1.5,"inc":"ab","step":3,"loss":-0{line_end}'
    )
    assert record.loss == 0.0 and math.copysign(1.0, record.loss) == 1.0
    record = only(
        f'{SENTINEL} {{"event":"progress","time":1.5,"inc":"ab","step":3,"loss":-0.0{line_end}'
    )
    assert record.loss is not None and math.copysign(1.0, record.loss) == -1.0


def test_data_accepts_anything_operator_index_takes() -> None:
    import numpy as np
    import torch

    assert wire.data_text(np.int64(7)) == "7"
    assert wire.data_text(torch.tensor(7)) == "7"
    assert wire.data_text(torch.tensor(7.5)) is None  # a float tensor is no int
    assert wire.data_text(np.float64(7.0)) is None
    assert wire.data_text(True) is None
