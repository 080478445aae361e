"""What the storage layer and the drill say to each other: the fault modes, which file
operations each mode hits, and the one-line JSON commands and events on the two pipes.

The storage layer (:mod:`pytest_recoverygate.storage.fs`, a process of its own) is a
FUSE passthrough mounted over exactly the job's checkpoint folder. The drill
(:mod:`pytest_recoverygate.storage.layer`) writes commands to its standard input
and reads events from a pipe of its own; both are one JSON object a line:

- commands: ``{"cmd": "arm", "mode": M, "during": D, "latency": S, "free": B}``,
  ``{"cmd": "lift"}``, ``{"cmd": "exit"}``. End of input is ``exit``: a drill that dies
  takes its fault and its mount with it.
- events: ``ready`` (mounted), ``armed``, ``failed`` (an operation the fault failed),
  ``stalled`` / ``delayed`` (the first operation the fault holds / delays), ``wrote`` (a
  file closed after writes: its bytes), ``renamed``, ``removed``, ``truncated`` (a file's
  contents cut), ``lifted``, ``exit``; each with ``t`` (this
  machine's clock) and, for file events, ``path`` relative to the folder and the caller's
  ``pid``.

Bounded: at most :data:`MAX_EVENTS` events of each kind are sent one by one; past that
the layer counts them (``dropped`` in its ``exit`` event), so a job that writes a million
files cannot flood the drill.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "DURING",
    "EVENT_KINDS",
    "LOAD_OPS",
    "MAX_EVENTS",
    "MAX_LINE",
    "MODES",
    "SAVE_OPS",
    "command",
    "ops_hit",
    "parse_event",
]

#: ``injectFailure.mode``: what the faulted storage does.
MODES = ("enospc", "eio", "readonly", "stall", "latency")
#: ``injectFailure.during``: the save after the trigger, or the replacement's load.
DURING = ("save", "load")

#: The operations a save makes (write side): ``latency`` delays them under ``during:
#: save``; ``eio`` fails the ones a failing disk fails (:func:`ops_hit`).
SAVE_OPS = frozenset(
    {"create", "write", "fsync", "fsyncdir", "rename", "fallocate", "mkdir", "truncate"}
)
#: The operations a load makes (read side).
LOAD_OPS = frozenset({"read"})
_EIO_SAVE = frozenset({"write", "fsync", "fsyncdir", "rename", "fallocate"})

EVENT_KINDS = frozenset(
    {
        "ready",
        "armed",
        "failed",
        "stalled",
        "delayed",
        "wrote",
        "renamed",
        "removed",
        "truncated",
        "lifted",
        "exit",
    }
)
#: Events of one kind sent one by one; further ones are counted.
MAX_EVENTS = 2000
#: The longest line either side reads; a longer one is dropped.
MAX_LINE = 8192


def ops_hit(mode: str, during: str) -> frozenset[str]:
    """The operations ``mode`` acts on, ``during`` a save or a load.

    ``eio`` fails writes, fsync and rename (and fallocate) of a save, reads of a load;
    ``latency`` delays the save's operations or the load's reads; ``stall`` holds every
    operation; ``enospc`` and ``readonly`` hit what writes, whatever ``during`` says (a
    load that writes nothing never meets them).
    """
    if mode == "eio":
        return _EIO_SAVE if during == "save" else LOAD_OPS
    if mode == "latency":
        return SAVE_OPS if during == "save" else LOAD_OPS
    return frozenset()


def command(cmd: str, **fields: Any) -> bytes:
    """One command line."""
    return (json.dumps({"cmd": cmd, **fields}, separators=(",", ":")) + "\n").encode()


def parse_event(line: bytes) -> dict[str, Any] | None:
    """An event line as a mapping with a known ``ev`` and a numeric ``t``; None otherwise."""
    if len(line) > MAX_LINE:
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("ev") not in EVENT_KINDS:
        return None
    t = value.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        return None
    return value
