"""The timeline picture: produced next to the report, and drawn from the report's data."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_recoverygate.cli import main
from pytest_recoverygate.report.timeline import build_figure, series_by_incarnation

pytest.importorskip("matplotlib")


def test_each_incarnation_is_drawn_with_exactly_the_reported_points(
    write_drill: Callable[..., Path],
    tmp_path: Path,
) -> None:
    out = tmp_path / "report"
    path = write_drill({"workload": {"fake": {"resume": "older"}}})
    assert main(["run", "-f", str(path), "-q", "--report-dir", str(out)]) == 1
    doc = json.loads((out / "report.json").read_text())
    assert (out / "timeline.png").stat().st_size > 10_000
    series = series_by_incarnation(doc, doc["killTime"])
    assert len(series) == 2  # the killed incarnation and the one that resumed
    import matplotlib.pyplot as plt

    fig = build_figure(doc)
    try:
        [ax] = fig.axes
        drawn = {
            line.get_label(): list(zip(line.get_xdata(), line.get_ydata(), strict=True))
            for line in ax.get_lines()
            if line.get_label().startswith("incarnation")
        }
        assert ax.get_title().startswith("FAIL: resumed from step 20, expected step 40")
    finally:
        plt.close(fig)
    assert len(drawn) == len(series)
    for points, line in zip(series.values(), drawn.values(), strict=True):
        assert [step for _, step in line] == [step for _, step in points]
        assert [t for t, _ in line] == pytest.approx([t for t, _ in points])
    # The kill is at x = 0 and the lost steps (20..lastStepBeforeKill) are in the legend.
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert f"lost steps ({doc['lastStepBeforeKill'] - 20})" in labels
    assert "kill" in labels


def test_without_matplotlib_the_report_says_how_to_get_the_picture(
    write_drill: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pytest_recoverygate.report.timeline as timeline

    monkeypatch.setattr(timeline, "plotting_available", lambda: False)
    out = tmp_path / "report"
    assert main(["run", "-f", str(write_drill()), "-q", "--report-dir", str(out)]) == 0
    assert not (out / "timeline.png").exists()
    doc = json.loads((out / "report.json").read_text())
    assert doc["timelinePicture"] is None
    assert "recoverygate[plot]" in doc["timelinePictureHint"]
    # literal markdown (the hint can hold the job's text): renders as recoverygate[plot]
    assert "pip install 'recoverygate\\[plot\\]'" in (out / "summary.md").read_text()


def test_with_matplotlib_the_report_names_its_picture(
    write_drill: Callable[..., Path],
    tmp_path: Path,
) -> None:
    out = tmp_path / "report"
    assert main(["run", "-f", str(write_drill()), "-q", "--report-dir", str(out)]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["timelinePicture"] == "timeline.png"
    assert "timeline.png" in (out / "summary.md").read_text()
