"""The storage layer itself: a real FUSE mount over a real folder, each mode against the
kernel's own behaviour, and what it leaves behind when the drill dies.

We test these aspects:
- passthrough: the folder's earlier files stay readable through the mount, and the layer
  reports what the job writes, renames, truncates and removes (relative paths);
- a link planted in the folder is never followed by the layer (it runs as root);
- enospc holds the same operations to the same outcome as a real full ext4 (a loop
  mount made with no reserved blocks): an empty file can be made, a write fails
  ENOSPC, mkdir fails, rename/truncate/unlink work, statfs shows no free block; with a
  few free blocks a write that does not fit is a short write, then ENOSPC;
- readonly answers as a real read-only bind mount does (EROFS for every write, reads
  work), and reports each refusal;
- eio fails writes, fsync and rename of a save, reads of a load;
- stall holds an operation until lifted (then it completes), and a process blocked in a
  held operation still dies of SIGKILL; latency delays each operation;
- the drill SIGKILLed: the layer unmounts itself; the drill and the layer both
  SIGKILLed: ``recoverygate sweep`` unmounts what is left, and leaves a running drill's
  layer alone.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "mfusepy", reason="the storage layer needs mfusepy and libfuse3 (scripts/setup)"
)

from pytest_recoverygate.engine.model import StorageEvent, StorageEventKind
from pytest_recoverygate.storage.layer import (
    RECORD_PREFIX,
    StorageLayer,
    our_mounts,
    sweep,
)
from tests.patience import PROCESS, PROMPT, eventually, stays, within

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a FUSE layer needs root"),
    pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse"),
]

ROOT = Path(__file__).resolve().parents[2]


def collected(layer: StorageLayer, kind: StorageEventKind, at_least: int = 1) -> list[StorageEvent]:
    """The layer's events of ``kind``, waited for: they come over a pipe, after the
    operation they report has returned to its caller."""
    got: list[StorageEvent] = []

    def enough() -> bool:
        got.extend(e for e in layer.events() if e.kind is kind)
        return len(got) >= at_least

    eventually(enough, f"{at_least} {kind.value} event(s)", PROMPT)
    return got


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    made = tmp_path / "ckpt"
    made.mkdir()
    (made / "step-20.pt").write_bytes(b"twenty" * 100)
    return made


@pytest.fixture
def layer(folder: Path) -> Iterator[StorageLayer]:
    mounted = StorageLayer(folder)
    mounted.mount()
    try:
        yield mounted
    finally:
        assert mounted.close() is None
        assert not [t for t, _ in our_mounts() if t == str(folder)], "the mount is gone"


def outcomes(ops: list[tuple[str, Callable[[Path], object]]], where: Path) -> list[tuple[str, str]]:
    """Each named operation's outcome on ``where``, in order."""
    return [(name, outcome(functools.partial(op, where))) for name, op in ops]


def outcome(call: Callable[[], object]) -> str:
    """``ok`` or the errno name a call raised."""
    try:
        call()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


def write(path: Path, data: bytes) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        return os.write(fd, data)
    finally:
        os.close(fd)


# ------------------------------------------------------------------ passthrough


def test_the_folder_keeps_its_files_and_the_layer_reports_what_the_job_does(
    layer: StorageLayer, folder: Path
) -> None:
    assert (folder / "step-20.pt").read_bytes() == b"twenty" * 100
    (folder / ".tmp-40").write_bytes(b"x" * 5000)
    os.replace(folder / ".tmp-40", folder / "step-40.pt")
    with open(folder / "step-20.pt", "r+b") as handle:
        handle.truncate(10)
    (folder / "step-20.pt").unlink()
    got: list[tuple[str, str]] = []

    def four() -> bool:
        got.extend((e.kind.value, e.path) for e in layer.events())
        return len(got) >= 4

    eventually(four, "the layer's events")
    assert ("wrote", ".tmp-40") in got
    assert ("renamed", ".tmp-40") in got
    assert ("truncated", "step-20.pt") in got
    assert ("removed", "step-20.pt") in got


def test_a_planted_link_is_never_followed_by_the_layer(folder: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (folder / "sub").mkdir()
    (folder / "sub" / "f").write_bytes(b"mine")
    # Swap the folder for a link under the layer's feet: a path through it is refused.
    from pytest_recoverygate.storage import fs

    root = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    read, write_end = os.pipe()
    try:
        plain = fs.Layer(root, str(folder), fs._Events(write_end))
        os.rename(folder / "sub", tmp_path / "moved")
        os.symlink(outside, folder / "sub")
        with pytest.raises(OSError, match="Too many levels|Not a directory") as caught:
            with plain._at("/sub/f"):
                pass
        assert caught.value.errno in (errno.ELOOP, errno.ENOTDIR)
    finally:
        os.close(root)
        os.close(read)
        os.close(write_end)


# ------------------------------------------------------------------ enospc, as ext4


def full_ext4(tmp_path: Path) -> Iterator[Path]:
    image, mountpoint = tmp_path / "disk.img", tmp_path / "ext4"
    mountpoint.mkdir()
    subprocess.run(["truncate", "-s", "8M", str(image)], check=True)
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", str(image)], check=True
    )
    subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)], check=True)
    try:
        (mountpoint / "existing").write_bytes(b"e" * 100)
        fd = os.open(mountpoint / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for chunk in (65536, 4096, 1):  # to the last byte of the last block
                with contextlib.suppress(OSError):
                    while os.write(fd, b"f" * chunk) == chunk:
                        pass
        finally:
            os.close(fd)
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=False)


SEQUENCE: list[tuple[str, Callable[[Path], object]]] = [
    ("read an existing file", lambda d: (d / "existing").read_bytes()),
    ("create an empty file", lambda d: os.close(os.open(d / "new", os.O_CREAT | os.O_WRONLY))),
    ("write to it", lambda d: write(d / "new", b"n" * 10000)),
    ("mkdir", lambda d: os.mkdir(d / "dir")),
    ("rename", lambda d: os.rename(d / "new", d / "renamed")),
    ("truncate", lambda d: os.truncate(d / "existing", 10)),
    ("unlink", lambda d: os.unlink(d / "renamed")),
]


@pytest.mark.slow  # a loop-mounted ext4 filled to its last block
def test_enospc_answers_as_a_real_full_ext4(tmp_path: Path, folder: Path) -> None:
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 (e2fsprogs) is not installed")
    real = full_ext4(tmp_path)
    disk = next(real)
    try:
        free = os.statvfs(disk).f_bavail  # full: another writer took every block
        kernel = outcomes(SEQUENCE, disk)
    finally:
        with contextlib.suppress(StopIteration):
            next(real)
    (folder / "existing").write_bytes(b"e" * 100)
    layer = StorageLayer(folder)
    layer.mount()
    try:
        layer.arm("enospc", "save")
        assert os.statvfs(folder).f_bavail == free == 0
        ours = outcomes(SEQUENCE, folder)
    finally:
        assert layer.close() is None
    assert ours == kernel
    assert dict(kernel)["write to it"] == "ENOSPC" and dict(kernel)["mkdir"] == "ENOSPC"


def test_a_write_that_does_not_fit_is_a_short_write_then_enospc(folder: Path) -> None:
    layer = StorageLayer(folder)
    layer.mount()
    try:
        layer.arm("enospc", "save", free=8192)
        fd = os.open(folder / "big", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            assert os.write(fd, b"b" * 10000) == 8192
            assert outcome(lambda: os.write(fd, b"b" * 100)) == "ENOSPC"
        finally:
            os.close(fd)
        failed = collected(layer, StorageEventKind.FAILED)
        assert failed[0].error == "ENOSPC" and failed[0].path == "big"
    finally:
        assert layer.close() is None


# ------------------------------------------------------------------ readonly, eio


READONLY: list[tuple[str, Callable[[Path], object]]] = [
    ("read", lambda d: (d / "step-20.pt").read_bytes()),
    ("create", lambda d: os.close(os.open(d / "new", os.O_CREAT | os.O_WRONLY))),
    ("open for writing", lambda d: os.close(os.open(d / "step-20.pt", os.O_WRONLY))),
    ("mkdir", lambda d: os.mkdir(d / "dir")),
    ("rename", lambda d: os.rename(d / "step-20.pt", d / "x")),
    ("unlink", lambda d: os.unlink(d / "step-20.pt")),
]


@pytest.mark.slow  # a real read-only bind mount beside the layer
def test_readonly_answers_as_a_real_read_only_mount_and_reports_each_refusal(
    folder: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    subprocess.run(["mount", "--bind", str(other), str(other)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(other)], check=True)
        kernel = outcomes(READONLY, other)
    finally:
        subprocess.run(["umount", str(other)], check=False)
    layer = StorageLayer(folder)
    layer.mount()
    try:
        layer.arm("readonly", "save")
        ours = outcomes(READONLY, folder)
        refused = [e.op for e in collected(layer, StorageEventKind.FAILED, 4)]
    finally:
        assert layer.close() is None
    assert ours == kernel
    assert {name for name, got in kernel if got == "EROFS"} == {
        "create", "open for writing", "mkdir", "rename", "unlink"
    }  # fmt: skip
    assert len(refused) >= 4, refused
    assert (folder / "step-20.pt").exists(), "nothing was written while read-only"


def test_eio_fails_a_saves_writes_and_a_loads_reads(layer: StorageLayer, folder: Path) -> None:
    layer.arm("eio", "save")
    assert outcome(lambda: write(folder / "s.pt", b"s" * 10)) == "EIO"
    assert outcome(lambda: os.rename(folder / "step-20.pt", folder / "y")) == "EIO"
    assert outcome((folder / "step-20.pt").read_bytes) == "ok"
    layer.lift()
    layer.arm("eio", "load")
    assert outcome((folder / "step-20.pt").read_bytes) == "EIO"
    layer.lift()
    assert (folder / "step-20.pt").read_bytes() == b"twenty" * 100


# ------------------------------------------------------------------ stall, latency


def test_a_held_operation_completes_once_the_stall_is_lifted(
    layer: StorageLayer, folder: Path
) -> None:
    layer.arm("stall", "save")
    done: list[float] = []
    writer = threading.Thread(target=lambda: done.append(write(folder / "held", b"h" * 10)))
    writer.start()
    eventually(
        lambda: any(e.kind is StorageEventKind.STALLED for e in layer.events()), "a held operation"
    )
    stays(lambda: writer.is_alive() and not done, "held, neither failed nor done")
    layer.lift()
    writer.join(within(PROMPT))
    assert done == [10]
    assert (folder / "held").read_bytes() == b"h" * 10


def test_a_process_held_by_the_stall_still_dies_of_sigkill(
    layer: StorageLayer, folder: Path
) -> None:
    layer.arm("stall", "save")
    proc = subprocess.Popen(
        [sys.executable, "-c", f"open({str(folder / 'x')!r}, 'wb').write(b'1')"]
    )
    eventually(
        lambda: any(e.kind is StorageEventKind.STALLED for e in layer.events()), "a held operation"
    )
    stays(lambda: proc.poll() is None, "the held process runs")
    proc.kill()
    assert proc.wait(within(PROCESS)) == -signal.SIGKILL


def test_latency_delays_each_operation(layer: StorageLayer, folder: Path) -> None:
    layer.arm("latency", "save", latency=0.3)
    started = time.monotonic()
    write(folder / "slow", b"s")
    assert time.monotonic() - started >= 0.3
    delayed = collected(layer, StorageEventKind.DELAYED)
    assert delayed[0].path in ("slow", "")


# ------------------------------------------------------------------ a drill that dies

DRILL = textwrap.dedent(
    """
    import sys, time
    from pytest_recoverygate.storage.layer import StorageLayer
    layer = StorageLayer(sys.argv[1])
    layer.mount()
    layer.arm("stall", "save")
    print(layer.fsname, layer._proc.pid, flush=True)
    time.sleep(600)
    """
)


def start_drill(folder: Path, locks: Path) -> tuple[subprocess.Popen[str], str, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", DRILL, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "RECOVERYGATE_LOCK_DIR": str(locks)},
    )
    assert proc.stdout is not None
    with proc.stdout:
        fsname, pid = proc.stdout.readline().split()
    return proc, fsname, int(pid)


@pytest.fixture
def locks(tmp_path: Path) -> Path:
    made = tmp_path / "locks"
    made.mkdir(mode=0o700)
    return made


def test_a_sigkilled_drill_takes_its_fault_and_its_mount_with_it(folder: Path, locks: Path) -> None:
    proc, fsname, layer_pid = start_drill(folder, locks)
    assert any(s == fsname for _, s in our_mounts())
    proc.kill()
    proc.wait()
    eventually(lambda: not any(s == fsname for _, s in our_mounts()), "the layer to unmount")
    eventually(lambda: not Path(f"/proc/{layer_pid}").exists(), "the layer to exit")
    assert (folder / "step-20.pt").read_bytes() == b"twenty" * 100
    report = sweep(directory=locks)  # the record the drill could not remove
    assert not report.problems, report.lines
    assert not list(locks.glob(f"{RECORD_PREFIX}*.json")), report.lines


def test_the_sweep_unmounts_what_a_drill_and_its_layer_killed_together_left(
    folder: Path, locks: Path
) -> None:
    proc, fsname, layer_pid = start_drill(folder, locks)
    os.kill(layer_pid, signal.SIGKILL)  # the layer first: nothing unmounts the folder
    proc.kill()
    proc.wait()
    eventually(lambda: not Path(f"/proc/{layer_pid}").exists(), "the layer to die")
    assert any(s == fsname for _, s in our_mounts()), "a dead mount is left"
    dry = sweep(dry_run=True, directory=locks)
    assert any("would unmount" in line and str(folder) in line for line in dry.lines), dry.lines
    assert any(s == fsname for _, s in our_mounts()), "a dry run touches nothing"
    report = sweep(directory=locks)
    assert not report.problems, report.lines
    assert not any(s == fsname for _, s in our_mounts())
    assert not list(locks.glob(f"{RECORD_PREFIX}*.json"))
    assert (folder / "step-20.pt").read_bytes() == b"twenty" * 100


def test_the_sweep_leaves_a_running_drills_layer_alone(folder: Path, locks: Path) -> None:
    proc, fsname, _ = start_drill(folder, locks)
    try:
        report = sweep(directory=locks)
        assert any("running" in line for line in report.lines), report.lines
        assert any(s == fsname for _, s in our_mounts())
        [record] = list(locks.glob(f"{RECORD_PREFIX}*.json"))
        assert json.loads(record.read_text())["folder"] == str(folder)
    finally:
        proc.kill()
        proc.wait()
    eventually(lambda: not any(s == fsname for _, s in our_mounts()), "the layer to unmount")
    sweep(directory=locks)


def test_a_copy_of_the_mount_in_another_namespace_is_unmounted_there(folder: Path) -> None:
    """A mount namespace made while the layer is mounted (another tool's ``unshare``, with
    private propagation) holds a copy that keeps the layer serving: close unmounts that
    copy, says so in a note (no failure: nothing is left), and the layer exits."""
    layer = StorageLayer(folder)
    layer.mount()
    other = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "120"])
    try:
        mountinfo = Path(f"/proc/{other.pid}/mountinfo")

        def private_copy() -> bool:  # unshare makes it private just after the copy
            lines = [line for line in mountinfo.read_text().splitlines() if layer.fsname in line]
            return bool(lines) and all("shared:" not in line for line in lines)

        eventually(private_copy, "a private copy in the other namespace")
        assert layer.close() is None  # undone, so no failure: a note for the timeline
        assert len(layer.notes) == 1 and "copied into 1 other mount namespace" in layer.notes[0]
        assert layer.fsname not in mountinfo.read_text()
        assert not any(s == layer.fsname for _, s in our_mounts())
    finally:
        other.kill()
        other.wait()
