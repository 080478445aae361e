"""A hostile job cannot freeze the drill with its text, nor run code with the drill's rights.

Issue 30, findings 4 and 5. We test these aspects:
- bounded regexes: job output crafted against each regex that reads it (torchrun's root
  cause, the exception lines, the launcher prefixes, the failure signatures) is read in
  well under a second; the old patterns took seconds to minutes on the same inputs (the
  figures are in CHANGELOG.md, measured, not asserted: the bounds below are generous);
  the results on real output are unchanged;
- bounded buffers: a 50 MB line without a newline through the pod-log line splitter holds
  at most MAX_LINE_BYTES (measured with tracemalloc), comes out cut and counted, and the
  next line is whole;
- engine state: a flood of distinct incarnations and of checkpoint lines stops at the
  ledger's caps, the excess is counted as ignored lines and noted, and the verdict of the
  real recovery is unchanged;
- imports: the Ray helper, started from a folder with a planted ``json.py``, and the
  kubectl shim, started from a folder with a planted ``pytest_recoverygate/``, never
  import them (the same folder does take over an unisolated ``python -m`` / ``-c``:
  the test shows the plant works);
- loopback: a torchft example's lighthouse, started with the example's own command and
  ports, listens on loopback only; ``{port:NAME}`` is probed on loopback;
- root's tools: with a planted ``ip``/``nsenter``/``mount``/``hostname`` first on PATH,
  the node wrapper and ``ip`` run the system's, by absolute path from the trusted folders.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from pytest_recoverygate.engine.caps import MAX_CHECKPOINTS, MAX_INCARNATIONS
from pytest_recoverygate.engine.machine import Verdict
from pytest_recoverygate.engine.model import TrainingEventKind
from pytest_recoverygate.orchestrators.local import netns
from pytest_recoverygate.orchestrators.local.torchrun import root_cause, root_cause_fields
from pytest_recoverygate.orchestrators.ray.helper import helper_command
from pytest_recoverygate.report.diagnosis import Clues, diagnose
from pytest_recoverygate.shared.joboutput import OutputSplitter, torchrun_rank_of
from pytest_recoverygate.shared.textbounds import (
    MAX_LINE_BYTES,
    MAX_MATCH_LINE,
    CutLine,
    LineSplitter,
    cap_lines,
)
from tests.engine_events import C, L, S, ev
from tests.patience import JOB, PROMPT, eventually, within
from tests.reliability.conftest import Figures
from tests.test_engine_patterns import drive, engine_for, result_of, steps_run

REPO = Path(__file__).resolve().parents[2]
STARTED = TrainingEventKind.CHECKPOINT_STARTED
GENEROUS = 2.0  # seconds: the new code takes milliseconds; the old took seconds or more


def timed(call: object) -> float:
    assert callable(call)
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


# ---------------------------------------------------------------------------- regexes


def test_a_forged_root_cause_block_is_read_in_linear_time(figures: Figures) -> None:
    # One header, then 700 "rank / exitcode" lines and no traceback: the old single regex
    # tried every rank x every exitcode x the rest of the text (15 kB: 8 s on this machine).
    forged = "Root Cause (first observed failure):\n" + "  rank: 1 exitcode: 1\n" * 700
    assert len(forged) > 15_000
    assert timed(lambda: root_cause(forged)) < GENEROUS
    assert root_cause_fields(forged) is None  # no traceback field: no root cause
    spam = "Root Cause rank: 1 exitcode: 1 " * 1600  # 4 kB took 2.7 s, 8 kB 47 s
    assert timed(lambda: root_cause(spam)) < GENEROUS
    figures.add("hostile_regex_inputs", 2)


def test_the_root_cause_of_real_torchrun_output_is_unchanged() -> None:
    output = (
        "[rank1]: RuntimeError: the checkpoint is truncated\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-01-01\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 42)\n  error_file: <N/A>\n"
        "  traceback : Signal 9 (SIGKILL) received by PID 42\n"
    )
    assert root_cause_fields(output) == ("1", "-9", "Signal 9 (SIGKILL) received by PID 42")
    assert root_cause(output) == (
        "ChildFailedError; root cause rank 1, exit code -9 (Signal 9 (SIGKILL) received by "
        "PID 42); last worker error: RuntimeError: the checkpoint is truncated"
    )


@pytest.mark.parametrize(
    "output",
    [
        pytest.param("\n" * 50_000, id="blank-lines"),  # old: \s* across lines, ~60 s
        pytest.param(" \n" * 25_000, id="space-lines"),
        pytest.param("a." * 25_000, id="dotted-name"),
        pytest.param("[a]:" * 12_500, id="prefixes"),
    ],
)
def test_exception_lines_are_found_in_linear_time(output: str, figures: Figures) -> None:
    assert timed(lambda: root_cause(output)) < GENEROUS
    figures.add("hostile_regex_inputs")


def test_a_launcher_prefix_of_digits_is_read_in_linear_time(figures: Figures) -> None:
    line = b"[a" + b"1" * (64 * 1024)  # old: a lazy [\w-]*?(\d+) over it, 13 s
    assert timed(lambda: torchrun_rank_of(line)) < GENEROUS
    splitter = OutputSplitter(torchrun_rank_of, merged="torchrun")

    def feed() -> None:
        for _ in range(8):
            splitter.feed(line + b"\n")

    assert timed(feed) < GENEROUS
    assert torchrun_rank_of(b"[default12]:hello") == "rank 12"
    assert torchrun_rank_of(b"[rank3]: RuntimeError: x") == "rank 3"
    assert torchrun_rank_of(b"[default]:x") is None
    assert torchrun_rank_of(b"[1]:x") is None
    figures.add("hostile_regex_inputs")


@pytest.mark.parametrize(
    "lead",
    [
        "Gloo connectFullMesh failed with ",  # old: [^\n]* from each lead, 1 MiB line ~2 min
        "ERROR failed to connect, willRetry=0 ",
        "PytorchStreamReader failed reading file ",
        "FileNotFoundError: [Errno 2] ",
        'torch/serialization.py", line 1, in load\n',
    ],
)
def test_the_failure_signatures_read_a_mebibyte_of_crafted_output_quickly(
    lead: str, figures: Figures
) -> None:
    output = lead * (1024 * 1024 // len(lead))
    clues = Clues(output=output, verdict=Verdict.FAIL, killed=True, restarts=3)
    assert timed(lambda: diagnose(clues)) < 3 * GENEROUS
    figures.add("hostile_regex_inputs")


def test_the_signatures_still_match_their_real_lines() -> None:
    stale = "RuntimeError: Gloo connectFullMesh failed with [pair.cc:144] Connection refused"
    found = diagnose(Clues(output=f"x\n{stale}\ny", killed=True, restarts=3))
    assert [d.signature for d in found] == ["torchrun-shared-tcp-store"]
    assert found[0].evidence == stale
    truncated = "RuntimeError: PytorchStreamReader failed reading file data/0: invalid header"
    found = diagnose(Clues(output=truncated))
    assert [d.signature for d in found] == ["torch-load-truncated"]


def test_lines_are_cut_for_matching_and_counted() -> None:
    text = "short\n" + "y" * (MAX_MATCH_LINE + 10) + "\nshort"
    capped, cut = cap_lines(text)
    assert cut == 1
    assert capped.split("\n") == ["short", "y" * MAX_MATCH_LINE, "short"]
    assert cap_lines("a\nb") == ("a\nb", 0)


# ---------------------------------------------------------------------------- buffers


def test_a_50_mb_line_without_a_newline_stays_bounded_in_the_splitter(figures: Figures) -> None:
    splitter = LineSplitter()
    chunk = b"z" * (64 * 1024)
    total = 50 * 1000 * 1000
    lines: list[bytes] = []
    tracemalloc.start()
    try:
        started = time.perf_counter()
        sent = 0
        held = 0
        while sent < total:
            lines += splitter.feed(chunk)
            sent += len(chunk)
            held = max(held, splitter.buffered)
        lines += splitter.feed(b"tail\nnext line\n")
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held <= MAX_LINE_BYTES
    assert peak < 4 * MAX_LINE_BYTES, f"peak {peak} bytes"  # the line held, its copy out
    assert [len(line) for line in lines] == [MAX_LINE_BYTES, len(b"next line")]
    assert isinstance(lines[0], CutLine) and not isinstance(lines[1], CutLine)
    assert lines[1] == b"next line"
    assert splitter.truncated == 1
    assert elapsed < 10 * GENEROUS  # one pass over 50 MB (old: a find from the start per chunk)
    figures.add("hostile_buffer_bytes", total)


def test_the_splitter_keeps_lines_whole_across_chunks() -> None:
    splitter = LineSplitter(max_line=8)
    out = splitter.feed(b"ab") + splitter.feed(b"c\nde") + splitter.feed(b"f\n\n12345678\n")
    out += splitter.feed(b"123456789") + splitter.feed(b"abc\nok") + splitter.flush()
    assert out == [b"abc", b"def", b"", b"12345678", b"12345678", b"ok"]
    assert splitter.truncated == 1


# ---------------------------------------------------------------------------- engine caps


def test_a_flood_of_incarnations_is_capped_counted_and_the_verdict_holds(
    figures: Figures,
) -> None:
    engine = engine_for()
    flood = [ev(S, 0.01, f"forged-{i}", rank=1, pid=10_000 + i) for i in range(3 * 1024)]
    flood += [ev(C, 0.02, "forged-0", step, rank=1) for step in range(1, MAX_CHECKPOINTS + 51)]
    drive(engine, flood)
    drive(engine, steps_run("old", 0.0, list(range(1, 26))), kill_at=2.55)
    result = result_of(
        engine, steps_run("new", 3.0, [21, 22, 23, 24, 25], loaded=20, ckpt_every=None)
    )
    assert result.verdict is Verdict.PASS, result.summary
    ledger = engine.ledger
    assert len(ledger.others) == MAX_INCARNATIONS
    assert len(ledger.rank_saves[1]) == MAX_CHECKPOINTS
    excess = (3 * 1024 - MAX_INCARNATIONS) + 50
    assert ledger.capped_lines == excess
    assert result.ignored_lines == excess
    assert any("past the drill's bounds" in note for note in result.notes)
    figures.add("hostile_engine_lines", len(flood))


def test_repeated_checkpoint_lines_of_one_step_are_capped() -> None:
    # Each line is a timeline entry, even a repeat of one step: the cap counts lines.
    engine = engine_for(after_checkpoint=10**9)
    repeats = MAX_CHECKPOINTS + 20
    drive(engine, [ev(S, 0.0, "w", rank=0, pid=1)])
    for kind in (C, L, STARTED):
        drive(engine, [ev(kind, 0.01, "w", 7, rank=0) for _ in range(repeats)])
    assert engine.ledger.capped_lines == 3 * 20
    assert len(engine.ledger.checkpoints) == MAX_CHECKPOINTS


def test_the_reporting_ranks_incarnations_are_capped_too() -> None:
    engine = engine_for()
    drive(engine, [ev(S, 0.01, f"f{i}", rank=0, pid=i) for i in range(MAX_INCARNATIONS + 7)])
    assert len(engine.ledger.incs) == MAX_INCARNATIONS
    assert engine.ledger.capped_lines == 7


def test_start_lines_held_back_around_the_kill_are_capped_too() -> None:
    # Start lines stamped before the kill wait for their first other line (pending starts).
    engine = engine_for()
    drive(engine, steps_run("old", 0.0, list(range(1, 26))), kill_at=2.55)
    assert engine.kill_time is not None
    drive(engine, [ev(S, 2.0, f"early-{i}", rank=0, pid=i) for i in range(MAX_INCARNATIONS + 9)])
    assert engine.ledger.capped_lines == 9


def test_live_replicas_are_capped_too() -> None:
    from tests.test_live import start as live_start

    job = live_start()  # two replicas, a0 and b0
    for i in range(MAX_INCARNATIONS + 5):
        job.line(S, f"forged-{i}", replica=1)
    assert job.engine.ledger.capped_lines == 5 + 2  # the two real ones came first


# ---------------------------------------------------------------------------- imports


def plant(folder: Path, relative: str, marker: Path) -> None:
    """A module that, when imported, writes ``marker`` and breaks the import."""
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"open({str(marker)!r}, 'w').write('imported')\nraise SystemExit('planted module ran')\n"
    )


def test_the_ray_helper_never_imports_from_the_current_folder(tmp_path: Path) -> None:
    folder, marker = tmp_path / "jobdir", tmp_path / "marker"
    plant(folder, "json.py", marker)
    unisolated = subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.orchestrators.ray.helper", "bogus"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert marker.exists(), unisolated.stderr  # the plant works on what the drill used to run
    marker.unlink()
    done = subprocess.run(
        helper_command("bogus"),
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )
    assert not marker.exists()
    assert 'RECOVERYGATE-RAY {"error": "usage:' in done.stdout, done.stderr
    assert helper_command("x")[1] == "-I"


def test_the_kubectl_shim_never_imports_from_the_current_folder(tmp_path: Path) -> None:
    folder, marker = tmp_path / "work", tmp_path / "marker"
    plant(folder, "pytest_recoverygate/__init__.py", marker)
    unsafe = subprocess.run(
        [sys.executable, "-c", "import pytest_recoverygate.cli"],
        cwd=folder,
        capture_output=True,
        timeout=within(JOB),
        check=False,
    )
    assert marker.exists(), unsafe.stderr  # what `python -c` alone would have run
    marker.unlink()
    shim = REPO / ".krew" / "kubectl-recoverygate"
    done = subprocess.run(
        [str(shim), "--help"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
        env={**os.environ, "RECOVERYGATE_PYTHON": sys.executable},
    )
    assert not marker.exists()
    assert done.returncode == 0, done.stderr
    assert "kubectl recoverygate" in done.stdout


# ---------------------------------------------------------------------------- loopback


def listening(pid: int) -> set[str]:
    import psutil

    return {
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


@pytest.mark.slow
@pytest.mark.torchft
@pytest.mark.parametrize("example", sorted((REPO / "examples/local/torchft").glob("*.yaml")))
def test_the_torchft_examples_lighthouse_listens_on_loopback_only(example: Path) -> None:
    from pytest_recoverygate.config.loading import load_config
    from pytest_recoverygate.orchestrators.local.members import (
        MemberSpec,
        allocate_ports,
        fill_ports,
    )

    workload = load_config(example).workload
    members = [
        MemberSpec(m.name, tuple(m.command), dict(m.env), Path(), m.service)
        for m in workload.group  # type: ignore[attr-defined]
    ]
    ports = allocate_ports(members)
    lighthouse = next(m for m in members if m.service)
    command = list(fill_ports(lighthouse, ports).command)
    executable = shutil.which(command[0]) or str(Path(sys.executable).parent / command[0])
    if not Path(executable).exists():
        pytest.skip("torchft_lighthouse is not installed")
    proc = subprocess.Popen(
        [executable, *command[1:]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:

        def bound() -> set[str]:
            assert proc.poll() is None, "the lighthouse exited"
            return listening(proc.pid)

        addresses = eventually(bound, "the lighthouse listening")
        assert addresses <= {"127.0.0.1", "::1"}, addresses
        for member in members:
            for value in fill_ports(member, ports).env.values():
                assert "localhost" not in value and "[::]" not in value
    finally:
        proc.terminate()
        proc.wait(within(PROMPT))


def test_port_placeholders_are_probed_on_loopback() -> None:
    from pytest_recoverygate.orchestrators.local.members import MemberSpec, allocate_ports

    ports = allocate_ports([MemberSpec("a", ("x", "{port:one}", "{port:two}"))])
    import socket

    for port in ports.values():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free on loopback, where the service binds


# ---------------------------------------------------------------------------- root's tools


@pytest.mark.skipif(os.geteuid() != 0, reason="the trusted folders are used as root only")
def test_root_runs_its_tools_from_the_trusted_folders_never_from_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "bin"
    bad.mkdir()
    marker = tmp_path / "ran"
    for tool in ("ip", "nsenter", "unshare", "mount", "hostname"):
        script = bad / tool
        script.write_text(f"#!/bin/sh\necho {tool} >> {marker}\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bad}{os.pathsep}{os.environ.get('PATH', '')}")
    assert shutil.which("ip") == str(bad / "ip")  # the plant is first on PATH
    for tool in ("ip", "nsenter", "unshare", "mount", "hostname"):
        path = netns.tool_path(tool)
        if path is None:
            pytest.skip(f"{tool} is not installed in the trusted folders")
        assert os.path.dirname(path) in netns.TRUSTED_TOOL_DIRS
    node = netns.NodeNet(0, "rgtest-n0", 0.0, "10.77.0.1", "node0", "n0")
    wrapped = netns.node_command(node, tmp_path / "hosts", ["true"])
    assert str(bad) not in " ".join(wrapped)
    for tool in ("nsenter", "unshare", "hostname", "mount"):
        assert netns.tool_path(tool) in wrapped
    assert "--version" not in netns._ip("-V")  # ran the real ip (a plant prints nothing)
    assert netns._ip("-V").strip()
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_writable_or_foreign_tool_is_not_trusted(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert netns.is_trusted_tool(str(tool))
    tool.chmod(0o775)  # its group may write it
    assert not netns.is_trusted_tool(str(tool))
    tool.chmod(0o757)  # anyone may write it
    assert not netns.is_trusted_tool(str(tool))
    tool.chmod(0o755)
    os.chown(tool, 65534, 65534)  # nobody's
    assert not netns.is_trusted_tool(str(tool))
    assert not netns.is_trusted_tool(str(tmp_path))  # a folder
    assert not netns.is_trusted_tool(str(tmp_path / "missing"))
    assert netns.tool_path("definitely-not-a-tool-rg", root=True) is None
    assert netns.tool_path("sh", root=False) == shutil.which("sh")
