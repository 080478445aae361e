"""The truth corpus, third pass (issue 31): real drills of the shapes a new user met.

Like ``test_truth_corpus.py`` (same job, same helpers, real torchrun and a real SIGKILL of
rank 1): every verdict and figure is held to the records the job wrote itself.

We test these aspects:
- a short CI job that recovers and exits 0 inside the default-length sustain window
  (10 s) PASSes, with the note that the run ended inside the window, its figures matching
  the truth (was ERROR "finished inside the sustain window");
- a correct resume from 20 without checkpoint_loaded whose metrics thread ticks the held
  count twice before the slow first step (20, 20, then 21), after a first run of one line
  per step — with and without the thread's tick of 0 at every start (0, 20, 20, 21) — is
  inconclusive and names checkpoint_loaded (was FAIL: "steps 20–20 were done again", or
  "restarted from scratch");
- a correct resume whose load line names the next step (21, never reported saved) is
  inconclusive and names checkpoint_loaded (was FAIL: steps replayed);
- a job that starts from scratch on every start (nanoGPT's init_from='scratch', its own
  line printed) under torchrun with ``--log-dir`` in /tmp FAILs as restarted from scratch,
  and the diagnosis quotes the job's line, never the log folder;
- the other ranks' check says what rank 1 loaded by its own record, and with nobody
  reporting a load it is "not checked" in the report and the terminal;
- torchft (examples/local/torchft, reporting by hand): a replacement that reports its heal
  only after should_commit, so after the survivor's line of the same step, PASSes with the
  heal step of its own record and no lost step (was FAIL "the survivors were at step S + 1
  when it joined", "1 committed step(s) went backwards");
- Ray: in test_truth_third_pass_ray.py (the Ray drills run in their own lane).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.durations import parse_duration
from tests.cli_drill import run_cli_drill
from tests.patience import CLUSTER, within
from tests.truth import test_truth_corpus as corpus
from tests.truth.scenarios import TRUTH_BASE, Drill, scenario

pytestmark = [pytest.mark.e2e, pytest.mark.local]

SUSTAIN = "10s"  # the window a short job ends inside
EVERY_LINE = {"RECOVERYGATE_PROGRESS_INTERVAL": "0"}  # one line per reporter call


@scenario(
    corpus.job(
        "--steps=300",
        "--step-time=0.03",
        after="step-40",
        expect={"sustain": SUSTAIN},
        env=EVERY_LINE,
    )
)  # every step's line printed: the last one the drill saw is the last
def test_a_short_job_that_recovers_and_exits_0_inside_the_sustain_window_passes(
    drill: Drill,
) -> None:
    # 300 steps of 30 ms, checkpoints every 20, killed after 40: the replacement trains
    # 260 steps (under 8 s) and exits 0 inside the 10 s window.
    truth, why = drill.truth, drill.explain()
    assert truth.judged is not None, why
    ended = truth.judged.exit
    assert ended is not None and ended.extra.get("code") == 0, why  # it finished
    assert truth.judged.steps[-1].step == 300, why
    # inside the sustain window (the config's), which opens at its first step
    assert ended.t - truth.judged.steps[0].t < parse_duration(SUSTAIN), why
    corpus.assert_no_checkpoint_after_the_kill(drill)
    assert truth.resume_step == 40, why
    corpus.assert_passes_held_to_truth(drill)
    assert "ended inside the sustain window" in drill.report["summary"], why
    sustained = drill.report["recoveries"][0]["sustained"]
    assert sustained["endedInsideWindow"] is True, why
    assert sustained["lastStep"] == 300, why


def held_ticks(drill: Drill) -> list[int]:
    """The judged process's ticks of its held count, before its first step."""
    judged = drill.truth.judged
    assert judged is not None, drill.explain()
    first = judged.steps[0].t
    return [r.step for r in judged.records if r.event == "report" and r.t < first]


def assert_held_ticks_are_inconclusive(drill: Drill, *, tick_at_start: bool) -> None:
    truth, why = drill.truth, drill.explain()
    assert truth.resume_step == truth.loaded_step == 20, why  # a correct resume
    assert held_ticks(drill) == ([0] if tick_at_start else []) + [20, 20], why
    corpus.assert_inconclusive(drill)
    assert "checkpoint_loaded" in drill.report["summary"], why
    assert "RESTARTED_FROM_SCRATCH" not in corpus.reasons(drill.report), why


@scenario(corpus.job("--held-ticks=2", "--loaded=no", env=EVERY_LINE))
def test_a_metrics_thread_ticking_the_held_step_before_the_first_is_inconclusive_20_20_21(
    drill: Drill,
) -> None:
    assert_held_ticks_are_inconclusive(drill, tick_at_start=False)


@scenario(corpus.job("--held-ticks=2", "--loaded=no", "--tick-at-start", env=EVERY_LINE))
def test_a_metrics_thread_ticking_the_held_step_before_the_first_is_inconclusive_0_20_20_21(
    drill: Drill,
) -> None:
    assert_held_ticks_are_inconclusive(drill, tick_at_start=True)


@scenario(corpus.job("--loaded-label=next"))
def test_a_load_line_naming_the_next_step_is_inconclusive_and_names_the_fix(drill: Drill) -> None:
    truth, why = drill.truth, drill.explain()
    assert truth.loaded_step == truth.resume_step == 20, why  # it held 20, said 21
    assert corpus.loaded_step(drill.report) == 21, why
    assert 21 not in [c for c in truth.checkpoints_before_kill], why
    corpus.assert_inconclusive(drill)
    assert "never reported saved" in drill.report["summary"], why
    assert "checkpoint_loaded" in drill.report["summary"], why


#: torchrun's --log-dir: under /tmp (the drill's folder), and no checkpoint storage.
TORCHRUN_LOGS = "torchrun-logs"


def run_with_torchrun_logs_in_tmp(tmp_path: Path) -> Drill:
    logs = tmp_path / TORCHRUN_LOGS
    return corpus.run_drill(
        tmp_path, ["--resume=none", "--announce-scratch"], launcher=[f"--log-dir={logs}"]
    )


@scenario(run_with_torchrun_logs_in_tmp, keeps_output=True)
def test_a_job_told_to_start_from_scratch_is_diagnosed_by_its_own_line_not_a_log_folder(
    drill: Drill,
) -> None:
    logs = Path(drill.report["config"]).parent / TORCHRUN_LOGS  # the folder the drill ran in
    truth, why = drill.truth, drill.explain()
    assert truth.from_scratch, why
    corpus.assert_fails_for(drill, "RESTARTED_FROM_SCRATCH")
    assert "diagnosis: checkpoints saved, but the replacement trained from scratch" in (
        drill.output
    ), drill.output
    [evidence] = [line for line in drill.output.splitlines() if line.startswith("    evidence:")]
    assert str(logs) not in evidence, evidence  # the log folder is no checkpoint storage
    assert "the job printed:" in evidence, evidence
    assert "Initializing a new model from scratch" in evidence, evidence


def rank_loads_after_kill(drill: Drill, rank: int) -> list[int]:
    """The steps ``rank``'s processes started after the kill recorded loading."""
    kill = drill.truth.kill_time
    return [
        r.step
        for p in drill.processes
        if p.rank == rank and p.started > kill
        for r in p.records
        if r.event == "loaded"
    ]


@scenario(corpus.job())
def test_the_other_ranks_check_says_what_rank_1_loaded_by_its_own_record(drill: Drill) -> None:
    why = drill.explain()
    corpus.assert_passes_held_to_truth(drill)
    [loaded] = rank_loads_after_kill(drill, 1)
    [check] = [c for c in drill.report["checks"] if c["name"] == "all_ranks_resumed"]
    assert check["checked"] is True and check["status"] == "passed", why
    assert check["message"] == f"rank(s) 1 loaded step {loaded}", why
    assert [(e["rank"], e["loaded"]) for e in check["observed"]] == [(1, loaded)], why


@scenario(corpus.job("--loaded=no"))
def test_the_other_ranks_check_that_verified_nothing_is_reported_as_not_checked(
    drill: Drill,
) -> None:
    # No rank reports checkpoint_loaded: rank 1 says nothing about its resume.
    why = drill.explain()
    corpus.assert_passes_held_to_truth(drill)
    [check] = [c for c in drill.report["checks"] if c["name"] == "all_ranks_resumed"]
    assert check["checked"] is False and check["status"] == "unchecked", why
    assert check["message"].startswith("not checked: rank(s) 1"), why
    assert [s["status"] for s in check["observed"]] == ["unchecked"], why
    assert "[--  ] all_ranks_resumed: not checked" in drill.output, drill.output


# ---------------------------------------------------------------- torchft: the heal's quorum

TORCHFT = corpus.HERE.parents[1] / "examples" / "local" / "torchft"


def torchft_records(base: Path) -> list[dict[str, Any]]:
    rows = []
    for path in base.parent.glob(f"{base.name}.*.*.jsonl"):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["t"])


def run_torchft_reporting_its_heal_after_the_commit(tmp_path: Path) -> Drill:
    """The example job, reporting by hand: a heal only once should_commit decided the step,
    so the replacement's heal line comes after the survivor's line of the same step."""
    config: dict[str, Any] = yaml.safe_load((TORCHFT / "recovery-test.yaml").read_text())
    workload = config["workload"]
    workload["workdir"] = str(TORCHFT)
    workload["env"] = {
        **workload.get("env", {}),
        "HEAL_REPORTED_AFTER_COMMIT": "1",
        "RECOVERYGATE_GROUND_TRUTH": str(tmp_path / TRUTH_BASE),
        "RG_E2E_MARK": (mark := uuid.uuid4().hex),
        **EVERY_LINE,  # every commit printed: the survivor's line of S + 1 is there
    }
    config["expectations"].pop("stateDigestMatches")  # the hand-written loop sends no digest
    run = run_cli_drill(config, tmp_path / "recovery-test.yaml", timeout=within(CLUSTER))
    assert not corpus.left_behind(mark), "processes of the job left behind"
    return Drill(run.report, run.code, run.output, run.wall, tmp_path)


@pytest.mark.torchft
@scenario(
    run_torchft_reporting_its_heal_after_the_commit,
    needs=("torch", "torchft"),
    compact=False,  # torchft's records, not job.py's
)
def test_a_torchft_heal_reported_after_its_commit_passes_judged_by_its_quorum(
    drill: Drill,
) -> None:
    report = drill.report
    why = f"\n{report.get('summary')}\n{drill.output[-3000:]}"
    kill = float(report["killTime"])
    rows = torchft_records(drill.root / TRUTH_BASE)
    # The truth: the replacement (replica 1, started after the kill) healed to S and
    # committed S + 1 first; the survivor's commit of S + 1 was recorded before that heal.
    heals = [r for r in rows if r["replica"] == 1 and r["event"] == "heal" and r["t"] > kill]
    assert heals, f"the replacement never healed{why}"
    heal = heals[0]
    mine = [r for r in rows if r["pid"] == heal["pid"] and r["event"] == "commit"]
    assert mine[0]["step"] == heal["step"] + 1, why
    theirs = [
        r
        for r in rows
        if r["replica"] == 0 and r["event"] == "commit" and r["step"] == heal["step"] + 1
    ]
    assert theirs and theirs[0]["t"] < heal["t"], f"the scenario's shape did not occur{why}"
    assert report["verdict"] == "PASS", why
    assert drill.returncode == 0, why
    assert report["rejoinStep"] == heal["step"], why
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["heal_step"]["passed"] is True, why
    assert checks["lost_steps"]["passed"] is True and checks["lost_steps"]["observed"] == 0, why
