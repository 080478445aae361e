"""Report training progress to RecoveryGate: ``from recoverygate import reporter``.

Call ``reporter.progress(step)`` every step, ``reporter.checkpoint_started(step)`` when a
save begins, ``reporter.checkpoint_completed(step)`` once a checkpoint is durably saved
(``reporter.checkpoint_failed(step, error)`` when the save did not become one) and
``reporter.checkpoint_loaded(step)`` after a resume loaded one
(``reporter.checkpoint_load_started(step)`` as the load begins). Each call prints at
most one RECOVERYGATE/v1 line (see :mod:`recoverygate.wire`) to stdout, where the drill
reads it. The two checkpoint calls take an optional ``digest=``, the state's fingerprint
(a hex string, or a mapping of part name -> hex string, as ``state_digest`` returns it),
so a drill can check that the resumed state is the saved one, not just its step.

Why it is built like this:

- It sits inside the training loop, so a ``progress`` call that does not print is a
  countdown and a return (no clock read, no lookup): the clock is read again only when
  the countdown, sized from the measured step rate, says the rate-limit interval may
  have passed. The countdown is a closure's cell, not a module global: writing a cell
  is a pointer store, writing a global a dict store (about 8 ns, a quarter of an empty
  call, on every step).
- Lines are written with one ``os.write`` of a preformatted string, so each is flushed
  at once and lines from several threads never interleave mid-line.
- Nothing here may raise into training code or pull a third-party module into the job:
  only ``os``, ``sys``, ``time`` and ``_thread`` are imported; :mod:`recoverygate.wire`
  (which needs ``json``) is imported on the first emitted line, not at import, and
  :mod:`recoverygate.digest` (``hashlib``, and torch or numpy only for their objects) on
  the first use of ``state_digest``. A ``digest=`` that is not a valid digest is dropped;
  the step is still printed.

Environment (read on the first call, and again in a forked child):

- ``RANK``: this process's global rank (``SLURM_PROCID`` when RANK is unset; 0 when
  neither is set).
- ``RECOVERYGATE_RANKS``: ranks that print progress, ``0`` by default, a comma list, or
  ``all``. Checkpoint events (started, completed, loaded) are rare and print on every
  rank, so a drill can hold every rank's shard to the expected step;
  ``RECOVERYGATE_CHECKPOINT_RANKS`` (default ``all``) narrows them the same way.
- ``RECOVERYGATE_PROGRESS_INTERVAL``: seconds between progress lines (default 0.1).
  Checkpoint events always print.
- ``RECOVERYGATE_REPLAY_WINDOW``: how many progress calls print unthrottled at the start
  of a process and after each ``checkpoint_completed`` and ``checkpoint_loaded`` of it
  (default 32; 0: none but the first two): the steps a resume replays, which a drill
  compares with ``expectations.replay``. Their ``loss`` is converted with ``float()``
  then, so with a GPU tensor each of them costs a device sync.
- ``LOCAL_RANK``, ``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_RUN_ID``,
  ``WORLD_SIZE``: copied into the start event when set.
- ``RECOVERYGATE_REPLICA``, else ``REPLICA_GROUP_ID`` (torchft's): the replica group,
  copied into the start event as ``replica`` when it is a whole number.
- ``RECOVERYGATE_POISON``: ``RANK:STEP:FILE``, set by a drill's StickyFault (never by
  hand): on that rank, ``progress(STEP)`` while FILE exists prints a ``poisoned`` line and
  ends the process with exit code 1, as a crash at that step would; every call is then
  looked at (no countdown), in that drill's jobs alone.

How a process says how it was launched: importing this module sets
``RECOVERYGATE_PARENT_INC`` to this process's incarnation id, so a subprocess it starts
(warm-up, evaluation, data preparation: they inherit ``RANK``) finds it and puts it in
its start line as ``parent``; a forked child does the same from the fork hook. A worker
its launcher (torchrun, srun, the container) started has no ``parent``, and a drill
never takes a child of a worker for the replacement of a killed one.
"""

# The state lives in module globals on purpose: they are the cheapest lookups CPython
# has, and progress() runs on every training step. Its countdown, written on every call,
# is a closure's cell (see _countdown).
# ruff: noqa: PLW0603

from __future__ import annotations

import _thread
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import SupportsInt, TextIO

    from recoverygate.digest import state_digest

    Digest = str | Mapping[str, str] | None

    from typing import Protocol

    class _Progress(Protocol):
        def __call__(self, step: SupportsInt, loss: object = None, data: object = None) -> None: ...


__all__ = [
    "checkpoint_completed",
    "checkpoint_failed",
    "checkpoint_load_started",
    "checkpoint_loaded",
    "checkpoint_started",
    "configure",
    "enabled",
    "progress",
    "state_digest",
]

DEFAULT_INTERVAL = 0.1
DEFAULT_RANKS = "0"
#: Progress calls printed unthrottled at the start of a process and after each
#: checkpoint_completed / checkpoint_loaded: the steps a resume replays.
DEFAULT_REPLAY_WINDOW = 32
# At most this many progress calls go by without a look at the clock. It bounds how
# stale progress can get when steps suddenly slow down (32 steps), and keeps the
# amortized clock reads small: ~12 ns per call at 32, ~30 ns at 16.
_MAX_SKIP = 32
_NEVER = (1 << 30) - 1  # "never look again", kept a one-digit int so the countdown stays fast

# --- hot-path state: the countdown of progress() is the cell of its closure (_countdown)

# --- settings (configure() or the environment)
_stream: TextIO | None = None  # None: whatever sys.stdout is at the time of writing
_ranks_setting: str | None = None
_rank_setting: int | None = None
_interval_setting: float | None = None
_window_setting: int | None = None
_clock: Callable[[], float] = time.time

# --- per-process state, rebuilt by _init()
_ready = False
_on = False
_interval = DEFAULT_INTERVAL
_inc = os.urandom(8).hex()  # this process's incarnation id (a forked child draws anew)
_PARENT_ENV = "RECOVERYGATE_PARENT_INC"
_parent: str | None = os.environ.get(_PARENT_ENV) or None  # who started us, if it reported
try:  # noqa: SIM105 - contextlib would cost the import budget
    os.environ[_PARENT_ENV] = _inc  # our subprocesses will name us
except Exception:  # noqa: S110 - a read-only environment: children just cannot name us
    pass
_ckpt_on = False
_start_line = b""  # written before the first other line, then emptied
_progress_parts = (b"", b"")  # the line around its time and step, see wire.step_line_parts
_started_parts = (b"", b"")
_completed_parts = (b"", b"")
_loaded_parts = (b"", b"")
_failed_parts = (b"", b"")
_load_started_parts = (b"", b"")
_poisoned_parts = (b"", b"")
_poison_step: int | None = None  # RECOVERYGATE_POISON, for this rank: the step that kills
_poison_file = ""
_emitted = 0  # progress lines emitted so far (only "fewer than two" matters)
_replay_window = DEFAULT_REPLAY_WINDOW  # RECOVERYGATE_REPLAY_WINDOW
_window = 0  # progress calls still to print unthrottled (the replay window)
_last_emit = 0.0
_last_check = 0.0
_span = 0  # the countdown last set
_fd_stream: object = None  # the stream whose fd is cached in _fd
_fd = -1
_lock = _thread.allocate_lock()
# Each thread that prints a line is numbered, in the order of its first line: a line of a
# thread other than the first says which (wire's ``thread`` field), so a drill tells a
# metrics thread's progress from the training loop's checkpoints (issue 41, item 7). The
# number lives in the thread's own storage (a thread's ident may be reused after it ends).
_tls = _thread._local()  # .tag: the field this thread's lines carry (b"" for the first)
_numbered = 0  # threads numbered in this process so far


def _countdown() -> tuple[_Progress, Callable[[int], None]]:
    """``progress`` and the one way to set its countdown from outside it. The countdown is
    the closure's cell: ``progress`` writes it on every call, and a cell is written with
    a pointer store where a module global takes a dict store."""
    skip = 0  # progress calls left to ignore before looking at the clock again

    def progress(step: SupportsInt, loss: object = None, data: object = None) -> None:
        """Report that ``step`` completed. Cheap enough for every step of every rank.

        ``loss``: the step's loss (a float, a 0-d tensor, anything ``float()`` takes), so a
        drill can compare the steps a resumed job redoes with the killed run's
        (``expectations.replay``, docs/replay.md). It is converted only when a line is
        printed: a call that does not print costs no ``float()`` and no device sync. A loss
        given as text (``"2.3456"``, as a log line printed it) also tells the drill how many
        decimals it was printed with: equal losses are then equal to that precision only.
        ``data``: optional fingerprint of the step's batch (an int, a str or bytes).
        """
        nonlocal skip
        if skip:
            skip -= 1
            return
        skip = _progress(step, loss, data)

    def set_countdown(calls: int) -> None:
        nonlocal skip
        skip = calls

    progress.__qualname__ = "progress"
    return progress, set_countdown


progress, _set_countdown = _countdown()


def checkpoint_started(step: SupportsInt) -> None:
    """Report that a save of the state after ``step`` steps began. Never rate-limited."""
    if not _ready:
        _init()
    if _ckpt_on:
        _emit(_started_parts, step)


def checkpoint_completed(step: SupportsInt, digest: Digest = None) -> None:
    """Report that the checkpoint of ``step`` is durably saved. Never rate-limited.

    ``digest``: the saved state's fingerprint, a hex string or a mapping of part name
    (``"model"``, ``"optimizer"``, ...) -> hex string; see ``state_digest``.
    """
    if not _ready:
        _init()
    _open_window()
    if _ckpt_on:
        if digest is None:
            _emit(_completed_parts, step)
        else:
            _emit_digest(_completed_parts, step, digest)


def checkpoint_failed(step: SupportsInt, error: object = None) -> None:
    """Report that the save of the state after ``step`` steps did not become a checkpoint
    (it raised, timed out or was given up), instead of counting it. Never rate-limited.

    ``error``: what failed it, an exception or a text (written as ``Type: message``, at
    most 200 characters). A job that retries or skips a failed save says so with this;
    a drill that breaks the checkpoint storage (StorageFault) reads it.
    """
    if not _ready:
        _init()
    if not _ckpt_on:
        return
    try:
        value = int(step)
        if value < 0:
            return
        from recoverygate import wire  # loaded by _init already: a dict lookup

        text = None
        if error is not None:
            text = str(error)
            if isinstance(error, BaseException):
                text = f"{type(error).__name__}: {text}"
            text = text[:200]
        tail = b"" if text is None else f',"error":{wire.json_string(text)}'.encode("ascii")
        line = b"%s%.6f%s%d%s}\n" % (_failed_parts[0], _clock(), _failed_parts[1], value, tail)
        _write_after_start(line)
    except Exception:  # closed stdout, EPIPE, an error whose str() raises: drop the line
        return


def checkpoint_load_started(step: SupportsInt) -> None:
    """Report that a resume began loading the checkpoint of ``step`` (call
    :func:`checkpoint_loaded` once it holds it). Never rate-limited. A drill that kills
    inside the load (KillDuringRecovery ``phase: checkpointLoad``) aims at this line."""
    if not _ready:
        _init()
    if _ckpt_on:
        _emit(_load_started_parts, step)


def checkpoint_loaded(
    step: SupportsInt,
    digest: Digest = None,
    *,
    source: str = "checkpoint",
    peer: int | None = None,
) -> None:
    """Report that a resume loaded the checkpoint of ``step``. Never rate-limited.

    ``digest``: the fingerprint of the state now held (after every ``load_state_dict``),
    computed like the one passed to :func:`checkpoint_completed` for the same step.
    ``source``: where the state came from, ``"checkpoint"`` (storage, the default) or
    ``"peer"`` (copied from a live replica, torchft's heal); ``peer``: that replica's rank.
    An unknown ``source`` is dropped (the line says ``checkpoint``).
    """
    if not _ready:
        _init()
    _open_window()
    if _ckpt_on:
        if source == "checkpoint" and peer is None:
            if digest is None:
                _emit(_loaded_parts, step)
            else:
                _emit_digest(_loaded_parts, step, digest)
        else:
            _emit_digest(_loaded_parts, step, digest, source=source, peer=peer)


def enabled() -> bool:
    """Whether this process prints progress (its rank is among ``RECOVERYGATE_RANKS``)."""
    if not _ready:
        _init()
    return _on


def configure(
    *,
    stream: TextIO | None = None,
    ranks: str | None = None,
    rank: int | None = None,
    min_interval: float | None = None,
    clock: Callable[[], float] | None = None,
    replay_window: int | None = None,
) -> None:
    """Override the environment (for tests and unusual launchers); ``None`` keeps the default.

    ``stream``: where lines go (default: ``sys.stdout`` at the time of each write).
    ``ranks``: like ``RECOVERYGATE_RANKS``. ``rank``: this process's rank, like ``RANK``.
    ``min_interval``: seconds between progress lines. ``clock``: POSIX-seconds time
    function used for both the line's ``time`` and the rate limit. ``replay_window``:
    like ``RECOVERYGATE_REPLAY_WINDOW``.
    The reporter starts over: the next event is preceded by a start event again.
    """
    global _stream, _ranks_setting, _rank_setting, _interval_setting, _clock, _window_setting
    with _lock:
        _window_setting = replay_window
        _stream = stream
        _ranks_setting = ranks
        _rank_setting = rank
        _interval_setting = min_interval
        _clock = clock if clock is not None else time.time
        _reset()


def __getattr__(name: str) -> object:
    """``state_digest`` is loaded on first use: it needs ``hashlib``, this module must not."""
    if name == "state_digest":
        from recoverygate.digest import state_digest

        globals()["state_digest"] = state_digest
        return state_digest
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------- internals


def _reset() -> None:
    """Forget the per-process state; the next call re-reads the environment."""
    global _ready, _start_line, _fd_stream, _fd, _tls, _numbered
    _ready = False
    _set_countdown(0)
    _start_line = b""
    _fd_stream = None
    _fd = -1
    _tls = _thread._local()  # a forked child's first printing thread is its thread 0
    _numbered = 0


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _whole(value: object) -> int | None:
    """``value`` as an int >= 0, else None (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _replica() -> int | None:
    """The replica group: ``RECOVERYGATE_REPLICA``, else torchft's ``REPLICA_GROUP_ID``."""
    for name in ("RECOVERYGATE_REPLICA", "REPLICA_GROUP_ID"):
        value = _env_int(name)
        if value is not None and value >= 0:
            return value
    return None


def _wants(rank: int, ranks: str) -> bool:
    ranks = ranks.strip().lower()
    if ranks == "all":
        return True
    try:
        return rank in {int(part) for part in ranks.split(",") if part.strip()}
    except ValueError:
        return rank == 0  # unreadable setting: behave as the default


def _host() -> str:
    uname = getattr(os, "uname", None)
    if uname is not None:
        return str(uname().nodename)
    return os.environ.get("COMPUTERNAME", "")


def _init() -> None:
    """Decide whether this process prints and preformat its lines (once per process)."""
    global _ready, _on, _ckpt_on, _interval, _start_line, _emitted, _span
    global _replay_window, _window
    global _progress_parts, _started_parts, _completed_parts, _loaded_parts, _failed_parts
    global _load_started_parts, _poisoned_parts, _poison_step, _poison_file
    with _lock:
        if _ready:
            return
        try:
            env_rank = _env_int("RANK")
            if env_rank is None:
                env_rank = _env_int("SLURM_PROCID")
            rank = _rank_setting if _rank_setting is not None else env_rank
            ranks = _ranks_setting or os.environ.get("RECOVERYGATE_RANKS") or DEFAULT_RANKS
            _on = _wants(rank if rank is not None else 0, ranks)
            ckpt_ranks = os.environ.get("RECOVERYGATE_CHECKPOINT_RANKS") or "all"
            _ckpt_on = _on or _wants(rank if rank is not None else 0, ckpt_ranks)
            interval = _interval_setting
            if interval is None:
                try:
                    interval = float(os.environ.get("RECOVERYGATE_PROGRESS_INTERVAL", ""))
                except ValueError:
                    interval = DEFAULT_INTERVAL
            _interval = interval if interval >= 0 else DEFAULT_INTERVAL
            window = _window_setting
            if window is None:
                window = _env_int("RECOVERYGATE_REPLAY_WINDOW")
            _replay_window = window if window is not None and window >= 0 else DEFAULT_REPLAY_WINDOW
            _window = _replay_window
            _emitted = 0
            _span = 0
            _set_countdown(0)
            _poison_step, _poison_file = _poison_of(rank if rank is not None else 0)
            if _ckpt_on or _poison_step is not None:  # a poisoned rank always says it died
                from recoverygate import wire  # needs json: paid on the first line only

                _progress_parts = _encoded(wire.step_line_parts(wire.PROGRESS, _inc, rank))
                _started_parts = _encoded(wire.step_line_parts(wire.CHECKPOINT_STARTED, _inc, rank))
                _completed_parts = _encoded(
                    wire.step_line_parts(wire.CHECKPOINT_COMPLETED, _inc, rank)
                )
                _loaded_parts = _encoded(wire.step_line_parts(wire.CHECKPOINT_LOADED, _inc, rank))
                _failed_parts = _encoded(wire.step_line_parts(wire.CHECKPOINT_FAILED, _inc, rank))
                _load_started_parts = _encoded(
                    wire.step_line_parts(wire.CHECKPOINT_LOAD_STARTED, _inc, rank)
                )
                _poisoned_parts = _encoded(wire.step_line_parts(wire.POISONED, _inc, rank))
                _start_line = wire.format_start(
                    _process_start_time(),
                    _inc,
                    pid=os.getpid(),
                    host=_host(),
                    rank=rank,
                    restart=_env_int("TORCHELASTIC_RESTART_COUNT"),
                    local_rank=_env_int("LOCAL_RANK"),
                    run_id=os.environ.get("TORCHELASTIC_RUN_ID"),
                    ppid=os.getppid(),
                    parent=_parent if _parent != _inc else None,
                    world_size=_env_int("WORLD_SIZE"),
                    replica=_replica(),
                ).encode("ascii")
        except Exception:  # never raise into training code: stay silent instead
            _on = _ckpt_on = False
        _ready = True


def _poison_of(rank: int) -> tuple[int | None, str]:
    """``RECOVERYGATE_POISON`` (``RANK:STEP:FILE``) for this rank: (the step, the file)."""
    value = os.environ.get("RECOVERYGATE_POISON")
    if not value:
        return None, ""
    try:
        who, step, path = value.split(":", 2)
        if int(who) != rank or not path:
            return None, ""
        return int(step), path
    except ValueError:
        return None, ""


def _process_start_time() -> float:
    """When this process started (Linux: /proc/self/stat, 10 ms ticks), else now.

    The start event stands for the process's start, so a drill can time how long the
    replacement spent importing and initializing before its first report.
    """
    now = _clock()
    if _clock is not time.time:  # a test clock: stay on it
        return now
    try:
        with open("/proc/self/stat", "rb") as handle:
            stat = handle.read()
        ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
        boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        # The end of the start tick: never earlier than the true start, so a replacement
        # started right after a kill is never stamped before it.
        started = boot + (ticks + 1) / os.sysconf("SC_CLK_TCK")
    except Exception:
        return now
    return min(started, now) if now - 3600.0 < started else now


def _encoded(parts: tuple[str, str]) -> tuple[bytes, bytes]:
    return parts[0].encode("ascii"), parts[1].encode("ascii")


def _open_window() -> None:
    """A checkpoint was saved or loaded: print the next progress calls unthrottled."""
    global _window, _span
    if _on and _replay_window:
        _window = _replay_window
        _span = 0
        _set_countdown(0)


def _progress(step: SupportsInt, loss: object, data: object) -> int:
    """The slow path of :func:`progress`: maybe emit; the next countdown."""
    if not _ready:
        _init()
    if _poison_step is None:
        return _progress_emit(step, loss, data)
    _poisoned(step)
    _progress_emit(step, loss, data)
    return 0  # poisoned: every call is looked at


def _poisoned(step: SupportsInt) -> None:
    """A StickyFault's step: the process dies here while the drill's file exists."""
    try:
        if int(step) != _poison_step or not os.path.exists(_poison_file):
            return
        if _poisoned_parts[0]:
            _emit(_poisoned_parts, step)
        os.write(2, b"RecoveryGate StickyFault: this step is poisoned by the drill; exit 1\n")
    except Exception:  # never raise into training code
        return
    os._exit(1)


def _progress_emit(step: SupportsInt, loss: object, data: object) -> int:
    """Emit if due; the next countdown (progress calls to let go by unlooked at)."""
    global _span, _emitted, _last_emit, _last_check, _window
    if not _on:
        return _NEVER
    now = _clock()
    if _window:  # the replay window: every call prints, no countdown
        _window -= 1
        _emit_progress(step, now, loss, data)
        _emitted += 1
        _last_emit = _last_check = now
        _span = 0
        return 0
    since = now - _last_emit
    if since >= _interval or _emitted < 2 or since < 0:
        _emit_progress(step, now, loss, data)
        _emitted += 1
        _last_emit = now
        since = 0.0
    elapsed = now - _last_check
    _last_check = now
    if _emitted < 2 or elapsed <= 0:
        _span = 0
        return 0
    # Skip about half the calls expected before the interval is over: a step rate that
    # halves cannot delay a line, and the clock is read O(log) times per interval.
    span = int((_interval - since) * (_span + 1) / elapsed) >> 1
    if span > _MAX_SKIP:
        span = _MAX_SKIP
    elif span < 0:
        span = 0
    _span = span
    return span


def _emit(parts: tuple[bytes, bytes], step: SupportsInt, now: float | None = None) -> None:
    """Write one step line (after the start line if it is still due). Never raises."""
    try:
        value = int(step)
        if value < 0:
            return
        if now is None:
            now = _clock()
        # bytes %-formatting: the same text as wire.format_step, ~100 ns faster than
        # an f-string plus encode on the path every emitted line takes.
        line = b"%s%.6f%s%d}\n" % (parts[0], now, parts[1], value)
        _write_after_start(line)
    except Exception:  # closed stdout, EPIPE, odd steps: drop the line
        return


def _emit_progress(step: SupportsInt, now: float, loss: object, data: object) -> None:
    """A progress line, with ``loss`` (``float()`` is called here, on printed lines only)
    and ``data`` when given. A loss or fingerprint that cannot be read is dropped."""
    if loss is None and data is None:
        _emit(_progress_parts, step, now)
        return
    try:
        value = int(step)
        if value < 0:
            return
        from recoverygate import wire  # loaded by _init already: a dict lookup

        try:
            tail = wire.progress_fields(
                None if loss is None else float(loss),  # type: ignore[arg-type]
                None if data is None else wire.data_text(data),
                wire.printed_decimals(loss) if type(loss) is str else None,
            )
        except Exception:  # float() refused it: the step is still reported
            tail = wire.progress_fields(None, None if data is None else wire.data_text(data))
        line = b"%s%.6f%s%d%s}\n" % (
            _progress_parts[0],
            now,
            _progress_parts[1],
            value,
            tail.encode("ascii"),
        )
        _write_after_start(line)
    except Exception:  # closed stdout, EPIPE, odd steps: drop the line
        return


def _emit_digest(
    parts: tuple[bytes, bytes],
    step: SupportsInt,
    digest: object,
    *,
    source: str | None = None,
    peer: int | None = None,
) -> None:
    """Like :func:`_emit`, with the ``digest``/``parts`` (and ``source``/``peer``) fields."""
    try:
        value = int(step)
        if value < 0:
            return
        tail = b""
        try:
            from recoverygate import wire  # loaded by _init already: a dict lookup

            fields = wire.normalize_digest(digest) if digest is not None else None
            if fields is not None:
                tail = wire.digest_fields(*fields).encode("ascii")
        except Exception:  # an invalid digest is dropped; the step is still reported
            tail = b""
        if source is not None or peer is not None:
            from recoverygate import wire

            known = source if source in wire.LOAD_SOURCES else None
            tail += wire.source_fields(known, _whole(peer)).encode("ascii")
        line = b"%s%.6f%s%d%s}\n" % (parts[0], _clock(), parts[1], value, tail)
        _write_after_start(line)
    except Exception:  # closed stdout, EPIPE, odd steps: drop the line
        return


def _thread_tag() -> bytes:
    """The ``thread`` field of the calling thread's lines (b"" for the first thread)."""
    tag: bytes | None = getattr(_tls, "tag", None)
    return _number_thread() if tag is None else tag


def _number_thread() -> bytes:
    """Number the calling thread, which prints its first line: the next number (every
    thread past wire.MAX_THREAD gets that one)."""
    global _numbered
    from recoverygate import wire  # loaded by _init already: a dict lookup

    with _lock:
        tag = wire.thread_field(min(_numbered, wire.MAX_THREAD)).encode("ascii")
        _numbered += 1
    _tls.tag = tag
    return tag


def _write_after_start(line: bytes) -> None:
    """Write ``line`` (a step line, with this thread's ``thread`` field), after the
    process's start line if that is still due (once)."""
    global _start_line
    tag = _thread_tag()
    if tag:
        line = line[:-2] + tag + b"}\n"
    if _start_line:  # first line of the process: the start event goes first, once
        with _lock:
            if _start_line:
                # Emptied only once written: a thread that finds it empty knows the
                # start line is out, so its own line cannot overtake it.
                _write(_start_line + line)
                _start_line = b""
                return
    _write(line)


def _write(data: bytes) -> None:
    """One ``os.write`` to the stream's fd (or write + flush for fd-less streams)."""
    global _fd_stream, _fd
    stream: TextIO | None = _stream if _stream is not None else sys.stdout
    if stream is None:  # started with stdout closed: there is nowhere to write
        return
    if stream is not _fd_stream:
        try:
            fd = stream.fileno()
        except Exception:  # io.UnsupportedOperation, closed file, no fileno
            fd = -1
        _fd_stream = stream
        _fd = fd
    if _fd < 0:
        stream.write(data.decode("ascii"))
        stream.flush()
        return
    stream.flush()  # keep the job's own buffered prints ahead of our line
    while data:
        written = os.write(_fd, data)
        data = data[written:]


def _after_fork() -> None:
    """A forked child is a new process: new incarnation, new start event, rank re-read.

    Its ``parent`` is the process it was forked from, which had the reporter loaded.
    """
    global _inc, _lock, _parent
    _lock = _thread.allocate_lock()
    _parent = _inc
    _inc = os.urandom(8).hex()
    try:  # noqa: SIM105 - contextlib would cost the import budget
        os.environ[_PARENT_ENV] = _inc
    except Exception:  # noqa: S110 - a read-only environment: children cannot name us
        pass
    _reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
