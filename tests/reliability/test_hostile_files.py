"""A job's files cannot make the drill read, write or hang on what it points them at.

The drill may run as root (node faults) or as a Slurm operator, and everything a job
controls is hostile input: its output file's path, the files it can plant beside it,
the text it prints. We test these aspects, each attack reproduced with real files:

- the output tail (Slurm's output file, local attach, Ray's worker logs) never follows a
  symbolic link planted at the job's path, before or after it started reading; never
  blocks on a FIFO there; never reads a hard link to a file of another user's (a
  stand-in for ``/etc/shadow`` holding a secret we create) when the drill is not the
  job's user; and says once, with the reason, that it refused the file;
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from pytest_recoverygate.orchestrators.slurm.events import SlurmEventSource
from pytest_recoverygate.registry.seams import Notices, SimulatedClock
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.filetail import OutputTail, RefusedFile, open_job_file
from tests.reliability.conftest import Figures

SECRET = b"root:$6$s3cr3t-shadow-hash:19000:0:99999:7:::\n"
JOB_UID = 65534  # a job user that is not the drill's (nobody)
AS_ROOT = os.geteuid() == 0


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file standing in for /etc/shadow: the drill's own (root's when run as root)."""
    victim = tmp_path / "etc" / "shadow"
    victim.parent.mkdir()
    victim.write_bytes(SECRET)
    victim.chmod(0o600)
    return victim


class Tail:
    """An OutputTail of ``path`` as a backend builds one, feeding a real event source."""

    made: ClassVar[list[Tail]] = []

    def __init__(self, path: Path, owner: int | None) -> None:
        Tail.made.append(self)
        self.chunks: list[bytes] = []
        self.source = StreamEventSource()
        self.tail = OutputTail(
            str(path),
            self._sink,
            SimulatedClock(),
            interval=0.02,
            owner=owner,
            on_notice=self.source.notice,
        )

    def _sink(self, chunk: bytes, _received: float) -> None:
        self.chunks.append(chunk)
        self.source.feed(chunk)

    @property
    def read(self) -> bytes:
        return b"".join(self.chunks)

    def notices(self) -> list[str]:
        return [text for _, text in self.source.notices()]


@pytest.fixture(autouse=True)
def _stop_tails() -> Iterator[None]:
    yield
    while Tail.made:
        Tail.made.pop().tail.stop()


def _job_file(path: Path, text: bytes, uid: int | None) -> Path:
    path.write_bytes(text)
    if uid is not None:
        os.chown(path, uid, -1)
    return path


def test_a_symlink_at_the_jobs_path_is_never_followed(
    tmp_path: Path, secret: Path, figures: Figures
) -> None:
    link = tmp_path / "slurm-7.out"
    link.symlink_to(secret)
    tail = Tail(link, owner=os.geteuid())  # even as the job's own user: never followed

    assert tail.tail.poll_once() == 0
    assert tail.tail.poll_once() == 0

    assert SECRET not in tail.read
    assert tail.notices() == [
        f"not reading the job's file {link}: it is a symbolic link (not followed)"
    ]  # once, though polled twice
    with pytest.raises(RefusedFile, match="symbolic link"):
        open_job_file(str(link), os.geteuid())
    figures.add("hostile_files.symlinks_refused")


def test_a_file_swapped_for_a_symlink_mid_drill_is_read_to_its_end_and_no_further(
    tmp_path: Path, secret: Path, figures: Figures
) -> None:
    path = _job_file(tmp_path / "train.log", b"step 1\n", None)
    tail = Tail(path, owner=os.geteuid())
    tail.tail.poll_once()
    with path.open("ab") as handle:
        handle.write(b"step 2\n")  # written before the swap: still the job's
    planted = tmp_path / "planted"
    planted.symlink_to(secret)
    planted.rename(path)  # the job replaces its output with a link (atomic rename)

    tail.tail.poll_once()
    tail.tail.poll_once()

    assert tail.read == b"step 1\nstep 2\n"
    assert tail.notices() == [
        f"not reading the job's file {path}: it is a symbolic link (not followed)"
    ]
    path.unlink()
    path.write_bytes(b"step 3\n")  # a real file again: read from its start, said so
    tail.tail.poll_once()
    assert tail.read == b"step 1\nstep 2\nstep 3\n"
    assert tail.notices() == [f"reading the job's file {path} again: it passes the checks"]
    figures.add("hostile_files.symlinks_refused")


def test_a_fifo_at_the_jobs_path_does_not_hang_the_tail(tmp_path: Path, figures: Figures) -> None:
    fifo = tmp_path / "slurm-7.out"
    os.mkfifo(fifo)
    tail = Tail(fifo, owner=os.geteuid())
    done = threading.Event()

    def poll() -> None:
        tail.tail.seek_end()
        tail.tail.poll_once()
        done.set()

    started = time.monotonic()
    threading.Thread(target=poll, daemon=True).start()
    assert done.wait(5), "the tail blocked opening a FIFO with no writer"
    assert time.monotonic() - started < 5
    assert tail.notices() == [
        f"not reading the job's file {fifo}: it is a FIFO (named pipe), not a regular file"
    ]
    tail.tail.start()  # the thread polls it again and again, and stops when asked
    time.sleep(0.1)
    stopped = time.monotonic()
    tail.tail.stop()
    assert time.monotonic() - stopped < 2
    figures.add("hostile_files.fifos_refused")


@pytest.mark.skipif(not AS_ROOT, reason="a file of another user's needs root to make")
def test_a_hard_link_to_another_users_file_is_not_read_when_the_drill_is_not_the_job(
    tmp_path: Path, secret: Path, figures: Figures
) -> None:
    link = tmp_path / "slurm-7.out"
    os.link(secret, link)  # same inode as the secret: O_NOFOLLOW does not see it
    tail = Tail(link, owner=JOB_UID)

    assert tail.tail.poll_once() == 0

    assert SECRET not in tail.read
    assert tail.notices() == [
        f"not reading the job's file {link}: it is owned by uid 0, not by the job's user "
        f"(uid {JOB_UID}), and the drill runs as uid 0: a link to another user's file"
    ]
    figures.add("hostile_files.hard_links_refused")


@pytest.mark.skipif(not AS_ROOT, reason="the root-only rule")
def test_as_root_without_the_jobs_user_a_file_root_owns_is_refused(
    tmp_path: Path, secret: Path
) -> None:
    link = tmp_path / "slurm-7.out"
    os.link(secret, link)
    with pytest.raises(RefusedFile, match="owned by root"):
        open_job_file(str(link), None)


@pytest.mark.skipif(not AS_ROOT, reason="a file of another user's needs root to make")
def test_the_job_users_own_file_is_read_as_root(tmp_path: Path) -> None:
    path = _job_file(tmp_path / "slurm-7.out", b"step 1\n", JOB_UID)
    tail = Tail(path, owner=JOB_UID)
    tail.tail.poll_once()
    assert tail.read == b"step 1\n"
    assert tail.notices() == []


def test_the_slurm_source_hands_the_refusal_to_the_runner(tmp_path: Path, secret: Path) -> None:
    link = tmp_path / "slurm-7.out"
    link.symlink_to(secret)
    source = SlurmEventSource(StreamEventSource())
    tail = source.follow(str(link), SimulatedClock(), interval=0.02, owner=os.geteuid())
    tail.poll_once()
    assert isinstance(source, Notices)
    source.close()
    assert [text for _, text in source.notices()] == [
        f"not reading the job's file {link}: it is a symbolic link (not followed)"
    ]
