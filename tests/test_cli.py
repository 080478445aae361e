"""The ``recoverygate`` command: exit codes, the JSON report, validate, --help cost.

The CLI runs in a subprocess where the exit code or the imports matter, and in-process
(``main([...])``) elsewhere; both use the fake backend on the real clock, so each drill
takes about two seconds.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from pytest_recoverygate.cli import main
from tests.patience import JOB, PROCESS, deadline, within
from tests.transcripts import assert_rejudged

WriteDrill = Callable[..., Path]


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", *args],
        capture_output=True,
        text=True,
        timeout=within(JOB),
        input=stdin,
        check=False,
    )


@pytest.mark.parametrize(
    ("fake", "code"),
    [
        ({"resume": "latest"}, 0),
        ({"resume": "zero"}, 1),
        ({"resume": "older"}, 1),
        ({"resume": "never"}, 1),
        ({"restartDelay": "2500ms"}, 1),
    ],
    ids=["pass", "zero", "older", "never", "too-slow"],
)
def test_run_exits_0_on_pass_and_1_on_fail(
    write_drill: WriteDrill,
    fake: dict[str, str],
    code: int,
) -> None:
    path = write_drill({"workload": {"fake": fake}, "timeouts": {"recovery": "3s"}})
    assert main(["run", "-f", str(path), "-q"]) == code


def test_run_writes_the_json_report_with_the_contract_keys(
    write_drill: WriteDrill,
    tmp_path: Path,
) -> None:
    report = tmp_path / "out" / "report.json"
    assert main(["run", "-f", str(write_drill()), "-q", "--report", str(report)]) == 0
    doc = json.loads(report.read_text())
    for key in (
        "verdict",
        "resumeStep",
        "expectedResumeStep",
        "lostSteps",
        "recoveryTimeSeconds",
        "checks",
        "target",
        "timeline",
        "breakdown",
    ):
        assert key in doc, key
    assert doc["verdict"] == "PASS"
    assert doc["resumeStep"] == doc["expectedResumeStep"]
    assert {c["name"] for c in doc["checks"]} >= {"resume_step", "recovery_time"}
    assert all(
        set(c) >= {"name", "passed", "expected", "observed", "message"} for c in doc["checks"]
    )
    assert doc["target"]["rank"] == 1
    assert any(e["kind"] == "kill" for e in doc["timeline"])
    assert not stat.S_IMODE(report.stat().st_mode) & stat.S_IWOTH


def test_a_report_dir_holds_report_events_transcript_summary_and_picture(
    write_drill: WriteDrill,
    tmp_path: Path,
) -> None:
    out = tmp_path / "drill"
    assert main(["run", "-f", str(write_drill()), "-q", "--report-dir", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"report.json", "events.jsonl", "summary.md", "transcript.jsonl"} <= names
    assert_rejudged(out)  # a drill on the real clock, replayed to its own report
    pytest.importorskip("matplotlib")
    assert {"timeline.png", "timeline.svg"} <= names
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_github_step_summary_gets_a_markdown_summary(
    write_drill: WriteDrill,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    path = write_drill({"workload": {"fake": {"resume": "zero"}}})
    assert main(["run", "-f", str(path), "-q", "--report", str(tmp_path / "r.json")]) == 1
    text = summary.read_text()
    assert "FAIL" in text
    assert "the job restarted from scratch" in text
    assert "| resumeStep | 0 |" in text


def test_github_step_summary_gets_the_summary_of_a_run_without_any_report_option(
    write_drill: WriteDrill,
    tmp_path: Path,
) -> None:
    summary = tmp_path / "step-summary.md"
    summary.write_text("# earlier steps\n")
    path = write_drill({"workload": {"fake": {"resume": "zero"}}})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(path), "-q"],
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
        env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert proc.returncode == 1, proc.stderr
    text = summary.read_text()
    assert text.startswith("# earlier steps\n")  # appended, never overwritten
    assert "RecoveryGate drill `recovery-test`: FAIL" in text
    assert "| resumeStep | 0 |" in text
    assert "**Diagnosis: checkpoints saved, but the replacement trained from scratch**" in text


def test_a_long_message_is_shortened_on_the_terminal_with_a_marker_never_mid_word() -> None:
    from pytest_recoverygate.cli import shorten

    message = "root cause rank 1; last worker error: RuntimeError: " + "word " * 300
    short = shorten(message, 100)
    assert len(short) < len(message)
    kept, _, marker = short.partition(" … [shortened here: ")
    assert message.startswith(kept) and message[len(kept)] == " "  # cut between words
    assert marker.endswith("more characters in the report]")
    assert shorten("short", 100) == "short"
    one_token = "x" * 300
    assert shorten(one_token, 100).startswith("x" * 100 + " … [shortened here: 200 more")


def test_an_invalid_config_exits_2_with_the_line_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("workload:\n  orchestrator: fake\ninjectFailure:\n  afterCheckpoint: soon\n")
    proc = run_cli("run", "-f", str(path), "--yes")
    assert proc.returncode == 2
    assert "bad.yaml:4" in proc.stderr
    assert "afterCheckpoint" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    proc = run_cli("validate", "-f", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2
    assert "nope.yaml" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_validate_checks_a_file_without_running_it(write_drill: WriteDrill) -> None:
    proc = run_cli("validate", "-f", str(write_drill()))
    assert proc.returncode == 0, proc.stderr
    assert "valid" in proc.stdout


def test_validate_prints_the_effective_config_with_the_defaults_as_yaml(
    write_drill: WriteDrill,
    tmp_path: Path,
) -> None:
    path = write_drill({"timeouts": {}})
    proc = run_cli("validate", "-f", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"# {path}: valid (fake drill 'recovery-test')")
    effective = yaml.safe_load(proc.stdout)
    # what the file left out, filled in with the defaults, in the YAML language
    assert effective["timeouts"] == {
        "discovery": "5m",
        "checkpoint": "1h",
        "recovery": "5s",
        "recoveryGrace": "30s",
    }
    assert effective["injectFailure"]["count"] == 1
    # the fault's own defaults, filled in like every other section's
    assert effective["injectFailure"]["targetRank"] == 1
    assert effective["injectFailure"]["delay"] == "0s"
    assert effective["workload"]["reportingRank"] == 0
    again = tmp_path / "again.yaml"
    again.write_text(proc.stdout)
    assert run_cli("validate", "-f", str(again)).returncode == 0  # it loads back


@pytest.mark.parametrize(
    ("fault", "filled", "left_to_the_run"),
    [
        ("KillWorker", {"targetRank": 1, "delay": "0s"}, []),
        ("Preempt", {"targetRank": 1, "delay": "0s", "gracePeriod": "30s"}, []),
        ("KillDuringCheckpoint", {}, ["targetRank", "delay"]),
    ],
)
def test_validate_fills_in_the_defaults_of_inject_failure(
    write_drill: WriteDrill,
    tmp_path: Path,
    fault: str,
    filled: dict[str, object],
    left_to_the_run: list[str],
) -> None:
    path = write_drill({"injectFailure": {"type": fault, "afterCheckpoint": "next"}})
    proc = run_cli("validate", "-f", str(path))
    assert proc.returncode == 0, proc.stderr
    inject = yaml.safe_load(proc.stdout)["injectFailure"]
    assert {k: inject[k] for k in filled} == filled
    for key in left_to_the_run:  # decided by the run: said, not made up
        assert key not in inject
        assert f"# injectFailure.{key}: " in proc.stdout
    again = tmp_path / "again.yaml"
    again.write_text(proc.stdout)
    assert run_cli("validate", "-f", str(again)).returncode == 0, "it loads back"


def test_validate_never_prints_env_values(tmp_path: Path) -> None:
    path = tmp_path / "local.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "workload": {
                    "orchestrator": "local",
                    "command": ["torchrun", "train.py"],
                    "env": {"WANDB_API_KEY": "s3cret-value"},
                },
                "injectFailure": {"afterCheckpoint": "next"},
                "expectations": {"maxRecoveryTime": "1m"},
            }
        )
    )
    proc = run_cli("validate", "-f", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "s3cret-value" not in proc.stdout
    assert yaml.safe_load(proc.stdout)["workload"]["env"] == {"WANDB_API_KEY": "<redacted>"}


def test_require_confirm_without_a_terminal_or_yes_exits_2_before_touching_anything(
    write_drill: WriteDrill,
) -> None:
    path = write_drill({"safety": {"requireConfirm": True}})
    proc = run_cli("run", "-f", str(path))
    assert proc.returncode == 2
    assert "--yes" in proc.stderr
    assert "discovering" not in proc.stderr


def test_yes_confirms_the_kill(write_drill: WriteDrill) -> None:
    path = write_drill({"safety": {"requireConfirm": True}})
    proc = run_cli("run", "-f", str(path), "--yes")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "RecoveryGate verdict: PASS" in proc.stdout


def test_dry_run_exits_0_and_says_nothing_was_killed(write_drill: WriteDrill) -> None:
    proc = run_cli("run", "-f", str(write_drill({"safety": {"requireConfirm": True}})), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "nothing was killed" in proc.stdout


def test_sigint_mid_drill_exits_130_after_cleanup(write_drill: WriteDrill) -> None:
    import signal
    import time

    path = write_drill({"injectFailure": {"afterCheckpoint": "step-100000"}})
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_recoverygate.cli", "run", "-f", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    until = deadline(PROCESS)
    assert proc.stderr is not None
    seen = ""
    while "waiting for" not in seen and time.time() < until:
        seen += proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=within(PROCESS))
    assert proc.returncode == 130
    assert "cleanup done" in err


def test_help_does_not_import_kubernetes_torch_or_pydantic() -> None:
    code = (
        "import sys, runpy; sys.argv = ['recoverygate', '--help']\n"
        "try:\n    runpy.run_module('pytest_recoverygate.cli', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = [m for m in ('kubernetes', 'torch', 'pydantic', 'psutil') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=True,
    )
    assert "HEAVY []" in proc.stdout
    assert "exit codes" in proc.stdout


def test_kubectl_plugin_name_is_shown_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"], prog="kubectl-recoverygate")
    assert exited.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith("usage: kubectl recoverygate [-h]"), usage
    assert "exit codes: 0 PASS" in usage


def test_the_console_scripts_are_installed() -> None:
    bindir = Path(sys.executable).parent
    for name in ("recoverygate", "kubectl-recoverygate"):
        assert (bindir / name).exists() or any(
            (Path(p) / name).exists() for p in os.environ.get("PATH", "").split(os.pathsep)
        ), name


def test_a_report_path_that_is_a_folder_is_refused_before_the_drill(
    write_drill: WriteDrill,
    tmp_path: Path,
) -> None:
    proc = run_cli("run", "-f", str(write_drill()), "--report", str(tmp_path))
    assert proc.returncode == 2
    assert "is a folder" in proc.stderr
    assert "discovering" not in proc.stderr


def test_a_report_that_cannot_be_written_keeps_the_verdict_and_exits_3(
    write_drill: WriteDrill,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    report = blocker / "r.json"  # its folder is a file: cannot be created (even as root)
    code = main(["run", "-f", str(write_drill()), "-q", "--report", str(report)])
    out, err = capsys.readouterr()
    assert code == 3
    assert "RecoveryGate verdict: PASS" in out
    assert "its report could not be written" in err


def test_a_step_summary_that_cannot_be_written_warns_and_keeps_the_verdict(
    write_drill: WriteDrill,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path))  # a folder: cannot be appended to
    code = main(["run", "-f", str(write_drill()), "-q", "--report", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 0
    assert "RecoveryGate verdict: PASS" in out
    assert "could not append the drill's summary to GITHUB_STEP_SUMMARY" in err
    assert (tmp_path / "r.json").is_file()
