"""The runner's part of the faults at rest: StorageFault's layer over the job's
checkpoint folder (mounted, armed, lifted, audited) and StickyFault's poison (armed at the
trigger), damage (the trigger checkpoint's files written over, then the kill) and bad node
(the backend's watcher over it, from the trigger on).

:class:`AtRest` is a base of the runner's drill: it acts through the drill's engine door,
backend and clock, and leaves the cleanup (lift, unmount, remove the poison) to the
drill's one cleanup.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_recoverygate.engine import model
from pytest_recoverygate.engine.machine import DrillEngine, Finish, KillTarget, RestoreTarget
from pytest_recoverygate.errors import DiscoveryError, DrillError
from pytest_recoverygate.links import docs_link
from pytest_recoverygate.registry.seams import Clock, Orchestrator, StickyNodes, StorageScope
from pytest_recoverygate.storage.damage import damage, files_written
from pytest_recoverygate.storage.layer import StorageLayer
from pytest_recoverygate.storage.poison import Poison

if TYPE_CHECKING:
    from pytest_recoverygate.config.schema import DrillConfig
    from pytest_recoverygate.transcript.record import EngineDoor

__all__ = ["AtRest", "poison_for"]

Action = KillTarget | RestoreTarget | Finish


def poison_for(config: DrillConfig, dry_run: bool) -> Poison | None:
    """StickyFault ``scope: step``: the poison the job's environment names (armed at the
    trigger, removed at cleanup); None for any other drill, and in a dry run."""
    failure = config.inject_failure
    if (
        failure.type != "StickyFault"
        or failure.scope != "step"
        or failure.at_step is None
        or dry_run
    ):
        return None
    return Poison(failure.rank_for(config.workload.reporting_rank), failure.at_step)


class AtRest:
    """The faults at rest of one drill (see the module docstring)."""

    config: DrillConfig
    clock: Clock
    orchestrator: Orchestrator
    engine: DrillEngine
    door: EngineDoor
    dry_run: bool
    target: model.Worker | None
    storage: StorageLayer | None
    poison: Poison | None
    _killed: set[str]

    if TYPE_CHECKING:  # the drill's own

        def _sync_phase(self, message: str | None = None) -> None: ...
        def _note(self, kind: str, detail: str) -> None: ...
        def _attempt(
            self, hit: Callable[..., model.KillResult], /, *args: Any, **kwargs: Any
        ) -> model.KillResult: ...

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
            return list(self.door.on_kill_result(
                model.KillResult(model.KillOutcome.DRY_RUN, now, detail)))  # fmt: skip
        try:
            armed_at = self.poison.arm()
        except OSError as exc:
            result = model.KillResult(
                model.KillOutcome.UNCONFIRMED, now, f"the poison could not be armed: {exc}"
            )
            return list(self.door.on_kill_result(result))
        detail = f"{what} is poisoned (the reporter ends each incarnation that reports it)"
        return list(
            self.door.on_kill_result(model.KillResult(model.KillOutcome.KILLED, armed_at, detail))
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
            return list(self.door.on_kill_result(
                model.KillResult(model.KillOutcome.DRY_RUN, now, detail)))  # fmt: skip
        self._sync_phase(f"checkpoint step {step} reached; damaging ({spec.damage}) {listed}")
        try:
            done = damage(folder, [name for name, _ in names], spec.damage)
        except OSError as exc:
            return self._not_damaged(f"damaging {folder} failed ({exc}); see the timeline")
        if not done:
            return self._not_damaged(f"none of {listed} could be damaged (gone, or a link)")
        self.door.sticky_damaged(step, tuple(d.describe() for d in done), self.clock.now())
        return None

    def _sticky_node_scope(self) -> None:
        """``scope: node`` needs a backend that can keep a node bad (StickyNodes);
        DiscoveryError otherwise, before anything is hit."""
        failure = self.config.inject_failure
        if failure.type == "StickyFault" and not isinstance(self.orchestrator, StickyNodes):
            raise _discovery_error(
                f"StickyFault scope: node needs a backend that can keep a node bad, and "
                f"orchestrator {self.orchestrator.name} implements no make_node_bad "
                f"({docs_link('faults.md')}); use scope: step"
            )

    def _make_node_bad(self, action: KillTarget, node: model.Node) -> list[Action]:
        """``scope: node``: the node stays bad from now on: the backend's watcher kills or
        stops every job process placed there until the drill ends (its cleanup)."""
        spec = self.engine.spec.sticky
        assert spec is not None
        assert isinstance(self.orchestrator, StickyNodes)
        verb = "checking what would make bad" if self.dry_run else "making bad for good"
        self._sync_phase(
            f"checkpoint step {action.checkpoint_step} reached; {verb} {node.describe()}"
            + (f" (kill {action.index})" if action.index > 1 else "")
        )
        result = self._attempt(
            self.orchestrator.make_node_bad,
            node,
            dry_run=self.dry_run,
            mode=spec.mode,
            after=spec.after,
        )
        return list(self.door.on_kill_result(result))

    def _not_damaged(self, detail: str) -> list[Action]:
        result = model.KillResult(model.KillOutcome.UNCONFIRMED, self.clock.now(), detail)
        return list(self.door.on_kill_result(result))

    def _already_gone(self, detail: str) -> list[Action]:
        """The engine's answer to a target that is not there to hit (nothing was)."""
        return list(
            self.door.on_kill_result(
                model.KillResult(model.KillOutcome.ALREADY_GONE, self.clock.now(), detail)
            )
        )

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
        self.door.storage_mounted(self.clock.now())
        self._note("storage", f"storage layer mounted over {layer.folder} ({layer.fsname})")

    def _storage_scope(self, target: model.Worker) -> None:
        """A StorageFault, or a StickyFault ``scope: checkpoint``, on a job the config
        cannot scope (one the backend attaches to): its ``path`` must lie in a folder the
        running job can be shown to use, and for a StorageFault the target's processes
        must see a mount made here. DiscoveryError otherwise, before anything is mounted,
        damaged or hit."""
        spec = self.engine.spec
        sticky = spec.sticky is not None and spec.sticky.scope == "checkpoint"
        if spec.storage is None and not sticky:
            return
        fault = "StickyFault" if sticky else "StorageFault"
        path_given = (
            spec.storage.path if spec.storage is not None else self.config.inject_failure.path
        )
        untouched = "nothing was damaged" if sticky else "nothing was mounted"
        name = self.orchestrator.name
        if not isinstance(self.orchestrator, StorageScope):
            raise _discovery_error(
                f"{fault} on {path_given}: orchestrator {name} cannot show which folders "
                "the job uses (its workload section names none, and the backend reads none "
                f"from the running job: no storage_scope, {docs_link('backends.md')}); "
                f"{untouched}"
            )
        scope = self.orchestrator.storage_scope(target, mount=not sticky)
        path = Path(os.path.realpath(str(path_given)))
        if any(path == folder or folder in path.parents for folder in scope):
            return
        shown = ", ".join(str(folder) for folder in scope[:4]) or "none"
        raise _discovery_error(
            f"{fault}: path {path_given} lies outside what the job can be shown to use "
            f"(as {name} shows it: {shown}); point injectFailure.path at the folder the job "
            f"saves its checkpoints in; {untouched}"
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
            return list(self.door.on_kill_result(result))
        try:
            armed_at = self.storage.arm(spec.mode, spec.during, spec.latency)
        except DrillError as exc:
            result = model.KillResult(model.KillOutcome.UNCONFIRMED, now, str(exc))
            return list(self.door.on_kill_result(result))
        result = model.KillResult(model.KillOutcome.KILLED, armed_at, f"{what} is armed")
        if load:
            self._killed.add(self.target.instance_id)
            kill = self._attempt(
                self.orchestrator.kill, self.target, dry_run=False, fault=model.KILL
            )
            result = replace(kill, detail=f"{what} is armed; {kill.detail}")
        return list(self.door.on_kill_result(result))

    def _lift_storage(self, action: RestoreTarget) -> list[Action]:
        """Lift the fault, then read back the files the engine names (the audit)."""
        self._note("restore", f"lifting the storage fault: {action.why}")
        layer = self.storage
        if layer is None:
            return []
        lifted = layer.lift()
        actions: list[Action] = []
        for event in layer.events():  # what the layer saw before it was lifted comes first
            actions += self.door.on_storage_event(event)
        record = self.engine.storage_record
        if record is not None:
            for event in layer.audit(record.audit_plan()):
                actions += self.door.on_storage_event(event)
        outcome = model.KillOutcome.KILLED if lifted is not None else model.KillOutcome.UNCONFIRMED
        result = model.KillResult(outcome, lifted or self.clock.now(), f"lifted: {action.why}")
        return actions + list(self.door.on_restore_result(result))


def _discovery_error(message: str) -> DrillError:
    return DiscoveryError(message)
