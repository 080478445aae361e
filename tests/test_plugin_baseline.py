"""pytest's ``--drill-baseline=DIR`` and ``--drill-max-regression``, through ``pytester``
in-process (a new Python process per run cost seconds each). The baseline folder comes
from a pytest process of its own, as a user's earlier run makes it: it writes the
timeline pictures, and numpy imported inside an in-process run would be dropped by
pytester's module snapshot afterwards, which numpy refuses at its next import.

We test these aspects: a drill whose figures regressed against its report in the
baseline folder (an earlier ``--drill-report-dir`` run) fails with the table in its
failure text and in the JUnit properties; within the allowances it passes; a drill with
no baseline passes with a note; the ini twins work the same; a bad allowance or a
missing baseline folder is a usage error before anything runs.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import FAKE_DRILL, merge
from tests.patience import CLUSTER, within

SLOWER = {"workload": {"fake": {"restartDelay": "1500ms"}}}  # the group restarts 1 s later


def drill_file(pytester: pytest.Pytester, changes: dict[str, Any] | None = None) -> Path:
    path = pytester.path / "recovery-test.yaml"
    path.write_text(yaml.safe_dump(merge({**FAKE_DRILL, "name": "nightly"}, changes or {})))
    return path


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder a first pytest run wrote with --drill-report-dir (once per module)."""
    root = tmp_path_factory.mktemp("baseline")
    path = root / "recovery-test.yaml"
    path.write_text(yaml.safe_dump(merge({**FAKE_DRILL, "name": "nightly"}, {})))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"--rootdir={root}",
            f"--drill-config={path}",
            f"--drill-report-dir={root / 'base'}",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=within(CLUSTER),
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (root / "base" / "nightly" / "report.json").is_file()
    return root / "base"


def test_a_regressed_drill_fails_with_the_table_in_its_text_and_junit(
    pytester: pytest.Pytester, baseline: Path
) -> None:
    path = drill_file(pytester, SLOWER)
    out = pytester.path / "out.xml"
    result = pytester.runpytest_inprocess(
        f"--drill-config={path}",
        f"--drill-baseline={baseline}",
        "--drill-max-regression=recoveryTime=20%,lostSteps=40",
        f"--junitxml={out}",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*the drill regressed against its baseline (recoveryTime)*",
            "*figure*baseline*this run*change*allowed*",
            "*recoveryTime*20%*REGRESSED*",
            "*BASELINE recovery-test.yaml::drill: regressed against*: recoveryTime",
        ]
    )
    props = {p.get("name"): p.get("value") for p in ET.parse(out).getroot().iter("property")}
    prefix = "recoverygate.recovery-test.yaml::drill."
    assert props[prefix + "baseline.regressed"] == "recoveryTime"
    assert "REGRESSED" in (props[prefix + "baseline"] or "")
    assert props[prefix + "verdict"] == "PASS"  # the drill itself passed; the gate did not


def test_within_the_allowances_set_in_the_ini_file_it_passes(
    pytester: pytest.Pytester, baseline: Path
) -> None:
    pytester.makeini(
        f"[pytest]\ndrill_baseline = {baseline}\ndrill_max_regression = recoveryTime=5s\n"
    )
    path = drill_file(pytester, SLOWER)
    result = pytester.runpytest_inprocess(f"--drill-config={path}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*BASELINE *: compared with *no figure regressed*"])


def test_a_drill_without_a_baseline_passes_with_a_note(pytester: pytest.Pytester) -> None:
    (pytester.path / "empty").mkdir()
    path = drill_file(pytester)
    out = pytester.path / "out.xml"
    result = pytester.runpytest_inprocess(
        f"--drill-config={path}", "--drill-baseline=empty", f"--junitxml={out}"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*BASELINE *: no baseline (*nightly*report.json does not exist)*"])
    props = {p.get("name"): p.get("value") for p in ET.parse(out).getroot().iter("property")}
    assert "no baseline" in (props["recoverygate.recovery-test.yaml::drill.baseline"] or "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--drill-baseline=nowhere"],
            "*--drill-baseline/drill_baseline: *nowhere does not exist*",
        ),
        (
            ["--drill-baseline=.", "--drill-max-regression=recoveryTime=fast"],
            "*--drill-max-regression: recoveryTime='fast' is not an allowance*",
        ),
    ],
)
def test_bad_baseline_options_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    path = drill_file(pytester)
    result = pytester.runpytest_inprocess(f"--drill-config={path}", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
