"""The job's own output, kept per worker in bounded memory (pytest_recoverygate/shared/joboutput.py).

We test these aspects: a worker's log keeps its head and its tail within the bound and
marks the cut visibly, on a line boundary; torchrun's merged stream stays whole while
each rank's prefixed lines also go to that rank (``[default1]:`` of ``--tee``,
``[rank1]:`` of torch's tracebacks, not the ``[1]:`` of torchrun's failure summary);
SLURM's ``--label`` prefixes name tasks; lines split across chunks are rejoined; the
failing worker is the one whose error came last; the excerpt of the failing worker ends
at its error (not at the launcher's summary) and leaves out the reporter's lines; the
report folder gets one file per worker and report.json names them. Real torchrun output
from tests/diagnosis/data is used where the format matters.
"""

from __future__ import annotations

import json
from pathlib import Path

from pytest_recoverygate.shared.joboutput import (
    JobOutput,
    OutputSplitter,
    WorkerLog,
    WorkerOutput,
    failure_excerpt,
    file_name,
    slurm_task_of,
    torchrun_rank_of,
)

DATA = Path(__file__).resolve().parent / "diagnosis" / "data"


def feed_in_chunks(splitter: OutputSplitter, data: bytes, size: int = 777) -> None:
    for start in range(0, len(data), size):
        splitter.feed(data[start : start + size])


def test_a_worker_log_under_its_bound_is_kept_whole() -> None:
    log = WorkerLog(limit=1000)
    log.write(b"line 1\n")
    log.write(b"line 2\n")
    assert log.text() == "line 1\nline 2\n"
    assert log.cut_bytes == 0


def test_a_worker_log_keeps_head_and_tail_and_marks_the_cut_on_a_line_boundary() -> None:
    log = WorkerLog(limit=1000)
    for number in range(500):
        log.write(f"line {number:04d}\n".encode())
    text = log.text()
    assert log.size <= 1000
    assert text.startswith("line 0000\n")
    assert text.endswith("line 0499\n")
    head, marker, tail = text.partition("\n[... recoverygate: ")
    assert marker, text
    assert head.splitlines()[-1].startswith("line ")  # the head ends on what it kept
    assert "bytes of this output were cut here; the first and the last 500 bytes are kept" in tail
    after_marker = tail.split("...]\n", 1)[1]
    assert after_marker.startswith("line ")  # resumes on a whole line
    assert all(len(line) == 9 for line in after_marker.splitlines())


def test_a_worker_log_stays_bounded_whatever_is_written() -> None:
    log = WorkerLog(limit=4096)
    for _ in range(1000):
        log.write(b"x" * 1500)
    assert log.size == 4096
    assert log.cut_bytes == 1000 * 1500 - 4096


def test_prefixes_name_ranks_and_tasks_but_not_torchruns_failure_entries() -> None:
    assert torchrun_rank_of(b"[default1]:step 3") == "rank 1"
    assert torchrun_rank_of(b"[rank12]: Traceback") == "rank 12"
    assert torchrun_rank_of(b"[default0]:[rank0]: RuntimeError") == "rank 0"
    assert torchrun_rank_of(b"[1]:") is None  # an entry of torchrun's "Failures:" block
    assert torchrun_rank_of(b"[E1201 11:16:37.343 ProcessGroupGloo.cpp:67] Gloo") is None
    assert slurm_task_of(b"0: hello") == "task 0"
    assert slurm_task_of(b" 3: hello") == "task 3"
    assert slurm_task_of(b"10:30 am") is None


def test_file_names_are_safe() -> None:
    assert file_name("rank 1") == "rank-1.log"
    assert file_name("pod llama-worker-0") == "pod-llama-worker-0.log"
    assert file_name("../../etc/passwd") == "etc-passwd.log"


def test_torchruns_merged_output_stays_whole_and_each_rank_gets_its_lines() -> None:
    data = (DATA / "collective-timeout-5s.log").read_bytes()  # torchrun --tee=3
    splitter = OutputSplitter(torchrun_rank_of, merged="torchrun")
    feed_in_chunks(splitter, data)
    output = splitter.output(order=["torchrun"])
    assert [w.label for w in output.workers] == ["torchrun", "rank 0", "rank 1"]
    assert output.workers[0].text == data.decode()
    rank0 = output.get("rank 0")
    assert rank0 is not None
    assert all(line.startswith("[default0]:") for line in rank0.text.splitlines())
    assert "Timed out waiting 5000ms" in rank0.text
    assert output.failing == "rank 0"


def test_an_untagged_error_after_the_ranks_lines_makes_the_launcher_stream_the_failing_one() -> (
    None
):
    # the restarted group failed in init_process_group, before torch tags its lines
    splitter = OutputSplitter(torchrun_rank_of, merged="torchrun")
    feed_in_chunks(splitter, (DATA / "torchrun-shared-tcp-store.log").read_bytes())
    output = splitter.output(order=["torchrun"])
    assert output.failing == "torchrun"
    label, lines = output.excerpt() or ("", ())
    assert label == "torchrun"
    assert lines[-1].startswith("RuntimeError: Gloo connectFullMesh failed")
    assert not any("ChildFailedError" in line for line in lines)


def test_the_excerpt_ends_at_the_workers_error_and_leaves_out_reporter_lines() -> None:
    text = (
        'RECOVERYGATE/v1 {"event":"progress","time":1.0,"inc":"a","step":1}\n'
        "Traceback (most recent call last):\n"
        '  File "train.py", line 1, in <module>\n'
        "RuntimeError: boom\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "=====\nRoot Cause (first observed failure):\n=====\n"
    )
    assert failure_excerpt(text, 2) == (
        '  File "train.py", line 1, in <module>',
        "RuntimeError: boom",
    )
    assert "RECOVERYGATE/v1" not in "\n".join(failure_excerpt(text, 20))
    assert failure_excerpt("a\nb\nc\n", 2) == ("b", "c")  # no error: the last lines


def test_lines_split_across_chunks_and_streams_are_rejoined() -> None:
    splitter = OutputSplitter(slurm_task_of, merged="job")
    splitter.feed(b"0: hel", stream="a")
    splitter.feed(b"1: other\n", stream="b")
    splitter.feed(b"lo\n", stream="a")
    output = splitter.output(order=["job"])
    assert output.get("task 0") == WorkerOutput("task 0", "0: hello\n")
    assert output.get("task 1") == WorkerOutput("task 1", "1: other\n")


def test_a_stream_that_is_one_worker_goes_to_its_label() -> None:
    splitter = OutputSplitter(lambda line: None, default="pod log")
    splitter.feed(b"[default1]:x\nRuntimeError: y\n", "uid-1", label="pod llama-0")
    output = splitter.output()
    assert [w.label for w in output.workers] == ["pod llama-0"]
    assert output.failing == "pod llama-0"


def test_the_number_of_separate_worker_logs_is_bounded() -> None:
    from pytest_recoverygate.shared.joboutput import MAX_WORKERS

    splitter = OutputSplitter(slurm_task_of, merged="job", limit=1024)
    for task in range(MAX_WORKERS + 50):
        splitter.feed(f"{task}: hello\n".encode())
    labels = [w.label for w in splitter.output().workers]
    assert len(labels) == MAX_WORKERS + 1  # and "other workers" shares the rest
    assert "other workers" in labels


def test_an_empty_job_output_has_no_excerpt() -> None:
    assert JobOutput().excerpt() is None
    assert JobOutput().text == ""


def test_the_report_folder_keeps_one_file_per_worker_named_in_report_json(
    write_drill: object,
    tmp_path: Path,
) -> None:
    from pytest_recoverygate.cli import main

    out = tmp_path / "out"
    # The job never comes back: the drill waits out its recovery timeout, 2 s (the SLO).
    never = {"workload": {"fake": {"resume": "never"}}, "timeouts": {"recovery": "2s"}}
    path = write_drill(never)  # type: ignore[operator]
    assert main(["run", "-f", str(path), "-q", "--report-dir", str(out)]) == 1
    doc = json.loads((out / "report.json").read_text())
    assert doc["jobOutput"] == {"rank 0": "output/rank-0.log", "rank 1": "output/rank-1.log"}
    assert "killed by SIGKILL" in (out / "output" / "rank-1.log").read_text()
    assert doc["failingWorker"] == "rank 1"
    assert doc["failingWorkerTail"][-1] == "[fake job] the group does not restart (resume: never)"
    assert doc["jobOutputNote"]
