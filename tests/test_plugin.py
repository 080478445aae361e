"""The pytest plugin, exercised through ``pytester`` as a user would run it.

We test these aspects: drill items collected from ``--drill-config`` (no Python test
file), ``-m drill`` selection, the verdict as the test outcome, the JUnit XML content,
the ``recovery_drill`` fixture with the ``drill`` marker, ``--dry-run``, the refusal to
kill without ``--drill-yes``, the report header and the live phase lines.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import FAKE_DRILL, merge
from tests.transcripts import assert_rejudged

WriteDrill = Callable[..., Path]


def drill_file(
    pytester: pytest.Pytester,
    changes: dict[str, Any] | None = None,
    name: str = "recovery-test.yaml",
) -> Path:
    path = pytester.path / name
    path.write_text(yaml.safe_dump(merge(FAKE_DRILL, changes or {})))
    return path


def test_drill_config_runs_the_drill_as_a_test_item(pytester: pytest.Pytester) -> None:
    path = drill_file(pytester)
    result = pytester.runpytest(f"--drill-config={path}", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["recovery-test.yaml::drill PASSED*"])


def test_minus_m_drill_selects_drill_items(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_model="def test_model():\n    assert True\n")
    path = drill_file(pytester)
    result = pytester.runpytest(f"--drill-config={path}", "-m", "drill")
    result.assert_outcomes(passed=1, deselected=1)


def test_a_failing_drill_fails_the_test_with_the_verdict(pytester: pytest.Pytester) -> None:
    path = drill_file(pytester, {"workload": {"fake": {"resume": "zero"}}})
    result = pytester.runpytest(f"--drill-config={path}")
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*RecoveryGate verdict: FAIL*",
            "*resumed from step 0, expected step 40*the job restarted from scratch*",
        ]
    )


def test_junit_xml_carries_the_verdict_and_figures(pytester: pytest.Pytester) -> None:
    path = drill_file(pytester)
    out = pytester.path / "out.xml"
    result = pytester.runpytest(f"--drill-config={path}", f"--junitxml={out}")
    result.assert_outcomes(passed=1)
    root = ET.parse(out).getroot()
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    prefix = "recoverygate.recovery-test.yaml::drill."
    assert props[prefix + "verdict"] == "PASS"
    assert props[prefix + "resumeStep"] == "40"
    assert props[prefix + "expectedResumeStep"] == "40"
    assert float(props[prefix + "recoveryTimeSeconds"] or "nan") > 0
    assert prefix + "lostSteps" in props
    # Each check's state; the fake job's rank 1 says nothing about its load: not checked.
    assert props[prefix + "check.resume_step"] == "passed"
    assert props[prefix + "check.all_ranks_resumed"] == "unchecked"
    # xunit2 (the default) has no testcase properties: they sit on the testsuite.
    [case] = root.iter("testcase")
    assert case.find("properties") is None


def test_junit_xml_carries_the_replay_figures(pytester: pytest.Pytester) -> None:
    path = drill_file(
        pytester,
        {"workload": {"fake": {"replay": "data"}}, "expectations": {"replay": "exact"}},
    )
    out = pytester.path / "out.xml"
    result = pytester.runpytest(f"--drill-config={path}", f"--junitxml={out}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*replay diverged at step 41*", "*replayed steps (exact)*"])
    props = {p.get("name"): p.get("value") for p in ET.parse(out).getroot().iter("property")}
    prefix = "recoverygate.recovery-test.yaml::drill.replay."
    assert props[prefix + "mode"] == "exact"
    assert props[prefix + "firstDivergentStep"] == "41"
    assert props[prefix + "dataMatched"] == "False"
    assert prefix + "steps" not in props


def test_junit_xunit1_also_gets_testcase_properties(pytester: pytest.Pytester) -> None:
    path = drill_file(pytester, {"workload": {"fake": {"resume": "older"}}})
    out = pytester.path / "out.xml"
    result = pytester.runpytest(
        f"--drill-config={path}", f"--junitxml={out}", "-o", "junit_family=xunit1"
    )
    result.assert_outcomes(failed=1)
    [case] = ET.parse(out).getroot().iter("testcase")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["verdict"] == "FAIL"
    assert props["resumeStep"] == "20"
    failure = case.find("failure")
    assert failure is not None
    assert "older checkpoint" in (failure.get("message") or "") + (failure.text or "")


def test_the_fixture_and_marker_expose_the_figures(pytester: pytest.Pytester) -> None:
    drill_file(pytester, name="drill.yaml")
    pytester.makepyfile(
        test_recovery="""
        import pytest

        def test_model_unit():
            assert 1 + 1 == 2

        @pytest.mark.drill(config="drill.yaml")
        def test_resumes_from_latest(recovery_drill):
            result = recovery_drill.run()
            assert result.verdict.value == "PASS"
            assert result.resume_step == result.expected_resume_step == 40
            assert result.recovery_time_seconds < 2

        @pytest.mark.drill(config="drill.yaml",
                           overrides={"workload.fake.resume": "zero"})
        def test_overrides_change_the_job(recovery_drill):
            result = recovery_drill.run()
            assert result.resume_step == 0
            assert result.reasons[0].name == "RESTARTED_FROM_SCRATCH"
        """
    )
    result = pytester.runpytest("--strict-markers")
    result.assert_outcomes(passed=3)


def test_the_fixture_skips_without_any_config(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_drill(recovery_drill):
            recovery_drill.run()
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no drill config*--drill-config*"])


def test_dry_run_passes_without_killing(pytester: pytest.Pytester) -> None:
    path = drill_file(pytester, {"safety": {"requireConfirm": True}})
    result = pytester.runpytest(f"--drill-config={path}", "--dry-run")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*checking the kill of rank 1*", "*DRY-RUN*nothing was killed*"])


def test_a_drill_config_that_needs_confirmation_fails_without_drill_yes(
    pytester: pytest.Pytester,
) -> None:
    # A CI gate that ran nothing must not be green: the file was asked for by name.
    path = drill_file(pytester, {"safety": {"requireConfirm": True}})
    refused = pytester.runpytest(f"--drill-config={path}")
    refused.assert_outcomes(failed=1)
    assert refused.ret == pytest.ExitCode.TESTS_FAILED
    refused.stdout.fnmatch_lines(
        [
            "*safety.requireConfirm is true and nothing confirmed the kill, so the drill did not "
            "run. Confirm kills with --drill-yes (or drill_yes = true in the pytest ini file), set "
            "safety.requireConfirm: false in the drill config*",
        ]
    )
    refused.stdout.no_fnmatch_line("*discovering*")  # refused before anything was touched
    confirmed = pytester.runpytest(f"--drill-config={path}", "--drill-yes")
    confirmed.assert_outcomes(passed=1)


def test_the_ini_drill_config_that_needs_confirmation_also_fails(
    pytester: pytest.Pytester,
) -> None:
    drill_file(pytester, {"safety": {"requireConfirm": True}})
    pytester.makeini("[pytest]\ndrill_config = recovery-test.yaml\n")
    pytester.runpytest().assert_outcomes(failed=1)
    pytester.makeini("[pytest]\ndrill_config = recovery-test.yaml\ndrill_yes = true\n")
    pytester.runpytest().assert_outcomes(passed=1)


def test_a_marker_drill_that_needs_confirmation_skips_and_the_summary_says_why(
    pytester: pytest.Pytester,
) -> None:
    drill_file(pytester, {"safety": {"requireConfirm": True}}, name="drill.yaml")
    pytester.makepyfile(
        test_recovery="""
        import pytest

        def test_model_unit():
            assert True

        @pytest.mark.drill(config="drill.yaml")
        def test_resumes(recovery_drill):
            recovery_drill.run()

        def test_no_config(recovery_drill):
            recovery_drill.run()
        """
    )
    result = pytester.runpytest()  # no -rs
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.OK  # an ordinary unit-test run may skip drills
    result.stdout.fnmatch_lines(
        [
            "*= recoverygate drills =*",
            "SKIPPED test_recovery.py::test_resumes: *drill.yaml: safety.requireConfirm is true*"
            "--drill-yes*",
            "SKIPPED test_recovery.py::test_no_config: no drill config: pass --drill-config=FILE*",
        ]
    )
    quiet = pytester.runpytest("-q")
    quiet.stdout.fnmatch_lines(["SKIPPED test_recovery.py::test_resumes: *--drill-yes*"])


def test_drill_items_are_counted_as_collected(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_model="def test_model():\n    assert True\n")
    first = drill_file(pytester)
    second = drill_file(pytester, name="other.yaml")
    result = pytester.runpytest(f"--drill-config={first}", f"--drill-config={second}")
    result.stdout.fnmatch_lines(["collected 3 items"])
    result.assert_outcomes(passed=3)
    only = pytester.runpytest(f"--drill-config={first}", "--collect-only", "-q")
    only.stdout.fnmatch_lines(["recovery-test.yaml::drill", "*2 tests collected*"])


def test_the_report_folder_is_named_after_the_drill(pytester: pytest.Pytester) -> None:
    path = drill_file(pytester, {"name": "llama-finetune"})
    drill_file(pytester, name="drill.yaml")
    pytester.makepyfile(
        test_recovery="""
        import pytest

        @pytest.mark.drill(config="drill.yaml")
        def test_one(recovery_drill):
            recovery_drill.run()

        @pytest.mark.drill(config="drill.yaml")
        def test_two(recovery_drill):
            recovery_drill.run()
        """
    )
    out = pytester.path / "reports"
    result = pytester.runpytest(f"--drill-config={path}", f"--drill-report-dir={out}")
    result.assert_outcomes(passed=3)
    # the drill's name, by default the file's stem; a second test of it adds its own name
    assert sorted(p.name for p in out.iterdir()) == ["drill", "drill-test_two", "llama-finetune"]
    assert (out / "llama-finetune" / "report.json").is_file()
    for folder in out.iterdir():  # each drill of the plugin, rejudged from its transcript
        assert_rejudged(folder)


def test_the_header_says_what_will_run(pytester: pytest.Pytester) -> None:
    path = drill_file(pytester)
    result = pytester.runpytest(f"--drill-config={path}", "--dry-run", "--co")
    result.stdout.fnmatch_lines(
        ["recoverygate *: drills: *recovery-test.yaml (fake); kills: dry run*"]
    )


def test_phase_lines_show_without_dash_s_and_quiet_hides_them(
    pytester: pytest.Pytester,
) -> None:
    path = drill_file(pytester)
    loud = pytester.runpytest(f"--drill-config={path}")
    loud.stdout.fnmatch_lines(
        [
            "*[[]waiting for checkpoint[]] waiting for checkpoint >= step 40*",
            "*[[]recovering[]]*",
            "*[[]done[]] PASS*",
        ]
    )
    quiet = pytester.runpytest(f"--drill-config={path}", "-q")
    assert "[recovering]" not in quiet.stdout.str()


def test_the_ini_twin_of_drill_config_works(pytester: pytest.Pytester) -> None:
    drill_file(pytester)
    pytester.makeini("[pytest]\ndrill_config = recovery-test.yaml\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)


def test_an_invalid_config_fails_the_item_with_the_problem(pytester: pytest.Pytester) -> None:
    path = pytester.path / "bad.yaml"
    path.write_text("workload:\n  orchestrator: fake\n  color: red\n")
    result = pytester.runpytest(f"--drill-config={path}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*bad.yaml:3*workload.color*"])
    assert "Traceback" not in result.stdout.str()


def test_a_bad_override_names_the_key_and_says_it_was_an_override(
    pytester: pytest.Pytester,
) -> None:
    drill_file(pytester, name="drill.yaml")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.drill(config="drill.yaml", overrides={"expectations.maxRecoveryTime": "soon"})
        def test_it(recovery_drill):
            recovery_drill.run(check=True)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*drill.yaml (override): expectations.maxRecoveryTime*soon*"])


def test_the_terminal_summary_lists_each_drill_with_its_breakdown(
    pytester: pytest.Pytester,
) -> None:
    path = drill_file(pytester, {"workload": {"fake": {"resume": "zero"}}})
    result = pytester.runpytest(f"--drill-config={path}")
    result.stdout.fnmatch_lines(
        [
            "*= recoverygate drills =*",
            "FAIL recovery-test.yaml::drill: resumed from step 0, expected step 40*",
            "*resumeStep=0*expectedResumeStep=40*",
            "*recovery breakdown (s after kill): failureDetected=0.100*checkpointLoaded=unknown*",
        ]
    )


def test_a_drill_config_that_does_not_exist_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--drill-config=missing.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--drill-config*missing.yaml does not exist*"])


def test_dry_run_on_the_command_line_wins_over_a_marker_that_asks_for_the_kill(
    pytester: pytest.Pytester,
) -> None:
    drill_file(pytester, name="drill.yaml")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.drill(config="drill.yaml", dry_run=False)
        def test_marker(recovery_drill):
            assert recovery_drill.run().verdict.value == "DRY-RUN"

        @pytest.mark.drill(config="drill.yaml")
        def test_call(recovery_drill):
            assert recovery_drill.run(dry_run=False).verdict.value == "DRY-RUN"
        """
    )
    result = pytester.runpytest("--dry-run")
    result.assert_outcomes(passed=2)


def test_a_drill_that_cannot_run_fails_instead_of_skipping(pytester: pytest.Pytester) -> None:
    path = pytester.path / "k8s.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "workload": {
                    "orchestrator": "kubernetes",
                    "selector": "training-run=x",
                    "kubeconfig": "no-such-kubeconfig",
                },
                "injectFailure": {"afterCheckpoint": "next"},
                "expectations": {"maxRecoveryTime": "1m"},
                "safety": {"requireConfirm": False},
            }
        )
    )
    result = pytester.runpytest(f"--drill-config={path}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the drill cannot run*no-such-kubeconfig*"])


def test_a_pytest_run_appends_each_drill_to_the_github_step_summary(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    summary = pytester.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    path = drill_file(pytester, {"name": "ci-gate"})
    result = pytester.runpytest(f"--drill-config={path}")  # no --drill-report-dir
    result.assert_outcomes(passed=1)
    assert "RecoveryGate drill `ci-gate`: PASS" in summary.read_text()


def test_a_failing_drill_shows_the_diagnosis_in_the_failure_and_the_summary(
    pytester: pytest.Pytester,
) -> None:
    path = drill_file(pytester, {"workload": {"fake": {"resume": "zero"}}})
    result = pytester.runpytest(f"--drill-config={path}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*diagnosis: checkpoints saved, but the replacement trained from scratch",
            "*more: file://*/docs/troubleshooting.md#checkpoints-not-shared",
            "*= recoverygate drills =*",
            "FAIL recovery-test.yaml::drill: resumed from step 0*",
            "  diagnosis: checkpoints saved, but the replacement trained from scratch (file://*troubleshooting.md#*)",
        ]
    )


def test_the_fixture_exposes_the_evidence_after_run(pytester: pytest.Pytester) -> None:
    drill_file(pytester, {"workload": {"fake": {"resume": "zero"}}}, name="drill.yaml")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.drill(config="drill.yaml")
        def test_resumes(recovery_drill):
            result = recovery_drill.run()
            assert result.verdict.value == "FAIL"
            evidence = recovery_drill.evidence
            assert [d.signature for d in evidence.diagnoses] == ["checkpoints-not-shared"]
            assert evidence.job_output.get("rank 1") is not None
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)
