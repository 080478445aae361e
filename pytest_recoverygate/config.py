"""Load ``recovery-test.yaml`` into a validated, typed :class:`DrillConfig`.

A drill config points a destructive tool at an expensive job, so it is checked strictly
and every problem is reported at once, each on its own line, in the form::

    FILE:LINE: key.path: problem — got VALUE; allowed: … (fix hint)

How: the YAML is *composed* (not loaded) with pyyaml's safe loader, so every key keeps
the line it was written on; anchors and aliases are refused while composing (a "billion
laughs" document never expands), nesting depth and file size are bounded. The node tree
is then turned into plain Python values by hand, which also catches duplicate keys,
complex keys and unknown tags. Pydantic v2 (strict, ``extra="forbid"``, camelCase
aliases) validates the values, and its errors are rewritten in our words with the line
numbers found while composing. Nothing here touches the cluster or the job: checking a
config is safe to run anywhere (``recoverygate validate``).

In YAML the keys are camelCase (``injectFailure.afterCheckpoint``); in Python the
attributes are snake_case (``config.inject_failure.after_checkpoint``). Models can also
be built in Python by field name; there durations may be plain seconds and step
references plain ints, while YAML insists on ``90s`` and ``step-1000``.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from yaml.events import AliasEvent, CollectionStartEvent, Event, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from pytest_recoverygate.durations import (
    DurationSyntaxError,
    StepRefSyntaxError,
    format_duration,
    format_step_ref,
    parse_duration,
    parse_step_ref,
)
from pytest_recoverygate.errors import ConfigError

__all__ = [
    "DrillConfig",
    "Expectations",
    "FakeJobSpec",
    "FakeWorkload",
    "InjectFailure",
    "KubernetesWorkload",
    "LocalWorkload",
    "Safety",
    "SlurmWorkload",
    "Timeouts",
    "WorkloadConfig",
    "dump_effective",
    "load_config",
    "parse_config",
    "schema_keys",
]

#: Bounds that turn absurd values into errors instead of overflows or endless waits.
MAX_CONFIG_BYTES = 256 * 1024
MAX_DEPTH = 32
MAX_DURATION = 30 * 24 * 3600.0  # 30 days
MAX_RANK = 1_000_000
MAX_STEP = 2**63 - 1
MAX_PID = 4_194_304  # Linux PID_MAX_LIMIT on 64-bit
MAX_SLURM_JOB_ID = 2**32 - 1

Orchestrator = Literal["fake", "local", "kubernetes", "slurm"]
ResumeMode = Literal["latest", "zero", "older", "never"]
FailureType = Literal["KillWorker", "KillStep", "Requeue"]
ORCHESTRATORS: tuple[str, ...] = get_args(Orchestrator)
SLURM_ONLY_FAILURES = ("KillStep", "Requeue")

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_ROOT_ONLY_IN_PYTHON = ("sourcePath", "source_path")


# --------------------------------------------------------------------------- values


def _meta(allowed: str, example: str) -> dict[str, Any]:
    """Field metadata the error messages and docs use: what is allowed, and an example."""
    return {"allowed": allowed, "example": example}


def _rg_error(
    problem: str,
    allowed: str = "",
    hint: str = "",
    key: tuple[str, ...] = (),
    got: str | None = None,
) -> PydanticCustomError:
    """An error in our own words; ``key`` extends the error's location (model checks)."""
    ctx: dict[str, Any] = {"problem": problem, "allowed": allowed, "hint": hint, "key": key}
    if got is not None:
        ctx["got"] = got
    return PydanticCustomError("recoverygate", "{problem}", ctx)


def _from_yaml(info: ValidationInfo) -> bool:
    return isinstance(info.context, Mapping) and bool(info.context.get("yaml"))


def _base_dir(info: ValidationInfo) -> Path:
    if isinstance(info.context, Mapping):
        base = info.context.get("base_dir")
        if isinstance(base, Path):
            return base
    return Path.cwd()


def _duration(
    minimum: float = 0.0, maximum: float = MAX_DURATION, *, zero_ok: bool = True
) -> BeforeValidator:
    """A validator turning ``90s``/``5m``/``1h30m``/``250ms`` into float seconds within bounds."""
    low = format_duration(minimum)
    if minimum == 0 and not zero_ok:
        allowed = f"a duration above 0 and at most {format_duration(maximum)}, like 90s, 5m, 1h30m"
    else:
        allowed = f"a duration from {low} to {format_duration(maximum)}, like 90s, 5m, 1h30m"

    def check(value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool):
            raise _rg_error("must be a duration, not true/false", allowed)
        if isinstance(value, (int, float)):
            if _from_yaml(info):
                hint = f"write {value}s" if value >= 0 else "durations are never negative"
                raise _rg_error("a duration needs a unit", allowed, hint)
            seconds = float(value)
        elif isinstance(value, str):
            try:
                seconds = parse_duration(value)
            except DurationSyntaxError as exc:
                raise _rg_error(f"is not a valid duration ({exc})", allowed) from None
        else:
            raise _rg_error("must be a duration", allowed)
        if not math.isfinite(seconds) or seconds < minimum or seconds > maximum:
            raise _rg_error("is out of range", allowed)
        if seconds == 0 and not zero_ok:
            raise _rg_error("must be longer than zero", allowed)
        return seconds

    return BeforeValidator(check)


def _step_ref(literal: str) -> BeforeValidator:
    """A validator turning ``step-N`` into N and passing ``literal`` (``latest``/``next``)."""
    allowed = f"step-N (N a whole number >= 0) or {literal}"

    def check(value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            if value.strip() == literal:
                return literal
            try:
                return parse_step_ref(value)
            except StepRefSyntaxError:
                raise _rg_error("is not a step reference", allowed) from None
        if isinstance(value, int) and not isinstance(value, bool):
            if _from_yaml(info):
                raise _rg_error(
                    "a step reference is written step-N", allowed, f"write step-{value}"
                )
            if 0 <= value <= MAX_STEP:
                return value
            raise _rg_error("is out of range", allowed)
        raise _rg_error("is not a step reference", allowed)

    return BeforeValidator(check)


def _path(*, must_be_dir: bool = False, optional: bool = True) -> BeforeValidator:
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
            raise _rg_error("must be a path (text)", "a file or folder path", 'quote it: "…"')
        if not raw.strip() or "\x00" in raw:
            raise _rg_error("is not a usable path", "a non-empty path")
        path = Path(raw).expanduser()
        if not path.is_absolute():
            path = _base_dir(info) / path
        path = path.resolve()
        if must_be_dir and not path.is_dir():
            what = "does not exist" if not path.exists() else "is not a folder"
            raise _rg_error(
                f"{what}: {path}",
                "an existing folder, relative to the config file's folder",
                "create it or fix the path",
            )
        return path

    return BeforeValidator(check)


def _command(value: Any) -> Any:
    """Accept a list of strings or one string split like a shell would (no shell runs)."""
    allowed = 'a list of strings like ["torchrun", "train.py"], or one string'
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise _rg_error(f"cannot be split into arguments ({exc})", allowed) from None
    if isinstance(value, list):
        if not value:
            raise _rg_error("must not be empty", allowed)
        for index, item in enumerate(value):
            if isinstance(item, str) and "\x00" in item:
                raise _rg_error(f"argument {index} contains a NUL byte", allowed)
        if isinstance(value[0], str) and not value[0].strip():
            raise _rg_error("the program (first item) is empty", allowed)
    return value


_WHOLE_NUMBER = re.compile(r"[1-9][0-9]*")


def _id_number(value: Any) -> Any:
    """An id written as text (``jobId: "12345"``, what envsubst or a template produces).

    Only plain decimal digits without a leading zero become a number; anything else is
    left for strict validation to refuse (``"0123"``, ``"12.0"``, ``" 12"``, ``"1e3"``).
    """
    if isinstance(value, str) and _WHOLE_NUMBER.fullmatch(value):
        return int(value)
    return value


# ------------------------------------------------------------------------- models


class _Model(BaseModel):
    """Strict, frozen, camelCase in YAML and snake_case in Python."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
    )


class FakeJobSpec(_Model):
    """The simulated training job of ``orchestrator: fake`` (the whole block is optional)."""

    workers: int = Field(
        default=2,
        ge=2,
        le=1024,
        json_schema_extra=_meta("a whole number from 2 to 1024", "workers: 2"),
    )
    steps_per_second: float = Field(
        default=50.0,
        gt=0,
        le=1_000_000,
        allow_inf_nan=False,
        json_schema_extra=_meta("a number above 0 and at most 1000000", "stepsPerSecond: 50"),
    )
    checkpoint_every: int = Field(
        default=20,
        ge=1,
        le=MAX_STEP,
        json_schema_extra=_meta("a whole number >= 1 (steps)", "checkpointEvery: 20"),
    )
    restart_delay: Annotated[float, _duration()] = Field(
        default=1.0, json_schema_extra=_meta("a duration like 1s", "restartDelay: 1s")
    )
    resume: ResumeMode = Field(
        default="latest", json_schema_extra=_meta("latest, zero, older or never", "resume: latest")
    )
    startup_delay: Annotated[float, _duration()] = Field(
        default=0.0, json_schema_extra=_meta("a duration like 0s", "startupDelay: 0s")
    )


class _WorkloadBase(_Model):
    reporting_rank: int = Field(
        default=0,
        ge=0,
        le=MAX_RANK,
        json_schema_extra=_meta("a whole number >= 0", "reportingRank: 0"),
    )


class FakeWorkload(_WorkloadBase):
    """An in-memory simulated job: try the whole tool with no infrastructure."""

    orchestrator: Literal["fake"] = Field(json_schema_extra=_meta("fake", "orchestrator: fake"))
    fake: FakeJobSpec = Field(
        default_factory=FakeJobSpec,
        json_schema_extra=_meta("a mapping of the fake job's settings", "fake: {workers: 2}"),
    )

    @model_validator(mode="after")
    def _reporting_rank_exists(self) -> FakeWorkload:
        if self.reporting_rank >= self.fake.workers:
            raise _rg_error(
                f"rank {self.reporting_rank} does not exist "
                f"in a job of {self.fake.workers} workers",
                f"a rank from 0 to {self.fake.workers - 1}",
                key=("reportingRank",),
                got=str(self.reporting_rank),
            )
        return self


class LocalWorkload(_WorkloadBase):
    """A torchrun job on this machine, launched by the drill or attached to by pid."""

    orchestrator: Literal["local"] = Field(json_schema_extra=_meta("local", "orchestrator: local"))
    command: Annotated[list[str] | None, BeforeValidator(_command)] = Field(
        default=None,
        json_schema_extra=_meta(
            "a non-empty list of strings (plain numbers like 2 or 0.5 count as written), "
            "or one string split like a shell (no shell runs)",
            'command: ["torchrun", "--nproc-per-node=2", "train.py"]',
        ),
    )
    workdir: Annotated[Path, _path(must_be_dir=True, optional=False)] = Field(
        default=Path(),
        validate_default=True,
        json_schema_extra=_meta(
            "an existing folder, relative to the config file's folder", "workdir: ."
        ),
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra=_meta(
            "a mapping of names to text values (plain numbers like 1 count as written)",
            'env: {NCCL_DEBUG: "INFO"}',
        ),
    )
    attach_pid: Annotated[int | None, BeforeValidator(_id_number)] = Field(
        default=None,
        ge=1,
        le=MAX_PID,
        json_schema_extra=_meta(
            'the pid of a running torchrun agent (a whole number, also quoted: "1234")',
            "attachPid: 1234",
        ),
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not name or "=" in name or "\x00" in name:
                raise _rg_error(
                    "is not a usable environment variable name",
                    "names without '=' or NUL, like NCCL_DEBUG",
                    key=(name,),
                    got=repr(name),
                )
        return env

    @model_validator(mode="after")
    def _command_xor_attach(self) -> LocalWorkload:
        if self.command is None and self.attach_pid is None:
            raise _rg_error(
                "required key is missing",
                "command (the job to launch) or attachPid (a torchrun agent already running)",
                'e.g. command: ["torchrun", "--nproc-per-node=2", "train.py"]',
                key=("command",),
                got="nothing",
            )
        if self.command is not None and self.attach_pid is not None:
            raise _rg_error(
                "attachPid and command cannot both be set",
                "either command (launch) or attachPid (attach)",
                "remove command to attach to the running job, or attachPid to launch one",
                key=("attachPid",),
                got=str(self.attach_pid),
            )
        return self


class KubernetesWorkload(_WorkloadBase):
    """Pods of one training job (e.g. a Kubeflow PyTorchJob), found by label selector."""

    orchestrator: Literal["kubernetes"] = Field(
        json_schema_extra=_meta("kubernetes", "orchestrator: kubernetes")
    )
    selector: Annotated[str, Field(min_length=1, max_length=1024)] = Field(
        json_schema_extra=_meta("a non-empty label selector", 'selector: "training-run=llama"')
    )
    namespace: str | None = Field(
        default=None,
        pattern=_DNS_LABEL,
        json_schema_extra=_meta(
            "a namespace name (lowercase letters, digits, '-')", "namespace: default"
        ),
    )
    context: str | None = Field(
        default=None,
        min_length=1,
        json_schema_extra=_meta("a kubeconfig context name", "context: my-ctx"),
    )
    kubeconfig: Annotated[Path | None, _path()] = Field(
        default=None,
        json_schema_extra=_meta("a path to a kubeconfig file", "kubeconfig: ~/.kube/config"),
    )
    container: str | None = Field(
        default=None,
        pattern=_DNS_LABEL,
        json_schema_extra=_meta(
            "a container name (lowercase letters, digits, '-')", "container: pytorch"
        ),
    )

    @field_validator("selector", mode="before")
    @classmethod
    def _strip_selector(cls, value: Any) -> Any:
        if isinstance(value, str):
            stripped = value.strip()
            if not stripped:
                raise _rg_error(
                    "must not be empty (an empty selector matches every pod)",
                    "a label selector naming one job",
                    'e.g. selector: "training-run=llama"',
                )
            return stripped
        return value


class SlurmWorkload(_WorkloadBase):
    """One SLURM job, by id or by name (+ user)."""

    orchestrator: Literal["slurm"] = Field(json_schema_extra=_meta("slurm", "orchestrator: slurm"))
    job_id: Annotated[int | None, BeforeValidator(_id_number)] = Field(
        default=None,
        ge=1,
        le=MAX_SLURM_JOB_ID,
        json_schema_extra=_meta(
            'a SLURM job id (a whole number, also quoted: "12345")', "jobId: 12345"
        ),
    )
    job_name: str | None = Field(
        default=None, min_length=1, json_schema_extra=_meta("a SLURM job name", "jobName: llama-ft")
    )
    user: str | None = Field(
        default=None, min_length=1, json_schema_extra=_meta("a user name", "user: alice")
    )
    partition: str | None = Field(
        default=None, min_length=1, json_schema_extra=_meta("a partition name", "partition: gpu")
    )
    output: Annotated[Path | None, _path()] = Field(
        default=None,
        json_schema_extra=_meta(
            "the job's stdout file (SLURM patterns like %j allowed)", "output: slurm-%j.out"
        ),
    )
    poll_interval: Annotated[float, _duration(0.1, 60.0)] = Field(
        default=1.0, json_schema_extra=_meta("a duration from 100ms to 1m", "pollInterval: 1s")
    )

    @model_validator(mode="after")
    def _one_job(self) -> SlurmWorkload:
        if self.job_id is None and self.job_name is None:
            raise _rg_error(
                "required key is missing",
                "jobId or jobName (exactly one)",
                "e.g. jobId: 12345",
                key=("jobId",),
                got="nothing",
            )
        if self.job_id is not None and self.job_name is not None:
            raise _rg_error(
                "jobId and jobName cannot both be set",
                "exactly one of jobId / jobName",
                "keep the one that names the job",
                key=("jobName",),
                got=self.job_name,
            )
        if self.user is not None and self.job_name is None:
            raise _rg_error(
                "user only applies with jobName",
                "user together with jobName",
                "remove user: a job id is unique",
                key=("user",),
                got=self.user,
            )
        return self


WorkloadConfig = FakeWorkload | LocalWorkload | KubernetesWorkload | SlurmWorkload
_WORKLOAD_BY_TAG: dict[str, type[_WorkloadBase]] = {
    "fake": FakeWorkload,
    "local": LocalWorkload,
    "kubernetes": KubernetesWorkload,
    "slurm": SlurmWorkload,
}


class InjectFailure(_Model):
    """What to break, and when."""

    type: FailureType = Field(
        default="KillWorker",
        json_schema_extra=_meta(
            "KillWorker, KillStep or Requeue (the last two with slurm only)", "type: KillWorker"
        ),
    )
    after_checkpoint: Annotated[int | Literal["next"], _step_ref("next")] = Field(
        json_schema_extra=_meta("step-N or next", "afterCheckpoint: step-1000")
    )
    target_rank: int = Field(
        default=1,
        ge=0,
        le=MAX_RANK,
        json_schema_extra=_meta("a whole number >= 0", "targetRank: 1"),
    )


class Expectations(_Model):
    """What a successful recovery looks like (the drill's pass criteria)."""

    resume_from_checkpoint: Annotated[int | Literal["latest"], _step_ref("latest")] = Field(
        default="latest",
        json_schema_extra=_meta("step-N or latest", "resumeFromCheckpoint: latest"),
    )
    max_recovery_time: Annotated[float, _duration(zero_ok=False)] = Field(
        json_schema_extra=_meta("a duration above 0, like 5m", "maxRecoveryTime: 5m")
    )
    max_lost_steps: int | None = Field(
        default=None,
        ge=0,
        le=MAX_STEP,
        json_schema_extra=_meta("a whole number >= 0", "maxLostSteps: 100"),
    )


class Safety(_Model):
    """Interlocks before anything is destroyed."""

    require_confirm: bool = Field(
        default=True, json_schema_extra=_meta("true or false", "requireConfirm: true")
    )
    dry_run: bool = Field(default=False, json_schema_extra=_meta("true or false", "dryRun: false"))


class Timeouts(_Model):
    """Deadlines of the drill's phases, in seconds.

    ``recovery`` left out (or 0 in Python) is derived by :class:`DrillConfig` as
    ``maxRecoveryTime + recoveryGrace``, so after validation it is always a positive number:
    "never came back" is decided that long after the kill.
    """

    discovery: Annotated[float, _duration(zero_ok=False)] = Field(
        default=300.0, json_schema_extra=_meta("a duration above 0", "discovery: 5m")
    )
    checkpoint: Annotated[float, _duration(zero_ok=False)] = Field(
        default=3600.0, json_schema_extra=_meta("a duration above 0", "checkpoint: 1h")
    )
    recovery: Annotated[float, _duration(zero_ok=False)] = Field(
        default=0.0, json_schema_extra=_meta("a duration above 0", "recovery: 10m")
    )
    recovery_grace: Annotated[float, _duration(zero_ok=True)] = Field(
        default=30.0,
        json_schema_extra=_meta("a duration >= 0", "recoveryGrace: 30s"),
    )


class DrillConfig(_Model):
    """One drill: the workload, the failure to inject, the expectations and the guards."""

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$")] = (
        Field(
            default="drill",
            json_schema_extra=_meta("a short name (default: the file's name)", "name: llama-drill"),
        )
    )
    workload: WorkloadConfig = Field(
        discriminator="orchestrator",
        json_schema_extra=_meta(
            "a mapping with orchestrator: fake | local | kubernetes | slurm "
            "and that backend's keys",
            "workload: {orchestrator: fake}",
        ),
    )
    inject_failure: InjectFailure = Field(
        json_schema_extra=_meta(
            "a mapping with afterCheckpoint (and type, targetRank)",
            "injectFailure: {afterCheckpoint: next}",
        )
    )
    expectations: Expectations = Field(
        json_schema_extra=_meta(
            "a mapping with maxRecoveryTime (and resumeFromCheckpoint, maxLostSteps)",
            "expectations: {maxRecoveryTime: 5m}",
        )
    )
    safety: Safety = Field(
        default_factory=Safety,
        json_schema_extra=_meta("a mapping with requireConfirm, dryRun", "safety: {dryRun: true}"),
    )
    timeouts: Timeouts = Field(
        default_factory=Timeouts,
        validate_default=True,
        json_schema_extra=_meta(
            "a mapping with discovery, checkpoint, recovery", "timeouts: {discovery: 5m}"
        ),
    )
    source_path: Path = Field(
        default=Path("recovery-test.yaml"),
        json_schema_extra=_meta("set by the loader", ""),
    )

    @model_validator(mode="before")
    @classmethod
    def _from_the_file(cls, data: Any, info: ValidationInfo) -> Any:
        """Fill in what the file implies: its path and, by default, its stem as the name."""
        if isinstance(data, dict) and isinstance(info.context, Mapping):
            source = info.context.get("source")
            if isinstance(source, Path):
                data = dict(data)
                data["sourcePath"] = source
                data.setdefault("name", source.stem or "drill")
        return data

    @field_validator("name", mode="before")
    @classmethod
    def _strip_name(cls, value: Any) -> Any:
        return value.strip() if isinstance(value, str) else value

    @field_validator("inject_failure")
    @classmethod
    def _failure_fits_workload(cls, failure: InjectFailure, info: ValidationInfo) -> InjectFailure:
        workload = info.data.get("workload")
        if workload is None:
            return failure
        if failure.type in SLURM_ONLY_FAILURES and not isinstance(workload, SlurmWorkload):
            orchestrator = getattr(workload, "orchestrator", "?")
            raise _rg_error(
                f"{failure.type} needs orchestrator: slurm (this drill uses {orchestrator})",
                "KillWorker with this orchestrator",
                "use type: KillWorker",
                key=("type",),
                got=failure.type,
            )
        if isinstance(workload, FakeWorkload) and failure.target_rank >= workload.fake.workers:
            raise _rg_error(
                f"rank {failure.target_rank} does not exist "
                f"in a job of {workload.fake.workers} workers",
                f"a rank from 0 to {workload.fake.workers - 1}",
                key=("targetRank",),
                got=str(failure.target_rank),
            )
        return failure

    @field_validator("timeouts")
    @classmethod
    def _derive_recovery(cls, timeouts: Timeouts, info: ValidationInfo) -> Timeouts:
        expectations = info.data.get("expectations")
        if expectations is None:
            return timeouts
        slo = expectations.max_recovery_time
        if timeouts.recovery == 0.0:
            derived = min(slo + timeouts.recovery_grace, MAX_DURATION)
            return timeouts.model_copy(update={"recovery": derived})
        if timeouts.recovery < slo:
            raise _rg_error(
                f"is shorter than expectations.maxRecoveryTime ({format_duration(slo)}), "
                "so a slow but passing recovery would be cut off",
                f"a duration of at least {format_duration(slo)}",
                "raise it, or leave it out for maxRecoveryTime + recoveryGrace",
                key=("recovery",),
            )
        return timeouts


# ------------------------------------------------------------------- YAML reading


class _Refused(Exception):
    """A YAML feature we refuse on purpose (anchors, aliases, deep nesting)."""

    def __init__(self, line: int, problem: str, hint: str) -> None:
        super().__init__(problem)
        self.line = line
        self.problem = problem
        self.hint = hint


class _Loader(yaml.SafeLoader):
    """pyyaml's safe loader that refuses anchors, aliases and deep nesting while composing.

    Refusing at compose time means a "billion laughs" document costs what its text costs:
    no alias is ever followed.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event: Event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark else 1
        if isinstance(event, AliasEvent):
            raise _Refused(
                line,
                f"YAML aliases (*{event.anchor}) are not allowed",
                "write the value out in full; anchors and aliases are refused so a config "
                "cannot expand into a YAML bomb",
            )
        if isinstance(event, (ScalarEvent, CollectionStartEvent)) and event.anchor is not None:
            raise _Refused(
                line,
                f"YAML anchors (&{event.anchor}) are not allowed",
                "remove the anchor and write values out in full; anchors and aliases are "
                "refused so a config cannot expand into a YAML bomb",
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(
                    line,
                    f"nesting is deeper than {MAX_DEPTH} levels",
                    "a drill config is a few levels deep",
                )
            node: Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1


@dataclass(frozen=True)
class _Where:
    """Where a value sits in the file, and how it was written."""

    line: int
    text: str  # the value as written (scalars), or a short description (collections)


@dataclass(frozen=True, order=True)
class _Problem:
    line: int
    path: str
    problem: str
    got: str
    allowed: str
    hint: str

    def render(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line else f"{file} (override)"
        text = f"{where}: {self.path}: {self.problem} — got {self.got}"
        if self.allowed:
            text += f"; allowed: {self.allowed}"
        if self.hint:
            text += f" ({self.hint})"
        return text


_PathKey = tuple[Any, ...]
_INVALID = object()  # stands in for a value that could not be read (already reported)

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_SCALAR_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "timestamp")
)


def _shorten(text: str, limit: int = 80) -> str:
    """One line, printable, at most ``limit`` characters."""
    printable = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return printable if len(printable) <= limit else printable[: limit - 1] + "…"


def _scalar_text(node: ScalarNode) -> str:
    if node.style in ('"', "'"):
        return _shorten(f"{node.style}{node.value}{node.style}")
    if node.value == "" and node.tag == "tag:yaml.org,2002:null":
        return "nothing (empty value)"
    return _shorten(str(node.value))


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        keys = ", ".join(_shorten(str(k), 20) for k in list(value)[:4])
        return (
            f"a mapping ({keys}{', …' if len(value) > 4 else ''})" if value else "an empty mapping"
        )
    if isinstance(value, list):
        if not value:
            return "[] (an empty list)"
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return _shorten(repr(value) if isinstance(value, str) else str(value))


class _Reader:
    """Turns a composed YAML node tree into Python values, remembering where each was."""

    def __init__(self, loader: _Loader) -> None:
        self.loader = loader
        self.where: dict[_PathKey, _Where] = {}
        self.problems: list[_Problem] = []

    def _problem(
        self, line: int, path: _PathKey, problem: str, *, got: str, allowed: str, hint: str = ""
    ) -> None:
        self.problems.append(_Problem(line, _format_path(path), problem, got, allowed, hint))

    def read(self, node: Node, path: _PathKey) -> Any:
        line = node.start_mark.line + 1
        if isinstance(node, ScalarNode):
            if node.tag not in _SCALAR_TAGS:
                self._problem(
                    line,
                    path,
                    f"YAML tag {node.tag} is not supported",
                    got=_scalar_text(node),
                    allowed="plain YAML values (text, numbers, true/false)",
                    hint="remove the tag",
                )
                return _INVALID
            try:
                value = self.loader.construct_object(node)
            except (yaml.YAMLError, ValueError, OverflowError, TypeError) as exc:
                problem = getattr(exc, "problem", None) or str(exc)
                self._problem(
                    line,
                    path,
                    f"cannot be read ({_shorten(str(problem), 100)})",
                    got=_scalar_text(node),
                    allowed="plain YAML values (text, numbers, true/false)",
                    hint="remove the !!tag or quote the value",
                )
                return _INVALID
            if _is_text_slot(path) and _is_plain_decimal(node, value):
                return node.value  # a number in argv or env: its decimal text, as written
            return value
        if isinstance(node, MappingNode):
            if node.tag != _MAP_TAG:
                self._problem(
                    line,
                    path,
                    f"YAML tag {node.tag} is not supported",
                    got="a tagged mapping",
                    allowed="a plain mapping",
                    hint="remove the tag",
                )
                return _INVALID
            result: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key_line = key_node.start_mark.line + 1
                if not isinstance(key_node, ScalarNode):
                    self._problem(
                        key_line,
                        path,
                        "a key must be a plain word, not a list or mapping",
                        got="a complex key",
                        allowed="key: value pairs",
                        hint="write the key as a word",
                    )
                    continue
                key = self.read(key_node, (*path, key_node.value))
                if key is _INVALID:
                    continue
                child = (*path, key)
                if key in result:
                    first = self.where[child].line
                    self._problem(
                        key_line,
                        child,
                        f"key appears twice (first on line {first})",
                        got=_scalar_text(key_node),
                        allowed="each key once",
                        hint="remove one of them",
                    )
                    continue
                value = self.read(value_node, child)
                text = (
                    _scalar_text(value_node)
                    if isinstance(value_node, ScalarNode)
                    else _describe(value)
                )
                self.where[child] = _Where(key_line, text)
                result[key] = value
            return result
        if isinstance(node, SequenceNode):
            if node.tag != _SEQ_TAG:
                self._problem(
                    line,
                    path,
                    f"YAML tag {node.tag} is not supported",
                    got="a tagged list",
                    allowed="a plain list",
                    hint="remove the tag",
                )
                return _INVALID
            items: list[Any] = []
            for index, item_node in enumerate(node.value):
                child = (*path, index)
                value = self.read(item_node, child)
                text = (
                    _scalar_text(item_node)
                    if isinstance(item_node, ScalarNode)
                    else _describe(value)
                )
                self.where[child] = _Where(item_node.start_mark.line + 1, text)
                items.append(value)
            return items
        raise AssertionError(f"unexpected YAML node {node!r}")  # pragma: no cover


_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")


def _is_text_slot(path: _PathKey) -> bool:
    """An argument of ``workload.command`` or a value of ``workload.env``: always text."""
    return len(path) == 3 and path[0] == "workload" and path[1] in ("command", "env")


def _is_plain_decimal(node: ScalarNode, value: Any) -> bool:
    """A bare number whose text reads the same to everyone: ``2``, ``-1``, ``0.02``.

    Not ``0x10``, ``010`` (octal in YAML 1.1), ``1_000``, ``1e3``, ``+5`` or ``.inf``: YAML
    turns those into a number whose decimal text differs from what was written, so which
    one was meant is a guess. Booleans (``yes``, ``on``) and null are never numbers here.
    """
    if node.style is not None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return _DECIMAL.fullmatch(node.value) is not None


def _key_text(key: Any) -> str:
    """A key as it reads in a message: quoted when it is blank or has spaces or dots."""
    text = str(key)
    if not text or any(c.isspace() or c == "." or not c.isprintable() for c in text):
        return _shorten(json.dumps(text, ensure_ascii=False), 40)
    return _shorten(text, 40)


def _format_path(path: _PathKey) -> str:
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            word = _key_text(part)
            out += f".{word}" if out else word
    return out or "(top level)"


def _syntax_problem(exc: yaml.YAMLError, text: str) -> _Problem:
    """A YAML syntax error as a problem line: where, what, and the line itself."""
    lines = text.splitlines()
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line, column = mark.line + 1, mark.column + 1
    elif isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
    else:  # pragma: no cover - every pyyaml error has a mark or a position
        line, column = 1, 1
    what = " ".join(
        str(p) for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p
    )
    if isinstance(exc, yaml.reader.ReaderError):
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        what = f"character {char!r} (U+{ord(char):04X}) is not allowed in YAML"
    what = what or str(exc)
    hint = f"fix the YAML near column {column}"
    if "\t" in what or "'\\t'" in what:
        hint = "YAML indents with spaces, not tabs"
    elif "expected a single document" in what:
        hint = "one drill per file: remove the extra '---' document"
    got = _shorten(repr(lines[line - 1])) if 0 < line <= len(lines) else "the end of the file"
    return _Problem(line, "(YAML syntax)", _shorten(what, 160), got, "well-formed YAML", hint)


def _compose(text: str) -> Node | None:
    loader = _Loader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


# ----------------------------------------------------------------- error wording

_TYPE_PROBLEMS = {
    "int_type": "must be a whole number",
    "float_type": "must be a number",
    "string_type": "must be text",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a mapping of keys",
    "model_type": "must be a mapping of keys",
    "model_attributes_type": "must be a mapping of keys",
    "literal_error": "is not one of the allowed values",
    "greater_than": "is too small",
    "greater_than_equal": "is too small",
    "less_than": "is too large",
    "less_than_equal": "is too large",
    "finite_number": "must be a finite number",
    "string_too_short": "must not be empty",
    "string_too_long": "is too long",
    "string_pattern_mismatch": "contains characters that are not allowed",
    "too_short": "must not be empty",
    "missing": "required key is missing",
    "extra_forbidden": "unknown key",
    "invalid_key": "a key must be a word (text)",
    "path_type": "must be a path (text)",
    "is_instance_of": "has the wrong type",
}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        found.extend(_models_in(arg))
    return found


def _field_named(model: type[BaseModel], key: Any) -> tuple[str, FieldInfo] | None:
    for name, info in model.model_fields.items():
        if key in (info.alias, name):
            return name, info
    return None


def _locate(loc: tuple[Any, ...]) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model holding the last key of ``loc`` and that key's field (None if unknown)."""
    model: type[BaseModel] | None = DrillConfig
    parent: type[BaseModel] | None = None
    field: FieldInfo | None = None
    index = 0
    while index < len(loc) and model is not None:
        parent = model
        found = _field_named(model, loc[index])
        if found is None:
            return parent, None
        field = found[1]
        inner = _models_in(field.annotation)
        if len(inner) > 1 and index + 1 < len(loc) and loc[index + 1] in _WORKLOAD_BY_TAG:
            model = _WORKLOAD_BY_TAG[loc[index + 1]]
            index += 2
            continue
        model = inner[0] if len(inner) == 1 else None
        index += 1
    return parent, field


def _display_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drop the tag pydantic inserts: ('workload', 'local', 'command') → ('workload', 'command')."""
    if len(loc) > 1 and loc[0] == "workload" and loc[1] in _WORKLOAD_BY_TAG:
        return (loc[0], *loc[2:])
    return loc


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return [
        info.alias or name for name, info in model.model_fields.items() if name != "source_path"
    ]


def _did_you_mean(key: str, candidates: list[str]) -> str:
    folded = {c.lower().replace("_", "").replace("-", ""): c for c in candidates}
    probe = key.lower().replace("_", "").replace("-", "")
    if probe in folded:
        return f"did you mean {folded[probe]}?"
    close = difflib.get_close_matches(probe, list(folded), n=1, cutoff=0.7)
    if close:
        return f"did you mean {folded[close[0]]}?"
    return ""


def _elsewhere(key: str) -> str:
    """Name the backends where an unknown workload key would be valid."""
    owners = [tag for tag, model in _WORKLOAD_BY_TAG.items() if key in _allowed_keys(model)]
    return f"{key} belongs to orchestrator: {' / '.join(owners)}" if owners else ""


def _is_env_value(path: tuple[Any, ...]) -> bool:
    return len(path) == 3 and path[0] == "workload" and path[1] == "env"


def _translate(error: Mapping[str, Any], where: dict[_PathKey, _Where]) -> _Problem:
    """One pydantic error, rewritten with its line, key path, value, what is allowed and a fix."""
    kind = str(error["type"])
    loc = tuple(error["loc"])
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    if loc and loc[-1] == "[key]":
        loc = loc[:-1]
        kind = "invalid_key"
    if kind == "recoverygate":
        loc = (*loc, *ctx.get("key", ()))
    parent, field = _locate(loc)
    path = _display_loc(loc)
    meta: Mapping[str, Any] = (
        field.json_schema_extra
        if field is not None and isinstance(field.json_schema_extra, dict)
        else {}
    )
    allowed = str(meta.get("allowed", ""))
    example = str(meta.get("example", ""))
    hint = f"e.g. {example}" if example else ""
    problem = _TYPE_PROBLEMS.get(kind, str(error.get("msg", "is not valid")))

    spot = where.get(path)
    got = spot.text if spot is not None else _describe(error.get("input"))
    quoted = spot is not None and spot.text.startswith(("'", '"'))

    if kind in ("union_tag_invalid", "union_tag_not_found"):
        path = (*path, "orchestrator")
        spot = where.get(path)
        allowed = ", ".join(ORCHESTRATORS)
        if kind == "union_tag_not_found":
            problem, got = "required key is missing", "nothing"
            hint = "say which backend runs the job, e.g. orchestrator: fake"
        else:
            problem = "is not a known orchestrator"
            got = spot.text if spot is not None else _describe(ctx.get("tag"))
            hint = (
                _did_you_mean(str(ctx.get("tag", "")), list(ORCHESTRATORS))
                or "e.g. orchestrator: kubernetes"
            )
    elif kind == "missing":
        got = "nothing"
        hint = f"add {example}" if example else ""
    elif kind == "extra_forbidden":
        key = str(loc[-1])
        candidates = _allowed_keys(parent) if parent is not None else []
        allowed = ", ".join(candidates)
        got = _key_text(loc[-1])
        hint = _did_you_mean(key, candidates)
        if not hint and len(path) == 2 and path[0] == "workload":
            hint = _elsewhere(key)
        hint = hint or "remove it"
    elif kind == "invalid_key":
        got = _describe(loc[-1] if loc else error.get("input"))
        hint = 'quote the key: "…": value'
    elif kind == "recoverygate":
        problem = str(ctx.get("problem", problem))
        allowed = str(ctx.get("allowed") or allowed)
        hint = str(ctx.get("hint") or hint)
        if "got" in ctx:
            got = str(ctx["got"])
    elif kind in ("literal_error",):
        allowed = allowed or str(ctx.get("expected", ""))
    elif kind == "string_type" and spot is not None and not quoted:
        key = path[-1] if path else "key"
        if _is_text_slot(path):
            problem = _ambiguous_text(error.get("input"), spot.text, hidden=_is_env_value(path))
        if _is_env_value(path):
            hint = 'quote it: NAME: "value"'
        elif isinstance(key, int):
            hint = f'quote it: - "{spot.text}"'
        else:
            hint = f'quote it: {key}: "{spot.text}"'
    elif kind in ("int_type", "float_type") and isinstance(error.get("input"), bool):
        hint = (
            f"write a number, not true/false; {hint}" if hint else "write a number, not true/false"
        )
    elif kind in ("int_type", "float_type", "bool_type") and quoted:
        hint = f"remove the quotes; {hint}" if hint else "remove the quotes"

    names_the_value = kind in ("extra_forbidden", "invalid_key") or "got" in ctx
    if _is_env_value(path) and not names_the_value:
        got = "a value (hidden: env values may be secrets)"
    line = _line_for(path, where)
    return _Problem(line, _format_path(path), problem, got, allowed, hint)


def _ambiguous_text(value: Any, written: str, *, hidden: bool) -> str:
    """Why a bare YAML value cannot stand for argv or env text: what YAML made of it."""
    if isinstance(value, bool):
        made = "true/false"
    elif isinstance(value, (int, float)):
        made = "a number" if hidden else f"the number {value!r}"
    elif value is None:
        made = "null (nothing)"
    else:
        return "must be text"
    subject = "it" if hidden else written
    return f"must be text, and YAML reads {subject} as {made}, so what was meant is unclear"


def _line_for(path: tuple[Any, ...], where: dict[_PathKey, _Where]) -> int:
    """The line of ``path``, or of its nearest parent that exists (where a missing key goes)."""
    for end in range(len(path), 0, -1):
        spot = where.get(path[:end])
        if spot is not None:
            return spot.line
    root = where.get(())
    return root.line if root is not None else 1


# ------------------------------------------------------------------- public API


def parse_config(
    text: str | bytes, source: Path, overrides: Mapping[str, Any] | None = None
) -> DrillConfig:
    """Validate the YAML ``text`` of the config file at ``source``.

    ``overrides`` maps dotted YAML key paths (``expectations.maxRecoveryTime``) to values
    written as in YAML (``"30s"``, ``"step-100"``); they replace or add keys before
    validation (the pytest marker's ``overrides=``).

    ``source`` names the file in messages and anchors relative paths (its folder) and
    the default name (its stem); it need not exist. Raises :class:`ConfigError` listing
    every problem found, one per line.
    """
    source = Path(source)
    file = str(source)
    if len(text) > MAX_CONFIG_BYTES:
        unit = "bytes" if isinstance(text, bytes) else "characters"
        raise ConfigError(
            _Problem(
                1,
                "(file)",
                "is too large for a drill config",
                f"more than {MAX_CONFIG_BYTES} {unit}",
                f"at most {MAX_CONFIG_BYTES} {unit} (a drill config is a few hundred)",
                "is this the right file?",
            ).render(file)
        )
    if isinstance(text, bytes):
        raw = text
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise ConfigError(
                _Problem(
                    line,
                    "(file)",
                    "is not UTF-8 text",
                    f"byte 0x{raw[exc.start]:02x} at offset {exc.start}",
                    "a UTF-8 encoded YAML file",
                    "save the file as UTF-8",
                ).render(file)
            ) from None
    text = text.removeprefix("\ufeff")

    try:
        node = _compose(text)
    except _Refused as exc:
        raise ConfigError(
            _Problem(
                exc.line,
                "(YAML)",
                exc.problem,
                _source_line(text, exc.line),
                "plain YAML",
                exc.hint,
            ).render(file)
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(_syntax_problem(exc, text).render(file)) from None
    except RecursionError:  # pragma: no cover - depth is bounded while composing
        raise ConfigError(
            _Problem(1, "(YAML)", "is nested too deeply", "", "plain YAML", "").render(file)
        ) from None

    if node is None:
        raise ConfigError(
            _Problem(
                1,
                "(file)",
                "is empty",
                "no YAML content",
                "a mapping with workload, injectFailure and expectations",
                "see docs/config.md for a complete example",
            ).render(file)
        )

    reader = _Reader(_Loader(""))
    data = reader.read(node, ())
    if data is _INVALID:  # the whole document was refused (e.g. a tagged root)
        raise ConfigError("\n".join(p.render(file) for p in sorted(reader.problems)))
    reader.where[()] = _Where(node.start_mark.line + 1, _describe(data))
    if not isinstance(data, dict):
        raise ConfigError(
            "\n".join(
                p.render(file)
                for p in sorted(
                    [
                        *reader.problems,
                        _Problem(
                            node.start_mark.line + 1,
                            "(top level)",
                            "must be a mapping of keys",
                            _describe(data),
                            "a mapping with workload, injectFailure and expectations",
                            "start the file with workload:",
                        ),
                    ]
                )
            )
        )

    for dotted, value in (overrides or {}).items():
        node_data: Any = data
        *parents, last = dotted.split(".")
        for key in parents:
            child = node_data.get(key)
            if not isinstance(child, dict):
                child = {}
                node_data[key] = child
            node_data = child
        node_data[last] = value
        reader.where[tuple(dotted.split("."))] = _Where(0, _describe(value))

    for reserved in _ROOT_ONLY_IN_PYTHON:
        if reserved in data:
            where = reader.where[(reserved,)]
            reader.problems.append(
                _Problem(
                    where.line,
                    reserved,
                    "unknown key",
                    reserved,
                    ", ".join(_allowed_keys(DrillConfig)),
                    "the loader sets it; remove it",
                )
            )
            del data[reserved]

    problems = list(reader.problems)
    context = {"yaml": True, "source": source.absolute(), "base_dir": source.absolute().parent}
    config: DrillConfig | None = None
    try:
        config = DrillConfig.model_validate(data, context=context, by_alias=True, by_name=False)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            if error.get("input") is not _INVALID:
                problems.append(_translate(error, reader.where))
        problems.extend(_cross_checks(data, reader.where, problems))
    if problems or config is None:
        unique = sorted(set(problems))
        if not unique:  # pragma: no cover - a failed validation always yields a problem
            unique = [_Problem(1, "(top level)", "is not a valid drill config", "", "", "")]
        raise ConfigError("\n".join(p.render(file) for p in unique))
    return config


def _cross_checks(
    data: dict[Any, Any], where: dict[_PathKey, _Where], found: list[_Problem]
) -> list[_Problem]:
    """Checks across sections that pydantic skips when a section itself is invalid.

    The same checks run inside the models when everything else is valid; here they run on
    the raw values so that one run of ``validate`` lists every problem.
    """
    extra: list[_Problem] = []
    workload, failure = data.get("workload"), data.get("injectFailure")
    if not (isinstance(workload, dict) and isinstance(failure, dict)):
        return extra
    orchestrator, kind = workload.get("orchestrator"), failure.get("type")
    already = any(p.path == "injectFailure.type" for p in found)
    if (
        not already
        and isinstance(orchestrator, str)
        and isinstance(kind, str)
        and orchestrator in _WORKLOAD_BY_TAG
        and orchestrator != "slurm"
        and kind in SLURM_ONLY_FAILURES
    ):
        extra.append(
            _Problem(
                _line_for(("injectFailure", "type"), where),
                "injectFailure.type",
                f"{kind} needs orchestrator: slurm (this drill uses {orchestrator})",
                str(kind),
                "KillWorker with this orchestrator",
                "use type: KillWorker",
            )
        )
    return extra


def _source_line(text: str, line: int) -> str:
    lines = text.splitlines()
    return _shorten(repr(lines[line - 1])) if 0 < line <= len(lines) else "the end of the file"


def load_config(
    path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None
) -> DrillConfig:
    """Read and validate the drill config file at ``path``; raise :class:`ConfigError`.

    ``overrides``: see :func:`parse_config`."""
    source = Path(path)
    file = str(source)
    try:
        if source.is_dir():
            found = sorted(p.name for p in source.iterdir() if p.suffix in (".yaml", ".yml"))[:5]
            hint = f"e.g. {source / found[0]}" if found else "pass the YAML file itself"
            raise ConfigError(
                _Problem(
                    0, "(file)", "is a folder, not a file", file, "a recovery-test.yaml file", hint
                )
                .render(file)
                .replace(f"{file} (override):", f"{file}:", 1)
            )
        with source.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)  # more is refused unread
    except FileNotFoundError:
        raise ConfigError(
            f"{file}: (file): does not exist — got {source.absolute()}; allowed: a path to a "
            f"YAML file (check the path; it is relative to {Path.cwd()})"
        ) from None
    except PermissionError:
        raise ConfigError(
            f"{file}: (file): cannot be read (permission denied) — got {source.absolute()}; "
            "allowed: a readable file (check its permissions)"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"{file}: (file): cannot be read ({exc.strerror or exc}) — got {source.absolute()}; "
            "allowed: a readable YAML file"
        ) from None
    return parse_config(data, source, overrides)


def dump_effective(config: DrillConfig) -> dict[str, Any]:
    """The normalized config in YAML key names, defaults filled in, for headers and ``validate``.

    Durations come back as ``5m``, step numbers as ``step-N``, paths as absolute strings.
    Environment values of the job are never included (they may be secrets): each shows
    as ``<redacted>``.
    """
    dumped = config.model_dump(mode="json", by_alias=True, exclude={"source_path"})
    _rewrite(dumped, type(config))
    workload = dumped.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("env"), dict):
        workload["env"] = dict.fromkeys(workload["env"], "<redacted>")
    return dumped


def _format_step(value: Any) -> Any:
    return (
        format_step_ref(value) if isinstance(value, int) and not isinstance(value, bool) else value
    )


def _format_seconds(value: Any) -> Any:
    return (
        format_duration(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else value
    )


_DURATION_FIELDS = frozenset(
    {
        "restart_delay",
        "startup_delay",
        "poll_interval",
        "max_recovery_time",
        "discovery",
        "checkpoint",
        "recovery",
        "recovery_grace",
    }
)
_STEP_FIELDS = frozenset({"after_checkpoint", "resume_from_checkpoint"})


def _rewrite(dumped: dict[str, Any], model: type[BaseModel]) -> None:
    """Format durations and step numbers of a dumped model back into the YAML language."""
    for name, info in model.model_fields.items():
        key = info.alias or name
        if key not in dumped:
            continue
        value = dumped[key]
        if name in _DURATION_FIELDS:
            dumped[key] = _format_seconds(value)
        elif name in _STEP_FIELDS:
            dumped[key] = _format_step(value)
        elif isinstance(value, dict):
            inner = _models_in(info.annotation)
            if len(inner) > 1:
                inner = (
                    [_WORKLOAD_BY_TAG[value["orchestrator"]]]
                    if value.get("orchestrator") in _WORKLOAD_BY_TAG
                    else []
                )
            if inner:
                _rewrite(value, inner[0])


def schema_keys() -> list[tuple[str, str, str]]:
    """Every key of the schema as (section, YAML key, what is allowed), in schema order.

    The reference in ``docs/config.md`` is checked against this list, so a key added to a
    model without documentation fails a test.
    """
    sections: list[tuple[str, type[BaseModel]]] = [
        ("", DrillConfig),
        *((f"workload ({tag})", model) for tag, model in _WORKLOAD_BY_TAG.items()),
        ("workload.fake", FakeJobSpec),
        ("injectFailure", InjectFailure),
        ("expectations", Expectations),
        ("safety", Safety),
        ("timeouts", Timeouts),
    ]
    keys: list[tuple[str, str, str]] = []
    for section, model in sections:
        for name, info in model.model_fields.items():
            if name == "source_path":
                continue
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            keys.append((section, info.alias or name, str(extra.get("allowed", ""))))
    return keys
