"""The config's sections that ask no backend: the strict, frozen, camelCase
:class:`Section` every model of the config (and of a backend's ``workload``) builds on,
``evidence``, ``expectations``, ``projection``, ``safety`` and ``timeouts``; re-exported by
:mod:`pytest_recoverygate.config.schema`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Tag,
    model_validator,
)
from pydantic.alias_generators import to_camel
from recoverygate.evidence import PRESETS, Spec, pattern_problem

from pytest_recoverygate.config.fields import (
    MAX_STEP,
    at_most_one,
    duration,
    option,
    refuse,
    step_ref,
    sustain_value,
)
from pytest_recoverygate.engine.spec import MAX_KILLS

__all__ = [
    "PATTERN_TAGS",
    "REPLAY_TAGS",
    "Evidence",
    "EvidencePattern",
    "EvidencePatterns",
    "Expectations",
    "Projection",
    "ReplayTolerance",
    "Safety",
    "Section",
    "Timeouts",
    "or_list",
]


#: ``maxRecoveryTime`` in live mode when neither it nor ``maxRejoinTime`` is given.
LIVE_REJOIN_DEFAULT = "90s"


class Section(BaseModel):
    """Strict, frozen, camelCase in YAML and snake_case in Python."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
    )


def or_list(words: list[str] | tuple[str, ...]) -> str:
    """``a``, ``a or b``, ``a, b or c``: the words a message offers."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _one_of(*values: str) -> BeforeValidator:
    """A text key that takes one of ``values`` (worded like the other keys' errors)."""
    allowed = or_list(list(values))

    def check(value: Any) -> Any:
        if value is None or (isinstance(value, str) and value in values):
            return value
        raise refuse(f"must be {allowed}", allowed, f"e.g. {values[0]}", choices=values)

    return BeforeValidator(check)


# --- issue 33: expectations.replay (docs/replay.md)

_REPLAY_ALLOWED = "report, exact, or a mapping {rtol, atol, maxDivergentSteps}"


class ReplayTolerance(Section):
    """``replay: {rtol, atol, maxDivergentSteps}``: a replayed step matches when
    |new - old| <= atol + rtol * |old|; at most ``maxDivergentSteps`` may not."""

    rtol: float = option(
        0.0,
        "a number >= 0: relative to the killed run's loss",
        "rtol: 1e-3",
        ge=0,
        allow_inf_nan=False,
    )
    atol: float = option(0.0, "a number >= 0: absolute", "atol: 0", ge=0, allow_inf_nan=False)
    max_divergent_steps: int = option(
        0,
        "a whole number >= 0: compared steps allowed outside the tolerance",
        "maxDivergentSteps: 0",
        ge=0,
        le=MAX_STEP,
    )


def _replay_tag(value: Any) -> str:
    """Which form of ``replay`` a value is (a mode word, or a tolerance mapping)."""
    return "tolerance" if isinstance(value, (dict, ReplayTolerance)) else "mode"


def _replay_value(value: Any) -> Any:
    if value is None or isinstance(value, (dict, ReplayTolerance)):
        return value
    if isinstance(value, str) and value in ("report", "exact"):
        return value
    hint = "e.g. replay: exact, or replay: {rtol: 1e-3}"
    raise refuse(
        "must be report, exact or a tolerance mapping",
        _REPLAY_ALLOWED,
        hint,
        choices=("report", "exact"),
    )


#: The union tags of ``replay`` (not keys: the loader drops them from error locations).
REPLAY_TAGS = frozenset({"mode", "tolerance"})


class Expectations(Section):
    """What a successful recovery looks like (the drill's pass criteria). ``recovery: live``
    (docs/torchft.md): ``maxRecoveryTime`` may be left out, it is ``maxRejoinTime`` then."""

    @model_validator(mode="before")
    @classmethod
    def _live_defaults(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and data.get("recovery") == "live"
            and "maxRecoveryTime" not in data
            and "max_recovery_time" not in data
        ):
            data = dict(data)
            rejoin = data.get("maxRejoinTime", data.get("max_rejoin_time"))
            data["maxRecoveryTime"] = rejoin if rejoin is not None else LIVE_REJOIN_DEFAULT
        return data

    recovery: Annotated[str, _one_of("restart", "live")] = option(
        "restart", "restart or live", "recovery: live"
    )
    max_survivor_stall: Annotated[float | None, duration(zero_ok=False, optional=True)] = option(
        None,
        "a duration above 0 (recovery: live): the survivors' longest gap between "
        "committed steps from the kill to the rejoin",
        "maxSurvivorStall: 10s",
    )
    max_rejoin_time: Annotated[float | None, duration(zero_ok=False, optional=True)] = option(
        None,
        "a duration above 0 (recovery: live): kill -> the replacement's first "
        "committed step (default maxRecoveryTime)",
        "maxRejoinTime: 90s",
    )
    rejoin_from: Annotated[str | None, _one_of("peer", "checkpoint")] = option(
        None,
        "peer or checkpoint (recovery: live): where the replacement's state must come from",
        "rejoinFrom: peer",
    )

    resume_from_checkpoint: Annotated[int | Literal["latest"], step_ref("latest")] = option(
        "latest", "step-N or latest", "resumeFromCheckpoint: latest"
    )
    max_recovery_time: Annotated[float, duration(zero_ok=False)] = option(
        ..., "a duration above 0, like 5m", "maxRecoveryTime: 5m"
    )
    max_lost_steps: int | None = option(
        None, "a whole number >= 0", "maxLostSteps: 100", ge=0, le=MAX_STEP
    )
    max_detection_time: Annotated[float | None, duration(zero_ok=False, optional=True)] = option(
        None,
        "a duration above 0 (HangWorker, PartitionNode): the stop or the cut -> the job notices",
        "maxDetectionTime: 2m",
    )
    max_crash_loop: int | None = option(
        None,
        "a whole number >= 1 (StickyFault; default 3): the most incarnations that may die "
        "of the same failure before the job stops retrying it",
        "maxCrashLoop: 3",
        ge=1,
        le=MAX_KILLS,
    )
    saved_on_preempt: bool = option(
        False,
        "true or false (Preempt): require a checkpoint completed in the grace period",
        "savedOnPreempt: true",
    )
    restart_budget: int | None = option(
        None,
        "a whole number >= 0 (count: untilBudgetExhausted): the restarts the job survives",
        "restartBudget: 3",
        ge=0,
        le=MAX_KILLS,
    )
    state_digest_matches: bool = option(
        False,
        "true or false: the loaded state must equal the one saved at that step "
        "(needs digest= on checkpoint_completed and checkpoint_loaded)",
        "stateDigestMatches: true",
    )
    sustain: Annotated[str | None, sustain_value()] = option(
        None,
        "N steps or a duration: how long training must keep advancing after the resume "
        "before a PASS (default: the larger of 3 progress lines and 10s)",
        "sustain: 5 steps",
    )
    max_stall: Annotated[float | None, duration(zero_ok=False, optional=True)] = option(
        None,
        "a duration above 0: how long the job may go without an advancing step after the "
        "resume before it is a stall (default: 3x its longest gap before the kill, at "
        "least 5s); set it when the job pauses on purpose, e.g. to evaluate",
        "maxStall: 2m",
    )
    all_ranks: bool = option(
        False,
        "true or false: every rank must report checkpoint_loaded of the expected step "
        "(a rank that says nothing FAILs instead of being reported unchecked)",
        "allRanks: true",
    )
    replay: Annotated[
        Annotated[Literal["report", "exact"], Tag("mode")]
        | Annotated[ReplayTolerance, Tag("tolerance")],
        Discriminator(_replay_tag),
        BeforeValidator(_replay_value),
    ] = option(
        "report",
        _REPLAY_ALLOWED + ": compare the losses of the steps the replacement redoes with "
        "the killed run's (report: figures only, never the verdict)",
        "replay: exact",
    )
    replay_steps: int = option(
        5,
        "a whole number >= 0: with replay exact or a tolerance and no delay, kill once "
        "the job is this many steps past the trigger checkpoint",
        "replaySteps: 5",
        ge=0,
        le=1_000_000,
    )

    @model_validator(mode="after")
    def _replay_restart_only(self) -> Expectations:
        """issue 33: a replay compares a restarted job's redone steps; live has none."""
        if self.recovery == "live" and self.replay != "report":
            raise refuse(
                "compares the steps a restarted job redoes; with recovery: live the "
                "survivors never redo a step",
                "report (with recovery: live)",
                "remove replay, or use recovery: restart",
                key=("replay",),
                got=str(self.replay) if isinstance(self.replay, str) else "a tolerance",
            )
        return self


class Projection(Section):
    """Project the measured failure cost to a large run (``recoverygate goodput``)."""

    gpus: int = option(..., "a whole number >= 1", "gpus: 16384", ge=1, le=10_000_000)
    mtbf_hours: float | None = option(
        None,
        "hours > 0: the whole job's mean time between failures at that scale",
        "mtbfHours: 3",
        gt=0,
    )
    failures_per_gpu_hour: float | None = option(
        None,
        "a rate > 0 (default: Llama 3 405B's, 419 in 54 days on 16,384 GPUs)",
        "failuresPerGpuHour: 2e-5",
        gt=0,
    )
    interval: Annotated[float | None, duration(zero_ok=False, optional=True)] = option(
        None, "a duration: also evaluate this interval", "interval: 30m"
    )

    @model_validator(mode="after")
    def _one_rate(self) -> Projection:
        at_most_one(
            ("failuresPerGpuHour", self.failures_per_gpu_hour),
            ("mtbfHours", self.mtbf_hours),
            both=("one of them", "keep the one you measured"),
        )
        return self


class Safety(Section):
    """Interlocks before anything is destroyed."""

    require_confirm: bool = option(True, "true or false", "requireConfirm: true")
    dry_run: bool = option(False, "true or false", "dryRun: false")


class Timeouts(Section):
    """Deadlines of the drill's phases, in seconds.

    ``recovery`` left out stays None: "never came back" is then decided
    ``maxRecoveryTime + recoveryGrace`` after the kill, a value computed in one place
    (:attr:`~pytest_recoverygate.engine.spec.DrillSpec.effective_recovery_timeout`).
    """

    discovery: Annotated[float, duration(zero_ok=False)] = option(
        300.0, "a duration above 0", "discovery: 5m"
    )
    checkpoint: Annotated[float, duration(zero_ok=False)] = option(
        3600.0, "a duration above 0", "checkpoint: 1h"
    )
    recovery: Annotated[float | None, duration(zero_ok=False)] = option(
        None, "a duration above 0", "recovery: 10m"
    )
    recovery_grace: Annotated[float, duration(zero_ok=True)] = option(
        30.0, "a duration >= 0", "recoveryGrace: 30s"
    )


def _evidence_pattern(kind: str) -> BeforeValidator:
    """One ``evidence.patterns`` key: a regex that compiles, has its groups and cannot
    backtrack without bound (checked by the same code the job's processes run), or a
    mapping ``{regex, stepBase}`` (a regex checked the same way)."""

    def check(value: Any) -> Any:
        if value is None:
            return value
        mapping = isinstance(value, dict)
        if mapping and "regex" not in value:
            return value  # the preset's regex, with its own base (Evidence checks the preset)
        regex = value["regex"] if mapping else value
        message = pattern_problem(kind, regex)
        if message is not None:
            raise refuse(
                message,
                "a regular expression with a (?P<step>...) group (checkpoints: or (?P<path>...))",
                f"e.g. {kind}: '{_PATTERN_EXAMPLES[kind]}'",
                key=("regex",) if mapping else (),
                got=str(regex)[:200],
            )
        return value

    return BeforeValidator(check)


_PATTERN_EXAMPLES = {
    "progress": r"iter (?P<step>\d+): loss (?P<loss>[0-9.]+)",
    "checkpointStarted": r"saving checkpoint at iteration\s+(?P<step>\d+)",
    "checkpointCompleted": r"successfully saved checkpoint from iteration\s+(?P<step>\d+)",
    "checkpointLoaded": r"successfully loaded checkpoint .* at iteration (?P<step>\d+)",
}

_STEP_BASE_HELP = (
    "completed or index: the number a line names counts the steps done, or is the 0-based "
    "index of the step just done (the drill adds 1)"
)


class EvidencePattern(Section):
    """One pattern with its own step base: ``{regex: …, stepBase: completed | index}``."""

    regex: str | None = option(
        None,
        "a regular expression (default: the preset's of this kind)",
        "regex: 'Resuming training from snapshot at Epoch (?P<step>\\d+)'",
    )
    step_base: Annotated[str | None, _one_of("completed", "index")] = option(
        None, _STEP_BASE_HELP + " (default: the section's stepBase)", "stepBase: completed"
    )

    def entry(self) -> str | dict[str, str]:
        """The pattern as the job's processes get it (a bare regex when it has no base)."""
        if self.step_base is None and self.regex is not None:
            return self.regex
        given = {"regex": self.regex, "stepBase": self.step_base}
        return {key: value for key, value in given.items() if value is not None}


def _pattern_tag(value: Any) -> str:
    """Which form of a ``patterns`` value a value is (a regex, or a mapping)."""
    return "mapping" if isinstance(value, (dict, EvidencePattern)) else "text"


#: A ``patterns`` value: a regex, or a mapping with its own base.
_Pattern = (
    Annotated[
        Annotated[str, Tag("text")] | Annotated[EvidencePattern, Tag("mapping")],
        Discriminator(_pattern_tag),
    ]
    | None
)

#: The union tags of a ``patterns`` value (not keys: the loader drops them from locations).
PATTERN_TAGS = frozenset({"text", "mapping"})


class EvidencePatterns(Section):
    """Custom patterns, each overriding the preset's of the same kind (docs/evidence.md);
    each a regex, or ``{regex, stepBase}`` for a line whose number has its own base."""

    progress: Annotated[_Pattern, _evidence_pattern("progress")] = option(
        None,
        "a regex with (?P<step>...) (and optionally (?P<loss>...)): a training step",
        "progress: 'iter (?P<step>\\d+): loss (?P<loss>[0-9.]+)'",
    )
    checkpoint_started: Annotated[_Pattern, _evidence_pattern("checkpointStarted")] = option(
        None,
        "a regex with (?P<step>...) or (?P<path>...): a save began (printed before the write)",
        "checkpointStarted: 'saving checkpoint at iteration\\s+(?P<step>\\d+)'",
    )
    checkpoint_completed: Annotated[_Pattern, _evidence_pattern("checkpointCompleted")] = option(
        None,
        "a regex with (?P<step>...) or (?P<path>...): a save is durable",
        "checkpointCompleted: 'successfully saved checkpoint from iteration\\s+(?P<step>\\d+)'",
    )
    checkpoint_loaded: Annotated[_Pattern, _evidence_pattern("checkpointLoaded")] = option(
        None,
        "a regex with (?P<step>...) or (?P<path>...): a resume loaded a checkpoint",
        "checkpointLoaded: 'loaded checkpoint .* at iteration (?P<step>\\d+)'",
    )

    def entries(self) -> dict[str, str | dict[str, str]]:
        """The patterns given, by kind, as the job's processes get them."""
        out: dict[str, str | dict[str, str]] = {}
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if value is not None:
                out[info.alias or name] = value if isinstance(value, str) else value.entry()
        return out


class Evidence(Section):
    """The job's own log lines as evidence, matched inside its processes (docs/evidence.md)."""

    preset: Annotated[str | None, _one_of(*PRESETS)] = option(
        None, f"{or_list(list(PRESETS))}: a known trainer's lines", "preset: nanogpt"
    )
    patterns: EvidencePatterns | None = option(
        None,
        "a mapping with progress, checkpointStarted, checkpointCompleted, checkpointLoaded",
        "patterns: {progress: 'iter (?P<step>\\d+):'}",
    )
    step_base: Annotated[str | None, _one_of("completed", "index")] = option(
        None,
        _STEP_BASE_HELP + ", for every pattern (the preset's too) without its own "
        "stepBase (default: each preset line's, else completed)",
        "stepBase: index",
    )

    pod_logs: bool = option(
        False,
        "true or false (kubernetes): match the reporting rank's pod log in the drill, for "
        "an image without the reporter (docs: evidence.md says what that evidence lacks)",
        "podLogs: true",
    )

    @model_validator(mode="after")
    def _something_to_match(self) -> Evidence:
        if self.preset is None and self.patterns is None:
            raise refuse(
                "evidence needs a preset or patterns",
                f"preset: {or_list(list(PRESETS))}, or patterns: {{progress: ...}}",
                "e.g. evidence: {preset: nanogpt}",
            )
        return self

    @model_validator(mode="after")
    def _regex_to_take(self) -> Evidence:
        """A pattern given only a stepBase takes the preset's regex: there must be one."""
        entries = self.patterns.entries() if self.patterns else {}
        for kind, entry in entries.items():
            if isinstance(entry, dict) and "regex" not in entry:
                table = PRESETS.get(self.preset or "", {})
                if not table.get(kind):
                    owner = (
                        f"preset {self.preset} has no {kind} line"
                        if self.preset
                        else "there is no preset"
                    )
                    raise refuse(
                        f"needs a regex: {owner} to take it from",
                        "a regular expression with a (?P<step>...) group",
                        f"e.g. regex: '{_PATTERN_EXAMPLES[kind]}'",
                        key=("patterns", kind, "regex"),
                        got="nothing",
                    )
        return self

    def spec(self) -> Spec:
        """The spec the job's processes get (the preset with these patterns over it)."""
        patterns = self.patterns.entries() if self.patterns else {}
        return Spec({"preset": self.preset, "patterns": patterns, "stepBase": self.step_base})

    def environment(self, current: str | None = None) -> str:
        """The ``RECOVERYGATE_AUTO`` value that turns the matching on; ``current``: the
        value the job's environment already has (its frameworks are kept)."""
        return self.spec().to_json(frameworks=current)
