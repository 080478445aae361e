"""``recoverygate compare BASE NEW``: a drill's figures against a baseline report.

We test these aspects: the table (every figure of the reports: base, new, change), the
exit codes (0 without or within the allowances, 1 beyond one or on a verdict that went
from PASS to FAIL or ERROR, allowances or not, 2 on bad input with a
message naming it and no traceback), relative, absolute and phase allowances, the
warning (or refusal with ``--strict``) for different drills, and that a figure a newer
report carries slots in without a change to the table of known figures.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_recoverygate.cli import main
from pytest_recoverygate.errors import BaselineError
from pytest_recoverygate.report.compare import (
    compare,
    extract_figures,
    load_report,
    parse_allowances,
)
from tests.trend_reports import run_fake_drill


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A fast run, a slower one (the group restarts 1 s later) and another drill's."""
    root = tmp_path_factory.mktemp("compare")
    fast = run_fake_drill(root / "fast")
    slow = run_fake_drill(root / "slow", {"workload": {"fake": {"restartDelay": "1500ms"}}})
    other = run_fake_drill(root / "other", name="other-drill")
    assert (fast[0], slow[0], other[0]) == (0, 0, 0)
    return {"fast": fast[1], "slow": slow[1], "other": other[1]}


def doc(path: Path) -> dict[str, Any]:
    return load_report(path)


def rows(out: str) -> dict[str, list[str]]:
    """The table's rows by figure name (cells split on runs of two spaces)."""
    table: dict[str, list[str]] = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("  ") if c.strip()]
        if len(cells) > 2:
            table[cells[0]] = cells
    return table


def test_without_allowances_it_prints_every_figure_and_exits_0(
    reports: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(reports["fast"]), str(reports["slow"])]) == 0
    out = capsys.readouterr().out
    table = rows(out)
    base, new = doc(reports["fast"]), doc(reports["slow"])
    # recovery time, each phase of the breakdown, lost steps, lost work, save stall, step time
    for figure in ("recoveryTime", "lostSteps", "lostWork", "saveStall", "stepTime"):
        assert figure in table, out
    for phase in base["breakdown"]:
        assert phase in table, out
    recovery = table["recoveryTime"]
    assert recovery[1] == f"{base['recoveryTimeSeconds']:.3f}s"
    assert recovery[2] == f"{new['recoveryTimeSeconds']:.3f}s"
    delta = new["recoveryTimeSeconds"] - base["recoveryTimeSeconds"]
    assert recovery[3].startswith(f"{delta:+.3f}s")
    assert "REGRESSED" not in out
    assert "figures shown only" in out


def test_a_figure_beyond_its_allowance_is_marked_and_exits_1(
    reports: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "compare",
            str(reports["fast"]),
            str(reports["slow"]),
            "--max-regression",
            "recoveryTime=20%,lostSteps=100,checkpointLoaded=2s",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    table = rows(out)
    assert table["recoveryTime"][-1] == "REGRESSED"
    assert table["recoveryTime"][-2] == "20%"
    assert table["lostSteps"][-1] in ("ok", "improved")
    assert table["checkpointLoaded"][-1] in ("ok", "improved")
    assert "regressed beyond the allowance: recoveryTime" in out


def test_the_slower_phase_alone_regresses_by_its_own_duration(
    reports: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # The slow run's group restarts 1 s later: the replacement-running phase takes that
    # second; the phases after it take as long as before.
    code = main(
        [
            "compare",
            str(reports["fast"]),
            str(reports["slow"]),
            "--max-regression",
            "replacementRunning=500ms,firstStepAfterResume=500ms",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    table = rows(out)
    assert table["replacementRunning"][-1] == "REGRESSED"
    assert table["firstStepAfterResume"][-1] in ("ok", "improved")


def test_a_generous_absolute_allowance_passes(
    reports: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["compare", str(reports["fast"]), str(reports["slow"] / "report.json")]
    assert main([*args, "--max-regression", "recoveryTime=10s"]) == 0
    assert rows(capsys.readouterr().out)["recoveryTime"][-1] == "ok"
    # and the other way round, the slower run as the baseline, it improved
    assert main(["compare", args[2], args[1], "--max-regression", "recoveryTime=0%"]) == 0
    assert rows(capsys.readouterr().out)["recoveryTime"][-1] == "improved"


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda tmp, good: [str(tmp / "missing.json"), good], "missing.json"),
        (lambda tmp, good: [str(tmp), good], "holds no report.json"),
        (lambda tmp, good: [good, str(tmp / "other.json")], "no drill report"),
        (lambda tmp, good: [good, str(tmp / "broken.json")], "not JSON"),
        (lambda tmp, good: [good, good, "--max-regression", "recoveryTime=fast"], "'fast'"),
        (lambda tmp, good: [good, good, "--max-regression", "speed=5%"], "unknown figure 'speed'"),
        (lambda tmp, good: [good, good, "--max-regression", "recoveryTime"], "FIGURE=ALLOWANCE"),
    ],
    ids=[
        "missing",
        "folder-without-report",
        "not-a-report",
        "not-json",
        "bad-allowance",
        "unknown-figure",
        "no-equals",
    ],
)
def test_bad_input_exits_2_with_a_message_naming_it(
    reports: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Any,
    named: str,
) -> None:
    (tmp_path / "other.json").write_text(json.dumps({"name": "a coverage report"}))
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["compare", *make(tmp_path, str(reports["fast"]))]) == 2
    err = capsys.readouterr().err
    assert named in err
    assert "Traceback" not in err


def test_a_drill_report_dir_of_one_drill_is_a_report_folder_too(
    reports: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --drill-report-dir=DIR writes DIR/<drill>/report.json
    assert main(["compare", str(reports["fast"].parent), str(reports["slow"].parent)]) == 0
    assert "recoveryTime" in capsys.readouterr().out
    both = tmp_path / "both"
    for name in ("fast", "other"):
        shutil.copytree(reports[name], both / reports[name].name)
    assert main(["compare", str(both), str(reports["slow"])]) == 2
    assert "holds the reports of 2 drills (nightly, other-drill)" in capsys.readouterr().err


def test_different_drills_warn_and_strict_refuses(
    reports: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["compare", str(reports["fast"]), str(reports["other"])]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "warning: base and new are different drills: 'nightly' and 'other-drill'" in captured.err
    assert "recoveryTime" in captured.out
    assert main([*args, "--strict"]) == 2
    captured = capsys.readouterr()
    assert "refused (--strict)" in captured.err
    assert captured.out == ""


def test_a_new_report_figure_slots_in_without_a_table_row(reports: dict[str, Path]) -> None:
    # Another backend adds a figure to its report (a live recovery's heal time, say): it
    # is compared, and gated, by its key, lower being better.
    base, new = load_report(reports["fast"]), load_report(reports["slow"])
    base["healTimeSeconds"], new["healTimeSeconds"] = 1.0, 1.5
    comparison = compare(base, new, parse_allowances("healTimeSeconds=10%", "test"))
    [regressed] = [r for r in comparison.regressed if r.figure == "healTimeSeconds"]
    assert (regressed.base, regressed.new) == (1.0, 1.5)
    # in the costs too
    base["costs"]["detectionTimeSeconds"], new["costs"]["detectionTimeSeconds"] = 0.5, 0.5
    comparison = compare(base, new, parse_allowances("detectionTimeSeconds=0s", "test"))
    [row] = [r for r in comparison.rows if r.figure == "detectionTimeSeconds"]
    assert row.status.value == "ok"
    # a limit or a setting is not a figure
    assert "maxRecoveryTimeSeconds" not in extract_figures(new)
    assert "checkpointIntervalSeconds" not in extract_figures(new)


def test_a_relative_allowance_on_a_zero_base_allows_nothing(reports: dict[str, Path]) -> None:
    base, new = load_report(reports["fast"]), load_report(reports["fast"])
    base["lostSteps"], new["lostSteps"] = 0, 1
    comparison = compare(base, new, parse_allowances("lostSteps=50%", "test"))
    assert [r.figure for r in comparison.regressed] == ["lostSteps"]
    with pytest.raises(BaselineError, match="'-1%'"):
        parse_allowances("lostSteps=-1%", "test")


def test_a_pass_that_became_a_fail_exits_1_without_any_allowance(
    reports: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 41: PASS -> FAIL exited 0 unless --max-regression was given."""
    for verdict in ("FAIL", "ERROR"):
        failed = doc(reports["fast"]) | {"verdict": verdict, "summary": "resumed from step 0"}
        path = tmp_path / f"{verdict}.json"
        path.write_text(json.dumps(failed))
        assert main(["compare", str(reports["fast"]), str(path)]) == 1, verdict
        out = capsys.readouterr().out
        assert f"the verdict regressed (PASS to {verdict}): exit 1" in out
        assert main(["compare", str(reports["fast"]), str(path), "--markdown"]) == 1
        assert "the verdict regressed" in capsys.readouterr().out
    # the other way round is no regression; neither is PASS to PASS
    assert main(["compare", str(path), str(reports["fast"])]) == 0
    assert main(["compare", str(reports["fast"]), str(reports["slow"])]) == 0
