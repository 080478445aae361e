"""Smoke tests of bench/: every benchmark runs in --quick mode and emits its targets as JSON.

We test these aspects: each module prints one ``BENCH-JSON`` line whose results carry the
target fields (name, measured, limit, unit, op, ratio, passed) with consistent ratios;
the parser benchmark finds exactly the events its generator planted; the result record
computes ratios and verdicts for both directions of limit; RESULTS.md's tables render every
target of a recorded run.

The parser and latency modules (about 10 s together) run in the default test run. The
others take a minute or more (the reporter's 1M-step loops, real torchrun drills, a
4,096-pod fake cluster, a torch model saved and digested) and run only with
``RECOVERYGATE_BENCH=1``; the real benchmark
runs (``python bench/run_all.py``) are never part of the test run.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench._common import RESULT_FIELDS, Result, subprocess_env
from tests.patience import DRILL, within

ROOT = Path(__file__).resolve().parent.parent
SLOW = pytest.mark.skipif(
    os.environ.get("RECOVERYGATE_BENCH") != "1",
    reason="slow benchmark smoke test: set RECOVERYGATE_BENCH=1 (see bench/README.md)",
)


def run_quick(name: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"bench_{name}.py"), "--quick"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=within(DRILL),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BENCH-JSON ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    doc: dict[str, Any] = json.loads(lines[0][len("BENCH-JSON ") :])
    assert doc["bench"] == name
    assert doc["quick"] is True
    assert {"nproc", "cpu", "python", "loadavg", "date"} <= set(doc["machine"])
    targets = [r for r in doc["results"] if r["passed"] is not None]
    assert targets, "a benchmark without a single target"
    for result in doc["results"]:
        assert set(RESULT_FIELDS) <= set(result)
    for result in targets:
        assert result["op"] in ("<=", ">=")
        assert math.isfinite(result["measured"]), result
        assert result["limit"] > 0, result
        assert result["ratio"] == pytest.approx(result["measured"] / result["limit"])
        expected = (
            result["measured"] <= result["limit"]
            if result["op"] == "<="
            else result["measured"] >= result["limit"]
        )
        assert result["passed"] is expected
    assert doc["passed"] is all(r["passed"] for r in targets)
    return doc


def by_name(doc: dict[str, Any], prefix: str) -> dict[str, Any]:
    return next(r for r in doc["results"] if r["name"].startswith(prefix))


def test_a_ratio_below_one_passes_an_upper_limit_and_fails_a_lower_one() -> None:
    upper = Result("t", 2.0, 4.0, "ms")
    lower = Result("t", 2.0, 4.0, "x", op=">=")
    assert (upper.ratio, upper.passed) == (0.5, True)
    assert (lower.ratio, lower.passed) == (0.5, False)


def test_the_parser_benchmark_finds_exactly_what_its_generator_planted() -> None:
    doc = run_quick("parser")
    assert by_name(doc, "events found exactly as planted")["passed"] is True
    assert by_name(doc, "parser peak memory beyond the chunk")["passed"] is True


@pytest.mark.slow  # real pipes and file tails timed over seconds
def test_the_latency_benchmark_reports_pipe_and_file_tail_percentiles() -> None:
    doc = run_quick("latency")
    pipe = by_name(doc, "pipe")
    assert pipe["extra"]["p50_ms"] <= pipe["extra"]["p99_ms"] <= pipe["extra"]["max_ms"]
    assert by_name(doc, "file tail")["limit"] == 250.0


@pytest.mark.slow  # a second interpreter, timed lines
def test_the_evidence_benchmark_measures_the_hook_next_to_the_print() -> None:
    doc = run_quick("evidence")
    plain = by_name(doc, "print of a 200-byte line")["measured"]
    assert plain > 0
    for name in ("hook: a 200-byte line that matches nothing", "hook: a 200-byte progress line"):
        result = by_name(doc, name)
        assert result["limit"] == 2.0
        assert result["measured"] > 0  # the hook does work: a figure of 0 would be a bug
    worst = by_name(doc, "hook: the worst crafted 1 KiB line")
    assert worst["limit"] == 50.0
    assert worst["measured"] > 0
    for preset in ("nanogpt", "torchtitan", "megatron", "litgpt"):  # beside its typical line
        assert by_name(doc, f"hook, {preset}: typical line")["measured"] >= 0
        assert by_name(doc, f"hook, {preset}: slowest crafted")["measured"] > 0


@pytest.mark.slow  # fresh interpreters started and timed, over and over
def test_the_auto_hook_benchmark_finds_the_unset_line_costs_one_lookup() -> None:
    doc = run_quick("auto")
    assert by_name(doc, "modules imported by the line")["measured"] == 0
    assert by_name(doc, "the .pth line, variable unset")["limit"] > 0


@SLOW
@pytest.mark.e2e
def test_the_reporter_benchmark_emits_its_targets() -> None:
    doc = run_quick("reporter")
    assert by_name(doc, "progress lines per 100 ms")["passed"] is True


@SLOW
@pytest.mark.e2e
@pytest.mark.local
def test_the_overhead_benchmark_emits_its_targets() -> None:
    doc = run_quick("overhead")
    assert by_name(doc, "verdict after the deciding event")["measured"] > 0


@SLOW
@pytest.mark.e2e
@pytest.mark.kubernetes
def test_the_scale_benchmark_drills_the_fake_cluster() -> None:
    doc = run_quick("scale")
    assert by_name(doc, "drill verdicts PASS")["passed"] is True


@SLOW
@pytest.mark.e2e
def test_the_digest_benchmark_sees_every_planted_change() -> None:
    doc = run_quick("digest")
    assert by_name(doc, "planted changes seen by the shipped digest")["passed"] is True
    assert by_name(doc, "state_digest(")["extra"]["params"] > 1_000_000


@SLOW
@pytest.mark.e2e
@pytest.mark.local
def test_the_accuracy_benchmark_compares_real_drills_with_ground_truth() -> None:
    doc = run_quick("accuracy")
    assert by_name(doc, "resume step equal")["measured"] == 2


def test_the_results_tables_render_every_target_of_a_run_all_document() -> None:
    from bench.markdown import render

    doc = json.loads((ROOT / "bench" / "results.json").read_text())
    text = render(doc)
    targets = [r for b in doc["benchmarks"] for r in b["results"] if r["passed"] is not None]
    summary = text[text.index("| benchmark |") : text.index("\n### ")]
    rows = [line for line in summary.splitlines() if line.startswith("| ")][1:]  # no header
    assert len(rows) == len(targets)
    assert text.count("**MISS**") == sum(1 for r in targets if not r["passed"])
