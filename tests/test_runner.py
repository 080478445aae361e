"""The runner, driven through the fake backend on a simulated clock.

We test these aspects:
- each verdict the fake job can produce, with the figures the report needs;
- cleanup: for every phase of the drill and every way out of it (verdict, backend
  exception, event-source exception, Ctrl-C, SIGTERM) cleanup runs exactly once, the
  event source is closed, no thread is left and the exit code is right. The table
  below is the proof; each row is one (phase, way out) pair;
- confirmation: a kill nobody can confirm is refused before anything is touched;
- dry run: the flow runs to the kill, and the kill is only checked.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

from pytest_recoverygate.config.loading import DrillConfig
from pytest_recoverygate.engine.machine import FailureReason, Phase, Verdict
from pytest_recoverygate.engine.model import KillOutcome, Worker, Workload
from pytest_recoverygate.errors import BackendError, DrillInterrupted, UsageError
from pytest_recoverygate.orchestrators.fake import FakeOrchestrator, FakeWorkload
from pytest_recoverygate.registry.seams import Orchestrator, SimulatedClock
from pytest_recoverygate.runner import RunOptions, Status, run_drill

ConfigFactory = Callable[..., DrillConfig]


def fake(clock: SimulatedClock, config: DrillConfig, **kw: Any) -> FakeOrchestrator:
    workload = config.workload
    assert isinstance(workload, FakeWorkload)
    spec = workload.fake
    params: dict[str, Any] = {
        "workers": spec.workers,
        "steps_per_second": spec.steps_per_second,
        "checkpoint_every": spec.checkpoint_every,
        "restart_delay": spec.restart_delay,
        "resume": spec.resume,
    }
    params.update(kw)
    return FakeOrchestrator(clock=clock, **params)


def test_the_fake_backend_satisfies_the_orchestrator_protocol() -> None:
    _: Orchestrator = FakeOrchestrator(clock=SimulatedClock())
    assert isinstance(_, Orchestrator)


@pytest.mark.parametrize(
    ("resume", "delay", "verdict", "reason"),
    [
        ("latest", "500ms", Verdict.PASS, None),
        ("zero", "500ms", Verdict.FAIL, FailureReason.RESTARTED_FROM_SCRATCH),
        ("older", "500ms", Verdict.FAIL, FailureReason.RESUMED_FROM_OLDER_CHECKPOINT),
        ("never", "500ms", Verdict.FAIL, FailureReason.NEVER_CAME_BACK),
        ("latest", "3s", Verdict.FAIL, FailureReason.TOO_SLOW),
    ],
)
def test_a_simulated_drill_reaches_the_verdict_the_job_deserves(
    fake_config: ConfigFactory,
    resume: str,
    delay: str,
    verdict: Verdict,
    reason: FailureReason | None,
) -> None:
    config = fake_config({"workload": {"fake": {"resume": resume, "restartDelay": delay}}})
    clock = SimulatedClock()
    result = run_drill(config, clock=clock, orchestrator=fake(clock, config))
    assert result.verdict is verdict, result.summary
    if reason is None:
        assert result.reasons == ()
    else:  # the named reason comes first; losing the steps since may follow
        assert result.reasons[0] is reason
    assert result.target is not None
    assert result.target.rank == 1
    assert result.trigger_checkpoint == 40


def test_a_passing_drill_reports_its_figures(fake_config: ConfigFactory) -> None:
    config = fake_config()
    clock = SimulatedClock()
    backend = fake(clock, config)
    result = run_drill(config, clock=clock, orchestrator=backend)
    assert result.verdict is Verdict.PASS
    assert (result.resume_step, result.expected_resume_step) == (40, 40)
    # restartDelay 0.5 s + checkpoint load 0.05 s + one step at 100 steps/s.
    assert result.recovery_time_seconds == pytest.approx(0.56, abs=0.005)
    assert result.restarts == 1
    assert [dry for _, dry in backend.kills] == [False]
    assert backend.cleanups == 1


def test_a_dry_run_checks_the_kill_and_kills_nothing(fake_config: ConfigFactory) -> None:
    config = fake_config()
    clock = SimulatedClock()
    backend = fake(clock, config)
    result = run_drill(config, RunOptions(dry_run=True), clock=clock, orchestrator=backend)
    assert result.verdict is Verdict.DRY_RUN
    assert result.exit_code == 0
    assert [dry for _, dry in backend.kills] == [True]
    assert backend._incarnations[-1].killed_at is None


def test_an_unconfirmed_kill_is_refused_before_anything_is_touched(
    fake_config: ConfigFactory,
) -> None:
    config = fake_config({"safety": {"requireConfirm": True}})
    clock = SimulatedClock()
    backend = fake(clock, config)
    with pytest.raises(UsageError, match=r"requireConfirm.*--yes"):
        run_drill(config, RunOptions(), clock=clock, orchestrator=backend)
    assert backend.kills == []
    assert backend._incarnations == []  # not even discovered


def test_a_declined_confirmation_kills_nothing(fake_config: ConfigFactory) -> None:
    config = fake_config({"safety": {"requireConfirm": True}})
    clock = SimulatedClock()
    backend = fake(clock, config)
    asked = []

    def decline(target: Worker, workload: Workload) -> bool:
        asked.append(target)
        return False

    options = RunOptions(confirm=decline)
    result = run_drill(config, options, clock=clock, orchestrator=backend)
    assert result.verdict is Verdict.ERROR
    assert "not confirmed" in result.summary
    assert [w.rank for w in asked] == [1]
    assert backend.kills == []
    assert backend.cleanups == 1


def test_a_kill_that_cannot_be_confirmed_is_an_error_not_a_verdict(
    fake_config: ConfigFactory,
) -> None:
    config = fake_config()
    clock = SimulatedClock()
    backend = fake(clock, config, kill_outcome=KillOutcome.UNCONFIRMED)
    result = run_drill(config, clock=clock, orchestrator=backend)
    assert result.verdict is Verdict.ERROR
    assert len(backend.kills) == 1


def test_a_missing_target_rank_is_an_error(fake_config: ConfigFactory) -> None:
    config = fake_config({"injectFailure": {"targetRank": 7}, "workload": {"fake": {"workers": 8}}})
    clock = SimulatedClock()
    backend = fake(clock, config, workers=2)  # the job is smaller than the config says
    result = run_drill(config, clock=clock, orchestrator=backend)
    assert result.verdict is Verdict.ERROR
    assert "target rank 7 is not among the workers" in result.summary
    assert "ranks present: 0, 1" in result.summary
    assert backend.kills == []


# ------------------------------------------------------------ cleanup table

PHASES = [
    Phase.DISCOVERING,
    Phase.WAITING_FOR_CHECKPOINT,
    Phase.KILLING,
    Phase.RECOVERING,
    Phase.VERIFYING,
]
# way out -> (exit code, raises DrillInterrupted)
WAYS_OUT = {
    "orchestrator-exception": 3,
    "event-source-exception": 3,
    "drill-error": 3,
    "ctrl-c": 130,
    "sigterm": 130,
}


class Injector:
    """An observer that strikes once, when the drill enters ``phase``."""

    def __init__(self, phase: Phase, way: str, backend: FakeOrchestrator) -> None:
        self.phase, self.way, self.backend = phase, way, backend
        self.struck = False

    def __call__(self, status: Status) -> None:
        if self.struck or status.phase is not self.phase or not status.phase_changed:
            return
        self.struck = True
        if self.way == "ctrl-c":
            raise KeyboardInterrupt
        if self.way == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            return
        error: BaseException = (
            BackendError("the backend broke") if self.way == "drill-error" else RuntimeError("boom")
        )
        if self.phase is Phase.KILLING:
            # The observer runs just before the kill call: break the kill itself.
            self.backend.raise_in["kill"] = error
        elif self.way == "event-source-exception":
            self.backend.raise_in["poll"] = error
        else:
            raise error


@pytest.mark.parametrize("way", list(WAYS_OUT))
@pytest.mark.parametrize("phase", PHASES, ids=lambda p: p.name.lower())
def test_cleanup_runs_once_on_every_way_out_of_every_phase(
    fake_config: ConfigFactory,
    phase: Phase,
    way: str,
) -> None:
    config = fake_config()
    clock = SimulatedClock()
    # Slow steps, no start or checkpoint_loaded lines: the drill learns the stride from
    # the replacement's second line, so it visibly passes through VERIFYING.
    backend = fake(clock, config, start_events=False, loaded_events=False, steps_per_second=5)
    injector = Injector(phase, way, backend)
    threads_before = set(threading.enumerate())
    options = RunOptions(observer=injector)
    exit_code: int
    try:
        result = run_drill(config, options, clock=clock, orchestrator=backend)
        exit_code = result.exit_code
    except DrillInterrupted as exc:
        exit_code = 130
        assert exc.result is not None
    assert injector.struck, f"the drill never entered {phase}"
    assert backend.cleanups == 1
    assert backend.events().closed
    assert set(threading.enumerate()) <= threads_before
    want = WAYS_OUT[way]
    if phase is Phase.KILLING and way in ("orchestrator-exception", "drill-error"):
        want = 3  # a kill that raised is unconfirmed: ERROR, never PASS or FAIL
    assert exit_code == want
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize(
    ("resume", "exit_code"),
    [("latest", 0), ("zero", 1), ("never", 1)],
)
def test_cleanup_runs_once_when_the_drill_ends_with_a_verdict(
    fake_config: ConfigFactory,
    resume: str,
    exit_code: int,
) -> None:
    config = fake_config({"workload": {"fake": {"resume": resume}}})
    clock = SimulatedClock()
    backend = fake(clock, config)
    result = run_drill(config, clock=clock, orchestrator=backend)
    assert result.exit_code == exit_code
    assert backend.cleanups == 1


def test_a_failing_cleanup_turns_a_pass_into_an_error(fake_config: ConfigFactory) -> None:
    config = fake_config()
    clock = SimulatedClock()
    backend = fake(clock, config, raise_in={"cleanup": RuntimeError("could not reap pid 42")})
    result = run_drill(config, clock=clock, orchestrator=backend)
    assert result.verdict is Verdict.ERROR
    assert "cleanup failed: RuntimeError: could not reap pid 42" in result.summary


# ------------------------------------------------------------------ StorageFault's scope


class ScopedFake(FakeOrchestrator):
    """The fake job, with the StorageScope seam answering ``scope`` (or refusing)."""

    def __init__(self, scope: tuple[Any, ...] | str, **kw: Any) -> None:
        super().__init__(**kw)
        self.scope = scope
        self.asked: list[Worker] = []
        self.mounts: list[bool] = []  # what each ask said of a mount

    def storage_scope(self, target: Worker, *, mount: bool = True) -> tuple[Any, ...]:
        from pytest_recoverygate.errors import DiscoveryError

        self.asked.append(target)
        self.mounts.append(mount)
        if isinstance(self.scope, str):
            raise DiscoveryError(self.scope)
        return self.scope


@pytest.mark.parametrize(
    ("scope", "words"),
    [
        (None, "cannot show which folders the job uses"),
        ((), "lies outside what the job can be shown to use"),
        ("its processes run in a mount namespace of their own", "mount namespace of their own"),
    ],
    ids=["no seam", "outside", "refused"],
)
def test_a_storage_fault_the_running_job_does_not_scope_is_refused_before_any_mount(
    tmp_path: Any, scope: Any, words: str
) -> None:
    """A backend whose config cannot scope the job (slurm): the runner asks the backend
    after discovery, and refuses (ERROR, exit 3) before the layer is mounted or anything
    is hit."""
    from pytest_recoverygate.config.loading import parse_config
    from pytest_recoverygate.storage.layer import our_mounts

    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = parse_config(
        "workload:\n  orchestrator: slurm\n  jobId: 7\ninjectFailure:\n  type: StorageFault\n"
        f"  mode: eio\n  path: {folder}\n  afterCheckpoint: step-40\nexpectations:\n"
        "  maxRecoveryTime: 60s\nsafety:\n  requireConfirm: false\n",
        tmp_path / "drill.yaml",
    )
    clock = SimulatedClock()
    backend = FakeOrchestrator(clock=clock) if scope is None else ScopedFake(scope, clock=clock)
    result = run_drill(config, RunOptions(handle_signals=False), clock=clock, orchestrator=backend)
    assert result.verdict is Verdict.ERROR and result.exit_code == 3, result.summary
    assert words in result.summary, result.summary
    assert not any(e.kind == "storage" for e in result.timeline), result.timeline
    assert not [t for t, _ in our_mounts() if t == str(folder)]
    assert backend.kills == []
    if isinstance(backend, ScopedFake):
        assert [w.rank for w in backend.asked] == [1]


def test_a_storage_fault_in_what_the_running_job_shows_passes_the_scope_check(
    tmp_path: Any,
) -> None:
    """The path inside the scope: the runner goes on (a dry run mounts nothing)."""
    from pytest_recoverygate.config.loading import parse_config

    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = parse_config(
        "workload:\n  orchestrator: slurm\n  jobId: 7\ninjectFailure:\n  type: StorageFault\n"
        f"  mode: eio\n  path: {folder}\n  afterCheckpoint: step-40\nexpectations:\n"
        "  maxRecoveryTime: 60s\nsafety:\n  requireConfirm: false\n  dryRun: true\n",
        tmp_path / "drill.yaml",
    )
    clock = SimulatedClock()
    backend = ScopedFake((tmp_path.resolve(),), clock=clock)
    result = run_drill(config, RunOptions(handle_signals=False), clock=clock, orchestrator=backend)
    assert "would arm the eio fault" in " ".join(e.detail for e in result.timeline), result.summary
    assert [w.rank for w in backend.asked] == [1]
    assert backend.mounts == [True]


STICKY_CHECKPOINT = (
    "workload:\n  orchestrator: slurm\n  jobId: 7\ninjectFailure:\n  type: StickyFault\n"
    "  scope: checkpoint\n  path: {folder}\n  afterCheckpoint: step-40\nexpectations:\n"
    "  maxRecoveryTime: 60s\nsafety:\n  requireConfirm: false\n"
)


def test_a_damage_path_the_running_job_does_not_show_is_refused_before_anything_is_hit(
    tmp_path: Any,
) -> None:
    """StickyFault scope checkpoint on a job the config cannot scope (slurm): the backend
    is asked after discovery, without a mount check (nothing is mounted), and a path
    outside what it shows is refused (ERROR, exit 3): nothing damaged, nothing killed."""
    from pytest_recoverygate.config.loading import parse_config

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "step-40.pt").write_bytes(b"x" * 64)
    config = parse_config(STICKY_CHECKPOINT.format(folder=folder), tmp_path / "drill.yaml")
    clock = SimulatedClock()
    backend = ScopedFake((tmp_path.resolve() / "elsewhere",), clock=clock)
    result = run_drill(config, RunOptions(handle_signals=False), clock=clock, orchestrator=backend)
    assert result.verdict is Verdict.ERROR and result.exit_code == 3, result.summary
    assert "StickyFault: path" in result.summary and "nothing was damaged" in result.summary
    assert backend.mounts == [False]
    assert backend.kills == []
    assert (folder / "step-40.pt").read_bytes() == b"x" * 64


def test_a_damage_path_the_running_job_shows_passes_the_scope_check(tmp_path: Any) -> None:
    from pytest_recoverygate.config.loading import parse_config

    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = parse_config(STICKY_CHECKPOINT.format(folder=folder), tmp_path / "drill.yaml")
    clock = SimulatedClock()
    backend = ScopedFake((tmp_path.resolve(),), clock=clock)
    result = run_drill(config, RunOptions(handle_signals=False), clock=clock, orchestrator=backend)
    assert "lies outside" not in result.summary, result.summary
    assert backend.mounts == [False]
