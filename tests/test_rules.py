"""The verdict's rule book (pytest_recoverygate/engine/rules) and the page made from it.

We test these aspects: docs/verdict-rules.md is exactly the text the table renders; every
rule is pinned by scenario tests that exist; each rule fails only with the reasons its row
declares, and every declared reason is reachable in its code; every check of a real drill
names the rule that decided it, and that rule fills that check; no function of the package
is over 100 lines; ``recoverygate explain`` prints each check's rule and condition, and
refuses a bad path or bad JSON with exit 2.
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from pytest_recoverygate.cli import main
from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.engine.rules import SCOPES, TABLE, Rule
from pytest_recoverygate.engine.rules.doc import render
from pytest_recoverygate.orchestrators import build_orchestrator
from pytest_recoverygate.registry.seams import SimulatedClock
from pytest_recoverygate.runner import RunOptions, run_drill

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pytest_recoverygate"
MAX_FUNCTION_LINES = 100


def fixtures() -> dict[str, list[str]]:
    """Each rule's fixtures by scenario name (tests/fixtures/rules), as the page links them."""
    folder = ROOT / "tests" / "fixtures" / "rules"
    return {
        rule.name: sorted(p.name.removesuffix(".jsonl") for p in rule.glob("*.jsonl"))
        for rule in sorted(folder.iterdir())
    }


def test_the_rules_page_is_the_text_the_table_renders() -> None:
    page = (ROOT / "docs" / "verdict-rules.md").read_text(encoding="utf-8")
    assert page == render(TABLE, fixtures()), (
        "docs/verdict-rules.md is stale: run scripts/verdict-rules"
    )


def test_the_script_checks_and_writes_the_page() -> None:
    script = ROOT / "scripts" / "verdict-rules"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_rule_names_are_unique_and_scopes_known() -> None:
    names = [rule.name for rule in TABLE]
    assert len(names) == len(set(names))
    assert {rule.scope for rule in TABLE} <= set(SCOPES)
    assert all(rule.condition for rule in TABLE), "each rule's function states its condition"


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


@pytest.mark.parametrize("rule", TABLE, ids=lambda rule: rule.name)
def test_every_rule_is_pinned_by_scenario_tests_that_exist(rule: Rule) -> None:
    assert rule.tests, f"rule {rule.name} has no scenario test"
    for test in rule.tests:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), test
        assert name in _test_functions(ROOT / path), f"{test} does not exist"


def _reasons(function: ast.FunctionDef, module: dict[str, ast.FunctionDef]) -> set[str]:
    """The FailureReason members (``R.NAME``) a function and the module's functions it
    calls (transitively) name."""
    seen: set[str] = set()
    found: set[str] = set()
    todo = [function]
    while todo:
        node = todo.pop()
        if node.name in seen:
            continue
        seen.add(node.name)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
                if sub.value.id == "R":
                    found.add(sub.attr)
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
                if sub.func.id in module:
                    todo.append(module[sub.func.id])
    return found


@pytest.mark.parametrize("rule", TABLE, ids=lambda rule: rule.name)
def test_each_rule_fails_only_with_the_reasons_its_row_declares(rule: Rule) -> None:
    source: ModuleType | None = inspect.getmodule(rule.judge)
    assert source is not None
    tree = ast.parse(textwrap.dedent(inspect.getsource(source)))
    module = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    found = _reasons(module[rule.judge.__name__], module)
    declared = {reason.name for reason in rule.fails}
    if rule.undecided:
        declared.add("INCONCLUSIVE")
    assert found <= declared, "a reason the rule's row does not declare"
    assert declared - {"INCONCLUSIVE"} <= found, "a declared reason the rule never gives"


@pytest.mark.parametrize("rule", TABLE, ids=lambda rule: rule.name)
def test_no_rule_fails_a_check_as_inconclusive(rule: Rule) -> None:
    # A check is failed with a failure reason, or undecided: never both (issue 41,
    # target_killed returned a failed check with reason INCONCLUSIVE).
    assert "INCONCLUSIVE" not in {reason.name for reason in rule.fails}


def _report_of(example: str, tmp_path: Path) -> dict[str, object]:
    config = load_config(ROOT / "examples" / "fake" / example)
    clock = SimulatedClock()
    report = tmp_path / "report.json"
    run_drill(
        config,
        RunOptions(report_path=report, handle_signals=False),
        clock=clock,
        orchestrator=build_orchestrator(config, clock),
    )
    doc: dict[str, object] = json.loads(report.read_text(encoding="utf-8"))
    return doc


@pytest.mark.parametrize(
    "example",
    ["recovery-test.yaml", "resume-zero.yaml", "hang.yaml", "preempt-no-save.yaml", "live.yaml"],
)
def test_every_check_of_a_drill_names_the_rule_that_filled_it(example: str, tmp_path: Path) -> None:
    doc = _report_of(example, tmp_path)
    checks = doc["checks"]
    assert isinstance(checks, list) and checks
    by_name = {rule.name: rule for rule in TABLE}
    for check in checks:
        rule = by_name[check["rule"]]
        assert rule.check == check["name"]
        assert check["passed"] is not True or rule.passes
        assert check["passed"] is not None or rule.undecided


def _functions_over(limit: int) -> dict[str, int]:
    long: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > limit:
                    long[f"{path.relative_to(ROOT)}:{node.lineno}:{node.name}"] = lines
    return long


def test_no_function_of_the_package_is_over_100_lines() -> None:
    assert _functions_over(MAX_FUNCTION_LINES) == {}


def test_explain_names_each_check_s_rule_and_its_condition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _report_of("resume-zero.yaml", tmp_path)
    assert main(["explain", str(tmp_path / "report.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"verdict: FAIL — {doc['summary']}")
    assert "resume_step: FAILED (RESTARTED_FROM_SCRATCH)" in out
    assert "  rule resume_step (resume.resume_step)" in out
    assert "The replacement resumed from the expected step" in out
    assert "  rule new_incarnation (comeback.new_incarnation)" in out


def test_explain_calls_a_check_that_verified_nothing_not_checked_as_the_terminal_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 41: it said "all_ranks_resumed: passed — not checked: …"; the terminal marks
    # it "--", the page "not checked", and the rule says it neither passes nor fails.
    doc = _report_of("recovery-test.yaml", tmp_path)
    check = next(c for c in doc["checks"] if c["name"] == "all_ranks_resumed")  # type: ignore[attr-defined]
    assert check["status"] == "unchecked"
    assert main(["explain", str(tmp_path / "report.json")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("all_ranks_resumed:"))
    assert line.startswith(
        "all_ranks_resumed: not checked (it verified nothing: it neither passes nor fails "
        "the drill) — rank(s) 1 reported no checkpoint_loaded"
    )
    assert "passed" not in line
    assert "  rule all_ranks_resumed (ranks.all_ranks_resumed)" in out


def test_explain_finds_the_rules_of_a_report_that_names_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _report_of("preempt-no-save.yaml", tmp_path)
    for check in doc["checks"]:  # type: ignore[attr-defined]
        del check["rule"]
    older = tmp_path / "older.json"
    older.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["explain", str(older)]) == 0
    out = capsys.readouterr().out
    assert "  rule saved_on_preempt (faults.saved_on_preempt)" in out
    assert "  one of the rules " not in out.split("saved_on_preempt:")[1].split("\n")[1]


def test_explain_prints_what_the_job_wrote_without_its_terminal_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _report_of("never.yaml", tmp_path)
    doc["summary"] = "evil \x1b[2J\x1b]0;title\x07 done"
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "evil \\x1b[2J\\x1b]0;title\\x07 done" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "the file does not exist"), ("{not json", "not JSON"), ("[1]", "no drill report")],
)
def test_explain_refuses_a_bad_report_with_exit_2(
    content: str | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert main(["explain", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
    assert str(path) in captured.err
    assert "Traceback" not in captured.err


def test_every_rule_has_its_section_on_the_page() -> None:
    """The table links each rule to its section: a scope without a heading drops them."""
    page = render(TABLE)
    missing = [rule.name for rule in TABLE if f"\n### {rule.name}\n" not in page]
    assert not missing, missing
