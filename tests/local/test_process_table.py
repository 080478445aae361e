"""A look at the process table is that look's own.

A full CI run failed two multi-node drills with ``watching the job failed:
KeyError('create_time')``: each node's watcher took the process table through psutil's
``process_iter``, which caches its Process objects for the whole process and replaces
their ``info`` on every walk, so the table one watcher had just taken lost the start
times it had added as soon as the other watcher walked the table. The table is now read
from ``/proc`` into records of its own.

We test these aspects, on real child processes:
- a table stays whole when other code walks psutil's table meanwhile (the Ray backend's
  marker search does), and when two threads take tables at once;
- each row says what psutil says of that process: parent, start time (the identity's),
  zombie or not;
- a row reads the process's environment now, and None once the process is gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import psutil
import pytest

from pytest_recoverygate.orchestrators.local.processes import Identity, process_table
from tests.patience import JOB, PROMPT, eventually, within


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "RG_TABLE_PROBE": "a=b=c"},
    )
    yield proc
    proc.kill()
    proc.wait(timeout=within(PROMPT))


def test_a_table_keeps_its_start_times_when_other_code_walks_psutils_table(
    child: subprocess.Popen[bytes],
) -> None:
    table, children = process_table()
    list(psutil.process_iter(["pid"]))  # e.g. the Ray backend's search for its marker

    row = table[child.pid]
    assert Identity(row.pid, row.create_time) == Identity.of(psutil.Process(child.pid))
    assert row.ppid == os.getpid()
    assert child.pid in children[os.getpid()]


def test_two_threads_taking_tables_at_once_each_get_whole_rows(
    child: subprocess.Popen[bytes],
) -> None:
    expected = Identity.of(psutil.Process(child.pid))
    errors: list[BaseException] = []

    def look() -> None:
        try:
            for _ in range(20):
                table, _ = process_table()
                for row in table.values():
                    assert row.create_time > 0 and row.ppid >= 0
                assert Identity(child.pid, table[child.pid].create_time) == expected
        except BaseException as exc:  # reported below, with the thread's failure
            errors.append(exc)

    threads = [threading.Thread(target=look) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=within(JOB))
    assert errors == []


def test_a_row_says_what_psutil_says_of_the_process(child: subprocess.Popen[bytes]) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    zombie = psutil.STATUS_ZOMBIE  # exited, not waited for yet
    eventually(lambda: psutil.Process(dead.pid).status() == zombie, "the child's exit", PROMPT)
    try:
        table, _ = process_table()
        assert table[dead.pid].zombie
        assert not table[child.pid].zombie
        me = table[os.getpid()]
        assert me.ppid == os.getppid()
        assert Identity(me.pid, me.create_time) == Identity.of(psutil.Process())
    finally:
        dead.wait(timeout=within(PROMPT))


def test_a_row_reads_the_environment_now_and_none_once_the_process_is_gone(
    child: subprocess.Popen[bytes],
) -> None:
    table, _ = process_table()
    row = table[child.pid]
    environ = row.environ()
    assert environ is not None
    assert environ["RG_TABLE_PROBE"] == "a=b=c"  # split at the first '=' only
    assert environ == psutil.Process(child.pid).environ()

    child.kill()
    child.wait(timeout=within(PROMPT))
    assert row.environ() is None
