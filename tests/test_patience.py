"""The suite's patience (tests/patience.py): one slack factor, one wait, no other timeouts.

We test these aspects:
- the slack: ``RECOVERYGATE_TEST_SLACK`` wins and is checked (a number >= 1); without it,
  the load average per usable core, never below 1 and never above ``MAX_SLACK``;
- ``within`` and ``deadline`` stretch a budget by the slack now;
- ``eventually`` returns what the predicate found, asks once more at the deadline, fails
  naming what it waited for, the budget, the slack and what was seen, and stretches its
  budget when the load rises during the wait (on a simulated clock: no test here sleeps
  for a budget);
- ``stays`` passes while its predicate holds and fails the moment it does not;
- the suite itself: no test module outside patience.py carries a literal timeout, sleep
  or deadline (the job scripts the tests run, and the fake servers' own timers, are the
  world, not the tests' patience; a line that is not a wait says so: ``# not a wait``).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import patience

ROOT = Path(__file__).resolve().parent.parent


class FakeClock:
    """A clock that moves only when paused on."""

    def __init__(self) -> None:
        self.t = 0.0
        self.pauses = 0

    def now(self) -> float:
        return self.t

    def pause(self, seconds: float) -> None:
        self.pauses += 1
        self.t += seconds


@pytest.fixture
def no_slack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(patience.SLACK_ENV, "1")


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The one-minute load average the module reads (settable), on 2 usable cores."""
    monkeypatch.delenv(patience.SLACK_ENV, raising=False)
    value = [0.0]
    monkeypatch.setattr(os, "getloadavg", lambda: (value[0], 0.0, 0.0))
    monkeypatch.setattr(patience, "_cores", lambda: 2)
    return value


# --------------------------------------------------------------------------- slack


def test_the_slack_is_the_load_per_core_never_below_one_nor_above_the_cap(
    load: list[float],
) -> None:
    load[0] = 0.5
    assert patience.slack() == 1.0
    load[0] = 5.0
    assert patience.slack() == 2.5
    load[0] = 100.0
    assert patience.slack() == patience.MAX_SLACK


def test_the_environment_sets_the_slack(monkeypatch: pytest.MonkeyPatch, load: list[float]) -> None:
    load[0] = 9.0
    monkeypatch.setenv(patience.SLACK_ENV, "3")
    assert patience.slack() == 3.0
    assert patience.within(10) == 30.0
    monkeypatch.setenv(patience.SLACK_ENV, "1")
    assert patience.slack() == 1.0  # the load is then ignored


def test_the_header_says_where_the_slack_comes_from(
    monkeypatch: pytest.MonkeyPatch, load: list[float]
) -> None:
    load[0] = 3.0
    assert patience.describe() == (
        "slack 1.50 now (load 3.00 on 2 core(s); RECOVERYGATE_TEST_SLACK sets it)"
    )
    monkeypatch.setenv(patience.SLACK_ENV, "2.5")
    assert patience.describe() == "slack 2.5 (RECOVERYGATE_TEST_SLACK)"


@pytest.mark.parametrize("given", ["0.5", "fast", "nan", "inf", "-2"])
def test_a_slack_that_is_not_a_number_of_at_least_one_is_an_error(
    monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    monkeypatch.setenv(patience.SLACK_ENV, given)
    with pytest.raises(ValueError, match=f"RECOVERYGATE_TEST_SLACK={given!r}: expected a number"):
        patience.slack()


def test_a_deadline_is_the_stretched_budget_from_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(patience.SLACK_ENV, "2")
    before = time.time()
    got = patience.deadline(patience.PROCESS)
    assert before + 2 * patience.PROCESS <= got <= time.time() + 2 * patience.PROCESS


# --------------------------------------------------------------------------- eventually


def test_eventually_returns_what_the_predicate_found(no_slack: None) -> None:
    clock = FakeClock()
    answers = iter([None, [], ["found"]])
    got = patience.eventually(lambda: next(answers), "a thing", now=clock.now, pause=clock.pause)
    assert got == ["found"] and clock.pauses == 2


def test_eventually_fails_naming_the_wait_the_budget_the_slack_and_what_was_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(patience.SLACK_ENV, "2")
    clock = FakeClock()
    with pytest.raises(patience.Timeout) as caught:
        patience.eventually(
            lambda: False,
            "replacement worker",
            5,
            seen=lambda: ["gone"],
            now=clock.now,
            pause=clock.pause,
        )
    assert str(caught.value) == (
        "no replacement worker within 5 s x slack 2.00 = 10.0 s; seen: ['gone']"
    )
    assert clock.t == pytest.approx(10.0, abs=patience.POLL)
    assert isinstance(caught.value, AssertionError)  # pytest reads it as a failed assert


def test_eventually_asks_once_more_at_the_deadline(no_slack: None) -> None:
    clock = FakeClock()
    late: list[float] = []

    def arrives_in_the_last_pause() -> bool:
        if clock.t >= 1.0:
            late.append(clock.t)
        return len(late) == 2  # the second ask past the deadline: the one more

    found = patience.eventually(  # a pause of 1/8 s: the clock hits the deadline exactly
        arrives_in_the_last_pause, "x", 1.0, interval=0.125, now=clock.now, pause=clock.pause
    )
    assert found and late == [1.0, 1.0]


def test_a_load_that_rises_during_a_wait_stretches_it(load: list[float]) -> None:
    clock = FakeClock()

    def rising(done_at: float | None) -> bool:
        if clock.t >= 9.0:
            load[0] = 6.0  # slack 3 from here on
        return done_at is not None and clock.t >= done_at

    assert patience.eventually(lambda: rising(25.0), "x", 10, now=clock.now, pause=clock.pause)
    load[0], clock.t = 0.0, 0.0
    with pytest.raises(patience.Timeout, match="slack 3.00 = 30.0 s"):
        patience.eventually(lambda: rising(None), "y", 10, now=clock.now, pause=clock.pause)
    assert clock.t == pytest.approx(30.0, abs=patience.POLL)


def test_gather_collects_until_the_collection_is_enough(no_slack: None) -> None:
    polls = iter([[1], [], [2, 3], [4]])
    assert patience.gather(lambda: next(polls), lambda got: 3 in got, "a 3") == [1, 2, 3]


def test_gather_fails_with_what_it_collected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(patience.SLACK_ENV, "1")
    monkeypatch.setattr(patience, "eventually", _on_a_fake_clock(patience.eventually))
    with pytest.raises(patience.Timeout, match=r"no a 3 within .*; seen: \[1, 2\]"):
        patience.gather(iter([[1], [2]] + [[]] * 10_000).__next__, lambda got: 3 in got, "a 3")


def _on_a_fake_clock(wait: Any) -> Any:
    clock = FakeClock()
    return lambda *a, **k: wait(*a, **k, now=clock.now, pause=clock.pause)


# --------------------------------------------------------------------------- stays


def test_stays_passes_while_the_predicate_holds(no_slack: None) -> None:
    asked: list[int] = []

    def holds() -> bool:
        asked.append(1)
        return True

    patience.stays(holds, "alive", during=0.02)
    assert len(asked) >= 2


def test_stays_fails_the_moment_the_predicate_does_not_hold(no_slack: None) -> None:
    answers = iter([True, False])
    with pytest.raises(AssertionError, match="the victim runs: no longer so"):
        patience.stays(lambda: next(answers), "the victim runs", during=60)


# --------------------------------------------------------------------------- the hold

#: The job side of the hold, as examples/local/train.py's ``hold()`` does it: park at the
#: save of step argv[1] while the file exists (a stand-in: no torch to import).
PARKS = """
import os, sys, time
from pathlib import Path
path, step = os.environ["RG_TEST_HOLD"], int(sys.argv[1])
kind, _, at = Path(path).read_text().strip().partition(" ")
if kind == "save" and step >= int(at):
    Path(f"{path}.parked.{os.getpid()}").write_text(f"save {step}")
    while os.path.exists(path):
        time.sleep(0.05)
print("saved", step, flush=True)
"""


def test_a_hold_parks_the_save_it_names_and_lets_go_once_the_parked_process_is_killed(
    tmp_path: Path,
) -> None:
    env = {**os.environ, patience.HOLD_ENV: str(tmp_path / "hold")}
    with patience.Hold(tmp_path, "save", 60) as hold:
        assert hold.env == {patience.HOLD_ENV: str(tmp_path / "hold")}
        earlier = subprocess.run(
            [sys.executable, "-c", PARKS, "40"], env=env, capture_output=True, text=True,
            timeout=patience.within(patience.PROCESS), check=True,
        )  # fmt: skip
        assert earlier.stdout == "saved 40\n"  # an earlier save does not park
        job = subprocess.Popen([sys.executable, "-c", PARKS, "60"], env=env)
        assert hold.wait_parked(patience.PROCESS) == [job.pid]
        patience.stays(lambda: job.poll() is None, "the parked save")
        job.kill()
        job.wait(patience.within(patience.PROMPT))
    assert hold.killed == [job.pid]
    assert not hold.path.exists()


def test_a_hold_whose_save_never_parks_fails_the_test_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(patience, "DRILL", 0.2)  # the budget of the hold's waits
    with pytest.raises(patience.Timeout, match="no a save of step 60 parked"):
        with patience.Hold(tmp_path, "save", 60) as hold:  # a drill that never saves 60
            patience.eventually(lambda: not hold.path.exists(), "the hold given up", 5.0)
    assert not (tmp_path / "hold").exists()


# --------------------------------------------------------------------------- the suite

#: Not the tests' patience: the job scripts the tests run (their pace is the job's), the
#: fake API server's and the out-of-tree backend's own timers (the world's: a watch's
#: bookmark interval, its own shutdown), and patience.py itself.
WORLD = (
    "tests/patience.py",
    "tests/kubernetes/fake_apiserver.py",
    "tests/reliability/standin_job.py",
    "tests/truth/job.py",
    "tests/diagnosis/replay_job.py",
    "tests/diagnosis/data/capture/",
    "tests/backends/outoftree/",
    "tests/integrations/dcp_job.py",
    "tests/ray/data/",
    "tests/fixtures/",
)


def _literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _literal(node.left) and _literal(node.right)
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    return False


def _is_clock(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("time", "monotonic", "perf_counter")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    )


def literal_waits(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Each literal wall-clock wait in ``tree``: a ``timeout=`` or ``patience=`` of a
    number, any ``time.sleep``, a ``wait``/``join`` of a number, a clock plus a number, a
    parameter ``timeout`` (or ``seconds``, ``patience``) defaulting to a number, a
    ``*TIMEOUT*`` constant."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for k in node.keywords:
                if k.arg in ("timeout", "patience") and _literal(k.value):
                    yield k.value.lineno, f"{k.arg}=<number>"
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "sleep" and isinstance(func, ast.Attribute):
                yield node.lineno, "time.sleep(...)"
            elif name in ("wait", "join") and len(node.args) == 1 and not node.keywords:
                if _literal(node.args[0]):
                    yield node.lineno, f"{name}(<number>)"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            if _is_clock(node.left) and _literal(node.right):
                yield node.lineno, "clock + <number>"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.args[len(args.args) - len(args.defaults) :]
            pairs = list(zip(positional, args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            for arg, default in pairs:
                waits = arg.arg in ("timeout", "seconds", "patience") or arg.arg.endswith(
                    "_timeout"
                )
                if waits and _literal(default):
                    yield default.lineno, f"parameter {arg.arg}=<number>"
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and "TIMEOUT" in target.id.upper():
                if _literal(node.value):
                    yield node.lineno, f"{target.id} = <number>"


def test_the_scan_finds_each_kind_of_literal_wait() -> None:
    source = (
        "import time\n"
        "proc.wait(timeout=10)\n"
        "time.sleep(0.5)\n"
        "thread.join(30)\n"
        "deadline = time.monotonic() + 5\n"
        "def f(x, timeout: float = 60): pass\n"
        "TIMEOUT = 420.0\n"
        "time.sleep(step_time)\n"
        "Harness(patience=60.0)\n"
        "ok = proc.wait(timeout=patience.within(patience.PROCESS))\n"
        "policy.wait(1, headers)\n"
    )
    found = sorted(line for line, _ in literal_waits(ast.parse(source)))
    assert found == [2, 3, 4, 5, 6, 7, 8, 9]


def test_no_test_module_carries_a_literal_timeout() -> None:
    found = []
    for path in sorted(ROOT.glob("tests/**/*.py")):
        where = path.relative_to(ROOT).as_posix()
        if where.startswith(WORLD):
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for line, kind in literal_waits(ast.parse(text)):
            if "# not a wait" not in lines[line - 1]:
                found.append(f"{where}:{line}: {kind}: {lines[line - 1].strip()}")
    assert not found, (
        "wait with tests/patience.py (eventually, within, deadline, stays and the named "
        "budgets), or say why a line is not a wait ('# not a wait: ...'):\n" + "\n".join(found)
    )
