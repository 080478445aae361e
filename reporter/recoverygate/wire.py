"""The RECOVERYGATE/v1 line: the one definition shared by the writer and every reader.

A training process reports progress by printing lines such as::

    RECOVERYGATE/v1 {"event":"progress","time":1764416834.123456,"inc":"9f2c4e1a0b7d3c55","step":12}

that is the literal sentinel ``RECOVERYGATE/v1``, one space, a compact JSON object and
a newline. Fields (unknown extra fields are ignored, so the format can grow):

=============== ======= =====================================================================
``event``       str     ``start``, ``progress``, ``checkpoint_started``,
                        ``checkpoint_completed``, ``checkpoint_loaded``, ``checkpoint_failed``,
                        ``checkpoint_load_started``, ``poisoned``
``time``        number  POSIX seconds on the emitter's clock, microsecond resolution
``inc``         str     incarnation id, 16 hex chars, random per process
``rank``        int     global rank (``RANK``); absent when unknown
``step``        int     training step (>= 0); required for every event except ``start``
``digest``      str     checkpoint_completed / checkpoint_loaded, optional: the state's
                        fingerprint, 1 to 128 hex digits (read as lower case)
``parts``       object  checkpoint_completed / checkpoint_loaded, optional: part name ->
                        digest of that part (1 to 16 parts; names of 1 to 64 characters
                        from ``A-Z a-z 0-9 _ . : / -``; values as ``digest``)
``pid``         int     start only: the process id
``host``        str     start only: the host name
``restart``     int     start only: ``TORCHELASTIC_RESTART_COUNT``; absent outside torchrun
``local_rank``  int     start only, optional: ``LOCAL_RANK``
``run_id``      str     start only, optional: ``TORCHELASTIC_RUN_ID``
``ppid``        int     start only, optional: the parent process id
``parent``      str     start only, optional: the incarnation id of the process that started
                        this one, when that process had the reporter loaded (a subprocess
                        or forked child of a worker: warm-up, evaluation, a checkpoint
                        writer); absent for a process its launcher started
``world_size``  int     start only, optional: ``WORLD_SIZE``
``replica``     int     start only, optional: the replica group (torchft's
                        ``REPLICA_GROUP_ID``, or ``RECOVERYGATE_REPLICA``)
``source``      str     checkpoint_loaded only, optional: where the state came from,
                        ``checkpoint`` (the default when absent) or ``peer`` (a live replica)
``peer``        int     checkpoint_loaded only, optional: the replica rank the state came from
``loss``        number  progress only, optional: the step's loss, written so that it reads
                        back as the same float (Python's ``repr``); a non-finite loss is the
                        string ``"nan"``, ``"inf"`` or ``"-inf"`` (a number that is no finite
                        float, e.g. ``NaN``, ``1e400`` or a huge integer, is malformed)
``loss_decimals`` int   progress only, optional, with ``loss``: the loss was read from a line
                        the job printed, with that many decimals (0 to 24; of the mantissa in
                        ``1.234e-05`` form): two such losses that are equal are equal to
                        that precision, not bit for bit
``data``        str     progress only, optional: a fingerprint of the step's batch, 1 to 128
                        characters (the reporter writes an int in decimal, bytes in hex, and
                        anything longer than 128 characters as its BLAKE2b-128 hex digest)
``error``       str     checkpoint_failed only, optional: what failed the save (the reporter
                        writes ``Type: message``, at most 200 characters; a reader keeps at
                        most :data:`MAX_ERROR_CHARS`)
``thread``      int     any event but ``start``, optional: which thread of the process printed
                        the line, numbered in the order the threads printed their first line
                        (0 for the first; absent means 0 or not said). Two lines of one
                        process with different numbers came from different threads: a
                        metrics thread's progress, the loop's checkpoints (0 to
                        :data:`MAX_THREAD`; the reporter gives every thread past it that
                        number)
=============== ======= =====================================================================

``checkpoint_failed`` says that the save of the state after ``step`` steps did not become a
checkpoint (it raised, timed out, or was given up): the job says so instead of counting it
(docs/faults.md, StorageFault). ``checkpoint_load_started`` says that a resume began
loading the checkpoint of ``step`` (its ``checkpoint_loaded`` follows once it holds it):
the load phase of a recovery (docs/faults.md, KillDuringRecovery). ``poisoned`` is the
reporter's own, never a job's: a StickyFault made this process die at ``step``
(``RECOVERYGATE_POISON``), the line its last.

``checkpoint_started`` (a save of the state after ``step`` steps began) carries no digest:
on it and on the other events the two fields are unknown fields, ignored. On a checkpoint
event a ``digest`` or ``parts`` field that breaks these rules makes the event malformed,
like any other field of the wrong type. The reporter sends ``parts`` together with ``digest`` =
:func:`combine_parts` of them, so one comparison of ``digest`` says whether two states
match and ``parts`` say which part differs; a writer may send either field alone.

Why the reader looks like this: launchers and log collectors prefix lines
(``[default1]:``, a kubelet timestamp, SLURM's ``0: ``), torchrun glues two ranks' lines
together, tqdm ends its lines with ``\\r``, and a crashing process truncates its last
line. So a sentinel may appear anywhere in a line, several times per physical line, and
everything that is not a well-formed sentinel event is either ignored (no sentinel) or
counted as malformed (a sentinel followed by something else) -- never raised.

The parser must keep up with gigabytes of logs: :class:`StreamParser` looks for the
sentinel with ``bytes.find`` over whole chunks (C speed, no per-line Python loop) and
keeps bounded state whatever the line length.

This module is imported by the reporter only when it first emits, because ``json`` and
``dataclasses`` would cost more than the reporter's whole import budget.
"""

from __future__ import annotations

import json
import math
import operator
import re
from typing import NamedTuple

__all__ = [
    "EVENT_KINDS",
    "LOAD_SOURCES",
    "MAX_DATA_CHARS",
    "MAX_DIGEST_CHARS",
    "MAX_DIGEST_PARTS",
    "MAX_ERROR_CHARS",
    "MAX_EVENT_BYTES",
    "MAX_PART_NAME_CHARS",
    "MAX_STEP",
    "MAX_THREAD",
    "SENTINEL",
    "SENTINEL_BYTES",
    "Record",
    "StreamParser",
    "combine_parts",
    "data_text",
    "digest_fields",
    "format_record",
    "format_start",
    "format_step",
    "is_part_name",
    "json_string",
    "loss_text",
    "normalize_digest",
    "parse_text",
    "printed_decimals",
    "progress_fields",
    "record_from_json",
    "source_fields",
    "step_line_parts",
    "thread_field",
]

SENTINEL = "RECOVERYGATE/v1"
SENTINEL_BYTES = SENTINEL.encode("ascii")
START = "start"
PROGRESS = "progress"
CHECKPOINT_STARTED = "checkpoint_started"
CHECKPOINT_COMPLETED = "checkpoint_completed"
CHECKPOINT_LOADED = "checkpoint_loaded"
CHECKPOINT_FAILED = "checkpoint_failed"
CHECKPOINT_LOAD_STARTED = "checkpoint_load_started"
POISONED = "poisoned"
EVENT_KINDS = frozenset(
    {
        START,
        PROGRESS,
        CHECKPOINT_STARTED,
        CHECKPOINT_COMPLETED,
        CHECKPOINT_LOADED,
        CHECKPOINT_FAILED,
        CHECKPOINT_LOAD_STARTED,
        POISONED,
    }
)
#: The longest ``error`` a reader keeps (a longer one is cut to this, never malformed).
MAX_ERROR_CHARS = 512
#: ``source`` values of checkpoint_loaded (absent means ``checkpoint``).
LOAD_SOURCES = frozenset({"checkpoint", "peer"})
#: Events that may carry ``digest`` and ``parts``.
DIGEST_EVENTS = frozenset({CHECKPOINT_COMPLETED, CHECKPOINT_LOADED})

#: Bounds of the digest fields: a line with 16 parts at their longest is still well under
#: MAX_EVENT_BYTES (16 x (64 + 128 + 6) + ~300 bytes).
MAX_DIGEST_CHARS = 128
MAX_DIGEST_PARTS = 16
MAX_PART_NAME_CHARS = 64
#: The longest ``data`` fingerprint on the wire; a longer one is sent as its digest.
MAX_DATA_CHARS = 128
#: The largest step a line may carry (a 64-bit counter's range): a step beyond any run
#: is malformed, not evidence (a 401-digit step overflowed the figures made of it).
MAX_STEP = 2**63
#: The most decimals ``loss_decimals`` may say (a float holds no more than 17 digits).
MAX_LOSS_DECIMALS = 24
#: The highest ``thread`` number (the reporter numbers every later thread with it).
MAX_THREAD = 63
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_HEX = re.compile(rf"[0-9a-fA-F]{{1,{MAX_DIGEST_CHARS}}}").fullmatch
_PART_NAME = re.compile(rf"[A-Za-z0-9_.:/-]{{1,{MAX_PART_NAME_CHARS}}}").fullmatch

#: The most bytes read after a sentinel while waiting for the end of its event. Our own
#: lines are ~150 bytes; anything longer than this is malformed and skipped, which is
#: what bounds the parser's memory on a never-ending line.
MAX_EVENT_BYTES = 4096

_SENT_LEN = len(SENTINEL_BYTES)
_CARRY = _SENT_LEN - 1  # bytes kept between chunks so a split sentinel is still found
_NL = b"\n"
_CR = b"\r"
_CLOSE_BRACE = ord("}")


class Record(NamedTuple):
    """One parsed event, with the wire's field names (``time`` is the emitter's clock).

    A NamedTuple rather than a frozen dataclass: just as immutable, and about ten times
    cheaper to build, which is most of the parser's cost on a log full of events.
    """

    event: str
    time: float
    inc: str
    step: int | None = None
    rank: int | None = None
    pid: int | None = None
    host: str | None = None
    restart: int | None = None
    local_rank: int | None = None
    run_id: str | None = None
    digest: str | None = None
    parts: tuple[tuple[str, str], ...] = ()  # (name, digest) sorted by name
    ppid: int | None = None
    parent: str | None = None
    world_size: int | None = None
    replica: int | None = None
    source: str | None = None  # checkpoint_loaded: "checkpoint" (None) or "peer"
    peer: int | None = None
    loss: float | None = None  # progress: the step's loss, as the job computed it
    data: str | None = None  # progress: a fingerprint of the step's batch
    loss_decimals: int | None = None  # progress: the loss's printed decimals (a log line's)
    error: str | None = None  # checkpoint_failed: what failed the save
    thread: int | None = None  # any event but start: the process's thread that printed it


# ---------------------------------------------------------------------------- digests


def combine_parts(parts: tuple[tuple[str, str], ...]) -> str:
    """The one digest standing for all ``parts`` (valid, sorted by name), 16 hex digits.

    BLAKE2b with an 8-byte digest over ``name=digest\n`` for each part in name order:
    the same parts always combine to the same digest, whoever computed them.
    """
    import hashlib  # only checkpoint lines with parts need it

    text = "".join(f"{name}={value}\n" for name, value in parts)
    return hashlib.blake2b(text.encode("ascii"), digest_size=8).hexdigest()


def is_part_name(name: str) -> bool:
    """Whether ``name`` may name a part on the wire (1-64 of ``A-Z a-z 0-9 _ . : / -``)."""
    return _PART_NAME(name) is not None


def _parts_from(value: object) -> tuple[tuple[str, str], ...] | None:
    """Valid ``parts`` as sorted pairs, or None (not a mapping of name -> hex digest)."""
    items = getattr(value, "items", None)
    if items is None:
        return None
    out = []
    for name, digest in items():
        if type(name) is not str or type(digest) is not str:
            return None
        if _PART_NAME(name) is None or _HEX(digest) is None:
            return None
        out.append((name, digest.lower()))
    if not out or len(out) > MAX_DIGEST_PARTS:
        return None
    out.sort()
    return tuple(out)


def normalize_digest(value: object) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """A user's ``digest=`` as the line's ``(digest, parts)``, or None when it is invalid.

    A hex string becomes ``(lower-case string, ())``; a mapping of part name -> hex
    string becomes ``(combine_parts(parts), parts)`` with the parts sorted by name.
    Anything else (another type, a non-hex value, a bad name, no part or more than
    :data:`MAX_DIGEST_PARTS`) is None. Never raises.
    """
    try:
        if isinstance(value, str):
            if _HEX(value) is None:
                return None
            return value.lower(), ()
        parts = _parts_from(value)
        if parts is None:
            return None
        return combine_parts(parts), parts
    except Exception:  # a mapping whose items() misbehaves
        return None


def digest_fields(digest: str | None, parts: tuple[tuple[str, str], ...] = ()) -> str:
    """The text of the optional ``digest`` and ``parts`` fields, each with a leading comma.

    Both must be valid already (see :func:`normalize_digest`); names and digests need
    no JSON escaping, which is why their alphabets are restricted.
    """
    text = "" if digest is None else f',"digest":"{digest}"'
    if parts:
        text += ',"parts":{' + ",".join(f'"{name}":"{value}"' for name, value in parts) + "}"
    return text


# ---------------------------------------------------------------------------- writing


def json_string(value: str) -> str:
    """``value`` as a JSON string literal (ASCII-only, so any byte stream carries it).

    Every ``/`` is written ``\\/`` (a legal JSON escape for the same character), so the
    sentinel can never appear inside a line's payload: the parser takes a sentinel inside
    a line for the start of a glued next line (a host or run id "RECOVERYGATE/v1" broke
    the line; found by the round-trip property test).
    """
    return json.dumps(value).replace("/", "\\/")


def _time(value: float) -> str:
    return f"{value:.6f}"


def step_line_parts(event: str, inc: str, rank: int | None) -> tuple[str, str]:
    """The constant text around the time and the step of a non-start event.

    The reporter formats ``f"{head}{time:.6f}{middle}{step}}}\\n"`` on its hot path: one
    f-string, no ``json.dumps``. ``inc`` must be JSON-safe (hex).
    """
    if event not in EVENT_KINDS or event == START:
        raise ValueError(f"not a step event: {event!r}")
    rank_part = "" if rank is None else f',"rank":{int(rank)}'
    head = f'{SENTINEL} {{"event":"{event}","time":'
    middle = f',"inc":{json_string(inc)}{rank_part},"step":'
    return head, middle


def loss_text(value: float) -> str:
    """``value`` as the ``loss`` field's JSON value: ``repr`` (which reads back as the same
    float, bit for bit), or the string ``"nan"``/``"inf"``/``"-inf"`` (JSON has no such
    numbers)."""
    if math.isfinite(value):
        return repr(value)
    return '"nan"' if math.isnan(value) else ('"inf"' if value > 0 else '"-inf"')


def data_text(value: object) -> str | None:
    """A user's ``data=`` (an int, a str or bytes) as the wire's fingerprint text, or None.

    An int (or anything ``operator.index`` takes: a numpy int, an integer 0-d tensor)
    is written in decimal, bytes (``bytes``, ``bytearray``, ``memoryview``) in hex,
    a str as it is; a text longer than :data:`MAX_DATA_CHARS` is replaced by its
    BLAKE2b-128 hex digest (equal batches still give equal fingerprints). Anything else
    (a bool, a float, None, an empty text) is None. Never raises.
    """
    try:
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            text = str(int(value)) if abs(value) < 10**MAX_DATA_CHARS else format(value, "x")
        elif isinstance(value, str):
            text = value
        elif isinstance(value, (bytes, bytearray, memoryview)):
            raw = bytes(value)
            if len(raw) * 2 > MAX_DATA_CHARS:
                import hashlib  # only long fingerprints need it

                return hashlib.blake2b(raw, digest_size=16).hexdigest()
            text = raw.hex()
        elif hasattr(type(value), "__index__"):  # numpy ints, integer 0-d tensors
            return data_text(operator.index(value))  # type: ignore[arg-type]
        else:
            return None
        if not text:
            return None
        if len(text) > MAX_DATA_CHARS:
            import hashlib

            return hashlib.blake2b(
                text.encode("utf-8", "surrogatepass"), digest_size=16
            ).hexdigest()
        return text
    except Exception:  # a misbehaving int or buffer subclass: no fingerprint
        return None


def printed_decimals(text: str) -> int | None:
    """How many decimals a number was printed with (``2.3456``: 4, ``6.543210E+00``: 6,
    ``3``: 0), or None when ``text`` is no plain number (``nan``, ``inf``)."""
    mantissa = text.strip().lower().partition("e")[0].lstrip("+-")
    whole, _, decimals = mantissa.partition(".")
    if not (whole or decimals) or not (whole + decimals).isdigit():
        return None
    return min(len(decimals), MAX_LOSS_DECIMALS)


def progress_fields(
    loss: float | None, data: str | None = None, decimals: int | None = None
) -> str:
    """The text of the optional ``loss``, ``loss_decimals`` and ``data`` fields
    (progress), each with a leading comma. ``data`` must be a valid fingerprint (see
    :func:`data_text`); ``decimals`` (0 to 24) is written only with a loss."""
    text = "" if loss is None else f',"loss":{loss_text(float(loss))}'
    if loss is not None and decimals is not None:
        text += f',"loss_decimals":{int(decimals)}'
    if data is not None:
        text += f',"data":{json_string(data)}'
    return text


def format_step(
    event: str,
    time: float,
    inc: str,
    step: int,
    rank: int | None = None,
    *,
    digest: str | None = None,
    parts: tuple[tuple[str, str], ...] = (),
    source: str | None = None,
    peer: int | None = None,
    loss: float | None = None,
    data: str | None = None,
    loss_decimals: int | None = None,
    error: str | None = None,
    thread: int | None = None,
) -> str:
    """One complete progress/checkpoint line, newline included.

    ``digest`` and ``parts`` (checkpoint_completed and checkpoint_loaded only) must be
    valid: lower-case hex, parts sorted by name, as :func:`normalize_digest` returns them.
    ``source`` and ``peer``: checkpoint_loaded only (see :func:`source_fields`).
    ``loss``, ``loss_decimals`` and ``data``: progress only (see :func:`progress_fields`).
    ``loss`` and ``data``: progress only (see :func:`progress_fields`). ``error``:
    checkpoint_failed only. ``thread``: any of them (see :func:`thread_field`).
    """
    head, middle = step_line_parts(event, inc, rank)
    extra = ""
    if error is not None:
        if event != CHECKPOINT_FAILED:
            raise ValueError(f"a {event} event carries no error")
        extra = f',"error":{json_string(error)}'
    if loss is not None or data is not None:
        if event != PROGRESS:
            raise ValueError(f"a {event} event carries no loss or data")
        if data is not None and (not data or len(data) > MAX_DATA_CHARS):
            raise ValueError(f"data must be 1 to {MAX_DATA_CHARS} characters")
        if loss_decimals is not None and not 0 <= loss_decimals <= MAX_LOSS_DECIMALS:
            raise ValueError(f"loss_decimals must be 0 to {MAX_LOSS_DECIMALS}")
        extra = progress_fields(loss, data, loss_decimals)
    if digest is not None or parts:
        if event not in DIGEST_EVENTS:
            raise ValueError(f"a {event} event carries no digest")
        extra = digest_fields(digest, parts)
    if source is not None or peer is not None:
        if event != CHECKPOINT_LOADED:
            raise ValueError(f"a {event} event carries no source")
        extra += source_fields(source, peer)
    if thread is not None:
        extra += thread_field(thread)
    return f"{head}{_time(time)}{middle}{int(step)}{extra}}}\n"


def thread_field(thread: int) -> str:
    """The text of the optional ``thread`` field with a leading comma; none for thread 0
    (absent means 0). ``thread`` must be 0 to :data:`MAX_THREAD`."""
    if not 0 <= thread <= MAX_THREAD:
        raise ValueError(f"thread must be 0 to {MAX_THREAD}, got {thread}")
    return f',"thread":{int(thread)}' if thread else ""


def source_fields(source: str | None, peer: int | None = None) -> str:
    """The text of the optional ``source`` and ``peer`` fields, each with a leading comma.

    ``source`` must be one of :data:`LOAD_SOURCES` (or None); ``peer`` an int >= 0.
    """
    if source is not None and source not in LOAD_SOURCES:
        raise ValueError(f"source must be one of {sorted(LOAD_SOURCES)}, got {source!r}")
    text = "" if source is None else f',"source":"{source}"'
    if peer is not None:
        text += f',"peer":{int(peer)}'
    return text


def format_start(
    time: float,
    inc: str,
    *,
    pid: int,
    host: str,
    rank: int | None = None,
    restart: int | None = None,
    local_rank: int | None = None,
    run_id: str | None = None,
    ppid: int | None = None,
    parent: str | None = None,
    world_size: int | None = None,
    replica: int | None = None,
) -> str:
    """One complete start line, newline included (formatted once per process)."""
    parts = [f'{SENTINEL} {{"event":"start","time":{_time(time)},"inc":{json_string(inc)}']
    if rank is not None:
        parts.append(f',"rank":{int(rank)}')
    parts.append(f',"pid":{int(pid)},"host":{json_string(host)}')
    if restart is not None:
        parts.append(f',"restart":{int(restart)}')
    if local_rank is not None:
        parts.append(f',"local_rank":{int(local_rank)}')
    if run_id is not None:
        parts.append(f',"run_id":{json_string(run_id)}')
    if ppid is not None:
        parts.append(f',"ppid":{int(ppid)}')
    if parent is not None:
        parts.append(f',"parent":{json_string(parent)}')
    if world_size is not None:
        parts.append(f',"world_size":{int(world_size)}')
    if replica is not None:
        parts.append(f',"replica":{int(replica)}')
    parts.append("}\n")
    return "".join(parts)


def format_record(record: Record) -> str:
    """Any :class:`Record` as its line (the inverse of the parser, used by tests and fakes)."""
    if record.event == START:
        return format_start(
            record.time,
            record.inc,
            pid=record.pid if record.pid is not None else 0,
            host=record.host if record.host is not None else "",
            rank=record.rank,
            restart=record.restart,
            local_rank=record.local_rank,
            run_id=record.run_id,
            ppid=record.ppid,
            parent=record.parent,
            world_size=record.world_size,
            replica=record.replica,
        )
    if record.step is None:
        raise ValueError(f"a {record.event} record needs a step")
    return format_step(
        record.event,
        record.time,
        record.inc,
        record.step,
        record.rank,
        digest=record.digest,
        parts=record.parts,
        source=record.source,
        peer=record.peer,
        loss=record.loss,
        data=record.data,
        loss_decimals=record.loss_decimals,
        error=record.error,
        thread=record.thread,
    )


# ---------------------------------------------------------------------------- reading


class _Bad(Exception):
    """A field has the wrong type; the event is malformed."""


#: The smallest int whose float() overflows (ints below it round to a finite float).
_FLOAT_LIMIT = 2**1024 - 2**970


def _opt_int(value: object) -> int | None:
    """An optional non-negative int field (bool is an int subclass and never valid)."""
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise _Bad
    return value


def _opt_str(value: object) -> str | None:
    if value is None or type(value) is str:
        return value
    raise _Bad


def _opt_digest(value: object) -> str | None:
    if value is None:
        return None
    if type(value) is not str or _HEX(value) is None:
        raise _Bad
    return value.lower()


def _opt_loss(value: object) -> float | None:
    """The ``loss`` field: a finite number, or one of the non-finite strings. A number
    that is no finite float (JSON's ``NaN``/``Infinity`` literals, ``1e400``, an int
    beyond the float range) makes the event malformed: only the strings say non-finite."""
    if value is None:
        return None
    if type(value) is int:
        if abs(value) >= _FLOAT_LIMIT:
            raise _Bad
        value = float(value)
    if type(value) is float:
        if not math.isfinite(value):
            raise _Bad
        return value
    if type(value) is str and value in _NON_FINITE:
        return _NON_FINITE[value]
    raise _Bad


def _opt_data(value: object) -> str | None:
    if value is None:
        return None
    if type(value) is not str or not value or len(value) > MAX_DATA_CHARS:
        raise _Bad
    return value


def _opt_parts(value: object) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if type(value) is not dict:
        raise _Bad
    parts = _parts_from(value)
    if parts is None:
        raise _Bad
    return parts


def record_from_json(obj: object) -> Record | None:
    """A :class:`Record` from a decoded JSON value, or None when it is not a valid event."""
    if type(obj) is not dict:
        return None
    get = obj.get
    event = get("event")
    time = get("time")
    inc = get("inc")
    step = get("step")
    if type(event) is not str or event not in EVENT_KINDS or type(inc) is not str or not inc:
        return None
    if type(time) is int:
        time = float(time)
    elif type(time) is not float or not math.isfinite(time):
        return None
    try:
        if step is None:
            if event != START:
                return None
        elif type(step) is not int or step < 0 or step > MAX_STEP:
            return None
        pid = get("pid")
        if pid is not None and type(pid) is not int:
            return None
        digest: str | None = None
        parts: tuple[tuple[str, str], ...] = ()
        if event in DIGEST_EVENTS:  # elsewhere the fields are unknown ones: ignored
            digest = _opt_digest(get("digest"))
            parts = _opt_parts(get("parts"))
        source: str | None = None
        peer: int | None = None
        if event == CHECKPOINT_LOADED:  # elsewhere unknown fields: ignored
            source = _opt_str(get("source"))
            if source is not None and source not in LOAD_SOURCES:
                raise _Bad
            peer = _opt_int(get("peer"))
        loss: float | None = None
        data: str | None = None
        decimals: int | None = None
        if event == PROGRESS:  # elsewhere unknown fields: ignored
            loss = _opt_loss(get("loss"))
            data = _opt_data(get("data"))
            decimals = _opt_int(get("loss_decimals"))
            if decimals is not None and (decimals > MAX_LOSS_DECIMALS or loss is None):
                raise _Bad
        error: str | None = None
        if event == CHECKPOINT_FAILED:
            error = _opt_str(get("error"))
            if error is not None:
                error = error[:MAX_ERROR_CHARS]
        thread = None if event == START else _opt_int(get("thread"))
        if thread is not None and thread > MAX_THREAD:
            raise _Bad
        return Record(
            event,
            time,
            inc,
            step,
            _opt_int(get("rank")),
            pid,
            _opt_str(get("host")),
            _opt_int(get("restart")),
            _opt_int(get("local_rank")),
            _opt_str(get("run_id")),
            digest,
            parts,
            *(
                (_opt_int(get("ppid")), _opt_str(get("parent")), _opt_int(get("world_size")))
                if event == START
                else (None, None, None)
            ),
            _opt_int(get("replica")) if event == START else None,
            source,
            peer,
            loss,
            data,
            decimals,
            error,
            thread or None,
        )
    except (_Bad, ArithmeticError, ValueError, TypeError):  # never raised: malformed
        return None


_raw_decode = json.JSONDecoder().raw_decode

# The exact layout our writer produces for step events, matched without json or slicing.
# It accepts a subset of what the JSON path accepts and yields the same Record, so it is
# only a shortcut: anything else (a start event, extra fields, other emitters) goes
# through json.
_FAST = re.compile(
    rb'[ \t]*\{"event":"(progress|checkpoint_started|checkpoint_completed|checkpoint_loaded|'
    rb'checkpoint_failed|checkpoint_load_started|poisoned)",'
    rb'"time":((?:0|[1-9][0-9]{0,15})\.[0-9]{1,9}),"inc":"([0-9a-f]{1,64})",'
    rb'(?:"rank":(0|[1-9][0-9]{0,8}),)?"step":(0|[1-9][0-9]{0,17})'
    rb'(?:,"loss":(-?(?:0|[1-9][0-9]{0,24})(?:\.[0-9]{1,24})?(?:e[-+]?[0-9]{1,3})?)'
    rb'(?:,"loss_decimals":(0|[1-9][0-9]?))?)?(?:,"thread":([1-9][0-9]?))?\}'
).match
_EVENT_NAMES = {name.encode("ascii"): name for name in EVENT_KINDS}


def _fast_loss(text: bytes) -> float:
    """A loss the fast path matched, read as the JSON path reads it (an integer such as
    ``-0`` is an int there: 0.0, never -0.0); inf when it overflows (then malformed)."""
    if b"." in text or b"e" in text:
        return float(text)
    return float(int(text))


def _fast_record(groups: tuple[bytes | None, ...]) -> Record | None:
    """The :class:`Record` of a line :data:`_FAST` matched (its groups, in order); None
    when its loss is beyond the float range (malformed, as on the JSON path)."""
    event, time, inc, rank, step, loss, decimals, thread = groups
    assert event is not None
    assert time is not None
    assert inc is not None
    assert step is not None
    name = _EVENT_NAMES[event]
    value = None
    printed = None
    if loss is not None and name == PROGRESS:
        value = _fast_loss(loss)
        if not math.isfinite(value):
            return None
        if decimals is not None:
            printed = int(decimals)
            if printed > MAX_LOSS_DECIMALS:
                return None
    number = None if thread is None else int(thread)
    if number is not None and number > MAX_THREAD:
        return None
    return Record(
        name,
        float(time),
        inc.decode("ascii"),
        int(step),
        None if rank is None else int(rank),
        # a loss on another event is an unknown field there: ignored, as the JSON path does
        loss=value,
        loss_decimals=printed,
        thread=number,
    )


def _decode_event(data: bytes, start: int, stop: int) -> Record | None:
    """The event in ``data[start:stop]`` (the bytes after a sentinel), or None."""
    fast = _FAST(data, start, stop)
    if fast is not None:
        return _fast_record(fast.groups())
    if data.find(b"}", start, stop) < 0:  # truncated: no object can end here (no exception)
        return None
    text = data[start:stop].decode("utf-8", "replace").lstrip(" \t")
    try:
        obj, _ = _raw_decode(text)
        return record_from_json(obj)
    except Exception:  # last resort: a line that raises anything is malformed, never fatal
        return None


class StreamParser:
    """Finds RECOVERYGATE/v1 events in a byte stream fed in chunks of any size.

    State between chunks is bounded: with no sentinel in sight only the last
    ``len(SENTINEL) - 1`` bytes are kept (a sentinel split across chunks is still
    found); after a sentinel, at most ``MAX_EVENT_BYTES`` bytes while its event is
    incomplete. An event ends at ``\\n``, at ``\\r``, at the next sentinel (glued
    lines), or as soon as its JSON object is complete at the end of the data so far.
    Not thread-safe: use one parser per stream.
    """

    __slots__ = ("_carry", "_pending", "malformed", "max_event_bytes")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._carry = b""
        self._pending = b""
        self.malformed = 0
        self.max_event_bytes = max_event_bytes

    @property
    def buffered(self) -> int:
        """Bytes held between chunks (bounded; exposed so tests can prove it)."""
        return len(self._carry) + len(self._pending)

    def feed(self, chunk: bytes) -> list[Record]:
        """The events completed by ``chunk``, in stream order."""
        if not chunk:
            return []
        if type(chunk) is not bytes:
            chunk = bytes(chunk)
        if self._pending:
            data = self._pending + chunk
            self._pending = b""
            return self._scan(data, 0)
        carry = self._carry
        if carry:
            pos = (carry + chunk[:_CARRY]).find(SENTINEL_BYTES)
            if pos >= 0:
                self._carry = b""
                return self._scan(carry + chunk, pos)
        pos = chunk.find(SENTINEL_BYTES)
        if pos < 0:
            self._carry = chunk[-_CARRY:] if len(chunk) >= _CARRY else (carry + chunk)[-_CARRY:]
            return []
        self._carry = b""
        return self._scan(chunk, pos)

    def flush(self) -> list[Record]:
        """End of stream: the pending event, if any, is complete now (or malformed)."""
        pending = self._pending
        self._pending = b""
        self._carry = b""
        if not pending:
            return []
        record = _decode_event(pending, _SENT_LEN, len(pending))
        if record is None:
            self.malformed += 1
            return []
        return [record]

    def _scan(self, data: bytes, pos: int) -> list[Record]:
        """Parse events from ``data`` starting with the sentinel at ``pos``."""
        out: list[Record] = []
        size = len(data)
        limit = self.max_event_bytes
        while True:
            body = pos + _SENT_LEN
            fast = _FAST(data, body)
            if fast is not None:
                # The writer's own layout, whole: no search for the line's end is needed
                # (the pattern cannot cross a line end or a glued sentinel).
                record = _fast_record(fast.groups())
                if record is not None:
                    out.append(record)
                else:  # a loss beyond the float range
                    self.malformed += 1
                resume = fast.end()
                pos = data.find(SENTINEL_BYTES, resume)
                if pos < 0:
                    self._carry = data[max(resume, size - _CARRY) :]
                    return out
                continue
            end = min(size, body + limit)
            stop = data.find(_NL, body, end)
            ended = stop >= 0
            if not ended:
                stop = end
            cr = data.find(_CR, body, stop)
            if cr >= 0:
                stop = cr
                ended = True
            glued = data.find(SENTINEL_BYTES, body, stop)
            if glued >= 0:
                stop = glued
                ended = True
            if ended:
                record = _decode_event(data, body, stop)
                resume = stop
            elif end == size and size - body < limit:
                # Incomplete: maybe the JSON is whole already (no newline yet).
                record = _decode_event(data, body, size) if data[-1] == _CLOSE_BRACE else None
                if record is None:
                    self._pending = data[pos:]
                    return out
                resume = size
            else:  # no end within the limit: a giant line, not an event of ours
                record = None
                resume = body
            if record is None:
                self.malformed += 1
            else:
                out.append(record)
            pos = data.find(SENTINEL_BYTES, resume)
            if pos < 0:
                self._carry = data[max(resume, size - _CARRY) :]
                return out


def parse_text(text: str | bytes) -> tuple[list[Record], int]:
    """All events in ``text`` (one or more lines) and how many sentinels were malformed."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    parser = StreamParser()
    records = parser.feed(data)
    records += parser.flush()
    return records, parser.malformed
