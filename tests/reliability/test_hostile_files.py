"""A job's files cannot make the drill read, write or hang on what it points them at.

The drill may run as root (node faults) or as a Slurm operator, and everything a job
controls is hostile input: its output file's path, the files it can plant beside it,
the text it prints. We test these aspects, each attack reproduced with real files:

- the output tail (Slurm's output file, local attach, Ray's worker logs) never follows a
  symbolic link planted at the job's path, before or after it started reading; never
  blocks on a FIFO there; never reads a hard link to a file of another user's (a
  stand-in for ``/etc/shadow`` holding a secret we create) when the drill is not the
  job's user; and says once, with the reason, that it refused the file;
- a report folder with links planted at ``timeline.png``/``.svg``, ``report.json``,
  ``summary.md``, ``events.jsonl`` and ``output/`` (a real fake-backend drill writes into
  it): every victim keeps its bytes and its mode, the report's files are real files,
  0600, in folders 0700; report.html rendered from a folder with links planted at the
  picture and the job's output does not carry what they point to;
- the drill lock: a hard link (or a symlink, a FIFO) planted at the lock file's name is
  refused, the victim untouched; the holder's text in the message is printable and
  bounded; the default lock folder is private;
- job text on screens: the step summary of a job whose output closes fences
  (```` ```` ````, ``~~~~``), holds ANSI/OSC escapes and fake markdown links shows it as
  text; the verdict block and the live status show control characters visibly;
- token masking in the job output a report keeps (Hugging Face, GitHub, AWS, Slack,
  ``sk-``, Bearer, ``password=``), the terminal's tail included.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from pytest_recoverygate.cli import LiveStatus
from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.engine.machine import Phase, Verdict
from pytest_recoverygate.errors import DiscoveryError
from pytest_recoverygate.orchestrators.slurm.events import SlurmEventSource
from pytest_recoverygate.registry.seams import Notices, SimulatedClock
from pytest_recoverygate.report.evidence import gather_evidence
from pytest_recoverygate.report.files import markdown_summary, write_html_report, write_reports
from pytest_recoverygate.report.terminal import print_result
from pytest_recoverygate.runner import RunOptions, Status, run_drill
from pytest_recoverygate.shared import lock as lock_module
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.filetail import OutputTail, RefusedFile, open_job_file
from pytest_recoverygate.shared.joboutput import JobOutput, WorkerOutput
from pytest_recoverygate.shared.jobtext import mask_secrets
from pytest_recoverygate.shared.lock import DrillLock, lock_dir
from tests.conftest import FAKE_DRILL, merge
from tests.patience import PROCESS, PROMPT, eventually, within
from tests.reliability.conftest import Figures
from tests.trend_reports import run_fake_drill

SECRET = b"root:$6$s3cr3t-shadow-hash:19000:0:99999:7:::\n"
JOB_UID = 65534  # a job user that is not the drill's (nobody)
AS_ROOT = os.geteuid() == 0


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file standing in for /etc/shadow: the drill's own (root's when run as root)."""
    victim = tmp_path / "etc" / "shadow"
    victim.parent.mkdir()
    victim.write_bytes(SECRET)
    victim.chmod(0o600)
    return victim


class Tail:
    """An OutputTail of ``path`` as a backend builds one, feeding a real event source."""

    made: ClassVar[list[Tail]] = []

    def __init__(self, path: Path, owner: int | None) -> None:
        Tail.made.append(self)
        self.chunks: list[bytes] = []
        self.source = StreamEventSource()
        self.tail = OutputTail(
            str(path),
            self._sink,
            SimulatedClock(),
            interval=0.02,
            owner=owner,
            on_notice=self.source.notice,
        )

    def _sink(self, chunk: bytes, _received: float) -> None:
        self.chunks.append(chunk)
        self.source.feed(chunk)

    @property
    def read(self) -> bytes:
        return b"".join(self.chunks)

    def notices(self) -> list[str]:
        return [text for _, text in self.source.notices()]


@pytest.fixture(autouse=True)
def _stop_tails() -> Iterator[None]:
    yield
    while Tail.made:
        Tail.made.pop().tail.stop()


def _job_file(path: Path, text: bytes, uid: int | None) -> Path:
    path.write_bytes(text)
    if uid is not None:
        os.chown(path, uid, -1)
    return path


def test_a_symlink_at_the_jobs_path_is_never_followed(
    tmp_path: Path, secret: Path, figures: Figures
) -> None:
    link = tmp_path / "slurm-7.out"
    link.symlink_to(secret)
    tail = Tail(link, owner=os.geteuid())  # even as the job's own user: never followed

    assert tail.tail.poll_once() == 0
    assert tail.tail.poll_once() == 0

    assert SECRET not in tail.read
    assert tail.notices() == [
        f"not reading the job's file {link}: it is a symbolic link (not followed)"
    ]  # once, though polled twice
    with pytest.raises(RefusedFile, match="symbolic link"):
        open_job_file(str(link), os.geteuid())
    figures.add("hostile_file_attacks")


def test_a_file_swapped_for_a_symlink_mid_drill_is_read_to_its_end_and_no_further(
    tmp_path: Path, secret: Path, figures: Figures
) -> None:
    path = _job_file(tmp_path / "train.log", b"step 1\n", None)
    tail = Tail(path, owner=os.geteuid())
    tail.tail.poll_once()
    with path.open("ab") as handle:
        handle.write(b"step 2\n")  # written before the swap: still the job's
    planted = tmp_path / "planted"
    planted.symlink_to(secret)
    planted.rename(path)  # the job replaces its output with a link (atomic rename)

    tail.tail.poll_once()
    tail.tail.poll_once()

    assert tail.read == b"step 1\nstep 2\n"
    assert tail.notices() == [
        f"not reading the job's file {path}: it is a symbolic link (not followed)"
    ]
    path.unlink()
    path.write_bytes(b"step 3\n")  # a real file again: read from its start, said so
    tail.tail.poll_once()
    assert tail.read == b"step 1\nstep 2\nstep 3\n"
    assert tail.notices() == [f"reading the job's file {path} again: it passes the checks"]
    figures.add("hostile_file_attacks")


def test_a_fifo_at_the_jobs_path_does_not_hang_the_tail(tmp_path: Path, figures: Figures) -> None:
    fifo = tmp_path / "slurm-7.out"
    os.mkfifo(fifo)
    tail = Tail(fifo, owner=os.geteuid())
    done = threading.Event()

    def poll() -> None:
        tail.tail.seek_end()
        tail.tail.poll_once()
        done.set()

    threading.Thread(target=poll, daemon=True).start()
    assert done.wait(within(PROMPT)), "the tail blocked opening a FIFO with no writer"
    assert tail.notices() == [
        f"not reading the job's file {fifo}: it is a FIFO (named pipe), not a regular file"
    ]
    polls: list[int] = []
    poll_once = tail.tail.poll_once

    def counted() -> int:
        polls.append(1)
        return poll_once()

    tail.tail.poll_once = counted  # type: ignore[method-assign]
    tail.tail.start()  # the thread polls it again and again, and stops when asked
    eventually(lambda: len(polls) >= 3, "three polls of the FIFO by the tail's thread", PROMPT)
    stopped = threading.Thread(target=tail.tail.stop, daemon=True)
    stopped.start()
    stopped.join(within(PROMPT))
    assert not stopped.is_alive(), "stop() hung on the FIFO"
    figures.add("hostile_file_attacks")


@pytest.mark.skipif(not AS_ROOT, reason="a file of another user's needs root to make")
def test_a_hard_link_to_another_users_file_is_not_read_when_the_drill_is_not_the_job(
    tmp_path: Path, secret: Path, figures: Figures
) -> None:
    link = tmp_path / "slurm-7.out"
    os.link(secret, link)  # same inode as the secret: O_NOFOLLOW does not see it
    tail = Tail(link, owner=JOB_UID)

    assert tail.tail.poll_once() == 0

    assert SECRET not in tail.read
    assert tail.notices() == [
        f"not reading the job's file {link}: it is owned by uid 0, not by the job's user "
        f"(uid {JOB_UID}), and the drill runs as uid 0: a link to another user's file"
    ]
    figures.add("hostile_file_attacks")


@pytest.mark.skipif(not AS_ROOT, reason="the root-only rule")
def test_as_root_without_the_jobs_user_a_file_root_owns_is_refused(
    tmp_path: Path, secret: Path
) -> None:
    link = tmp_path / "slurm-7.out"
    os.link(secret, link)
    with pytest.raises(RefusedFile, match="owned by root"):
        open_job_file(str(link), None)


@pytest.mark.skipif(not AS_ROOT, reason="a file of another user's needs root to make")
def test_the_job_users_own_file_is_read_as_root(tmp_path: Path) -> None:
    path = _job_file(tmp_path / "slurm-7.out", b"step 1\n", JOB_UID)
    tail = Tail(path, owner=JOB_UID)
    tail.tail.poll_once()
    assert tail.read == b"step 1\n"
    assert tail.notices() == []


def test_the_slurm_source_hands_the_refusal_to_the_runner(tmp_path: Path, secret: Path) -> None:
    link = tmp_path / "slurm-7.out"
    link.symlink_to(secret)
    source = SlurmEventSource(StreamEventSource())
    tail = source.follow(str(link), SimulatedClock(), interval=0.02, owner=os.geteuid())
    tail.poll_once()
    assert isinstance(source, Notices)
    source.close()
    assert [text for _, text in source.notices()] == [
        f"not reading the job's file {link}: it is a symbolic link (not followed)"
    ]


# --------------------------------------------------------------------- report folders

VICTIM = b"root:x:0:0:root:/root:/bin/bash\n"
PLANTED_FILES = (
    "timeline.png",
    "timeline.svg",
    "report.json",
    "summary.md",
    "events.jsonl",
    "report.html",
)


def _victims(tmp_path: Path, names: tuple[str, ...]) -> dict[str, Path]:
    folder = tmp_path / "victims"
    folder.mkdir()
    victims = {}
    for name in names:
        victim = folder / name.replace("/", "_")
        victim.write_bytes(VICTIM)
        victim.chmod(0o640)
        victims[name] = victim
    return victims


def test_links_planted_in_a_report_folder_are_replaced_and_their_targets_untouched(
    tmp_path: Path, figures: Figures
) -> None:
    report = tmp_path / "drills" / "nightly"
    report.mkdir(parents=True)
    victims = _victims(tmp_path, PLANTED_FILES)
    for name, victim in victims.items():
        (report / name).symlink_to(victim)
    victim_folder = tmp_path / "victim-folder"
    victim_folder.mkdir(mode=0o755)
    (report / "output").symlink_to(victim_folder, target_is_directory=True)

    code, folder = run_fake_drill(tmp_path / "drills", {"workload": {"fake": {"resume": "zero"}}})

    assert code == 1 and folder == report
    for name, victim in victims.items():
        assert victim.read_bytes() == VICTIM, name
        assert stat.S_IMODE(victim.stat().st_mode) == 0o640, name
        assert not (report / name).is_symlink(), name
    assert list(victim_folder.iterdir()) == []
    assert stat.S_IMODE(victim_folder.stat().st_mode) == 0o755
    assert not (report / "output").is_symlink() and (report / "output").is_dir()
    doc = json.loads((report / "report.json").read_text())
    assert doc["timelinePicture"] == "timeline.png"
    assert doc["jobOutput"], "the fake job's output is kept under output/"
    figures.add("hostile_file_attacks", len(victims) + 1)


def test_report_files_are_the_owners_alone(tmp_path: Path) -> None:
    code, report = run_fake_drill(tmp_path, {"workload": {"fake": {"resume": "zero"}}})
    assert code == 1
    assert stat.S_IMODE(report.stat().st_mode) == 0o700
    paths = list(report.rglob("*"))
    assert {p.name for p in paths} >= {"report.json", "timeline.png", "output", "report.html"}
    for path in paths:
        want = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == want, path


def test_report_html_does_not_read_links_planted_at_the_picture_or_the_output(
    tmp_path: Path, secret: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run_fake_drill(tmp_path, {"workload": {"fake": {"resume": "zero"}}})
    assert code == 1
    doc = json.loads((report / "report.json").read_text())
    relative = next(iter(doc["jobOutput"].values()))
    for name in ("timeline.svg", relative):
        (report / name).unlink()
        (report / name).symlink_to(secret)

    write_html_report(report)

    page = (report / "report.html").read_text()
    assert "s3cr3t-shadow-hash" not in page
    err = capsys.readouterr().err
    assert "not reading timeline.svg is a symbolic link" in err
    assert f"not reading {relative} is a symbolic link" in err


def test_a_fifo_planted_at_the_jobs_output_in_a_report_folder_does_not_hang_html(
    tmp_path: Path,
) -> None:
    code, report = run_fake_drill(tmp_path, {"workload": {"fake": {"resume": "zero"}}})
    assert code == 1
    doc = json.loads((report / "report.json").read_text())
    relative = next(iter(doc["jobOutput"].values()))
    (report / relative).unlink()
    os.mkfifo(report / relative)
    done = threading.Event()

    def render() -> None:
        write_html_report(report)
        done.set()

    threading.Thread(target=render, daemon=True).start()
    assert done.wait(within(PROMPT)), "report.html blocked reading a FIFO"


# --------------------------------------------------------------------- the drill lock


def test_a_hard_link_planted_at_the_lock_files_name_is_refused_and_left_untouched(
    tmp_path: Path, figures: Figures
) -> None:
    victim = tmp_path / "passwd"
    victim.write_bytes(VICTIM)
    victim.chmod(0o644)
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    lock = DrillLock("slurm\0\0train", job="train", config_path="ci.yaml", directory=locks)
    os.link(victim, lock.path)

    with pytest.raises(DiscoveryError, match="has 2 hard links; nothing was written"):
        lock.acquire()

    assert victim.read_bytes() == VICTIM and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert not lock.held
    lock.path.unlink()
    lock.path.symlink_to(victim)
    with pytest.raises(DiscoveryError, match="is a symbolic link"):
        lock.acquire()
    lock.path.unlink()
    os.mkfifo(lock.path)
    with pytest.raises(DiscoveryError, match="not a regular file"):
        lock.acquire()
    assert victim.read_bytes() == VICTIM
    figures.add("hostile_file_attacks", 3)


def test_the_lock_holders_text_is_shown_printable_and_bounded(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    first = DrillLock("k", job="job", config_path="a.yaml", directory=locks)
    first.acquire()
    try:
        hostile = {"pid": "\x1b[2J", "config": "\x1b]0;pwned\x07" + "x" * 3000}
        fd = os.open(first.path, os.O_WRONLY)
        os.pwrite(fd, json.dumps(hostile).encode(), 0)
        os.close(fd)
        second = DrillLock("k", job="job", config_path="b.yaml", directory=locks)
        with pytest.raises(DiscoveryError) as caught:
            second.acquire()
    finally:
        first.release()
    message = str(caught.value)
    assert "\x1b" not in message and "\x07" not in message
    assert "pid unknown" in message and "\\x1b]0;pwned\\x07" in message
    assert len(message) < 600


def test_the_default_lock_folder_is_private(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RECOVERYGATE_LOCK_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(lock_module, "ROOT_LOCK_DIR", tmp_path / "run" / "recoverygate")
    (tmp_path / "run").mkdir()
    folder = lock_dir()
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
    assert stat.S_IMODE(st.st_mode) == 0o700
    folder.chmod(0o777)  # someone opened it up: refused, with the fix
    with pytest.raises(DiscoveryError, match="not a private folder"):
        lock_dir()


def test_the_lock_folder_from_the_environment_passes_the_same_checks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 41: RECOVERYGATE_LOCK_DIR was taken without the private-folder checks (as
    root it accepted a 0777 folder, where another user could plant the lock file)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("RECOVERYGATE_LOCK_DIR", str(shared))
    with pytest.raises(DiscoveryError, match=r"not a private folder .*RECOVERYGATE_LOCK_DIR"):
        lock_dir()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(private)
    monkeypatch.setenv("RECOVERYGATE_LOCK_DIR", str(link))
    with pytest.raises(DiscoveryError, match="not a private folder"):
        lock_dir()
    monkeypatch.setenv("RECOVERYGATE_LOCK_DIR", str(private))
    assert lock_dir() == private
    missing = tmp_path / "missing"
    monkeypatch.setenv("RECOVERYGATE_LOCK_DIR", str(missing))
    assert lock_dir() == missing
    assert stat.S_IMODE(os.lstat(missing).st_mode) == 0o700


# --------------------------------------------------------------------- job text on screens

HOSTILE_TAIL = [
    "Traceback (most recent call last):",
    "~~~~",
    "```",
    "````` closes a five-backtick fence",
    "**[Click to fix your job](https://evil.example/steal)** <img src=https://evil.example/p>",
    "\x1b[2J\x1b[1;1HRecoveryGate verdict: PASS \x1b]8;;https://evil.example\x07link\x1b]8;;\x07",
    "RuntimeError: boom",
]


def _summary_doc(summary: str, tail: list[str]) -> dict[str, Any]:
    return {
        "drill": "nightly",
        "verdict": "FAIL",
        "summary": summary,
        "checks": [
            {
                "name": "resumeStep",
                "passed": False,
                "expected": 40,
                "observed": 0,
                "message": "[evil](https://evil.example) \x1b[31mred",
            }
        ],
        "failingWorker": "rank 1",
        "failingWorkerTail": tail,
        "jobOutput": {"rank 1": "output/rank-1.log"},
    }


def test_the_step_summary_shows_a_hostile_tail_and_summary_as_text(figures: Figures) -> None:
    text = markdown_summary(
        _summary_doc(
            "resumed from step 0 [see here](https://evil.example) # not a heading", HOSTILE_TAIL
        )
    )
    lines = text.splitlines()
    opening = lines.index("``````")  # one longer than the longest backtick run (5)
    closing = len(lines) - 1 - lines[::-1].index("``````")
    assert closing > opening
    inside = lines[opening + 1 : closing]
    assert inside[1:4] == ["~~~~", "```", "````` closes a five-backtick fence"]
    assert all(not line.startswith("``````") for line in inside)
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[2J" in text  # the escape is shown, not run
    assert "\\[see here\\](https\\://evil.example)" in text
    assert "\\[evil\\](https\\://evil.example) \\\\x1b\\[31mred" in text
    assert "](https://evil" not in text.split("``````")[0]  # no link outside the fence
    figures.add("hostile_file_attacks")


def test_the_verdict_block_and_the_status_line_show_control_characters_visibly(
    tmp_path: Path,
) -> None:
    result = run_drill(load_config(_fake_config(tmp_path)), RunOptions(confirmed=True))
    hostile = replace(
        result,
        summary="\x1b[2J\x1b[HRecoveryGate verdict: PASS\r\x1b]0;title\x07 \x9b31m",
        verdict=Verdict.FAIL,
    )
    out = io.StringIO()
    print_result(hostile, out)
    shown = out.getvalue()
    assert not any(c in shown for c in "\x1b\x07\r\x9b")
    assert "\\x1b[2J\\x1b[HRecoveryGate verdict: PASS\\x0d\\x1b]0;title\\x07 \\x9b31m" in shown
    status = io.StringIO()
    LiveStatus(status)(
        Status(
            phase=Phase.DISCOVERING,
            message="found \x1b[31mpid 7\x1b[0m",
            elapsed=1.0,
            step=None,
            since_kill=None,
            max_recovery_time=None,
            phase_changed=True,
        )
    )
    assert "\x1b" not in status.getvalue() and "\\x1b[31mpid 7" in status.getvalue()


def _fake_config(tmp_path: Path) -> Path:
    path = tmp_path / "drill.yaml"
    path.write_text(yaml.safe_dump(merge(FAKE_DRILL, {"workload": {"fake": {"resume": "zero"}}})))
    return path


# --------------------------------------------------------------------- secrets in kept output

TOKENS = {
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345": "hf_[masked]",
    "ghp_0123456789abcdefghijABCDEFGHIJ012345": "ghp_[masked]",
    "AKIAIOSFODNN7EXAMPLE": "AKIAIOSF[masked]",
    "xoxb-123456789012-abcdefghijkl": "xoxb-[masked]",
    "sk-proj-0123456789abcdefghijklmn": "sk-[masked]",
    "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc": "Authorization: Bearer [masked]",
    "--password=hunter2hunter2": "--password=[masked]",
    "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCY": "AWS_SECRET_ACCESS_KEY=[masked]",
}


def test_common_tokens_are_masked_and_ordinary_lines_kept() -> None:
    for token, masked in TOKENS.items():
        assert mask_secrets(f"x {token} y") == f"x {masked} y", token
    for line in ("step 40 loss=0.25 tokens/s=12000", "task-abcdefghijklmnopqrstuvwxyz", "sk-short"):
        assert mask_secrets(line) == line


class _JobWithSecrets:
    """A backend's kept output as the runner asks for it (JobOutputSource)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def job_output(self) -> JobOutput:
        return JobOutput((WorkerOutput("rank 1", self.text),), failing="rank 1")


def test_the_job_output_a_report_keeps_is_masked(tmp_path: Path, figures: Figures) -> None:
    result = run_drill(load_config(_fake_config(tmp_path)), RunOptions(confirmed=True))
    lines = [f"env: {token}" for token in TOKENS] + ["RuntimeError: boom"]
    evidence = gather_evidence(result, _JobWithSecrets("\n".join(lines) + "\n"))  # type: ignore[arg-type]
    report = tmp_path / "report"
    write_reports(result, load_config(_fake_config(tmp_path)), None, report, [], evidence=evidence)
    out = io.StringIO()
    print_result(result, out, evidence)
    kept = [p.read_text() for p in report.rglob("*") if p.is_file() and p.suffix != ".png"]
    for token in TOKENS:
        secret_part = token.split("=")[-1].split(" ")[-1][8:]
        assert all(secret_part not in text for text in [*kept, out.getvalue()]), token
    log = (report / "output" / "rank-1.log").read_text()
    assert all(masked in log for masked in TOKENS.values())
    figures.add("hostile_file_attacks", len(TOKENS))


# --------------------------------------------------------------------- a real attached drill

AGENT_LIKE = """
import os, subprocess, sys, time
for rank in range(2):
    env = {**os.environ, "RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.local
def test_an_attached_job_that_swaps_its_output_for_a_symlink_gets_a_refusal_on_the_timeline(
    tmp_path: Path, secret: Path, figures: Figures
) -> None:
    """A torchrun-like agent writing to train.log; once the drill follows it, the job
    renames a symlink to the secret over train.log. The drill reads nothing through it,
    and its report's timeline says why; the secret is in no report file."""
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    with open(log, "ab") as out:
        agent = subprocess.Popen(
            [sys.executable, "-c", AGENT_LIKE], stdout=out, start_new_session=True
        )
    config = tmp_path / "attach.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "attach",
                "workload": {"orchestrator": "local", "attachPid": agent.pid},
                "injectFailure": {"afterCheckpoint": "step-20"},
                "expectations": {"maxRecoveryTime": "5s"},
                "safety": {"requireConfirm": False, "dryRun": True},
                "timeouts": {"discovery": "20s", "checkpoint": "4s"},
            }
        )
    )

    phases: list[Phase] = []

    def swap() -> None:
        # the drill has found the agent and follows its file: it waits for a checkpoint
        following = Phase.WAITING_FOR_CHECKPOINT
        eventually(lambda: following in phases, "the drill following the agent's output")
        planted = tmp_path / "planted"
        planted.symlink_to(secret)
        planted.rename(log)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    report = tmp_path / "report"
    try:
        observe = RunOptions(report_dir=report, observer=lambda st: phases.append(st.phase))
        result = run_drill(load_config(config), observe)
    finally:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(timeout=within(PROCESS))
        swapper.join(within(PROMPT))
    assert result.verdict is Verdict.ERROR
    refused = [e for e in result.timeline if e.kind == "refused"]
    assert [e.detail for e in refused] == [
        f"not reading the job's file {log}: it is a symbolic link (not followed)"
    ]
    doc = json.loads((report / "report.json").read_text())
    assert any(e["kind"] == "refused" for e in doc["timeline"])
    assert "**Job files the drill refused to read**" in (report / "summary.md").read_text()
    shown = io.StringIO()
    print_result(result, shown)
    assert f"  refused: not reading the job's file {log}: it is a symbolic link" in shown.getvalue()
    for path in report.rglob("*"):
        if path.is_file():
            assert b"s3cr3t-shadow-hash" not in path.read_bytes(), path
    figures.add("hostile_file_attacks")
