"""The one loop that runs a drill: backend + event source -> engine -> actions.

The CLI and the pytest plugin both call :func:`run_drill`; neither holds drill logic.
The runner guarantees, on every way out (verdict, error, exception, Ctrl-C, SIGTERM):
the event source is closed and ``cleanup()`` runs exactly once, then the report is
written. An interrupt is re-raised as :class:`DrillInterrupted` *after* cleanup, with
the partial result attached, so callers map it to exit code 130.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec

from pytest_recoverygate.config.schema import spec_from_config
from pytest_recoverygate.engine import model
from pytest_recoverygate.engine.machine import (
    DrillEngine,
    DrillResult,
    Finish,
    KillTarget,
    Phase,
    RestoreTarget,
    Verdict,
)
from pytest_recoverygate.errors import (
    ConfigError,
    ConfirmationRequired,
    DrillError,
    DrillInterrupted,
    ReportError,
    UsageError,
    describe_exception,
)
from pytest_recoverygate.links import docs_link
from pytest_recoverygate.registry import get_backend
from pytest_recoverygate.registry.seams import (
    Clock,
    EventSource,
    NodeFaults,
    Notices,
    Orchestrator,
    RealClock,
    StorageScope,
    cleanup_once,
)
from pytest_recoverygate.shared.lock import DrillLock, job_lock
from pytest_recoverygate.storage.damage import damage, files_written
from pytest_recoverygate.storage.layer import StorageLayer
from pytest_recoverygate.storage.poison import Poison

if TYPE_CHECKING:
    from pytest_recoverygate.config.schema import DrillConfig
    from pytest_recoverygate.report.evidence import Evidence

__all__ = [
    "MAX_RAW_OTHER",
    "MAX_RAW_PROGRESS",
    "ProgressRecord",
    "RunOptions",
    "Status",
    "check_confirmation",
    "check_report_paths",
    "run_drill",
    "spec_from_config",
    "unmatched_evidence",
]

_P = ParamSpec("_P")


@dataclass(frozen=True, slots=True)
class Status:
    """What the drill is doing now, for live progress displays: its phase and message,
    the seconds since it started, the job's newest step, the seconds since the kill and
    the recovery limit (None until known), and whether the phase just changed."""

    phase: Phase
    message: str
    elapsed: float
    step: int | None
    since_kill: float | None
    max_recovery_time: float | None
    phase_changed: bool = False


Observer = Callable[[Status], None]
Action = KillTarget | RestoreTarget | Finish
Confirm = Callable[[model.Worker, model.Workload], bool]
EvidenceSink = Callable[["Evidence"], None]


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How to run a drill; everything the config does not say.

    ``confirmed`` is ``--yes``: kills need no prompt. ``confirm`` is asked otherwise when
    the config requires confirmation; without it (non-interactive) the drill is refused
    before anything is touched. ``on_evidence`` receives the job's output and the
    diagnoses once the drill has ended (before the report is written).
    """

    dry_run: bool = False
    confirmed: bool = False
    confirm: Confirm | None = None
    observer: Observer | None = None
    poll_interval: float = 0.05
    status_interval: float = 1.0
    report_path: Path | None = None
    report_dir: Path | None = None
    handle_signals: bool = True
    on_evidence: EvidenceSink | None = None


def check_confirmation(config: DrillConfig, options: RunOptions) -> None:
    """Refuse, before anything is touched, a kill nobody can confirm."""
    dry_run = options.dry_run or config.safety.dry_run
    if dry_run or not config.safety.require_confirm or options.confirmed:
        return
    if options.confirm is None:
        raise ConfirmationRequired(
            f"{config.source_path}: safety.requireConfirm is true but this run cannot ask "
            "(no terminal). Confirm the kill with --yes (pytest: --drill-yes), set "
            "safety.requireConfirm: false, or try it first with --dry-run."
        )


def check_report_paths(options: RunOptions) -> None:
    """Refuse, before anything is touched, report paths that cannot be written."""
    if options.report_path is not None and options.report_path.is_dir():
        raise UsageError(f"--report {options.report_path} is a folder; give a file path")
    if (
        options.report_dir is not None
        and options.report_dir.exists()
        and (not options.report_dir.is_dir())
    ):
        raise UsageError(f"--report-dir {options.report_dir} is a file; give a folder")


def run_drill(
    config: DrillConfig,
    options: RunOptions | None = None,
    *,
    clock: Clock | None = None,
    orchestrator: Orchestrator | None = None,
) -> DrillResult:
    """Run one drill to its verdict. Raises ConfigError/UsageError before touching
    anything, and DrillInterrupted (after cleanup) on Ctrl-C/SIGTERM."""
    options = options or RunOptions()
    clock = clock or RealClock()
    check_confirmation(config, options)
    check_report_paths(options)
    poison = _poison_for(config, options)
    try:
        if orchestrator is None:
            from pytest_recoverygate.orchestrators import build_orchestrator

            environment = poison.environment if poison is not None else None
            orchestrator = build_orchestrator(config, clock, environment)
    except BaseException:
        if poison is not None:
            poison.close()
        raise
    drill = _Drill(config, options, clock, orchestrator, poison)
    with _signals_raise_interrupt(options.handle_signals):
        result = drill.run()
    result = unmatched_evidence(result, config, drill.raw_log)
    evidence = _keep_evidence(result, config, options, orchestrator)
    if (
        options.report_path is not None
        or options.report_dir is not None
        or os.environ.get("GITHUB_STEP_SUMMARY")  # every run appends its summary in CI
    ):
        from pytest_recoverygate.report.files import write_reports

        try:
            write_reports(
                result,
                config,
                options.report_path,
                options.report_dir,
                drill.raw_log,
                evidence=evidence,
            )
        except OSError as exc:
            if result.verdict is Verdict.INTERRUPTED:  # the interrupt is what to report
                raise DrillInterrupted(drill.interrupted_by).with_result(result) from None
            raise ReportError(
                f"the drill ended ({result.verdict.value}) but its report could not be "
                f"written: {exc}",
                result,
            ) from None
    if result.verdict is Verdict.INTERRUPTED:
        raise DrillInterrupted(drill.interrupted_by).with_result(result)
    return result


def _poison_for(config: DrillConfig, options: RunOptions) -> Poison | None:
    """StickyFault ``scope: step``: the poison the job's environment names (armed at the
    trigger, removed at cleanup); None for any other drill, and in a dry run."""
    failure = config.inject_failure
    if (
        failure.type != "StickyFault"
        or failure.scope != "step"
        or failure.at_step is None
        or options.dry_run
        or config.safety.dry_run
    ):
        return None
    return Poison(failure.rank_for(config.workload.reporting_rank), failure.at_step)


def _keep_evidence(
    result: DrillResult, config: DrillConfig, options: RunOptions, orchestrator: Orchestrator
) -> Evidence:
    """After cleanup: the job's own output and the diagnoses, handed to ``on_evidence``."""
    from pytest_recoverygate.report.evidence import gather_evidence

    evidence = gather_evidence(result, orchestrator, config)
    if options.on_evidence is not None:
        options.on_evidence(evidence)
    return evidence


#: ``evidence.patterns`` kind -> the event its matches report.
_EVIDENCE_EVENTS = {
    "progress": "progress",
    "checkpointStarted": "checkpoint_started",
    "checkpointCompleted": "checkpoint_completed",
    "checkpointLoaded": "checkpoint_loaded",
}


def unmatched_evidence(
    result: DrillResult, config: DrillConfig, raw_log: list[dict[str, Any]]
) -> DrillResult:
    """A drill with an ``evidence`` section: what pod-log evidence lacks (``podLogs``);
    and, when it did not PASS, each pattern no line matched during the whole drill (the
    CLI and the report show the job's last lines). When not one progress line matched,
    the summary says so: the drill could not see the job train, which is not evidence of
    anything about its recovery."""
    if config.evidence is None:
        return result
    if config.evidence.pod_logs:
        from pytest_recoverygate.shared.logevidence import LACKS

        result = replace(result, notes=(*result.notes, LACKS))
    if result.verdict is Verdict.PASS:
        return result
    seen = {row.get("event") for row in raw_log}
    where = f"preset {config.evidence.preset}" if config.evidence.preset else "your patterns"
    notes = []
    # A drill that saw no replacement start (a StorageFault the job went on from, a drill
    # ended before any kill) had no load to match: its load line's silence says nothing.
    came_back = any(info.new for info in result.incarnations)
    for kind, pattern in config.evidence.spec().sources.items():
        if kind == "checkpointLoaded" and not came_back:
            continue
        if pattern and _EVIDENCE_EVENTS[kind] not in seen:
            notes.append(
                f"evidence: no line matched the {kind} pattern ({where}) {pattern!r} during "
                "the whole drill; compare it with the job's last lines, and check that the "
                "reporter is installed in the job's Python (its start-up hook does the matching)"
            )
    if not notes:
        return result
    summary = result.summary
    if "progress" not in seen:  # "inconclusive" only where the verdict says so (ERROR)
        said = "inconclusive: " if result.verdict is Verdict.ERROR else "note: "
        summary = f"{summary} ({said}{notes[0].removeprefix('evidence: ')})"
    return replace(result, summary=summary, notes=(*result.notes, *notes))


#: Lines stamped this long before the job's launch are still taken as its own (the
#: reporter stamps a process's start at the end of its 10 ms start tick; clocks step).
NOT_BEFORE_SLACK = 0.25


class _Drill:
    """One run: owns the engine, the backend and the cleanup guarantee."""

    def __init__(
        self,
        config: DrillConfig,
        options: RunOptions,
        clock: Clock,
        orchestrator: Orchestrator,
        poison: Poison | None = None,
    ) -> None:
        self.config = config
        self.options = options
        self.clock = clock
        self.orchestrator = orchestrator
        self.dry_run = options.dry_run or config.safety.dry_run
        self.started = clock.now()
        self.engine = DrillEngine(spec_from_config(config), self.started)
        self.target: model.Worker | None = None
        self.node: model.Node | None = None  # node faults: the node hit (or to hit)
        self._killed: set[str] = set()  # instance ids hit so far: never twice
        self._killed_nodes: set[str] = set()  # node identities a KillNode hit: never twice
        self.source: EventSource | None = None
        self.progress = ProgressRecord()
        self.raw_log: list[dict[str, Any]] = []
        self.raw_dropped = 0  # event rows past the bounds below: not in events.jsonl
        self._raw_progress = 0
        self.interrupted_by = "SIGINT"
        self._last_status = 0.0
        self._shown_phase: Phase | None = None
        self.lock: DrillLock | None = None
        self.storage: StorageLayer | None = None  # StorageFault: the layer over the folder
        self.poison = poison  # StickyFault scope step: the poison (removed at cleanup)

    @property
    def phase(self) -> Phase:
        """The engine's phase: the runner keeps none of its own."""
        return self.engine.phase

    def run(self) -> DrillResult:
        result: DrillResult
        try:
            result = self._run()
        except DrillInterrupted as exc:
            self.interrupted_by = exc.signal_name
            result = self._abort(Verdict.INTERRUPTED, f"interrupted by {exc.signal_name}")
        except KeyboardInterrupt:
            result = self._abort(Verdict.INTERRUPTED, "interrupted by SIGINT (Ctrl-C)")
        except (ConfigError, UsageError):
            self._cleanup()
            raise
        except DrillError as exc:
            result = self._abort(Verdict.ERROR, str(exc))
        except Exception as exc:  # a backend bug must still end in cleanup and ERROR
            detail = describe_exception(exc)  # a missing module: the pip command
            self.engine.note(self.clock.now(), "exception", traceback.format_exc(limit=8))
            result = self._abort(
                Verdict.ERROR, f"the drill failed in phase '{self.phase.value}': {detail}"
            )
        finally:
            cleanup_error = self._cleanup()
        if cleanup_error is not None and result.verdict is not Verdict.INTERRUPTED:
            result = replace(
                result,
                verdict=Verdict.ERROR if result.verdict is not Verdict.FAIL else result.verdict,
                summary=f"{result.summary}; cleanup failed: {cleanup_error}",
            )
        return self._finalize(result)

    def _run(self) -> DrillResult:
        self._shown_phase = Phase.DISCOVERING
        self._status(self.engine.status(self.clock.now()), phase_changed=True)
        # StorageFault: where the config shows the job's folders (a job the backend
        # launches), the layer is mounted before the job starts; else after discovery.
        before_launch = self.config.workload.storage_scope() is not None
        if before_launch:
            self._mount_storage()
        deadline = self.clock.now() + self.config.timeouts.discovery
        workload = self.orchestrator.discover(deadline)
        rank = self.config.inject_failure.rank_for(self.config.workload.reporting_rank)
        target = workload.by_rank(rank)
        if target is None:
            ranks = ", ".join(str(w.rank) for w in workload.workers) or "none"
            raise _discovery_error(
                f"target rank {rank} is not among the workers of {workload.job} "
                f"(ranks present: {ranks}); set injectFailure.targetRank to one of them"
            )
        self.target = target
        if not before_launch:
            self._storage_scope(target)  # DiscoveryError, nothing touched
        discovered = (
            f"{workload.job}: {len(workload.workers)} worker(s); target {target.describe()}"
        )
        if self.config.inject_failure.on_node:
            self.node = self._target_node(workload, target)
            discovered = (
                f"{workload.job}: {len(workload.workers)} worker(s) on "
                f"{len(workload.nodes)} nodes; target {self.node.describe()}"
            )
        backend = get_backend(self.config.workload.orchestrator)
        scope = backend.lock_scope(workload, target)
        self.lock = job_lock(backend.name, scope, self.config.source_path)
        self.lock.acquire()  # a second drill against this job: DiscoveryError, nothing touched
        if not self.dry_run and self.config.safety.require_confirm and not self.options.confirmed:
            assert self.options.confirm is not None  # check_confirmation made sure
            shown = target
            if self.node is not None:  # the prompt names what is hit: the whole node
                shown = replace(target, name=f"{target.name}, with every instance of "
                                f"{self.node.describe()}")  # fmt: skip
            if not self.options.confirm(shown, workload):
                raise _usage_declined(target)
        if not before_launch:
            self._mount_storage()  # the job runs: the layer over its folder from now on
        self.source = self.orchestrator.events()
        self.engine.discovered(
            self.clock.now(),
            discovered,
            restart_budget=backend.restart_budget(self.config.workload),
            ranks=tuple(w.rank for w in workload.workers),
            not_before=(
                None if workload.started_at is None else workload.started_at - NOT_BEFORE_SLACK
            ),
            world_size=len(workload.workers),
        )
        self._sync_phase()
        while True:
            actions = self._pump()
            for action in actions:
                if isinstance(action, Finish):
                    return action.result
                actions.extend(self._execute(action))
            self._sync_phase()
            self._wait()

    def _pump(self) -> list[Action]:
        assert self.source is not None
        actions: list[Action] = []
        for event in self.source.poll():
            self._record(event)
            actions += self.engine.on_training_event(event)
        for group_event in self.orchestrator.watch_group():
            actions += self.engine.on_group_event(group_event)
        if self.storage is not None:
            for storage_event in self.storage.events():
                actions += self.engine.on_storage_event(storage_event)
        self._take_notices()
        actions += self.engine.tick(self.clock.now())
        return actions

    def _take_notices(self) -> None:
        """The event source's notices (a job file it refused to read) onto the timeline."""
        if isinstance(self.source, Notices):
            for at, text in self.source.notices():
                self.engine.note(at, "refused", text)

    def _target_node(self, workload: model.Workload, target: model.Worker) -> model.Node:
        """The node a node fault hits: ``targetNode``, else the target rank's node."""
        failure = self.config.inject_failure
        if not isinstance(self.orchestrator, NodeFaults):
            raise _discovery_error(
                f"{failure.type} needs a backend that can act on nodes, and "
                f"orchestrator {self.orchestrator.name} implements no current_node/"
                f"kill_node/restore_node ({docs_link('nodes.md')}); use type: KillWorker"
            )
        indexes = ", ".join(str(n.index) for n in workload.nodes) or "none"
        if len(workload.nodes) < 2:
            raise _discovery_error(
                f"{failure.type} needs a job on two nodes or more, and {workload.job} runs on "
                f"{len(workload.nodes) or 'one'} node(s) (nodes found: {indexes}); run it on "
                "more nodes, or use type: KillWorker"
            )
        if failure.target_node is not None:
            node = workload.node(failure.target_node)
            if node is None:
                raise _discovery_error(
                    f"injectFailure.targetNode {failure.target_node} is not among the nodes "
                    f"of {workload.job} (nodes present: {indexes}); set it to one of them"
                )
            return node
        node = workload.node_of(target)
        if node is None:
            raise _discovery_error(
                f"the node of {target.describe()} is not among the nodes of {workload.job} "
                f"(nodes present: {indexes}); set injectFailure.targetNode"
            )
        return node

    def _execute(self, action: KillTarget | RestoreTarget | Finish) -> list[Action]:
        if isinstance(action, RestoreTarget):
            if self.engine.spec.storage is not None:
                return self._lift_storage(action)
            return self._restore(action)
        assert isinstance(action, KillTarget)
        assert self.target is not None
        if self.config.inject_failure.on_node:
            return self._execute_on_node(action)
        if action.fault == "StorageFault":
            return self._arm_storage(action)
        sticky = self.engine.spec.sticky
        if sticky is not None and sticky.scope == "step":
            return self._arm_sticky(action)
        if sticky is not None and sticky.scope == "checkpoint":
            undamaged = self._damage_checkpoint(action)
            if undamaged is not None:
                return undamaged
        target = self._target_for(action)
        if target is None:
            rank = self.target.rank if action.rank is None else action.rank
            return self._already_gone(
                f"no running instance of rank {rank} other than the one killed before was "
                "found; nothing was killed"
            )
        self.target = target
        self._killed.add(target.instance_id)
        how = {"Preempt": "preempting", "HangWorker": "stopping"}.get(action.fault, "killing")
        verb = f"checking the {how.removesuffix('ing')} of" if self.dry_run else how
        self._sync_phase(
            f"checkpoint step {action.checkpoint_step} reached; {verb} {target.describe()}"
            + (f" (kill {action.index})" if action.index > 1 else "")
        )
        fault = model.Fault(action.fault, action.grace_period)
        result = self._attempt(self.orchestrator.kill, target, dry_run=self.dry_run, fault=fault)
        return list(self.engine.on_kill_result(result))

    def _execute_on_node(self, action: KillTarget) -> list[Action]:
        """A node fault: every instance of the target node, as the backend sees it now."""
        assert self.node is not None
        assert isinstance(self.orchestrator, NodeFaults)
        spec = self.engine.spec
        index = self.node.index
        node = self.orchestrator.current_node(index)
        if node is None and action.index == 1:
            node = self.node
        if node is None or (action.fault == "KillNode" and node.identity in self._killed_nodes):
            return self._already_gone(
                f"node {index} is not running, or is the node killed before; nothing was touched"
            )
        self.node = node
        if action.fault == "KillNode":
            self._killed_nodes.add(node.identity)
        self._killed.update(w.instance_id for w in node.workers)
        how = {"PartitionNode": "cutting the link of", "DrainNode": "draining"}.get(
            action.fault, "killing"
        )
        verb = f"checking the {how.split()[0].removesuffix('ing')} of" if self.dry_run else how
        self._sync_phase(
            f"checkpoint step {action.checkpoint_step} reached; {verb} {node.describe()}"
            + (f" (kill {action.index})" if action.index > 1 else "")
        )
        fault = model.Fault(
            action.fault,
            action.grace_period,
            replace=spec.replace_node,
            duration=spec.partition_duration,
            drain_node=spec.drain_node,
            cordon=spec.cordon,
        )
        result = self._attempt(self.orchestrator.kill_node, node, dry_run=self.dry_run, fault=fault)
        return list(self.engine.on_kill_result(result))

    # ------------------------------------------------------------------ StickyFault

    def _arm_sticky(self, action: KillTarget) -> list[Action]:
        """``scope: step``: arm the poison (nothing is killed: the job's own step is)."""
        spec = self.engine.spec.sticky
        assert spec is not None
        what = f"step {spec.at_step} on rank {self.engine.spec.target_rank}"
        self._sync_phase(
            f"checkpoint step {action.checkpoint_step} reached; "
            + ("checking the poisoning of" if self.dry_run else "poisoning")
            + f" {what}"
        )
        now = self.clock.now()
        if self.poison is None:
            detail = (
                f"would poison {what}: each incarnation of that rank that reports it exits 1 "
                "until the drill ends (RECOVERYGATE_POISON, read by the reporter)"
            )
            return list(self.engine.on_kill_result(
                model.KillResult(model.KillOutcome.DRY_RUN, now, detail)))  # fmt: skip
        try:
            armed_at = self.poison.arm()
        except OSError as exc:
            result = model.KillResult(
                model.KillOutcome.UNCONFIRMED, now, f"the poison could not be armed: {exc}"
            )
            return list(self.engine.on_kill_result(result))
        detail = f"{what} is poisoned (the reporter ends each incarnation that reports it)"
        return list(
            self.engine.on_kill_result(model.KillResult(model.KillOutcome.KILLED, armed_at, detail))
        )

    def _damage_checkpoint(self, action: KillTarget) -> list[Action] | None:
        """``scope: checkpoint``: write over the files the trigger checkpoint's save wrote
        under ``path`` (storage.damage); None when done (the target is killed next), else
        the engine's answer to a damage that could not be done (nothing was touched)."""
        spec = self.engine.spec.sticky
        folder = self.config.inject_failure.path
        assert spec is not None
        assert folder is not None
        step = action.checkpoint_step
        window = self.engine.sticky_save_window(step)
        now = self.clock.now()
        if window is None:
            return self._not_damaged(f"the save of checkpoint {step} was not seen; nothing done")
        try:
            names = files_written(folder, *window)
        except OSError as exc:
            return self._not_damaged(f"{folder} cannot be read ({exc.strerror}); nothing done")
        listed = ", ".join(name for name, _ in names) or "none"
        if not names:
            return self._not_damaged(
                f"no file under {folder} was written by the save of checkpoint {step} (from "
                f"{window[1] - window[0]:.3f}s before its checkpoint_completed); is path the "
                "job's checkpoint folder? Nothing was touched"
            )
        if self.dry_run:
            assert self.target is not None
            result = self._attempt(self.orchestrator.kill, self.target, dry_run=True)
            detail = f"would {spec.damage} {listed} under {folder}, then: {result.detail}"
            return list(self.engine.on_kill_result(
                model.KillResult(model.KillOutcome.DRY_RUN, now, detail)))  # fmt: skip
        self._sync_phase(f"checkpoint step {step} reached; damaging ({spec.damage}) {listed}")
        try:
            done = damage(folder, [name for name, _ in names], spec.damage)
        except OSError as exc:
            return self._not_damaged(f"damaging {folder} failed ({exc}); see the timeline")
        if not done:
            return self._not_damaged(f"none of {listed} could be damaged (gone, or a link)")
        self.engine.sticky_damaged(step, tuple(d.describe() for d in done), self.clock.now())
        return None

    def _not_damaged(self, detail: str) -> list[Action]:
        result = model.KillResult(model.KillOutcome.UNCONFIRMED, self.clock.now(), detail)
        return list(self.engine.on_kill_result(result))

    # ------------------------------------------------------------------ StorageFault

    def _mount_storage(self) -> None:
        """StorageFault: the storage layer over the checkpoint folder, mounted before the
        job starts, or once discovery showed the running job's folders (a dry run mounts
        nothing)."""
        spec = self.engine.spec.storage
        if spec is None or self.dry_run:
            return
        layer = StorageLayer(spec.path, wakeup=self.clock.wakeup)
        self.storage = layer  # cleanup unmounts whatever of it came up
        layer.mount()
        self.engine.storage_mounted(self.clock.now())
        self._note("storage", f"storage layer mounted over {layer.folder} ({layer.fsname})")

    def _storage_scope(self, target: model.Worker) -> None:
        """StorageFault on a job the config cannot scope (one the backend attaches to):
        its ``path`` must lie in a folder the running job can be shown to use, and the
        target's processes must see a mount made here. DiscoveryError otherwise, before
        anything is mounted or hit."""
        spec = self.engine.spec.storage
        if spec is None:
            return
        name = self.orchestrator.name
        if not isinstance(self.orchestrator, StorageScope):
            raise _discovery_error(
                f"StorageFault on {spec.path}: orchestrator {name} cannot show which folders "
                "the job uses (its workload section names none, and the backend reads none "
                f"from the running job: no storage_scope, {docs_link('backends.md')}); "
                "nothing was mounted"
            )
        scope = self.orchestrator.storage_scope(target)
        path = Path(os.path.realpath(spec.path))
        if any(path == folder or folder in path.parents for folder in scope):
            return
        shown = ", ".join(str(folder) for folder in scope[:4]) or "none"
        raise _discovery_error(
            f"StorageFault: path {spec.path} lies outside what the job can be shown to use "
            f"(as {name} shows it: {shown}); point injectFailure.path at the folder the job "
            "saves its checkpoints in; nothing was mounted"
        )

    def _arm_storage(self, action: KillTarget) -> list[Action]:
        """Arm the fault; with ``during: load`` kill the target too (its replacement
        loads through the faulty storage)."""
        spec = self.engine.spec.storage
        assert spec is not None
        assert self.target is not None
        what = f"the {spec.mode} fault on {spec.path}"
        load = spec.during == "load"
        self._sync_phase(
            f"checkpoint step {action.checkpoint_step} reached; "
            + ("checking" if self.dry_run else "arming")
            + f" {what}"
            + (f" and killing {self.target.describe()}" if load else "")
        )
        now = self.clock.now()
        if self.dry_run or self.storage is None:
            detail = f"would arm {what} (a storage layer over exactly that folder)"
            if load:
                result = self._attempt(
                    self.orchestrator.kill, self.target, dry_run=True, fault=model.KILL
                )
                detail += f"; {result.detail}"
            result = model.KillResult(model.KillOutcome.DRY_RUN, now, detail)
            return list(self.engine.on_kill_result(result))
        try:
            armed_at = self.storage.arm(spec.mode, spec.during, spec.latency)
        except DrillError as exc:
            result = model.KillResult(model.KillOutcome.UNCONFIRMED, now, str(exc))
            return list(self.engine.on_kill_result(result))
        result = model.KillResult(model.KillOutcome.KILLED, armed_at, f"{what} is armed")
        if load:
            self._killed.add(self.target.instance_id)
            kill = self._attempt(
                self.orchestrator.kill, self.target, dry_run=False, fault=model.KILL
            )
            result = replace(kill, detail=f"{what} is armed; {kill.detail}")
        return list(self.engine.on_kill_result(result))

    def _lift_storage(self, action: RestoreTarget) -> list[Action]:
        """Lift the fault, then read back the files the engine names (the audit)."""
        self._note("restore", f"lifting the storage fault: {action.why}")
        layer = self.storage
        if layer is None:
            return []
        lifted = layer.lift()
        actions: list[Action] = []
        for event in layer.events():  # what the layer saw before it was lifted comes first
            actions += self.engine.on_storage_event(event)
        record = self.engine.storage_record
        if record is not None:
            for event in layer.audit(record.audit_plan()):
                actions += self.engine.on_storage_event(event)
        outcome = model.KillOutcome.KILLED if lifted is not None else model.KillOutcome.UNCONFIRMED
        result = model.KillResult(outcome, lifted or self.clock.now(), f"lifted: {action.why}")
        return actions + list(self.engine.on_restore_result(result))

    def _restore(self, action: RestoreTarget) -> list[Action]:
        """End the fault on the node (the link back up); cleanup does it again anyway."""
        assert self.node is not None
        assert isinstance(self.orchestrator, NodeFaults)
        self._note("restore", f"restoring {self.node.describe()}: {action.why}")
        result = self._attempt(self.orchestrator.restore_node, self.node)
        return list(self.engine.on_restore_result(result))

    def _already_gone(self, detail: str) -> list[Action]:
        """The engine's answer to a target that is not there to hit (nothing was)."""
        return list(
            self.engine.on_kill_result(
                model.KillResult(model.KillOutcome.ALREADY_GONE, self.clock.now(), detail)
            )
        )

    def _attempt(
        self, hit: Callable[_P, model.KillResult], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> model.KillResult:
        """The backend's answer to a fault call; UNCONFIRMED with the error it raised
        instead (the call may have hit before it failed)."""
        try:
            return hit(*args, **kwargs)
        except DrillError as exc:
            return model.KillResult(model.KillOutcome.UNCONFIRMED, self.clock.now(), str(exc))

    def _target_for(self, action: KillTarget) -> model.Worker | None:
        """The instance to hit: the discovered one first; after that, the rank's current one.

        A later kill never reuses an instance already killed (a stale view after a
        recovery must not make the drill hit the same, or no, process twice).
        """
        assert self.target is not None
        rank = self.target.rank if action.rank is None else action.rank
        if action.index == 1 and rank == self.target.rank:
            return self.target
        current = self.orchestrator.current_worker(rank)
        if current is None or current.instance_id in self._killed:
            return None
        return current

    def _record(self, event: model.TrainingEvent) -> None:
        """Keep the event for the costs and the report, within bounds: what the job prints
        must not grow the drill's memory (the engine is capped the same way)."""
        progress = event.kind is model.TrainingEventKind.PROGRESS
        if progress and event.step is not None:
            self.progress.add((event.timestamp, event.incarnation, event.step))
        kept = self._raw_progress if progress else len(self.raw_log) - self._raw_progress
        if kept >= (MAX_RAW_PROGRESS if progress else MAX_RAW_OTHER):
            self.raw_dropped += 1
        else:
            self._raw_progress += progress
            row: dict[str, Any] = {
                "time": event.timestamp,
                "received": event.received,
                "event": event.kind.value,
                "step": event.step,
                "inc": event.incarnation,
                "rank": event.rank,
            }
            # recovery: live's fields, only where a line carried them
            extra = {"replica": event.replica, "source": event.source, "peer": event.peer}
            row.update({k: v for k, v in extra.items() if v is not None})
            self.raw_log.append(row)

    def _sync_phase(self, message: str | None = None) -> None:
        """Show the engine's phase when it changed, else a fresh status line now and then."""
        phase = self.engine.phase
        changed = phase is not self._shown_phase
        self._shown_phase = phase
        if changed or message is not None:
            self._status(message or self.engine.status(self.clock.now()), phase_changed=True)
        elif self.clock.now() - self._last_status >= self.options.status_interval:
            self._status(self.engine.status(self.clock.now()))

    def _wait(self) -> None:
        timeout = self.options.poll_interval
        deadline = self.engine.deadline
        if deadline is not None:
            timeout = min(timeout, max(deadline - self.clock.now(), 0.0))
        self.clock.wait(timeout)

    def _status(self, message: str, *, phase_changed: bool = False) -> None:
        now = self.clock.now()
        self._last_status = now
        if phase_changed:
            self._note(f"phase:{self.phase.name.lower()}", message)
        observer = self.options.observer
        if observer is None:
            return
        kill = self.engine.kill_time
        observer(
            Status(
                phase=self.phase,
                message=message,
                elapsed=now - self.started,
                step=self.engine.current_step,
                since_kill=None if kill is None else now - kill,
                max_recovery_time=self.config.expectations.max_recovery_time,
                phase_changed=phase_changed,
            )
        )

    def _note(self, kind: str, detail: str) -> None:
        self.engine.note(self.clock.now(), kind, detail)

    def _abort(self, verdict: Verdict, message: str) -> DrillResult:
        return self.engine.abort(self.clock.now(), verdict, message)

    @cleanup_once
    def _cleanup(self) -> str | None:
        """Close the source and clean the backend up, once; return the failure, if any."""
        errors: list[str] = []
        with _signals_deferred():
            if self.poison is not None:  # no incarnation dies at the step from now on
                try:
                    problem = self.poison.close()
                except OSError as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                if problem is not None:
                    errors.append(f"the poison: {problem}")
            if self.storage is not None:  # a stalled job is let go before anything else
                try:
                    self.storage.lift()
                except Exception as exc:
                    errors.append(f"lifting the storage fault: {exc}")
            if self.source is not None:
                try:
                    self.source.close()
                except Exception as exc:
                    errors.append(f"closing the event source: {exc}")
            try:
                self.orchestrator.cleanup()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            if self.storage is not None:
                try:
                    problem = self.storage.close()
                except Exception as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                if problem is not None:
                    errors.append(f"the storage layer: {problem}")
                for note in self.storage.notes:
                    self._note("cleanup", note)
        if self.lock is not None:
            self.lock.release()
        self._note("cleanup", "; ".join(errors) or "done")
        return "; ".join(errors) or None

    def _finalize(self, result: DrillResult) -> DrillResult:
        self._take_notices()
        malformed = self.source.malformed_lines if self.source is not None else 0
        timeline = tuple(sorted(self.engine.timeline_entries(), key=lambda e: e.timestamp))
        from pytest_recoverygate.engine.costs import measure

        costs = measure(
            self.progress.points(),
            [(step, at) for step, at, _ in result.checkpoints],
            result.saves,
            result.recoveries,
            [inc for _, _, inc in result.checkpoints],
        )
        notes = result.notes
        if self.raw_dropped:
            notes += (
                f"{self.raw_dropped} event line(s) past the drill's bounds on what it keeps "
                f"({MAX_RAW_PROGRESS:,} progress lines, {MAX_RAW_OTHER:,} others) are not in "
                "events.jsonl; the verdict saw every line",
            )
        if self.progress.stride > 1:
            notes += (
                f"the progress kept for the costs and the picture is every line of the "
                f"last {ProgressRecord.RECENT:,} and every {self.progress.stride}th before "
                f"them ({self.progress.seen:,} lines in all)",
            )
        result = replace(
            result,
            target=self.target,
            timeline=timeline,
            malformed_lines=malformed,
            progress=self.progress.points(),
            costs=costs.as_dict(),
            notes=notes,
        )
        self._status(f"{result.verdict.value}: {result.summary}", phase_changed=True)
        return result


#: The most event rows of each kind the runner keeps for events.jsonl (the rest counted).
MAX_RAW_PROGRESS = 100_000
MAX_RAW_OTHER = 200_000  # above what the engine holds: 3 x 50,000 checkpoint lines, starts


class ProgressRecord:
    """The progress lines a drill keeps for its costs and its picture, in bounded memory:
    every line of the last :data:`RECENT`, and of those before them every ``stride``-th,
    at most :data:`HISTORY` (when the history is full, every other one is dropped and the
    stride doubles). The costs take time per step over the span between two kept lines,
    so a sparser history averages more steps per sample; it biases nothing."""

    RECENT = 32_768
    HISTORY = 32_768

    def __init__(self) -> None:
        self._recent: deque[tuple[float, str, int]] = deque()
        self._history: list[tuple[float, str, int]] = []
        self.stride = 1
        self.seen = 0
        self._aged = 0  # lines that left the recent window so far

    def add(self, point: tuple[float, str, int]) -> None:
        self.seen += 1
        self._recent.append(point)
        if len(self._recent) <= self.RECENT:
            return
        old = self._recent.popleft()
        if self._aged % self.stride == 0:
            self._history.append(old)
            if len(self._history) >= self.HISTORY:
                del self._history[1::2]
                self.stride *= 2
        self._aged += 1

    def points(self) -> tuple[tuple[float, str, int], ...]:
        """The kept lines, in the order they came."""
        return (*self._history, *self._recent)

    def __len__(self) -> int:
        return len(self._history) + len(self._recent)


def _discovery_error(message: str) -> DrillError:
    from pytest_recoverygate.errors import DiscoveryError

    return DiscoveryError(message)


def _usage_declined(target: model.Worker) -> DrillError:
    return DrillError(f"the kill of {target.describe()} was not confirmed; nothing was killed")


# ---------------------------------------------------------------------- signals


@contextlib.contextmanager
def _signals_raise_interrupt(enabled: bool) -> Iterator[None]:
    """SIGTERM (and SIGINT) raise DrillInterrupted in the main thread while a drill runs."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if _deferred.active:
            _deferred.pending = signal.Signals(signum).name
            return
        raise DrillInterrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class _Deferred:
    active = False
    pending: str | None = None


_deferred = _Deferred()


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold signals while cleanup runs, so a second Ctrl-C cannot cut cleanup short."""
    _deferred.active = True
    try:
        yield
    finally:
        _deferred.active = False
        if _deferred.pending is not None:
            print(
                f"recoverygate: {_deferred.pending} received during cleanup; "
                "cleanup finished first",
                file=sys.stderr,
            )
            _deferred.pending = None
