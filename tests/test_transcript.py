"""Transcripts and ``recoverygate rejudge`` (pytest_recoverygate/transcript).

We test these aspects:
- every shipped fake-backend example (examples/fake/*.yaml), run by the runner on a
  simulated clock into a report folder, is rejudged from its transcript to the same
  result: the engine answers every call as recorded, the rejudged report equals the
  recorded report.json key for key (verdict, summary, reasons, checks, figures, timeline,
  costs, ...), and the result objects' verdict, summary, checks and figures are equal;
- the format: a header with the version, the versions of recoverygate and Python, the
  spec in plain JSON; each call with its arguments as full values; an end line last;
  ``--report`` alone writes none;
- the runner makes every input to the engine through its recorded door, none directly;
- ``rejudge`` exits as ``run`` does (0 PASS, 1 FAIL, 3 ERROR, an interrupted drill's
  too), prints the verdict, the checks and the differences, and ``--json`` all of it;
- ``-f``: the same drill judged under another config's expectations (a tighter SLO
  fails it; the config's other settings are named and not used; a drill that would have
  killed at another time cannot be judged from the transcript: ERROR, said so);
- hostile transcripts: each malformed one exits 2 with ``FILE:LINE: problem`` and no
  traceback (not a transcript, another version, not UTF-8, not JSON, nested too deeply,
  an empty line, an unknown call or key, a missing argument, a value of the wrong type
  with its field named, a line, a file or a line count past the bounds, no end line, a
  line after it, a transcript the recorder cut, a link, a folder without one); a value
  that makes the engine raise is an ERROR saying where, never a traceback;
- the recorder stops at the bounds, counts what it did not write and says so.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.cli import main
from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.engine.machine import DrillResult, Verdict
from pytest_recoverygate.errors import DrillInterrupted
from pytest_recoverygate.orchestrators import build_orchestrator
from pytest_recoverygate.registry.seams import SimulatedClock
from pytest_recoverygate.report.files import figures
from pytest_recoverygate.runner import RunOptions, Status, run_drill
from pytest_recoverygate.transcript import lines, read, record
from pytest_recoverygate.transcript.rejudge import rejudge
from tests.transcripts import assert_rejudged

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "fake"


def run_example(config_path: Path, report_dir: Path, **options: Any) -> DrillResult:
    """The drill on a simulated clock, its report folder written."""
    config = load_config(config_path)
    clock = SimulatedClock()
    return run_drill(
        config,
        RunOptions(report_dir=report_dir, handle_signals=False, **options),
        clock=clock,
        orchestrator=build_orchestrator(config, clock),
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Report folders of three examples: a PASS, a FAIL, a PASS of three kills."""
    base = tmp_path_factory.mktemp("transcripts")
    out = {}
    for name in ("recovery-test", "resume-zero", "repeated"):
        run_example(EXAMPLES / f"{name}.yaml", base / name)
        out[name] = base / name
    return out


def transcript_lines(folder: Path) -> list[dict[str, Any]]:
    text = (folder / lines.FILE_NAME).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def write_lines(path: Path, rows: list[Any]) -> Path:
    text = "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------ the examples, bit for bit


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_fake_example_is_rejudged_to_the_same_result(name: str, tmp_path: Path) -> None:
    result = run_example(EXAMPLES / name, tmp_path / "report")
    judged = assert_rejudged(tmp_path / "report")  # every answer, every key of report.json
    again = judged.result
    assert again.verdict is result.verdict
    assert again.summary == result.summary
    assert again.reasons == result.reasons
    assert [c.as_dict() for c in again.checks] == [c.as_dict() for c in result.checks]
    assert repr(figures(again)) == repr(figures(result))
    assert again.notes == result.notes
    assert again.timeline == result.timeline
    assert repr(again.costs) == repr(result.costs)
    assert judged.exit_code == result.exit_code


# ------------------------------------------------------------------ the format


def test_a_transcript_has_its_header_every_call_and_an_end_line(
    folders: dict[str, Path],
) -> None:
    rows = transcript_lines(folders["recovery-test"])
    header = rows[0]
    assert header["transcript"] == "recoverygate" and header["version"] == lines.VERSION
    assert {"recoverygate", "python", "spec", "started_at", "recorded_by"} <= set(header)
    assert header["spec"]["max_recovery_time"] == 3.0 and header["spec"]["sustain"]["lines"] == 3
    assert header["drill"] == "recovery-test" and header["orchestrator"] == "fake"
    calls = {row["call"] for row in rows[1:]}
    assert {"discovered", "on_training_event", "on_group_event", "on_kill_result", "tick"} <= (
        calls
    )
    event = next(row["event"] for row in rows[1:] if row["call"] == "on_training_event")
    assert set(event) == {
        "kind", "timestamp", "incarnation", "step", "received", "rank", "pid", "host",
        "restart_count", "digest", "digest_parts", "ppid", "parent", "world_size", "replica",
        "source", "peer", "loss", "data", "loss_decimals", "error", "thread",
    }  # fmt: skip
    kill = next(row for row in rows[1:] if row["call"] == "on_kill_result")
    assert kill["result"]["outcome"] == "killed"
    asked = [row for row in rows if any(a["action"] == "kill" for a in row.get("then", []))]
    assert len(asked) == 1  # the engine's answer is written beside the call that got it
    assert rows[-1]["call"] == "end" and rows[-1]["target"]["rank"] == 1


def test_report_alone_writes_no_transcript(tmp_path: Path) -> None:
    config = load_config(EXAMPLES / "resume-zero.yaml")
    clock = SimulatedClock()
    run_drill(
        config,
        RunOptions(report_path=tmp_path / "report.json", handle_signals=False),
        clock=clock,
        orchestrator=build_orchestrator(config, clock),
    )
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_the_runner_feeds_the_engine_only_through_its_door() -> None:
    source = (ROOT / "pytest_recoverygate" / "runner.py").read_text(encoding="utf-8")
    inputs = "|".join(lines.CALLS)
    assert re.findall(rf"engine\.({inputs})\(", source) == []
    assert source.count("DrillEngine(") == 1  # the one it makes, behind its door


# ------------------------------------------------------------------ the command


def test_rejudge_prints_the_verdict_checks_and_no_difference(
    folders: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rejudge", str(folders["recovery-test"])]) == 0
    out = capsys.readouterr().out
    assert "RecoveryGate verdict: PASS" in out
    assert "[ok  ] resume_step" in out
    assert "replay: every answer of the engine as recorded" in out
    assert "differences from the recorded report: none" in out


def test_rejudge_exits_1_on_a_fail_and_takes_the_file_itself(
    folders: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rejudge", str(folders["resume-zero"] / "transcript.jsonl")]) == 1
    assert "RecoveryGate verdict: FAIL" in capsys.readouterr().out
    doc = rejudge(folders["resume-zero"]).doc
    assert doc["reasons"][0] == "RESTARTED_FROM_SCRATCH"


def test_rejudge_json_has_the_report_and_the_differences(
    folders: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rejudge", str(folders["resume-zero"]), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["report"]["verdict"] == "FAIL" and out["exitCode"] == 1
    assert out["differences"] == [] and out["diverged"] == []
    assert out["version"] == 1 and out["expectations"] is None


def test_an_interrupted_drill_is_rejudged_to_interrupted_with_exit_3(tmp_path: Path) -> None:
    def observer(status: Status) -> None:
        if status.phase.name == "RECOVERING":
            raise KeyboardInterrupt

    with pytest.raises(DrillInterrupted):
        run_example(EXAMPLES / "recovery-test.yaml", tmp_path / "r", observer=observer)
    judged = assert_rejudged(tmp_path / "r")
    assert judged.result.verdict is Verdict.INTERRUPTED
    assert judged.exit_code == 3
    assert main(["rejudge", str(tmp_path / "r")]) == 3


def test_a_folder_of_one_drill_folder_is_found(folders: dict[str, Path], tmp_path: Path) -> None:
    outer = tmp_path / "outer"  # a --drill-report-dir folder of one drill
    shutil.copytree(folders["resume-zero"], outer / "resume-zero")
    assert assert_rejudged(outer).result.verdict is Verdict.FAIL


# ------------------------------------------------------------------ -f: other expectations


def write_config(path: Path, expectations: str, extra: str = "") -> Path:
    path.write_text(
        "workload:\n  orchestrator: fake\ninjectFailure:\n  type: KillWorker\n"
        f"  afterCheckpoint: step-40\n{extra}expectations:\n{expectations}",
        encoding="utf-8",
    )
    return path


def test_a_tighter_slo_fails_the_same_drill_without_running_it(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tight = write_config(tmp_path / "tight.yaml", "  maxRecoveryTime: 500ms\n  maxLostSteps: 30\n")
    assert main(["rejudge", str(folders["recovery-test"]), "-f", str(tight)]) == 1
    out = capsys.readouterr().out
    assert "expectations: from" in out and "max_recovery_time 3.0 -> 0.5" in out
    assert "came back too slowly" in out
    assert 'verdict: recorded "PASS", rejudged "FAIL"' in out


def test_a_looser_lost_steps_limit_and_the_settings_not_taken_are_named(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    other = write_config(
        tmp_path / "other.yaml",
        "  maxRecoveryTime: 3s\n  maxLostSteps: 1\n",
        extra="  targetRank: 0\n",
    )
    judged = rejudge(folders["recovery-test"], _spec(other))
    assert judged.result.verdict is Verdict.FAIL
    assert "LOST_TOO_MANY_STEPS" in [r.name for r in judged.result.reasons]
    assert judged.ignored == ("recovery_timeout", "target_rank")  # timeouts are the drill's
    assert [name for name, _, _ in judged.changed] == ["max_lost_steps"]


def test_expectations_under_which_the_drill_would_have_killed_elsewhere_are_not_judged(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    longer = write_config(
        tmp_path / "longer.yaml", "  maxRecoveryTime: 3s\n  sustain: 30s\n", extra="  count: 3\n"
    )
    judged = rejudge(folders["repeated"], _spec(longer))
    assert judged.result.verdict is Verdict.ERROR
    assert "would have acted otherwise" in judged.result.summary
    assert judged.exit_code == 3


def _spec(path: Path) -> Any:
    from pytest_recoverygate.config.schema import spec_from_config

    return spec_from_config(load_config(path))


def test_an_invalid_config_for_f_exits_2(folders: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: {orchestrator: fake}\nexpectations: {maxRecoveryTime: soon}\n")
    assert main(["rejudge", str(folders["recovery-test"]), "-f", str(bad)]) == 2


# ------------------------------------------------------------------ hostile transcripts


def _broken(rows: list[dict[str, Any]], case: str) -> list[Any]:
    """The transcript ``rows`` broken one way (see HOSTILE)."""
    rows = json.loads(json.dumps(rows))
    header, end = rows[0], rows[-1]
    calls: list[Any] = rows[1:-1]
    tick = next(i for i, row in enumerate(calls) if row["call"] == "tick")
    event = next(i for i, row in enumerate(calls) if row["call"] == "on_training_event")
    if case == "not-a-transcript":
        header.pop("transcript")
    elif case == "version":
        header["version"] = 2
    elif case == "version-text":
        header["version"] = "1"
    elif case == "spec-type":
        header["spec"]["max_recovery_time"] = "3s"
    elif case == "spec-unknown":
        header["spec"]["maxRecoveryTime"] = 3
    elif case == "unknown-call":
        calls[tick] = {"call": "explode", "now": 1.0}
    elif case == "no-call":
        calls[tick] = {"now": 1.0}
    elif case == "missing-argument":
        calls[tick] = {"call": "tick"}
    elif case == "unknown-key":
        calls[tick]["evil"] = True
    elif case == "wrong-type":
        calls[event]["event"]["step"] = "12"
    elif case == "bool-for-int":
        calls[event]["event"]["step"] = True
    elif case == "unknown-enum":
        calls[event]["event"]["kind"] = "exploded"
    elif case == "unknown-field":
        calls[event]["event"]["evil"] = 1
    elif case == "missing-field":
        del calls[event]["event"]["incarnation"]
    elif case == "pair":
        calls[event]["event"]["digest_parts"] = [["a", "b", "c"]]
    elif case == "nested":
        calls[tick] = {"call": "note", "at": 1.0, "kind": "x", "detail": "", "data": {}}
        calls[tick]["data"]["deep"] = [[[[[[[[[[[[1]]]]]]]]]]]]
    elif case == "then":
        calls[tick]["then"] = [{"action": "launch"}]
    elif case == "array":
        calls[tick] = [1, 2]
    elif case == "empty-line":
        return [header, *calls[:tick], "", *calls[tick + 1 :], end]
    elif case == "no-end":
        return [header, *calls]
    elif case == "after-end":
        return [header, *calls, end, calls[tick]]
    elif case == "cut":
        end.update(cut="the drill made more than 10 calls", unrecorded=5)
    return [header, *calls, end]


#: case -> the line it breaks (1: the header, T: the tick broken, E: the event, L: the
#: last line) and the problem said.
HOSTILE = {
    "not-a-transcript": ("1", "not a RecoveryGate transcript"),
    "version": ("1", "transcript version 2; recoverygate 0.1.0 reads version 1"),
    "version-text": ("1", "transcript version '1'"),
    "spec-type": ("1", "header: spec.max_recovery_time: '3s' is not a float"),
    "spec-unknown": ("1", "unknown field 'maxRecoveryTime' of DrillSpec"),
    "unknown-call": ("T", "'explode' call; a line is one of the calls discovered"),
    "no-call": ("T", "no call; a line is one of the calls"),
    "missing-argument": ("T", "tick: the argument 'now' is missing"),
    "unknown-key": ("T", "tick: unknown key 'evil'"),
    "wrong-type": ("E", "on_training_event: event.step: '12' is not an int"),
    "bool-for-int": ("E", "event.step: True is not an int"),
    "unknown-enum": ("E", "event.kind: 'exploded' is no TrainingEventKind"),
    "unknown-field": ("E", "unknown field 'evil' of TrainingEvent"),
    "missing-field": ("E", "event.incarnation: missing (a field of TrainingEvent)"),
    "pair": ("E", "event.digest_parts[0]: a list of 3 values, not 2"),
    "nested": ("T", "nested deeper than a transcript line is"),
    "then": ("T", "'then' is not a list of actions"),
    "array": ("T", "list, not a JSON object"),
    "empty-line": ("T", "an empty line; each line is one JSON object"),
    "no-end": ("L", "ends without its end line"),
    "after-end": ("L", "a line after the end line"),
    "cut": ("L", "the transcript was cut (the drill made more than 10 calls); 5 call(s)"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_malformed_transcript_is_refused_with_its_file_and_line(
    case: str,
    folders: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = transcript_lines(folders["resume-zero"])
    broken = _broken(rows, case)
    path = write_lines(tmp_path / "transcript.jsonl", broken)
    where, said = HOSTILE[case]
    tick = 2 + next(i for i, r in enumerate(rows[1:]) if r["call"] == "tick")
    event = 2 + next(i for i, r in enumerate(rows[1:]) if r["call"] == "on_training_event")
    line = {"1": 1, "T": tick, "E": event, "L": len(broken)}[where]
    assert main(["rejudge", str(path)]) == 2
    err = capsys.readouterr().err
    assert f" rejudge: {path}:{line}: " in err, err
    assert said in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "line", "said"),
    [
        (b"", None, "empty; a transcript starts with its header line"),
        (b"\xff\xfe{}\n", 1, "not UTF-8"),
        (b"{not json\n", 1, "not JSON"),
        (b"[" * 100_000 + b"\n", 1, "JSON nested too deeply"),
        (b"9" * 5000 + b"\n", 1, "not JSON"),
    ],
    ids=["empty", "not-utf8", "not-json", "deep", "huge-int"],
)
def test_bytes_that_are_no_transcript_are_refused(
    content: bytes,
    line: int | None,
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "transcript.jsonl"
    path.write_bytes(content)
    assert main(["rejudge", str(path)]) == 2
    err = capsys.readouterr().err
    assert (f"{path}:{line}: " if line else f"{path}: ") in err, err
    assert said in err and "Traceback" not in err, err


@pytest.mark.parametrize("bound", ["MAX_LINE_BYTES", "MAX_LINES", "MAX_BYTES"])
def test_a_transcript_past_a_bound_is_refused(
    bound: str,
    folders: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    limit = {"MAX_LINE_BYTES": 200, "MAX_LINES": 50, "MAX_BYTES": 20_000}[bound]
    monkeypatch.setattr(read, bound, limit)
    assert main(["rejudge", str(folders["resume-zero"])]) == 2
    err = capsys.readouterr().err
    said = {
        "MAX_LINE_BYTES": "bytes; a transcript line has at most 200",
        "MAX_LINES": ":51: more than 50 lines",
        "MAX_BYTES": "over 20,000 bytes",
    }[bound]
    assert said in err and "Traceback" not in err, err


def test_paths_that_are_no_transcript_are_refused(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = tmp_path / "link.jsonl"
    link.symlink_to(folders["resume-zero"] / "transcript.jsonl")
    assert main(["rejudge", str(link)]) == 2
    assert "not read: link.jsonl is a symbolic link" in capsys.readouterr().err
    assert main(["rejudge", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["rejudge", str(tmp_path / "empty")]) == 2
    assert "holds no transcript.jsonl" in capsys.readouterr().err
    assert main(["rejudge", str(folders["recovery-test"].parent)]) == 2
    assert "holds the transcripts of 3 drills" in capsys.readouterr().err


def test_a_value_that_makes_the_engine_raise_is_an_error_that_says_where(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = transcript_lines(folders["resume-zero"])
    # the last step before the kill stamped NaN (a float the reader accepts, a value the
    # wire never lets through): the lost-work arithmetic raises on it
    kill = next(i for i, row in enumerate(rows[1:], start=1) if row["call"] == "on_kill_result")
    decided = max(
        i
        for i, row in enumerate(rows[:kill])
        if row.get("call") == "on_training_event" and row["event"]["kind"] == "progress"
    )
    rows[decided]["event"]["timestamp"] = math.nan
    path = write_lines(tmp_path / "transcript.jsonl", rows)
    assert main(["rejudge", str(path)]) == 3
    out = capsys.readouterr()
    assert "RecoveryGate verdict: ERROR" in out.out
    raised = "the engine raised ValueError: cannot convert float NaN to integer"
    at = re.search(rf"{re.escape(str(path))}:(\d+): on_training_event raised ValueError", out.out)
    assert at is not None and int(at.group(1)) > decided, out.out  # where it raised, after it
    assert f"{raised} replaying transcript.jsonl:{at.group(1)}" in out.out
    assert "Traceback" not in out.err + out.out


# ------------------------------------------------------------------ the recorder's bounds


def test_the_recorder_stops_at_its_bound_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(record, "MAX_LINES", 40)
    result = run_example(EXAMPLES / "resume-zero.yaml", tmp_path / "r")
    assert result.verdict is Verdict.FAIL  # recording never costs the drill its verdict
    rows = transcript_lines(tmp_path / "r")
    assert len(rows) <= 40
    assert rows[-1]["cut"] == "the drill made more than 38 calls"
    assert rows[-1]["unrecorded"] > 0
    assert main(["rejudge", str(tmp_path / "r")]) == 2
    assert "the transcript was cut (the drill made more than 38 calls)" in capsys.readouterr().err


# ------------------------------------------------------------------ CI: failed drills kept


def test_a_failed_test_keeps_its_drills_report_folders_and_says_where(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests import conftest

    monkeypatch.setenv("RECOVERYGATE_KEEP_FAILED_DRILLS", str(tmp_path / "kept"))
    pytester.makeconftest(
        "from tests.conftest import (pytest_runtest_makereport, pytest_runtest_setup,\n"
        "    pytest_terminal_summary)\n"
    )
    pytester.makepyfile(
        """
        from tests import cli_drill

        def drill(tmp_path, name):
            folder = tmp_path / name
            folder.mkdir()
            (folder / "transcript.jsonl").write_text("{}\\n")
            cli_drill.RAN.append(folder)

        def test_a_drill_that_fails(tmp_path):
            drill(tmp_path, "report")
            assert False, "the verdict was not the one expected"

        def test_a_drill_that_passes(tmp_path):
            drill(tmp_path, "report")
        """
    )
    try:
        result = pytester.runpytest("-p", "no:cacheprovider")
    finally:
        kept, conftest.KEPT_DRILLS[:] = list(conftest.KEPT_DRILLS), []
    result.assert_outcomes(passed=1, failed=1)
    folder = (
        tmp_path
        / "kept"
        / "test_a_failed_test_keeps_its_drills_report_folders_and_says_where.py_test_a_drill_that_fails"
        / "report"
    )
    assert kept == [folder]
    assert (folder / "transcript.jsonl").read_text() == "{}\n"
    result.stdout.fnmatch_lines(
        [
            "*recoverygate: the report folders of this test's drills, kept*",
            f"*recoverygate rejudge {folder}",
            "*recoverygate: failed drills kept*",
        ]
    )
    assert [p.name for p in (tmp_path / "kept").iterdir()] == [folder.parent.name]
