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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec

from pytest_recoverygate.atrest import AtRest, poison_for
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
    cleanup_once,
)
from pytest_recoverygate.shared.lock import DrillLock, job_lock
from pytest_recoverygate.storage.layer import StorageLayer
from pytest_recoverygate.storage.poison import Poison
from pytest_recoverygate.transcript import outcome
from pytest_recoverygate.transcript.outcome import (
    MAX_RAW_OTHER,
    MAX_RAW_PROGRESS,
    EventLog,
    EvidenceView,
    ProgressRecord,
    finished,
    with_cleanup_error,
)
from pytest_recoverygate.transcript.record import EngineDoor, Recorder

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
    poison = poison_for(config, options.dry_run or config.safety.dry_run)
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
    result = unmatched_evidence(result, config, drill.log.rows)
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
                drill.log.rows,
                evidence=evidence,
                transcript=None if drill.recorder is None else drill.recorder.text(),
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


def _keep_evidence(
    result: DrillResult, config: DrillConfig, options: RunOptions, orchestrator: Orchestrator
) -> Evidence:
    """After cleanup: the job's own output and the diagnoses, handed to ``on_evidence``."""
    from pytest_recoverygate.report.evidence import gather_evidence

    evidence = gather_evidence(result, orchestrator, config)
    if options.on_evidence is not None:
        options.on_evidence(evidence)
    return evidence


def unmatched_evidence(
    result: DrillResult, config: DrillConfig, raw_log: list[dict[str, Any]]
) -> DrillResult:
    """A drill with an ``evidence`` section: what pod-log evidence lacks and the patterns
    no line matched (:func:`pytest_recoverygate.transcript.outcome.unmatched_evidence`)."""
    return outcome.unmatched_evidence(result, EvidenceView.of(config), raw_log)


#: Lines stamped this long before the job's launch are still taken as its own (the
#: reporter stamps a process's start at the end of its 10 ms start tick; clocks step).
NOT_BEFORE_SLACK = 0.25


class _Drill(AtRest):
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
        self.engine = DrillEngine(spec_from_config(config), self.started)  # read, never fed
        # Every input goes through the door, recorded for transcript.jsonl when a report
        # folder is written (recoverygate rejudge replays it).
        self.recorder = (
            None
            if options.report_dir is None
            else Recorder(self.engine.spec, self.started, context=_context(config, self.dry_run))
        )
        self.door = EngineDoor(self.engine, self.recorder)
        self.target: model.Worker | None = None
        self.node: model.Node | None = None  # node faults: the node hit (or to hit)
        self._killed: set[str] = set()  # instance ids hit so far: never twice
        self._killed_nodes: set[str] = set()  # node identities a KillNode hit: never twice
        self.source: EventSource | None = None
        self.log = EventLog()  # the events kept for events.jsonl and the costs
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
            self._note("exception", traceback.format_exc(limit=8))
            result = self._abort(
                Verdict.ERROR, f"the drill failed in phase '{self.phase.value}': {detail}"
            )
        finally:
            cleanup_error = self._cleanup()
        return self._finalize(with_cleanup_error(result, cleanup_error), cleanup_error)

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
        self.door.discovered(
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
            self.log.add(event)
            actions += self.door.on_training_event(event)
        for group_event in self.orchestrator.watch_group():
            actions += self.door.on_group_event(group_event)
        if self.storage is not None:
            for storage_event in self.storage.events():
                actions += self.door.on_storage_event(storage_event)
        self._take_notices()
        actions += self.door.tick(self.clock.now())
        return actions

    def _take_notices(self) -> None:
        """The event source's notices (a job file it refused to read) onto the timeline."""
        if isinstance(self.source, Notices):
            for at, text in self.source.notices():
                self.door.note(at, "refused", text)

    def _target_node(self, workload: model.Workload, target: model.Worker) -> model.Node:
        """The node a node fault hits: ``targetNode``, else the target rank's node."""
        failure = self.config.inject_failure
        if not isinstance(self.orchestrator, NodeFaults):
            raise _discovery_error(
                f"{failure.type} needs a backend that can act on nodes, and "
                f"orchestrator {self.orchestrator.name} implements no current_node/"
                f"kill_node/restore_node ({docs_link('nodes.md')}); use type: KillWorker"
            )
        self._sticky_node_scope()  # StickyFault scope node: a backend that keeps it bad
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
        return list(self.door.on_kill_result(result))

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
        if spec.sticky is not None:  # StickyFault scope node: the node stays bad from now on
            return self._make_node_bad(action, node)
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
        return list(self.door.on_kill_result(result))

    def _restore(self, action: RestoreTarget) -> list[Action]:
        """End the fault on the node (the link back up); cleanup does it again anyway."""
        assert self.node is not None
        assert isinstance(self.orchestrator, NodeFaults)
        self._note("restore", f"restoring {self.node.describe()}: {action.why}")
        result = self._attempt(self.orchestrator.restore_node, self.node)
        return list(self.door.on_restore_result(result))

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
        self.door.note(self.clock.now(), kind, detail)

    def _abort(self, verdict: Verdict, message: str) -> DrillResult:
        return self.door.abort(self.clock.now(), verdict, message)

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

    def _finalize(self, result: DrillResult, cleanup_error: str | None) -> DrillResult:
        self._take_notices()
        malformed = self.source.malformed_lines if self.source is not None else 0
        if self.recorder is not None:  # the transcript's last line: what the runner adds
            self.recorder.end(
                target=self.target, malformed_lines=malformed, cleanup_error=cleanup_error
            )
        result = finished(
            result,
            log=self.log,
            timeline=self.engine.timeline_entries(),
            target=self.target,
            malformed_lines=malformed,
        )
        self._status(f"{result.verdict.value}: {result.summary}", phase_changed=True)
        return result


def _context(config: DrillConfig, dry_run: bool) -> dict[str, Any]:
    """A transcript header's keys from the config: what the report says of the drill."""
    evidence = EvidenceView.of(config)
    return {
        "drill": config.name,
        "config": str(config.source_path),
        "orchestrator": config.workload.orchestrator,
        "dry_run": dry_run,
        "evidence": None if evidence is None else evidence.as_dict(),
    }


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
