"""recovery-test.yaml loading and strict validation.

We test these aspects:

- the happy path of every backend, with defaults filled in (name from the file's stem,
  the recovery deadline derived from ``maxRecoveryTime`` when ``timeouts.recovery`` is
  left out), relative paths resolved
  against the config file's folder, a string ``command`` split like a shell would;
- every error path: each case of the table :data:`PROBLEMS` (and each test after it)
  asserts that the message names the file, the line, the key path and the offending
  value (``FILE:LINE: key.path: problem — got VALUE; …``);
- that one message lists every problem, one per line, in file order;
- that secrets (``env`` values) never show up in messages or in ``dump_effective``.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, get_args

import pytest
import yaml
from pydantic import BaseModel, ValidationError, create_model

from pytest_recoverygate.config.loading import (
    dump_effective,
    load_config,
    parse_config,
    schema_keys,
)
from pytest_recoverygate.config.schema import (
    DrillConfig,
    Expectations,
    InjectFailure,
    WorkloadBase,
    spec_from_config,
)
from pytest_recoverygate.config.yamlfile import YamlLoader
from pytest_recoverygate.durations import format_duration, parse_duration
from pytest_recoverygate.engine.spec import ReplaySpec
from pytest_recoverygate.errors import ConfigError
from pytest_recoverygate.orchestrators.fake import FakeWorkload
from pytest_recoverygate.orchestrators.kubernetes import KubernetesWorkload
from pytest_recoverygate.orchestrators.local import LocalWorkload
from pytest_recoverygate.orchestrators.ray import RayWorkload
from pytest_recoverygate.orchestrators.slurm import SlurmWorkload
from pytest_recoverygate.registry import all_backends

REST = """\
injectFailure:
  afterCheckpoint: step-100
expectations:
  maxRecoveryTime: 5m
"""

FAKE = "workload:\n  orchestrator: fake\n" + REST

LINE = re.compile(
    r"^(?P<file>[^\n]+?):(?P<line>\d+): (?P<path>\S+): (?P<problem>.+?) — got (?P<got>.+)$"
)


def write(folder: Path, text: str, name: str = "drill.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


def problem_line(message: str, file: Path | str, line: int, key: str) -> str:
    """The one message line for ``key`` at ``line`` (fails the test if it is not there)."""
    prefix = f"{file}:{line}: {key}: "
    found = [text for text in message.splitlines() if text.startswith(prefix)]
    assert found, f"no line starting with {prefix!r} in:\n{message}"
    return found[0]


W = TypeVar("W", bound=WorkloadBase)


def workload_of(path: Path, model: type[W]) -> W:
    """The ``workload`` section of the config at ``path``, as the backend's model."""
    workload = load_config(path).workload
    assert isinstance(workload, model), workload
    return workload


def assert_problem(message: str, file: Path, line: int, key: str, got: str) -> str:
    text = problem_line(message, file, line, key)
    assert f"— got {got}" in text, text
    return text


# ----------------------------------------------------------------- happy paths


def test_a_minimal_fake_drill_loads_with_every_default(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FAKE, "my-drill.yaml"))

    assert config.name == "my-drill"
    assert config.source_path == tmp_path / "my-drill.yaml"
    assert isinstance(config.workload, FakeWorkload)
    assert config.workload.reporting_rank == 0
    fake = config.workload.fake
    assert (fake.workers, fake.steps_per_second, fake.checkpoint_every) == (2, 50.0, 20)
    assert (fake.restart_delay, fake.resume, fake.startup_delay) == (1.0, "latest", 0.0)
    assert config.inject_failure == InjectFailure(
        type="KillWorker", after_checkpoint=100, target_rank=None
    )
    assert config.expectations.resume_from_checkpoint == "latest"
    assert config.expectations.max_recovery_time == 300.0
    assert config.expectations.max_lost_steps is None
    assert config.safety.require_confirm is True
    assert config.safety.dry_run is False
    assert config.timeouts.discovery == 300.0
    assert config.timeouts.checkpoint == 3600.0


def test_the_recovery_timeout_defaults_to_the_slo_plus_the_grace(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FAKE.replace("5m", "90s")))
    assert config.timeouts.recovery is None  # left out: derived in one place, the engine's
    assert spec_from_config(config).effective_recovery_timeout == 90 + 30
    graced = load_config(
        write(tmp_path, FAKE.replace("5m", "90s") + "timeouts:\n  recoveryGrace: 5s\n")
    )
    assert spec_from_config(graced).effective_recovery_timeout == 95


def test_an_explicit_recovery_timeout_is_kept(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FAKE + "timeouts: {recovery: 1h, discovery: 30s}\n"))
    assert config.timeouts.recovery == 3600.0
    assert spec_from_config(config).effective_recovery_timeout == 3600.0
    assert config.timeouts.discovery == 30.0


def test_a_full_fake_drill_reads_every_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        name: full
        workload:
          orchestrator: fake
          reportingRank: 2
          fake: {workers: 4, stepsPerSecond: 12.5, checkpointEvery: 7, restartDelay: 250ms,
                 resume: older, startupDelay: 1.5s}
        injectFailure: {type: KillWorker, afterCheckpoint: next, targetRank: 3}
        expectations: {resumeFromCheckpoint: step-1000, maxRecoveryTime: 1h30m, maxLostSteps: 0,
                       maxStall: 2m}
        safety: {requireConfirm: false, dryRun: true}
        """,
    )
    config = load_config(path)
    assert config.name == "full"
    assert isinstance(config.workload, FakeWorkload)
    assert config.workload.reporting_rank == 2
    assert config.workload.fake.model_dump() == {
        "workers": 4,
        "steps_per_second": 12.5,
        "checkpoint_every": 7,
        "restart_delay": 0.25,
        "resume": "older",
        "startup_delay": 1.5,
        "save_time": 0.0,
        "atomic_saves": True,
        "saves_on_sigterm": False,
        "hang_timeout": 1800.0,
        "max_restarts": None,
        "elastic": True,
        "replay": "none",
        "replay_noise": 1e-6,
        "replay_spikes": 2,
        "replicas": None,
        "min_replicas": 1,
        "heal": "peer",
        "heartbeat_timeout": 2.0,
    }
    assert config.inject_failure.after_checkpoint == "next"
    assert config.inject_failure.target_rank == 3
    assert config.expectations.resume_from_checkpoint == 1000
    assert config.expectations.max_recovery_time == 5400.0
    assert config.expectations.max_lost_steps == 0
    assert config.expectations.max_stall == 120.0
    assert spec_from_config(config).max_stall == 120.0
    assert config.safety.dry_run is True
    assert config.safety.require_confirm is False


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        ("", ReplaySpec("report")),
        ("  replay: report\n", ReplaySpec("report")),
        ("  replay: exact\n", ReplaySpec("exact")),
        ("  replay: {rtol: 1e-3}\n", ReplaySpec("tolerance", rtol=1e-3)),
        (
            "  replay:\n    rtol: 0.05\n    atol: 1e-6\n    maxDivergentSteps: 2\n",
            ReplaySpec("tolerance", rtol=0.05, atol=1e-6, max_divergent_steps=2),
        ),
    ],
)
def test_replay_takes_a_mode_or_a_tolerance(tmp_path: Path, value: str, mode: ReplaySpec) -> None:
    text = FAKE.replace("  maxRecoveryTime: 5m\n", "  maxRecoveryTime: 5m\n" + value)
    spec = spec_from_config(load_config(write(tmp_path, text)))
    assert spec.replay == mode
    assert spec.replay_steps == 5


@pytest.mark.parametrize(
    ("value", "line", "key", "problem"),
    [
        ("  replay: fuzzy\n", 7, "expectations.replay", "must be report, exact or a tolerance"),
        ("  replay: 1e-3\n", 7, "expectations.replay", "must be report, exact or a tolerance"),
        ("  replay:\n    rtol: -1\n", 8, "expectations.replay.rtol", "is too small"),
        ("  replay:\n    atol: .inf\n", 8, "expectations.replay.atol", "finite"),
        ("  replay:\n    rtl: 1\n", 8, "expectations.replay.rtl", "unknown key"),
        ("  replay:\n    maxDivergentSteps: 1.5\n", 8, "expectations.replay.maxDivergentSteps", ""),
        ("  replaySteps: -1\n", 7, "expectations.replaySteps", "is too small"),
    ],
)
def test_a_bad_replay_is_refused_at_its_line_and_key(
    tmp_path: Path, value: str, line: int, key: str, problem: str
) -> None:
    text = FAKE.replace("  maxRecoveryTime: 5m\n", "  maxRecoveryTime: 5m\n" + value)
    path = write(tmp_path, text)
    message = problem_line(error_of(path), path, line, key)
    assert problem in message


def test_replay_is_refused_with_live_recovery(tmp_path: Path) -> None:
    text = """\
        workload:
          orchestrator: fake
          fake: {replicas: 2}
        injectFailure:
          afterStep: 50
        expectations:
          recovery: live
          replay: exact
        """
    path = write(tmp_path, text)
    message = problem_line(error_of(path), path, 8, "expectations.replay")
    assert "recovery: live" in message


def test_a_local_drill_resolves_workdir_against_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "configs" / "job").mkdir(parents=True)
    path = write(
        tmp_path / "configs",
        textwrap.dedent(
            """\
        workload:
          orchestrator: local
          command: ["torchrun", "--nproc-per-node=2", "train.py"]
          workdir: job
          env: {NCCL_DEBUG: INFO, SEED: "1"}
        """
        )
        + REST,
    )
    monkeypatch.chdir(tmp_path)  # the current folder must not matter
    config = load_config(path)
    assert isinstance(config.workload, LocalWorkload)
    assert config.workload.command == ["torchrun", "--nproc-per-node=2", "train.py"]
    assert config.workload.workdir == (tmp_path / "configs" / "job").resolve()
    assert config.workload.env == {"NCCL_DEBUG": "INFO", "SEED": "1"}
    assert config.workload.attach_pid is None


def test_a_local_workdir_defaults_to_the_config_folder(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, "workload: {orchestrator: local, command: python t.py}\n" + REST)
    )
    assert isinstance(config.workload, LocalWorkload)
    assert config.workload.workdir == tmp_path.resolve()


def test_a_command_string_is_split_like_a_shell_would(tmp_path: Path) -> None:
    text = (
        "workload:\n  orchestrator: local\n"
        '  command: torchrun --nproc-per-node=2 "my train.py" --lr=1e-4\n'
    )
    config = load_config(write(tmp_path, text + REST))
    assert isinstance(config.workload, LocalWorkload)
    assert config.workload.command == [
        "torchrun",
        "--nproc-per-node=2",
        "my train.py",
        "--lr=1e-4",
    ]


def test_a_local_drill_can_attach_to_a_running_agent(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, "workload: {orchestrator: local, attachPid: 4242}\n" + REST)
    )
    assert isinstance(config.workload, LocalWorkload)
    assert config.workload.attach_pid == 4242
    assert config.workload.command is None


def test_a_kubernetes_drill_loads_and_expands_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = write(
        tmp_path,
        textwrap.dedent(
            """\
        workload:
          orchestrator: kubernetes
          selector: "  training-run=llama  "
          namespace: ml-team
          context: my-ctx
          kubeconfig: ~/.kube/config
          container: pytorch
          reportingRank: 0
        """
        )
        + REST,
    )
    config = load_config(path)
    assert isinstance(config.workload, KubernetesWorkload)
    assert config.workload.selector == "training-run=llama"
    assert config.workload.namespace == "ml-team"
    assert config.workload.context == "my-ctx"
    assert config.workload.kubeconfig == (tmp_path / "home" / ".kube" / "config").resolve()
    assert config.workload.container == "pytorch"


def test_a_relative_kubeconfig_is_relative_to_the_config_folder(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "workload: {orchestrator: kubernetes, selector: a=b, kubeconfig: kube/cfg}\n" + REST,
    )
    config = load_config(path)
    assert isinstance(config.workload, KubernetesWorkload)
    assert config.workload.kubeconfig == (tmp_path / "kube" / "cfg").resolve()
    assert config.workload.namespace is None


def test_a_slurm_drill_by_job_id_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        workload:
          orchestrator: slurm
          jobId: 12345
          partition: gpu
          output: logs/slurm-%j.out
          pollInterval: 250ms
        injectFailure: {type: Requeue, afterCheckpoint: step-0}
        expectations: {maxRecoveryTime: 10m}
        """,
    )
    config = load_config(path)
    assert isinstance(config.workload, SlurmWorkload)
    assert config.workload.job_id == 12345
    assert config.workload.job_name is None
    assert config.workload.output == (tmp_path / "logs" / "slurm-%j.out").resolve()
    assert config.workload.poll_interval == 0.25
    assert config.inject_failure.type == "Requeue"
    assert config.inject_failure.after_checkpoint == 0


def test_a_slurm_drill_by_job_name_and_user_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "workload: {orchestrator: slurm, jobName: llama-ft, user: alice}\n"
        "injectFailure: {type: KillStep, afterCheckpoint: next}\n"
        "expectations: {maxRecoveryTime: 5m}\n",
    )
    config = load_config(path)
    assert isinstance(config.workload, SlurmWorkload)
    assert (config.workload.job_name, config.workload.user) == ("llama-ft", "alice")
    assert config.workload.poll_interval == 1.0
    assert config.inject_failure.type == "KillStep"


def test_load_config_accepts_a_string_path(tmp_path: Path) -> None:
    path = write(tmp_path, FAKE)
    assert load_config(str(path)).name == "drill"


def test_parse_config_reads_text_for_a_file_that_does_not_exist(tmp_path: Path) -> None:
    config = parse_config(FAKE, tmp_path / "inline.yaml")
    assert config.name == "inline"
    assert config.source_path == tmp_path / "inline.yaml"


def test_the_shipped_fake_examples_are_valid() -> None:
    examples = sorted((Path(__file__).parent.parent / "examples" / "fake").glob("*.yaml"))
    assert examples, "examples/fake has no configs"
    for example in examples:
        assert isinstance(load_config(example).workload, FakeWorkload)


def test_models_can_be_built_in_python_with_seconds_and_step_numbers() -> None:
    config = DrillConfig(
        workload=FakeWorkload(orchestrator="fake"),
        inject_failure=InjectFailure(after_checkpoint=40),
        expectations=Expectations(max_recovery_time=3, resume_from_checkpoint=40),
    )
    assert config.expectations.max_recovery_time == 3.0
    assert spec_from_config(config).effective_recovery_timeout == 33.0  # SLO + recoveryGrace
    assert config.inject_failure.after_checkpoint == 40


# ----------------------------------------------------------------- dump_effective


def test_dump_effective_uses_yaml_names_and_the_yaml_language(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FAKE))
    dumped = dump_effective(config)
    assert dumped["injectFailure"] == {
        "type": "KillWorker",
        "afterCheckpoint": "step-100",
        "targetRank": 1,  # the fault's defaults, filled in (gracePeriod: Preempt only)
        "delay": "0s",
        "count": 1,
    }
    assert dumped["expectations"]["maxRecoveryTime"] == "5m"
    assert dumped["timeouts"] == {
        "discovery": "5m",
        "checkpoint": "1h",
        "recovery": "5m30s",
        "recoveryGrace": "30s",
    }
    assert dumped["workload"]["fake"]["restartDelay"] == "1s"
    assert "sourcePath" not in dumped


def test_dump_effective_loads_back_to_the_same_config(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FAKE.replace("step-100", "next")))
    dumped = dump_effective(config)
    again = parse_config(yaml.safe_dump(dumped), tmp_path / "drill.yaml")
    # the same drill, with the derived recovery deadline and the fault's defaults written out
    derived = spec_from_config(config).effective_recovery_timeout
    assert again.timeouts.recovery == derived
    assert again == config.model_copy(
        update={
            "timeouts": config.timeouts.model_copy(update={"recovery": derived}),
            "inject_failure": config.inject_failure.model_copy(
                update={"target_rank": 1, "delay": "0s"}
            ),
        }
    )
    assert dump_effective(again) == dumped


def test_dump_effective_never_shows_env_values(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "workload:\n  orchestrator: local\n  command: [python]\n"
        "  env: {HF_TOKEN: hf_supersecret, WANDB_API_KEY: k-123}\n" + REST,
    )
    dumped = dump_effective(load_config(path))
    assert dumped["workload"]["env"] == {"HF_TOKEN": "<redacted>", "WANDB_API_KEY": "<redacted>"}
    assert "supersecret" not in repr(dumped)
    assert "k-123" not in repr(dumped)


# ------------------------------------------------------------- every refusal, one line each


@dataclass(frozen=True)
class Case:
    """A config that is refused, and the one message line that must say so.

    The line is ``FILE:LINE: KEY: …`` and says ``— got GOT`` (unless GOT is None) and
    every text in ``says``. ``text`` is written as the config file (``bytes`` as they are).
    """

    name: str
    text: str | bytes
    line: int
    key: str
    got: str | None
    says: tuple[str, ...] = ()


# fmt: off
PROBLEMS = [  # name, the file's text; the line, key and value named, what it says
    Case("refuses_an_empty_file", "",
         1, "(file)", "no YAML content"),
    Case("refuses_a_file_of_only_comments", "# nothing yet\n\n# still nothing\n",
         1, "(file)", None, ("is empty",)),
    Case("refuses_a_top_level_list", "\n- workload: {}\n- two\n",
         2, "(top level)", "a list of 2 items", ("must be a mapping",)),
    Case("refuses_a_top_level_scalar", "just words\n",
         1, "(top level)", "'just words'"),
    Case("reports_a_yaml_syntax_error_with_its_line",
         "workload:\n  orchestrator: fake\n  selector: a: b\n",
         3, "(YAML syntax)", "'  selector: a: b'", ("mapping values are not allowed",)),
    Case("refuses_two_documents_in_one_file", FAKE + "---\n" + FAKE,
         7, "(YAML syntax)", "'---'", ("one drill per file",)),
    Case("refuses_aliases", "name: &n drill\nworkload: {orchestrator: fake}\n" + REST,
         1, "(YAML)", "'name: &n drill'", ("anchors (&n) are not allowed",)),
    Case("refuses_an_alias_at_its_line", FAKE + "timeouts: {discovery: *d}\n",
         7, "(YAML)", None, ("aliases (*d) are not allowed",)),
    Case("refuses_nesting_deeper_than_any_config", "workload: " + "[" * 100 + "]" * 100 + "\n",
         1, "(YAML)", None, ("nesting is deeper than",)),
    Case("refuses_a_duplicate_key_naming_both_lines",
         FAKE + "expectations: {maxRecoveryTime: 1m}\n",
         7, "expectations", "expectations", ("key appears twice (first on line 5)",)),
    Case("refuses_a_complex_key", FAKE + "? [a, b]\n: 1\n",
         7, "(top level)", None, ("plain word",)),
    Case("refuses_python_tags", FAKE + 'name: !!python/object/apply:os.system ["true"]\n',
         7, "name", None, ("not supported",)),
    Case("refuses_an_unknown_scalar_tag", FAKE + "name: !secret abc\n",
         7, "name", "abc", ("YAML tag !secret is not supported",)),
    Case("refuses_a_value_its_own_tag_cannot_read", FAKE + "  maxLostSteps: !!int lots\n",
         7, "expectations.maxLostSteps", "lots", ("cannot be read",)),
    Case("refuses_an_unknown_key_and_suggests_the_right_one",
         FAKE + "safety:\n  requireConfrim: false\n",
         8, "safety.requireConfrim", "requireConfrim", ("unknown key", "allowed: requireConfirm, dryRun", "did you mean requireConfirm?")),
    Case("refuses_snake_case_keys", FAKE + "safety: {dry_run: true}\n",
         7, "safety.dry_run", "dry_run", ("did you mean dryRun?",)),
    Case("names_the_backend_an_unknown_workload_key_belongs_to",
         "workload:\n  orchestrator: local\n  command: [x]\n  jobId: 5\n" + REST,
         4, "workload.jobId", "jobId", ("jobId belongs to orchestrator: slurm",)),
    Case("refuses_a_source_path_key", FAKE + "sourcePath: /etc/passwd\n",
         7, "sourcePath", "sourcePath", ("unknown key",)),
    Case("refuses_a_missing_orchestrator_and_lists_the_allowed_ones",
         "workload:\n  selector: a=b\n" + REST,
         1, "workload.orchestrator", "nothing", ("allowed: fake, local, kubernetes, slurm",)),
    Case("refuses_an_unknown_orchestrator", "workload:\n  orchestrator: docker\n" + REST,
         2, "workload.orchestrator", "docker", ("allowed: fake, local, kubernetes, slurm",)),
    Case("suggests_the_orchestrator_spelled_in_another_case",
         "workload:\n  orchestrator: Slurm\n" + REST,
         2, "workload.orchestrator", "Slurm", ("did you mean slurm?",)),
    Case("refuses_a_workload_that_is_not_a_mapping", "workload: fake\n" + REST,
         1, "workload", "fake", ("must be a mapping",)),
    Case("refuses_a_missing_trigger_checkpoint",
         "workload: {orchestrator: fake}\ninjectFailure:\n  type: KillWorker\n"
        "expectations: {maxRecoveryTime: 5m}\n",
         2, "injectFailure.afterCheckpoint", "nothing", ("add afterCheckpoint: step-1000",)),
    Case("asks_for_step_n_instead_of_a_bare_number", FAKE.replace("step-100", "100"),
         4, "injectFailure.afterCheckpoint", "100", ("write step-100", "allowed: step-N")),
    Case("refuses_a_malformed_step_reference", FAKE + "  resumeFromCheckpoint: step-last\n",
         7, "expectations.resumeFromCheckpoint", "step-last", ("or latest",)),
    Case("refuses_a_step_number_too_large_to_be_real", FAKE.replace("step-100", "step-" + "9" * 40),
         4, "injectFailure.afterCheckpoint", "step-999"),
    Case("asks_for_a_unit_on_a_bare_number_duration", FAKE.replace("5m", "300"),
         6, "expectations.maxRecoveryTime", "300", ("write 300s",)),
    Case("refuses_a_negative_duration", FAKE + "timeouts: {discovery: -5m}\n",
         7, "timeouts.discovery", "-5m", ("cannot be negative",)),
    Case("refuses_a_negative_bare_duration", FAKE + "timeouts: {checkpoint: -5}\n",
         7, "timeouts.checkpoint", "-5", ("never negative",)),
    Case("refuses_a_zero_recovery_slo", FAKE.replace("5m", "0s"),
         6, "expectations.maxRecoveryTime", "0s", ("longer than zero",)),
    Case("refuses_a_duration_in_unknown_units", FAKE.replace("5m", "5 minutes"),
         6, "expectations.maxRecoveryTime", "5 minutes", ("like 90s, 5m, 1h30m",)),
    Case("refuses_a_duration_longer_than_any_drill", FAKE.replace("5m", "99999999h"),
         6, "expectations.maxRecoveryTime", "99999999h", ("out of range",)),
    Case("refuses_a_poll_interval_outside_its_range",
         "workload: {orchestrator: slurm, jobId: 1, pollInterval: 10ms}\n" + REST,
         1, "workload.pollInterval", "10ms", ("from 100ms to 1m",)),
    Case("refuses_a_boolean_where_a_number_belongs", FAKE + "  maxLostSteps: true\n",
         7, "expectations.maxLostSteps", "true", ("not true/false",)),
    Case("refuses_a_quoted_number", 'workload: {orchestrator: fake, fake: {workers: "4"}}\n' + REST,
         1, "workload.fake.workers", '"4"', ("remove the quotes",)),
    Case("refuses_a_fraction_where_a_whole_number_belongs",
         "workload:\n  orchestrator: fake\n  fake:\n    checkpointEvery: 2.5\n" + REST,
         4, "workload.fake.checkpointEvery", "2.5"),
    Case("refuses_a_huge_number", FAKE + "  maxLostSteps: " + "9" * 30 + "\n",
         7, "expectations.maxLostSteps", "999999", ("too large",)),
    Case("refuses_an_infinite_rate",
         "workload:\n  orchestrator: fake\n  fake: {stepsPerSecond: .inf}\n" + REST,
         3, "workload.fake.stepsPerSecond", ".inf"),
    Case("refuses_too_few_fake_workers",
         "workload:\n  orchestrator: fake\n  fake: {workers: 1}\n" + REST,
         3, "workload.fake.workers", "1", ("from 2 to 1024",)),
    Case("refuses_an_unknown_resume_mode",
         "workload:\n  orchestrator: fake\n  fake: {resume: newest}\n" + REST,
         3, "workload.fake.resume", "newest", ("latest, zero, older or never",)),
    Case("refuses_a_negative_rank", FAKE.replace("step-100", "step-100\n  targetRank: -1"),
         5, "injectFailure.targetRank", "-1"),
    Case("refuses_a_target_rank_the_fake_job_does_not_have",
         FAKE.replace("step-100", "step-100\n  targetRank: 2"),
         5, "injectFailure.targetRank", "2", ("a rank from 0 to 1",)),
    Case("refuses_a_reporting_rank_the_fake_job_does_not_have",
         "workload:\n  orchestrator: fake\n  reportingRank: 5\n" + REST,
         3, "workload.reportingRank", "5"),
    Case("refuses_a_slurm_only_failure_on_another_backend",
         FAKE.replace("step-100", "step-100\n  type: Requeue"),
         5, "injectFailure.type", "Requeue", ("needs orchestrator: slurm",)),
    Case("refuses_an_unknown_failure_type", FAKE.replace("step-100", "step-100\n  type: KillRack"),
         5, "injectFailure.type", "KillRack",
         ("KillWorker, KillStep, Requeue, KillDuringCheckpoint, Preempt, HangWorker",)),
    # issue 41: misspelt *values* get "did you mean" as misspelt keys do
    Case("suggests_the_fault_type_a_misspelt_one_meant",
         FAKE.replace("step-100", "step-100\n  type: KillWorkr"),
         5, "injectFailure.type", "KillWorkr", ("did you mean KillWorker?",)),
    Case("suggests_latest_for_a_misspelt_latest", FAKE + "  resumeFromCheckpoint: lastest\n",
         7, "expectations.resumeFromCheckpoint", "lastest", ("did you mean latest?",)),
    Case("suggests_next_for_a_misspelt_next", FAKE.replace("step-100", "nxt"),
         4, "injectFailure.afterCheckpoint", "nxt", ("did you mean next?",)),
    Case("suggests_the_delay_word_a_misspelt_one_meant",
         FAKE.replace("step-100", "step-100\n  delay: beforeNextCheckpiont"),
         5, "injectFailure.delay", "beforeNextCheckpiont", ("did you mean beforeNextCheckpoint?",)),
    Case("suggests_until_budget_exhausted", FAKE.replace("step-100", "step-100\n  count: untilBudgetExhuasted"),
         5, "injectFailure.count", "untilBudgetExhuasted", ("did you mean untilBudgetExhausted?",)),
    Case("suggests_the_replay_mode_a_misspelt_one_meant", FAKE + "  replay: exat\n",
         7, "expectations.replay", "exat", ("did you mean exact?",)),
    Case("suggests_the_preset_a_misspelt_one_meant", FAKE + "evidence: {preset: nanogtp}\n",
         7, "evidence.preset", "nanogtp", ("did you mean nanogpt?",)),
    Case("suggests_a_value_spelt_in_another_case", FAKE + "  recovery: Live\n",
         7, "expectations.recovery", "Live", ("did you mean live?",)),
    Case("refuses_a_value_far_from_every_choice_with_its_example",
         FAKE + "evidence: {preset: deepspeed}\n",
         7, "evidence.preset", "deepspeed", ("(e.g. nanogpt)",)),
    Case("refuses_a_recovery_timeout_shorter_than_the_slo", FAKE + "timeouts:\n  recovery: 1m\n",
         8, "timeouts.recovery", "1m", ("shorter than expectations.maxRecoveryTime (5m)",)),
    Case("refuses_a_text_value_where_true_or_false_belongs",
         FAKE + "safety: {requireConfirm: sure}\n",
         7, "safety.requireConfirm", "sure"),
    Case("refuses_an_empty_name", 'name: "  "\n' + FAKE,
         1, "name", '"  "', ("must not be empty",)),
    Case("asks_to_quote_a_name_that_yaml_reads_as_a_date", "name: 2026-01-31\n" + FAKE,
         1, "name", "2026-01-31", ('quote it: name: "2026-01-31"',)),
    Case("refuses_an_empty_selector",
         'workload:\n  orchestrator: kubernetes\n  selector: "   "\n' + REST,
         3, "workload.selector", '"   "', ("matches every pod",)),
    Case("refuses_a_missing_selector", "workload:\n  orchestrator: kubernetes\n" + REST,
         1, "workload.selector", "nothing"),
    Case("refuses_a_namespace_kubernetes_would_refuse",
         "workload:\n  orchestrator: kubernetes\n  selector: a=b\n  namespace: My_NS\n" + REST,
         4, "workload.namespace", "My_NS", ("lowercase",)),
    Case("refuses_a_local_drill_without_command_or_pid",
         "workload:\n  orchestrator: local\n" + REST,
         1, "workload.command", "nothing", ("attachPid",)),
    Case("refuses_an_empty_command", "workload:\n  orchestrator: local\n  command: []\n" + REST,
         3, "workload.command", "[]", ("must not be empty",)),
    Case("refuses_a_command_with_unbalanced_quotes",
         "workload:\n  orchestrator: local\n  command: python 'train.py\n" + REST,
         3, "workload.command", "python 'train.py", ("No closing quotation",)),
    Case("refuses_both_command_and_attach_pid",
         "workload:\n  orchestrator: local\n  command: [x]\n  attachPid: 77\n" + REST,
         4, "workload.attachPid", "77", ("cannot both be set",)),
    Case("refuses_an_env_name_with_an_equals_sign",
         'workload:\n  orchestrator: local\n  command: [x]\n  env: {"A=B": c}\n' + REST,
         4, "workload.env.A=B", "'A=B'"),
    Case("refuses_a_slurm_drill_with_both_job_id_and_name",
         "workload:\n  orchestrator: slurm\n  jobId: 1\n  jobName: x\n" + REST,
         4, "workload.jobName", "x", ("cannot both be set",)),
    Case("refuses_a_slurm_drill_without_a_job", "workload:\n  orchestrator: slurm\n" + REST,
         1, "workload.jobId", "nothing", ("jobId or jobName",)),
    Case("refuses_a_slurm_drill_with_both_a_job_name_and_a_script",
         "workload:\n  orchestrator: slurm\n  jobName: x\n  script: job.sbatch\n" + REST,
         4, "workload.script", None, ("jobName and script cannot both be set", "a job the drill submits")),
    Case("refuses_a_slurm_script_that_is_not_there",
         "workload:\n  orchestrator: slurm\n  script: no-such.sbatch\n" + REST,
         3, "workload.script", "no-such.sbatch", ("is not a file",)),
    Case("refuses_sbatch_args_without_a_script",
         "workload:\n  orchestrator: slurm\n  jobId: 9\n  sbatchArgs: [-N2]\n" + REST,
         4, "workload.sbatchArgs", None, ("only applies with script",)),
    Case("refuses_an_env_for_a_running_slurm_job",
         "workload:\n  orchestrator: slurm\n  jobId: 9\n  env: {A: b}\n" + REST,
         4, "workload.env", "a mapping (A)", ("the drill passes nothing to a job it did not submit",)),
    Case("refuses_an_sbatch_option_the_drill_sets_itself",
         "workload:\n  orchestrator: slurm\n  script: job.sbatch\n  sbatchArgs: [-N1, --export=NONE]\n"
         + REST,
         4, "workload.sbatchArgs.1", "--export=NONE", ("--export=ALL: set variables in workload.env",)),
    Case("refuses_a_partition_with_a_slurm_script",
         "workload:\n  orchestrator: slurm\n  script: job.sbatch\n  partition: gpu\n" + REST,
         4, "workload.partition", "gpu", ("sbatchArgs",)),
    Case("refuses_a_poisoned_step_on_a_running_slurm_job",
         "workload:\n  orchestrator: slurm\n  jobName: x\ninjectFailure:\n  afterCheckpoint: step-100\n"
         "  type: StickyFault\n  scope: step\n  atStep: 120\nexpectations:\n  maxRecoveryTime: 5m\n",
         7, "injectFailure.scope", "step", ("environment of a running job (jobName) cannot be changed", "workload.script")),
    Case("refuses_a_slurm_user_without_a_job_name",
         "workload:\n  orchestrator: slurm\n  jobId: 9\n  user: bob\n" + REST,
         4, "workload.user", "bob", ("only applies with jobName",)),
    Case("stays_strict_on_a_quoted_number_where_a_count_belongs", FAKE + '  maxLostSteps: "100"\n',
         7, "expectations.maxLostSteps", '"100"', ("remove the quotes",)),
    Case("refuses_a_max_stall_of_zero", FAKE + "  maxStall: 0s\n",
         7, "expectations.maxStall", "0s", ("longer than zero",)),
    Case("refuses_both_rates_of_a_projection",
         FAKE + "projection:\n  gpus: 8\n  failuresPerGpuHour: 2e-5\n  mtbfHours: 3\n",
         10, "projection.mtbfHours", "3", ("cannot both be set", "keep the one you measured")),
    Case("explains_tabs_in_indentation", "workload:\n\torchestrator: fake\n",
         2, "(YAML syntax)", r"'\torchestrator: fake'", ("spaces, not tabs",)),
    Case("refuses_bytes_that_are_not_utf8", b"workload:\n  orchestrator: fake\nname: caf\xe9\n",
         3, "(file)", "byte 0xe9 at offset", ("not UTF-8",)),
    Case("refuses_control_characters", "workload:\n  orchestrator: fake\nname: a\x00b\n",
         3, "(YAML syntax)", None, ("'\\x00' (U+0000) is not allowed",)),
    Case("refuses_a_file_too_large_to_be_a_config", FAKE + "#" * 300_000 + "\n",
         1, "(file)", "more than 262144 bytes"),
]
# fmt: on


@pytest.mark.parametrize("case", PROBLEMS, ids=[case.name for case in PROBLEMS])
def test_it_refuses_with_the_file_line_key_value_and_what_is_wrong(
    tmp_path: Path, case: Case
) -> None:
    if isinstance(case.text, bytes):
        path = tmp_path / "drill.yaml"
        path.write_bytes(case.text)
    else:
        path = write(tmp_path, case.text)
    message = error_of(path)
    text = problem_line(message, path, case.line, case.key)
    if case.got is not None:
        assert f"— got {case.got}" in text, text
    for said in case.says:
        assert said in text, text


# ------------------------------------------------------------------ file errors


def test_it_refuses_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    message = error_of(path)
    assert message.startswith(f"{path}: (file): does not exist — got {path}")


def test_it_refuses_a_directory_and_suggests_the_file_inside(tmp_path: Path) -> None:
    write(tmp_path, FAKE, "recovery-test.yaml")
    message = error_of(tmp_path)
    assert message.startswith(f"{tmp_path}: (file): is a folder, not a file — got {tmp_path}")
    assert str(tmp_path / "recovery-test.yaml") in message


def test_it_accepts_a_utf8_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "drill.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + FAKE.encode())
    assert load_config(path).name == "drill"


def test_it_refuses_a_tagged_document(tmp_path: Path) -> None:
    path = write(tmp_path, "!!omap\n" + FAKE)
    message = error_of(path)
    assert "YAML tag tag:yaml.org,2002:omap is not supported" in problem_line(
        message, path, 1, "(top level)"
    )
    assert "object at" not in message


# ------------------------------------------------------------------- key errors


def test_it_refuses_missing_required_sections(tmp_path: Path) -> None:
    path = write(tmp_path, "\nworkload: {orchestrator: fake}\n")
    message = error_of(path)
    assert "required key is missing — got nothing" in problem_line(
        message, path, 2, "injectFailure"
    )
    assert "required key is missing" in problem_line(message, path, 2, "expectations")


# ----------------------------------------------------------------- value errors


# ------------------------------------------------------------ backend specifics


def test_it_takes_a_plain_number_in_the_command_as_its_decimal_text(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "workload:\n  orchestrator: local\n  command:\n    - torchrun\n    - --nproc-per-node\n"
        "    - 2\n    - train.py\n    - --lr\n    - 0.50\n    - --offset\n    - -3\n"
        "    - --wd\n    - 1e-4\n    - --warmup\n    - 2E3\n" + REST,
    )
    assert workload_of(path, LocalWorkload).command == [
        "torchrun",
        "--nproc-per-node",
        "2",
        "train.py",
        "--lr",
        "0.50",
        "--offset",
        "-3",
        "--wd",
        "1e-4",
        "--warmup",
        "2E3",
    ]


@pytest.mark.parametrize(
    ("written", "made"),
    [
        ("0x10", "the number 16"),
        ("010", "the number 8"),
        ("1_000", "the number 1000"),
        ("+5", "the number 5"),
        (".inf", "the number inf"),
        ("yes", "true/false"),
        ("on", "true/false"),
        ("~", "null"),
    ],
)
def test_it_refuses_a_command_argument_yaml_reads_as_something_else(
    tmp_path: Path,
    written: str,
    made: str,
) -> None:
    path = write(
        tmp_path,
        f"workload:\n  orchestrator: local\n  command:\n    - python\n    - {written}\n" + REST,
    )
    text = assert_problem(error_of(path), path, 5, "workload.command[1]", written)
    assert f"YAML reads {written} as {made}" in text
    assert f'quote it: - "{written}"' in text


def test_it_refuses_a_workdir_that_does_not_exist(tmp_path: Path) -> None:
    path = write(
        tmp_path, "workload:\n  orchestrator: local\n  command: [x]\n  workdir: missing\n" + REST
    )
    text = assert_problem(error_of(path), path, 4, "workload.workdir", "missing")
    assert str(tmp_path / "missing") in text


def test_it_refuses_env_values_that_are_not_text_without_printing_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "workload:\n  orchestrator: local\n  command: [x]\n"
        "  env:\n    API_PIN: 0x918273\n    DEBUG: yes\n" + REST,
    )
    message = error_of(path)
    text = problem_line(message, path, 5, "workload.env.API_PIN")
    assert "must be text" in text
    assert "YAML reads it as a number" in text
    assert "hidden" in text
    assert "quote it" in text
    assert "918273" not in message
    assert "YAML reads it as true/false" in problem_line(message, path, 6, "workload.env.DEBUG")


def test_it_takes_a_plain_number_as_an_env_value_as_written(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "workload:\n  orchestrator: local\n  command: [x]\n"
        "  env:\n    SEED: 1\n    NCCL_TIMEOUT: 1800\n    RATIO: 0.25\n    LR: 1e-3\n" + REST,
    )
    assert workload_of(path, LocalWorkload).env == {
        "SEED": "1",
        "NCCL_TIMEOUT": "1800",
        "RATIO": "0.25",
        "LR": "1e-3",
    }


def test_it_takes_a_slurm_job_id_given_as_text(tmp_path: Path) -> None:
    # what envsubst and templating produce: jobId: "${SLURM_JOB_ID}"
    path = write(tmp_path, 'workload:\n  orchestrator: slurm\n  jobId: "12345"\n' + REST)
    assert workload_of(path, SlurmWorkload).job_id == 12345


def test_it_takes_an_attach_pid_given_as_text(tmp_path: Path) -> None:
    path = write(tmp_path, 'workload:\n  orchestrator: local\n  attachPid: "4242"\n' + REST)
    assert workload_of(path, LocalWorkload).attach_pid == 4242


@pytest.mark.parametrize("written", ['"012345"', '"12.0"', '" 12345"', '"1e3"', "12.0", "true"])
def test_it_refuses_a_slurm_job_id_that_could_mean_two_things(
    tmp_path: Path,
    written: str,
) -> None:
    path = write(tmp_path, f"workload:\n  orchestrator: slurm\n  jobId: {written}\n" + REST)
    assert "must be a whole number" in assert_problem(
        error_of(path), path, 3, "workload.jobId", written
    )


# ----------------------------------------------------------- the message itself


def test_one_message_lists_every_problem_in_file_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        workload:
          orchestrator: kubernetes
          selector: ""
          namespce: default
        injectFailure:
          afterCheckpoint: 1000
        expectations:
          maxRecoveryTime: 5
        safety: {dryRun: maybe}
        """,
    )
    lines = error_of(path).splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "workload.selector",
        "workload.namespce",
        "injectFailure.afterCheckpoint",
        "expectations.maxRecoveryTime",
        "safety.dryRun",
    ]
    numbers = [int(line.split(":")[1]) for line in lines]
    assert numbers == [3, 4, 6, 8, 9]


def test_every_problem_line_has_the_documented_shape(tmp_path: Path) -> None:
    path = write(
        tmp_path, "workload: {orchestrator: x}\ninjectFailure: 3\nexpectations: []\nfoo: 1\n"
    )
    lines = error_of(path).splitlines()
    assert len(lines) == 4
    for line in lines:
        match = LINE.match(line)
        assert match, line
        assert match["file"] == str(path)
        assert "; allowed: " in line
        assert "Input should" not in line


def test_messages_keep_validator_jargon_out(tmp_path: Path) -> None:
    path = write(tmp_path, "workload: {orchestrator: fake, fake: {workers: x, resume: 3}}\n" + REST)
    message = error_of(path)
    for jargon in ("Input should", "pydantic", "errors.pydantic.dev", "literal_error", "Traceback"):
        assert jargon not in message


# ------------------------------------------------------------------ durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("250ms", 0.25),
        ("0s", 0.0),
        (" 2h ", 7200.0),
        ("1m30s500ms", 90.5),
    ],
)
def test_durations_parse_to_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.25, "250ms"),
        (1.5, "1.5s"),
        (90, "1m30s"),
        (300, "5m"),
        (5400, "1h30m"),
        (3600, "1h"),
        (630, "10m30s"),
    ],
)
def test_durations_format_back_in_the_config_language(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


# ---------------------------------------------------------------- the reference

DOCS = Path(__file__).parent.parent / "docs" / "config.md"


def test_the_reference_documents_every_key() -> None:
    text = DOCS.read_text(encoding="utf-8")
    missing = [
        f"{section}.{key}" if section else key
        for section, key, _allowed in schema_keys()
        if f"`{key}`" not in text and f"`fake.{key}`" not in text
    ]
    assert not missing, f"docs/config.md does not mention: {missing}"


def test_every_complete_example_in_the_reference_is_valid(tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), flags=re.S)
    complete = [block for block in blocks if "workload:" in block and "expectations:" in block]
    assert len(complete) >= 4
    backends = {type(parse_config(block, tmp_path / "doc.yaml").workload) for block in complete}
    assert backends == {
        FakeWorkload,
        LocalWorkload,
        KubernetesWorkload,
        SlurmWorkload,
        RayWorkload,
    }


def _sections(model: type[BaseModel]) -> list[type[BaseModel]]:
    """``model`` and every section model below it, depth first."""
    found = [model]
    for info in model.model_fields.values():
        for inner in (info.annotation, *get_args(info.annotation)):
            for kind in (inner, *get_args(inner)):
                if isinstance(kind, type) and issubclass(kind, BaseModel) and kind not in found:
                    found += [m for m in _sections(kind) if m not in found]
    return found


def test_every_example_an_error_message_shows_is_accepted() -> None:
    # A message ends "(e.g. failuresPerGpuHour: 2e-5)": that line, pasted into a config,
    # must be read as the key's value and pass the key's own checks (pyyaml alone read
    # 2e-5 as text, and the example was refused as "must be a number").
    models = _sections(DrillConfig)
    models += [m for b in all_backends().values() for m in _sections(b.workload)]
    checked, refused = 0, []
    for model in dict.fromkeys(models):
        for name, info in model.model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            example = extra.get("example")
            if not isinstance(example, str) or not example or name == "workload":
                continue
            written = yaml.load(example, Loader=YamlLoader)
            assert isinstance(written, dict), f"{model.__name__}.{name}: {example!r}"
            assert list(written) == [info.alias or name], f"{model.__name__}: {example!r}"
            key: dict[str, Any] = {name: (info.annotation, info)}
            one = create_model("One", __config__=model.model_config, **key)
            try:
                one.model_validate(written)
            except ValidationError as exc:
                refused.append(f"{model.__name__}.{name}: {example!r}: {exc.errors()[0]['msg']}")
            checked += 1
    assert checked >= 80
    assert not refused, refused
