"""The training-side reporter: what it prints, when, from which ranks, and that it never hurts.

We test these aspects:

- lines: the start event comes once per process (again after a fork), before anything else;
- rate limit: the first two progress calls always print, then one line per interval;
  checkpoint events (started, completed, loaded) always print;
- replay window: the first N progress calls of a process and after each checkpoint
  completed or loaded print unthrottled, with their loss (``float()`` only on printed
  calls, the value read back bit for bit) and data fingerprint;
- digests: a hex string or a mapping of parts is carried on the checkpoint line; anything
  else is dropped and the step still printed;
- rank filter: RANK / RECOVERYGATE_RANKS, and ``configure`` overriding them;
- threads: a line of a thread other than the process's first printing one says its number
  (a metrics thread's progress against the loop's checkpoints), numbered again after a fork;
- robustness: odd step values, closed stdout, a broken pipe, concurrent threads;
- isolation: importing it loads nothing outside the standard library (not even json).

In-process tests drive the module through ``configure`` with a fake clock; anything about
a whole process (environment, fork, closed stdout) runs a real child interpreter.
"""

from __future__ import annotations

import functools
import io
import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import recoverygate
from recoverygate import reporter, wire
from recoverygate.wire import Record, parse_text

from tests.patience import JOB, PROMPT, within

REPORTER_PATH = str(Path(recoverygate.__file__).resolve().parent.parent)


class FakeClock:
    """POSIX time that only moves when the test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _fresh_reporter() -> Iterator[None]:
    reporter.configure()
    yield
    reporter.configure()


def parsed(stream: io.StringIO) -> list[Record]:
    records, malformed = parse_text(stream.getvalue())
    assert malformed == 0
    return records


def steps(records: list[Record], event: str = "progress") -> list[int | None]:
    return [r.step for r in records if r.event == event]


def run_child(
    code: str, env: dict[str, str] | None = None, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    child_env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in {
            "RANK",
            "SLURM_PROCID",
            "RECOVERYGATE_RANKS",
            "LOCAL_RANK",
            "RECOVERYGATE_PARENT_INC",
        }
        and not key.startswith("TORCHELASTIC_")
    }
    child_env["PYTHONPATH"] = REPORTER_PATH
    child_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )


# ---------------------------------------------------------------------------- lines


def test_the_first_event_of_a_process_is_preceded_by_one_start_event() -> None:
    out = io.StringIO()
    clock = FakeClock()
    reporter.configure(stream=out, clock=clock, min_interval=0)
    reporter.progress(5)
    reporter.checkpoint_completed(5)
    reporter.progress(6)
    records = parsed(out)
    assert [r.event for r in records] == ["start", "progress", "checkpoint_completed", "progress"]
    start = records[0]
    assert start.pid == os.getpid()
    assert start.host
    assert len(start.inc) == 16
    int(start.inc, 16)
    assert {r.inc for r in records} == {start.inc}
    assert records[1].time == clock.now


def test_each_line_is_one_newline_terminated_line() -> None:
    out = io.StringIO()
    reporter.configure(stream=out, min_interval=0)
    reporter.checkpoint_loaded(3)
    lines = out.getvalue().splitlines(keepends=True)
    assert len(lines) == 2
    assert all(line.startswith("RECOVERYGATE/v1 {") and line.endswith("}\n") for line in lines)


def test_lines_go_to_the_stream_file_descriptor_when_it_has_one(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    with path.open("w") as stream:
        print("before", file=stream)  # buffered in the stream: must stay ahead of our line
        reporter.configure(stream=stream, min_interval=0)
        reporter.progress(1)
        reporter.checkpoint_completed(1)
        # Already on disk, without closing or flushing the stream ourselves.
        text = path.read_text()
    assert text.startswith("before\n")
    assert steps(parse_text(text)[0], "checkpoint_completed") == [1]


# ---------------------------------------------------------------------------- rate limit


def test_the_first_two_progress_calls_always_print() -> None:
    out = io.StringIO()
    reporter.configure(stream=out, clock=FakeClock(), min_interval=1000.0, replay_window=0)
    for step in range(100):
        reporter.progress(step)
    assert steps(parsed(out)) == [0, 1]


def test_progress_prints_about_once_per_interval() -> None:
    out = io.StringIO()
    clock = FakeClock()
    reporter.configure(stream=out, clock=clock, min_interval=0.1, replay_window=0)
    step_time = 0.004
    for step in range(5000):  # 20 simulated seconds
        clock.now = 1_800_000_000.0 + step * step_time
        reporter.progress(step)
    times = [r.time for r in parsed(out) if r.event == "progress"]
    gaps = [b - a for a, b in itertools.pairwise(times[1:])]
    assert 150 <= len(times) <= 202
    assert all(gap >= 0.1 - 1e-6 for gap in gaps)
    assert all(gap <= 0.1 + 3 * step_time for gap in gaps)


def test_a_slow_loop_prints_its_steps_without_falling_behind() -> None:
    out = io.StringIO()
    clock = FakeClock()
    reporter.configure(stream=out, clock=clock, min_interval=0.1)
    for step in range(50):  # one step every 0.25 s: slower than the interval
        clock.now += 0.25
        reporter.progress(step)
    assert steps(parsed(out)) == list(range(50))


def test_a_step_rate_that_drops_does_not_silence_progress() -> None:
    out = io.StringIO()
    clock = FakeClock()
    reporter.configure(stream=out, clock=clock, min_interval=0.1)
    step = 0
    for _ in range(1000):  # fast: 1 ms per step
        clock.now += 0.001
        reporter.progress(step)
        step += 1
    for _ in range(100):  # then 1 s per step (an eval pass, a slow node)
        clock.now += 1.0
        reporter.progress(step)
        step += 1
    printed = steps(parsed(out))
    assert printed[-1] == step - 1
    # The countdown set during the fast phase may hide a few slow steps, never more
    # than the reporter's cap on calls between clock reads (32).
    assert len([s for s in printed if s is not None and s >= 1000]) >= 100 - 32


def test_checkpoint_events_are_never_dropped() -> None:
    out = io.StringIO()
    reporter.configure(stream=out, clock=FakeClock(), min_interval=1000.0)
    for step in range(1000):
        reporter.progress(step)
        if step % 10 == 0:
            reporter.checkpoint_started(step)
            reporter.checkpoint_completed(step)
            reporter.checkpoint_loaded(step, digest="ab")
    records = parsed(out)
    assert steps(records, "checkpoint_started") == list(range(0, 1000, 10))
    assert steps(records, "checkpoint_completed") == list(range(0, 1000, 10))
    assert steps(records, "checkpoint_loaded") == list(range(0, 1000, 10))


# ---------------------------------------------------------------------------- digests


def test_a_hex_digest_is_carried_on_the_checkpoint_line() -> None:
    out = io.StringIO()
    clock = FakeClock()
    reporter.configure(stream=out, clock=clock, rank=0)
    reporter.checkpoint_completed(100, digest="00C0FFEE12345678")
    reporter.checkpoint_loaded(100, "00c0ffee12345678")
    _, completed, loaded = parsed(out)
    assert completed == Record(
        "checkpoint_completed",
        clock.now,
        completed.inc,
        step=100,
        rank=0,
        digest="00c0ffee12345678",
    )
    assert (loaded.event, loaded.digest, loaded.parts) == (
        "checkpoint_loaded",
        "00c0ffee12345678",
        (),
    )


def test_a_mapping_digest_is_carried_as_parts_with_their_combination() -> None:
    out = io.StringIO()
    reporter.configure(stream=out)
    parts = {"rng": "03", "model": "01", "optimizer": "02"}
    reporter.checkpoint_completed(5, digest=parts)
    record = parsed(out)[1]
    assert record.parts == (("model", "01"), ("optimizer", "02"), ("rng", "03"))
    assert record.digest == wire.combine_parts(record.parts)


@pytest.mark.parametrize(
    "digest",
    [
        123,
        1.5,
        b"ab",
        ["ab"],
        object(),
        "",
        "not hex",
        "a" * 129,
        {},
        {"model": 1},
        {"bad name": "ab"},
        {f"p{i}": "ab" for i in range(17)},
    ],
)
def test_an_invalid_digest_is_dropped_and_the_step_still_printed(digest: object) -> None:
    out = io.StringIO()
    reporter.configure(stream=out)
    reporter.checkpoint_completed(7, digest=digest)  # type: ignore[arg-type]
    reporter.checkpoint_loaded(7, digest=digest)  # type: ignore[arg-type]
    records = parsed(out)
    assert [(r.event, r.step, r.digest, r.parts) for r in records[1:]] == [
        ("checkpoint_completed", 7, None, ()),
        ("checkpoint_loaded", 7, None, ()),
    ]


def test_a_mapping_that_raises_while_read_never_reaches_training_code() -> None:
    class Hostile(dict[str, str]):
        def items(self):
            raise RuntimeError("boom")

    out = io.StringIO()
    reporter.configure(stream=out)
    reporter.checkpoint_completed(3, digest=Hostile(model="ab"))
    assert steps(parsed(out), "checkpoint_completed") == [3]


def test_a_digest_line_is_the_first_line_after_the_start_event_too() -> None:
    result = run_child(
        """
        from recoverygate import reporter
        reporter.checkpoint_loaded(40, digest={"model": "aa", "rng": "bb"})
        reporter.progress(41)
        """
    )
    assert result.returncode == 0, result.stderr
    records, malformed = parse_text(result.stdout)
    assert malformed == 0
    assert [r.event for r in records] == ["start", "checkpoint_loaded", "progress"]
    assert records[1].parts == (("model", "aa"), ("rng", "bb"))


def test_a_rank_that_does_not_print_progress_still_reports_its_shard_with_its_digest() -> None:
    # Checkpoint lines are rare (one per save or load) and print on every rank, so a drill
    # can hold every rank's shard to the expected step; progress stays on rank 0.
    out = io.StringIO()
    reporter.configure(stream=out, rank=3)
    reporter.progress(1)
    reporter.checkpoint_completed(1, digest={"model": "ab"})
    records = parsed(out)
    assert [r.event for r in records] == ["start", "checkpoint_completed"]
    assert records[1].rank == 3 and records[1].parts == (("model", "ab"),)


def test_the_default_interval_caps_the_line_rate_on_the_real_clock() -> None:
    out = io.StringIO()
    reporter.configure(stream=out)
    started = time.monotonic()
    for step in range(300_000):
        reporter.progress(step)
    elapsed = time.monotonic() - started
    # the replay window (the first 32 calls) prints unthrottled, then the interval rules
    assert len(steps(parsed(out))) <= reporter.DEFAULT_REPLAY_WINDOW + elapsed / 0.1 + 3


# ---------------------------------------------------------------------------- replay window


class CountingLoss:
    """A loss that counts its conversions (a GPU tensor's ``float()`` is a device sync)."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.floats = 0

    def __float__(self) -> float:
        self.floats += 1
        return self.value


def test_the_first_window_of_calls_prints_unthrottled_then_the_interval_rules() -> None:
    out = io.StringIO()
    reporter.configure(stream=out, clock=FakeClock(), min_interval=1000.0, replay_window=5)
    for step in range(1, 101):
        reporter.progress(step)
    assert steps(parsed(out)) == [1, 2, 3, 4, 5]


def test_each_checkpoint_completed_and_loaded_reopens_the_window() -> None:
    out = io.StringIO()
    reporter.configure(stream=out, clock=FakeClock(), min_interval=1000.0, replay_window=3)
    for step in range(1, 41):
        reporter.progress(step)
        if step == 20:
            reporter.checkpoint_completed(step)
    reporter.checkpoint_loaded(20)
    for step in range(21, 31):
        reporter.progress(step)
    assert steps(parsed(out)) == [1, 2, 3, 21, 22, 23, 21, 22, 23]


def test_the_window_is_read_from_the_environment() -> None:
    code = """
        from recoverygate import reporter
        for step in range(1, 200):
            reporter.progress(step)
    """
    out = run_child(
        code, {"RECOVERYGATE_REPLAY_WINDOW": "7", "RECOVERYGATE_PROGRESS_INTERVAL": "60"}
    )
    assert steps(parse_text(out.stdout)[0]) == [1, 2, 3, 4, 5, 6, 7]
    bad = run_child(
        code, {"RECOVERYGATE_REPLAY_WINDOW": "many", "RECOVERYGATE_PROGRESS_INTERVAL": "60"}
    )
    assert len(steps(parse_text(bad.stdout)[0])) == reporter.DEFAULT_REPLAY_WINDOW


@pytest.mark.parametrize(
    "value",
    [0.1 + 0.2, 2.5, -0.0, 1e-300, 5e-324, 1.7976931348623157e308, 123456789.123456789, 3],
)
def test_a_loss_reads_back_as_the_same_float_bit_for_bit(value: float) -> None:
    out = io.StringIO()
    reporter.configure(stream=out, clock=FakeClock())
    reporter.progress(1, loss=value)
    (record,) = [r for r in parsed(out) if r.event == "progress"]
    assert record.loss is not None
    assert record.loss.hex() == float(value).hex()


def test_a_non_finite_loss_is_carried_as_text_and_reads_back() -> None:
    out = io.StringIO()
    reporter.configure(stream=out, clock=FakeClock())
    for step, value in enumerate((float("inf"), float("-inf"), float("nan")), start=1):
        reporter.progress(step, loss=value)
    losses = [r.loss for r in parsed(out) if r.event == "progress"]
    assert losses[:2] == [float("inf"), float("-inf")]
    assert losses[2] is not None
    assert losses[2] != losses[2]  # NaN


def test_float_runs_only_on_the_calls_that_print() -> None:
    out = io.StringIO()
    clock = FakeClock()
    reporter.configure(stream=out, clock=clock, min_interval=0.1, replay_window=4)
    loss = CountingLoss(0.5)
    for step in range(1, 2001):
        clock.now += 0.001
        reporter.progress(step, loss=loss)
    printed = [r for r in parsed(out) if r.event == "progress"]
    assert 4 < len(printed) < 2000 // 50
    assert loss.floats == len(printed)
    assert all(r.loss == 0.5 for r in printed)


def test_a_loss_float_refuses_is_dropped_and_the_step_still_printed() -> None:
    out = io.StringIO()
    reporter.configure(stream=out, clock=FakeClock())
    reporter.progress(1, loss="not a number")
    reporter.progress(2, loss=object(), data=7)
    records = [r for r in parsed(out) if r.event == "progress"]
    assert [(r.step, r.loss, r.data) for r in records] == [(1, None, None), (2, None, "7")]


def test_data_fingerprints_are_written_as_text_and_long_ones_as_a_digest() -> None:
    out = io.StringIO()
    reporter.configure(stream=out, clock=FakeClock())
    values: list[object] = [12, "batch/7", b"\x01\xff", bytes(range(100)), "x" * 200, True]
    for step, value in enumerate(values, start=1):
        reporter.progress(step, loss=1.0, data=value)
    data = [r.data for r in parsed(out) if r.event == "progress"]
    assert data[:3] == ["12", "batch/7", "01ff"]
    assert data[3] is not None
    assert len(data[3]) == 32
    assert data[3] == wire.data_text(bytes(range(100)))
    assert data[4] is not None
    assert len(data[4]) == 32
    assert data[5] is None  # a bool is no fingerprint


# ---------------------------------------------------------------------------- ranks


@pytest.mark.parametrize(
    ("rank", "ranks", "prints"),
    [
        (0, None, True),
        (1, None, False),
        (1, "all", True),
        (1, "0,1", True),
        (2, "0, 1", False),
        (3, "ALL", True),
        (0, "nonsense", True),
        (1, "nonsense", False),
    ],
)
def test_only_the_selected_ranks_print_progress(rank: int, ranks: str | None, prints: bool) -> None:
    out = io.StringIO()
    reporter.configure(stream=out, rank=rank, ranks=ranks)
    reporter.progress(1)
    reporter.checkpoint_completed(1)
    assert reporter.enabled() is prints
    records = parsed(out)
    assert bool(steps(records)) is prints
    assert steps(records, "checkpoint_completed") == [1]  # every rank reports its checkpoints
    assert {r.rank for r in records} == {rank}


def test_rank_and_torchelastic_fields_come_from_the_environment() -> None:
    result = run_child(
        """
        from recoverygate import reporter
        reporter.progress(10)
        """,
        env={
            "RANK": "3",
            "RECOVERYGATE_RANKS": "all",
            "LOCAL_RANK": "1",
            "TORCHELASTIC_RESTART_COUNT": "2",
            "TORCHELASTIC_RUN_ID": "run-9",
        },
    )
    assert result.returncode == 0, result.stderr
    start, progress = parse_text(result.stdout)[0]
    assert (start.rank, start.local_rank, start.restart, start.run_id) == (3, 1, 2, "run-9")
    assert progress.rank == 3


def test_a_non_zero_rank_prints_no_progress_by_default_but_its_checkpoints() -> None:
    result = run_child(
        """
        from recoverygate import reporter
        reporter.progress(1); reporter.checkpoint_completed(1)
        print(reporter.enabled())
        """,
        env={"RANK": "1"},
    )
    assert result.returncode == 0, result.stderr
    records, _ = parse_text(result.stdout)
    assert [r.event for r in records] == ["start", "checkpoint_completed"]
    assert result.stdout.endswith("False\n")


def test_checkpoint_ranks_narrow_the_checkpoint_lines_like_ranks_narrow_progress() -> None:
    result = run_child(
        """
        from recoverygate import reporter
        reporter.progress(1); reporter.checkpoint_completed(1); reporter.checkpoint_loaded(1)
        """,
        env={"RANK": "1", "RECOVERYGATE_CHECKPOINT_RANKS": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""


def test_the_start_line_says_how_the_process_was_launched() -> None:
    # A worker started by its launcher names no parent; a subprocess it starts (warm-up,
    # evaluation: it inherits RANK) names the worker's incarnation, and so does a forked
    # child (a checkpoint writer). WORLD_SIZE and the parent pid come along.
    result = run_child(
        """
        import os, subprocess, sys
        from recoverygate import reporter
        reporter.progress(1)
        sys.stdout.flush()
        subprocess.run([sys.executable, "-c",
                        "from recoverygate import reporter; reporter.progress(1)"], check=True)
        pid = os.fork()
        if pid == 0:
            reporter.checkpoint_completed(1)
            os._exit(0)
        os.waitpid(pid, 0)
        """,
        env={"WORLD_SIZE": "4"},
    )
    assert result.returncode == 0, result.stderr
    starts = [r for r in parse_text(result.stdout)[0] if r.event == "start"]
    assert len(starts) == 3, result.stdout
    worker, sub, forked = starts
    assert worker.parent is None and worker.world_size == 4 and worker.ppid is not None
    assert sub.parent == worker.inc and sub.ppid == worker.pid
    assert forked.parent == worker.inc and forked.ppid == worker.pid
    assert len({worker.inc, sub.inc, forked.inc}) == 3


def test_slurm_procid_stands_in_for_a_missing_rank() -> None:
    result = run_child(
        "from recoverygate import reporter; print(reporter.enabled())",
        env={"SLURM_PROCID": "2"},
    )
    assert result.stdout == "False\n"


def test_the_interval_comes_from_the_environment() -> None:
    result = run_child(
        """
        from recoverygate import reporter
        for step in range(200):
            reporter.progress(step)
        """,
        env={"RECOVERYGATE_PROGRESS_INTERVAL": "0"},
    )
    assert steps(parse_text(result.stdout)[0]) == list(range(200))


# ---------------------------------------------------------------------------- processes


def in_thread(*calls: Callable[[], None]) -> None:
    """Run ``calls`` in order in one new thread, and wait for it."""

    def run() -> None:
        for call in calls:
            call()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def test_each_thread_that_prints_is_numbered_in_the_order_of_its_first_line() -> None:
    stream = io.StringIO()
    reporter.configure(stream=stream, rank=0, min_interval=0.0)
    reporter.checkpoint_loaded(40)  # the loop: the process's first printing thread
    in_thread(lambda: reporter.progress(40), lambda: reporter.progress(44))  # metrics thread
    reporter.checkpoint_completed(60)
    in_thread(lambda: reporter.checkpoint_completed(80))  # another thread
    got = [(r.event, r.step, r.thread) for r in parsed(stream) if r.event != "start"]
    assert got == [
        ("checkpoint_loaded", 40, None),
        ("progress", 40, 1),
        ("progress", 44, 1),
        ("checkpoint_completed", 60, None),
        ("checkpoint_completed", 80, 2),
    ]


def test_threads_past_the_wire_cap_share_its_number() -> None:
    stream = io.StringIO()
    reporter.configure(stream=stream, rank=0)
    for step in range(wire.MAX_THREAD + 3):
        in_thread(functools.partial(reporter.checkpoint_completed, step))
    numbers = [r.thread for r in parsed(stream) if r.event == "checkpoint_completed"]
    assert numbers == [None, *range(1, wire.MAX_THREAD), *[wire.MAX_THREAD] * 3]


def test_a_forked_child_numbers_its_threads_again() -> None:
    result = run_child(
        """
        import os, threading
        from recoverygate import reporter
        reporter.checkpoint_completed(1)
        t = threading.Thread(target=reporter.checkpoint_completed, args=(2,))
        t.start(); t.join()
        pid = os.fork()
        if pid == 0:
            reporter.checkpoint_completed(3)  # the child's first printing thread
            os._exit(0)
        os.waitpid(pid, 0)
        """
    )
    assert result.returncode == 0, result.stderr
    records, malformed = parse_text(result.stdout)
    assert malformed == 0
    got = [(r.step, r.thread) for r in records if r.event == "checkpoint_completed"]
    assert got == [(1, None), (2, 1), (3, None)]


def test_the_start_event_is_printed_once_per_process_and_again_after_fork() -> None:
    result = run_child(
        """
        import os
        from recoverygate import reporter
        reporter.progress(1)
        reporter.checkpoint_completed(1)
        pid = os.fork()
        if pid == 0:
            reporter.progress(2)
            reporter.checkpoint_completed(2)
            os._exit(0)
        os.waitpid(pid, 0)
        reporter.progress(3)
        reporter.checkpoint_completed(3)
        """
    )
    assert result.returncode == 0, result.stderr
    records, malformed = parse_text(result.stdout)
    assert malformed == 0
    starts = [r for r in records if r.event == "start"]
    assert len(starts) == 2
    parent, child = starts
    assert parent.inc != child.inc
    assert parent.pid != child.pid
    assert records[0] == parent

    def checkpoints(inc: str) -> list[int | None]:
        return [r.step for r in records if r.inc == inc and r.event == "checkpoint_completed"]

    assert checkpoints(child.inc) == [2]
    assert checkpoints(parent.inc) == [1, 3]


def test_closed_stdout_never_raises_into_training_code() -> None:
    code = """
        import os, sys
        from recoverygate import reporter
        reporter.configure(min_interval=0)
        for step in range(100):
            reporter.progress(step)
            reporter.checkpoint_completed(step)
        sys.stderr.write("survived\\n")
    """
    # stdout closed before Python started: sys.stdout is None.
    started_closed = subprocess.run(
        ["sh", "-c", 'exec "$0" -c "$1" >&-', sys.executable, textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": REPORTER_PATH},
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )
    assert started_closed.returncode == 0, started_closed.stderr
    assert started_closed.stderr == "survived\n"
    # stdout closed under a running process: os.write fails with EBADF.
    closed_later = run_child("import os; os.close(1)\n" + textwrap.dedent(code))
    assert closed_later.returncode == 0, closed_later.stderr
    assert closed_later.stderr == "survived\n"


def test_a_broken_pipe_never_raises_into_training_code() -> None:
    code = """
        import sys
        from recoverygate import reporter
        reporter.configure(min_interval=0)
        sys.stdin.readline()  # wait until the reader is gone
        for step in range(1000):
            reporter.progress(step)
            reporter.checkpoint_completed(step)
        sys.stderr.write("survived\\n")
    """
    env = {**os.environ, "PYTHONPATH": REPORTER_PATH, "RANK": "0"}
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdin is not None
        assert proc.stderr is not None
        proc.stdout.close()
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        stderr = proc.stderr.read().decode()
        assert proc.wait(within(JOB)) == 0, stderr
    assert stderr == "survived\n"


@pytest.mark.parametrize("step", ["abc", None, object(), [1], float("nan"), -1])
def test_odd_step_values_are_swallowed(step: object) -> None:
    out = io.StringIO()
    reporter.configure(stream=out, min_interval=0)
    reporter.progress(step)  # type: ignore[arg-type]
    reporter.checkpoint_started(step)  # type: ignore[arg-type]
    reporter.checkpoint_completed(step)  # type: ignore[arg-type]
    reporter.checkpoint_loaded(step)  # type: ignore[arg-type]
    reporter.checkpoint_completed(step, digest="ab")  # type: ignore[arg-type]
    assert [r.event for r in parsed(out) if r.event != "start"] == []


def test_steps_that_convert_to_int_are_converted() -> None:
    out = io.StringIO()
    reporter.configure(stream=out, min_interval=0)
    reporter.progress(7.9)
    reporter.checkpoint_completed("12")  # type: ignore[arg-type]
    records = parsed(out)
    assert steps(records) == [7]
    assert steps(records, "checkpoint_completed") == [12]


def test_a_stream_that_fails_is_swallowed() -> None:
    attempts: list[str] = []

    class Broken(io.StringIO):
        def write(self, s: str) -> int:
            attempts.append(s)
            raise OSError("disk full")

    reporter.configure(stream=Broken(), min_interval=0)
    reporter.progress(1)  # no exception may reach the training loop
    reporter.checkpoint_completed(1)
    assert attempts, "the reporter never tried to write, so nothing was swallowed"


def test_lines_from_many_threads_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    with path.open("a") as stream:
        reporter.configure(stream=stream, min_interval=0)

        def work(offset: int) -> None:
            for step in range(2000):
                reporter.checkpoint_completed(offset + step)

        threads = [threading.Thread(target=work, args=(n * 10_000,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    records, malformed = parse_text(path.read_bytes())
    assert malformed == 0
    assert len(steps(records, "checkpoint_completed")) == 8000
    assert [r.event for r in records].count("start") == 1
    assert records[0].event == "start"


def test_no_line_overtakes_the_start_line_while_it_is_being_written() -> None:
    class SlowFirstWrite(io.StringIO):
        """The first write (the start line) takes a while, as on a slow pipe."""

        def __init__(self) -> None:
            super().__init__()
            self.writing = threading.Event()

        def write(self, s: str) -> int:
            if not self.writing.is_set():
                self.writing.set()
                time.sleep(0.2)  # not a wait: the slow pipe's pace
            return super().write(s)

    out = SlowFirstWrite()
    reporter.configure(stream=out, min_interval=0)
    first = threading.Thread(target=reporter.checkpoint_completed, args=(1,))
    first.start()
    assert out.writing.wait(within(PROMPT))
    reporter.checkpoint_completed(2)  # meanwhile, from another thread
    first.join(within(PROMPT))
    assert [(r.event, r.step) for r in parsed(out)] == [
        ("start", None),
        ("checkpoint_completed", 1),
        ("checkpoint_completed", 2),
    ]


# ---------------------------------------------------------------------------- isolation


def test_importing_the_reporter_loads_only_the_standard_library() -> None:
    result = run_child(
        """
        import sys
        before = set(sys.modules)
        from recoverygate import reporter
        at_import = sorted(set(sys.modules) - before)
        reporter.progress(1)
        after_first_line = sorted(set(sys.modules) - before)
        print(" ".join(at_import))
        print(" ".join(after_first_line))
        """
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if not line.startswith("RECOVERYGATE")]
    at_import, after_first_line = (set(line.split()) for line in lines)
    ours = {"recoverygate", "recoverygate.reporter", "recoverygate.wire"}
    # json costs more than the whole import budget: it waits for the first line.
    assert at_import - ours <= {"__future__"}
    stdlib = set(sys.stdlib_module_names)
    third_party = {m for m in after_first_line - ours if m.split(".")[0] not in stdlib}
    assert third_party == set()


def test_the_package_root_imports_nothing_eagerly() -> None:
    result = run_child("import sys, recoverygate; print('recoverygate.reporter' in sys.modules)")
    assert result.stdout == "False\n"
    assert recoverygate.__version__ == "0.1.0"
    assert set(reporter.__all__) == {
        "checkpoint_completed",
        "checkpoint_failed",
        "checkpoint_load_started",
        "checkpoint_loaded",
        "checkpoint_started",
        "configure",
        "enabled",
        "progress",
        "state_digest",
    }


def test_the_start_event_is_stamped_with_the_process_start_not_the_first_report() -> None:
    import json
    import subprocess
    import sys

    code = (
        "import time\n"
        "from recoverygate import reporter\n"
        "time.sleep(0.4)  # imports and initialization before the first step\n"
        "reporter.progress(1)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=within(JOB),
    ).stdout
    events = [
        json.loads(line.split(" ", 1)[1])
        for line in out.splitlines()
        if line.startswith("RECOVERYGATE/v1 ")
    ]
    start, progress = events[0], events[1]
    assert start["event"] == "start"
    assert progress["time"] - start["time"] >= 0.35
