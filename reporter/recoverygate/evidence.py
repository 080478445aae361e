"""Evidence from the lines a job already prints: presets, the matcher and its stream tap.

A job that never calls the reporter still prints its step, its loss and usually its
checkpoint saves and loads. With the ``evidence`` spec in ``RECOVERYGATE_AUTO`` (see
:mod:`recoverygate.integrations.auto`) the start-up hook wraps ``sys.stdout`` and
``sys.stderr`` of every Python process of the job: what the process writes is passed on
unchanged, then matched line by line, and each match becomes an ordinary RECOVERYGATE/v1
line of this process (the reporter's own calls) -- one transport, one parser, every
backend. docs/evidence.md describes the presets, their lines and their traps.

The spec is a JSON object::

    {"preset": "nanogpt",                        # optional
     "patterns": {"progress": "...",             # optional, each overrides the preset's
                  "checkpointLoaded": {"regex": "...", "stepBase": "completed"}, ...},
     "stepBase": "completed" | "index"}          # optional: the base of every pattern

The base of a pattern says what the number its line names is: ``completed``, the steps
completed; ``index``, the 0-based index of the step just done (the drill adds 1). Its own
``stepBase`` (a pattern given as a mapping) wins, then the spec's ``stepBase`` (every
pattern of the set, the preset's too), then the preset's base of that line
(:data:`PRESETS`' ``bases``), else ``completed``. A preset's neighbour line keeps its own.

What a match means (the step contract, docs/step-contract.md):

- ``progress``: ``step`` group = steps completed (by its base); a ``loss`` group rides
  along as the line's ``loss``.
- ``checkpointStarted``: a save *began* (a line printed before the write), never its
  completion. Its step: the ``step`` group, else the step in the ``path`` group
  (``step-N``, ``checkpoint-N``, ``iter_000000N``, ``epoch=E-step=S``, ``global_stepN``),
  else the preset's neighbour line printed before it (nanoGPT's ``step N: train loss``).
- ``checkpointCompleted``: the save is durable; its step as above, else the save started
  last. A preset whose trainer prints no completion line (nanoGPT, litgpt: synchronous
  saves) completes the pending save on the process's next progress line, which it could
  only print once the save returned; a kill in between leaves a save that only started.
- ``checkpointLoaded``: a resume loaded the state; its step as above, else the preset's
  neighbour line printed next (nanoGPT's ``step N: train loss`` at the resume step).

Bounds: a pattern sees at most :data:`MAX_LINE_CHARS` characters of a line; patterns with
nested unbounded quantifiers or alternatives under one are refused at validation
(:func:`problems`), and what remains is timed there on probe lines of that length.

Lines relayed from another process -- torchrun's ``[rank0]:`` / ``[default0]:`` headers,
Ray's ``(RayTrainWorker pid=N)`` (which Ray's driver prints in colour unless
``RAY_COLOR_PREFIX=0``: the header is looked for after the colour codes are taken off)
-- are not matched in the relaying process (the process that printed them matched them
itself); a torchrun agent and a Ray driver (connected with ``ray.init``) match nothing:
every line of a training step they print is a worker's, relayed, and reported by that
worker with its rank. The Kubernetes fallback, which reads pod logs, strips those headers
instead (:func:`strip_relay`).

Standard library only; ``json`` and the reporter are imported when first needed.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any

    #: Where a match is found: ``starts`` (the fixed texts every match begins with: it is
    #: tried where they appear), ``anchored`` (it begins at the start of the line), ``hint``
    #: (a fixed text every match contains: it is searched for only in lines that have it).
    _Plan = tuple[tuple[str, ...] | None, bool, str | None]

__all__ = [
    "KINDS",
    "MAX_LINE_CHARS",
    "PRESETS",
    "Matcher",
    "Spec",
    "clean_line",
    "install",
    "pattern_problem",
    "preset_base",
    "problems",
    "spec_from_json",
    "step_from_path",
    "strip_relay",
    "tap_ray_streams",
    "uninstall",
]

KINDS = ("progress", "checkpointStarted", "checkpointCompleted", "checkpointLoaded")
STEP_BASES = ("completed", "index")
#: The most characters of one line a pattern is matched against (the rest is not seen).
MAX_LINE_CHARS = 1024
#: The longest pattern accepted.
MAX_PATTERN_CHARS = 512
#: The most characters kept of a line still being written (a line without its newline).
_MAX_PARTIAL = 4 * MAX_LINE_CHARS

_LOSS = r"(?P<loss>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"

#: preset -> its patterns, its neighbour line (``context``), the base of each line's number
#: (``bases``: a kind or ``context`` -> ``index``; a line not named there is ``completed``)
#: and how it completes a save (``line``: its own completion line; ``progress``: the next
#: progress line proves a synchronous save returned).
PRESETS: dict[str, dict[str, Any]] = {
    "nanogpt": {
        "progress": r"^iter (?P<step>\d+): loss " + _LOSS,
        # out_dir names no step (ckpt.pt is overwritten): the step is the eval line's
        "checkpointStarted": r"^saving checkpoint to ",
        "checkpointCompleted": None,
        "checkpointLoaded": r"^Resuming training from ",
        "context": r"^step (?P<step>\d+): train loss ",
        "bases": {"progress": "index"},  # "step N:" counts the steps done: completed
        "completion": "progress",
    },
    "torchtitan": {
        "progress": r"\bstep:\s*(?P<step>\d+)\s+loss:\s*" + _LOSS,
        "checkpointStarted": r"\b(?:Saving|Staging) the checkpoint\.",
        "checkpointCompleted": (
            r"\b(?:Finished saving the checkpoint in |Last step checkpoint completed in )"
        ),
        "checkpointLoaded": r"\bLoading the checkpoint from (?P<path>\S+?)\.?$",
        "context": None,  # the progress line
        "bases": {},
        "completion": "line",
    },
    "megatron": {
        "progress": r"\biteration\s+(?P<step>\d+)/\s*\d+ \|(?:.*? lm loss:? " + _LOSS + ")?",
        "checkpointStarted": r"\bsaving checkpoint at iteration\s+(?P<step>\d+) to ",
        "checkpointCompleted": r"\bsuccessfully saved checkpoint from iteration\s+(?P<step>\d+)",
        "checkpointLoaded": (
            r"\bsuccessfully loaded checkpoint from .*? at iteration\s+(?P<step>\d+)"
        ),
        "context": None,
        "bases": {},
        "completion": "line",
    },
    "litgpt": {
        "progress": r"\biter \d+ step (?P<step>\d+) \| loss train: " + _LOSS,
        "checkpointStarted": r"^Saving checkpoint to (?P<path>.+)$",
        "checkpointCompleted": None,
        "checkpointLoaded": r"^Resuming training from (?P<path>.+)$",
        "context": None,
        "bases": {},
        "completion": "progress",
    },
}

#: A step a path names. A bare ``step`` not preceded by a letter: the lookbehind follows
#: its ``s`` (not before it) so that every alternative starts with a letter and the regex
#: engine skips the characters none starts with.
_PATH_STEP = re.compile(
    r"(?:s(?<![A-Za-z]s)tep[-_=]?|checkpoint-|iter_|global_step)0*(\d{1,12})(?!\d)"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
#: Headers a launcher puts before a line it relays from another process.
_RELAY = re.compile(
    r"\[(?:rank|default)(\d{1,6})\]:\s?|\(\w{1,64} pid=\d{1,10}(?:, ip=[^)]{1,64})?\) "
)
#: torchrun's own module: the agent runs it (``torchrun``, ``python -m torch.distributed.run``).
#: Not the agent server's modules: a worker imports those too, through
#: ``torch.distributed.checkpoint`` (its async process executor) or ``transformers.trainer``.
_AGENT_MODULE = "torch.distributed.run"
#: What torchrun gives each worker it starts, and not itself. ``LOCAL_RANK`` is no sign of
#: a worker: a launcher may export it to torchrun (``LOCAL_RANK=$SLURM_LOCALID``).
_WORKER_ENV = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


#: ``ray._private.worker.SCRIPT_MODE``: the mode of a process connected as a driver.
_RAY_SCRIPT_MODE = 0


def _is_ray_driver() -> bool:
    """Whether this process is a Ray driver: connected to its cluster as a script
    (``ray.init``), so the training lines it prints are its workers', relayed. Asked at
    each line: ``ray.init`` comes after the hook. A Ray worker (the mode of a worker
    process) matches its own lines; a process that imports ray without connecting does
    too."""
    worker = sys.modules.get("ray._private.worker")  # first: one lookup, all a job pays
    if worker is None:
        return False
    return getattr(getattr(worker, "global_worker", None), "mode", None) == _RAY_SCRIPT_MODE


def _is_torchrun_agent() -> bool:
    """Whether this process is a torchrun agent: it runs torchrun's module, and no torchrun
    started it. Asked at each line, not once: ``python -m torch.distributed.run`` may print
    before it has imported itself, and a worker forked from the agent is a worker."""
    modules = sys.modules  # first: two lookups, the cost a worker pays for each line
    if _AGENT_MODULE not in modules:
        main = getattr(modules.get("__main__"), "__spec__", None)
        if getattr(main, "name", None) != _AGENT_MODULE:
            return False
    environ = os.environ
    return not any(name in environ for name in _WORKER_ENV)


#: Texts a path that names a step has (``global_step`` has ``step``): one is looked for
#: before the path is searched, so that a path naming none costs a scan, not a search.
_PATH_WORDS = ("step", "checkpoint-", "iter_")


def step_from_path(path: str) -> int | None:
    """The step a checkpoint path names (the last ``step-N`` and the like), or None."""
    path = path[-MAX_LINE_CHARS:]
    if not any(word in path for word in _PATH_WORDS):
        return None
    found = _PATH_STEP.findall(path)
    return int(found[-1]) if found else None


def strip_relay(line: str) -> tuple[str, int | None]:
    """``line`` without a launcher's relay header, and the rank that header names (the
    header may be in colour: Ray's driver prints ``\x1b[36m(RayTrainWorker pid=N)\x1b[0m``)."""
    if line.startswith("\x1b"):
        line = clean_line(line)
    match = _RELAY.match(line)
    if match is None:
        return line, None
    rank = match.group(1)
    return line[match.end() :], int(rank) if rank is not None else None


def clean_line(line: str) -> str:
    """The text a pattern sees: at most MAX_LINE_CHARS, without ANSI codes or ``\\r``."""
    line = line[:MAX_LINE_CHARS]
    if "\r" in line:
        line = line.rstrip("\r")
        line = line[line.rfind("\r") + 1 :]
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return line


# ---------------------------------------------------------------------------- the spec


def preset_base(preset: str | None, kind: str) -> str:
    """The base of a preset's line of ``kind`` (or ``context``): ``completed`` or ``index``."""
    bases: Mapping[str, str] = PRESETS[preset]["bases"] if preset in PRESETS else {}
    return bases.get(kind, "completed")


def _entry(value: object) -> tuple[str | None, str | None]:
    """A ``patterns`` value as ``(regex, its own stepBase)``: a regex, or a mapping."""
    if isinstance(value, dict):
        regex, base = value.get("regex"), value.get("stepBase")
        return (regex if isinstance(regex, str) else None), (
            base if isinstance(base, str) else None
        )
    return (value if isinstance(value, str) else None), None


class Spec:
    """A checked evidence spec: one compiled pattern per kind (None: not matched) and the
    base of each (``bases``: a kind or ``context`` -> ``completed`` or ``index``)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        preset = data.get("preset")
        base: dict[str, Any] = dict(PRESETS[preset]) if preset is not None else {}
        patterns = data.get("patterns") or {}
        self.preset: str | None = preset
        #: the spec's own ``stepBase`` (every pattern of the set), None if not given
        self.step_base: str | None = data.get("stepBase")
        #: the patterns as given (a regex, or a mapping with its own base)
        self.given: dict[str, Any] = {k: patterns[k] for k in KINDS if patterns.get(k)}
        self.sources: dict[str, str | None] = {}
        self.bases: dict[str, str] = {}
        for kind in KINDS:
            regex, own = _entry(self.given.get(kind))
            self.sources[kind] = regex or base.get(kind)
            self.bases[kind] = own or self.step_base or preset_base(preset, kind)
        self.bases["context"] = preset_base(preset, "context")
        self.patterns = {k: re.compile(v) if v else None for k, v in self.sources.items()}
        context = base.get("context")
        self.context = re.compile(context) if context else None
        self.completion: str = base.get("completion", "line")

    def to_json(self, frameworks: str | None = None) -> str:
        """The ``RECOVERYGATE_AUTO`` value carrying this spec (only what differs from the
        preset); ``frameworks``: the variable's value before (its framework list is kept)."""
        import json

        out: dict[str, Any] = {}
        if self.preset is not None:
            out["preset"] = self.preset
        preset = PRESETS.get(self.preset or "", {})
        own = {k: v for k, v in self.given.items() if v != preset.get(k)}
        if own:
            out["patterns"] = own
        if self.step_base is not None:
            out["stepBase"] = self.step_base
        value: dict[str, Any] = {"evidence": out}
        before = (frameworks or "").strip()
        if before.startswith("{"):
            try:
                before = str(json.loads(before).get("frameworks", ""))
            except Exception:
                before = ""
        if before and before.lower() not in ("0", "false", "no", "off"):
            value["frameworks"] = before
        return json.dumps(value, separators=(",", ":"), sort_keys=True)


def spec_from_json(text: str) -> Spec | None:
    """The spec in a ``RECOVERYGATE_AUTO`` value (a JSON object), or None if it has none
    or it is invalid: a job is never stopped by its drill's settings."""
    import json

    try:
        data = json.loads(text)
        evidence = data.get("evidence") if isinstance(data, dict) else None
        if not isinstance(evidence, dict) or problems(evidence, timed=False):
            return None
        return Spec(evidence)
    except Exception:
        return None


# ---------------------------------------------------------------------------- validation


def problems(data: Mapping[str, Any], *, timed: bool = True) -> list[tuple[tuple[str, ...], str]]:
    """What is wrong with an evidence spec: ``(key path, message)`` pairs, empty when fine."""
    found: list[tuple[tuple[str, ...], str]] = []
    preset = data.get("preset")
    if preset is not None and preset not in PRESETS:
        found.append((("preset",), f"unknown preset {preset!r}: use {', '.join(PRESETS)}"))
    base = data.get("stepBase")
    if base is not None and base not in STEP_BASES:
        found.append((("stepBase",), f"stepBase must be completed or index, not {base!r}"))
    patterns = data.get("patterns") or {}
    if not isinstance(patterns, dict):
        return [*found, (("patterns",), "patterns must be a mapping of kind -> regex")]
    for kind, value in patterns.items():
        if kind not in KINDS:
            found.append(
                (("patterns", str(kind)), f"unknown kind {kind!r}: use {', '.join(KINDS)}")
            )
            continue
        if isinstance(value, dict):
            found += _entry_problems(kind, value, preset, timed=timed)
            continue
        message = pattern_problem(kind, value, timed=timed)
        if message is not None:
            found.append((("patterns", kind), message))
    if preset is None and not patterns:
        found.append(((), "give a preset or at least one pattern"))
    return found


def _entry_problems(
    kind: str, value: Mapping[str, Any], preset: object, *, timed: bool
) -> list[tuple[tuple[str, ...], str]]:
    """What is wrong with a pattern given as ``{regex, stepBase}``."""
    found: list[tuple[tuple[str, ...], str]] = []
    where = ("patterns", kind)
    for key in value:
        if key not in ("regex", "stepBase"):
            found.append(((*where, str(key)), f"unknown key {key!r}: use regex, stepBase"))
    base = value.get("stepBase")
    if base is not None and base not in STEP_BASES:
        found.append(((*where, "stepBase"), f"stepBase must be completed or index, not {base!r}"))
    if "regex" in value:
        message = pattern_problem(kind, value["regex"], timed=timed)
        if message is not None:
            found.append(((*where, "regex"), message))
    elif not (isinstance(preset, str) and PRESETS.get(preset, {}).get(kind)):
        owner = "no preset" if preset is None else f"preset {preset} has no {kind} line"
        found.append(((*where, "regex"), f"needs a regex: {owner} to take it from"))
    return found


def pattern_problem(
    kind: str, text: object, *, timed: bool = True, grouped: bool = True
) -> str | None:
    """Why ``text`` cannot be the ``kind`` pattern, or None. ``grouped=False``: a preset's
    own pattern, whose step may come from its neighbour line instead of a group."""
    if not isinstance(text, str) or not text:
        return "a pattern must be a non-empty regular expression (a quoted string)"
    if len(text) > MAX_PATTERN_CHARS:
        return f"a pattern may have at most {MAX_PATTERN_CHARS} characters, not {len(text)}"
    try:
        compiled = re.compile(text)
    except re.error as error:
        where = f" at position {error.pos}" if error.pos is not None else ""
        return f"does not compile: {error.msg}{where}"
    groups = set(compiled.groupindex)
    if grouped and kind == "progress" and "step" not in groups:
        return "a progress pattern needs a (?P<step>...) group: the step the line reports"
    if grouped and kind != "progress" and not groups & {"step", "path"}:
        return (
            f"a {kind} pattern needs a (?P<step>...) group, or a (?P<path>...) group whose "
            "text names the step (step-N, checkpoint-N, iter_000000N, epoch=E-step=S)"
        )
    nested = _nested_repeat(text)
    if nested is not None:
        return (
            f"may backtrack catastrophically: {nested}; write it without a repeat inside "
            "an unbounded repeat (e.g. \\d+ instead of (\\d+)+)"
        )
    if timed:
        slow = _slow_probe(compiled)
        if slow is not None:
            return slow
    return None


#: The budget of one probe match at validation (a line of MAX_LINE_CHARS characters).
PROBE_BUDGET_SECONDS = 0.02


def _nested_repeat(text: str) -> str | None:
    """A description of an unbounded repeat holding a repeat or an alternative, or None."""
    try:
        from re import _parser as parser  # type: ignore[attr-defined]
    except ImportError:  # Python < 3.11
        import sre_parse as parser
    try:
        tree = parser.parse(text)
    except Exception:
        return None
    unbounded = parser.MAXREPEAT

    def walk(items: Any, inside: bool) -> str | None:
        for op, arg in items:
            name = str(op)
            if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                _low, high, sub = arg
                if inside and name != "POSSESSIVE_REPEAT":
                    return "a repeat inside an unbounded repeat"
                found = walk(sub, inside or high == unbounded)
            elif name == "BRANCH":
                if inside and len(arg[1]) > 1:
                    return "alternatives inside an unbounded repeat"
                found = next((f for b in arg[1] if (f := walk(b, inside))), None)
            elif name in ("SUBPATTERN", "ATOMIC_GROUP", "ASSERT", "ASSERT_NOT"):
                sub = arg[-1]
                found = walk(sub, inside)
            else:
                found = None
            if found:
                return found
        return None

    return walk(tree, False)


def _probes(compiled: re.Pattern[str]) -> Iterator[str]:
    """Units of probe lines built to make a pattern work hard."""
    literal = re.sub(r"\\.|[^A-Za-z0-9 :=_./-]", "", compiled.pattern)[:64] or "a"
    yield from ("a", " ", "0", "0.", "a ", literal, literal + " 1")


def _slow_probe(compiled: re.Pattern[str]) -> str | None:
    """Time the pattern on probe lines of 16, 32, ... MAX_LINE_CHARS characters; the
    first over the budget refuses it, so a pattern that explodes is stopped while the
    line is still short (the total is at most a few budgets for a polynomial pattern)."""
    import time

    for unit in _probes(compiled):
        length = 16
        while length <= MAX_LINE_CHARS:
            probe = (unit * (length // len(unit) + 1))[:length]
            took = 0.0
            for _ in range(2):  # twice over the budget: not a pause of a busy machine
                start = time.perf_counter()
                compiled.search(probe)
                took = time.perf_counter() - start
                if took <= PROBE_BUDGET_SECONDS:
                    break
            if took > PROBE_BUDGET_SECONDS:
                return (
                    f"too slow: {took * 1000:.0f} ms on a {length}-character line (a pattern "
                    f"sees up to {MAX_LINE_CHARS}; at most {PROBE_BUDGET_SECONDS * 1000:.0f} ms "
                    "each); anchor it or make it more literal"
                )
            length *= 2
    return None


# ---------------------------------------------------------------------------- matching


#: An event the matcher found: (kind, step, loss or None).
Event = tuple[str, int, "float | None"]


#: How many places of a line a pattern that starts with fixed text is tried at: the first
#: places its fixed text appears. A trainer's line names that text once, or a few times
#: (Megatron's ``iteration`` line: four times, matched at the first); a line that names it
#: more often before a match is not one, and is left unmatched by that pattern. With
#: :data:`MAX_LINE_CHARS` this bounds what one line costs, however it was made.
MAX_TRIES = 4
#: The most fixed starts one pattern is tried by (its alternatives'), and the fewest
#: characters each must have to be worth looking for.
_MAX_STARTS = 4
_MIN_FIXED = 3


def _parser() -> Any:
    try:
        from re import _parser as parser  # type: ignore[attr-defined]
    except ImportError:  # Python < 3.11
        import sre_parse as parser
    return parser


def _fixed_starts(items: Any, parser: Any) -> tuple[list[str], bool] | None:
    """The fixed texts a sequence of the parse tree begins with (one per alternative) and
    whether the whole sequence is fixed text; None where it begins with anything else."""
    starts = [""]
    for op, arg in items:
        if op is parser.LITERAL:
            starts = [s + chr(arg) for s in starts]
            continue
        inner: tuple[list[str], bool] | None = None
        if op is parser.BRANCH:
            found = [_fixed_starts(branch, parser) for branch in arg[1]]
            if all(f is not None for f in found):
                texts = [t for f in found if f is not None for t in f[0]]
                inner = (texts, all(f[1] for f in found if f is not None))
        elif op is parser.SUBPATTERN and not arg[1] and not arg[2]:  # a group, no flags
            inner = _fixed_starts(arg[-1], parser)
        elif op is parser.IN and all(o is parser.LITERAL for o, _a in arg):  # [cd], c|d
            inner = ([chr(a) for _o, a in arg], True)
        if inner is None:
            return starts, False
        starts = [s + t for s in starts for t in inner[0]]
        if len(starts) > _MAX_STARTS:
            return None
        if not inner[1]:
            return starts, False
    return starts, True


def _plan(pattern: re.Pattern[str]) -> _Plan:
    """How to look for ``pattern`` in a line (:data:`_Plan`): by its fixed starts where it
    has them (after ``^`` or ``\\b``), else by a fixed text it contains, else everywhere.
    Case-insensitive patterns are searched everywhere."""
    if pattern.flags & re.IGNORECASE:
        return None, False, None
    multiline = bool(pattern.flags & re.MULTILINE)  # its ^ is any line's start
    parser = _parser()
    try:
        items = list(parser.parse(pattern.pattern))
    except Exception:
        return None, False, None
    anchored = False
    while items and items[0][0] is parser.AT:
        where = items.pop(0)[1]
        if where is parser.AT_BEGINNING_STRING or (where is parser.AT_BEGINNING and not multiline):
            anchored = True
        elif where is not parser.AT_BOUNDARY:
            return None, False, _required_text(items, parser)
    found = _fixed_starts(items, parser)
    if found is not None and found[0] and all(len(s) >= _MIN_FIXED for s in found[0]):
        return tuple(found[0]), anchored, None
    return None, anchored, _required_text(items, parser)


def _required_text(items: Any, parser: Any) -> str | None:
    """The longest fixed text of the top-level sequence (every match contains it), if it
    has at least 4 characters."""
    best = run = ""
    for op, arg in items:
        if op is parser.LITERAL:
            run += chr(arg)
            best = max(best, run, key=len)
        else:
            run = ""
    return best if len(best) >= 4 else None


def _match_at(pattern: re.Pattern[str], line: str, starts: tuple[str, ...]) -> re.Match[str] | None:
    """The leftmost match of ``pattern`` (as ``search`` finds it), tried only where one of
    its fixed ``starts`` appears, at the first :data:`MAX_TRIES` such places of each."""
    best: re.Match[str] | None = None
    for start in starts:
        at = line.find(start)
        tries = 0
        while at >= 0 and tries < MAX_TRIES and (best is None or at < best.start()):
            match = pattern.match(line, at)
            if match is not None:
                best = match
                break
            tries += 1
            at = line.find(start, at + 1)
    return best


class Matcher:
    """Lines in, events out, with the state lines without a step need. Pure: no I/O."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self._rules: list[tuple[str, re.Pattern[str], _Plan]] = [
            (kind, pattern, _plan(pattern))
            for kind, pattern in spec.patterns.items()
            if pattern is not None
        ]
        if spec.context is not None:
            self._rules.append(("context", spec.context, _plan(spec.context)))
        self.context_step: int | None = None  # the neighbour line last seen
        #: the loss of the last progress line as printed (its precision rides with it)
        self.loss_text: str | None = None
        self.pending_save: int | None = None  # a save started, not yet proven complete
        self.pending_load = False  # a load line waiting for the neighbour that names its step
        #: what to add to the number a line of each kind names (1: its base is ``index``)
        self._offsets = {k: int(base == "index") for k, base in spec.bases.items()}
        self._step_offset = self._offsets["progress"]
        self._completes = spec.completion == "progress"  # the next step line completes a save
        self._own_context = spec.context is None  # the progress line is the neighbour line
        progress = spec.patterns["progress"]
        self._loss = progress is not None and "loss" in progress.groupindex

    def feed(self, line: str) -> list[Event]:
        """The events one line (without its newline) proves, in order."""
        if len(line) > MAX_LINE_CHARS or "\r" in line or "\x1b" in line:
            line = clean_line(line)
        out: list[Event] = []
        for kind, pattern, (starts, anchored, hint) in self._rules:
            if anchored:  # one place to try: the start of the line
                if starts is not None and not line.startswith(starts):
                    continue
                match = pattern.match(line)
            elif starts is not None:
                match = _match_at(pattern, line, starts)
            elif hint is not None and hint not in line:
                continue
            else:
                match = pattern.search(line)
            if match is None:
                continue
            if kind == "progress":
                self._progress(match, out)
            else:
                self._apply(kind, match, out)
            break  # one line, one meaning: the first kind that matches it (KINDS order)
        return out

    def _apply(self, kind: str, match: re.Match[str], out: list[Event]) -> None:
        step = _step_of(match)
        if step is not None:
            step += self._offsets[kind]
        if kind == "context":
            if step is not None:
                self.context_step = step
                if self.pending_load:
                    self.pending_load = False
                    out.append(("checkpointLoaded", step, None))
            return
        if kind == "checkpointStarted":
            if step is None:
                step = self.context_step
            if step is not None:
                self.pending_save = step
                out.append((kind, step, None))
        elif kind == "checkpointCompleted":
            if step is None:
                step = self.pending_save
            self.pending_save = None
            if step is not None:
                out.append((kind, step, None))
        elif step is not None:  # checkpointLoaded
            out.append((kind, step, None))
        elif self.spec.context is not None:
            self.pending_load = True

    def _progress(self, match: re.Match[str], out: list[Event]) -> None:
        text = match.group("step")
        if text is None or not (text.isascii() and text.isdigit()) or len(text) > 12:
            return
        step = int(text) + self._step_offset
        if self.pending_save is not None and self._completes:
            out.append(("checkpointCompleted", self.pending_save, None))
            self.pending_save = None
        self.pending_load = False  # a step came first: the load's step stays unknown
        # The neighbour line names the save that follows it at once; after a step it is
        # stale (nanoGPT's save at the end, with no eval line before it, names no step).
        self.context_step = step if self._own_context else None
        loss = None
        if self._loss:  # inline: this runs on every matched step line
            text = match.group("loss")
            try:
                loss = float(text)
            except (TypeError, ValueError):
                loss = None
            if loss is not None and not math.isfinite(loss):
                loss = None
        self.loss_text = text if loss is not None else None
        out.append(("progress", step, loss))


def _step_of(match: re.Match[str]) -> int | None:
    groups = match.re.groupindex
    if "step" in groups:
        text = match.group("step")
        if text is not None and text.isascii() and text.isdigit() and len(text) <= 12:
            return int(text)
        return None
    if "path" in groups:
        path = match.group("path")
        return step_from_path(path) if path else None
    return None


# ---------------------------------------------------------------------------- the tap


class _Tap:
    """``sys.stdout`` / ``sys.stderr`` as they were, plus matching of each whole line."""

    def __init__(self, stream: Any, sink: Callable[[str], None]) -> None:
        self.__dict__["_rg_stream"] = stream
        self.__dict__["_rg_sink"] = sink
        self.__dict__["_rg_part"] = [""]  # the line being written (a list: no setattr)

    def write(self, text: str) -> int:
        written: int = self._rg_stream.write(text)
        try:
            part = self._rg_part
            if text == "\n":  # print(line) writes the line, then its newline
                line = part[0]
                part[0] = ""
                self._rg_sink(line)
            elif "\n" in text:
                head, _, rest = (part[0] + text).rpartition("\n")
                part[0] = rest[-_MAX_PARTIAL:]
                for line in head.split("\n"):
                    self._rg_sink(line)
            elif len(part[0]) < _MAX_PARTIAL:
                part[0] += text[:_MAX_PARTIAL]
        except Exception:  # noqa: S110 - matching never breaks the job's own output
            pass
        return written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_rg_stream"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["_rg_stream"], name, value)

    def __iter__(self) -> Any:
        return iter(self.__dict__["_rg_stream"])

    def __repr__(self) -> str:
        return repr(self.__dict__["_rg_stream"])


class _Emitter:
    """Turns the matcher's events into reporter lines of this process."""

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher
        self._reporter: Any = None  # recoverygate.reporter, imported on the first event

    def line(self, text: str) -> None:
        if not text:
            return
        if _is_torchrun_agent() or _is_ray_driver():
            return  # a launcher: its workers match their own lines, with their rank
        first = text[0]
        if first == "\x1b":  # a coloured header (Ray's relay): looked for without colours
            text = clean_line(text)
            first = text[:1]
        if first and first in "[(" and _RELAY.match(text):
            return  # relayed from another process, which matched it itself
        for kind, step, loss in self.matcher.feed(text):
            if kind == "progress":
                self._progress(step, loss)
            else:
                self._emit(kind, step)

    def _load_reporter(self) -> Any:
        from recoverygate import reporter

        self._reporter = reporter
        return reporter

    def _emit(self, kind: str, step: int) -> None:
        reporter = self._reporter or self._load_reporter()
        if kind == "checkpointStarted":
            reporter.checkpoint_started(step)
        elif kind == "checkpointCompleted":
            reporter.checkpoint_completed(step)
        else:
            reporter.checkpoint_loaded(step)

    def _progress(self, step: int, loss: float | None) -> None:
        """A progress line by the reporter's own rules (its rate limit and replay window);
        the loss as the line printed it, so that its precision reaches the drill."""
        reporter = self._reporter or self._load_reporter()
        reporter.progress(step, loss=self.matcher.loss_text if loss is not None else None)


_installed: list[_Tap] = []
#: The file descriptors the taps write to (1 and 2): a stream Ray opens on them is tapped.
_tapped_fds: set[int] = set()
#: The attribute that holds the unpatched function on a patched one.
_ORIGINAL = "__recoverygate_original__"


def install(spec: Spec) -> bool:
    """Tap ``sys.stdout`` and ``sys.stderr`` with one matcher for this process. Never raises."""
    try:
        if _installed:
            return True
        emitter = _Emitter(Matcher(spec))
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name, None)
            if stream is None or isinstance(stream, _Tap):
                continue
            tap = _Tap(stream, emitter.line)
            setattr(sys, name, tap)
            _installed.append(tap)
            with contextlib.suppress(Exception):  # no descriptor: nothing Ray re-opens
                _tapped_fds.add(stream.fileno())
        return bool(_installed)
    except Exception:
        return False


def tap_ray_streams(utils: Any) -> None:
    """Keep the tap in a Ray worker process: Ray's ``default_worker`` replaces
    ``sys.stdout`` and ``sys.stderr`` after start-up with new streams on the same
    descriptors (``ray._private.utils.open_log(fd, unbuffered=True, closefd=False)``),
    dropping the tap; its ``open_log`` is wrapped so that a stream it opens on a tapped
    descriptor is tapped again, with the same matcher. Called when ``ray._private.utils``
    is imported (:mod:`recoverygate.integrations.auto`)."""
    original = getattr(utils, "open_log", None)
    if original is None or hasattr(original, _ORIGINAL) or not _installed:
        return
    sink = _installed[0].__dict__["_rg_sink"]

    def open_log(path: Any, *args: Any, **kwargs: Any) -> Any:
        stream = original(path, *args, **kwargs)
        if isinstance(path, int) and path in _tapped_fds and not isinstance(stream, _Tap):
            return _Tap(stream, sink)
        return stream

    setattr(open_log, _ORIGINAL, original)
    open_log.__doc__ = original.__doc__
    utils.open_log = open_log


def uninstall() -> None:
    """Put the original streams back (for tests)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if isinstance(stream, _Tap):
            setattr(sys, name, stream.__dict__["_rg_stream"])
    _installed.clear()
    _tapped_fds.clear()
