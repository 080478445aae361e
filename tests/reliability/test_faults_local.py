"""The new faults on the local backend, with real processes: who got which signal, when.

We test these aspects, from the processes' own accounts (the stand-in's ``--signal-log``:
each worker records its start, its first step and every SIGTERM / SIGCONT with the
sender's pid; the agent records how each worker ended, and whether it SIGKILLed it
itself), never from the backend's own account of what it did:
- Preempt, a SIGTERM is never followed by a second target: the target exits on SIGTERM
  at once (the grace period then runs out while its replacement, same rank, trains), it
  ignores SIGTERM (SIGKILL after the grace period), or the drill ends inside the grace
  period (Ctrl-C, SIGTERM to the drill, pytest-timeout's SIGALRM, the recovery deadline):
  exactly one instance (pid and start time) got the drill's SIGTERM, at most that one
  died of a SIGKILL the agent did not send before cleanup began, no replacement of that
  rank was signalled by the drill, and no escalation thread outlives cleanup;
- HangWorker, a SIGSTOPped process is never left stopped: the HangWorker drill ended on
  each way out of the phases after the SIGSTOP (killing, recovering, verifying): no
  process of the job is left at all, none in state T (test_cleanup_local's Sabotaged
  backend and its leftover check, with ``injectFailure.type: HangWorker``);
- count, a repeated drill never kills two instances at once: ``count: 3`` (SIGKILL and
  Preempt) and ``untilBudgetExhausted`` against the stand-in's ``--max-restarts 2``, and
  one real torchrun drill (examples/local/train.py with ground truth): every kill hit a
  different instance of the rank, the current one; kill k+1 came after the replacement
  group's first step after kill k (the recovery the drill verified) and after kill k's
  victim was gone (never two destructive actions outstanding).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.engine.machine import DrillResult, Phase, Verdict
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.patience import QUIET, Timeout, eventually
from tests.reliability.conftest import Figures
from tests.reliability.test_cleanup_local import (
    LAST_SUMMARY,
    WAYS_OUT,
    Sabotaged,
    check_no_leftovers,
    drill_yaml,
    local_backend,
    matrix,
    run_row,
)

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
Ident = tuple[int, float]  # pid, start time (psutil's create_time)


@dataclass
class Account:
    """What the job's processes wrote about themselves (the stand-in's --signal-log)."""

    starts: dict[Ident, dict[str, Any]] = field(default_factory=dict)
    first_step: dict[int, float] = field(default_factory=dict)  # pid -> time
    signals: list[dict[str, Any]] = field(default_factory=list)  # received, with sender
    exits: dict[Ident, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def read(cls, folder: Path) -> Account:
        account = cls()
        for path in sorted(folder.glob("*.jsonl")):
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                if rec["event"] == "start":
                    account.starts[(rec["pid"], round(rec["create_time"], 3))] = rec
                elif rec["event"] == "first-step":
                    account.first_step[rec["pid"]] = rec["t"]
                elif rec["event"] == "signal":
                    account.signals.append(rec)
                elif rec["event"] == "worker-exit" and rec["create_time"] is not None:
                    account.exits[(rec["worker"], round(rec["create_time"], 3))] = rec
        return account

    def identity(self, pid: int) -> Ident:
        [ident] = [i for i in self.starts if i[0] == pid]
        return ident

    def drill_signals(self, name: str) -> list[dict[str, Any]]:
        """Signals ``name`` the drill's process (this one) sent, as their receivers saw them."""
        return [s for s in self.signals if s["sender"] == os.getpid() and s["signal"] == name]

    def outside_sigkills(self, before: float) -> list[Ident]:
        """Workers that died of a SIGKILL their agent did not send, before ``before``."""
        return [
            ident
            for ident, rec in self.exits.items()
            if rec["returncode"] == -signal.SIGKILL
            and not rec["killed_by_agent"]
            and rec["t"] < before
        ]

    def rank_of(self, ident: Ident) -> int:
        return int(self.starts[ident]["rank"])


def instance(worker_id: str) -> Ident:
    pid, _, created = worker_id.partition("@")
    return int(pid), round(float(created), 3)


def escalation_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "recoverygate-preempt"]


def config_for(tmp_path: Path, on_sigterm: str, *more: str, **options: Any) -> Any:
    log = tmp_path / "signals"
    log.mkdir()
    args = ("--signal-log", str(log), "--on-sigterm", on_sigterm, "--stop-timeout", "0.3", *more)
    return load_config(drill_yaml(tmp_path, standin_args=args, spawn_grandchild=False, **options))


# ---------------------------------------------------------------------- Preempt

#: row -> (what the target does with SIGTERM, grace period, how the drill ends)
PREEMPT_ROWS: dict[str, tuple[str, str, str]] = {
    "exits-at-once-grace-runs-out-on-the-replacement": ("exit", "0.5s", "verdict"),
    "ignores-sigterm-sigkilled-after-grace": ("ignore", "1s", "verdict"),
    "ctrl-c-inside-the-grace-period": ("ignore", "60s", "ctrl-c"),
    "sigterm-to-the-drill-inside-the-grace-period": ("ignore", "60s", "sigterm"),
    "pytest-timeout-inside-the-grace-period": ("ignore", "60s", "pytest-timeout"),
    "recovery-deadline-inside-the-grace-period": ("ignore", "60s", "deadline"),
}


@pytest.mark.slow  # the job's processes, a real grace period or signal per row (1-3 s)
@pytest.mark.parametrize("row", list(PREEMPT_ROWS))
def test_a_preempt_sigterm_reaches_one_instance_and_its_sigkill_no_other(
    tmp_path: Path, row: str, figures: Figures
) -> None:
    on_sigterm, grace, way = PREEMPT_ROWS[row]
    threads_before = set(threading.enumerate())
    config = config_for(
        tmp_path,
        on_sigterm,
        # exit row: the replacement holds at its resume step past the grace period
        resume_pause=1.5 if on_sigterm == "exit" else 0.2,
        failure={"type": "Preempt", "gracePeriod": grace},
        timeouts={"recovery": "2s"} if way == "deadline" else None,
        expectations={"maxRecoveryTime": "2s"} if way == "deadline" else None,
    )
    backend = Sabotaged(local_backend(config), Phase.RECOVERING, way)
    outcome = run_row(config, backend)
    assert backend.cleanup_started is not None
    left_escalations = escalation_threads()
    check_no_leftovers(backend, threads_before, figures)
    account = Account.read(tmp_path / "signals")

    terms = account.drill_signals("SIGTERM")
    targets = {account.identity(s["pid"]) for s in terms}
    killed = account.outside_sigkills(before=backend.cleanup_started)
    [victim] = [i for i in account.starts if account.rank_of(i) == 1 and i[0] == terms[0]["pid"]]
    replacements = [i for i in account.starts if account.rank_of(i) == 1 and i != victim]
    hit_replacements = [s for s in account.signals if account.identity(s["pid"]) in replacements]
    hit_replacements = [s for s in hit_replacements if s["sender"] == os.getpid()]
    extra = (len(terms) - 1) + len(set(killed) - {victim}) + len(hit_replacements)
    figures.add("double_signals", extra)
    figures.add("threads_left", len(left_escalations))
    figures.add("preempt_drills")
    figures.add("drills_run")
    assert len(terms) == 1, f"the drill sent SIGTERM {len(terms)} times: {terms}"
    assert targets == {victim}
    assert set(killed) <= {victim}, f"SIGKILLed from outside: {killed}, victim {victim}"
    assert hit_replacements == [], f"the drill signalled a replacement: {hit_replacements}"
    assert left_escalations == [], "an escalation thread outlived cleanup"
    if way == "verdict":
        assert outcome == 0, f"{row}: exit {outcome}: {LAST_SUMMARY[0]}"
        assert replacements, "the target was never replaced"
        # exit: it was gone at once, so the escalation had nothing to hit; ignore: SIGKILL
        assert killed == ([] if on_sigterm == "exit" else [victim]), killed
    else:
        assert backend.struck or way == "deadline", f"the drill never reached {row}"
        assert killed == [], f"SIGKILL inside the grace period: {killed}"
        assert replacements == [], "a target that ignores SIGTERM was replaced in the grace"
        assert outcome == (1 if way == "deadline" else WAYS_OUT[way]), f"{row}: got {outcome}"


# ---------------------------------------------------------------------- HangWorker

HANG_PHASES = [Phase.KILLING, Phase.RECOVERING, Phase.VERIFYING]
RESUME_HOLD = 60.0  # as in test_cleanup_local: VERIFYING lasts past the recovery timeout


class HangSabotaged(Sabotaged):
    """Sabotaged, also noting whether the victim was stopped (state T) when it struck."""

    stopped_at_strike: bool | None = None

    def strike(self, where: str) -> None:
        if not self.struck and self.real._struck.stopped and self.stopped_at_strike is None:
            import psutil

            def stopped() -> bool:  # SIGSTOP takes effect asynchronously
                for identity in list(self.real._struck.stopped):
                    proc = identity.process()
                    if proc is not None and proc.status() == psutil.STATUS_STOPPED:
                        return True
                return False

            with contextlib.suppress(Timeout):  # not stopped: the test's assert says so
                self.stopped_at_strike = eventually(stopped, "the victim stopped", QUIET)
        super().strike(where)


@pytest.mark.parametrize(
    ("phase", "way"), matrix(HANG_PHASES, quick=(Phase.KILLING, "drill-error"))
)
def test_a_hang_drill_ended_any_way_leaves_no_process_stopped_or_alive(
    tmp_path: Path, phase: Phase, way: str, figures: Figures
) -> None:
    threads_before = set(threading.enumerate())
    # The workers ignore SIGTERM: a worker that died of it could go before its signal
    # thread took the SIGCONT (pending with the SIGTERM, which sigwaitinfo returns first).
    config = config_for(
        tmp_path,
        "ignore",
        "--hang-timeout",
        "0.5",
        resume_pause=RESUME_HOLD if phase is Phase.VERIFYING else 0.3,
        failure={"type": "HangWorker"},
        expectations={"maxDetectionTime": "20s"},
    )
    backend = HangSabotaged(local_backend(config), phase, way)
    outcome = run_row(config, backend)
    assert backend.struck, f"the drill never reached {phase.name} to strike"
    check_no_leftovers(backend, threads_before, figures)
    assert outcome == WAYS_OUT[way], f"{phase.name} x {way}: got {outcome}"
    account = Account.read(tmp_path / "signals")
    conts = account.drill_signals("SIGCONT")
    if phase is Phase.RECOVERING or (phase is Phase.KILLING and way not in ("drill-error",)):
        if backend.real._struck.victim is not None:
            # struck while it was stopped: cleanup continued it first, once
            assert backend.stopped_at_strike, "the victim was not stopped when the drill ended"
            assert len(conts) == 1, f"SIGCONTs from the drill: {conts}"
    figures.add("hang_rows")
    figures.add("cleanup_rows")
    figures.add("drills_run")


# ---------------------------------------------------------------------- count


def kill_times(result: DrillResult) -> list[float]:
    """When the drill sent each kill, from its own timeline."""
    return sorted(e.timestamp for e in result.timeline if e.kind == "kill")


def assert_one_at_a_time(
    account: Account,
    kills: list[tuple[float, Ident]],
    figures: Figures,
) -> None:
    """Each kill to a different instance of rank 1, after the previous recovery and victim."""
    victims = [v for _, v in kills]
    overlaps = 0
    for k in range(1, len(kills)):
        at, victim = kills[k]
        before_at, before = kills[k - 1]
        gone = account.exits[before]["t"]
        # the group started after kill k-1 and its first steps (the recovery verified)
        group = [i for i, rec in account.starts.items() if before_at < rec["t"] < at]
        assert {account.rank_of(i) for i in group} == {0, 1}, f"kill {k + 1}: no new group"
        firsts = [account.first_step[i[0]] for i in group if i[0] in account.first_step]
        assert victim in group, f"kill {k + 1} hit {victim}, not the current instance"
        if not (gone < at and firsts and max(firsts) < at):
            overlaps += 1
        assert gone < at, f"kill {k + 1} at {at} while kill {k}'s victim lived until {gone}"
        assert firsts and max(firsts) < at, f"kill {k + 1} before recovery {k}'s first steps"
    figures.add("double_signals", overlaps + len(victims) - len(set(victims)))
    figures.add("repeated_kills_checked", len(kills))
    assert len(set(victims)) == len(victims), f"an instance was hit twice: {victims}"
    assert all(account.rank_of(v) == 1 for v in victims)


@pytest.mark.slow  # three kills of the job's processes and their recoveries (4-5 s)
@pytest.mark.parametrize(
    ("fault", "count", "max_restarts"),
    [("KillWorker", 3, "5"), ("Preempt", 3, "5"), ("KillWorker", "untilBudgetExhausted", "2")],
    ids=["count-3-sigkill", "count-3-preempt", "until-budget-exhausted"],
)
def test_repeated_kills_hit_one_current_instance_at_a_time(
    tmp_path: Path, fault: str, count: int | str, max_restarts: str, figures: Figures
) -> None:
    threads_before = set(threading.enumerate())
    config = config_for(
        tmp_path,
        "exit",
        "--max-restarts",
        max_restarts,
        resume_pause=0.2,
        failure={
            "type": fault,
            "count": count,
            **({"gracePeriod": "5s"} if fault == "Preempt" else {}),
        },
    )
    backend = Sabotaged(local_backend(config), None, "verdict")
    result = run_drill(config, RunOptions(poll_interval=0.02), orchestrator=backend)
    assert backend.cleanup_started is not None
    check_no_leftovers(backend, threads_before, figures)
    assert result.verdict is Verdict.PASS, result.summary
    # untilBudgetExhausted: two recoveries, then the job gives up on the third kill
    assert len(result.recoveries) == (2 if count == "untilBudgetExhausted" else 3), result.summary
    account = Account.read(tmp_path / "signals")
    if fault == "Preempt":
        terms = account.drill_signals("SIGTERM")
        victims = [account.identity(s["pid"]) for s in terms]
        times = [s["t"] for s in terms]
        assert account.outside_sigkills(before=backend.cleanup_started) == []
    else:
        victims = account.outside_sigkills(before=backend.cleanup_started)
        victims.sort(key=lambda v: account.exits[v]["t"])
        times = [account.exits[v]["t"] for v in victims]
    assert len(victims) == 3, f"{len(victims)} instances hit: {victims}"
    drill_kills = kill_times(result)
    assert len(drill_kills) == 3, result.timeline
    for drill_at, at in zip(drill_kills, times, strict=True):
        assert drill_at <= at + 0.01, "the drill's kill came after the victim saw it"
    assert_one_at_a_time(account, list(zip(times, victims, strict=True)), figures)
    figures.add("drills_run")


@pytest.mark.e2e
def test_a_real_torchrun_drill_until_the_budget_is_exhausted_kills_one_at_a_time(
    tmp_path: Path, figures: Figures
) -> None:
    """examples/local/train.py under torchrun --max-restarts=2: three kills, one at a time.

    The processes' own records are train.py's ground truth (one line per step, per rank
    and pid): a kill's victim is the rank-1 process whose records stop at it.
    """
    truth = tmp_path / "truth"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=2",
        str(REPO / "examples" / "local" / "train.py"),
        f"--ckpt-dir={tmp_path / 'checkpoints'}",
        "--ckpt-every=10",
        "--step-time=0.02",
    ]
    path = drill_yaml(
        tmp_path,
        command=command,
        checkpoint="step-10",
        extra_env={
            "RECOVERYGATE_GROUND_TRUTH": str(truth),
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        },
        failure={"count": "untilBudgetExhausted"},
        expectations={"maxRecoveryTime": "60s"},
        timeouts={"discovery": "120s", "recovery": "60s", "checkpoint": "60s"},
    )
    config = load_config(path)
    threads_before = set(threading.enumerate())
    backend = Sabotaged(local_backend(config), None, "verdict")
    result = run_drill(config, RunOptions(poll_interval=0.02), orchestrator=backend)
    check_no_leftovers(backend, threads_before, figures)
    assert result.verdict is Verdict.PASS, result.summary
    assert "survived 2 kill(s) and gave up loudly on kill 3" in result.summary
    processes: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for file in tmp_path.glob("truth.*.jsonl"):
        for line in file.read_text().splitlines():
            rec = json.loads(line)
            processes.setdefault((rec["rank"], rec["pid"]), []).append(rec)
    kills = kill_times(result)
    assert len(kills) == 3, result.timeline
    victims = []
    for k, at in enumerate(kills):
        spanning = [
            key
            for key, recs in processes.items()
            if key[0] == 1 and recs[0]["t"] < at and recs[-1]["t"] <= at + 0.5
        ]
        alive_at = [key for key in spanning if processes[key][-1]["t"] >= at - 1.0]
        assert len(alive_at) == 1, f"kill {k + 1}: rank-1 processes around it: {alive_at}"
        victims.append(alive_at[0])
        if k:
            before = kills[k - 1]
            # the recovery verified: rank 0's replacement (started after kill k-1) stepped
            firsts = [
                recs[0]["t"]
                for key, recs in processes.items()
                if key[0] == 0 and recs[0]["t"] > before
            ]
            assert firsts and min(firsts) < at, f"kill {k + 1} before recovery {k}'s steps"
            assert processes[victims[k - 1]][-1]["t"] < at, "two kills outstanding at once"
    figures.add("double_signals", len(victims) - len(set(victims)))
    figures.add("repeated_kills_checked", len(kills))
    figures.add("drills_run")
    assert len(set(victims)) == 3, f"an instance was hit twice: {victims}"
