"""Step bases of evidence patterns (``stepBase``; issue 41, item 1).

We test these aspects:
- the PyTorch DDP tutorial (``multigpu_torchrun.py``), by its own format strings: every
  number it prints is a 0-based index, so ``stepBase: index`` must move its save and load
  lines too; a drill of it FAILs the off-by-one resume it has (it was a false PASS,
  "resumed from step 6 as expected", while it trained the loaded epoch again); its load
  line read as a count (a per-pattern base) FAILs "resumed from step 6, expected step 7";
  the tutorial with that off-by-one fixed PASSes;
- what a base applies to: every pattern of the set (a preset's too), a pattern's own
  ``stepBase`` first, a preset's line keeping its documented base otherwise, a step taken
  from a neighbour line keeping that line's base, a path's step moved like a group's;
- the ``{regex, stepBase}`` form: checked like a plain pattern (file, line, key), a regex
  left out only where a preset has one, carried to the job's processes unchanged;
- docs/evidence.md names the base of each preset's lines as the table holds them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recoverygate.evidence import (
    KINDS,
    PRESETS,
    Matcher,
    Spec,
    preset_base,
    problems,
    spec_from_json,
)

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.machine import DrillResult, Finish, KillTarget
from pytest_recoverygate.engine.model import (
    KillOutcome,
    KillResult,
    TrainingEventKind,
)
from pytest_recoverygate.engine.verdict import FailureReason, Verdict
from pytest_recoverygate.errors import ConfigError
from tests.engine_events import T0, ev
from tests.test_engine_patterns import engine_for

DOCS = Path(__file__).resolve().parents[1] / "docs" / "evidence.md"

KIND = {
    "progress": TrainingEventKind.PROGRESS,
    "checkpointStarted": TrainingEventKind.CHECKPOINT_STARTED,
    "checkpointCompleted": TrainingEventKind.CHECKPOINT_COMPLETED,
    "checkpointLoaded": TrainingEventKind.CHECKPOINT_LOADED,
}

# ---------------------------------------------------------------------------- the tutorial

#: The patterns issue 41 drilled pytorch/examples' distributed/ddp-tutorial-series/
#: multigpu_torchrun.py with (unmodified but for CPU/gloo), every number a 0-based index.
TUTORIAL: dict[str, Any] = {
    "patterns": {
        "progress": r"\[GPU\d+\] Epoch (?P<step>\d+) \| Batchsize",
        "checkpointCompleted": r"Epoch (?P<step>\d+) \| Training snapshot saved at",
        "checkpointLoaded": r"Resuming training from snapshot at Epoch (?P<step>\d+)",
    },
    "stepBase": "index",
}


def tutorial(first: int, epochs: int, *, stored: int | None = None) -> Iterator[str]:
    """The lines rank 0 of the tutorial prints, by its own format strings (save_every=1):
    ``Trainer.__init__`` and ``_load_snapshot`` when a snapshot exists (``stored``: its
    ``EPOCHS_RUN``), then ``train``'s loop of ``_run_epoch`` and ``_save_snapshot``."""
    if stored is not None:
        yield "Loading snapshot"
        yield f"Resuming training from snapshot at Epoch {stored}"
    for epoch in range(first, first + epochs):
        yield f"[GPU0] Epoch {epoch} | Batchsize: 32 | Steps: 32"
        yield f"Epoch {epoch} | Training snapshot saved at snapshot.pt"


def drill_tutorial(spec: dict[str, Any], *, fixed: bool = False) -> DrillResult:
    """Drill the tutorial from its lines through the engine: the kill lands after the
    first snapshot proven to hold 7 epochs (``afterCheckpoint: step-7``); the replacement
    loads the last snapshot saved and resumes as the tutorial does, at ``EPOCHS_RUN``.
    The tutorial stores the index of the epoch just finished there; ``fixed``: it stores
    the epochs run (``epoch + 1``), and so resumes at the next epoch."""
    engine = engine_for(after_checkpoint=7)
    finishes: list[Finish] = []
    clock = [0.0]

    def run(incarnation: str, lines: Iterator[str]) -> int | None:
        """Feed one process's lines until the kill: the epoch of the last snapshot it
        saved before the kill, None if it was not killed."""
        matcher = Matcher(Spec(spec))
        saved = None
        engine.on_training_event(ev(TrainingEventKind.START, clock[0], incarnation))
        for line in lines:
            clock[0] += 0.1
            if line.startswith("Epoch "):
                saved = int(line.split()[1])
            for kind, step, loss in matcher.feed(line):
                event = ev(KIND[kind], clock[0], incarnation, step, loss=loss)
                for action in engine.on_training_event(event):
                    if isinstance(action, KillTarget):
                        result = KillResult(KillOutcome.KILLED, T0 + clock[0])
                        finishes.extend(
                            a for a in engine.on_kill_result(result) if isinstance(a, Finish)
                        )
                        return saved
                    if isinstance(action, Finish):
                        finishes.append(action)
        return None

    saved = run("old", tutorial(0, 20))
    assert saved is not None, "the drill never killed: no snapshot holding 7 epochs"
    clock[0] += 1.0
    stored = saved + 1 if fixed else saved
    assert run("new", tutorial(stored, 6, stored=stored)) is None
    if not finishes:
        finishes = [a for a in engine.tick(T0 + clock[0] + 1000) if isinstance(a, Finish)]
    assert len(finishes) == 1, finishes
    return finishes[0].result


def with_loaded_base(base: str) -> dict[str, Any]:
    """TUTORIAL with the load line's own base."""
    patterns = dict(TUTORIAL["patterns"])
    patterns["checkpointLoaded"] = {"regex": patterns["checkpointLoaded"], "stepBase": base}
    return {**TUTORIAL, "patterns": patterns}


def test_the_ddp_tutorials_lines_all_move_with_step_base_index() -> None:
    matcher = Matcher(Spec(TUTORIAL))
    found = [e for line in tutorial(6, 1, stored=6) for e in matcher.feed(line)]
    assert found == [
        ("checkpointLoaded", 7, None),  # "at Epoch 6": the 7th epoch
        ("progress", 7, None),  # "[GPU0] Epoch 6 | Batchsize"
        ("checkpointCompleted", 7, None),  # "Epoch 6 | Training snapshot saved"
    ]


def test_the_ddp_tutorials_resume_that_trains_the_loaded_epoch_again_fails() -> None:
    """It was a false PASS: "resumed from step 6 as expected" (only its progress line
    moved, its save and load lines stayed one short and hid the off-by-one)."""
    result = drill_tutorial(TUTORIAL)
    assert result.verdict is Verdict.FAIL, result.summary
    assert FailureReason.STEPS_REPLAYED in result.reasons, result.summary
    assert result.loaded_step == 7
    assert result.expected_resume_step == 7  # the snapshot after epoch index 6
    assert "loaded checkpoint 7, but the first step reported after it was 7" in result.summary
    assert "off by one" in result.summary


def test_the_tutorials_load_line_read_as_a_count_fails_resumed_from_an_older_step() -> None:
    result = drill_tutorial(with_loaded_base("completed"))
    assert result.verdict is Verdict.FAIL, result.summary
    assert result.resume_step == 6
    assert result.expected_resume_step == 7
    assert "resumed from step 6, expected step 7" in result.summary


def test_the_tutorial_with_its_off_by_one_fixed_passes_with_the_loads_own_base() -> None:
    # The snapshot stores epoch + 1 (the epochs run) and the load line prints that count.
    result = drill_tutorial(with_loaded_base("completed"), fixed=True)
    assert result.verdict is Verdict.PASS, result.summary
    assert result.resume_step == result.expected_resume_step == 7


# ---------------------------------------------------------------------------- what a base applies to


def feed(spec: dict[str, Any], *lines: str) -> list[tuple[str, int, float | None]]:
    matcher = Matcher(Spec(spec))
    return [e for line in lines for e in matcher.feed(line)]


def test_a_patterns_own_base_wins_over_the_sets() -> None:
    spec = {
        "patterns": {
            "progress": r"it (?P<step>\d+)",
            "checkpointCompleted": {"regex": r"saved (?P<step>\d+)", "stepBase": "completed"},
            "checkpointStarted": {"regex": r"saving (?P<step>\d+)"},  # the set's base
        },
        "stepBase": "index",
    }
    assert feed(spec, "it 4", "saving 4", "saved 5") == [
        ("progress", 5, None),
        ("checkpointStarted", 5, None),
        ("checkpointCompleted", 5, None),
    ]


def test_a_paths_step_moves_with_its_patterns_base() -> None:
    spec = {
        "patterns": {
            "progress": r"it (?P<step>\d+)",
            "checkpointCompleted": r"wrote (?P<path>\S+)",
        },
        "stepBase": "index",
    }
    assert feed(spec, "wrote /ckpt/step-4") == [("checkpointCompleted", 5, None)]


def test_preset_lines_keep_their_bases_unless_the_set_gives_one() -> None:
    lines = ("Loading the checkpoint from ./outputs/checkpoint/step-8.",)
    assert feed({"preset": "torchtitan"}, *lines) == [("checkpointLoaded", 8, None)]
    assert feed({"preset": "torchtitan", "stepBase": "index"}, *lines) == [
        ("checkpointLoaded", 9, None)
    ]
    # a stepBase alone keeps the preset's regex
    own = {"preset": "torchtitan", "patterns": {"checkpointLoaded": {"stepBase": "index"}}}
    assert feed(own, *lines) == [("checkpointLoaded", 9, None)]
    assert Spec(own).sources["checkpointLoaded"] == PRESETS["torchtitan"]["checkpointLoaded"]


def test_nanogpts_saves_and_loads_keep_the_base_of_the_step_line_they_take() -> None:
    lines = (
        "Resuming training from out",
        "step 250: train loss 1.0, val loss 1.0",
        "saving checkpoint to out",
        "iter 250: loss 1.0000, time 1.00ms, mfu 1.00%",
    )
    expected = [
        ("checkpointLoaded", 250, None),
        ("checkpointStarted", 250, None),
        ("checkpointCompleted", 250, None),
        ("progress", 251, 1.0),
    ]
    assert feed({"preset": "nanogpt"}, *lines) == expected
    assert feed({"preset": "nanogpt", "stepBase": "index"}, *lines) == expected
    completed = feed({"preset": "nanogpt", "stepBase": "completed"}, *lines)
    assert completed[-1] == ("progress", 250, 1.0)  # only its progress line has a number


# ---------------------------------------------------------------------------- the mapping form


@pytest.mark.parametrize(
    ("entry", "where", "says"),
    [
        ({"regex": "loaded (\\d+)"}, ("patterns", "checkpointLoaded", "regex"), "(?P<step>"),
        ({"stepBase": "zero"}, ("patterns", "checkpointLoaded", "stepBase"), "completed or index"),
        ({"regx": "x"}, ("patterns", "checkpointLoaded", "regx"), "unknown key 'regx'"),
        ({"stepBase": "index"}, ("patterns", "checkpointLoaded", "regex"), "needs a regex"),
    ],
)
def test_a_bad_mapping_pattern_is_refused_with_its_key(
    entry: dict[str, str], where: tuple[str, ...], says: str
) -> None:
    found = problems({"patterns": {"progress": "it (?P<step>\\d+)", "checkpointLoaded": entry}})
    assert found, entry
    assert found[0][0] == where
    assert says in found[0][1]


def test_a_stepbase_alone_is_fine_where_the_preset_has_that_line() -> None:
    assert problems({"preset": "megatron", "patterns": {"progress": {"stepBase": "index"}}}) == []
    found = problems(
        {"preset": "nanogpt", "patterns": {"checkpointCompleted": {"stepBase": "index"}}}
    )
    assert found[0][1] == (
        "needs a regex: preset nanogpt has no checkpointCompleted line to take it from"
    )


CONFIG = """\
workload: {{orchestrator: fake}}
injectFailure: {{afterCheckpoint: step-7}}
expectations: {{maxRecoveryTime: 60s}}
evidence:
  patterns:
    progress: '\\[GPU\\d+\\] Epoch (?P<step>\\d+) \\| Batchsize'
    checkpointLoaded: {loaded}
  stepBase: index
"""


def test_the_config_takes_a_mapping_and_the_job_gets_it_unchanged(tmp_path: Path) -> None:
    loaded = (
        "{regex: 'Resuming training from snapshot at Epoch (?P<step>\\d+)', stepBase: completed}"
    )
    config = parse_config(CONFIG.format(loaded=loaded), tmp_path / "t.yaml")
    assert config.evidence is not None
    value = json.loads(config.evidence.environment())
    assert value["evidence"]["patterns"]["checkpointLoaded"] == {
        "regex": "Resuming training from snapshot at Epoch (?P<step>\\d+)",
        "stepBase": "completed",
    }
    assert value["evidence"]["stepBase"] == "index"
    spec = spec_from_json(json.dumps(value))
    assert spec is not None
    assert spec.bases == {
        "progress": "index",
        "checkpointStarted": "index",
        "checkpointCompleted": "index",
        "checkpointLoaded": "completed",
        "context": "completed",
    }


@pytest.mark.parametrize(
    ("loaded", "says"),
    [
        (
            "{regex: 'Resuming (\\d+)'}",
            "t.yaml:7: evidence.patterns.checkpointLoaded.regex: a checkpointLoaded pattern needs",
        ),
        (
            "{regex: 'Resuming (?P<step>\\d+)', stepBase: indx}",
            "t.yaml:7: evidence.patterns.checkpointLoaded.stepBase: must be completed or index",
        ),
        (
            "{regexp: 'Resuming (?P<step>\\d+)'}",
            "t.yaml:7: evidence.patterns.checkpointLoaded.regexp: unknown key",
        ),
        (
            "{stepBase: completed}",
            "t.yaml:7: evidence.patterns.checkpointLoaded.regex: needs a regex: there is no preset",
        ),
    ],
)
def test_a_bad_mapping_in_the_config_names_file_line_and_key(
    tmp_path: Path, loaded: str, says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(CONFIG.format(loaded=loaded), tmp_path / "t.yaml")
    text = str(caught.value)
    assert says in text, text
    assert ".mapping" not in text and ".text" not in text  # no union tags in the key


# ---------------------------------------------------------------------------- the docs


def test_the_docs_name_the_base_of_each_presets_lines() -> None:
    text = DOCS.read_text(encoding="utf-8")
    table = text[text.index("The presets' lines") :]
    for preset in PRESETS:
        row = re.search(rf"^\| `{preset}` \| (.*?) \| (.*?) \|$", table, flags=re.M)
        assert row is not None, preset
        index = [k for k in KINDS if preset_base(preset, k) == "index"]
        assert (row.group(1) == "none") == (not index), (preset, row.group(0))
        for kind in index:
            assert kind in row.group(1), (preset, kind)
