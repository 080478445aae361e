"""``recoverygate history DIR... -o OUT``: many runs of one drill as a picture and a table.

We test these aspects: the folders a nightly job keeps (a report folder, or a folder of
them) in the order given or by start time; history.png/.svg drawn from exactly the
reports' figures (recovery time stacked by phase, the SLO line, failures marked, lost
steps); history.md with one row per run; bad folders and mixed drills exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_recoverygate.cli import main
from pytest_recoverygate.report.compare import phase_durations
from pytest_recoverygate.report.history import build_history_figure, collect_runs
from tests.trend_reports import run_fake_drill

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three nights' folders (each holding the drill's report folder): fast, slower, too slow."""
    root = tmp_path_factory.mktemp("history")
    delays = ["300ms", "800ms", "2500ms"]  # the SLO is 2 s: the third night fails
    folders = []
    for night, delay in enumerate(delays, 1):
        code, _ = run_fake_drill(
            root / f"night-{night}", {"workload": {"fake": {"restartDelay": delay}}}
        )
        assert code == (1 if night == 3 else 0)
        folders.append(root / f"night-{night}")
    return folders


def test_history_draws_every_run_in_the_order_given(
    nights: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "trend"
    given = [nights[2], nights[0], nights[1]]
    assert main(["history", *map(str, given), "-o", str(out)]) == 0
    assert "3 run(s) of 'nightly'" in capsys.readouterr().out
    assert (out / "history.png").stat().st_size > 10_000
    assert (out / "history.svg").read_text().lstrip().startswith("<?xml")
    table = (out / "history.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 3
    docs = [json.loads((night / "nightly" / "report.json").read_text()) for night in given]
    for row, doc in zip(rows, docs, strict=True):
        assert f"{doc['recoveryTimeSeconds']:.2f}s" in row
        assert ("**FAIL**" in row) == (doc["verdict"] == "FAIL")
    assert "![history](history.png)" in table
    # by start time, the third night comes last again
    runs = collect_runs(given, by_start=True)
    assert [r.path.parent for r in runs] == nights


def test_the_picture_stacks_each_runs_phases_to_its_recovery_time(nights: list[Path]) -> None:
    import matplotlib.pyplot as plt

    runs = collect_runs(nights)
    fig = build_history_figure(runs)
    try:
        top, bottom = fig.axes[0], fig.axes[1]
        stacks = [0.0] * len(runs)
        for container in top.containers:
            for x, patch in enumerate(container.patches):
                stacks[x] += patch.get_height()
        for stacked, run in zip(stacks, runs, strict=True):
            phases = sum(v or 0.0 for v in phase_durations(run.doc).values())
            assert stacked == pytest.approx(max(phases, run.doc["recoveryTimeSeconds"]))
        labels = [t.get_text() for t in top.get_legend().get_texts()]
        assert "SLO (maxRecoveryTime)" in labels and "FAIL / ERROR" in labels
        [slo] = [line for line in top.get_lines() if line.get_label() == "SLO (maxRecoveryTime)"]
        assert set(slo.get_ydata()) == {runs[0].doc["maxRecoveryTimeSeconds"]}
        [marks] = [c for c in top.collections if c.get_label() == "FAIL / ERROR"]
        assert [x for x, _ in marks.get_offsets()] == [2]  # the third run failed
        lost = [p.get_height() for p in bottom.containers[0].patches]
        assert lost == [r.doc["lostSteps"] for r in runs]
    finally:
        plt.close(fig)


def test_bad_folders_and_mixed_drills_exit_2(
    nights: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["history", str(tmp_path / "empty"), "-o", str(tmp_path / "o")]) == 2
    assert "holds no report.json" in capsys.readouterr().err
    assert main(["history", str(tmp_path / "nowhere"), "-o", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    code, _ = run_fake_drill(tmp_path / "other", name="other-drill")
    assert code == 0
    capsys.readouterr()
    args = ["history", str(nights[0]), str(tmp_path / "other"), "-o", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "2 drills (nightly, other-drill)" in err and "--drill NAME" in err
    assert "Traceback" not in err
    assert main([*args, "--drill", "nightly"]) == 0
