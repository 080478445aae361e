"""What a multi-node drill that was itself SIGKILLed left behind, found and removed
(``recoverygate sweep``; docs/nodes.md).

A drill cleans up on every way out but one: a SIGKILL of the drill process itself
(``kill -9``, the OOM killer). Its network namespaces stay, with its job's processes still
in them, and so does its folder. So each drill's network claims an **owner record** before
it makes its first namespace: ``recoverygate-netns-rgID.json`` in the drill lock folder
(:func:`~pytest_recoverygate.shared.lock.lock_dir`: ``/run/recoverygate`` as root), which
names the drill and its folder, and which the drill holds an exclusive ``flock`` on for as
long as it runs. It removes the record once its namespaces and folder are gone.

The kernel drops a ``flock`` when its holder dies, whatever kills it, so ownership needs
no pid (which the system may have given to another process since): a record that
:func:`sweep` can lock belongs to a drill that is no longer running. For such a record
alone, and only for what carries that drill's own names, it

1. SIGKILLs the processes inside the drill's namespaces (``rgID-sw``, ``rgID-nK``,
   ``rgID-nK-rJ``), each pinned by a pidfd and checked, once pinned, to be in that
   namespace; again until none is left (a process forked meanwhile too), for up to
   :data:`EXIT_WAIT` seconds. While one is left, nothing is deleted: deleting the name
   would leave it running in a namespace nothing could find again;
2. deletes the namespaces (their veth pairs and the bridge go with them), nodes first;
3. removes the drill's folder, only when it is the very folder the drill made (the
   device and inode the record holds), not a link;
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
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pytest_recoverygate.errors import BackendError
from pytest_recoverygate.orchestrators.local.netns import NETNS_DIR, delete_netns
from pytest_recoverygate.orchestrators.local.processes import pidfd_open, start_time
from pytest_recoverygate.shared.lock import lock_dir, same_file

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
_RECORD_BYTES = 4096  # a drill writes about 150
EXIT_WAIT = 5.0  # seconds for the processes in a dead drill's namespaces to be gone


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
        """Give up the claim; with ``done`` (nothing of the drill left) remove the record
        too (while still holding it), else leave it for :func:`sweep`."""
        if self.fd < 0:
            return
        if done:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self.fd)  # drops the flock
        self.fd = -1


def claim(drill_id: str, folder: Path) -> OwnerRecord:
    """Write and lock drill ``drill_id``'s owner record (before its first namespace).

    The record is written and locked under a name no sweep looks at, then linked into
    place, so a sweep never sees it unlocked or half written."""
    if not _ID.fullmatch(drill_id):
        raise BackendError(f"drill id {drill_id!r} is not lowercase hex")
    where = lock_dir()
    path = where / f"{RECORD_PREFIX}{drill_id}.json"
    draft = where / f".{RECORD_PREFIX}{drill_id}.{os.getpid()}.draft"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(draft, flags, 0o600)
    except OSError as exc:
        raise BackendError(f"the drill's owner record {path} could not be made: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        info = os.lstat(folder)
        text = json.dumps(
            {
                "drill": drill_id,
                "pid": os.getpid(),
                "folder": str(folder),
                "folderId": [info.st_dev, info.st_ino],
            }
        )
        os.write(fd, text.encode("utf-8"))
        os.link(draft, path)
    except OSError as exc:
        os.close(fd)
        raise BackendError(f"the drill's owner record {path} could not be made: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            draft.unlink()
    return OwnerRecord(drill_id, path, fd)


@dataclass
class SweepReport:
    """What one sweep found and did: lines to print, and what it could not remove."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)  # drill ids whose leftovers went


def sweep(*, dry_run: bool = False, directory: Path | None = None) -> SweepReport:
    """Remove what each drill that no longer runs left behind (see the module docstring);
    with ``dry_run``, only say what that is. A drill lock folder that cannot be used
    raises :class:`~pytest_recoverygate.errors.DiscoveryError`."""
    report = SweepReport()
    folder = directory or lock_dir()
    owned: set[str] = set()
    for path in sorted(folder.glob(f"{RECORD_PREFIX}*.json")):
        drill_id = path.name[len(RECORD_PREFIX) : -len(".json")]
        if not _ID.fullmatch(drill_id):
            report.lines.append(f"{path}: not a record a drill writes; left alone")
            continue
        owned.add(drill_id)
        try:
            _sweep_record(path, drill_id, report, dry_run=dry_run)
        except OSError as exc:
            report.problems.append(f"{path}: {exc}")
            report.lines.append(f"drill rg{drill_id}: not swept: {exc}")
    for name in _namespaces():
        match = re.fullmatch(r"rg([0-9a-f]+)-.*", name)
        if (
            match
            and match.group(1) not in owned
            and namespace_pattern(match.group(1)).fullmatch(name)
        ):
            report.lines.append(
                f"namespace {name}: named like a drill's, but no owner record in {folder} "
                "names it (a drill of another user or lock folder, one from before records, "
                "or another tool's); left alone"
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
        if not same_file(fd, path):  # its drill removed it between the open and the lock
            report.lines.append(f"drill rg{drill_id}: ended meanwhile, and cleaned up")
            return
        content = _read_record(fd, drill_id)
        if content is None:
            report.lines.append(f"{path}: not what a drill writes; left alone")
            return
        pid, drill_folder, folder_id = content
        names = _drill_namespaces(drill_id)
        # "No longer running" is what the free lock proves; the pid is only what the record
        # says (a forged record may name any pid).
        head = f"drill rg{drill_id} (no longer running; its record names pid {pid})"
        if dry_run:
            report.lines.append(
                f"{head}: would remove namespaces {', '.join(names) or 'none'}, the processes "
                f"in them, and {drill_folder}"
            )
            return
        problems, folder_said = _remove(drill_id, names, drill_folder, folder_id)
        if problems:
            report.problems += problems
            report.lines.append(f"{head}: not all removed: {'; '.join(problems)}")
            return
        report.lines.append(
            f"{head}: removed namespaces {', '.join(names) or 'none'}; {folder_said}"
        )
        report.swept.append(drill_id)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    finally:
        os.close(fd)


def _read_record(fd: int, drill_id: str) -> tuple[int, Path, tuple[int, int]] | None:
    """The pid, folder and folder identity a drill's record names, or None when it is
    not one."""
    try:
        data = json.loads(os.pread(fd, _RECORD_BYTES, 0).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("drill") != drill_id:
        return None
    pid, folder, folder_id = data.get("pid"), data.get("folder"), data.get("folderId")
    if not isinstance(pid, int) or not isinstance(folder, str) or not folder:
        return None
    if not (
        isinstance(folder_id, list)
        and len(folder_id) == 2
        and all(isinstance(n, int) for n in folder_id)
    ):
        return None
    return pid, Path(folder), (folder_id[0], folder_id[1])


def _namespaces() -> list[str]:
    with contextlib.suppress(OSError):
        return sorted(p.name for p in NETNS_DIR.iterdir())
    return []


def _drill_namespaces(drill_id: str) -> list[str]:
    """Drill ``drill_id``'s namespaces: its nodes first, its switch last."""
    pattern = namespace_pattern(drill_id)
    names = [n for n in _namespaces() if pattern.fullmatch(n)]
    return sorted(names, key=lambda n: (n.endswith("-sw"), n))


def _remove(
    drill_id: str, names: list[str], folder: Path, folder_id: tuple[int, int]
) -> tuple[list[str], str]:
    """End the processes in ``names``, delete them, remove the folder: what failed, and
    what became of the folder.

    Nothing is deleted while a process is still in one of the namespaces (deleting the
    name would leave it running in a namespace nothing can find again)."""
    problems: list[str] = []
    deadline = time.monotonic() + EXIT_WAIT
    while True:
        inside = {name: _pids_inside(name) for name in names}
        if not any(inside.values()):
            break
        if time.monotonic() >= deadline:
            for name, pids in inside.items():
                problems += [
                    f"pid {pid} is still in namespace {name} after SIGKILL" for pid in pids
                ]
            return problems, ""
        for name, pids in inside.items():
            problems += _kill_inside(name, pids)
        if problems:
            return problems, ""
        time.sleep(0.05)
        _reap(pid for pids in inside.values() for pid in pids)
    for name in names:
        try:
            delete_netns(name)
        except BackendError as exc:
            problems.append(str(exc))
    try:
        found = os.lstat(folder)
    except FileNotFoundError:
        return problems, f"its folder {folder} was gone already"
    if not stat.S_ISDIR(found.st_mode) or (found.st_dev, found.st_ino) != folder_id:
        return problems, (
            f"{folder} is not the folder the drill made (another file or folder has that "
            "name now): left alone"
        )
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        problems.append(f"{folder} could not be removed: {exc}")
    return problems, f"removed its folder {folder}"


def _netns_key(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _pids_inside(name: str) -> list[int]:
    """The live processes in namespace ``name`` (a zombie is in none)."""
    key = _netns_key(str(NETNS_DIR / name))
    if key is None:
        return []
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and _netns_key(f"/proc/{entry}/ns/net") == key
    ]


def _kill_inside(name: str, pids: list[int]) -> list[str]:
    """SIGKILL each of ``pids``, pinned by a pidfd and checked through it to be still in
    namespace ``name``; what could not be signalled."""
    key = _netns_key(str(NETNS_DIR / name))
    problems: list[str] = []
    for pid in pids:
        pidfd = pidfd_open(pid)
        if pidfd is None:
            if start_time(pid) is not None and _netns_key(f"/proc/{pid}/ns/net") == key:
                problems.append(f"pid {pid} in namespace {name} could not be pinned (pidfd)")
            continue  # otherwise it is gone
        try:
            # Pinned: the pid now names this process until the pidfd is closed.
            if key is not None and _netns_key(f"/proc/{pid}/ns/net") == key:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            continue
        except PermissionError as exc:
            problems.append(f"pid {pid} in namespace {name} could not be signalled: {exc}")
        finally:
            os.close(pidfd)
    return problems


def _reap(pids: Iterable[int]) -> None:
    """Collect the exit status of those killed processes that are this process's children
    (a sweep run by a subreaper adopts them); any other pid is not touched."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
