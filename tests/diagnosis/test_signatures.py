"""The known failure signatures, each against output captured from the real failure.

We test these aspects:

- every sample in ``data/`` (see its README for how each was captured) is diagnosed with
  exactly its own signature and no other: the table is specific, not only sensitive;
- each signature's guards: no diagnosis where the fix is already in place, where the
  pattern cannot be the cause (a timeout someone chose, a folder that existed because a
  checkpoint was saved), or where the drill passed on the first restart;
- the table and docs/troubleshooting.md agree: every signature has its section (the
  anchor the diagnosis links to) and at least one real sample;
- through the CLI in a subprocess (a local drill of ``replay_job.py``, a launcher without
  torch that replays a sample): the verdict block shows the diagnosis, its link and the
  failing worker's last lines; ``--report-dir`` keeps the job's output per worker and
  ``report.json`` names the files and carries the diagnoses.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_recoverygate.engine.machine import FailureReason, Verdict
from pytest_recoverygate.links import docs_link
from pytest_recoverygate.report.diagnosis import DOCS_PAGE, SIGNATURES, Clues, diagnose
from tests.patience import CLUSTER, within

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
ROOT = HERE.parents[1]
DOCS = ROOT / "docs" / "troubleshooting.md"
REPLAY = HERE / "replay_job.py"


def sample(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def failed_after_kill(output: str, **changes: object) -> Clues:
    """A drill that killed a worker and then FAILed (never came back)."""
    fields: dict[str, object] = {
        "output": output,
        "verdict": Verdict.FAIL,
        "killed": True,
        "restarts": 3,
        "reasons": (FailureReason.NEVER_CAME_BACK,),
        "checkpoints_before_kill": 100,
        "expected_resume_step": 100,
    }
    fields.update(changes)
    return Clues(**fields)  # type: ignore[arg-type]


def error_before_kill(output: str) -> Clues:
    """A drill that ended in ERROR before the kill, no checkpoint seen (a first start)."""
    return Clues(output=output, verdict=Verdict.ERROR)


def from_report(doc: dict[str, object], output: str) -> Clues:
    """The clues of a real drill, from its report.json."""
    checks = doc["checks"]
    assert isinstance(checks, list)
    reasons = tuple(FailureReason[c["reason"]] for c in checks if c["reason"])
    config = yaml.safe_load((ROOT / "examples/local/recovery-test-node-local.yaml").read_text())
    return Clues(
        output=output,
        verdict=Verdict(doc["verdict"]),
        reasons=reasons,
        killed=True,
        restarts=doc["restarts"],  # type: ignore[arg-type]
        resume_step=doc["resumeStep"],  # type: ignore[arg-type]
        expected_resume_step=doc["expectedResumeStep"],  # type: ignore[arg-type]
        checkpoints_before_kill=doc["triggerCheckpoint"],  # type: ignore[arg-type]
        env=config["workload"]["env"],
        command=tuple(config["workload"]["command"]),
    )


NODE_LOCAL = json.loads((DATA / "checkpoints-not-shared-report.json").read_text())

CASES = {
    "torchrun-shared-tcp-store.log": (
        failed_after_kill(sample("torchrun-shared-tcp-store.log")),
        {"torchrun-shared-tcp-store"},
    ),
    "collective-timeout-default.log": (
        failed_after_kill(sample("collective-timeout-default.log")),
        {"collective-timeout-default"},
    ),
    "collective-timeout-5s.log": (failed_after_kill(sample("collective-timeout-5s.log")), set()),
    "torch-load-truncated-resume.log": (
        failed_after_kill(sample("torch-load-truncated-resume.log")),
        {"torch-load-truncated"},
    ),
    "torch-load-zip-half.log": (
        failed_after_kill(sample("torch-load-zip-half.log")),
        {"torch-load-truncated"},
    ),
    "torch-load-zip-large-half.log": (
        failed_after_kill(sample("torch-load-zip-large-half.log")),
        {"torch-load-truncated"},
    ),
    "torch-load-zip-empty.log": (
        failed_after_kill(sample("torch-load-zip-empty.log")),
        {"torch-load-truncated"},
    ),
    "torch-load-legacy-half.log": (
        failed_after_kill(sample("torch-load-legacy-half.log")),
        {"torch-load-truncated"},
    ),
    "torch-load-legacy-empty.log": (
        failed_after_kill(sample("torch-load-legacy-empty.log")),
        {"torch-load-truncated"},
    ),
    "checkpoints-not-shared-report.json": (
        from_report(NODE_LOCAL, sample("checkpoints-not-shared.log")),
        {"checkpoints-not-shared"},
    ),
    "missing-checkpoint-dir-listdir.log": (
        error_before_kill(sample("missing-checkpoint-dir-listdir.log")),
        {"missing-checkpoint-dir"},
    ),
    "missing-checkpoint-dir-save.log": (
        error_before_kill(sample("missing-checkpoint-dir-save.log")),
        {"missing-checkpoint-dir"},
    ),
    "missing-checkpoint-file-load.log": (
        error_before_kill(sample("missing-checkpoint-file-load.log")),
        {"missing-checkpoint-dir"},
    ),
    "missing-python-package.log": (
        error_before_kill(sample("missing-python-package.log")),
        {"missing-python-package"},
    ),
    "ray-report-without-step.log": (
        error_before_kill(sample("ray-report-without-step.log")),
        {"reporter-without-step"},
    ),
}


def ids(clues: Clues) -> set[str]:
    return {d.signature for d in diagnose(clues)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_real_sample_gets_exactly_its_own_diagnosis(name: str) -> None:
    clues, expected = CASES[name]
    assert ids(clues) == expected


def test_every_sample_file_is_a_case_and_every_signature_has_a_sample() -> None:
    files = {p.name for p in DATA.iterdir() if p.is_file() and p.name != "README.md"}
    assert files - {"checkpoints-not-shared.log"} == set(CASES)
    covered = set().union(*(expected for _, expected in CASES.values()))
    assert covered == {s.id for s in SIGNATURES}
    readme = (DATA / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in files), "every sample says how it was made"


def test_every_signature_has_its_section_in_the_troubleshooting_page() -> None:
    headings = re.findall(r"^## `([a-z0-9-]+)`$", DOCS.read_text(), re.M)
    assert headings == [s.id for s in SIGNATURES]
    assert DOCS_PAGE == "troubleshooting.md"


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_diagnosis_is_one_paragraph_with_a_fix_its_evidence_and_its_link(name: str) -> None:
    for diagnosis in diagnose(CASES[name][0]):
        assert "\n" not in diagnosis.text
        assert "Fix" in diagnosis.text
        assert diagnosis.evidence and "\n" not in diagnosis.evidence
        assert diagnosis.docs == docs_link(DOCS_PAGE, diagnosis.signature)
        assert set(diagnosis.as_dict()) == {"signature", "title", "diagnosis", "evidence", "docs"}


# ------------------------------------------------------------------- the guards


def test_a_truncated_load_is_recognised_in_a_rank_prefixed_log_as_torchrun_prints_it() -> None:
    for name in ("torch-load-zip-large-half.log", "torch-load-zip-half.log"):
        prefixed = "".join(f"[rank0]: {line}\n" for line in sample(name).splitlines())
        assert ids(failed_after_kill(prefixed)) == {"torch-load-truncated"}, name


def test_an_einval_outside_torch_load_is_no_truncated_checkpoint() -> None:
    output = sample("torch-load-zip-large-half.log").replace(", in load\n", ", in read_all\n")
    assert "torch-load-truncated" not in ids(failed_after_kill(output))
    (diagnosis,) = diagnose(failed_after_kill(sample("torch-load-zip-large-half.log")))
    assert "Errno 22" in diagnosis.evidence and "PyTorchFileReader" in diagnosis.evidence


def test_the_tcp_store_diagnosis_names_both_fixes() -> None:
    (diagnosis,) = diagnose(CASES["torchrun-shared-tcp-store.log"][0])
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in diagnosis.text
    assert "PrefixStore" in diagnosis.text
    assert "connectFullMesh failed" in diagnosis.evidence


def test_the_tcp_store_is_not_blamed_when_its_fix_is_set() -> None:
    clues = failed_after_kill(
        sample("torchrun-shared-tcp-store.log"), env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    )
    assert "torchrun-shared-tcp-store" not in ids(clues)


def test_the_tcp_store_is_not_blamed_for_output_before_any_kill() -> None:
    clues = failed_after_kill(sample("torchrun-shared-tcp-store.log"), killed=False)
    assert "torchrun-shared-tcp-store" not in ids(clues)


def test_a_pass_that_needed_several_restarts_is_explained_one_that_needed_one_is_not() -> None:
    output = sample("torchrun-shared-tcp-store.log")
    slow = failed_after_kill(output, verdict=Verdict.PASS, reasons=(), restarts=2)
    (diagnosis,) = diagnose(slow)
    assert diagnosis.text.startswith("The job recovered, but only after 2 restarts")
    assert diagnose(failed_after_kill(output, verdict=Verdict.PASS, reasons=(), restarts=1)) == ()


def test_the_collective_timeout_diagnosis_says_how_long_and_how_to_shorten_it() -> None:
    (diagnosis,) = diagnose(CASES["collective-timeout-default.log"][0])
    assert "waited 30 minutes" in diagnosis.text
    assert "timeout=datetime.timedelta(seconds=N)" in diagnosis.text
    assert "Timed out waiting 1800000ms" in diagnosis.evidence


def test_a_folder_that_held_a_checkpoint_was_no_missing_folder() -> None:
    clues = failed_after_kill(sample("missing-checkpoint-dir-listdir.log"))
    assert "missing-checkpoint-dir" not in ids(clues)


def test_a_missing_file_that_is_no_checkpoint_folder_is_not_diagnosed() -> None:
    output = (
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "train.py", line 3, in <module>\n'
        "[rank0]:     open('config/tokenizer.json')\n"
        "[rank0]: FileNotFoundError: [Errno 2] No such file or directory: "
        "'config/tokenizer.json'\n"
    )
    assert "missing-checkpoint-dir" not in ids(error_before_kill(output))


def test_the_node_local_diagnosis_quotes_the_path_from_the_command() -> None:
    (diagnosis,) = diagnose(CASES["checkpoints-not-shared-report.json"][0])
    assert "checkpoint of step 100 was completed before the kill" in diagnosis.evidence
    assert "{tmpdir}" in diagnosis.evidence
    assert "PersistentVolumeClaim" in diagnosis.text


def test_a_restart_from_scratch_without_any_checkpoint_is_not_blamed_on_storage() -> None:
    clues = Clues(
        verdict=Verdict.FAIL,
        reasons=(FailureReason.RESTARTED_FROM_SCRATCH,),
        killed=True,
        resume_step=0,
        expected_resume_step=None,
    )
    assert ids(clues) == set()


def test_nothing_is_diagnosed_without_a_failure() -> None:
    for name, (clues, _) in CASES.items():
        passed = Clues(output=clues.output, verdict=Verdict.PASS, killed=clues.killed, restarts=1)
        assert diagnose(passed) == (), name


# ------------------------------------------------------------------- through the CLI


def local_drill(tmp_path: Path, *replay_args: str) -> Path:
    path = tmp_path / "replay-drill.yaml"
    reporter_root = str(ROOT / "reporter")
    path.write_text(
        yaml.safe_dump(
            {
                "name": "replay",
                "workload": {
                    "orchestrator": "local",
                    "command": [sys.executable, str(REPLAY), "--nproc", "2", *replay_args],
                    "env": {"PYTHONPATH": reporter_root},
                },
                "injectFailure": {"afterCheckpoint": "step-20", "targetRank": 1},
                "expectations": {"maxRecoveryTime": "5s"},
                "safety": {"requireConfirm": False},
                "timeouts": {"discovery": "30s", "checkpoint": "30s", "recovery": "10s"},
            }
        )
    )
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_recoverygate.cli", *args],
        capture_output=True,
        text=True,
        timeout=within(CLUSTER),
        check=False,
    )


@pytest.mark.slow  # a CLI process running a local drill on real processes (3-7 s)
@pytest.mark.local
def test_the_cli_shows_the_diagnosis_and_the_failing_workers_last_lines(tmp_path: Path) -> None:
    config = local_drill(tmp_path, "--replay", str(DATA / "torch-load-truncated-resume.log"))
    out = tmp_path / "report"
    proc = run_cli("run", "-f", str(config), "-q", "--report-dir", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = proc.stdout
    assert "RecoveryGate verdict: FAIL" in text
    assert "diagnosis: torch.load on a truncated checkpoint" in text
    assert f"more: {docs_link(DOCS_PAGE, 'torch-load-truncated')}" in text
    # the failing worker's own lines, ending at its error, with where the rest is
    tail = re.search(
        r"last (\d+) lines of (rank \d) \(whole output: (\S+)\):\n((?:    \| .*\n)+)", text
    )
    assert tail is not None, text
    assert 10 <= int(tail.group(1)) <= 20
    assert "Traceback (most recent call last)" in tail.group(4)
    assert "PytorchStreamReader failed reading zip archive" in tail.group(4).splitlines()[-1]
    assert Path(tail.group(3)).is_file()
    # the report folder keeps the job's output per worker and names the files
    doc = json.loads((out / "report.json").read_text())
    assert doc["jobOutput"]["torchrun"] == "output/torchrun.log"
    assert doc["jobOutput"][tail.group(2)] == f"output/{tail.group(2).replace(' ', '-')}.log"
    assert doc["failingWorker"] == tail.group(2)
    for relative in doc["jobOutput"].values():
        assert (out / relative).is_file()
    merged = (out / "output" / "torchrun.log").read_text()
    assert "[default0]:RECOVERYGATE/v1" in merged and "ChildFailedError" in merged
    assert [d["signature"] for d in doc["diagnoses"]] == ["torch-load-truncated"]
    # the root cause is whole in the report
    assert (
        "if the checkpoint was not saved properly, was transferred incorrectly, or the "
        "file was modified after saving." in doc["summary"]
    )
    summary = (out / "summary.md").read_text()
    assert "**Diagnosis: torch.load on a truncated checkpoint**" in summary
    assert f"**Last lines of {tail.group(2)}** (whole output: `output/" in summary


@pytest.mark.slow  # a CLI process running a local drill on real processes (2-3 s)
@pytest.mark.local
def test_a_job_failing_on_its_first_start_gets_the_missing_folder_diagnosis(
    tmp_path: Path,
) -> None:
    config = local_drill(
        tmp_path, "--at-start", "--replay", str(DATA / "missing-checkpoint-dir-listdir.log")
    )
    proc = run_cli("run", "-f", str(config), "-q")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "diagnosis: no checkpoint folder or file on the first start" in proc.stdout
    assert "os.makedirs(folder, exist_ok=True)" in proc.stdout
    assert "FileNotFoundError: [Errno 2] No such file or directory" in proc.stdout
    assert "--report-dir keeps the whole output" in proc.stdout


def scratch_after_checkpoints(output: str, command: tuple[str, ...]) -> Clues:
    """A FAIL restarted from scratch although checkpoint 100 was completed before the kill."""
    return Clues(
        output=output,
        verdict=Verdict.FAIL,
        reasons=(FailureReason.RESTARTED_FROM_SCRATCH,),
        killed=True,
        resume_step=0,
        expected_resume_step=100,
        checkpoints_before_kill=100,
        command=command,
    )


def test_a_log_folder_in_tmp_is_no_checkpoint_storage_and_a_from_scratch_line_is_quoted() -> None:
    # nanoGPT run as its README says, under torchrun with --log-dir in /tmp; its checkpoints
    # are in a shared out_dir, and it prints this line on every start (init_from='scratch').
    command = (
        "torchrun",
        "--standalone",
        "--nproc-per-node=2",
        "--log-dir=/tmp/torchrun-logs",
        "train.py",
        "--out_dir=/shared/out",
    )
    output = "[default0]:Initializing a new model from scratch\n[default0]:iter 0: loss 10.9\n"
    (diagnosis,) = diagnose(scratch_after_checkpoints(output, command))
    assert diagnosis.signature == "checkpoints-not-shared"
    assert "/tmp" not in diagnosis.evidence
    assert "the job printed: [default0]:Initializing a new model from scratch" in (
        diagnosis.evidence
    )
    assert "init_from='scratch'" in diagnosis.text
    assert "PersistentVolumeClaim" not in diagnosis.text  # the storage is not blamed


def test_a_checkpoint_folder_in_tmp_is_still_named_as_node_local_storage() -> None:
    for command in (
        ("torchrun", "--log-dir", "/tmp/logs", "train.py", "--ckpt-dir", "/tmp/ckpt"),
        ("torchrun", "train.py", "--out_dir=/tmp/run1"),
        ("python", "train.py", "/tmp/checkpoints"),
    ):
        (diagnosis,) = diagnose(scratch_after_checkpoints("", command))
        assert "the command names a per-process or node-local path: /tmp/" in diagnosis.evidence
        assert "/tmp/logs" not in diagnosis.evidence
        assert "PersistentVolumeClaim" in diagnosis.text


def test_without_any_path_or_line_both_causes_are_named_and_neither_claimed() -> None:
    (diagnosis,) = diagnose(scratch_after_checkpoints("", ("torchrun", "train.py")))
    assert diagnosis.evidence == (
        "resumed from step 0 although the checkpoint of step 100 was completed before the kill"
    )
    assert "Either its resume never loaded" in diagnosis.text


def test_the_no_step_diagnosis_shows_the_workers_own_warning() -> None:
    (diagnosis,) = diagnose(CASES["ray-report-without-step.log"][0])
    assert "recoverygate: ray: report() without a step" in diagnosis.evidence
    assert "(RayTrainWorker pid=" in diagnosis.evidence
    assert "step=N" in diagnosis.text
