"""Fuzzing recovery-test.yaml: whatever a user (or a bad merge) writes, the answer is a
DrillConfig or a ConfigError naming the problem, never a traceback.

We test these aspects:

- random text, random bytes and random YAML-token soup;
- random nested structures (dumped as YAML) using the schema's own keys, so that the
  validators, not just the parser, get exercised;
- valid configs of every backend mutated one step at a time (a key dropped, renamed or
  added; a value replaced by a wrong type, a huge or negative number, a bad duration…);
- YAML bombs (billion laughs, deep nesting) refused fast, before anything expands;
- invariants of every outcome: a ConfigError's lines all have the documented shape and
  never show an ``env`` value; a DrillConfig survives ``dump_effective`` and loads back
  to the same drill (its derived recovery deadline written out), whose dump is the same;
  durations parse back from their formatted form.
"""

from __future__ import annotations

import copy
import os
import re
import string
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pytest_recoverygate.config.loading import dump_effective, parse_config
from pytest_recoverygate.config.schema import MAX_DURATION, DrillConfig, delay_of
from pytest_recoverygate.durations import (
    DurationSyntaxError,
    format_duration,
    parse_duration,
)
from pytest_recoverygate.errors import ConfigError

#: Examples per fuzz test; raise it for a long soak: RECOVERYGATE_FUZZ_EXAMPLES=20000.
FUZZ_EXAMPLES = int(os.environ.get("RECOVERYGATE_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SECRET = "S3CR3T-VALUE-0xC0FFEE"
SHAPE = re.compile(r"^(?P<file>.+?):(?:\d+:)? \S.*?: .+ — got .+$")

KEYS = [
    "name", "workload", "orchestrator", "reportingRank", "fake", "workers", "stepsPerSecond",
    "checkpointEvery", "restartDelay", "resume", "startupDelay", "command", "workdir", "env",
    "attachPid", "selector", "namespace", "context", "kubeconfig", "container", "jobId",
    "jobName", "user", "partition", "output", "pollInterval", "injectFailure", "type",
    "afterCheckpoint", "targetRank", "expectations", "resumeFromCheckpoint", "maxRecoveryTime",
    "maxLostSteps", "safety", "requireConfirm", "dryRun", "timeouts", "discovery", "checkpoint",
    "recovery", "sourcePath", "inject_failure", "",
]  # fmt: skip
WORDS = [
    "fake", "local", "kubernetes", "slurm", "latest", "next", "zero", "older", "never",
    "KillWorker", "KillStep", "Requeue", "step-0", "step-1000", "step-", "step--1", "90s",
    "5m", "1h30m", "1.5s", "250ms", "-5s", "0s", "5", "1e400", ".inf", ".nan", "yes", "~",
    "training-run=llama", " ", "a=b", ".", "..", "/", "~/x", "%j", "\t", "é", "\x85",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WORDS),
    st.text(max_size=20),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=12), st.integers(-3, 3), st.booleans())
structures = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(keys, inner, max_size=6),
    ),
    max_leaves=30,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("fuzz")
    (base / "job").mkdir()
    return base


def check_outcome(text: str | bytes, folder: Path) -> DrillConfig | None:
    """Parse; the result must be a config or a well-formed ConfigError — nothing else."""
    source = folder / "fuzz.yaml"
    try:
        config = parse_config(text, source)
    except ConfigError as error:
        message = str(error)
        assert message, "a ConfigError must say something"
        for line in message.splitlines():
            assert line.startswith(f"{source}:"), line
            assert SHAPE.match(line), line
            assert "Input should" not in line, line
        assert SECRET not in message
        return None
    dumped = dump_effective(config)
    # env values are redacted wherever the secret went (a mutation may also move the
    # planted value into a field that is not secret, such as the command: shown as given)
    env = dumped.get("workload", {}).get("env") or {}
    assert SECRET not in repr(env)
    if not getattr(config.workload, "env", None):
        again = parse_config(yaml.safe_dump(dumped), source)
        assert dump_effective(again) == dumped  # the effective config is a fixed point
        # the same config but for the derived deadline and the fault's defaults written out
        kept = {"timeouts": config.timeouts, "inject_failure": config.inject_failure}
        assert again.model_copy(update=kept) == config
        fault, fault_again = config.inject_failure, again.inject_failure
        assert fault_again.effective_target_rank == fault.effective_target_rank
        assert delay_of(fault_again.delay).value == delay_of(fault.delay).value
    return config


def dump(data: Any) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


# ------------------------------------------------------------------ raw input


@FUZZ
@given(text=st.text(max_size=400))
def test_random_text_never_crashes(text: str, folder: Path) -> None:
    check_outcome(text, folder)


@FUZZ
@given(data=st.binary(max_size=400))
def test_random_bytes_never_crash(data: bytes, folder: Path) -> None:
    check_outcome(data, folder)


TOKENS = [
    "workload", "orchestrator", "fake", ":", ": ", "-", "- ", "\n", "  ", "\t", "[", "]", "{", "}",
    ",", "&a ", "*a", "!!python/object:os.system ", "!!binary ", "!!set ", "? ", "'", '"', "#",
    "---\n", "...\n", "%YAML 1.1\n", "<<: ", "|\n", ">\n", "step-100", "5m", "\x00", "\ufeff",
    "injectFailure", "afterCheckpoint", "expectations", "maxRecoveryTime", "\\", "\r", "\x85",
]  # fmt: skip


@FUZZ
@given(parts=st.lists(st.sampled_from(TOKENS), max_size=60))
def test_yaml_token_soup_never_crashes(parts: list[str], folder: Path) -> None:
    check_outcome("".join(parts), folder)


@FUZZ
@given(data=structures)
def test_random_structures_never_crash(data: Any, folder: Path) -> None:
    check_outcome(dump(data), folder)


# ----------------------------------------------------------- mutated configs

VALID: list[dict[str, Any]] = [
    {
        "workload": {"orchestrator": "fake", "fake": {"workers": 3, "restartDelay": "2s"}},
        "injectFailure": {"afterCheckpoint": "step-40"},
        "expectations": {"maxRecoveryTime": "3s", "maxLostSteps": 40},
        "safety": {"requireConfirm": False},
        "timeouts": {"recovery": "6s"},
    },
    {
        "workload": {
            "orchestrator": "local",
            "command": ["torchrun", "--nproc-per-node=2", "train.py"],
            "workdir": "job",
            "env": {"HF_TOKEN": SECRET},
        },
        "injectFailure": {"type": "KillWorker", "afterCheckpoint": "next", "targetRank": 1},
        "expectations": {"resumeFromCheckpoint": "latest", "maxRecoveryTime": "5m"},
    },
    {
        "workload": {
            "orchestrator": "kubernetes",
            "selector": "training-run=llama",
            "namespace": "default",
            "kubeconfig": "~/.kube/config",
        },
        "injectFailure": {"afterCheckpoint": "step-1000"},
        "expectations": {"resumeFromCheckpoint": "step-1000", "maxRecoveryTime": "5m"},
        "timeouts": {"discovery": "1m", "checkpoint": "2h"},
    },
    {
        "workload": {"orchestrator": "slurm", "jobName": "llama-ft", "user": "alice"},
        "injectFailure": {"type": "Requeue", "afterCheckpoint": "step-0"},
        "expectations": {"maxRecoveryTime": "10m"},
    },
]

bad_values = st.one_of(
    scalars,
    st.sampled_from([2**63, 2**64, -1, 10**30, -(10**30), 0, 1.0, True, False, "", "   "]),
    st.just({"nested": [1, 2, {"deep": SECRET}]}),
    st.just([SECRET]),
)


def paths_of(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            found += paths_of(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += paths_of(value, (*prefix, index))
    return found


def mutate(data: Any, path: tuple[Any, ...], action: str, value: Any, key: Any) -> Any:
    value = copy.deepcopy(value)  # strategies may hand out the same object twice
    if not path:
        return data
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "replace":
        parent[last] = value
    elif action == "delete":
        del parent[last]
    elif action == "rename" and isinstance(parent, dict):
        parent[key] = parent.pop(last)
    elif action == "add" and isinstance(parent, dict):
        parent[key] = value
    return data


@FUZZ
@given(
    base=st.sampled_from(range(len(VALID))),
    steps=st.lists(
        st.tuples(
            st.integers(min_value=0),
            st.sampled_from(["replace", "delete", "rename", "add"]),
            bad_values,
            keys,
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_mutated_valid_configs_never_crash(
    base: int, steps: list[tuple[int, str, Any, Any]], folder: Path
) -> None:
    data = yaml.safe_load(dump(VALID[base]))  # a deep copy
    for pick, action, value, key in steps:
        paths = paths_of(data)
        if not paths:
            break
        data = mutate(data, paths[pick % len(paths)], action, value, key)
    check_outcome(dump(data), folder)


def test_the_unmutated_configs_are_valid(folder: Path) -> None:
    for data in VALID:
        assert isinstance(check_outcome(dump(data), folder), DrillConfig)


# ------------------------------------------------------------------- bombs


def billion_laughs(levels: int = 10) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        refs = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (billion_laughs(), "anchors (&a0) are not allowed"),
        ("workload: " + "[" * 50_000 + "]" * 50_000 + "\n", "nesting is deeper than"),
        ("w: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n", "nesting is deeper than"),
        ("a: *undefined\n", "aliases (*undefined) are not allowed"),
    ],
    ids=["billion-laughs", "deep-lists", "deep-mappings", "dangling-alias"],
)
def test_yaml_bombs_are_refused_fast(text: str, says: str, folder: Path) -> None:
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_config(text, folder / "bomb.yaml")
    assert time.perf_counter() - started < 2.0  # generous: it takes milliseconds


@FUZZ
@given(levels=st.integers(min_value=1, max_value=30), name=st.sampled_from(string.ascii_letters))
def test_any_anchor_is_refused(levels: int, name: str, folder: Path) -> None:
    text = billion_laughs(levels).replace("&a0", f"&{name}0").replace("*a0", f"*{name}0")
    with pytest.raises(ConfigError, match="are not allowed"):
        parse_config(text, folder / "bomb.yaml")


# --------------------------------------------------------------- durations

duration_texts = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=10**4),
        st.one_of(st.none(), st.integers(min_value=0, max_value=999_999_999)),
        st.sampled_from(["h", "m", "s", "ms"]),
    ),
    min_size=1,
    max_size=4,
).map(lambda parts: "".join(f"{n}{'' if f is None else f'.{f}'}{u}" for n, f, u in parts))


@FUZZ
@given(text=duration_texts)
def test_durations_format_back_to_the_same_value(text: str) -> None:
    seconds = parse_duration(text)
    assert seconds >= 0
    assume(seconds <= MAX_DURATION)  # what a config accepts
    assert parse_duration(format_duration(seconds)) == seconds


@FUZZ
@given(text=st.text(max_size=30))
def test_duration_parsing_only_ever_raises_its_own_error(text: str) -> None:
    try:
        assert parse_duration(text) >= 0
    except DurationSyntaxError:
        pass
