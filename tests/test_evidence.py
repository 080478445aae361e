"""Evidence from a job's own lines (recoverygate.evidence, the ``evidence:`` section).

We test these aspects:
- each preset on its sample lines (tests/data/evidence/): the events and steps they prove,
  held to the step contract (a save line is a save started; completion needs its proof);
- lines without a step: the path group, the neighbour line, a load waiting for it;
- what a pattern sees: ANSI codes stripped, ``\\r`` redraws, a line cut at MAX_LINE_CHARS;
- bad input refused at validation: unknown preset, a pattern that does not compile, one
  without its group, nested quantifiers, a pattern too slow on a long line;
- the hook in a real Python process: lines passed through unchanged, each match a
  RECOVERYGATE/v1 line of that process (with loss), logging handlers, relayed lines and
  a torchrun agent left alone, nothing at all when RECOVERYGATE_AUTO is off;
- the config section: errors with file:line:key and exit 2, the variable a launched job
  gets, and what ``validate`` prints for an attached one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from recoverygate.evidence import (
    MAX_LINE_CHARS,
    Matcher,
    Spec,
    clean_line,
    pattern_problem,
    problems,
    spec_from_json,
    step_from_path,
    strip_relay,
)

from pytest_recoverygate.cli import main as cli_main
from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.orchestrators import AUTO_ENV, with_evidence
from tests import patience

DATA = Path(__file__).parent / "data" / "evidence"


def events(
    preset: str, name: str | None = None, **extra: object
) -> list[tuple[str, int, float | None]]:
    matcher = Matcher(Spec({"preset": preset, **extra}))
    out = []
    for line in (DATA / f"{name or preset}.log").read_text().splitlines():
        out += matcher.feed(line)
    return out


def test_nanogpt_lines_prove_steps_and_a_save_completed_by_the_next_iter_line() -> None:
    assert events("nanogpt") == [
        ("progress", 1, 10.9812),  # iter 0 is the step of index 0: one step done
        ("progress", 2, 10.9301),
        ("checkpointStarted", 2, None),  # "saving checkpoint to out": its step from "step 2:"
        ("checkpointCompleted", 2, None),  # the next iter line: torch.save returned
        ("progress", 3, 10.447),
    ]


def test_a_nanogpt_save_cut_before_the_next_iter_line_only_started() -> None:
    lines = (DATA / "nanogpt.log").read_text().splitlines()[:-1]  # killed during torch.save
    matcher = Matcher(Spec({"preset": "nanogpt"}))
    found = [e for line in lines for e in matcher.feed(line)]
    assert found[-1] == ("checkpointStarted", 2, None)
    assert not any(kind == "checkpointCompleted" for kind, _, _ in found)


def test_a_nanogpt_resume_takes_its_step_from_the_step_line_after_it_and_resaves() -> None:
    assert events("nanogpt", "nanogpt-resume") == [
        ("checkpointLoaded", 2, None),
        ("checkpointStarted", 2, None),
        ("checkpointCompleted", 2, None),
        ("progress", 3, 10.447),
    ]


def test_torchtitan_lines_through_its_colour_codes() -> None:
    """Captured from torchtitan 0.3.0's own trainer (a resume at step 8, 10 steps)."""
    assert events("torchtitan") == [
        ("checkpointLoaded", 8, None),  # the path: step-8
        ("progress", 9, 7.95461),
        ("checkpointStarted", 9, None),  # "Saving the checkpoint.": the step line before
        ("checkpointCompleted", 9, None),  # "Finished saving the checkpoint in 0.22 seconds."
        ("progress", 10, 8.02949),
        ("checkpointStarted", 10, None),
        ("checkpointCompleted", 10, None),  # the last step's: "Last step checkpoint completed"
    ]


def test_megatron_lines() -> None:
    assert events("megatron") == [
        ("checkpointLoaded", 100, None),
        ("progress", 110, 6.54321),
        ("checkpointStarted", 120, None),
        ("checkpointCompleted", 120, None),
    ]


def test_litgpt_lines_take_the_path_step_and_a_save_completes_at_the_next_step() -> None:
    """Captured from litgpt 0.5.13's own pretraining (resumed from step 20, saving at 40)."""
    found = events("litgpt")
    assert found[0] == ("checkpointLoaded", 20, None)  # "Resuming training from …/step-00000020/…"
    progress = [(step, loss) for kind, step, loss in found if kind == "progress"]
    assert progress[0] == (21, 6.204)
    assert [step for step, _ in progress] == list(range(21, 42))
    assert found[-3:] == [
        ("checkpointStarted", 40, None),  # "Saving checkpoint to '…/step-00000040/…'"
        ("checkpointCompleted", 40, None),  # fabric.save is synchronous: the next step line
        ("progress", 41, 6.172),
    ]


def test_litgpt_progress_is_the_optimizer_step_under_gradient_accumulation() -> None:
    """With accumulation litgpt prints each micro-batch ``iter`` and the optimizer ``step``
    (pretrain.py's format; the captured run above has none)."""
    line = (
        "Epoch 1 | iter 44 step 11 | loss train: 9.871, val: n/a | iter time: 120.33 ms"
        " (step) remaining time: 0:00:10"
    )
    assert Matcher(Spec({"preset": "litgpt"})).feed(line) == [("progress", 11, 9.871)]


def test_step_base_index_adds_one_and_completed_keeps_the_number() -> None:
    line = "it 4 done"
    index = Matcher(Spec({"patterns": {"progress": r"it (?P<step>\d+)"}, "stepBase": "index"}))
    done = Matcher(Spec({"patterns": {"progress": r"it (?P<step>\d+)"}}))
    assert index.feed(line) == [("progress", 5, None)]
    assert done.feed(line) == [("progress", 4, None)]


@pytest.mark.parametrize(
    ("path", "step"),
    [
        ("/ckpt/step-100", 100),
        ("out/checkpoint-2500/", 2500),
        ("/megatron/iter_0000700", 700),
        ("lightning_logs/epoch=3-step=1200.ckpt", 1200),
        ("/ds/global_step300", 300),
        ("out/ckpt.pt", None),
        ("/runs/mystep-5x", None),
    ],
)
def test_the_step_a_path_names(path: str, step: int | None) -> None:
    assert step_from_path(path) == step


def test_the_step_a_path_names_is_found_as_by_a_search_from_every_position() -> None:
    # The shipped regex is laid out for speed (the lookbehind after its "s"); this one, the
    # plain statement of the rule, finds the same steps in paths made of their words.
    import random

    plain = re.compile(
        r"(?:(?<![A-Za-z])step[-_=]?|checkpoint-|iter_|global_step)0*(\d{1,12})(?!\d)"
    )
    words = ["step", "s", "tep", "-", "_", "=", "0", "7", "12", "/", "x", "A", ".", "checkpoint-"]
    words += ["iter_", "global_step", "global", "1234567890123"]
    rng = random.Random(44)
    for _ in range(5000):
        path = "".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
        found = plain.findall(path)
        assert step_from_path(path) == (int(found[-1]) if found else None), path


def test_a_save_line_without_any_step_is_not_reported() -> None:
    matcher = Matcher(Spec({"preset": "nanogpt"}))
    assert matcher.feed("saving checkpoint to out") == []  # no "step N:" line before it
    matcher.feed("step 250: train loss 1.0, val loss 1.0")
    matcher.feed("iter 250: loss 1.0000, time 1.00ms, mfu 1.00%")
    # only_save_checkpoint_at_end: a save after steps, with no eval line right before it
    assert matcher.feed("saving checkpoint to out") == []


def test_a_nanogpt_out_dir_that_looks_like_a_step_is_not_a_step() -> None:
    matcher = Matcher(Spec({"preset": "nanogpt"}))
    assert matcher.feed("Resuming training from runs/step-5000") == []
    assert matcher.feed("step 250: train loss 1.0, val loss 1.0") == [
        ("checkpointLoaded", 250, None)
    ]


def test_what_a_pattern_sees() -> None:
    assert clean_line("\x1b[1;31mstep: 3\x1b[0m") == "step: 3"
    assert clean_line("iter 1: loss 2\riter 2: loss 1\r") == "iter 2: loss 1"
    assert len(clean_line("x" * (MAX_LINE_CHARS * 4))) == MAX_LINE_CHARS
    assert strip_relay("[rank3]:iter 5: loss 1") == ("iter 5: loss 1", 3)
    assert strip_relay("[default0]: iter 5") == ("iter 5", 0)
    assert strip_relay("(RayTrainWorker pid=42) iter 5") == ("iter 5", None)


def with_rules(spec: Spec, kind: str | None = None, *, everywhere: bool = False) -> Matcher:
    """A matcher of ``spec`` with its rule of ``kind`` only (None: all of them), each
    pattern searched in the whole line when ``everywhere`` (as before the bound)."""
    matcher = Matcher(spec)
    matcher._rules = [
        (k, pattern, (None, False, None) if everywhere else plan)
        for k, pattern, plan in matcher._rules
        if kind is None or k == kind
    ]
    return matcher


def preset_lines() -> list[str]:
    """Every sample line of every preset, and each again behind text that is no trainer's,
    and each with its first 12 characters repeated before it (fixed text, up to 3 times)."""
    lines = []
    for path in sorted(DATA.glob("*.log")):
        for raw in path.read_text().splitlines():
            line = clean_line(raw)
            lines += [line, "noise 42 | " + line, line[:12] * 3 + line, "step " + line]
    return lines


@pytest.mark.parametrize("preset", ["nanogpt", "torchtitan", "megatron", "litgpt"])
def test_each_preset_pattern_finds_what_a_search_of_the_line_finds(preset: str) -> None:
    # Every preset pattern is tried only where its fixed start appears (so the worst a
    # line can cost is bounded); on the trainers' lines that finds what a search finds.
    spec = Spec({"preset": preset})
    assert all(plan[0] is not None for _k, _p, plan in Matcher(spec)._rules)
    for kind in (None, *(k for k, _p, _plan in Matcher(spec)._rules)):
        bounded, everywhere = with_rules(spec, kind), with_rules(spec, kind, everywhere=True)
        for line in preset_lines():
            assert bounded.feed(line) == everywhere.feed(line), (kind, line)


def test_a_pattern_is_tried_at_the_first_places_of_its_fixed_start_only() -> None:
    from recoverygate.evidence import MAX_TRIES

    matcher = Matcher(Spec({"preset": "megatron"}))
    real = "successfully saved checkpoint from iteration 100"
    decoys = "successfully saved checkpoint from iteration x; "
    assert matcher.feed(decoys * (MAX_TRIES - 1) + real) == [("checkpointCompleted", 100, None)]
    # a line naming it more often than a trainer's would: left unmatched by that pattern
    assert matcher.feed(decoys * MAX_TRIES + real) == []


@pytest.mark.parametrize(
    ("regex", "plan"),
    [
        (r"^iter (?P<step>\d+)", (("iter ",), True, None)),
        (r"\bstep:\s*(?P<step>\d+)", (("step:",), False, None)),
        (r"\b(?:Saving|Staging) the", (("Saving the", "Staging the"), False, None)),
        (r"(?P<g>abc|abd)x", (("abcx", "abdx"), False, None)),
        (r"foo ?bar(?P<step>\d+)", (("foo",), False, None)),
        (r"(?i)iter (?P<step>\d+)", (None, False, None)),  # case-insensitive: everywhere
        (r"\bfoo|bar", (None, False, None)),  # the \b is the first alternative's only
        (r".*step (?P<step>\d+)", (None, False, "step ")),
        (r"(?m)^step (?P<step>\d+)", (None, False, "step ")),
        (r"(?<=x)step (?P<step>\d+)", (None, False, "step ")),
    ],
)
def test_how_a_pattern_is_looked_for(regex: str, plan: tuple[object, ...]) -> None:
    from recoverygate.evidence import _plan

    assert _plan(re.compile(regex)) == plan


@pytest.mark.parametrize(
    ("data", "where", "says"),
    [
        ({"preset": "nanogtp"}, ("preset",), "unknown preset 'nanogtp'"),
        ({"patterns": {"progress": "iter (\\d+"}}, ("patterns", "progress"), "does not compile"),
        ({"patterns": {"progress": "iter \\d+"}}, ("patterns", "progress"), "(?P<step>"),
        ({"patterns": {"checkpointStarted": "saving"}}, ("patterns", "checkpointStarted"), "path"),
        ({"patterns": {"progress": "(?P<step>(\\d+)+)x"}}, ("patterns", "progress"), "catastroph"),
        (
            {"patterns": {"progress": "(?:a|ab)*(?P<step>\\d)"}},
            ("patterns", "progress"),
            "alternatives",
        ),
        ({"patterns": {"bogus": "x"}}, ("patterns", "bogus"), "unknown kind"),
        ({"stepBase": "zero", "preset": "nanogpt"}, ("stepBase",), "completed or index"),
        ({}, (), "a preset or at least one pattern"),
    ],
)
def test_bad_specs_are_refused_with_the_key(
    data: dict[str, object], where: tuple[str, ...], says: str
) -> None:
    found = problems(data)
    assert found, data
    assert found[0][0] == where
    assert says in found[0][1]


def test_a_pattern_slow_on_long_lines_is_refused_and_the_time_is_bounded() -> None:
    import time

    start = time.perf_counter()
    message = pattern_problem("progress", r"\s*\s*\s*\s*\s*\s*x(?P<step>\d)")
    took = time.perf_counter() - start
    assert message is not None
    assert message.startswith("too slow")
    assert took < 5.0  # stopped on a short probe line, not run on a 1024-character one


def test_every_preset_pattern_passes_its_own_validation() -> None:
    from recoverygate.evidence import KINDS, PRESETS

    for preset, table in PRESETS.items():
        for kind in KINDS:
            if table[kind] is not None:
                assert pattern_problem(kind, table[kind], grouped=False) is None, (preset, kind)


def test_an_invalid_spec_in_the_environment_turns_matching_off() -> None:
    assert spec_from_json('{"evidence": {"preset": "nope"}}') is None
    assert spec_from_json("{not json") is None
    assert spec_from_json('{"evidence": {"preset": "nanogpt"}}') is not None


# ---------------------------------------------------------------------------- the hook

JOB = r"""
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
print("step 0: train loss 4.0000, val loss 4.0000")
sys.stdout.write("iter 0: loss 3.5")
sys.stdout.write("000, time 1.00ms, mfu -100.00%\n")
print("[rank1]:iter 7: loss 1.0000, time 1.00ms, mfu -100.00%")
print("step 1: train loss 3.0000, val loss 3.0000")
print("saving checkpoint to out")
logging.info("iter 1: loss 2.5000, time 1.00ms, mfu -100.00%")
print("tapped" if type(sys.stdout).__name__ == "_Tap" else "plain")
"""


#: What a launcher gives a process; the tests set it themselves.
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
#: The environment torchrun gives a worker it starts.
WORKER_ENV = {"LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"}
#: A stand-in for torchrun's module, loaded as the agent has it.
FAKE_AGENT = "import sys, types; sys.modules['torch.distributed.run'] = types.ModuleType('r')\n"


def run_job(
    env_value: str | None, source: str = JOB, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (AUTO_ENV, *LAUNCHER_ENV)}
    if env_value is not None:
        env[AUTO_ENV] = env_value
    env.update(extra or {})
    return subprocess.run(
        [sys.executable, "-c", source],
        env=env,
        capture_output=True,
        text=True,
        timeout=patience.within(patience.JOB),
        check=True,
    )


def steps_of(stdout: str) -> list[tuple[object, object]]:
    """The (event, step) pairs a process reported, its start left out."""
    return [(e["event"], e.get("step")) for e in sentinel_events(stdout) if e["event"] != "start"]


def sentinel_events(stdout: str) -> list[dict[str, object]]:
    return [
        json.loads(line.split(" ", 1)[1])
        for line in stdout.splitlines()
        if line.startswith("RECOVERYGATE/v1 ")
    ]


@pytest.mark.slow
def test_the_hook_reports_each_match_as_a_line_of_the_process_and_passes_the_rest() -> None:
    done = run_job(json.dumps({"evidence": {"preset": "nanogpt"}}))
    found = sentinel_events(done.stdout)
    start, *rest = found
    assert start["event"] == "start"
    assert {e["inc"] for e in found} == {start["inc"]}
    assert [(e["event"], e["step"], e.get("loss")) for e in rest] == [
        ("progress", 1, 3.5),
        ("checkpoint_started", 1, None),
        ("checkpoint_completed", 1, None),  # the logging line on stderr completes it
        ("progress", 2, 2.5),
    ]
    plain = run_job(None)
    own = [line for line in done.stdout.splitlines() if not line.startswith("RECOVERYGATE/v1")]
    assert own[:-1] == plain.stdout.splitlines()[:-1]  # the job's lines, unchanged
    assert (own[-1], plain.stdout.splitlines()[-1]) == ("tapped", "plain")
    assert done.stderr == plain.stderr


@pytest.mark.slow
def test_a_torchrun_agent_matches_nothing() -> None:
    done = run_job(json.dumps({"evidence": {"preset": "nanogpt"}}), FAKE_AGENT + JOB)
    assert sentinel_events(done.stdout) == []


@pytest.mark.slow
def test_an_agent_given_local_rank_by_its_launcher_still_matches_nothing() -> None:
    """Slurm scripts export ``LOCAL_RANK=$SLURM_LOCALID`` before torchrun. Taken for a
    worker, such an agent matched the lines it relays under a prefix of its own
    (``--role trainer`` gives ``[trainer0]:``): every event twice, once as the agent."""
    done = run_job(
        json.dumps({"evidence": {"preset": "nanogpt"}}),
        FAKE_AGENT + JOB.replace("[rank1]:", "[trainer1]:"),
        extra={"LOCAL_RANK": "0"},
    )
    assert sentinel_events(done.stdout) == []


@pytest.mark.slow
def test_an_agent_that_prints_before_it_has_imported_torchrun_matches_nothing() -> None:
    """``python -m torch.distributed.run`` imports torch before its own module, and torch
    may warn; the agent is the agent once torchrun's module is there."""
    done = run_job(
        json.dumps({"evidence": {"preset": "nanogpt"}}),
        "import warnings; warnings.warn('a warning while torch imports')\n" + FAKE_AGENT + JOB,
    )
    assert "a warning while torch imports" in done.stderr  # the premise: a line came first
    assert sentinel_events(done.stdout) == []


@pytest.mark.slow
def test_a_worker_forked_from_the_agent_matches_its_own_lines() -> None:
    """A function entrypoint's workers may be forked from the agent, tap and all; torchrun
    gives each its worker environment before the function runs."""
    fork = (
        FAKE_AGENT
        + "import os\nprint('agent up', flush=True)\npid = os.fork()\nif pid:\n"
        + "    os.waitpid(pid, 0)\n    raise SystemExit(0)\n"
        + "".join(f"os.environ[{k!r}] = {v!r}\n" for k, v in WORKER_ENV.items())
    )
    done = run_job(json.dumps({"evidence": {"preset": "nanogpt"}}), fork + JOB)
    assert "agent up" in done.stdout  # the premise: the agent printed before the fork
    worker = run_job(json.dumps({"evidence": {"preset": "nanogpt"}}), extra=WORKER_ENV)
    assert steps_of(done.stdout) == steps_of(worker.stdout) != [], done.stdout


@pytest.mark.slow
def test_a_worker_that_imports_torchruns_agent_server_still_matches() -> None:
    """torch.distributed.checkpoint imports torchrun's agent server (its async process
    executor does): every DCP job, torchtitan's among them, and transformers.trainer. Taken
    for the agent, such a worker reported nothing (found drilling torchtitan)."""
    pytest.importorskip("torch")
    dcp = "import sys, torch.distributed.checkpoint\n"
    probe = "\nagent = 'torch.distributed.elastic.agent.server.local_elastic_agent'\n"
    done = run_job(
        json.dumps({"evidence": {"preset": "nanogpt"}}),
        dcp + JOB + probe + "print('agent server imported' if agent in sys.modules else '')\n",
        extra=WORKER_ENV,
    )
    assert "agent server imported" in done.stdout  # the premise
    steps = [(e["event"], e["step"]) for e in sentinel_events(done.stdout)[1:]]
    assert steps[0] == ("progress", 1), done.stdout
    standalone = run_job(json.dumps({"evidence": {"preset": "nanogpt"}}), dcp + JOB)
    assert sentinel_events(standalone.stdout)[1:], "a plain python job (no torchrun) matches too"


# ---------------------------------------------------------------------------- the config

CONFIG = """\
name: ev
workload:
  orchestrator: local
  command: [python, train.py]
  env: {{RECOVERYGATE_AUTO: transformers}}
injectFailure: {{afterCheckpoint: next}}
expectations: {{maxRecoveryTime: 60s}}
evidence:
{evidence}
"""


def write(tmp_path: Path, evidence: str) -> Path:
    path = tmp_path / "recovery-test.yaml"
    path.write_text(CONFIG.format(evidence=evidence))
    return path


def test_a_launched_job_gets_the_spec_and_keeps_its_frameworks(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, "  preset: megatron\n  patterns: {progress: 'it (?P<step>\\d+)'}")
    )
    value = json.loads(with_evidence(config).env[AUTO_ENV])  # type: ignore[attr-defined]
    assert value == {
        "evidence": {"preset": "megatron", "patterns": {"progress": "it (?P<step>\\d+)"}},
        "frameworks": "transformers",
    }
    spec = spec_from_json(json.dumps(value))
    assert spec is not None
    assert (
        spec.sources["checkpointCompleted"]
        == Spec({"preset": "megatron"}).sources["checkpointCompleted"]
    )


@pytest.mark.parametrize(
    ("evidence", "says"),
    [
        ("  preset: nanogtp", "ev.yaml:9: evidence.preset: must be nanogpt"),
        ("  patterns: {progress: 'iter (\\d+'}", "evidence.patterns.progress: does not compile"),
        (
            "  patterns: {checkpointLoaded: 'loaded'}",
            "evidence.patterns.checkpointLoaded: a checkpointLoaded pattern needs",
        ),
        ("  patterns: {progress: '(?P<step>(\\d+)*)'}", "may backtrack catastrophically"),
    ],
)
def test_bad_evidence_exits_2_naming_file_line_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], evidence: str, says: str
) -> None:
    path = write(tmp_path, evidence)
    path = path.rename(tmp_path / "ev.yaml")
    assert cli_main(["validate", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert says.replace("ev.yaml", str(path)) in err or says in err, err
    assert "Traceback" not in err


def test_validate_prints_the_variable_for_a_job_it_attaches_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "  preset: nanogpt")
    assert cli_main(["validate", "-f", str(path)]) == 0
    out = capsys.readouterr().out
    assert """# export RECOVERYGATE_AUTO='{"evidence":{"preset":"nanogpt"}}'""" in out


# ---------------------------------------------------------------------------- the verdict


def test_a_drill_that_saw_no_matching_line_names_the_pattern_and_says_inconclusive(
    tmp_path: Path,
) -> None:
    from pytest_recoverygate.engine.machine import DrillResult, Verdict
    from pytest_recoverygate.engine.verdict import IncarnationInfo
    from pytest_recoverygate.runner import unmatched_evidence

    config = load_config(write(tmp_path, "  preset: nanogpt"))
    timeout = DrillResult(verdict=Verdict.ERROR, summary="no checkpoint completed within 1h")
    result = unmatched_evidence(timeout, config, [{"event": "start"}])
    assert result.summary.startswith("no checkpoint completed within 1h (inconclusive: ")
    assert (
        "no line matched the progress pattern (preset nanogpt) '^iter (?P<step>" in result.summary
    )
    kinds = sorted(note.split(" pattern ")[0].rsplit(" ", 1)[-1] for note in result.notes)
    assert kinds == [
        "checkpointStarted",
        "progress",
    ]  # nanogpt has no completion line; no replacement started, so no load was missed

    trained = [
        {"event": "progress"},
        {"event": "checkpoint_started"},
        {"event": "checkpoint_completed"},
    ]
    replacement = IncarnationInfo("b", 0, 2, "h", 1, True, 1.0, 1.0, None, 1, 2)
    failed = DrillResult(
        verdict=Verdict.FAIL, summary="resumed from step 0", incarnations=(replacement,)
    )
    result = unmatched_evidence(failed, config, trained)
    assert result.summary == "resumed from step 0"  # progress matched: no inconclusive
    assert [n.split(" pattern ")[0] for n in result.notes] == [
        "evidence: no line matched the checkpointLoaded"
    ]

    passed = DrillResult(verdict=Verdict.PASS, summary="ok")
    assert unmatched_evidence(passed, config, []) is passed


def test_a_group_member_with_its_own_variable_gets_the_spec_too(tmp_path: Path) -> None:
    path = tmp_path / "recovery-test.yaml"
    path.write_text(
        "workload:\n"
        "  orchestrator: local\n"
        "  group:\n"
        "    - {name: a, command: [python, a.py], env: {RECOVERYGATE_AUTO: torchft}}\n"
        "    - {name: b, command: [python, b.py]}\n"
        "injectFailure: {afterCheckpoint: next}\n"
        "expectations: {maxRecoveryTime: 60s}\n"
        "evidence: {preset: litgpt}\n"
    )
    workload = with_evidence(load_config(path))
    base = json.loads(workload.env[AUTO_ENV])  # type: ignore[attr-defined]
    first, second = workload.group  # type: ignore[attr-defined]
    assert base == {"evidence": {"preset": "litgpt"}}
    assert json.loads(first.env[AUTO_ENV]) == {**base, "frameworks": "torchft"}
    assert AUTO_ENV not in second.env  # it inherits the workload's
