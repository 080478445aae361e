"""Parsing Slurm's outputs, from files captured on real clusters (see data/README.md).

We test these aspects:
- ``scontrol show job``: 22.05's one-line form in every state the drill meets (running,
  requeued and pending, failed, cancelled, completed with an output pattern and a job
  name with spaces), a 24.x one-line record whose SubmitLine has spaces and
  ``--options=``, and a 25.x multi-line record with fields 22.05 does not print;
- ``scontrol show step``, ``squeue -O`` rows, ``scontrol listpids`` and the node probe;
- which process is which rank (torchrun's workers by ``RANK``, srun tasks by task id);
- Slurm's own failure lines in the job output;
- the output tail: every byte handed on once in bounded reads (partial lines are the
  parser's), whole lines to the marker check, truncation, a new inode (the old file read
  to its end first), a rewrite past the offset, and a requeue that appends.

No cluster is needed; these run everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_recoverygate.errors import DiscoveryError, UsageError
from pytest_recoverygate.orchestrators.slurm import SlurmOrchestrator
from pytest_recoverygate.orchestrators.slurm.parsing import (
    JobInfo,
    ProcessRow,
    StepInfo,
    assign_ranks,
    expand_output_pattern,
    parse_listpids,
    parse_probe_output,
    parse_scontrol_records,
    parse_slurm_marker,
    parse_squeue_rows,
)
from pytest_recoverygate.registry.seams import Orchestrator, SimulatedClock
from pytest_recoverygate.shared.filetail import MARKER_LINE_KEEP, READ_CHUNK, OutputTail

DATA = Path(__file__).parent / "data"


def test_it_satisfies_the_orchestrator_protocol_and_cleans_up_twice() -> None:
    orch: Orchestrator = SlurmOrchestrator(job_id=1, clock=SimulatedClock())
    assert orch.name == "slurm"
    orch.cleanup()
    orch.cleanup()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs workload.jobId or workload.jobName"),
        ({"job_id": 1, "fault": "PartitionNode"}, "unknown fault type 'PartitionNode'"),
    ],
)
def test_it_refuses_a_config_it_cannot_drill(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        SlurmOrchestrator(clock=SimulatedClock(), **kwargs)  # type: ignore[arg-type]


def job(name: str) -> JobInfo:
    records = parse_scontrol_records((DATA / name).read_text())
    assert len(records) == 1
    return JobInfo.from_record(records[0])


def test_it_reads_a_running_22_05_job() -> None:
    info = job("scontrol-show-job-22.05-running.txt")
    assert (info.job_id, info.name, info.user, info.state) == ("2", "rgtest", "root", "RUNNING")
    assert info.restarts == 0
    assert info.requeue
    assert info.nodes == "localhost"
    assert info.batch_host == "localhost"
    assert info.stdout == "/tmp/rgjobs/slurm-2.out"


def test_it_reads_a_requeued_job_waiting_to_run_again() -> None:
    info = job("scontrol-show-job-22.05-requeued-pending.txt")
    assert (info.state, info.reason, info.restarts) == ("PENDING", "BeginTime", 1)
    assert info.nodes == ""


def test_it_reads_the_end_of_a_failed_and_of_a_cancelled_job() -> None:
    failed = job("scontrol-show-job-22.05-failed.txt")
    assert (failed.state, failed.reason, failed.exit_code) == ("FAILED", "NonZeroExitCode", "1:0")
    cancelled = job("scontrol-show-job-22.05-cancelled.txt")
    assert (cancelled.state, cancelled.restarts) == ("CANCELLED", 1)
    assert "state FAILED" in failed.describe_end()


def test_values_with_spaces_stay_whole() -> None:
    info = job("scontrol-show-job-22.05-completed-output-pattern.txt")
    assert info.name == "rg name with space"
    assert info.stdout == "/tmp/rgjobs/out-rg name with space-4.log"


def test_it_reads_a_24_x_record_whose_submit_line_has_options() -> None:
    record = parse_scontrol_records(
        (DATA / "scontrol-show-job-24.x-oneline-submitline.txt").read_text()
    )[0]
    assert record["SubmitLine"] == "sbatch -n1 --wrap sleep 60"
    assert record["StdErr"] == ""
    assert record["AllocTRES"] == "cpu=2,mem=1547579M,node=1,billing=2"
    info = JobInfo.from_record(record)
    assert (info.job_id, info.state, info.stdout, info.nodes) == (
        "132",
        "RUNNING",
        "/u/mer/slurm-132.out",
        "n01",
    )


def test_an_option_with_equals_inside_a_value_is_not_a_field() -> None:
    text = "JobId=7 JobName=x JobState=RUNNING SubmitLine=sbatch --job-name=x --output=a.out t.sh WorkDir=/w"
    record = parse_scontrol_records(text)[0]
    assert record["SubmitLine"] == "sbatch --job-name=x --output=a.out t.sh"
    assert record["WorkDir"] == "/w"


def test_it_reads_a_25_x_multi_line_record_with_new_fields() -> None:
    info = job("scontrol-show-job-25.x-multiline-slinky.txt")
    assert (info.job_id, info.name, info.user, info.state) == (
        "1",
        "job-sleep-single",
        "slurm",
        "CANCELLED",
    )
    assert info.stdout == ""
    record = parse_scontrol_records(
        (DATA / "scontrol-show-job-25.x-multiline-slinky.txt").read_text()
    )[0]
    assert record["OOMKillStep"] == "0"
    assert record["AdminComment"] == '{"pods":["slurm-bridge/job-sleep-single-8wtc2"]}'


def test_it_reads_steps_and_tells_training_steps_from_the_rest() -> None:
    records = parse_scontrol_records(
        (DATA / "scontrol-show-step-22.05-running.txt").read_text(), "StepId"
    )
    steps = [StepInfo.from_record(r) for r in records]
    assert [(s.step, s.state, s.tasks, s.is_training) for s in steps] == [
        ("batch", "RUNNING", 1, False),
        ("0", "RUNNING", 2, True),
    ]
    probe = StepInfo("2", "1", "recoverygate-probe", "RUNNING", "localhost")
    assert not probe.is_training


def test_it_reads_squeue_rows_including_a_held_job() -> None:
    rows = parse_squeue_rows((DATA / "squeue-by-name-22.05-two-jobs.txt").read_text())
    assert [(r["JobID"], r["Name"], r["State"], r["Reason"]) for r in rows] == [
        ("3", "rg torchrun", "PENDING", "JobHeldUser"),
        ("2", "rg torchrun", "RUNNING", "None"),
    ]


def test_it_reads_listpids_and_maps_srun_tasks_to_ranks() -> None:
    rows = parse_listpids((DATA / "scontrol-listpids-22.05-srun-two-tasks.txt").read_text())
    step_rows = [r for r in rows if r.step == "0"]
    assert {rank: row.pid for rank, row in assign_ranks(step_rows).items()} == {0: 5587, 1: 5588}


def test_it_maps_torchrun_workers_to_ranks_by_their_rank_variable() -> None:
    text = (DATA / "probe-22.05-torchrun-listed.txt").read_text()
    rows = parse_probe_output(text, "localhost")
    assert rows is not None
    ranks = assign_ranks([r for r in rows if r.step == "0"])
    assert {rank: row.pid for rank, row in ranks.items()} == {0: 15004, 1: 15005}
    assert ranks[1].start == "830783"
    assert ranks[1].world_size == 2
    assert ranks[1].restart_count == 0
    assert ranks[1].node == "localhost"


def test_torchrun_without_workers_yet_has_no_ranks() -> None:
    launcher = ProcessRow(pid=10, step="0", global_id=0, launcher=True)
    assert assign_ranks([launcher]) == {}


def test_a_worker_s_children_are_not_workers() -> None:
    worker = ProcessRow(pid=20, step="0", global_id=None, ppid=10, rank_env=1)
    loader = ProcessRow(pid=21, step="0", global_id=None, ppid=20, rank_env=1)
    assert assign_ranks([worker, loader]) == {1: worker}


def test_two_unrelated_processes_with_one_rank_are_refused() -> None:
    a = ProcessRow(pid=20, step="0", global_id=None, ppid=10, rank_env=1)
    b = ProcessRow(pid=30, step="0", global_id=None, ppid=11, rank_env=1)
    with pytest.raises(DiscoveryError, match="two processes claim RANK=1"):
        assign_ranks([a, b])


def test_a_probe_that_did_not_finish_is_not_trusted() -> None:
    text = (DATA / "probe-22.05-torchrun-listed.txt").read_text().replace("RGPROBE-END", "")
    assert parse_probe_output(text, "localhost") is None


def test_an_older_probe_s_rows_without_the_listing_are_refused() -> None:
    # rows only the listpids listing printed before them can vouch for (tests/reliability/
    # test_hostile_slurm.py: a job's process names and environment forge such rows)
    with pytest.raises(DiscoveryError, match="no RGPIDS-END"):
        parse_probe_output((DATA / "probe-22.05-torchrun.txt").read_text(), "localhost")


@pytest.mark.parametrize(
    ("line", "marker"),
    [
        ("srun: error: localhost: task 1: Killed", "srun: error: localhost: task 1: Killed"),
        (
            "slurmstepd: error: *** STEP 12.0 ON n01 CANCELLED AT 2026-11-29T13:50:23 ***",
            "slurmstepd: error: *** STEP 12.0 ON n01 CANCELLED AT 2026-11-29T13:50:23 ***",
        ),
        (
            "0: srun: error: n3: tasks 0-3: Exited with exit code 1",
            "srun: error: n3: tasks 0-3: Exited with exit code 1",
        ),
        ("[default1]: step 10 loss 0.1", None),
    ],
)
def test_it_recognises_slurm_s_own_failure_lines(line: str, marker: str | None) -> None:
    assert parse_slurm_marker(line) == marker


def test_output_patterns_expand_like_sbatch_does() -> None:
    info = job("scontrol-show-job-22.05-running.txt")
    assert expand_output_pattern("logs/%x-%j.out", info) == "logs/rgtest-2.out"
    assert expand_output_pattern("%u/%N/100%%.log", info) == "root/localhost/100%.log"


class Tail:
    """An OutputTail over a real file, driven poll by poll (no thread)."""

    def __init__(self, path: Path) -> None:
        self.chunks: list[bytes] = []
        self.lines: list[bytes] = []
        self.start_overs = 0
        self.tail = OutputTail(
            str(path),
            lambda chunk, _t: self.chunks.append(chunk),
            SimulatedClock(),
            on_line=lambda line, _t: self.lines.append(line),
            on_start_over=self._started_over,
            owner=os.geteuid(),  # the file is the test's own
        )

    def _started_over(self) -> None:
        self.start_overs += 1

    def read(self) -> bytes:
        self.tail.poll_once()
        out, self.chunks = b"".join(self.chunks), []
        return out


@pytest.fixture
def make_tail() -> Iterator[Callable[[Path], Tail]]:
    """Tails of the test; each is stopped after it (a tail keeps the file it read open)."""
    made: list[Tail] = []

    def make(path: Path) -> Tail:
        made.append(Tail(path))
        return made[-1]

    yield make
    for tail in made:
        tail.tail.stop()


def test_the_tail_hands_on_every_byte_once_and_whole_lines_to_the_marker_check(
    tmp_path: Path, make_tail: Callable[[Path], Tail]
) -> None:
    path = tmp_path / "slurm-1.out"
    tail = make_tail(path)
    assert tail.read() == b""  # the file does not exist yet
    path.write_bytes(b"one\ntw")
    assert tail.read() == b"one\ntw"  # the partial line is the parser's to keep
    assert tail.lines == [b"one"]
    with path.open("ab") as f:
        f.write(b"o\nthree")
    assert tail.read() == b"o\nthree"
    assert tail.lines == [b"one", b"two"]
    assert tail.read() == b""


def test_the_tail_reads_a_giant_line_in_bounded_pieces(
    tmp_path: Path, make_tail: Callable[[Path], Tail]
) -> None:
    path = tmp_path / "out"
    giant = READ_CHUNK * 3 + 5
    with path.open("wb") as f:
        f.write(b"x" * giant)
        f.write(b" srun: error: node1: task 1: Killed\n")
    tail = make_tail(path)
    tail.tail.poll_once()
    assert max(len(c) for c in tail.chunks) <= READ_CHUNK
    assert len(b"".join(tail.chunks)) == giant + len(b" srun: error: node1: task 1: Killed\n")
    # the marker check saw only the end of the giant line, with the marker in it
    assert len(tail.lines) == 1 and len(tail.lines[0]) <= MARKER_LINE_KEEP + READ_CHUNK
    assert tail.lines[0].endswith(b"srun: error: node1: task 1: Killed")


def test_the_tail_starts_over_when_the_file_shrinks(
    tmp_path: Path, make_tail: Callable[[Path], Tail]
) -> None:
    path = tmp_path / "out"
    tail = make_tail(path)
    path.write_bytes(b"old line one\nold line two\npartial")
    assert tail.read() == b"old line one\nold line two\npartial"
    path.write_bytes(b"new\n")
    assert tail.read() == b"new\n"
    assert tail.tail.restarts == 1
    assert tail.start_overs == 1
    assert tail.lines == [b"old line one", b"old line two", b"new"]  # "partial" dropped


def test_the_tail_starts_over_when_the_file_is_rewritten_past_the_offset(
    tmp_path: Path, make_tail: Callable[[Path], Tail]
) -> None:
    path = tmp_path / "out"
    tail = make_tail(path)
    path.write_bytes(b"first run line\n")
    assert tail.read() == b"first run line\n"
    path.write_bytes(b"second run, a longer line\n")  # truncated and rewritten between polls
    assert tail.read() == b"second run, a longer line\n"
    assert tail.start_overs == 1


def test_the_tail_reads_a_replaced_file_after_the_end_of_the_old_one(
    tmp_path: Path, make_tail: Callable[[Path], Tail]
) -> None:
    path = tmp_path / "out"
    tail = make_tail(path)
    path.write_bytes(b"a\n")
    assert tail.read() == b"a\n"
    with path.open("ab") as f:
        f.write(b"written just before the rotation\n")
    os.replace(path, tmp_path / "out.1")  # rotated by rename; the writer had finished
    path.write_bytes(b"b\n")
    assert tail.read() == b"written just before the rotation\nb\n"
    assert tail.start_overs == 1


def test_a_requeue_that_appends_keeps_the_offset(
    tmp_path: Path, make_tail: Callable[[Path], Tail]
) -> None:
    path = tmp_path / "out"
    tail = make_tail(path)
    path.write_bytes(b"run one\n")
    assert tail.read() == b"run one\n"
    tail.tail.restart()  # Restarts incremented; the job writes with --open-mode=append
    assert tail.read() == b""
    with path.open("ab") as f:
        f.write(b"run two\n")
    assert tail.read() == b"run two\n"
    assert tail.start_overs == 0


def test_a_requeue_that_truncates_and_outgrows_the_offset_is_read_again(
    tmp_path: Path, make_tail: Callable[[Path], Tail]
) -> None:
    path = tmp_path / "out"
    tail = make_tail(path)
    filler = b"x" * 100
    path.write_bytes(b"run one " + filler + b"\n")
    assert tail.read() == b"run one " + filler + b"\n"
    tail.tail.restart()
    assert tail.read() == b""
    # The same last 64 bytes before the old offset, another start: only the head check,
    # armed by the restart, can see that this is a new file.
    path.write_bytes(b"run two " + filler + b"\nmore\n")
    assert tail.read() == b"run two " + filler + b"\nmore\n"
    assert tail.start_overs == 1
