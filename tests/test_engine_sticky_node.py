"""StickyFault ``scope: node`` in the engine, driven directly (no backend, no clock).

We test these aspects:
- at the trigger the engine asks for the fault once; the backend's answer (the node went
  bad, the work on it hit) starts a recovery judged by the ``kill`` rules, the rule
  ``bad_node_avoided`` first;
- the backend's placements on the bad node and their hits are counted once each; more
  deaths there than ``maxCrashLoop`` FAIL ``BAD_NODE_REUSED`` at the hit that proves it,
  with what the rejoining burned in the message and ``faultDetails.badNode``;
- a replacement that trains while the bad node's agent is still in the job is never
  passed on that: the sustain window opens only after the last hit and the node's
  leaving; once the node left, the job must train on from the newest durable checkpoint
  (one its flapping incarnations saved counts);
- a node that never leaves while the job trains on is undecided at the deadline; a job
  that ends has stopped placing work there, and the kill rules judge the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_recoverygate.engine.machine import (
    DrillEngine,
    DrillResult,
    FailureReason,
    Finish,
    KillTarget,
    Verdict,
)
from pytest_recoverygate.engine.model import (
    GroupEventKind,
    KillOutcome,
    KillResult,
    TrainingEventKind,
    Worker,
)
from pytest_recoverygate.engine.spec import DrillSpec, StickySpec
from pytest_recoverygate.transcript.read import read_transcript
from pytest_recoverygate.transcript.rejudge import replay
from tests.engine_events import T0, C, G, L, P, S, ev, group_ev

R = FailureReason
NODE = "rg0a0b0c-node1"


def spec(max_crash_loop: int = 3, mode: str = "kill") -> DrillSpec:
    return DrillSpec(
        max_recovery_time=60.0,
        after_checkpoint=20,
        fault="StickyFault",
        target_rank=1,
        target_node=1,
        sticky=StickySpec("node", max_crash_loop=max_crash_loop, mode=mode, after=2.0),
        recovery_timeout=120.0,
    )


@dataclass
class Drill:
    engine: DrillEngine
    asked: list[KillTarget] = field(default_factory=list)
    result: DrillResult | None = None
    placements: int = 0
    now: float = 0.0

    @classmethod
    def trained_to_the_trigger(cls, s: DrillSpec | None = None) -> Drill:
        """Rank 0 (incarnation ``a``) trains steps 1..22, checkpoints 10 and 20; the node
        goes bad at the checkpoint of step 20 and its running work is hit then."""
        engine = DrillEngine(s or spec(), T0)
        engine.discovered(T0, "2 torchrun nodes", ranks=(0, 1), world_size=2)
        d = cls(engine)
        d.line(S, 0.0, "a")
        t = 0.1
        for step in range(1, 23):
            d.line(P, t, "a", step)
            if step % 10 == 0:
                d.line(C, t + 0.01, "a", step)
            t += 0.1
        assert len(d.asked) == 1, "the node goes bad once, at the trigger"
        return d

    def answer(self, actions: list[object], t: float) -> None:
        for action in actions:
            if isinstance(action, Finish):
                self.result = action.result
            elif isinstance(action, KillTarget):
                self.asked.append(action)
                bad = KillResult(KillOutcome.KILLED, T0 + t, f"{NODE} is bad from now on")
                self.answer(list(self.engine.on_kill_result(bad)), t)
                self.placement_hit(t)

    def line(self, kind: TrainingEventKind, t: float, inc: str, step: int | None = None,
             world: int | None = None) -> None:  # fmt: skip
        self.now = max(self.now, t)
        if self.result is None:
            event = ev(kind, t, inc, step, world_size=world)
            self.answer(list(self.engine.on_training_event(event)), t)

    def group(self, kind: GroupEventKind, t: float, detail: str = "", **extra: Any) -> None:
        self.now = max(self.now, t)
        if self.result is None:
            event = group_ev(kind, t, detail, **extra)
            self.answer(list(self.engine.on_group_event(event)), t)

    def placement_hit(self, t: float) -> None:
        """The backend: work placed on the bad node at ``t``, hit ``after`` later (the
        first placement, running when it went bad, is hit at once)."""
        self.placements += 1
        n = self.placements
        worker = Worker(1, f"rank 1 pid {100 + n}", f"{100 + n}@{T0 + t:.3f}", NODE)
        self.group(G.BAD_NODE_PLACEMENT, t, f"placement {n}", worker=worker, placement=n)
        hit = t if n == 1 else t + 2.0
        self.group(G.BAD_NODE_HIT, hit, f"SIGKILL sent to placement {n}", placement=n)

    def incarnation(self, t: float, inc: str, loaded: int, seconds: float,
                    world: int = 2) -> float:  # fmt: skip
        """Rank 0 restarts (``inc``), loads ``loaded`` and trains for ``seconds``, saving
        every 10 steps."""
        self.group(G.RESTARTING, t)
        self.line(S, t + 0.5, inc, world=world)
        self.line(L, t + 0.6, inc, loaded)
        step, end, t = loaded, t + 0.7 + seconds, t + 0.7
        while t < end:
            step += 1
            self.line(P, t, inc, step)
            if step % 10 == 0:
                self.line(C, t + 0.01, inc, step)
            t += 0.5
        return t

    def until(self, t_end: float) -> None:
        t = self.now
        while t <= t_end and self.result is None:
            self.answer(list(self.engine.tick(T0 + t)), t)
            t += 0.5

    def check(self, name: str = "bad_node") -> Any:
        assert self.result is not None
        return next(c for c in self.result.checks if c.name == name)

    def bad_node(self) -> dict[str, Any]:
        assert self.result is not None
        details: dict[str, Any] = self.result.recoveries[-1].fault_details["badNode"]
        return details


def test_a_job_that_takes_the_bad_node_out_passes() -> None:
    d = Drill.trained_to_the_trigger()
    t = d.incarnation(3.0, "b", 20, 14.0)  # trains longer than the sustain window ...
    assert d.result is None, "... but the bad node is still in the job: no PASS on that"
    d.placement_hit(t)  # its agent restarts its work there: placement 2, dies 2 s later
    t = d.incarnation(t + 3.0, "c", 40, 1.0)  # a group with the node again, cut short
    d.placement_hit(t)  # placement 3: its health check ends its agent before the hit ...
    d.group(G.NODE_GONE, t + 0.5, "node1: the torchrun agent exited with code 1")
    assert d.result is None
    t = d.incarnation(t + 1.0, "d", 40, 15.0, world=1)  # on with one node, from step 40
    assert d.result is not None, d.engine.status(T0 + t)
    assert d.result.verdict is Verdict.PASS, d.result.summary
    (recovery,) = d.result.recoveries
    assert recovery.resume_step == recovery.expected_resume_step == 40  # "b" saved it
    assert recovery.judged_incarnation == "d"
    assert d.check().passed is True
    assert "stopped placing work on rg0a0b0c-node1 after 3 placement(s) (3 died" in (
        d.check().message
    )
    figures = d.bad_node()
    assert (figures["placements"], figures["deaths"]) == (3, 3)
    assert [p["placement"] for p in figures["each"]] == [1, 2, 3]
    assert figures["each"][0]["seenSeconds"] == figures["each"][0]["hitSeconds"] == 0.0
    assert figures["leftSeconds"] is not None and figures["leftSeconds"] > 0
    assert recovery.fault_details["worldSizeAfter"] == 1
    assert recovery.fault_details["worldSizeBefore"] == 2
    # rank 1 went with the node: the group that trains on has no rank 1 to hold to a load
    assert "all_ranks_resumed" not in {c.name for c in d.result.checks}


def test_a_job_that_keeps_rejoining_the_bad_node_fails_when_proven() -> None:
    d = Drill.trained_to_the_trigger()
    t = 3.0
    for inc in ("b", "c", "d"):  # rank 0's processes never get past their start-up ...
        d.group(G.RESTARTING, t)
        d.line(S, t + 0.5, inc)
        assert d.result is None
        d.placement_hit(t)  # ... before the next placement on the bad node dies
        t += 3.0
    assert d.result is not None, "the fourth death proves it"
    assert d.result.verdict is Verdict.FAIL
    assert next(c.reason for c in d.result.failed_checks) is R.BAD_NODE_REUSED
    assert d.result.finished_at is not None
    assert d.result.finished_at == T0 + t - 3.0 + 2.0  # at the fourth hit, not the deadline
    message = d.check().message
    assert "keeps placing work on the bad node: 4 placement(s) on rg0a0b0c-node1" in message
    assert "since it went bad, 4 died there" in message
    assert d.bad_node()["deaths"] == 4
    # decided early: what time would have decided is left out, not failed for want of it
    assert [c.reason for c in d.result.failed_checks] == [R.BAD_NODE_REUSED]
    assert d.bad_node()["left"] is None


def test_a_restart_from_a_hit_slower_than_the_stall_limit_is_no_stall() -> None:
    # CI (tests/local/test_local_sticky_node.py, node-bad-rejoins): the third group trained
    # steps 41-43, the bad node's agent rejoined (every worker restarts), the group took
    # 7.1 s to come back under load and its node-1 worker died: the fourth death. That gap
    # is a restart from a hit, not a stall after a resume: BAD_NODE_REUSED alone.
    d = Drill.trained_to_the_trigger()
    t = 3.0
    for inc in ("b", "c"):
        d.group(G.RESTARTING, t)
        d.line(S, t + 0.5, inc)
        d.placement_hit(t)
        t += 3.0
    t = d.incarnation(t, "d", 20, 1.5)  # steps 21-23, then the group restarts ...
    d.placement_hit(t + 5.2)  # ... the fourth placement dies 7.2 s after step 43
    assert d.result is not None and d.result.verdict is Verdict.FAIL
    assert [c.reason for c in d.result.failed_checks] == [R.BAD_NODE_REUSED], [
        (c.name, c.message) for c in d.result.failed_checks
    ]


def test_a_job_whose_bad_node_stays_in_is_undecided() -> None:
    d = Drill.trained_to_the_trigger()
    t = d.incarnation(3.0, "b", 20, 200.0)  # trains on and on; the node's agent stays
    d.until(t + 200.0)
    assert d.result is not None and d.result.verdict is Verdict.ERROR, d.result
    check = d.check()
    assert check.passed is None and check.reason is R.INCONCLUSIVE
    assert "its agent is still in the job" in check.message


def test_a_job_that_ends_stops_placing_work_on_the_node() -> None:
    d = Drill.trained_to_the_trigger()
    t = d.incarnation(3.0, "b", 20, 1.0)
    d.placement_hit(t)
    d.group(G.JOB_FAILED, t + 3.0, "node0: RendezvousClosedError")
    assert d.result is not None and d.result.verdict is Verdict.FAIL
    assert d.check().passed is True and "it ended (node0: RendezvousClosedError)" in (
        d.check().message
    )
    assert R.BAD_NODE_REUSED not in [c.reason for c in d.result.failed_checks]


def test_a_hang_counts_as_a_placement_the_node_took() -> None:
    d = Drill.trained_to_the_trigger(spec(max_crash_loop=1, mode="hang"))
    t = d.incarnation(3.0, "b", 20, 1.0)
    d.placement_hit(t)
    assert d.result is not None and d.result.verdict is Verdict.FAIL
    assert "since it went bad, 2 hung there" in d.check().message


KEPT = Path(__file__).resolve().parent / "data" / "ci-node-bad-rejoins"


def test_the_drill_ci_kept_rejudges_to_bad_node_reused_alone() -> None:
    transcript = read_transcript(KEPT / "transcript.jsonl")
    recorded = json.loads((KEPT / "report.json").read_text())
    assert recorded["reasons"] == ["BAD_NODE_REUSED", "STOPPED_PROGRESSING"]
    result, diverged = replay(transcript)
    assert result.verdict is Verdict.FAIL and result.reasons == (R.BAD_NODE_REUSED,), result.summary
    assert all(": recorded finish FAIL" in line for line in diverged), diverged
