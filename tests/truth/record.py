"""Recording the truth corpus (``scripts/truth-corpus``): each scenario's real drill run
once, held to the job's truth live, and kept where the quick lane replays it.

A recording (``tests/fixtures/truth/<scenario>/``) holds what the replay and the
scenario's assertions read, and nothing the tool would compute again:

- ``transcript.jsonl``: the drill's transcript, as the runner wrote it;
- ``report.json``: the drill's report (one line: the comparison reads values, not layout);
- ``recovery-test.yaml``: the config the drill ran;
- the job's truth files (``truth.<rank>.<pid>.jsonl``), compacted: every record but the
  steps no assertion reads (:func:`compact_records`; kept whole where compacting would
  change the truth);
- ``output/``: the job's output, only where the scenario's assertions read the diagnoses
  made from it (``keeps_output``);
- ``meta.json``: the exit code ``run`` gave, the drill's wall time, when and with what it
  was recorded, and how many truth records were kept.

A recording is kept only when the live drill holds to its assertions and its recording,
replayed (:func:`~tests.truth.scenarios.replayed`), holds to them too.
"""

from __future__ import annotations

import datetime
import importlib
import json
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recoverygate import __version__

from tests import cli_drill
from tests.truth.scenarios import META, TRUTH_BASE, Drill, Scenario, replayed
from tests.truth.truth import Record, Truth, compute, load_processes

__all__ = ["Recorded", "compact_records", "record", "sizes", "truth_projection"]

REPORTING_RANK = 0
_STEPS = ("step", "report")


@dataclass(frozen=True)
class Recorded:
    """One scenario recorded: its folder, its drill's wall time and exit code, and the
    truth records kept of those the job wrote."""

    scenario: Scenario
    wall_seconds: float
    exit_code: int
    kept: int
    written: int


def truth_projection(truth: Truth) -> tuple[Any, ...]:
    """Every figure of the truth the assertions read (the processes by pid)."""
    first = truth.first_reported_step
    return (
        truth.last_step_before_kill,
        truth.checkpoints_before_kill,
        [(c.step, c.reported, c.t, c.extra) for c in truth.checkpoints_after_kill],
        truth.judged.pid if truth.judged else None,
        truth.first_step,
        truth.resume_step,
        truth.loaded_step,
        truth.lost_steps,
        truth.recovery_time,
        None if first is None else (first.step, first.t),
        truth.restarts,
        [p.pid for p in truth.started_after_kill],
        truth.survivor.pid if truth.survivor else None,
        [(r.step, r.reported, r.t) for r in truth.survivor_steps_after_kill],
        truth.survivor_seconds_after_kill,
        truth.from_scratch,
        truth.replayed_steps,
    )


def compact_records(base: Path, kill: float) -> dict[str, list[str]]:
    """job.py's truth files at ``base`` with the records the truth and the assertions
    read: every record that is not a step (starts, loads, checkpoints, shard loads,
    stalls, exits); of the reporting rank's steps and reports, each process's first and
    last, those after the kill (the survivor's), its last step before the kill, the old
    processes' steps past the
    earliest resume (the lost and the replayed steps, their losses), the new processes'
    steps up to one past the last step before the kill, their reports before their first
    step (held ticks) and their first report past the resume. File name -> its lines."""
    processes = load_processes(base)
    truth = compute(base, kill, REPORTING_RANK)
    new_first = [p.steps[0].step for p in truth.started_after_kill if p.steps]
    floor = min(new_first) - 1 if new_first else None
    ceiling = (truth.last_step_before_kill or 0) + 1
    kept: set[tuple[int, float, str, int]] = set()
    for proc in processes:
        steps = [r for r in proc.records if r.event in _STEPS]
        if proc.rank != REPORTING_RANK or not steps:
            continue
        chosen = [steps[0], steps[-1]]
        if proc.started <= kill:
            chosen += [r for r in steps if r.t > kill or floor is None or r.step > floor]
            chosen += [r for r in proc.steps if r.t <= kill][-1:]  # the last before the kill
        else:
            done = proc.steps[0] if proc.steps else None
            chosen += [r for r in steps if r.event == "step" and r.step <= ceiling]
            if done is not None:
                chosen += [r for r in steps if r.event == "report" and r.t < done.t]
                resume = done.step - 1
                chosen += [
                    r
                    for r in steps
                    if (r.event == "report" or r.reported) and r.step > resume and r.t >= done.t
                ][:1]
        kept.update(_key(r) for r in chosen)
    out: dict[str, list[str]] = {}
    for path in sorted(base.parent.glob(f"{base.name}.*.*.jsonl")):
        lines = []
        for line in path.read_text("utf-8").splitlines():
            if not line.strip():
                continue
            row = Record.parse(json.loads(line))
            if row.event not in _STEPS or _key(row) in kept:
                lines.append(line)
        out[path.name] = lines
    return out


def _key(r: Record) -> tuple[int, float, str, int]:
    return (r.pid, r.t, r.event, r.step)


def _keep_truth(
    scenario: Scenario, drill: Drill, folder: Path, *, compact: bool
) -> tuple[int, int]:
    """Write the job's truth files into ``folder``: compacted where that leaves the truth
    as it was, else whole. The records kept, of those written."""
    files = sorted({p for pattern in scenario.truth for p in drill.root.glob(pattern)})
    written = sum(len(p.read_text("utf-8").splitlines()) for p in files)
    if compact and drill.report.get("killTime") is not None:
        kill = float(drill.report["killTime"])
        for name, lines in compact_records(drill.root / TRUTH_BASE, kill).items():
            (folder / name).write_text("".join(f"{line}\n" for line in lines), "utf-8")
        before = truth_projection(compute(drill.root / TRUTH_BASE, kill))
        if truth_projection(compute(folder / TRUTH_BASE, kill)) == before:
            kept = sum(len(p.read_text("utf-8").splitlines()) for p in folder.glob("truth.*"))
            return kept, written
        for path in folder.glob("truth.*"):
            path.unlink()
    for path in files:
        shutil.copyfile(path, folder / path.name)
    return written, written


def _store(scenario: Scenario, drill: Drill, report_dir: Path, *, whole: bool) -> Recorded:
    folder = scenario.folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shutil.copyfile(report_dir / "transcript.jsonl", folder / "transcript.jsonl")
    report = json.loads((report_dir / "report.json").read_text("utf-8"))
    (folder / "report.json").write_text(json.dumps(report, separators=(",", ":")) + "\n")
    shutil.copyfile(Path(report["config"]), folder / "recovery-test.yaml")
    if scenario.keeps_output and (report_dir / "output").is_dir():
        shutil.copytree(report_dir / "output", folder / "output")
    kept, written = _keep_truth(scenario, drill, folder, compact=scenario.compact and not whole)
    meta = {
        "scenario": scenario.name,
        "test": f"{scenario.module}::test_{scenario.name}",
        "live": scenario.live,
        "exitCode": drill.returncode,
        "wallSeconds": round(drill.wall_seconds, 2),
        "recorded": datetime.date.today().isoformat(),
        "recoverygate": __version__,
        "truthRecords": {"kept": kept, "written": written},
    }
    (folder / META).write_text(json.dumps(meta, indent=1) + "\n", "utf-8")
    return Recorded(scenario, drill.wall_seconds, drill.returncode, kept, written)


def record(scenario: Scenario, work: Path | None = None) -> Recorded:
    """Run the scenario's drill live in ``work/<name>`` (``work``: a new temporary
    folder), hold it to its
    assertions, keep its recording and hold the replayed recording to them too. Raises
    (the assertion, or ImportError for what it needs) and leaves the drill's folder where
    it ran; on success the folder is removed."""
    for module in scenario.needs:
        importlib.import_module(module)
    folder = Path(tempfile.mkdtemp(prefix="truth-corpus-")) if work is None else work
    folder = folder / scenario.name
    folder.mkdir(parents=True)
    cli_drill.RAN.clear()
    drill = scenario.run(folder)
    scenario.check(drill)
    [report_dir] = cli_drill.RAN
    recorded = _store(scenario, drill, report_dir, whole=False)
    try:
        scenario.check(replayed(scenario.folder))
    except AssertionError:
        recorded = _store(scenario, drill, report_dir, whole=True)  # the whole truth, then
        scenario.check(replayed(scenario.folder))
    shutil.rmtree(folder, ignore_errors=True)
    return recorded


def sizes(folders: Iterable[Path]) -> dict[str, int]:
    """Bytes of each recording."""
    return {f.name: sum(p.stat().st_size for p in f.rglob("*") if p.is_file()) for f in folders}
