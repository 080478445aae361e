"""What a multi-node drill that was itself SIGKILLed left behind, found and removed
(``recoverygate sweep``; docs/nodes.md).

A drill cleans up on every way out but one: a SIGKILL of the drill process itself
(``kill -9``, the OOM killer). Its network namespaces stay, with its job's processes still
in them, and so does its folder. So each drill's network claims an **owner record** before
it makes its first namespace: ``recoverygate-netns-rgID.json`` in the drill lock folder
(:func:`~pytest_recoverygate.shared.lock.lock_dir`: ``/run/recoverygate`` as root), which
names the drill and its folder, and which the drill holds an exclusive ``flock`` on for as
long as it runs. It removes the record once every namespace it made is gone.

The kernel drops a ``flock`` when its holder dies, whatever kills it, so ownership needs
no pid (which the system may have given to another process since): a record that
:func:`sweep` can lock belongs to a drill that is no longer running. For such a record
alone, and only for what carries that drill's own names, it

1. SIGKILLs the processes inside the drill's namespaces (``rgID-sw``, ``rgID-nK``,
   ``rgID-nK-rJ``), each by pidfd, after checking through it that the process is still
   in that namespace and is the one listed (its start time);
2. deletes the namespaces (their veth pairs and the bridge go with them);
3. removes the drill's folder, only when it is a ``recoverygate-nodes-*`` folder (not a
   link) in the temp folder;
4. removes the record.

A record still locked (its drill is running), a namespace no record names, and a record
that is not a plain file of the drill's user with one link, or whose content is not what
a drill writes, are left alone, and the sweep says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pytest_recoverygate.errors import BackendError
from pytest_recoverygate.orchestrators.local.netns import NETNS_DIR, delete_netns
from pytest_recoverygate.orchestrators.local.processes import pidfd_open, start_time
from pytest_recoverygate.shared.lock import lock_dir

__all__ = [
    "RECORD_PREFIX",
    "OwnerRecord",
    "SweepReport",
    "claim",
    "namespace_pattern",
    "sweep",
]

RECORD_PREFIX = "recoverygate-netns-rg"
_ID = re.compile(r"[0-9a-f]{1,32}")
_RECORD_BYTES = 4096  # a drill writes about 100
EXIT_WAIT = 5.0  # seconds for the SIGKILLed processes to leave their namespaces


def namespace_pattern(drill_id: str) -> re.Pattern[str]:
    """The names :class:`~.netns.Network` gives drill ``drill_id``'s namespaces."""
    return re.compile(rf"rg{re.escape(drill_id)}-(sw|n[0-9]+(-r[0-9]+)?)")


@dataclass
class OwnerRecord:
    """A running drill's claim on its namespaces: the record file, locked while it runs."""

    drill_id: str
    path: Path
    fd: int

    def release(self, *, done: bool) -> None:
        """Give up the claim; with ``done`` (every namespace gone) remove the record too,
        else leave it for :func:`sweep`."""
        if self.fd < 0:
            return
        if done:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self.fd)  # drops the flock
        self.fd = -1


def claim(drill_id: str, folder: Path) -> OwnerRecord:
    """Write and lock drill ``drill_id``'s owner record (before its first namespace)."""
    if not _ID.fullmatch(drill_id):
        raise BackendError(f"drill id {drill_id!r} is not lowercase hex")
    path = lock_dir() / f"{RECORD_PREFIX}{drill_id}.json"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise BackendError(f"the drill's owner record {path} could not be made: {exc}") from exc
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new and ours: nobody else holds it
    text = json.dumps({"drill": drill_id, "pid": os.getpid(), "folder": str(folder)})
    os.write(fd, text.encode("utf-8"))
    return OwnerRecord(drill_id, path, fd)


@dataclass
class SweepReport:
    """What one sweep found and did: lines to print, and what it could not remove."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)  # drill ids whose leftovers went


def sweep(*, dry_run: bool = False, directory: Path | None = None) -> SweepReport:
    """Remove what each drill that no longer runs left behind (see the module docstring);
    with ``dry_run``, only say what that is."""
    report = SweepReport()
    folder = directory or lock_dir()
    records = sorted(folder.glob(f"{RECORD_PREFIX}*.json"))
    owned: set[str] = set()
    for path in records:
        drill_id = path.name[len(RECORD_PREFIX) : -len(".json")]
        if _ID.fullmatch(drill_id):
            owned.add(drill_id)
            _sweep_record(path, drill_id, report, dry_run=dry_run)
        else:
            report.lines.append(f"{path}: not a record a drill writes; left alone")
    for name in _namespaces():
        match = re.fullmatch(r"rg([0-9a-f]+)-.*", name)
        if (
            match
            and match.group(1) not in owned
            and namespace_pattern(match.group(1)).fullmatch(name)
        ):
            report.lines.append(
                f"namespace {name}: named like a drill's, but no owner record names it (a "
                "drill from before records, or another tool's); left alone"
            )
    if not report.lines:
        report.lines.append(f"nothing to sweep: no drill's owner record in {folder}")
    return report


def _sweep_record(path: Path, drill_id: str, report: SweepReport, *, dry_run: bool) -> None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        report.lines.append(f"{path}: cannot be opened ({exc.strerror}); left alone")
        return
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1:
            report.lines.append(f"{path}: not a plain file of this user; left alone")
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report.lines.append(f"drill rg{drill_id}: running (it holds its record); left alone")
            return
        content = _read_record(fd, drill_id)
        if content is None:
            report.lines.append(f"{path}: not what a drill writes; left alone")
            return
        pid, drill_folder = content
        names = [n for n in _namespaces() if namespace_pattern(drill_id).fullmatch(n)]
        head = f"drill rg{drill_id} (pid {pid}, no longer running)"
        if dry_run:
            report.lines.append(
                f"{head}: would remove namespaces {', '.join(names) or 'none'}, the processes "
                f"in them, and {drill_folder}"
            )
            return
        problems = _remove(drill_id, names, drill_folder, report)
        report.problems += problems
        if problems:
            report.lines.append(f"{head}: not all removed: {'; '.join(problems)}")
            return
        report.lines.append(
            f"{head}: removed namespaces {', '.join(names) or 'none'} and {drill_folder}"
        )
        report.swept.append(drill_id)
        path.unlink()
    finally:
        os.close(fd)


def _read_record(fd: int, drill_id: str) -> tuple[int, Path] | None:
    """The pid and folder a drill's record names, or None when it is not one."""
    try:
        data = json.loads(os.pread(fd, _RECORD_BYTES, 0).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("drill") != drill_id:
        return None
    pid, folder = data.get("pid"), data.get("folder")
    if not isinstance(pid, int) or not isinstance(folder, str):
        return None
    return pid, Path(folder)


def _namespaces() -> list[str]:
    with contextlib.suppress(OSError):
        return sorted(p.name for p in NETNS_DIR.iterdir())
    return []


def _remove(drill_id: str, names: list[str], folder: Path, report: SweepReport) -> list[str]:
    """End the processes in ``names``, delete them, remove the folder: what failed."""
    problems: list[str] = []
    killed: list[tuple[str, int]] = []
    for name in names:
        killed += [(name, pid) for pid in _kill_inside(name, report)]
    deadline = time.monotonic() + EXIT_WAIT
    while any(_in_namespace(pid, name) for name, pid in killed) and time.monotonic() < deadline:
        _reap(pid for _, pid in killed)
        time.sleep(0.05)
    _reap(pid for _, pid in killed)
    for name, pid in killed:
        if _in_namespace(pid, name):
            problems.append(f"pid {pid} is still in namespace {name} after SIGKILL")
    if problems:
        return problems
    for name in reversed(names):  # the nodes first, the switch last
        try:
            delete_netns(name)
        except BackendError as exc:
            problems.append(str(exc))
    if folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith(
        "recoverygate-nodes-"
    ):
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(folder).st_mode):
                shutil.rmtree(folder)
    elif str(folder):
        report.lines.append(
            f"drill rg{drill_id}: its record names folder {folder}, which is not a drill's "
            "folder (recoverygate-nodes-* in the temp folder); left alone"
        )
    return problems


def _netns_key(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _in_namespace(pid: int, name: str) -> bool:
    """Process ``pid`` is alive in namespace ``name`` (a zombie is in none)."""
    key = _netns_key(str(NETNS_DIR / name))
    return key is not None and _netns_key(f"/proc/{pid}/ns/net") == key


def _kill_inside(name: str, report: SweepReport) -> list[int]:
    """SIGKILL every process in namespace ``name``, each pinned by a pidfd and checked to
    be the process listed and still in it; the pids signalled."""
    key = _netns_key(str(NETNS_DIR / name))
    if key is None:
        return []
    listed = [
        (int(entry), start_time(int(entry)))
        for entry in os.listdir("/proc")
        if entry.isdigit() and _netns_key(f"/proc/{entry}/ns/net") == key
    ]
    signalled: list[int] = []
    for pid, started in listed:
        pidfd = pidfd_open(pid)
        if pidfd is None:
            report.problems.append(f"pid {pid} in namespace {name}: no pidfd; not signalled")
            continue
        try:
            if started is None or start_time(pid) != started or not _in_namespace(pid, name):
                continue  # gone, or another process by now
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            signalled.append(pid)
        except ProcessLookupError:
            continue
        finally:
            os.close(pidfd)
    return signalled


def _reap(pids: Iterable[int]) -> None:
    """Collect the exit status of those killed processes that are this process's children
    (a sweep run by a subreaper adopts them); any other pid is not touched."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
