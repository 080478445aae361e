"""What torchrun says, read: its command line (the restart budget) and its output (why
the job ended, which rank failed first). Pure text in, values out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pytest_recoverygate.shared.joboutput import EXCEPTION_LINE, torchrun_rank_of
from pytest_recoverygate.shared.textbounds import cap_lines

__all__ = ["ERROR_LINE", "OUTPUT_TAIL", "max_restarts", "root_cause", "root_cause_fields"]

_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def max_restarts(command: Sequence[str]) -> int | None:
    """torchrun's ``--max-restarts`` (``--max_restarts``) in ``command``, or None.

    None when the command is not torchrun itself (a shell script that runs it, say) or
    does not say: then the job's restart budget cannot be read from the drill's config.
    torchrun's own default (0 restarts) is not assumed for a command that does not say.
    """
    args = list(command)
    start = next(
        (
            i + 1
            for i, arg in enumerate(args)
            if arg.rsplit("/", 1)[-1] in _LAUNCHERS or arg in _LAUNCHERS
        ),
        None,
    )
    if start is None:
        return None
    for index in range(start, len(args)):
        arg = args[index]
        if not arg.startswith("-"):
            return None  # the training script: the rest are its own arguments
        name, sep, value = arg.partition("=")
        if name not in ("--max-restarts", "--max_restarts"):
            continue
        if not sep:
            value = args[index + 1] if index + 1 < len(args) else ""
        return int(value) if value.isdigit() else None
    return None


ERROR_LINE = re.compile(EXCEPTION_LINE.pattern, re.M)
OUTPUT_TAIL = 50000  # characters of the job's output the root cause is read from
#: torchrun's "Root Cause" block, field by field, each searched once after the one before
#: (one regex with three lazy ``.*?`` over the whole tail was the job's to make cubic: 4 kB
#: of "Root Cause rank: 1 exitcode: 1 " took 3.8 s, 8 kB 47 s, holding the GIL).
_ROOT_CAUSE_FIELDS = (
    re.compile(r"rank[ \t]*:[ \t]*(\d{1,9})"),
    re.compile(r"exitcode[ \t]*:[ \t]*(-?\d{1,9})"),
    re.compile(r"traceback[ \t]*:[ \t]*([^\n]*)"),
)
_NO_TRACEBACK = "To enable traceback"


def root_cause_fields(output: str) -> tuple[str, str, str] | None:
    """(rank, exit code, traceback) of torchrun's first "Root Cause" block in the tail of
    ``output`` (its lines cut to MAX_MATCH_LINE), or None. Linear in the text."""
    tail, _ = cap_lines(output[-OUTPUT_TAIL:])
    pos = tail.find("Root Cause")
    if pos < 0:
        return None
    found: list[str] = []
    for pattern in _ROOT_CAUSE_FIELDS:
        match = pattern.search(tail, pos)
        if match is None:
            return None  # a later block cannot have what this one's rest lacks
        found.append(match.group(1))
        pos = match.end()
    return found[0], found[1], found[2]


def root_cause(output: str) -> str:
    """Why the job ended, in one line: torchrun's error, its root-cause rank, the worker's error.

    torchrun ends with ``ChildFailedError`` and a "Root Cause" block naming the first
    rank that failed and how (a signal, or an exit code); the worker's own exception is
    the last other ``SomethingError: message`` line before it, preferably one the root
    cause rank printed (``[rank0]: …``): the other ranks' errors are often only the echo
    of its failure ("Connection closed by peer").
    """
    tail, _ = cap_lines(output[-OUTPUT_TAIL:])
    errors = [
        (
            m.group(1).rsplit(".", 1)[-1],
            (m.group(2) or "").strip(),
            torchrun_rank_of(m.group(0).encode("utf-8", "replace")),
        )
        for m in ERROR_LINE.finditer(tail)
    ]
    parts: list[str] = []
    launcher = next((e for e in reversed(errors) if e[0] == "ChildFailedError"), None)
    if launcher is not None:
        parts.append(launcher[0])
    cause = root_cause_fields(output)
    worker_errors = [e for e in errors if e[0] != "ChildFailedError"]
    if cause:
        rank, code, trace = cause[0], cause[1], cause[2].strip()
        how = f" ({trace})" if trace and not trace.startswith(_NO_TRACEBACK) else ""
        parts.append(f"root cause rank {rank}, exit code {code}{how}")
        own = [e for e in worker_errors if e[2] == f"rank {rank}"]
        untagged_after = worker_errors and worker_errors[-1][2] is None
        if own and not untagged_after:  # an untagged error last: a failed init, show it
            worker_errors = own
    worker = worker_errors[-1] if worker_errors else None
    if worker is not None:
        name, message, _ = worker
        parts.append(
            f"last worker error: {name}: {message}" if message else f"last worker error: {name}"
        )
    return "; ".join(parts)  # whole: the report keeps it all, the terminal may shorten it
