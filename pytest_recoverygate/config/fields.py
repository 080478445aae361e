"""The building blocks of the config's fields: bounds, messages, and the validators that
read durations, step references, sustain windows, paths, commands and ids (shared by the
schema and every backend's own section; :mod:`pytest_recoverygate.config.schema` re-exports them).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeAlias

from pydantic import BeforeValidator, Field, ValidationInfo
from pydantic_core import PydanticCustomError, PydanticUndefined

from pytest_recoverygate.durations import (
    DurationSyntaxError,
    StepRefSyntaxError,
    format_duration,
    parse_duration,
    parse_step_ref,
)
from pytest_recoverygate.engine.spec import StickySpec, Sustain
from pytest_recoverygate.engine.storage import StorageSpec
from pytest_recoverygate.storage.layer import folder_problem
from pytest_recoverygate.storage.wire import DURING, MODES

__all__ = [
    "MAX_DURATION",
    "MAX_PID",
    "MAX_RANK",
    "MAX_STEP",
    "Command",
    "IdNumber",
    "at_most_one",
    "check_target_replica",
    "command_arguments",
    "command_field",
    "damage_value",
    "distinct_items",
    "duration",
    "env_field",
    "env_names",
    "exactly_one",
    "file_path",
    "id_number",
    "id_option",
    "kill_after_value",
    "launch_or_attach",
    "meta",
    "node_count_field",
    "option",
    "path_in_scope",
    "recovery_phase_value",
    "reentry_keys",
    "refuse",
    "step_ref",
    "sticky_keys",
    "sticky_scope_value",
    "sticky_spec_of",
    "storage_during",
    "storage_keys",
    "storage_mode",
    "storage_spec_of",
    "sustain_of",
    "sustain_value",
    "workdir_field",
]

#: Bounds that turn absurd values into errors instead of overflows or endless waits.
MAX_DURATION = 30 * 24 * 3600.0  # 30 days
MAX_RANK = 1_000_000
MAX_STEP = 2**63 - 1
MAX_PID = 4_194_304  # Linux PID_MAX_LIMIT on 64-bit


# --------------------------------------------------------------------------- values


def meta(allowed: str | Callable[[], str], example: str) -> dict[str, Any]:
    """Field metadata the error messages and docs use: what is allowed, and an example.

    ``allowed`` may be a function, for text that depends on the installed backends.
    """
    return {"allowed": allowed, "example": example}


def option(default: Any, allowed: str | Callable[[], str], example: str, **constraints: Any) -> Any:
    """A config key's ``Field``: its default (``...``: the key is required, or its
    ``default_factory`` gives it), what is allowed and an example (:func:`meta`), and
    pydantic's own constraints (``ge``, ``le``, ``min_length``, ...) as keywords.
    """
    first = PydanticUndefined if default is ... else default
    return Field(first, json_schema_extra=meta(allowed, example), **constraints)


def refuse(
    problem: str,
    allowed: str = "",
    hint: str = "",
    key: tuple[str, ...] = (),
    got: str | None = None,
    *,
    choices: Sequence[str] = (),
) -> PydanticCustomError:
    """An error in our own words; ``key`` extends the error's location (model checks);
    ``choices``: the words the value may be, so a misspelt one gets "did you mean …?"."""
    ctx: dict[str, Any] = {"problem": problem, "allowed": allowed, "hint": hint, "key": key}
    if got is not None:
        ctx["got"] = got
    if choices:
        ctx["choices"] = tuple(choices)
    return PydanticCustomError("recoverygate", "{problem}", ctx)


def at_most_one(
    first: tuple[str, object], second: tuple[str, object], *, both: tuple[str, str]
) -> None:
    """Refuse a section that sets both of two keys, each given as ``(key, value)``, at
    ``second``'s key; ``both`` is the (allowed, hint) text of that refusal."""
    (first_key, first_value), (second_key, second_value) = first, second
    if first_value is not None and second_value is not None:
        raise refuse(
            f"{second_key} and {first_key} cannot both be set",
            *both,
            key=(second_key,),
            got=str(second_value),
        )


def exactly_one(
    first: tuple[str, object],
    second: tuple[str, object],
    *,
    missing: tuple[str, str],
    both: tuple[str, str],
) -> None:
    """Refuse a section that sets neither or both of two keys, each given as ``(key,
    value)``: neither is reported at ``first``'s key, both at ``second``'s; ``missing``
    and ``both`` are the (allowed, hint) texts of those two refusals."""
    (first_key, first_value), (_, second_value) = first, second
    if first_value is None and second_value is None:
        raise refuse("required key is missing", *missing, key=(first_key,), got="nothing")
    at_most_one(first, second, both=both)


def launch_or_attach(
    launch: tuple[str, object], attach: tuple[str, object], *, running: str, example: str
) -> None:
    """Refuse a workload that gives neither or both of what the drill launches and what
    it attaches to (``running``: what that is, for the message; ``example``: a launch)."""
    launch_key, attach_key = launch[0], attach[0]
    exactly_one(
        launch,
        attach,
        missing=(
            f"{launch_key} (the job to launch) or {attach_key} ({running})",
            f"e.g. {example}",
        ),
        both=(
            f"either {launch_key} (launch) or {attach_key} (attach)",
            f"remove {launch_key} to attach to the running job, or {attach_key} to launch one",
        ),
    )


def distinct_items(
    items: Sequence[object], field_name: str, *, allowed: str = "", why: str = ""
) -> None:
    """Refuse a list of ``workload.replicas`` items two of which share ``field_name``,
    at the later item's key; ``allowed`` replaces "a FIELD no other item has", ``why``
    follows the problem."""
    values = [str(getattr(item, field_name)) for item in items]
    for index, value in enumerate(values):
        if values.index(value) != index:
            raise refuse(
                f"is the {field_name} of item {values.index(value)} too{why}",
                allowed or f"a {field_name} no other item has",
                key=("replicas", str(index), field_name),
                got=value,
            )


def check_target_replica(
    replica: int | None, known: list[int] | None, needs: str, add: str
) -> None:
    """Refuse a ``targetReplica`` the job cannot take: one set without
    ``workload.replicas`` (``known`` None; ``needs`` says why it takes them, ``add`` how
    to write them), or, with them, one missing or not among the ``known`` replica ids."""
    if known is None:
        if replica is not None:
            raise refuse(
                needs,
                "targetReplica with workload.replicas",
                add,
                key=("targetReplica",),
                got=str(replica),
            )
        return
    if replica is None or replica not in known:
        raise refuse(
            f"is not among workload.replicas' replica ids ({', '.join(map(str, known))})"
            if replica is not None
            else "is required with workload.replicas (the replica group to kill)",
            f"one of {known}",
            "set targetReplica to one of them",
            key=("targetReplica",),
            got=str(replica) if replica is not None else "nothing",
        )


def _from_yaml(info: ValidationInfo) -> bool:
    return isinstance(info.context, Mapping) and bool(info.context.get("yaml"))


def _base_dir(info: ValidationInfo) -> Path:
    if isinstance(info.context, Mapping):
        base = info.context.get("base_dir")
        if isinstance(base, Path):
            return base
    return Path.cwd()


def duration(
    minimum: float = 0.0,
    maximum: float = MAX_DURATION,
    *,
    zero_ok: bool = True,
    optional: bool = False,
) -> BeforeValidator:
    """A validator turning ``90s``/``5m``/``1h30m``/``250ms`` into float seconds within bounds.

    ``optional``: ``null`` means "not set" (the field's default, ``None``).
    """
    low = format_duration(minimum)
    if minimum == 0 and not zero_ok:
        allowed = f"a duration above 0 and at most {format_duration(maximum)}, like 90s, 5m, 1h30m"
    else:
        allowed = f"a duration from {low} to {format_duration(maximum)}, like 90s, 5m, 1h30m"

    def check(value: Any, info: ValidationInfo) -> Any:
        if value is None and optional:
            return None
        if isinstance(value, bool):
            raise refuse("must be a duration, not true/false", allowed)
        if isinstance(value, (int, float)):
            if _from_yaml(info):
                hint = f"write {value}s" if value >= 0 else "durations are never negative"
                raise refuse("a duration needs a unit", allowed, hint)
            seconds = float(value)
        elif isinstance(value, str):
            try:
                seconds = parse_duration(value)
            except DurationSyntaxError as exc:
                raise refuse(f"is not a valid duration ({exc})", allowed) from None
        else:
            raise refuse("must be a duration", allowed)
        if not math.isfinite(seconds) or seconds < minimum or seconds > maximum:
            raise refuse("is out of range", allowed)
        if seconds == 0 and not zero_ok:
            raise refuse("must be longer than zero", allowed)
        return seconds

    check.kind = "duration"  # type: ignore[attr-defined]  # dump_effective writes it back as 5m
    return BeforeValidator(check)


_SUSTAIN_STEPS = re.compile(r"^\s*(\d+)\s+steps?\s*$")


def sustain_value() -> BeforeValidator:
    """A validator for ``sustain``: ``N steps`` (N >= 1) or a duration above 0, normalised."""
    allowed = "N steps (N >= 1) or a duration above 0, like 5 steps, 30s, 2m"

    def check(value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str):
            hint = f"write {value}s or {value} steps" if isinstance(value, int) else ""
            raise refuse("is neither a step count nor a duration", allowed, hint)
        match = _SUSTAIN_STEPS.match(value)
        if match:
            steps = int(match.group(1))
            if not 1 <= steps <= MAX_STEP:
                raise refuse("is out of range", allowed)
            return f"{steps} steps"
        try:
            seconds = parse_duration(value)
        except DurationSyntaxError:
            raise refuse("is neither a step count nor a duration", allowed) from None
        if not 0 < seconds <= MAX_DURATION:
            raise refuse("is out of range", allowed)
        return value.strip()

    return BeforeValidator(check)


def sustain_of(text: str | None) -> Sustain:
    """The engine's :class:`~pytest_recoverygate.engine.spec.Sustain` for a validated
    ``sustain``."""
    if text is None:
        return Sustain()
    match = _SUSTAIN_STEPS.match(text)
    if match:
        return Sustain(lines=1, seconds=0.0, steps=int(match.group(1)))
    return Sustain(lines=1, seconds=parse_duration(text))


_duration = duration  # for a field named ``duration`` (its name hides the function)


def step_ref(literal: str) -> BeforeValidator:
    """A validator turning ``step-N`` into N and passing ``literal`` (``latest``/``next``)."""
    allowed = f"step-N (N a whole number >= 0) or {literal}"

    def check(value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            if value.strip() == literal:
                return literal
            try:
                return parse_step_ref(value)
            except StepRefSyntaxError:
                raise refuse("is not a step reference", allowed, choices=(literal,)) from None
        if isinstance(value, int) and not isinstance(value, bool):
            if _from_yaml(info):
                raise refuse("a step reference is written step-N", allowed, f"write step-{value}")
            if 0 <= value <= MAX_STEP:
                return value
            raise refuse("is out of range", allowed)
        raise refuse("is not a step reference", allowed)

    check.kind = "step"  # type: ignore[attr-defined]  # dump_effective writes it back as step-N
    return BeforeValidator(check)


def file_path(*, must_be_dir: bool = False, optional: bool = True) -> BeforeValidator:
    """A validator turning a path string (``~`` expanded, relative to the config's folder)
    into an absolute, resolved :class:`~pathlib.Path`."""

    def check(value: Any, info: ValidationInfo) -> Any:
        if value is None and optional:  # an optional path left out (or written as null)
            return None
        if isinstance(value, Path):  # the default, or a model built in Python
            raw = str(value)
        elif isinstance(value, str):
            raw = value
        else:
            raise refuse("must be a path (text)", "a file or folder path", 'quote it: "…"')
        if not raw.strip() or "\x00" in raw:
            raise refuse("is not a usable path", "a non-empty path")
        if not raw.isprintable():  # a line break or control character in a path: a typo
            raise refuse("contains a control character", "a path of printable characters")
        try:
            path = Path(raw).expanduser()
        except RuntimeError:  # ~user with no such user, or no home directory at all
            raise refuse(
                "starts with ~ but that home directory cannot be found",
                "an absolute path, or one relative to the config file's folder",
            ) from None
        if not path.is_absolute():
            path = _base_dir(info) / path
        path = path.resolve()
        if must_be_dir and not path.is_dir():
            what = "does not exist" if not path.exists() else "is not a folder"
            raise refuse(
                f"{what}: {path}",
                "an existing folder, relative to the config file's folder",
                "create it or fix the path",
            )
        return path

    return BeforeValidator(check)


def command_arguments(value: Any) -> Any:
    """Accept a list of strings or one string split like a shell would (no shell runs)."""
    allowed = 'a list of strings like ["torchrun", "train.py"], or one string'
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise refuse(f"cannot be split into arguments ({exc})", allowed) from None
    if isinstance(value, list):
        if not value:
            raise refuse("must not be empty", allowed)
        for index, item in enumerate(value):
            if isinstance(item, str) and "\x00" in item:
                raise refuse(f"argument {index} contains a NUL byte", allowed)
        if isinstance(value[0], str) and not value[0].strip():
            raise refuse("the program (first item) is empty", allowed)
    return value


_WHOLE_NUMBER = re.compile(r"[1-9][0-9]*")


def node_count_field() -> Any:
    """``workload.nodes`` for a backend that launches one agent per node (local, fake)."""
    return option(
        1,
        "a whole number from 1 to 64 (default 1): > 1 runs one node per number",
        "nodes: 2",
        ge=1,
        le=64,
    )


#: A command the drill launches: a list, or one string split like a shell
#: (:func:`command_arguments`); None where the drill may attach to a running job instead.
Command: TypeAlias = Annotated[list[str] | None, BeforeValidator(command_arguments)]


def command_field(example: str, what: str = "") -> Any:
    """A :data:`Command` key's ``Field`` (``workload.command``, Ray's ``entrypoint``):
    ``what`` it launches, when the key's name does not say, and an example."""
    allowed = (
        "a non-empty list of strings (plain numbers like 2 or 0.5 count as written), "
        "or one string split like a shell (no shell runs)"
    )
    return option(None, f"{what}: {allowed}" if what else allowed, example)


def workdir_field() -> Any:
    """``workload.workdir`` of a backend that launches the job from a folder here."""
    return option(
        Path(),
        "an existing folder, relative to the config file's folder",
        "workdir: .",
        validate_default=True,
    )


def env_field(example: str) -> Any:
    """``workload.env``: what the launched job gets added to its environment."""
    return option(
        ...,
        "a mapping of names to text values (plain numbers like 1 count as written)",
        example,
        default_factory=dict,
    )


def env_names(env: dict[str, str], like: str) -> dict[str, str]:
    """``env`` if every name is one an environment can hold (``like``: an example name)."""
    for name in env:
        if not name or "=" in name or "\x00" in name:
            raise refuse(
                "is not a usable environment variable name",
                f"names without '=' or NUL, like {like}",
                key=(name,),
                got=repr(name),
            )
    return env


def id_number(value: Any) -> Any:
    """An id written as text (``jobId: "12345"``, what envsubst or a template produces).

    Only plain decimal digits without a leading zero become a number; anything else is
    left for strict validation to refuse (``"0123"``, ``"12.0"``, ``" 12"``, ``"1e3"``).
    """
    if isinstance(value, str) and _WHOLE_NUMBER.fullmatch(value):
        return int(value)
    return value


#: An optional id a config may also give as text (``jobId: "12345"``; :func:`id_number`).
IdNumber: TypeAlias = Annotated[int | None, BeforeValidator(id_number)]


def id_option(what: str, key: str, example: int, most: int) -> Any:
    """An :data:`IdNumber` key's ``Field``: ``what`` it is, an example, at most ``most``."""
    allowed = f'{what} (a whole number, also quoted: "{example}")'
    return option(None, allowed, f"{key}: {example}", ge=1, le=most)


# ---------------------------------------------------------------- StorageFault (issue 40)


def storage_mode(value: Any, info: ValidationInfo) -> Any:
    """``mode``: what the storage does (StorageFault), or what a bad node does to the work
    on it (StickyFault ``scope: node``), by the fault's ``type``."""
    sticky = info.data.get("type") == "StickyFault"
    allowed = NODE_MODES if sticky else MODES
    if value is None or (isinstance(value, str) and value in allowed):
        return value
    if sticky:
        raise refuse(
            "is not what a bad node does to the work on it (StickyFault scope: node)",
            " or ".join(NODE_MODES),
            "e.g. mode: kill",
        )
    raise refuse("is not a storage fault mode", " or ".join(MODES), "e.g. mode: enospc")


def storage_during(value: Any) -> Any:
    if value is None or (isinstance(value, str) and value in DURING):
        return value
    raise refuse("must be save or load", "save or load", "e.g. during: save")


def kill_after_value(value: Any) -> Any:
    if value is None or value in ("none", "save"):
        return value
    raise refuse("must be none or save", "none or save", "e.g. killAfter: save")


def storage_keys(failure: Any) -> None:
    """A StorageFault's keys fit each other (the path's own checks are the schema's)."""
    if failure.mode is None:
        raise refuse(
            "a StorageFault needs a mode",
            " or ".join(MODES),
            "add mode: enospc (or eio, readonly, stall, latency)",
            key=("mode",),
        )
    if failure.path is None:
        raise refuse(
            "a StorageFault needs the job's checkpoint folder",
            "an existing folder the job saves its checkpoints in",
            "add path: ./checkpoints",
            key=("path",),
        )
    if (failure.latency is None) != (failure.mode != "latency"):
        if failure.latency is None:
            raise refuse(
                "mode latency needs the delay to add",
                "a duration above 0",
                "add latency: 2s",
                key=("latency",),
            )
        raise refuse(
            f"applies to mode: latency only (this fault is {failure.mode})",
            "latency, with mode: latency",
            "remove latency, or use mode: latency",
            key=("latency",),
            got=format_duration(failure.latency),
        )
    if failure.during == "load" and failure.kill_after == "save":
        raise refuse(
            "does not go with during: load (the drill already kills the target for the load)",
            "killAfter with during: save",
            "remove killAfter, or use during: save",
            key=("killAfter",),
            got="save",
        )
    for key, given in (("count", failure.count != 1), ("delay", failure.delay is not None)):
        if given:
            raise refuse(
                "does not apply to StorageFault (one fault, armed at the trigger checkpoint)",
                f"{key} with another type",
                f"remove {key}",
                key=(key,),
            )
    problem = folder_problem(failure.path)
    if problem is not None:
        raise refuse(
            f"cannot be covered by a storage fault: {problem}",
            "the job's own checkpoint folder",
            "point path at the folder the job saves its checkpoints in",
            key=("path",),
            got=str(failure.path),
        )


def storage_spec_of(failure: Any) -> StorageSpec | None:
    """The engine's :class:`~pytest_recoverygate.engine.storage.StorageSpec` of a
    validated StorageFault (None for any other fault)."""
    if failure.type != "StorageFault" or failure.mode is None:
        return None
    return StorageSpec(
        mode=failure.mode,
        during=failure.during or "save",
        path=str(failure.path or ""),
        latency=failure.latency,
        duration=failure.duration,
        kill_after=failure.kill_after == "save",
    )


def path_in_scope(scope: tuple[Path, ...] | None, path: Path) -> None:
    """A StorageFault's ``path`` lies in a folder the job can be shown to use (``scope``:
    the workload's :meth:`storage_scope`; None: it cannot say yet)."""
    if scope is None:
        return
    if any(path == folder or folder in path.parents for folder in scope):
        return
    shown = ", ".join(str(f) for f in scope[:4]) or "none"
    raise refuse(
        "lies outside what the job can be shown to use (its working folder and the paths "
        f"its command names: {shown})",
        "the job's checkpoint folder, inside its working folder or named by its command",
        "point path at the folder the job saves to, or name it in the job's command",
        key=("path",),
        got=str(path),
    )


# ---------------------------------------------------------------- KillDuringRecovery (issue 43)

#: ``injectFailure.phase``: where in the first kill's recovery the second kill lands.
RECOVERY_PHASES = ("startup", "rendezvous", "checkpointLoad", "firstInterval")


def recovery_phase_value(value: Any) -> Any:
    if value is None or (isinstance(value, str) and value in RECOVERY_PHASES):
        return value
    raise refuse(
        "is not a phase of a recovery",
        " or ".join(RECOVERY_PHASES),
        "e.g. phase: checkpointLoad",
    )


def reentry_keys(failure: Any) -> None:
    """A KillDuringRecovery's keys fit each other."""
    if failure.phase is None:
        raise refuse(
            "a KillDuringRecovery needs the phase its second kill lands in",
            " or ".join(RECOVERY_PHASES),
            "add phase: checkpointLoad",
            key=("phase",),
        )
    if failure.count != 1:
        raise refuse(
            "does not apply to KillDuringRecovery (its two kills are one drill)",
            "count with another type",
            "remove count",
            key=("count",),
        )


# ---------------------------------------------------------------- StickyFault (issue 43)

#: ``injectFailure.scope`` of a StickyFault.
STICKY_SCOPES = ("step", "checkpoint", "node")
#: ``injectFailure.mode`` of a StickyFault with ``scope: node``: what the bad node does
#: to each job process that starts on it.
NODE_MODES = ("kill", "hang")
#: ``injectFailure.damage``: how a checkpoint is damaged at rest.
DAMAGES = ("truncate", "zero", "flip")


def sticky_scope_value(value: Any) -> Any:
    if value is None or (isinstance(value, str) and value in STICKY_SCOPES):
        return value
    raise refuse("is not a StickyFault scope", " or ".join(STICKY_SCOPES), "e.g. scope: step")


def damage_value(value: Any) -> Any:
    if value is None or (isinstance(value, str) and value in DAMAGES):
        return value
    raise refuse("is not a kind of damage", " or ".join(DAMAGES), "e.g. damage: flip")


def sticky_keys(failure: Any) -> None:
    """A StickyFault's keys fit its scope."""
    if failure.scope is None:
        raise refuse(
            "a StickyFault needs its scope",
            " or ".join(STICKY_SCOPES),
            "add scope: step (with atStep: N), scope: checkpoint (with path:) or scope: node",
            key=("scope",),
        )
    if failure.scope == "step" and failure.at_step is None:
        raise refuse(
            "scope: step needs the step every incarnation dies at",
            "a whole number >= 1, after the trigger checkpoint",
            "add atStep: 50",
            key=("atStep",),
        )
    trigger = failure.after_checkpoint
    if failure.scope == "step" and isinstance(trigger, int) and failure.at_step <= trigger:
        raise refuse(
            f"must come after the trigger (afterCheckpoint: step-{trigger}): the poison is "
            "armed there",
            f"a step above {trigger}",
            key=("atStep",),
            got=str(failure.at_step),
        )
    if failure.scope == "checkpoint" and failure.path is None:
        raise refuse(
            "scope: checkpoint needs the job's checkpoint folder (its files are damaged)",
            "an existing folder the job saves its checkpoints in",
            "add path: ./checkpoints",
            key=("path",),
        )
    for key, given, scope in (
        ("atStep", failure.at_step is not None, "step"),
        ("damage", failure.damage is not None, "checkpoint"),
        ("path", failure.path is not None, "checkpoint"),
        ("mode", failure.mode is not None, "node"),
        ("after", failure.after is not None, "node"),
        ("targetNode", failure.target_node is not None, "node"),
    ):
        if given and failure.scope != scope:
            raise refuse(
                f"applies to scope: {scope} only (this StickyFault is scope: {failure.scope})",
                f"{key} with scope: {scope}",
                f"remove {key}",
                key=(key,),
            )
    if failure.count != 1:
        raise refuse(
            "does not apply to StickyFault (the failure comes back by itself)",
            "count with another type",
            "remove count",
            key=("count",),
        )
    if failure.path is not None:
        problem = folder_problem(failure.path)
        if problem is not None:
            raise refuse(
                f"cannot be damaged by a fault: {problem}",
                "the job's own checkpoint folder",
                key=("path",),
                got=str(failure.path),
            )


def sticky_spec_of(
    failure: Any, max_crash_loop: int | None, gpus: int | None = None
) -> StickySpec | None:
    """The engine's StickySpec of a validated StickyFault (None for any other fault);
    ``gpus``: ``projection.gpus``, the scale a crash loop's cost is told at."""
    if failure.type != "StickyFault" or failure.scope is None:
        return None
    return StickySpec(
        scope=failure.scope,
        at_step=failure.at_step,
        max_crash_loop=3 if max_crash_loop is None else max_crash_loop,
        damage=failure.damage or "truncate",
        gpus=gpus,
        mode=failure.mode or "kill",
        after=failure.after or 0.0,
    )
