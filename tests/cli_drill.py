"""One drill run as a user runs it: the config written to a file, ``recoverygate run`` in a
subprocess, the report folder read back and the drill rejudged from its transcript.
Shared by the real-process drills (the truth corpus, the fault catalogue, the framework
integrations).

Every drill it runs writes a report folder (``--report-dir``) and is rejudged in this
process (``recoverygate rejudge``'s function): the replay through a fresh engine must
answer every call as the drill's engine did and give the report the drill wrote, value for
value, or the drill's test fails. When a test that ran drills fails, tests/conftest.py
keeps their folders (:data:`RAN`; :func:`keep_folders`) and prints where, so that
``recoverygate rejudge`` can tell an engine bug (it reproduces) from timing (it does not),
and the transcript can become a fixture. There are no automatic reruns.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.transcripts import assert_rejudged

__all__ = [
    "DRILL_SUSTAIN",
    "KEEP_ENV",
    "RAN",
    "CliRun",
    "keep_folders",
    "run_cli_drill",
    "with_drill_sustain",
]

#: Where the report folders of a failed test's drills are kept (default: ``failed-drills``
#: in the checkout, ignored by git; CI uploads it).
KEEP_ENV = "RECOVERYGATE_KEEP_FAILED_DRILLS"
#: The report folders of the drills the current test ran (tests/conftest.py empties it
#: before each test and keeps them when the test fails).
RAN: list[Path] = []

#: The sustain window of the test drills, unless a config sets its own: the drills are
#: about recovery, not about how long a job trains on, and the default (the larger of 3
#: progress lines and 10 s, what users get) would hold each PASS 9 s longer, every kill of
#: it again. One second of training (tens of steps of the test jobs) shows the replacement
#: trains on. The default itself is tested in tests/test_config.py and the engine tests.
DRILL_SUSTAIN = "1s"


def with_drill_sustain(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with ``expectations.sustain`` set to :data:`DRILL_SUSTAIN` where it sets
    none (live-mode drills are judged without a sustain window and keep theirs)."""
    expect = dict(config.get("expectations") or {})
    if expect.get("recovery") != "live":
        expect.setdefault("sustain", DRILL_SUSTAIN)
    return {**config, "expectations": expect}


@dataclass(frozen=True)
class CliRun:
    """The report, the exit code, everything the CLI printed, and the wall time."""

    report: dict[str, Any]
    code: int
    output: str
    wall: float


def run_cli_drill(
    config: Mapping[str, Any],
    path: Path,
    *,
    report_dir: Path | None = None,
    timeout: float,
    env: Mapping[str, str] | None = None,
    drill_sustain: bool = True,
) -> CliRun:
    """Write ``config`` (with :func:`with_drill_sustain`) to ``path`` and run it (``--yes
    -q``) into a report folder: ``report_dir``, else ``<config stem>-report`` next to the
    config; then rejudge it from its transcript and assert it reproduces
    (:func:`~tests.transcripts.assert_rejudged`). ``drill_sustain=False`` runs ``config``
    as it is."""
    text = with_drill_sustain(config) if drill_sustain else dict(config)
    path.write_text(yaml.safe_dump(text, sort_keys=False))
    if report_dir is None:  # always a folder: the transcript is in it
        report_dir = path.parent / f"{path.stem}-report"
    report_path = report_dir / "report.json"
    command = [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(path)]
    RAN.append(report_dir)
    started = time.monotonic()
    proc = subprocess.run(
        [*command, "--report-dir", str(report_dir), "--yes", "-q"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
        env=None if env is None else dict(env),
    )
    wall = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert report_path.exists(), f"no report (exit {proc.returncode}):\n{output}"
    assert_rejudged(report_dir)  # the drill's own transcript reproduces its report
    return CliRun(json.loads(report_path.read_text()), proc.returncode, output, wall)


def keep_folders(test_id: str, root: Path) -> list[Path]:
    """Copy the report folders of the drills the test ran (:data:`RAN`) to
    ``$RECOVERYGATE_KEEP_FAILED_DRILLS/<test>/`` (default ``root/failed-drills``); the
    copies' paths."""
    base = Path(os.environ.get(KEEP_ENV) or root / "failed-drills")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", test_id)[:150]
    kept = []
    for number, folder in enumerate(RAN, start=1):
        if not folder.is_dir():
            continue
        target = base / name / (folder.name if len(RAN) == 1 else f"{number}-{folder.name}")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(folder, target, symlinks=True)
        kept.append(target)
    return kept
