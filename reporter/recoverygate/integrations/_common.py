"""What every framework integration shares: never raising, barriers, fsync, markers, digests.

Nothing here imports torch: ``torch.distributed`` is looked up in ``sys.modules`` (a
framework that trains has imported it long before a hook runs), so this module stays as
cheap as the reporter for the start-up hook.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from recoverygate import reporter

__all__ = [
    "MARKER_NAME",
    "barrier",
    "digest_of",
    "distributed",
    "fsync_tree",
    "global_rank",
    "is_complete_marker",
    "safe",
    "warn_once",
    "world_size",
    "write_marker",
]

#: The file a callback writes into a checkpoint folder once every rank's part is in it.
MARKER_NAME = ".recoverygate-complete"

F = TypeVar("F", bound=Callable[..., Any])

_warned: set[str] = set()


def warn_once(what: str, error: BaseException | str) -> None:
    """Say on stderr, once per ``what``, that an integration hit a problem. Never raises."""
    if what in _warned:
        return
    _warned.add(what)
    try:
        detail = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        sys.stderr.write(f"recoverygate: {what}: {detail} (training continues)\n")
        sys.stderr.flush()
    except Exception:  # stderr closed: nothing left to tell
        return


def safe(what: str) -> Callable[[F], F]:
    """A hook that can never raise into training: an exception is reported once, then None."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as error:
                warn_once(f"{what} ({fn.__name__})", error)
                return None

        return run  # type: ignore[return-value]

    return wrap


def distributed() -> Any:
    """``torch.distributed`` when a process group is up, else None (never imports torch)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:
        return None
    return None


def world_size() -> int:
    """The process group's size, or ``WORLD_SIZE``, or 1."""
    dist = distributed()
    if dist is not None:
        return int(dist.get_world_size())
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def global_rank() -> int:
    """This process's global rank: the process group's, or ``RANK``, or 0."""
    dist = distributed()
    if dist is not None:
        return int(dist.get_rank())
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def barrier() -> bool:
    """Wait for every rank of the default group; True once all got here (or there is one).

    False when the barrier failed (a peer died): nothing can then be said about the other
    ranks' files, so the caller reports nothing.
    """
    dist = distributed()
    if dist is None or dist.get_world_size() <= 1:
        return True
    try:
        dist.barrier()
    except Exception as error:
        warn_once("the checkpoint barrier failed, the checkpoint is not reported", error)
        return False
    return True


def _fsync_path(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str) -> None:
    """fsync every file under ``path`` (a file or a folder), then the folders, then its parent."""
    if os.path.isfile(path):
        _fsync_path(path, os.O_RDONLY)
    else:
        for root, _dirs, files in os.walk(path):
            for name in files:
                _fsync_path(os.path.join(root, name), os.O_RDONLY)
            _fsync_path(root, os.O_RDONLY)
    parent = os.path.dirname(os.path.abspath(path))
    _fsync_path(parent, os.O_RDONLY)


def write_marker(folder: str, step: int, *, fsync: bool) -> None:
    """Mark ``folder`` complete: written to a temporary name, then renamed into place.

    The temporary file is a fresh one (``mkstemp``: ``O_CREAT|O_EXCL``, a random name), so
    a link planted at a predictable name cannot redirect the write.
    """
    marker = os.path.join(folder, MARKER_NAME)
    body = json.dumps({"step": int(step), "worldSize": world_size()}, separators=(",", ":"))
    fd, tmp = tempfile.mkstemp(prefix=f".{MARKER_NAME}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o644)  # readable like the checkpoint beside it (mkstemp: 0600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(body + "\n")
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, marker)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        _fsync_path(folder, os.O_RDONLY)


def is_complete_marker(folder: str, step: int | None = None) -> bool:
    """Whether ``folder`` holds a readable marker (for ``step``, when given)."""
    try:
        with open(os.path.join(folder, MARKER_NAME), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and (step is None or data.get("step") == step)


def digest_of(
    parts: Mapping[str, object], what: str, *, everywhere: bool = False
) -> dict[str, str] | None:
    """The state digest of ``parts`` (name -> object), on a rank that prints; else None.

    ``everywhere``: compute it on every rank and return it only where it prints -- for
    state whose ``state_dict()`` is a collective (FSDP full state dicts, DeepSpeed, a DCP
    ``Stateful`` that gathers), which would hang if only the printing rank called it.
    Parts that are None are left out. A digest that cannot be computed is reported once
    and dropped: the step is still reported.
    """
    printing = reporter.enabled()
    if not printing and not everywhere:
        return None
    named = {name: value for name, value in parts.items() if value is not None}
    if not named:
        return None
    try:
        digest = reporter.state_digest(named, parts=True)
    except Exception as error:
        warn_once(f"{what}: no state digest", error)
        return None
    return digest if printing else None
