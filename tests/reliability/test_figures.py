"""RELIABILITY.md stays true: its table parses, meets its minimums, and the suite is sized
to reach them; the checker itself rejects a document that claims too much.

The full comparison with a fresh run (``scripts/reliability-figures run`` then ``check``)
needs the whole suite's counters, so it runs in CI after the suite, not inside it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tests.reliability import (
    test_bad_input,
    test_cleanup_local,
    test_faults_kubernetes,
    test_faults_local,
    test_kill_once_kubernetes,
)

ROOT = Path(__file__).resolve().parents[2]


def checker() -> ModuleType:
    path = ROOT / "scripts" / "reliability-figures"
    from importlib.machinery import SourceFileLoader

    loader = SourceFileLoader("reliability_figures", str(path))
    spec = importlib.util.spec_from_loader("reliability_figures", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def table() -> dict[str, tuple[str, int]]:
    rows: dict[str, tuple[str, int]] = checker().read_table((ROOT / "RELIABILITY.md").read_text())
    return rows


def test_the_document_meets_its_own_minimums() -> None:
    rows = table()
    assert {
        "k8s_kill_scenarios",
        "k8s_full_drills",
        "faults_injected",
        "kills_observed",
        "cleanup_rows",
        "fuzz_cases",
        "double_kills",
        "leftovers_found",
        "preempt_drills",
        "hang_rows",
        "repeated_kills_checked",
        "double_signals",
        "stopped_left",
    } <= set(rows)
    documented = {name: value for name, (_, value) in rows.items()}
    assert checker().problems(rows, documented) == []


def test_the_suite_is_sized_to_reach_the_minimums() -> None:
    rows = table()

    def minimum(name: str) -> int:
        return int(rows[name][0].replace(",", ""))

    assert test_kill_once_kubernetes.KILL_SCENARIOS >= minimum("k8s_kill_scenarios")
    assert test_kill_once_kubernetes.FULL_DRILLS >= minimum("k8s_full_drills")
    # 30 table rows + 3 verdicts + 4 signal rows + 1 real torchrun row
    rows_planned = len(test_cleanup_local.PHASES) * len(test_cleanup_local.WAYS_OUT) + 3 + 4 + 1
    assert rows_planned >= minimum("cleanup_rows")
    assert test_bad_input.FUZZ_EXAMPLES * 3 // 2 >= minimum("fuzz_cases")
    preempt_rows = len(test_faults_local.PREEMPT_ROWS) + test_faults_kubernetes.PREEMPT_DRILLS
    assert preempt_rows >= minimum("preempt_drills")
    hang_rows = len(test_faults_local.HANG_PHASES) * len(test_cleanup_local.WAYS_OUT)
    assert hang_rows >= minimum("hang_rows")
    # 3 local count drills + 1 real torchrun drill + 2 Kubernetes count drills, 3 kills each
    assert (3 + 1 + 2) * 3 >= minimum("repeated_kills_checked")


def test_the_checker_rejects_a_document_that_claims_too_much() -> None:
    module = checker()
    rows = {"k8s_kill_scenarios": ("1,000", 1_000_000), "double_kills": ("= 0", 0)}
    run = {"k8s_kill_scenarios": 1_000, "double_kills": 0}
    assert any("order of magnitude" in p for p in module.problems(rows, run))
    assert any(
        "below the stated minimum" in p
        for p in module.problems(
            {"k8s_kill_scenarios": ("1,000", 999)}, {"k8s_kill_scenarios": 999}
        )
    )
    assert any(
        "must be 0" in p for p in module.problems({"double_kills": ("= 0", 0)}, {"double_kills": 1})
    )
    assert (
        module.problems({"k8s_kill_scenarios": ("1,000", 1_200)}, {"k8s_kill_scenarios": 1_000})
        == []
    )
