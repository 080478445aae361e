"""``report.html``: one self-contained page per report folder.

We test these aspects: the page is written in every report folder and holds, in order,
the verdict, the summary, the timeline (inline SVG), the breakdown, every check with
expected and observed, the costs, the diagnosis, every recovery of ``count: N`` and the
job's output tails; it loads nothing (no ``src``, no external link target, a CSP that
forbids everything but inline style); Chromium renders it (a screenshot whose banner
has the verdict's colour) with no console error; hostile job output (``<script>``, a
huge line, invalid UTF-8) from a real local drill is shown as text.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_recoverygate.cli import main
from pytest_recoverygate.report.files import markdown_summary
from pytest_recoverygate.report.html import OUTPUT_LINE_LIMIT, render_report, svg_for_inline
from tests.patience import JOB, within
from tests.trend_reports import run_fake_drill

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "tests" / "diagnosis" / "replay_job.py"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup installs it)"
)


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report folder of a count: 3 drill (PASS: three verified recoveries)."""
    root = tmp_path_factory.mktemp("html")
    code, folder = run_fake_drill(
        root,
        {
            "injectFailure": {"count": 3},
            "workload": {"fake": {"restartDelay": "300ms"}},
        },
    )
    assert code == 0
    return folder


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # we run as root in CI containers
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
        stdin=subprocess.DEVNULL,
    )


def console_errors(stderr: str) -> list[str]:
    """Console messages and blocked loads Chromium logged for the page."""
    return [
        line
        for line in stderr.splitlines()
        if "CONSOLE" in line or "Uncaught" in line or "Refused to" in line
    ]


def test_every_report_folder_has_the_page_in_reading_order(repeated: Path) -> None:
    page = (repeated / "report.html").read_text()
    headings = re.findall(r"<h2>([^<]*)</h2>", page)
    assert headings[:7] == [
        "Summary",
        "Timeline",
        "Recovery breakdown",
        "Checks",
        "Costs of a failure",
        "Diagnosis",
        "Every recovery (3)",
    ]
    assert "Job output (last lines)" in headings
    assert page.index('class="verdict"') < page.index("<h2>Summary</h2>")
    assert ">PASS</div>" in page
    # the timeline is inline SVG, not a picture to load
    assert page.count("<svg") == 1 and "<img" not in page
    # every check with expected and observed, as the report has them
    import json

    doc = json.loads((repeated / "report.json").read_text())
    for check in doc["checks"]:
        assert f"<code>{check['name']}</code>" in page
    assert doc["htmlReport"] == "report.html"
    assert len(doc["recoveries"]) == 3
    for recovery in doc["recoveries"]:
        assert recovery["summary"] in page
    # nothing to load: no src attribute, links only to the folder's own files or docs
    assert not re.search(r"\ssrc\s*=", page)
    assert "<script" not in page.lower()
    assert "default-src 'none'" in page
    assert "@media print" in page
    # the step summary points at the page
    assert "report.html" in (repeated / "summary.md").read_text()


@pytest.mark.e2e
@pytest.mark.browser
@needs_chromium
def test_chromium_renders_the_page_with_the_verdict_first_and_no_error(
    repeated: Path, tmp_path: Path
) -> None:
    import matplotlib.image

    shot = tmp_path / "shot.png"
    proc = chromium(  # within its timeout (patience.JOB, stretched): no page that hangs
        "--window-size=1200,1600", f"--screenshot={shot}", (repeated / "report.html").as_uri()
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_errors(proc.stderr) == []
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (1600, 1200)
    # the verdict banner is at the top, in PASS's green (#1a7f37)
    green = [0x1A / 255, 0x7F / 255, 0x37 / 255]
    banner = pixels[40, 600][:3]
    assert all(abs(float(a) - b) < 0.05 for a, b in zip(banner, green, strict=True)), banner
    # and the page is not blank below it: many distinct colours (text, the timeline)
    body = pixels[200:1600:7, ::7, :3].reshape(-1, 3)
    assert len({tuple(round(float(v), 2) for v in p) for p in body}) > 50
    dom = chromium("--dump-dom", (repeated / "report.html").as_uri())
    assert dom.returncode == 0
    assert "Every recovery (3)" in dom.stdout
    # printable: Chromium prints it to a PDF of a few pages
    pdf = tmp_path / "report.pdf"
    page = (repeated / "report.html").as_uri()
    printed = chromium("--no-pdf-header-footer", f"--print-to-pdf={pdf}", page)
    assert printed.returncode == 0, printed.stderr[-2000:]
    pages = len(re.findall(rb"/Type\s*/Page[^s]", pdf.read_bytes()))
    assert 1 <= pages <= 12, pages
    # the console check itself sees a script error and a blocked load
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><script>undefinedFn()</script><img src="https://x.invalid/a.png">')
    assert len(console_errors(chromium("--dump-dom", bad.as_uri()).stderr)) >= 1


def test_an_svg_with_anything_active_is_not_inlined() -> None:
    assert svg_for_inline('<?xml version="1.0"?>\n<svg><path d="M0 0"/></svg>') == (
        '<svg><path d="M0 0"/></svg>'
    )
    assert svg_for_inline("<svg><script>alert(1)</script></svg>") is None
    assert svg_for_inline('<svg onload="alert(1)"></svg>') is None
    assert svg_for_inline('<svg><image href="https://example.com/x.png"/></svg>') is None
    assert svg_for_inline("<html></html>") is None


HOSTILE = (
    b"Traceback (most recent call last):\n"
    b'<script>document.title="pwned"</script><img src=x onerror=alert(1)>\n'
    + b"A"
    * (OUTPUT_LINE_LIMIT * 3)
    + b"\nbad bytes: \xff\xfe\xc3\x28 end\n"
    b"RuntimeError: </pre><b>not bold</b>\n"
)


@pytest.mark.e2e
@pytest.mark.local
def test_hostile_job_output_is_shown_as_text(tmp_path: Path) -> None:
    replay = tmp_path / "hostile.log"
    replay.write_bytes(HOSTILE)
    config = tmp_path / "hostile.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "hostile",
                "workload": {
                    "orchestrator": "local",
                    "command": [
                        sys.executable,
                        str(REPLAY),
                        "--nproc",
                        "2",
                        "--replay",
                        str(replay),
                    ],
                    "env": {"PYTHONPATH": str(ROOT / "reporter")},
                },
                "injectFailure": {"afterCheckpoint": "step-20", "targetRank": 1},
                "expectations": {"maxRecoveryTime": "5s"},
                "safety": {"requireConfirm": False},
                "timeouts": {"discovery": "30s", "checkpoint": "30s", "recovery": "10s"},
            }
        )
    )
    out = tmp_path / "report"
    assert main(["run", "-f", str(config), "-q", "--report-dir", str(out)]) in (1, 3)
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<script" not in page.lower() and "<img" not in page and "<b>not bold" not in page
    assert "&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;" in page
    assert "&lt;/pre&gt;&lt;b&gt;not bold&lt;/b&gt;" in page
    assert "bad bytes: \ufffd\ufffd\ufffd( end" in page  # invalid UTF-8 as replacement characters
    more = OUTPUT_LINE_LIMIT * 3 - OUTPUT_LINE_LIMIT
    assert f"[line cut here: {more} more characters in the file]" in page
    assert "A" * (OUTPUT_LINE_LIMIT + 1) not in page
    if CHROMIUM is not None:  # and the browser shows it as text, runs nothing
        dom = chromium("--dump-dom", (out / "report.html").as_uri())
        assert dom.returncode == 0
        assert console_errors(dom.stderr) == []
        assert "pwned" not in re.search(r"<title>(.*?)</title>", dom.stdout).group(1)  # type: ignore[union-attr]
        assert '&lt;script&gt;document.title="pwned"&lt;/script&gt;' in dom.stdout


def test_the_github_step_summary_links_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/train")
    monkeypatch.setenv("GITHUB_RUN_ID", "4242")
    monkeypatch.delenv("RECOVERYGATE_REPORT_URL", raising=False)
    code, _ = run_fake_drill(tmp_path / "a")
    assert code == 0
    text = summary.read_text()
    assert "HTML report: `report.html` in the report folder" in text
    assert "(https://github.com/acme/train/actions/runs/4242#artifacts)" in text
    # where the job uploads the folder, the summary links the page itself
    monkeypatch.setenv("RECOVERYGATE_REPORT_URL", "https://ci.example.com/drills/night-1/")
    summary.unlink()
    code, _ = run_fake_drill(tmp_path / "b")
    assert code == 0
    assert "[Open the HTML report](https://ci.example.com/drills/night-1/report.html)" in (
        summary.read_text()
    )


# ---------------------------------------------------------------------------- issue 41


def test_the_replay_table_shows_every_digit_of_a_loss() -> None:
    """It rounded to 3 decimals: 2.345612 and 2.345648 both read 2.346."""
    replay = {
        "mode": "exact",
        "stepsCompared": 1,
        "firstDivergentStep": 21,
        "maxAbsDiff": 3.6e-05,
        "maxRelDiff": 1.5347e-05,
        "steps": [{"step": 21, "killed": 2.345612, "replacement": 2.345648, "matches": False}],
    }
    page = render_report({"verdict": "FAIL", "recoveries": [{"index": 1, "replay": replay}]})
    table = page.split("<h2>Replay</h2>")[1]
    assert "2.345612" in table and "2.345648" in table
    assert "2.346" not in table
    assert "3.6e-05" in table


def test_the_checks_table_and_the_summary_show_no_python_dicts(tmp_path: Path) -> None:
    check = {
        "name": "replay_matches",
        "passed": False,
        "checked": True,
        "expected": "every replayed step's loss equal to the killed run's",
        "observed": {"stepsCompared": 5, "firstDivergentStep": 21, "maxAbsDiff": 3.6e-05},
        "message": "replay diverged at step 21",
        "reason": "REPLAY_DIVERGED",
    }
    doc = {"verdict": "FAIL", "summary": "replay diverged", "checks": [check]}
    page = render_report(doc)
    checks = page.split("<h2>Checks</h2>")[1].split("<h2>")[0]
    assert "{" not in checks and "&#x27;stepsCompared" not in checks
    assert "stepsCompared 5, firstDivergentStep 21, maxAbsDiff 3.6e-05" in checks
    summary = markdown_summary(doc)
    assert "{" not in summary
    assert "observed stepsCompared 5, firstDivergentStep 21, maxAbsDiff 3.6e-05" in summary


def test_a_number_in_the_summary_table_carries_no_markdown_escape() -> None:
    """It showed ``\\14.678``: an ordered-list escape put before a digit, which markdown
    cannot escape, so the backslash was shown."""
    summary = markdown_summary(
        {"verdict": "PASS", "summary": "14. resumed", "recoveryTimeSeconds": 14.678}
    )
    assert "| recoveryTimeSeconds | 14.678 |" in summary
    assert "\\1" not in summary
    assert "\n14\\. resumed\n" in summary  # a line that would start a list: the dot escaped
