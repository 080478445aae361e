"""``recovery: live``: the engine judging torchft-style recoveries, driven directly.

We test these aspects:
- ``afterStep``: the kill fires once any replica reported the step (no checkpoint), once;
- PASS: the survivors kept committing, the replacement healed from a peer at the
  survivors' step and committed within ``maxRejoinTime``; figures and phases reported;
- each FAIL names what happened: survivors stalled (decided as soon as the open gap
  passes ``maxSurvivorStall``, before any deadline), never rejoined (at ``maxRejoinTime``),
  rejoined from scratch, rejoined from a checkpoint, healed to an older step;
- no kill before the target replica committed a step (one still joining tests nothing);
- inconclusive where the lines cannot decide: no heal line with a first step past 1;
- heals that are not recoveries (step 0, before the kill, another replica) are not judged;
- the report's live figures and the timeline picture (one line per replica);
- through the fake backend's replica groups on a simulated clock (examples/fake/live.yaml):
  PASS, and FAIL for min_replicas 2, a heal from scratch or from a checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from pytest_recoverygate.engine.machine import DrillEngine, DrillResult, Finish, KillTarget, Verdict
from pytest_recoverygate.engine.model import (
    KillOutcome,
    KillResult,
    TrainingEventKind,
)
from pytest_recoverygate.engine.spec import DrillSpec
from pytest_recoverygate.engine.verdict import FailureReason
from tests.engine_events import T0, L, P, S, line_at

FAKE_LIVE = Path(__file__).resolve().parent.parent / "examples" / "fake" / "live.yaml"


def spec(**overrides: object) -> DrillSpec:
    values: dict[str, object] = {
        "max_recovery_time": 30.0,
        "recovery": "live",
        "after_step": 20,
        "target_replica": 1,
        "target_rank": 0,
        "max_survivor_stall": 5.0,
        "max_rejoin_time": 30.0,
        "max_lost_steps": 0,
    }
    values.update(overrides)
    return DrillSpec(**values)  # type: ignore[arg-type]


@dataclass
class Job:
    """A two-replica torchft job written as lines: each step takes ``dt`` seconds."""

    engine: DrillEngine
    now: float = T0
    actions: list[object] = field(default_factory=list)

    def line(
        self,
        kind: TrainingEventKind,
        inc: str,
        step: int | None = None,
        *,
        replica: int | None = None,
        source: str | None = None,
        peer: int | None = None,
    ) -> None:
        event = line_at(kind, self.now, inc, step, replica=replica, source=source, peer=peer)
        self.actions += self.engine.on_training_event(event)

    def tick(self) -> None:
        self.actions += self.engine.tick(self.now)

    def killed(self) -> None:
        assert any(isinstance(a, KillTarget) for a in self.actions), self.actions
        self.actions += self.engine.on_kill_result(KillResult(KillOutcome.KILLED, self.now))

    @property
    def result(self) -> DrillResult:
        done = [a for a in self.actions if isinstance(a, Finish)]
        assert done, f"no verdict yet; phase {self.engine.phase}"
        return done[0].result


def start(s: DrillSpec | None = None) -> Job:
    engine = DrillEngine(s or spec(), T0)
    engine.discovered(T0, "two replica groups")
    job = Job(engine)
    job.line(S, "a0", replica=0)
    job.line(S, "b0", replica=1)
    job.line(L, "b0", 0, source="peer", peer=0)  # torchft's initial sync: not judged
    return job


def train(job: Job, steps: range, incs: tuple[str, ...], dt: float = 0.1) -> None:
    for step in steps:
        job.now += dt
        for inc in incs:
            job.line(P, inc, step)


def kill_at_20(job: Job) -> None:
    train(job, range(1, 21), ("a0", "b0"))
    job.killed()
    assert job.engine.kill_time == job.now


def heal_and_train(job: Job, inc: str, step: int) -> None:
    """Replica 1's replacement ``inc`` starts, heals from replica 0 at ``step`` 0.5 s
    later, and both commit the next three steps."""
    job.line(S, inc, replica=1)
    job.now += 0.5
    job.line(L, inc, step, source="peer", peer=0)
    train(job, range(step + 1, step + 4), ("a0", inc))


def test_after_step_kills_once_any_replica_reports_the_step() -> None:
    job = start()
    train(job, range(1, 20), ("a0", "b0"))
    assert not any(isinstance(a, KillTarget) for a in job.actions)
    train(job, range(20, 21), ("a0",))
    kills = [a for a in job.actions if isinstance(a, KillTarget)]
    assert len(kills) == 1
    assert kills[0].rank == 0
    assert kills[0].checkpoint_step == 20


def test_a_healed_replacement_and_training_survivors_pass() -> None:
    job = start()
    kill_at_20(job)
    kill = job.now
    train(job, range(21, 24), ("a0",), dt=0.7)  # the survivor slows, keeps committing
    job.now += 1.0
    heal_and_train(job, "b1", 23)
    result = job.result
    assert result.verdict is Verdict.PASS, result.summary
    live = result.live
    assert live is not None
    assert live.rejoin_source == "peer"
    assert live.rejoin_step == 23
    assert live.rejoin_peer == 0
    assert live.survivors_kept_training is True
    assert live.rejoin_time_seconds is not None
    assert live.survivor_stall_seconds is not None
    assert abs(live.rejoin_time_seconds - (job.now - 0.2 - kill)) < 1e-6
    assert abs(live.survivor_stall_seconds - 1.6) < 1e-6  # 23 -> 24 spans the rejoin
    started, healed, first = (
        live.phases["replica restarted"],
        live.phases["healed"],
        live.phases["first committed step"],
    )
    assert started is not None
    assert healed is not None
    assert first is not None
    assert started < healed < first
    names = [c.name for c in result.checks]
    assert names == [
        "target_killed",
        "survivors_kept_training",
        "rejoin_time",
        "rejoin_source",
        "heal_step",
        "lost_steps",
    ]
    assert {r.replica: r.before for r in live.replicas} == {0: 20, 1: 20}


def test_lines_of_the_killed_replica_until_the_kill_takes_effect_are_not_counted() -> None:
    # A kubelet kills a deleted pod's container a moment after the DELETE was sent: the
    # killed replica commits two more steps (0.3 s) before it dies (a full CI run's fake
    # cluster did this under load, and the old 50 ms allowance failed the drill).
    job = start()
    kill_at_20(job)
    train(job, range(21, 23), ("a0", "b0"), dt=0.15)
    train(job, range(23, 24), ("a0",), dt=0.7)
    job.now += 1.0
    heal_and_train(job, "b1", 23)
    result = job.result
    assert result.verdict is Verdict.PASS, result.summary
    assert result.checks[0].name == "target_killed" and result.checks[0].passed is True


def test_an_old_incarnation_still_reporting_after_its_replacement_started_is_undecided() -> None:
    # Failed and INCONCLUSIVE at once before (issue 41): the kill not ending the process
    # that reports is no proof against the job, it leaves its recovery unjudged.
    job = start()
    kill_at_20(job)
    train(job, range(21, 23), ("a0", "b0"), dt=0.7)
    job.line(S, "b1", replica=1)
    job.now += 0.2
    job.line(P, "b0", 23)  # the one the drill killed is still alive beside its replacement
    job.now += 0.3
    job.line(L, "b1", 23, source="peer", peer=0)
    train(job, range(24, 27), ("a0", "b1"))
    result = job.result
    assert result.verdict is Verdict.ERROR, result.summary
    assert "inconclusive" in result.summary
    check = result.checks[0]
    assert check.name == "target_killed" and check.passed is None
    assert check.reason is FailureReason.INCONCLUSIVE
    assert check.message == (
        "the killed replica's old incarnation b0 kept reporting until 1.60s after the kill, "
        "after its replacement had started (0.20s after the replacement's first line): "
        "both were alive at once: the kill had not ended the process that reports by then, "
        "so the recovery from it cannot be judged; check that the target the drill kills "
        "is the process that prints the replica's lines"
    )


def test_an_old_incarnation_reporting_past_the_time_a_kill_takes_effect_is_undecided() -> None:
    job = start(spec(max_survivor_stall=None))
    kill_at_20(job)
    train(job, range(21, 81), ("a0", "b0"))  # 6 s after the kill, no replacement yet
    job.now += 1.0
    heal_and_train(job, "b1", 80)
    result = job.result
    assert result.verdict is Verdict.ERROR, result.summary
    check = result.checks[0]
    assert check.name == "target_killed" and check.passed is None
    assert check.reason is FailureReason.INCONCLUSIVE
    assert "kept reporting until 6.00s after the kill, more than 5.00s after the kill was sent" in (
        check.message
    )


def test_survivors_that_wait_for_the_dead_replica_fail_as_soon_as_proven() -> None:
    job = start()
    kill_at_20(job)
    kill = job.now
    job.now = kill + 4.0
    job.tick()
    assert not any(isinstance(a, Finish) for a in job.actions)
    assert job.engine.deadline is not None
    assert job.engine.deadline < kill + 5.1  # the proof is due, not the final deadline
    job.now = kill + 5.2
    job.tick()
    result = job.result
    assert result.verdict is Verdict.FAIL
    assert FailureReason.SURVIVORS_STALLED in result.reasons
    assert "replica 0 committed no step for" in result.summary


def test_a_replica_that_never_rejoins_fails_at_max_rejoin_time() -> None:
    job = start(spec(max_survivor_stall=None, max_rejoin_time=10.0, max_recovery_time=10.0))
    kill_at_20(job)
    kill = job.now
    step = 21
    while job.now < kill + 10.5 and not any(isinstance(a, Finish) for a in job.actions):
        train(job, range(step, step + 1), ("a0",), dt=0.5)
        step += 1
        job.tick()
    result = job.result
    assert result.verdict is Verdict.FAIL
    assert result.reasons == (FailureReason.NEVER_REJOINED,)


def test_a_replacement_from_scratch_fails() -> None:
    job = start()
    kill_at_20(job)
    train(job, range(21, 25), ("a0",))
    job.line(S, "b1", replica=1)
    train(job, range(1, 3), ("b1",))
    train(job, range(25, 27), ("a0",))
    result = job.result
    assert result.verdict is Verdict.FAIL
    assert FailureReason.REJOINED_FROM_SCRATCH in result.reasons
    assert FailureReason.LOST_TOO_MANY_STEPS in result.reasons
    assert result.live is not None
    assert result.live.rejoin_source == "scratch"


def test_a_replacement_that_loads_its_own_checkpoint_fails() -> None:
    job = start()
    kill_at_20(job)
    train(job, range(21, 25), ("a0",))
    job.line(S, "b1", replica=1)
    job.line(L, "b1", 10)
    train(job, range(11, 12), ("b1",))
    train(job, range(25, 27), ("a0",))
    result = job.result
    assert result.verdict is Verdict.FAIL
    assert FailureReason.REJOINED_FROM_CHECKPOINT in result.reasons
    assert FailureReason.LOST_TOO_MANY_STEPS in result.reasons
    assert result.live is not None
    assert result.live.rejoin_source == "checkpoint"


def test_a_heal_to_an_older_step_fails() -> None:
    job = start()
    kill_at_20(job)
    train(job, range(21, 25), ("a0",))
    job.line(S, "b1", replica=1)
    job.line(L, "b1", 21, source="peer", peer=0)
    train(job, range(22, 23), ("b1",))
    train(job, range(25, 27), ("a0",))
    result = job.result
    assert result.verdict is Verdict.FAIL
    assert FailureReason.HEALED_TO_OLDER_STEP in result.reasons


def test_no_heal_line_past_step_one_is_inconclusive() -> None:
    job = start()
    kill_at_20(job)
    train(job, range(21, 25), ("a0",))
    job.line(S, "b1", replica=1)
    train(job, range(25, 27), ("a0", "b1"))
    result = job.result
    assert result.verdict is Verdict.ERROR
    assert result.inconclusive
    assert [c.name for c in result.undecided_checks] == ["rejoin_source"]


def test_no_kill_before_the_target_replica_committed_a_step() -> None:
    engine = DrillEngine(spec(), T0)
    engine.discovered(T0, "one job")
    job = Job(engine)
    job.line(S, "a0")  # no replica on the start line: the target replica is never seen
    train(job, range(1, 30), ("a0",))
    assert not any(isinstance(a, KillTarget) for a in job.actions)
    assert "waiting for replica 1 to commit" in " ".join(
        e.detail for e in engine.timeline_entries()
    )
    job.line(S, "b0", replica=1)
    train(job, range(30, 31), ("a0", "b0"))
    assert any(isinstance(a, KillTarget) for a in job.actions)


def test_heals_before_the_kill_and_of_other_replicas_are_not_judged() -> None:
    job = start()
    job.line(L, "a0", 0, source="peer", peer=1)
    kill_at_20(job)
    job.line(S, "b1", replica=1)
    job.line(L, "b1", 20, source="peer", peer=0)
    train(job, range(21, 23), ("a0", "b1"))
    result = job.result
    assert result.verdict is Verdict.PASS, result.summary
    assert result.live is not None
    assert result.live.rejoin_step == 20


def test_the_report_carries_the_live_figures_and_the_picture_one_line_per_replica() -> None:
    pytest.importorskip("matplotlib")
    from pytest_recoverygate.report.files import markdown_summary, result_to_dict
    from pytest_recoverygate.report.timeline import build_figure

    job = start()
    kill_at_20(job)
    train(job, range(21, 24), ("a0",), dt=0.7)
    job.line(S, "b1", replica=1)
    job.now += 0.5
    job.line(L, "b1", 23, source="peer", peer=0)
    train(job, range(24, 27), ("a0", "b1"))
    result = job.result
    points = [(T0 + i * 0.1, "a0", i) for i in range(1, 27)]
    points += [(T0 + 0.1, "b0", 1), (job.now, "b1", 26)]
    doc = result_to_dict(replace(result, progress=tuple(points)))
    assert doc["recoveryMode"] == "live"
    assert doc["rejoinSource"] == "peer"
    assert doc["rejoinStep"] == 23
    assert doc["live"]["replicas"][1]["incs"] == ["b0", "b1"]
    assert "| rejoinTimeSeconds |" in markdown_summary(doc)
    import matplotlib.pyplot as plt

    fig = build_figure(doc)
    try:
        labels = [line.get_label() for line in fig.axes[0].get_lines()]
    finally:
        plt.close(fig)
    assert {"replica 0", "replica 1", "replica 1 (replacement 1)"} <= set(labels)


# ------------------------------------------------------------------ through the fake backend


@pytest.mark.parametrize(
    ("changes", "code", "reasons", "source"),
    [
        ({}, 0, [], "peer"),
        ({"minReplicas": 2}, 1, ["SURVIVORS_STALLED"], None),
        ({"heal": "scratch"}, 1, ["REJOINED_FROM_SCRATCH", "LOST_TOO_MANY_STEPS"], "scratch"),
        (
            {"heal": "checkpoint"},
            1,
            ["REJOINED_FROM_CHECKPOINT", "HEALED_TO_OLDER_STEP", "LOST_TOO_MANY_STEPS"],
            "checkpoint",
        ),
    ],
    ids=["heals_from_a_peer", "min_replicas_2", "from_scratch", "from_a_checkpoint"],
)
def test_the_fake_live_job_reaches_the_verdict_of_what_it_simulates(
    tmp_path: Path,
    changes: dict[str, object],
    code: int,
    reasons: list[str],
    source: str | None,
) -> None:
    import yaml

    from pytest_recoverygate.config.loading import load_config
    from pytest_recoverygate.orchestrators import build_orchestrator
    from pytest_recoverygate.registry.seams import SimulatedClock
    from pytest_recoverygate.runner import RunOptions, run_drill

    data = yaml.safe_load(FAKE_LIVE.read_text())
    data["workload"]["fake"].update(changes)
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    clock = SimulatedClock()
    report = tmp_path / "report.json"
    result = run_drill(
        config,
        RunOptions(report_path=report, handle_signals=False),
        clock=clock,
        orchestrator=build_orchestrator(config, clock),
    )
    assert result.exit_code == code, result.summary
    doc = json.loads(report.read_text())
    assert [c["reason"] for c in doc["checks"] if c["passed"] is False] == reasons
    assert doc["recoveryMode"] == "live"
    assert doc["rejoinSource"] == source
    if not changes:
        # the simulated figures: the stall is the heartbeat timeout, the rejoin the
        # restart delay plus the join (0.2 s) plus one step (0.05 s)
        assert abs(doc["survivorStallSeconds"] - 2.0) < 0.06
        assert abs(doc["rejoinTimeSeconds"] - 5.25) < 0.06
        assert doc["rejoinStep"] >= 100


def test_a_job_that_never_reaches_after_step_times_out_naming_its_last_step() -> None:
    job = start(spec(checkpoint_timeout=30.0))
    train(job, range(1, 10), ("a0", "b0"))
    job.now = T0 + 31.0
    job.tick()
    result = job.result
    assert result.verdict is Verdict.ERROR
    assert "waiting for step 20; the last step seen was 9" in result.summary


def test_a_survivor_that_crashed_and_restarted_is_named_as_such() -> None:
    job = start()
    kill_at_20(job)
    kill = job.now
    job.now = kill + 1.0
    job.line(S, "a1", replica=0)  # the survivor itself came back: it crashed
    job.now = kill + 5.2
    job.tick()
    result = job.result
    assert result.verdict is Verdict.FAIL
    assert "replica(s) [0] restarted after the kill: a survivor crashed" in result.summary


def test_after_step_triggers_a_restart_mode_drill_too(tmp_path: Path) -> None:
    import yaml

    from pytest_recoverygate.config.loading import load_config
    from pytest_recoverygate.orchestrators import build_orchestrator
    from pytest_recoverygate.registry.seams import SimulatedClock
    from pytest_recoverygate.runner import RunOptions, run_drill

    data = yaml.safe_load((FAKE_LIVE.parent / "recovery-test.yaml").read_text())
    data["injectFailure"] = {"type": "KillWorker", "afterStep": 50}
    path = tmp_path / "restart.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    clock = SimulatedClock()
    result = run_drill(
        config,
        RunOptions(handle_signals=False),
        clock=clock,
        orchestrator=build_orchestrator(config, clock),
    )
    assert result.verdict is Verdict.PASS, result.summary
    assert result.trigger_checkpoint is not None
    assert result.trigger_checkpoint >= 50
    assert result.resume_step == 40  # the latest checkpoint before the kill (every 20 steps)
    assert result.live is None
