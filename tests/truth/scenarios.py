"""The truth corpus' scenarios: each a real drill and the assertions that hold its report
to the job's own records, run live or replayed from its recording.

A scenario is written as a test whose body takes the :class:`Drill` (``@scenario(run)``):
the decorator registers it (:data:`SCENARIOS`, by its name without ``test_``) and gives
pytest a test of the same name that runs the drill live and holds it to the body. The
same body judges the recording (``tests/fixtures/truth/<name>/``, made by
``scripts/truth-corpus record``): :func:`replayed` rejudges its transcript through a fresh
engine (no clock) and asserts it reproduces the recorded report value for value, then
builds the :class:`Drill` from the rejudged report and the job's stored truth files. One
assertion code for both; ``tests/truth/test_truth_replayed.py`` runs every recording in
the quick lane.

Only one live drill of each :data:`FAMILIES` stays in the drill lanes (``live=``, with
why); every other live test is marked ``recorded`` and the lanes leave it out
(``pytest -m recorded`` runs them live; so does ``scripts/truth-corpus record``).
"""

from __future__ import annotations

import functools
import io
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_recoverygate.config.loading import load_config
from pytest_recoverygate.report.diagnosis import clues_from, diagnose
from pytest_recoverygate.report.evidence import Evidence
from pytest_recoverygate.report.terminal import print_result
from pytest_recoverygate.shared.joboutput import JobOutput, WorkerOutput
from pytest_recoverygate.shared.jobtext import mask_secrets
from tests.transcripts import assert_rejudged
from tests.truth.truth import Process, Truth, compute, load_processes

__all__ = [
    "FAMILIES",
    "FIXTURES",
    "SCENARIOS",
    "Drill",
    "Scenario",
    "replayed",
    "scenario",
]

ROOT = Path(__file__).resolve().parents[2]
#: Where each scenario's recording lives: ``<name>/`` (see :func:`replayed`).
FIXTURES = ROOT / "tests" / "fixtures" / "truth"
#: The job's truth files in a drill's folder (``RECOVERYGATE_GROUND_TRUTH=<folder>/truth``).
TRUTH_BASE = "truth"
#: A recording's own facts: the exit code, the wall time, what was kept.
META = "meta.json"
#: The families of the corpus, each keeping one live drill in the drill lanes.
FAMILIES = (
    "a correct resume",
    "from scratch",
    "a replay or reset",
    "async lag",
    "survivor lines",
    "the real torch example",
)


@dataclass(frozen=True)
class Drill:
    """One drill: its report, exit code, what the CLI printed, its wall time, and the
    folder its job's truth files are in (``root``: the test's ``tmp_path`` live, the
    recording's folder replayed). ``truth`` and ``processes`` are read from there."""

    report: dict[str, Any]
    returncode: int
    output: str
    wall_seconds: float
    root: Path

    @functools.cached_property
    def processes(self) -> list[Process]:
        return load_processes(self.root / TRUTH_BASE)

    @functools.cached_property
    def truth(self) -> Truth:
        assert self.report.get("killTime") is not None, f"the drill never killed{self.explain()}"
        return compute(self.root / TRUTH_BASE, float(self.report["killTime"]))

    def explain(self) -> str:
        r = self.report
        figures = {
            k: r.get(k)
            for k in (
                "verdict",
                "resumeStep",
                "expectedResumeStep",
                "loadedStep",
                "lostSteps",
                "lostStepsUpperBound",
                "recoveryTimeSeconds",
                "restarts",
                "inconclusive",
                "judgedIncarnation",
            )
        }
        reasons = r.get("reasons", [])
        truth = ""
        if r.get("killTime") is not None:
            truth = f"\ntruth: {compute(self.root / TRUTH_BASE, float(r['killTime'])).describe()}"
        return (
            f"\nsummary: {r.get('summary')}\nreasons: {reasons}\nfigures: {figures}{truth}"
            f"\nexit code {self.returncode}, {self.wall_seconds:.1f}s ({self.root})"
        )


Run = Callable[[Path], Drill]
Check = Callable[[Drill], None]


@dataclass(frozen=True)
class Scenario:
    """One drill of the corpus: how to run it (``run(folder)``, which leaves the job's
    truth files in ``folder``), what must hold of it (``check``), the family whose live
    drill it is (None: judged from its recording only), the module it is written in,
    the modules it needs to run live, the truth files it leaves (globs in its folder), and
    whether its check reads the diagnoses (made from the job's output, kept then)."""

    name: str
    run: Run
    check: Check
    module: str
    live: str | None = None
    needs: tuple[str, ...] = ("torch",)
    truth: tuple[str, ...] = (f"{TRUTH_BASE}.*.*.jsonl",)
    keeps_output: bool = False
    compact: bool = True  # the truth files are job.py's records (:mod:`.record` compacts them)
    why_live: str = field(default="", compare=False)

    @property
    def folder(self) -> Path:
        return FIXTURES / self.name


#: Every scenario, by name (its test's name without ``test_``), as the modules register
#: them on import (:func:`load_all`).
SCENARIOS: dict[str, Scenario] = {}
#: The modules that write scenarios.
MODULES = (
    "tests.truth.test_truth_corpus",
    "tests.truth.test_truth_third_pass",
    "tests.truth.test_truth_third_pass_ray",
)


def load_all() -> dict[str, Scenario]:
    """Every scenario of :data:`MODULES` (importing a module registers its scenarios)."""
    import importlib

    for module in MODULES:
        importlib.import_module(module)
    return SCENARIOS


def scenario(
    run: Run,
    *,
    live: str | None = None,
    why_live: str = "",
    needs: tuple[str, ...] = ("torch",),
    truth: tuple[str, ...] = (f"{TRUTH_BASE}.*.*.jsonl",),
    keeps_output: bool = False,
    compact: bool = True,
) -> Callable[[Check], Callable[[Path], None]]:
    """Register the decorated check as a scenario run by ``run``; return the live test.

    ``live``: the family (:data:`FAMILIES`) whose one live drill this is, with
    ``why_live``; without it the live test is marked ``recorded`` (the drill lanes leave
    it out). ``needs``: what it imports to run live (``pytest.importorskip``)."""
    if live is not None and live not in FAMILIES:
        raise ValueError(f"live={live!r} is no family of {FAMILIES}")

    def register(check: Check) -> Callable[[Path], None]:
        name = check.__name__.removeprefix("test_")
        if name in SCENARIOS:
            raise ValueError(f"scenario {name} is registered twice")
        SCENARIOS[name] = Scenario(
            name, run, check, check.__module__, live, needs, truth, keeps_output, compact, why_live
        )

        def test(tmp_path: Path) -> None:
            for module in needs:
                pytest.importorskip(module)
            check(run(tmp_path))

        test.__name__ = test.__qualname__ = check.__name__
        test.__module__ = check.__module__
        test.__doc__ = check.__doc__
        if live is None:
            return pytest.mark.recorded(test)
        return test

    return register


def recorded_exit_code(folder: Path) -> int:
    meta: dict[str, Any] = json.loads((folder / META).read_text("utf-8"))
    return int(meta["exitCode"])


def replayed(folder: Path) -> Drill:
    """The recording in ``folder`` rejudged, as a :class:`Drill`: the transcript replayed
    through a fresh engine must answer every call and give every value of the recorded
    report as recorded (:func:`~tests.transcripts.assert_rejudged`), with the exit code
    ``run`` gave; where the job's output is kept, the diagnoses made from it must be the
    recorded ones too. ``output`` is the verdict block as ``run`` prints it, made from the
    rejudged result (with the diagnoses and the failing worker's lines where the output
    is kept)."""
    judged = assert_rejudged(folder)
    recorded, code = judged.recorded, recorded_exit_code(folder)
    assert recorded is not None
    assert judged.exit_code == code, f"{folder}: exit code {judged.exit_code}, recorded {code}"
    evidence = _evidence(folder, judged.result, recorded)
    block = io.StringIO()
    print_result(judged.result, block, evidence)
    meta = json.loads((folder / META).read_text("utf-8"))
    return Drill(judged.doc, code, block.getvalue(), float(meta["wallSeconds"]), folder)


def _portable(diagnosis: dict[str, Any]) -> dict[str, Any]:
    """A diagnosis with its docs link from the docs folder on: the link names the checkout
    it was made in (file:///.../docs/...), which a recording must not depend on."""
    docs = str(diagnosis.get("docs", ""))
    at = docs.rfind("/docs/")
    return {**diagnosis, "docs": docs[at + 1 :] if at >= 0 else docs}


def _recorded_config(folder: Path) -> Any:
    """The recording's config, its ``workload.workdir`` (the folder of the checkout it was
    recorded in, which need not exist here) replaced by the recording's own folder: the
    diagnoses read the command and the patterns, never that folder."""
    doc = yaml.safe_load((folder / "recovery-test.yaml").read_text("utf-8"))
    doc.setdefault("workload", {})["workdir"] = str(folder)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "recovery-test.yaml"
        path.write_text(yaml.safe_dump(doc), "utf-8")
        return load_config(path)


def _evidence(folder: Path, result: Any, recorded: dict[str, Any]) -> Evidence | None:
    """The diagnoses of the rejudged result, made from the kept output and config as the
    runner made them; None where the recording keeps no output."""
    files: dict[str, str] = recorded.get("jobOutput") or {}
    if not (folder / "output").is_dir():
        return None
    workers = tuple(
        WorkerOutput(label, (folder / path).read_text("utf-8")) for label, path in files.items()
    )
    output = JobOutput(workers, recorded.get("failingWorker"), recorded.get("jobOutputNote", ""))
    config = _recorded_config(folder)
    diagnoses = tuple(
        replace(d, text=mask_secrets(d.text), evidence=mask_secrets(d.evidence))
        for d in diagnose(clues_from(result, output.text, config))
    )  # as the runner keeps them
    got = [_portable(d.as_dict()) for d in diagnoses]
    want = [_portable(d) for d in recorded.get("diagnoses") or []]
    assert got == want, (
        f"{folder}: the diagnoses made from the kept output are not the recorded ones: "
        f"{got} != {recorded.get('diagnoses')}"
    )
    return Evidence(output, diagnoses)
