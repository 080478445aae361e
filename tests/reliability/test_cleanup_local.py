"""Cleanup on every way out of every phase, for the local backend, with real processes.

We test these aspects, one table row per (phase, way out):
- phases: discovering (right after the job was launched), waiting for the checkpoint,
  killing, recovering, verifying;
- ways out: an exception raised by the orchestrator, one raised by the event source, a
  DrillError from the backend, Ctrl-C, SIGTERM, and pytest-timeout's signal method
  (SIGALRM whose handler raises ``pytest.fail.Exception``, as pytest-timeout does); plus
  the three verdicts (PASS, FAIL, ERROR) as rows of their own;
- after each row: the backend's cleanup ran exactly once, no thread the drill started is
  running, no process of the job is left (every pid seen during the drill is gone, and
  this process -- the drill's subreaper -- has no child left), the drill lock is
  released, and the exit code (or the exception) is the one the contract names;
- then the same through real signals: the CLI and ``pytest --drill-config`` in a child
  process get SIGINT or SIGTERM mid-drill, exit 130 (CLI) or as interrupted (pytest),
  and leave no process of the job behind (orphans included);
- one row with real torchrun and examples/local/train.py, as the proof that the
  stand-in (tests/reliability/standin_job.py) behaves like torchrun where it matters;
- the drill's marker (RECOVERYGATE_DRILL_ID in the job's environment), which cleanup goes
  by: workers started in sessions no scan has seen, by an agent that answers SIGTERM by
  starting one more or that dies or freezes mid-restart, are ended; a process without
  the marker (an unrelated child, an orphan adopted from elsewhere) is never touched.

The job is the torchrun stand-in: an agent and two workers, each in its own session,
reporting through the real reporter, so a row costs about a second instead of the
2-5 s per process that ``import torch`` costs on a small machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import recoverygate
import yaml

from pytest_recoverygate.config.loading import DrillConfig, load_config
from pytest_recoverygate.engine.machine import Phase
from pytest_recoverygate.engine.model import (
    Fault,
    GroupEvent,
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEvent,
    Worker,
    Workload,
)
from pytest_recoverygate.errors import BackendError, DrillInterrupted
from pytest_recoverygate.orchestrators import build_orchestrator
from pytest_recoverygate.orchestrators.local import LocalOrchestrator
from pytest_recoverygate.registry.seams import EventSource, RealClock
from pytest_recoverygate.runner import RunOptions, Status, run_drill
from tests.patience import JOB, PROCESS, PROMPT, deadline, eventually, stays, within
from tests.reliability.conftest import Figures

pytestmark = pytest.mark.local

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STANDIN = HERE / "standin_job.py"
REPORTER_ROOT = str(Path(recoverygate.__file__).resolve().parent.parent)


def local_backend(config: DrillConfig) -> LocalOrchestrator:
    """The local backend a config describes, as the registry builds it for a drill."""
    backend = build_orchestrator(config, RealClock())
    assert isinstance(backend, LocalOrchestrator)
    return backend


def drill_yaml(
    tmp: Path,
    *,
    resume: str = "latest",
    target_rank: int = 1,
    command: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
    checkpoint: str = "step-10",
    resume_pause: float = 0.5,
    standin_args: tuple[str, ...] = (),
    failure: dict[str, Any] | None = None,
    expectations: dict[str, Any] | None = None,
    timeouts: dict[str, str] | None = None,
    spawn_grandchild: bool = True,
) -> Path:
    doc: dict[str, Any] = {
        "name": "cleanup-row",
        "workload": {
            "orchestrator": "local",
            "command": command
            or [
                sys.executable,
                str(STANDIN),
                "--nproc",
                "2",
                "--ckpt",
                str(tmp / "ckpt"),
                "--resume",
                resume,
                *(["--spawn-grandchild"] if spawn_grandchild else []),
                "--resume-pause",
                str(resume_pause),
                *standin_args,
            ],
            "workdir": str(tmp),
            "env": {"PYTHONPATH": os.pathsep.join([REPORTER_ROOT, str(REPO)]), **(extra_env or {})},
        },
        "injectFailure": {
            "type": "KillWorker",
            "afterCheckpoint": checkpoint,
            "targetRank": target_rank,
            **(failure or {}),
        },
        "expectations": {
            "resumeFromCheckpoint": "latest",
            "maxRecoveryTime": "20s",
            "maxLostSteps": 1000,
            "sustain": "3 steps",  # about cleanup, not the sustain window: keep it short
            **(expectations or {}),
        },
        "safety": {"requireConfirm": False},
        "timeouts": {
            "discovery": "30s",
            "checkpoint": "30s",
            "recovery": "20s",
            **(timeouts or {}),
        },
    }
    path = tmp / "recovery-test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class Sabotaged:
    """The real LocalOrchestrator, with one way out armed for one phase.

    Every call goes to the real backend; the only addition is the strike: an exception
    raised (or a signal sent to this process) at the first call made in ``phase``. It
    also records every pid of the job it can see, so leftovers can be looked for.
    """

    def __init__(self, real: LocalOrchestrator, phase: Phase | None, way: str) -> None:
        self.real, self.phase, self.way = real, phase, way
        self.name = real.name
        self.cleanups = 0
        self.cleanup_started: float | None = None  # time.time() when cleanup began
        self.struck = False
        self.current = Phase.DISCOVERING
        self.armed = False  # strike at the next poll whatever the phase (set by kill)
        self.pids: set[tuple[int, float]] = set()
        self._source = _SabotagedSource(self)

    # -- the strike
    def strike(self, where: str) -> None:
        if self.struck or self.way not in WAYS_OUT:
            return
        if self.phase is not self.current and not (self.armed and where == "poll"):
            return
        if self.way == "event-source-exception" and where not in ("poll", "events"):
            return
        if self.way == "orchestrator-exception" and where in ("poll", "events"):
            return
        self.struck = True
        self.note_pids()
        if self.way in ("orchestrator-exception", "event-source-exception"):
            raise RuntimeError(f"injected failure in {where}")
        if self.way == "drill-error":
            raise BackendError(f"injected backend failure in {where}")
        if self.way == "ctrl-c":
            raise KeyboardInterrupt
        if self.way == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            eventually(lambda: False, "SIGTERM's handler interrupting the drill", PROMPT)
        if self.way == "pytest-timeout":
            os.kill(os.getpid(), signal.SIGALRM)
            eventually(lambda: False, "SIGALRM's handler interrupting the drill", PROMPT)

    def note_pids(self) -> None:
        agent = self.real.agent_pid
        if agent is None:
            return
        try:
            root = psutil.Process(agent)
            for proc in [root, *root.children(recursive=True)]:
                self.pids.add((proc.pid, proc.create_time()))
        except psutil.NoSuchProcess:
            pass

    def observe(self, status: Status) -> None:
        self.current = status.phase

    # -- the Orchestrator protocol, delegated
    def discover(self, deadline: float) -> Workload:
        workload = self.real.discover(deadline)
        self.note_pids()
        self.strike("discover")
        return workload

    def kill(self, worker: Worker, *, dry_run: bool, fault: Fault = Fault()) -> KillResult:
        self.note_pids()
        if self.way in ("orchestrator-exception", "drill-error"):
            self.strike("kill")
        result = self.real.kill(worker, dry_run=dry_run, fault=fault)
        self.strike("kill")
        # The source is not read during the kill: its failure comes with the next read.
        self.armed = self.phase is Phase.KILLING and self.way == "event-source-exception"
        return result

    def current_worker(self, rank: int) -> Worker | None:
        return self.real.current_worker(rank)

    def watch_group(self) -> list[GroupEvent]:
        self.strike("watch_group")
        return self.real.watch_group()

    def events(self) -> EventSource:
        self.strike("events")  # the source is opened (once) at the end of discovery
        return self._source

    def cleanup(self) -> None:
        self.cleanups += 1
        if self.cleanup_started is None:
            self.cleanup_started = time.time()
        self.note_pids()
        self.real.cleanup()


class _SabotagedSource:
    def __init__(self, owner: Sabotaged) -> None:
        self.owner = owner

    def poll(self) -> list[TrainingEvent]:
        self.owner.strike("poll")
        return self.owner.real.events().poll()

    @property
    def malformed_lines(self) -> int:
        return self.owner.real.events().malformed_lines

    def close(self) -> None:
        self.owner.real.events().close()


class PytestTimeout(BaseException):
    """Stands for pytest's Failed("Timeout >Ns") in the table's expectations."""


def pytest_timeout_handler(signum: int, frame: Any) -> None:
    """pytest-timeout's signal method: ``pytest.fail("Timeout >%ss")`` from the handler."""
    pytest.fail("Timeout >5.0s (injected, as pytest-timeout's signal method raises it)")


#: seconds the restarted workers stay at the resume step in VERIFYING rows (> recovery timeout)
RESUME_HOLD = 60.0
PHASES = [
    Phase.DISCOVERING,
    Phase.WAITING_FOR_CHECKPOINT,
    Phase.KILLING,
    Phase.RECOVERING,
    Phase.VERIFYING,
]
#: way out -> what the caller sees: an exit code, or the exception type that escapes.
WAYS_OUT: dict[str, int | type[BaseException]] = {
    "orchestrator-exception": 3,
    "event-source-exception": 3,
    "drill-error": 3,
    "ctrl-c": 130,
    "sigterm": 130,
    "pytest-timeout": pytest.fail.Exception,
}


def matrix(phases: list[Phase], quick: tuple[Phase, str]) -> list[Any]:
    """The rows (phase, way out), ids ``phase-way``. Each row runs the job's processes for
    a second or more, so all but ``quick`` (its fastest, under a second) are marked slow:
    scripts/test runs every row, the quick lane that one."""
    return [
        pytest.param(
            phase,
            way,
            id=f"{phase.name.lower()}-{way}",
            marks=() if (phase, way) == quick else pytest.mark.slow,
        )
        for phase in phases
        for way in WAYS_OUT
    ]


@pytest.fixture
def no_leftovers(figures: Figures) -> Callable[[Sabotaged], None]:
    """Check that a finished drill left no thread, no process and no lock behind."""
    threads_before = set(threading.enumerate())
    return lambda backend: check_no_leftovers(backend, threads_before, figures)


def check_no_leftovers(
    backend: Sabotaged, threads_before: set[threading.Thread], figures: Figures
) -> None:
    """No thread started since ``threads_before``, no process of the job, no child left."""
    assert backend.cleanups == 1, f"cleanup ran {backend.cleanups} times"
    left_threads = [t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    left_procs = []
    for pid, created in backend.pids:
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                left_procs.append(pid)
        except psutil.NoSuchProcess:
            continue
    children = [
        c.pid
        for c in psutil.Process().children(recursive=True)
        if c.status() != psutil.STATUS_ZOMBIE
    ]
    stopped = []
    for pid in {*left_procs, *children}:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
                stopped.append(pid)
    figures.add("local_processes_tracked", len(backend.pids))
    figures.add("leftovers_found", len(left_threads) + len(left_procs) + len(children))
    figures.add("stopped_left", len(stopped))
    leftovers = [*left_procs, *children]
    stopped_text = describe(stopped)
    for pid in leftovers:  # never let one row's leftovers fail the next rows
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    assert stopped == [], f"processes left stopped (state T): {stopped_text}"
    assert left_threads == [], f"threads left running: {left_threads}"
    assert left_procs == [], f"job processes left: {describe(left_procs)}"
    assert children == [], f"children (adopted orphans) left: {describe(children)}"
    assert backend.pids, "the row never saw the job's processes"


def describe(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            env = proc.environ()
            out.append(
                f"pid {pid} sid {os.getsid(pid)} rank {env.get('RANK', '-')} "
                f"restart {env.get('TORCHELASTIC_RESTART_COUNT', '-')}: "
                f"{' '.join(proc.cmdline())[:120]}"
            )
        except (psutil.Error, OSError):
            out.append(f"pid {pid} (gone)")
    return "; ".join(out)


#: The last drill run_row finished: its verdict and summary, for an assertion's message.
LAST_SUMMARY: list[str] = [""]


def run_row(config: DrillConfig, backend: Sabotaged) -> int | type[BaseException]:
    previous = signal.signal(signal.SIGALRM, pytest_timeout_handler)
    LAST_SUMMARY[0] = ""
    try:
        result = run_drill(
            config, RunOptions(observer=backend.observe, poll_interval=0.02), orchestrator=backend
        )
        LAST_SUMMARY[0] = f"{result.verdict.value}: {result.summary}"
        return result.exit_code
    except DrillInterrupted as exc:
        assert exc.result is not None
        return 130
    except pytest.fail.Exception:
        return pytest.fail.Exception
    finally:
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    ("phase", "way"), matrix(PHASES, quick=(Phase.WAITING_FOR_CHECKPOINT, "event-source-exception"))
)
def test_every_way_out_of_every_phase_cleans_up_once_and_leaves_nothing(
    tmp_path: Path,
    phase: Phase,
    way: str,
    no_leftovers: Callable[[Sabotaged], None],
    figures: Figures,
) -> None:
    # VERIFYING lasts from the first progress line at the resume step to the next one.
    # The workers hold at the resume step for longer than the recovery timeout, so that
    # phase is there to strike in however late the drill gets to look on a loaded machine.
    pause = RESUME_HOLD if phase is Phase.VERIFYING else 0.5
    config = load_config(drill_yaml(tmp_path, resume_pause=pause))
    backend = Sabotaged(local_backend(config), phase, way)
    outcome = run_row(config, backend)
    assert backend.struck, f"the drill never reached {phase.name} to strike"
    no_leftovers(backend)
    want = WAYS_OUT[way]
    assert outcome == want, f"{phase.name} x {way}: got {outcome}, want {want}"
    figures.add("cleanup_rows")
    figures.add("drills_run")


@pytest.mark.slow  # a drill on the job's processes per verdict, seconds each
@pytest.mark.parametrize(
    ("resume", "target_rank", "exit_code"),
    [("latest", 1, 0), ("zero", 1, 1), ("latest", 5, 3)],
    ids=["pass", "fail-restarted-from-scratch", "error-no-such-rank"],
)
def test_each_verdict_cleans_up_once_and_leaves_nothing(
    tmp_path: Path,
    resume: str,
    target_rank: int,
    exit_code: int,
    no_leftovers: Callable[[Sabotaged], None],
    figures: Figures,
) -> None:
    config = load_config(drill_yaml(tmp_path, resume=resume, target_rank=target_rank))
    backend = Sabotaged(local_backend(config), None, "verdict")
    assert run_row(config, backend) == exit_code
    no_leftovers(backend)
    figures.add("cleanup_rows")
    figures.add("drills_run")


# ---------------------------------------------------------------------- real signals


def job_pids(root: int) -> set[tuple[int, float]]:
    try:
        parent = psutil.Process(root)
        return {(p.pid, p.create_time()) for p in parent.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def alive(pids: set[tuple[int, float]]) -> list[int]:
    out = []
    for pid, created in pids:
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.mark.slow  # a CLI or pytest process and the job's, signalled mid-drill (seconds)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
@pytest.mark.parametrize("front", ["cli", "pytest"])
def test_a_signal_to_the_drill_process_ends_it_cleanly_with_nothing_left(
    tmp_path: Path,
    sig: signal.Signals,
    front: str,
    figures: Figures,
) -> None:
    config = drill_yaml(tmp_path, checkpoint="step-100000")  # never reached: we interrupt
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), REPORTER_ROOT]))
    if front == "cli":
        args = [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(config), "-q"]
    else:
        args = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--drill-config={config}",
            "--drill-yes",
            "--rootdir",
            str(tmp_path),
        ]
    proc = subprocess.Popen(
        args, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        eventually((tmp_path / "ckpt").exists, "the job's first checkpoint", JOB)
        seen = job_pids(proc.pid)
        assert len(seen) >= 3, f"expected an agent and two workers, saw {seen}"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=within(JOB))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.decode(errors="replace")
    left = alive(seen)
    figures.add("leftovers_found", len(left))
    figures.add("cleanup_rows")
    figures.add("drills_run")
    assert left == [], f"job processes left after {sig.name}: {left}\n{text}"
    assert "Traceback" not in text, text
    if front == "cli":
        assert proc.returncode == 130, text
        assert "cleanup done" in text
    else:
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, text


@pytest.mark.e2e
def test_a_real_torchrun_drill_interrupted_by_sigterm_leaves_nothing(
    tmp_path: Path, figures: Figures
) -> None:
    train = REPO / "examples" / "local" / "train.py"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=3",
        str(train),
        f"--ckpt-dir={tmp_path / 'checkpoints'}",
        "--ckpt-every=20",
        "--step-time=0.02",
    ]
    config = drill_yaml(tmp_path, command=command, checkpoint="step-100000")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), REPORTER_ROOT]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(config), "-q"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        eventually(
            lambda: (
                any((tmp_path / "checkpoints").glob("*"))
                if (tmp_path / "checkpoints").exists()
                else False
            ),
            "a torch checkpoint",
            JOB,
        )
        seen = job_pids(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=within(JOB))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = alive(seen)
    figures.add("leftovers_found", len(left))
    figures.add("cleanup_rows")
    figures.add("drills_run")
    assert left == [], out.decode(errors="replace")
    assert proc.returncode == 130, out.decode(errors="replace")


# ---------------------------------------------------------------------- the drill's marker
#
# Cleanup finds the job's processes by the marker the drill puts in the job's
# environment (RECOVERYGATE_DRILL_ID), among its own descendants: orphans re-parent to the
# drill, a child subreaper. These rows are the scenarios the reliability suite found (a
# worker in a session the drill never saw) and the other half of the rule (a process
# without the marker is never touched).


def test_a_worker_started_while_the_agent_stops_is_cleaned_up_too(
    tmp_path: Path, no_leftovers: Callable[[Sabotaged], None], figures: Figures
) -> None:
    """The agent answers the drill's SIGTERM by starting one more worker and exiting."""
    config = load_config(drill_yaml(tmp_path, standin_args=("--orphan-on-term",)))
    backend = Sabotaged(local_backend(config), Phase.WAITING_FOR_CHECKPOINT, "ctrl-c")
    assert run_row(config, backend) == 130
    no_leftovers(backend)
    figures.add("cleanup_rows")
    figures.add("drills_run")


def adopted_workers(before: set[int], restart: str) -> list[psutil.Process]:
    """Workers of restart ``restart`` that are now this process's own (adopted) children."""
    found = []
    for child in psutil.Process().children():
        if child.pid in before:
            continue
        with contextlib.suppress(psutil.Error):
            if (
                "--worker" in child.cmdline()
                and child.status() != psutil.STATUS_ZOMBIE
                and child.environ().get("TORCHELASTIC_RESTART_COUNT") == restart
            ):
                found.append(child)
    return found


@pytest.mark.slow  # a drill on the job's processes (about 2 s)
def test_workers_an_agent_started_just_before_it_was_killed_are_cleaned_up_too(
    tmp_path: Path, figures: Figures
) -> None:
    """The agent dies mid-restart, right after starting the new group in new sessions.

    Nothing of the drill has seen those workers: their parent was gone a few ms after
    they started, their sessions are new, and they are nobody's descendants but the
    drill's (which adopted them). They train on, holding the output pipe.
    """
    config = load_config(drill_yaml(tmp_path, standin_args=("--die-mid-restart",)))
    backend = local_backend(config)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    orphans: list[psutil.Process] = []
    try:
        workload = backend.discover(deadline(PROCESS))
        target = workload.by_rank(1)
        assert target is not None
        assert backend.kill(target, dry_run=False).outcome is KillOutcome.KILLED
        eventually(
            lambda: any(e.kind is GroupEventKind.JOB_FAILED for e in backend.watch_group()),
            "the agent's death",
        )

        def two_adopted() -> bool:
            orphans[:] = adopted_workers(before, restart="1")
            return len(orphans) == 2

        eventually(two_adopted, "the new group's workers, adopted by this process")
        assert len({os.getsid(o.pid) for o in orphans}) == 2, "each in a session of its own"
        tracked = {(o.pid, o.create_time()) for o in orphans}
        for orphan in orphans:
            tracked |= {(c.pid, c.create_time()) for c in orphan.children(recursive=True)}
    finally:
        backend.cleanup()
    assert_nothing_left(tracked, before, figures)


def assert_nothing_left(
    tracked: set[tuple[int, float]], before: set[int], figures: Figures
) -> None:
    """No tracked process alive, and no child of this process that was not there before."""
    left = alive(tracked)
    late = [
        c.pid
        for c in psutil.Process().children(recursive=True)
        if c.pid not in before and c.status() != psutil.STATUS_ZOMBIE
    ]
    left_text, late_text = describe(left), describe(late)
    for pid in {*left, *late}:  # never let one row's leftovers fail the next rows
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    figures.add("local_processes_tracked", len(tracked))
    figures.add("leftovers_found", len(left) + len(late))
    figures.add("cleanup_rows")
    assert left == [], f"left running: {left_text}"
    assert late == [], f"children left: {late_text}"


@pytest.mark.slow  # a drill on the job's processes per row (about 1-2 s)
@pytest.mark.parametrize("then", ["killed", "left-stopped"])
def test_an_agent_stopped_mid_restart_leaves_nothing_behind(
    tmp_path: Path, then: str, figures: Figures
) -> None:
    """The agent freezes (SIGSTOP) right after starting the new group, in new sessions.

    Then it is SIGKILLed (its new workers are orphaned, adopted by this process) or
    left stopped (it cannot act on cleanup's SIGTERM until it is continued).
    """
    config = load_config(drill_yaml(tmp_path, standin_args=("--stop-mid-restart",)))
    backend = local_backend(config)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    tracked: set[tuple[int, float]] = set()
    try:
        workload = backend.discover(deadline(PROCESS))
        target = workload.by_rank(1)
        assert target is not None and backend.agent_pid is not None
        agent = psutil.Process(backend.agent_pid)
        assert backend.kill(target, dry_run=False).outcome is KillOutcome.KILLED
        eventually(lambda: agent.status() == psutil.STATUS_STOPPED, "the agent to stop mid-restart")
        new_group: list[psutil.Process] = []

        def two_started() -> bool:
            new_group[:] = [
                c
                for c in agent.children()
                if "--worker" in c.cmdline()
                and c.environ().get("TORCHELASTIC_RESTART_COUNT") == "1"
            ]
            return len(new_group) == 2

        eventually(two_started, "the new group's workers")
        if then == "killed":
            agent.kill()
            eventually(
                lambda: len(adopted_workers(before, restart="1")) == 2,
                "the new group's workers, adopted by this process",
            )
        tracked = {(p.pid, p.create_time()) for p in [agent, *new_group]}
        for worker in new_group:
            tracked |= {(c.pid, c.create_time()) for c in worker.children(recursive=True)}
    finally:
        backend.cleanup()
    assert_nothing_left(tracked, before, figures)


@pytest.mark.slow  # a drill on the job's processes (about 1-2 s)
def test_cleanup_never_touches_a_process_without_the_drills_marker(
    tmp_path: Path, figures: Figures
) -> None:
    """An unrelated child of the drill's process and an orphan it adopted both survive.

    While the drill runs, this process is a child subreaper: the orphan below (its
    parent exits at once) is re-parented to it, like the job's orphans, but it was not
    started by the job and does not carry the marker.
    """
    config = load_config(drill_yaml(tmp_path))
    backend = local_backend(config)
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    bystander = subprocess.Popen(sleeper)
    orphan: psutil.Process | None = None
    try:
        backend.discover(deadline(PROCESS))
        spawner = subprocess.run(
            [
                sys.executable,
                "-c",
                "import subprocess, sys; "
                f"print(subprocess.Popen({sleeper!r}, start_new_session=True, "
                "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        orphan = psutil.Process(int(spawner.stdout))
        assert orphan.ppid() == os.getpid(), "the orphan was adopted by the drill's process"
        backend.cleanup()
        stays(lambda: bystander.poll() is None, "the drill's own unrelated child runs")
        assert orphan.is_running() and orphan.status() != psutil.STATUS_ZOMBIE, (
            "an adopted orphan without the marker was killed"
        )
        figures.add("cleanup_rows")
    finally:
        backend.cleanup()
        bystander.kill()
        bystander.wait()
        if orphan is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                orphan.kill()
                orphan.wait(within(PROCESS))
