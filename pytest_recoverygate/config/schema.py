"""The drill config's schema: the sections every drill has, and the kit backends build
their own ``workload`` section from.

The file's sections (``injectFailure``, ``expectations``, ``safety``, ``timeouts``) are
models here; the ``workload`` section is the model of the backend it names, found in the
backend registry (:mod:`pytest_recoverygate.registry`), so this module names no
backend: a third-party backend's keys are validated exactly like a built-in one's.

Models are strict and frozen, camelCase in YAML and snake_case in Python
(:class:`Section`). A backend's workload model subclasses :class:`WorkloadBase` and uses
the value helpers below -- :func:`duration`, :func:`step_ref`, :func:`file_path`,
:func:`command_arguments`, :func:`id_number` -- and :func:`meta` on every field (what is
allowed, an example: the error messages and docs/config.md are made from them) and
:func:`refuse` for its own checks, so its errors read like every other:
``FILE:LINE: workload.key: problem — got VALUE; allowed: …``. Reading the YAML (with the
lines) and rewriting pydantic's errors is :mod:`pytest_recoverygate.config.loading`.

In Python, models can be built by field name; there durations may be plain seconds and
step references plain ints, while YAML insists on ``90s`` and ``step-1000``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PlainValidator,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticKnownError

from pytest_recoverygate.config.fields import (
    MAX_DURATION,
    MAX_PID,
    MAX_RANK,
    MAX_STEP,
    IdNumber,
    _duration,
    _from_yaml,
    command_arguments,
    damage_value,
    duration,
    exactly_one,
    file_path,
    id_number,
    id_option,
    kill_after_value,
    meta,
    node_count_field,
    option,
    path_in_scope,
    recovery_phase_value,
    reentry_keys,
    refuse,
    step_ref,
    sticky_keys,
    sticky_scope_value,
    sticky_spec_of,
    storage_during,
    storage_keys,
    storage_mode,
    storage_spec_of,
    sustain_of,
    sustain_value,
)
from pytest_recoverygate.config.sections import (
    Evidence,
    Expectations,
    Projection,
    ReplayTolerance,
    Safety,
    Section,
    Timeouts,
)
from pytest_recoverygate.config.sections import or_list as _or_list
from pytest_recoverygate.durations import (
    DurationSyntaxError,
    format_duration,
    parse_duration,
)
from pytest_recoverygate.engine.advice import PATTERNS
from pytest_recoverygate.engine.model import NODE_FAULTS
from pytest_recoverygate.engine.spec import FAULTS, MAX_KILLS, Delay, DrillSpec, ReplaySpec
from pytest_recoverygate.errors import UsageError
from pytest_recoverygate.registry import all_backends, backend_names, get_backend
from pytest_recoverygate.registry.seams import Backend
from pytest_recoverygate.storage.wire import MODES

__all__ = [
    "MAX_DURATION",
    "MAX_PID",
    "MAX_RANK",
    "MAX_STEP",
    "DrillConfig",
    "Evidence",
    "Expectations",
    "IdNumber",
    "InjectFailure",
    "Projection",
    "Safety",
    "Section",
    "Timeouts",
    "WorkloadBase",
    "command_arguments",
    "delay_of",
    "duration",
    "fault_refusal",
    "fault_types",
    "file_path",
    "id_number",
    "id_option",
    "meta",
    "node_count_field",
    "refuse",
    "replay_of",
    "spec_from_config",
    "step_ref",
    "storage_spec_of",
    "sustain_of",
    "sustain_value",
]


class WorkloadBase(Section):
    """What every backend's ``workload`` section has; a backend's model subclasses it and
    declares ``orchestrator: Literal["<its name>"]`` and its own keys."""

    reporting_rank: int = option(0, "a whole number >= 0", "reportingRank: 0", ge=0, le=MAX_RANK)
    orchestrator: str = option(..., "the backend's name", "orchestrator: NAME")

    def check_failure(self, failure: InjectFailure) -> None:
        """Refuse (with :func:`refuse`, ``key`` naming the injectFailure key) a failure
        this job cannot take, e.g. a target rank it does not have. Nothing by default."""

    def launched_with(self) -> tuple[tuple[str, ...], Mapping[str, str]]:
        """The command and environment the drill launches the job with, when it launches
        it (the diagnoses read them); nothing by default."""
        return (), {}

    def node_count(self) -> int | None:
        """How many nodes the job runs on, when the config says (``workload.nodes`` of the
        backends that launch one agent per node); None: known only at discovery."""
        return None

    def reads_job_log(self) -> bool:
        """Whether the backend can match the job's log lines itself (``evidence.podLogs``;
        its orchestrator then has ``match_log_evidence(spec)``). No by default."""
        return False

    def storage_scope(self) -> tuple[Path, ...] | None:
        """The folders the job can be shown to use (its working folder, the paths its
        command names): a StorageFault's ``path`` must lie in one of them. None: the
        backend cannot say before discovery (it checks then)."""
        return None


# ------------------------------------------------------------------ fault types


def fault_types() -> tuple[str, ...]:
    """The fault types a drill may name: those the engine knows that at least one
    installed backend carries out (each backend declares its own), in the engine's order."""
    offered = {kind for backend in all_backends().values() for kind in backend.faults}
    return tuple(kind for kind in FAULTS if kind in offered)


_NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five"}


def _fault_types_allowed() -> str:
    """``KillWorker, KillStep or Requeue (the last two with slurm only)``, from the registry."""
    backends = all_backends()
    kinds = fault_types()
    groups: dict[tuple[str, ...], list[str]] = {}
    for kind in kinds:
        offered_by = tuple(name for name, backend in backends.items() if kind in backend.faults)
        if len(offered_by) < len(backends):
            groups.setdefault(offered_by, []).append(kind)
    notes = []
    for offered_by, those in groups.items():
        if len(groups) == 1 and tuple(those) == kinds[-len(those) :]:
            count = len(those)
            what = "the last one" if count == 1 else f"the last {_NUMBERS.get(count, count)}"
        else:
            what = " and ".join(those)
        notes.append(f"{what} with {' / '.join(offered_by)} only")
    return f"{_or_list(kinds)} ({'; '.join(notes)})" if notes else _or_list(kinds)


def _fault_type(value: Any) -> Any:
    if isinstance(value, str) and value in fault_types():
        return value
    raise refuse("is not one of the allowed values", _fault_types_allowed(), choices=fault_types())


DELAY_ALLOWED = (
    "a duration (like 0s or 2s), a percentage of the measured checkpoint interval (like "
    '"50%"), beforeNextCheckpoint, or spread (with count: N)'
)


def _delay(value: Any, info: ValidationInfo) -> Any:
    """``delay``: kept in its YAML form (``2s``, ``50%``, ``beforeNextCheckpoint``, ``spread``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise refuse(
            "must be a duration, a percentage, beforeNextCheckpoint or spread", DELAY_ALLOWED
        )
    if isinstance(value, (int, float)):
        if _from_yaml(info):
            raise refuse("a duration needs a unit", DELAY_ALLOWED, f"write {value}s")
        return format_duration(float(value))
    text = value.strip()
    if text in ("beforeNextCheckpoint", "spread"):
        return text
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise refuse("is not a percentage", DELAY_ALLOWED) from None
        if not 0 <= percent < 100 or not math.isfinite(percent):
            raise refuse("must be from 0% to below 100% of the interval", DELAY_ALLOWED)
        return f"{percent:g}%"
    try:
        seconds = parse_duration(text)
    except DurationSyntaxError as exc:
        raise refuse(
            f"is not a valid delay ({exc})",
            DELAY_ALLOWED,
            choices=("beforeNextCheckpoint", "spread"),
        ) from None
    if seconds > MAX_DURATION:
        raise refuse("is out of range", DELAY_ALLOWED)
    return format_duration(seconds)


def _count(value: Any) -> Any:
    allowed = "a whole number >= 1, or untilBudgetExhausted"
    if isinstance(value, str) and value.strip() == "untilBudgetExhausted":
        return "untilBudgetExhausted"
    if isinstance(value, bool) or not isinstance(value, int):
        raise refuse(
            "must be a number of kills or untilBudgetExhausted",
            allowed,
            choices=("untilBudgetExhausted",),
        )
    if not 1 <= value <= MAX_KILLS:
        raise refuse(f"must be from 1 to {MAX_KILLS}", allowed)
    return value


# ------------------------------------------------------------------ the sections


def _optional_step_ref(literal: str) -> BeforeValidator:
    """:func:`step_ref`, with ``null`` meaning "not set" (a key that has an alternative)."""
    check = step_ref(literal).func

    def optional(value: Any, info: ValidationInfo) -> Any:
        return None if value is None else check(value, info)  # type: ignore[call-arg]

    optional.kind = "step"  # type: ignore[attr-defined]  # dump_effective writes step-N back
    return BeforeValidator(optional)


class InjectFailure(Section):
    """What to break, and when (the fault catalogue: README, "Faults")."""

    type: Annotated[str, BeforeValidator(_fault_type)] = option(
        "KillWorker", _fault_types_allowed, "type: KillWorker"
    )
    after_checkpoint: Annotated[int | Literal["next"] | None, _optional_step_ref("next")] = option(
        None, "step-N or next (required unless afterStep is set)", "afterCheckpoint: step-1000"
    )
    after_step: int | None = option(
        None,
        "a whole number >= 1: kill once the job reported this step (no checkpoint needed)",
        "afterStep: 50",
        ge=1,
        le=MAX_STEP,
    )
    target_replica: int | None = option(
        None,
        "a whole number >= 0: the replica group to hit (the reporter's replica, "
        "torchft's REPLICA_GROUP_ID); recovery: live",
        "targetReplica: 1",
        ge=0,
        le=MAX_RANK,
    )
    target_rank: int | None = option(
        None,
        "a whole number >= 0 (default 1; KillDuringCheckpoint: the rank that reports the save)",
        "targetRank: 1",
        ge=0,
        le=MAX_RANK,
    )
    delay: Annotated[str | None, BeforeValidator(_delay)] = option(
        None,
        DELAY_ALLOWED + " (default 0s; KillDuringCheckpoint: half the measured save time)",
        'delay: "50%"',
    )
    grace_period: Annotated[float | None, _duration(zero_ok=True, optional=True)] = option(
        None,
        "a duration (Preempt only; default 30s): SIGTERM, then SIGKILL after it",
        "gracePeriod: 30s",
    )
    count: Annotated[int | Literal["untilBudgetExhausted"], BeforeValidator(_count)] = option(
        1, "a whole number >= 1, or untilBudgetExhausted", "count: untilBudgetExhausted"
    )
    target_node: int | None = option(
        None,
        "a whole number >= 0 (KillNode, PartitionNode, DrainNode, StickyFault scope node; "
        "default: the node that hosts targetRank)",
        "targetNode: 1",
        ge=0,
        le=MAX_RANK,
    )
    replace: bool | None = option(
        None,
        "true or false (KillNode; default true): a replacement node starts, or the "
        "node stays dead (with an elastic job: the scale-down drill)",
        "replace: true",
    )
    duration: Annotated[float | None, _duration(zero_ok=False, optional=True)] = option(
        None,
        "a duration above 0 (PartitionNode; default: until the job noticed, or "
        "maxDetectionTime passed): how long the link stays cut",
        "duration: 20s",
    )
    drain_node: bool | None = option(
        None,
        "true or false (KillNode on slurm): also set the node DRAIN (RESUMEd at cleanup)",
        "drainNode: true",
    )
    cordon: bool | None = option(
        None,
        "true or false (KillNode, DrainNode on kubernetes): cordon the node first "
        "(uncordoned at cleanup)",
        "cordon: true",
    )
    # issue 40: StorageFault (docs/faults.md)
    mode: Annotated[str | None, BeforeValidator(storage_mode)] = option(
        None,
        f"{_or_list(list(MODES))} (StorageFault, required): what the checkpoint storage "
        "does; kill or hang (StickyFault scope node; default kill): what the bad node does "
        "to each job process that starts on it",
        "mode: enospc",
    )
    during: Annotated[str | None, BeforeValidator(storage_during)] = option(
        None,
        "save or load (StorageFault; default save): the first save after the trigger, or "
        "the replacement's load after a kill",
        "during: save",
    )
    path: Annotated[Path | None, file_path()] = option(  # checked whole by storage_keys
        None,
        "the job's checkpoint folder (StorageFault, required): an existing folder, relative "
        "to the config file's folder, inside what the job uses (its working folder, a path "
        "its command names)",
        "path: ./checkpoints",
    )
    latency: Annotated[float | None, _duration(zero_ok=False, optional=True)] = option(
        None,
        "a duration above 0 (StorageFault mode latency, required there): added to every "
        "write, fsync and rename of a save, or every read of a load",
        "latency: 2s",
    )
    # issue 43: KillDuringRecovery (docs/faults.md)
    phase: Annotated[str | None, BeforeValidator(recovery_phase_value)] = option(
        None,
        "startup, rendezvous, checkpointLoad or firstInterval (KillDuringRecovery, "
        "required): the phase of the first kill's recovery the second kill lands in",
        "phase: checkpointLoad",
    )
    second_target: int | None = option(
        None,
        "a whole number >= 0 (KillDuringRecovery; default the first kill's rank): the rank "
        "whose replacement the second kill hits",
        "secondTarget: 1",
        ge=0,
        le=MAX_RANK,
    )
    # issue 43: StickyFault (docs/faults.md)
    scope: Annotated[str | None, BeforeValidator(sticky_scope_value)] = option(
        None,
        "step, checkpoint or node (StickyFault, required): the failure that comes back",
        "scope: step",
    )
    after: Annotated[float | None, _duration(zero_ok=True, optional=True)] = option(
        None,
        "a duration (StickyFault scope node; default 0s): how long each job process that "
        "starts on the bad node runs before it is killed (mode kill) or stopped (mode hang)",
        "after: 5s",
    )
    at_step: int | None = option(
        None,
        "a whole number >= 1 (StickyFault scope step, required): every incarnation of the "
        "target rank dies when it reports this step",
        "atStep: 50",
        ge=1,
        le=MAX_STEP,
    )
    damage: Annotated[str | None, BeforeValidator(damage_value)] = option(
        None,
        "truncate, zero or flip (StickyFault scope checkpoint; default truncate): how the "
        "newest checkpoint's files are damaged at rest",
        "damage: flip",
    )
    kill_after: Annotated[str | None, BeforeValidator(kill_after_value)] = option(
        None,
        "none or save (StorageFault with during: save; default none): save SIGKILLs the "
        "target once the faulted save ended (after the fault is lifted), to prove what the "
        "job resumes from",
        "killAfter: save",
    )

    @property
    def on_node(self) -> bool:
        """A node fault: ``targetNode`` (or the target rank's node) is hit, all of it (a
        StickyFault with ``scope: node``: the node stays bad)."""
        return self.type in NODE_FAULTS or (self.type == "StickyFault" and self.scope == "node")

    @property
    def effective_target_rank(self) -> int | None:
        """The rank to hit; None: the rank that reports the save (KillDuringCheckpoint)."""
        if self.target_rank is not None:
            return self.target_rank
        return None if self.type == "KillDuringCheckpoint" else 1

    def rank_for(self, reporting_rank: int | None) -> int:
        """The rank to target first: the reporting rank stands for the saving one."""
        rank = self.effective_target_rank
        return rank if rank is not None else (reporting_rank or 0)

    @model_validator(mode="after")
    def _keys_fit_the_fault(self) -> InjectFailure:
        exactly_one(
            ("afterCheckpoint", self.after_checkpoint),
            ("afterStep", self.after_step),
            missing=(
                "afterCheckpoint (step-N or next), or afterStep (a step number)",
                "add afterCheckpoint: step-1000 (or afterStep: 50 to trigger on progress)",
            ),
            both=("one trigger: afterCheckpoint or afterStep", "remove one of them"),
        )
        if self.after_step is not None and self.type == "KillDuringCheckpoint":
            raise refuse(
                "does not apply to KillDuringCheckpoint (it kills inside a save)",
                "afterCheckpoint with KillDuringCheckpoint",
                "use afterCheckpoint, or another type",
                key=("afterStep",),
                got=str(self.after_step),
            )
        if self.grace_period is not None and self.type != "Preempt":
            raise refuse(
                f"applies to type: Preempt only (this drill injects {self.type})",
                "a duration, with type: Preempt",
                "remove gracePeriod, or use type: Preempt",
                key=("gracePeriod",),
                got=format_duration(self.grace_period),
            )
        only = (
            ("targetNode", self.target_node is not None, (*NODE_FAULTS, "StickyFault")),
            ("replace", self.replace is not None, ("KillNode",)),
            ("duration", self.duration is not None, ("PartitionNode", "StorageFault")),
            ("mode", self.mode is not None, ("StorageFault", "StickyFault")),
            ("after", self.after is not None, ("StickyFault",)),
            ("during", self.during is not None, ("StorageFault",)),
            ("path", self.path is not None, ("StorageFault", "StickyFault")),
            ("latency", self.latency is not None, ("StorageFault",)),
            ("killAfter", self.kill_after is not None, ("StorageFault",)),
            ("phase", self.phase is not None, ("KillDuringRecovery",)),
            ("scope", self.scope is not None, ("StickyFault",)),
            ("atStep", self.at_step is not None, ("StickyFault",)),
            ("damage", self.damage is not None, ("StickyFault",)),
            ("secondTarget", self.second_target is not None, ("KillDuringRecovery",)),
            ("drainNode", bool(self.drain_node), ("KillNode",)),
            ("cordon", bool(self.cordon), ("KillNode", "DrainNode")),
        )
        for key, given, faults in only:
            if given and self.type not in faults:
                kinds = _or_list(faults)
                raise refuse(
                    f"applies to type: {kinds} only (this drill injects {self.type})",
                    f"{key}, with type: {kinds}",
                    f"remove {key}, or use type: {faults[0]}",
                    key=(key,),
                )
        if self.type == "StorageFault":
            storage_keys(self)
        if self.type == "KillDuringRecovery":
            reentry_keys(self)
        if self.type == "StickyFault":
            sticky_keys(self)
        if self.delay == "spread" and (self.count in {1, "untilBudgetExhausted"}):
            raise refuse(
                "spreads the kills of count: N over the checkpoint interval, so it needs "
                "count: 2 or more",
                "spread with count: N (N >= 2)",
                "set count: 4, or use a duration or a percentage",
                key=("delay",),
                got="spread",
            )
        return self


def _workload_allowed() -> str:
    return f"a mapping with orchestrator: {' | '.join(backend_names())} and that backend's keys"


def _by_backend(value: Any, info: ValidationInfo) -> Any:
    """The ``workload`` section, validated by the model of the backend it names."""
    if isinstance(value, WorkloadBase):  # built in Python
        return value
    if not isinstance(value, dict):
        raise PydanticKnownError("model_type", {"class_name": "WorkloadBase"})
    names = backend_names()
    if "orchestrator" not in value:
        raise PydanticKnownError("union_tag_not_found", {"discriminator": "'orchestrator'"})
    tag = value["orchestrator"]
    if not isinstance(tag, str) or tag not in names:
        expected = ", ".join(repr(name) for name in names)
        raise PydanticKnownError(
            "union_tag_invalid",
            {"discriminator": "'orchestrator'", "tag": str(tag), "expected_tags": expected},
        )
    try:
        backend: Backend[Any] = get_backend(tag)
    except UsageError as exc:
        raise refuse(
            f"cannot be used: {exc}",
            ", ".join(names),
            "fix that backend's installation, or uninstall it",
            key=("orchestrator",),
            got=tag,
        ) from None
    yaml = _from_yaml(info)  # YAML speaks camelCase only; Python may use field names
    return backend.workload.model_validate(
        value,
        context=info.context,
        by_alias=True if yaml else None,
        by_name=False if yaml else None,
    )


class DrillConfig(Section):
    """One drill: the workload, the failure to inject, the expectations and the guards.

    ``workload`` is an instance of the model of the backend its ``orchestrator`` names
    (a :class:`WorkloadBase` subclass from the registry).
    """

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$")] = (
        option("drill", "a short name (default: the file's name)", "name: llama-drill")
    )
    workload: SerializeAsAny[Annotated[WorkloadBase, PlainValidator(_by_backend)]] = option(
        ..., _workload_allowed, "workload: {orchestrator: fake}"
    )
    inject_failure: InjectFailure = option(
        ...,
        "a mapping with afterCheckpoint (and type, targetRank)",
        "injectFailure: {afterCheckpoint: next}",
    )
    expectations: Expectations = option(
        ...,
        "a mapping with maxRecoveryTime (and resumeFromCheckpoint, maxLostSteps)",
        "expectations: {maxRecoveryTime: 5m}",
    )
    safety: Safety = option(
        ...,
        "a mapping with requireConfirm, dryRun",
        "safety: {dryRun: true}",
        default_factory=Safety,
    )
    projection: Projection | None = option(
        None,
        "a mapping with gpus (and mtbfHours or failuresPerGpuHour, interval)",
        "projection: {gpus: 16384}",
    )
    evidence: Evidence | None = option(
        None,
        "a mapping with preset (and patterns, stepBase): the job's own log lines as "
        "evidence, matched in its processes",
        "evidence: {preset: nanogpt}",
    )
    timeouts: Timeouts = option(
        ...,
        "a mapping with discovery, checkpoint, recovery",
        "timeouts: {discovery: 5m}",
        default_factory=Timeouts,
        validate_default=True,
    )
    source_path: Path = option(Path("recovery-test.yaml"), "set by the loader", "")

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

    @field_validator("evidence")
    @classmethod
    def _pod_logs_where_read(cls, evidence: Evidence | None, info: ValidationInfo) -> Any:
        workload = info.data.get("workload")
        if evidence is not None and evidence.pod_logs and isinstance(workload, WorkloadBase):
            if workload.reads_job_log():
                return evidence
            raise refuse(
                f"podLogs needs a backend that reads the job's log itself (Kubernetes), "
                f"not {workload.orchestrator}",
                "podLogs: false (the job's processes match their own lines)",
                "remove podLogs, and install recoverygate-reporter in the job's Python",
                key=("podLogs",),
                got="true",
            )
        return evidence

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
        refused = fault_refusal(workload.orchestrator, failure.type)
        if refused is not None:
            problem, allowed, hint = refused
            raise refuse(problem, allowed, hint, key=("type",), got=failure.type)
        backend = _backend_of(workload.orchestrator)
        for key, given in (
            ("drainNode", failure.drain_node),
            ("cordon", failure.cordon),
            ("targetReplica", failure.target_replica is not None),  # replica groups
        ):
            if given and backend is not None and key not in backend.failure_keys:
                honoured = [
                    name for name, other in _all_backends().items() if key in other.failure_keys
                ]
                where = " / ".join(honoured) if honoured else "a backend that offers it"
                raise refuse(
                    f"needs orchestrator: {where} (this drill uses {workload.orchestrator})",
                    f"{key} with orchestrator: {where}",
                    f"remove {key}",
                    key=(key,),
                )
        if failure.on_node:
            _node_fits(workload, failure)
        if failure.path is not None:
            path_in_scope(workload.storage_scope(), failure.path)
        workload.check_failure(failure)
        return failure

    @field_validator("expectations")
    @classmethod
    def _expectations_fit_the_fault(
        cls, expectations: Expectations, info: ValidationInfo
    ) -> Expectations:
        failure = info.data.get("inject_failure")
        if failure is None:
            return expectations
        needs = (
            (
                "maxDetectionTime",
                expectations.max_detection_time is not None,
                "HangWorker or PartitionNode",
                failure.type in ("HangWorker", "PartitionNode"),
            ),
            ("savedOnPreempt", expectations.saved_on_preempt, "Preempt", failure.type == "Preempt"),
            (
                "restartBudget",
                expectations.restart_budget is not None,
                "count: untilBudgetExhausted",
                failure.count == "untilBudgetExhausted",
            ),
        )
        live = expectations.recovery == "live"
        for key, given in (
            ("maxSurvivorStall", expectations.max_survivor_stall is not None),
            ("maxRejoinTime", expectations.max_rejoin_time is not None),
            ("rejoinFrom", expectations.rejoin_from is not None),
        ):
            if given and not live:
                raise refuse(
                    "applies to recovery: live only",
                    f"{key} with recovery: live",
                    f"remove {key}, or set recovery: live",
                    key=(key,),
                )
        if live and failure.target_replica is None:
            raise refuse(
                "recovery: live needs injectFailure.targetReplica (the replica group to kill)",
                "injectFailure.targetReplica: a replica group's REPLICA_GROUP_ID",
                "add targetReplica: 1 to injectFailure",
                key=("recovery",),
                got="live",
            )
        if live and (failure.count != 1 or failure.type not in ("KillWorker", "KillStep")):
            raise refuse(
                "recovery: live judges one KillWorker kill",
                "injectFailure type: KillWorker with count: 1",
                "use type: KillWorker and leave count out, or recovery: restart",
                key=("recovery",),
                got="live",
            )
        for key, given, wants, fits in needs:
            if given and not fits:
                raise refuse(
                    f"applies to {'type: ' if ':' not in wants else ''}{wants} only",
                    f"{key} with {'type: ' if ':' not in wants else ''}{wants}",
                    f"remove {key}, or change injectFailure",
                    key=(key,),
                )
        return expectations

    @field_validator("timeouts")
    @classmethod
    def _recovery_covers_the_slo(cls, timeouts: Timeouts, info: ValidationInfo) -> Timeouts:
        expectations = info.data.get("expectations")
        if expectations is None or timeouts.recovery is None:
            return timeouts
        slo = expectations.max_recovery_time
        if timeouts.recovery < slo:
            raise refuse(
                f"is shorter than expectations.maxRecoveryTime ({format_duration(slo)}), "
                "so a slow but passing recovery would be cut off",
                f"a duration of at least {format_duration(slo)}",
                "raise it, or leave it out for maxRecoveryTime + recoveryGrace",
                key=("recovery",),
            )
        return timeouts


def _backend_of(orchestrator: str) -> Backend[Any] | None:
    try:
        return get_backend(orchestrator)
    except UsageError:
        return None  # reported at workload.orchestrator


def _all_backends() -> dict[str, Backend[Any]]:
    return all_backends()


def _node_fits(workload: WorkloadBase, failure: InjectFailure) -> None:
    """Node faults against the node count the config gives (None: known at discovery)."""
    nodes = workload.node_count()
    if nodes is None:
        return
    if nodes < 2:
        sticky = failure.type == "StickyFault"
        raise refuse(
            f"{'scope: node ' if sticky else ''}needs a job on two nodes or more: this one "
            f"runs on {nodes} node (workload.nodes), so there is no other node to "
            f"{'go on with' if sticky else 'notice or recover'}",
            "a job with workload.nodes: 2 or more",
            "set workload.nodes: 2 (one torchrun per node), or use "
            + ("scope: step" if sticky else "type: KillWorker"),
            key=("scope",) if sticky else ("type",),
            got="node" if sticky else failure.type,
        )
    if failure.target_node is not None and failure.target_node >= nodes:
        raise refuse(
            f"node {failure.target_node} does not exist in a job of {nodes} node(s) "
            "(workload.nodes)",
            f"a node from 0 to {nodes - 1}",
            key=("targetNode",),
            got=str(failure.target_node),
        )


def fault_refusal(orchestrator: str, fault: str) -> tuple[str, str, str] | None:
    """Why ``orchestrator`` cannot inject ``fault``: (problem, allowed, hint), or None.

    The backend's own reason when it gives one; else which backends can.
    """
    try:
        backend = get_backend(orchestrator)
    except UsageError:
        return None  # reported at workload.orchestrator
    if fault in backend.faults:
        return None
    offered = [kind for kind in FAULTS if kind in backend.faults]
    allowed = f"{_or_list(offered)} with this orchestrator"
    hint = f"use type: {offered[0]}"
    reason = backend.refusals.get(fault)
    if reason is not None:
        return reason, allowed, hint
    others = [name for name, other in all_backends().items() if fault in other.faults]
    where = " / ".join(others) if others else "a backend that can inject it"
    return f"{fault} needs orchestrator: {where} (this drill uses {orchestrator})", allowed, hint


def spec_from_config(config: DrillConfig) -> DrillSpec:
    """The engine's plain-value view of a validated config."""
    failure, expect = config.inject_failure, config.expectations
    after = failure.after_checkpoint
    if after is None:
        after = "next"  # afterStep is the trigger
    expected = expect.resume_from_checkpoint
    return DrillSpec(
        max_recovery_time=expect.max_recovery_time,
        after_checkpoint=None if after == "next" else after,
        expected_resume_step=None if expected == "latest" else expected,
        max_lost_steps=expect.max_lost_steps,
        checkpoint_timeout=config.timeouts.checkpoint,
        recovery_timeout=config.timeouts.recovery,
        recovery_grace=config.timeouts.recovery_grace,
        reporting_rank=config.workload.reporting_rank,
        fault=failure.type,
        target_rank=failure.effective_target_rank,
        delay=delay_of(failure.delay),
        grace_period=30.0 if failure.grace_period is None else failure.grace_period,
        count=None if failure.count == "untilBudgetExhausted" else failure.count,
        restart_budget=expect.restart_budget,
        max_detection_time=expect.max_detection_time,
        saved_on_preempt=expect.saved_on_preempt,
        state_digest_matches=expect.state_digest_matches,
        sustain=sustain_of(expect.sustain),
        max_stall=expect.max_stall,
        all_ranks=expect.all_ranks,
        target_node=failure.target_node,
        replace_node=True if failure.replace is None else failure.replace,
        partition_duration=failure.duration,
        drain_node=bool(failure.drain_node),
        cordon=bool(failure.cordon),
        recovery=expect.recovery,
        after_step=failure.after_step,
        target_replica=failure.target_replica,
        max_survivor_stall=expect.max_survivor_stall,
        max_rejoin_time=expect.max_rejoin_time,
        rejoin_from=expect.rejoin_from or "peer",
        replay=replay_of(expect.replay),
        replay_steps=expect.replay_steps,
        evidence=(config.evidence.preset or PATTERNS) if config.evidence is not None else None,
        storage=storage_spec_of(failure),
        recovery_phase=failure.phase,
        second_target=failure.second_target,
        sticky=sticky_spec_of(
            failure,
            expect.max_crash_loop,
            config.projection.gpus if config.projection is not None else None,
        ),
    )


def replay_of(value: str | ReplayTolerance) -> ReplaySpec:
    """The engine's :class:`~pytest_recoverygate.engine.spec.ReplaySpec` for a validated
    ``replay``."""
    if isinstance(value, ReplayTolerance):
        return ReplaySpec("tolerance", value.rtol, value.atol, value.max_divergent_steps)
    return ReplaySpec("exact" if value == "exact" else "report")


def delay_of(text: str | None) -> Delay:
    """The engine's :class:`~pytest_recoverygate.engine.spec.Delay` for a validated ``delay``."""
    if text is None:
        return Delay()
    if text == "beforeNextCheckpoint":
        return Delay("before_next")
    if text == "spread":
        return Delay("spread")
    if text.endswith("%"):
        return Delay("fraction", float(text[:-1]) / 100.0, explicit=True)
    return Delay("seconds", parse_duration(text), explicit=True)
