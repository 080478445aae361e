"""The drill report: the JSON document, the report directory and the CI summary.

``report.json`` keys are the contract in DESIGN.md (verdict, resumeStep,
expectedResumeStep, lostSteps, recoveryTimeSeconds, checks, target, timeline) plus the
breakdown and bookkeeping, the diagnoses of known failure signatures, the failing
worker's last lines and, in a report folder, the job's own output (``output/*.log``, one
file per worker, named in ``jobOutput``), the drill's transcript (``transcript.jsonl``:
every call into the engine, :mod:`pytest_recoverygate.transcript`) and ``report.html``,
the folder as one page
(:mod:`pytest_recoverygate.report.html`). Files are written owner-only (0600, folders
0700: the job's output may hold secrets), atomically (temp file + rename), and never
through a link planted in the folder (:mod:`pytest_recoverygate.shared.safefiles`).

With ``GITHUB_STEP_SUMMARY`` set, every run appends its markdown summary there (pointing
at ``report.html``: a link with ``$RECOVERYGATE_REPORT_URL``); a step summary that cannot
be written is reported on stderr and never costs the verdict.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_recoverygate.engine.machine import DrillResult
from pytest_recoverygate.errors import describe_exception
from pytest_recoverygate.report.html import plain_value
from pytest_recoverygate.shared.jobtext import printable
from pytest_recoverygate.shared.safefiles import (
    UnsafeFile,
    open_folder,
    read_safely,
    write_safely,
)

if TYPE_CHECKING:
    from pytest_recoverygate.config.schema import DrillConfig
    from pytest_recoverygate.engine.goodput import Projection
    from pytest_recoverygate.report.evidence import Evidence

OUTPUT_FOLDER = "output"  # the job's own output, per worker, inside a report folder
HTML_REPORT = "report.html"  # the one-page report in a report folder
#: Every call the runner made into the engine (pytest_recoverygate.transcript):
#: ``recoverygate rejudge`` replays it.
TRANSCRIPT = "transcript.jsonl"
#: Where the CI job uploads the report folder (e.g. an artifact or pages URL): the step
#: summary then links ``<url>/report.html``.
REPORT_URL_ENV = "RECOVERYGATE_REPORT_URL"

__all__ = [
    "HTML_REPORT",
    "OUTPUT_FOLDER",
    "RECOVERY_PHASES",
    "REPORT_URL_ENV",
    "REPORT_VERSION",
    "TRANSCRIPT",
    "cost_figures",
    "cost_line",
    "evidence_to_dict",
    "figures",
    "live_figures",
    "live_to_dict",
    "markdown_summary",
    "project_config",
    "recovery_phases",
    "result_to_dict",
    "write_html_report",
    "write_private",
    "write_reports",
]

REPORT_VERSION = 1


#: The recovery's phases, in the order they happen: (report name, what it is on a terminal,
#: the breakdown point it ends at). Each starts where the one before it ended (the first at
#: the kill), so they mean the same on every backend and add up to the recovery time;
#: ``startup`` is the replacement's own start-up (imports, rendezvous, process-group init),
#: from its start line to its first reporter line.
RECOVERY_PHASES: tuple[tuple[str, str, str], ...] = (
    ("detection", "detection", "failureDetected"),
    ("scheduling", "scheduling", "replacementScheduled"),
    ("launch", "launch", "processStarted"),
    ("startup", "start-up (imports, rendezvous, init)", "firstReport"),
    ("checkpointLoad", "checkpoint load", "checkpointLoaded"),
    ("firstStep", "first step", "firstStepAfterResume"),
)


def recovery_phases(breakdown: Mapping[str, float | None]) -> dict[str, float | None]:
    """How long each phase of :data:`RECOVERY_PHASES` took, in seconds, from the
    breakdown's points (seconds after the kill). A phase whose end the backend could not
    see is None, and the next one counts from the last point seen."""
    phases: dict[str, float | None] = {}
    began = 0.0
    for name, _, end in RECOVERY_PHASES:
        ended = breakdown.get(end)
        phases[name] = None if ended is None else round(max(ended - began, 0.0), 6)
        began = began if ended is None else max(ended, began)
    return phases


def figures(result: DrillResult) -> dict[str, Any]:
    """The headline figures, by their contract names (also used for JUnit properties)."""
    return {
        "verdict": result.verdict.value,
        "resumeStep": result.resume_step,
        "expectedResumeStep": result.expected_resume_step,
        "lostSteps": result.lost_steps,
        "lostStepsUpperBound": result.lost_steps_upper_bound,
        "recoveryTimeSeconds": result.recovery_time_seconds,
        "restarts": result.restarts,
        "triggerCheckpoint": result.trigger_checkpoint,
        "loadedStep": result.loaded_step,
        "inconclusive": result.inconclusive,
        **live_figures(result),
    }


def live_figures(result: DrillResult) -> dict[str, Any]:
    """``recovery: live``'s headline figures (docs/torchft.md); none in restart mode."""
    live = result.live
    if live is None:
        return {}
    return {
        "recoveryMode": "live",
        "survivorStallSeconds": live.survivor_stall_seconds,
        "rejoinTimeSeconds": live.rejoin_time_seconds,
        "rejoinStep": live.rejoin_step,
        "rejoinSource": live.rejoin_source,
        "survivorsKeptTraining": live.survivors_kept_training,
    }


def live_to_dict(result: DrillResult) -> dict[str, Any] | None:
    """The ``live`` block of report.json: per replica its steps around the kill."""
    live = result.live
    if live is None:
        return None
    return {
        "targetReplica": live.target_replica,
        "rejoinPeer": live.rejoin_peer,
        "lostThroughputSteps": live.lost_throughput_steps,
        "phases": dict(live.phases),
        "replicas": [
            {
                "replica": r.replica,
                "target": r.target,
                "stepBeforeKill": r.before,
                "stepAtRejoin": r.at_rejoin,
                "lastStep": r.last,
                "stallSeconds": r.stall_seconds,
                "incarnations": r.incarnations,
                "incs": list(r.incs),
            }
            for r in live.replicas
        ],
    }


def cost_figures(result: DrillResult) -> dict[str, Any]:
    """The measured cost components, flat (JUnit ``costs.*`` properties, the CLI block)."""
    costs = result.costs or {}
    lost = costs.get("lostWorkSeconds") or {}
    recovery = costs.get("recoveryTimeSeconds") or {}
    return {
        "stepTimeMedianSeconds": costs.get("stepTimeMedianSeconds"),
        "stepTimeP95Seconds": costs.get("stepTimeP95Seconds"),
        "saveTimeMedianSeconds": costs.get("saveTimeMedianSeconds"),
        "saveStallMedianSeconds": costs.get("saveStallMedianSeconds"),
        "checkpointIntervalSteps": costs.get("checkpointIntervalSteps"),
        "checkpointIntervalSeconds": costs.get("checkpointIntervalSeconds"),
        "lostWorkSeconds": lost.get("median"),
        "recoveryTimeMedianSeconds": recovery.get("median")
        if recovery.get("count", 0) > 1
        else None,
        **(
            {"lostThroughputSteps": result.live.lost_throughput_steps}
            if result.live is not None
            else {}
        ),
    }


def cost_line(result: DrillResult) -> str | None:
    """One line of what a failure costs this job, or None when nothing was measured."""
    c = cost_figures(result)
    parts: list[str] = []
    if c["stepTimeMedianSeconds"] is not None:
        parts.append(f"step {c['stepTimeMedianSeconds']:.4f}s (p95 {c['stepTimeP95Seconds']:.4f}s)")
    if c["saveTimeMedianSeconds"] is not None:
        parts.append(f"save {c['saveTimeMedianSeconds']:.3f}s")
    if c["saveStallMedianSeconds"] is not None:
        parts.append(f"save stall {c['saveStallMedianSeconds']:.3f}s")
    if c["checkpointIntervalSeconds"] is not None:
        parts.append(
            f"checkpoint every {c['checkpointIntervalSteps']:g} steps / "
            f"{c['checkpointIntervalSeconds']:.2f}s"
        )
    if c["lostWorkSeconds"] is not None:
        parts.append(f"lost work {c['lostWorkSeconds']:.3f}s")
    lost = (result.costs or {}).get("lostWorkSeconds") or {}
    if lost.get("count", 0) > 1:
        parts.append(
            f"over {lost['count']} kills: lost work {lost['min']:.3f}–"
            f"{lost['max']:.3f}s (p95 {lost['p95']:.3f}s)"
        )
    live = result.live
    if live is not None and live.lost_throughput_steps is not None:
        parts.append(
            f"lost throughput {live.lost_throughput_steps:g} steps' worth of samples while "
            f"replica {live.target_replica} was out"
        )
    missing = (result.costs or {}).get("missing") or {}
    if "saveTime" in missing and result.costs and live is None:
        parts.append("save time unknown (no checkpoint_started)")
    return "cost of a failure: " + ", ".join(parts) if parts else None


def result_to_dict(result: DrillResult, config: DrillConfig | None = None) -> dict[str, Any]:
    """The JSON report as a plain dict."""
    target = result.target
    headline = result.headline
    doc: dict[str, Any] = {
        "reportVersion": REPORT_VERSION,
        "drill": config.name if config is not None else None,
        "config": str(config.source_path) if config is not None else None,
        "orchestrator": config.workload.orchestrator if config is not None else None,
        **figures(result),
        "summary": result.summary,
        "reasons": [reason.name for reason in result.reasons],
        "notes": list(result.notes),
        "lastStepBeforeKill": result.last_step_before_kill,
        "lastStepBeforeKillUpperBound": result.last_step_before_kill_upper_bound,
        "judgedIncarnation": result.judged_incarnation,
        "stepContract": None if result.step_contract is None else result.step_contract.as_dict(),
        "maxRecoveryTimeSeconds": (
            config.expectations.max_recovery_time if config is not None else None
        ),
        "killTime": result.kill_time,
        "startedAt": result.started_at,
        "finishedAt": result.finished_at,
        "malformedLines": result.malformed_lines,
        "ignoredLines": result.ignored_lines,
        "resumeStepBasis": headline.resume_basis if headline is not None else None,
        "resumeStepUpperBound": headline.resume_upper_bound if headline is not None else None,
        "sustained": headline.sustained if headline is not None else None,
        "replay": result.replay,
        "ranks": list(headline.fault_details.get("ranks", [])) if headline is not None else [],
        "checks": [check.as_dict() for check in result.checks],
        "incarnations": [inc.as_dict() for inc in result.incarnations],
        "checkpoints": [
            {"step": step, "time": at, "inc": inc} for step, at, inc in result.checkpoints
        ],
        "saves": [
            {"step": step, "started": started, "completed": completed}
            for step, started, completed in result.saves
        ],
        "recoveries": [recovery.as_dict() for recovery in result.recoveries],
        "costs": dict(result.costs),
        "breakdown": dict(result.breakdown),
        "recoveryPhases": recovery_phases(result.breakdown) if result.breakdown else {},
        "target": None
        if target is None
        else {
            "rank": target.rank,
            "name": target.name,
            "instanceId": target.instance_id,
            "node": target.node,
        },
        "timeline": [
            {"time": e.timestamp, "kind": e.kind, "detail": e.detail, **e.data}
            for e in result.timeline
        ],
        "progress": [{"time": t, "inc": inc, "step": step} for t, inc, step in result.progress],
    }
    if result.live is not None:
        doc["live"] = live_to_dict(result)
    if config is not None and config.projection is not None:
        doc["projection"] = _projection(doc, config)
    return doc


def _projection(doc: dict[str, Any], config: DrillConfig) -> dict[str, Any]:
    """The ``projection:`` block's figures, or why this drill's record cannot give them."""
    from pytest_recoverygate.engine.goodput import ProjectionError

    try:
        return project_config(doc, config).as_dict()
    except ProjectionError as exc:
        assert config.projection is not None
        return {"gpus": config.projection.gpus, "error": str(exc)}


def project_config(doc: dict[str, Any], config: DrillConfig) -> Projection:
    """The projection a config's ``projection:`` block asks for, from a report document."""
    from pytest_recoverygate.engine.goodput import inputs_from_report, project

    asked = config.projection
    assert asked is not None
    return project(
        inputs_from_report(doc),
        asked.gpus,
        mtbf_hours=asked.mtbf_hours,
        failures_per_gpu_hour=asked.failures_per_gpu_hour,
        interval=asked.interval,
    )


def evidence_to_dict(
    evidence: Evidence | None, files: dict[str, str] | None = None
) -> dict[str, Any]:
    """The report's keys for the job's output and the diagnoses.

    ``diagnoses`` (each ``signature``, ``title``, ``diagnosis``, ``evidence``, ``docs``),
    ``failingWorker`` and ``failingWorkerTail`` (its last lines), ``jobOutputNote`` (what
    the backend captures) and, with ``files``, ``jobOutput`` (worker -> file in the folder).
    """
    if evidence is None:
        return {}
    doc: dict[str, Any] = {"diagnoses": [d.as_dict() for d in evidence.diagnoses]}
    tail = evidence.failing_tail()
    doc["failingWorker"] = tail[0] if tail else None
    doc["failingWorkerTail"] = list(tail[1]) if tail else []
    if evidence.job_output is not None:
        doc["jobOutputNote"] = evidence.job_output.note
    if files is not None:
        doc["jobOutput"] = files
    return doc


def _write_job_output(evidence: Evidence | None, report_dir: Path) -> dict[str, str]:
    """``output/<worker>.log`` for every worker with output; worker -> relative path."""
    files: dict[str, str] = {}
    if evidence is None or evidence.job_output is None:
        return files
    used: set[str] = set()
    for worker in evidence.job_output.workers:
        if not worker.text:
            continue
        name, stem, number = worker.file_name, worker.file_name[:-4], 2
        while name in used:  # two labels that read the same as file names
            name, number = f"{stem}-{number}.log", number + 1
        used.add(name)
        write_private(report_dir / OUTPUT_FOLDER / name, worker.text, root=report_dir)
        files[worker.label] = f"{OUTPUT_FOLDER}/{name}"
    return files


def _append_step_summary(doc: dict[str, Any]) -> None:
    """Append the markdown summary to ``$GITHUB_STEP_SUMMARY``, if set; warn on failure."""
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary_file:
        return
    try:
        with open(summary_file, "a", encoding="utf-8") as handle:
            handle.write(markdown_summary(doc) + "\n")
    except OSError as exc:
        print(
            f"recoverygate: could not append the drill's summary to GITHUB_STEP_SUMMARY "
            f"({summary_file}): {exc}",
            file=sys.stderr,
        )


def write_private(path: Path, text: str | bytes, *, root: Path | None = None) -> None:
    """Write ``text`` atomically, owner-only (0600), through no planted link.

    ``root``: the report folder ``path`` is in; every folder between them is opened
    without following a link (see :func:`~pytest_recoverygate.shared.safefiles.write_safely`).
    Without it only the file's own name is protected (a link there is replaced).
    """
    base = path.parent if root is None else root
    write_safely(base, path.relative_to(base), text)


def write_reports(
    result: DrillResult,
    config: DrillConfig,
    report_path: Path | None,
    report_dir: Path | None,
    raw_log: list[dict[str, Any]],
    *,
    evidence: Evidence | None = None,
    transcript: str | None = None,
) -> list[Path]:
    """Write the JSON report (and, with a directory, the event log, the transcript,
    summary, picture and the job's output); append the summary to ``$GITHUB_STEP_SUMMARY``
    when it is set."""
    doc = {**result_to_dict(result, config), **evidence_to_dict(evidence)}
    text = json.dumps(doc, indent=2, default=str) + "\n"
    written: list[Path] = []
    if report_path is not None:
        write_private(report_path, text)
        written.append(report_path)
    if report_dir is not None:
        from pytest_recoverygate.report.timeline import PICTURE_HINT, write_timeline_picture

        with open_folder(report_dir):
            pass  # made owner-only when missing
        hint = PICTURE_HINT
        try:
            pictures = write_timeline_picture(doc, report_dir)
        except Exception as exc:  # a plotting failure must not cost the report
            pictures, hint = [], f"the picture could not be drawn ({describe_exception(exc)})"
        doc["timelinePicture"] = pictures[0].name if pictures else None
        if not pictures:
            doc["timelinePictureHint"] = hint
        pictures += _decision_pictures(doc, config, report_dir)
        files = _write_job_output(evidence, report_dir)
        doc.update(evidence_to_dict(evidence, files))
        doc["htmlReport"] = HTML_REPORT
        dir_text = json.dumps(doc, indent=2, default=str) + "\n"
        write_private(report_dir / "report.json", dir_text, root=report_dir)
        events = "".join(json.dumps(e, default=str) + "\n" for e in raw_log)
        write_private(report_dir / "events.jsonl", events, root=report_dir)
        if transcript is not None:  # every call into the engine: recoverygate rejudge
            write_private(report_dir / TRANSCRIPT, transcript, root=report_dir)
        write_private(report_dir / "summary.md", markdown_summary(doc), root=report_dir)
        try:
            write_html_report(report_dir, doc)
        except Exception as exc:  # a rendering failure must not cost the report
            del doc["htmlReport"]
            doc["htmlReportHint"] = f"report.html could not be rendered ({describe_exception(exc)})"
            write_private(
                report_dir / "report.json",
                json.dumps(doc, indent=2, default=str) + "\n",
                root=report_dir,
            )
            write_private(report_dir / "summary.md", markdown_summary(doc), root=report_dir)
            print(f"recoverygate: {doc['htmlReportHint']}", file=sys.stderr)
        written += [
            report_dir / "report.json",
            report_dir / "events.jsonl",
            *([report_dir / TRANSCRIPT] if transcript is not None else []),
            report_dir / "summary.md",
            *([report_dir / HTML_REPORT] if "htmlReport" in doc else []),
            *pictures,
            *(report_dir / path for path in files.values()),
        ]
    _append_step_summary(doc)
    return written


def write_html_report(report_dir: Path, doc: dict[str, Any] | None = None) -> Path:
    """Render ``report.html`` in a report folder from its own files: ``report.json`` (or
    ``doc``), ``timeline.svg`` and ``output/*.log`` (read as bytes, decoded with
    replacement characters). Works on any report folder, old ones too."""
    from pytest_recoverygate.report.html import render_report

    if doc is None:
        doc = json.loads(read_safely(report_dir, "report.json").decode("utf-8"))
    svg_name = Path(str(doc.get("timelinePicture") or "timeline.png")).with_suffix(".svg")
    svg_bytes = _read_in(report_dir, svg_name)
    svg = None if svg_bytes is None else svg_bytes.decode("utf-8", "replace")
    outputs: dict[str, str] = {}
    for label, relative in (doc.get("jobOutput") or {}).items():
        data = _read_in(report_dir, Path(str(relative)))
        if data is not None:
            outputs[str(label)] = data.decode("utf-8", "replace")
    files = sorted(
        p.relative_to(report_dir).as_posix()
        for p in report_dir.rglob("*")
        if p.is_file()
        and not p.is_symlink()
        and not p.name.startswith(".")
        and p.name != HTML_REPORT
    )
    path = report_dir / HTML_REPORT
    html = render_report(doc, timeline_svg=svg, outputs=outputs, files=files)
    write_private(path, html, root=report_dir)
    return path


def _read_in(report_dir: Path, relative: Path) -> bytes | None:
    """A file of the report folder, or None when missing or unsafe: a planted link, a FIFO,
    a hard link to another user's file (:func:`.safefiles.read_safely`), said on stderr."""
    if relative.is_absolute() or ".." in relative.parts:
        return None
    try:
        return read_safely(report_dir, relative)
    except UnsafeFile as exc:
        print(f"recoverygate: {report_dir}: not reading {exc.strerror}", file=sys.stderr)
        return None
    except OSError:
        return None


def _decision_pictures(doc: dict[str, Any], config: DrillConfig, report_dir: Path) -> list[Path]:
    """The spread picture (kills at two or more points of the interval) and, with a
    ``projection:`` block, the goodput picture."""
    from pytest_recoverygate.report.charts import write_goodput_picture, write_spread_picture

    drawn: list[Path] = []
    try:
        spread = write_spread_picture(doc, report_dir)
        doc["spreadPicture"] = spread[0].name if spread else None
        drawn += spread
        if config.projection is not None and "error" not in (doc.get("projection") or {}):
            goodput = write_goodput_picture(project_config(doc, config), report_dir)
            doc["goodputPicture"] = goodput[0].name if goodput else None
            drawn += goodput
    except Exception as exc:  # a plotting failure must not cost the report
        doc["pictureHint"] = f"a picture could not be drawn ({describe_exception(exc)})"
    return drawn


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _html_link(name: str) -> str:
    """The summary's pointer to the HTML report: a link with ``$RECOVERYGATE_REPORT_URL``
    (where the CI job uploads the folder), else the run's artifacts on GitHub Actions."""
    base = os.environ.get(REPORT_URL_ENV, "").strip()
    if base:
        return f"**[Open the HTML report]({base.rstrip('/')}/{name})** (`{name}`)"
    text = f"HTML report: `{name}` in the report folder"
    server, repo = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    run_id = os.environ.get("GITHUB_RUN_ID")
    if server and repo and run_id:
        text += f" ([this run's artifacts]({server}/{repo}/actions/runs/{run_id}#artifacts))"
    return text + "."


_MARKDOWN_SPECIAL = frozenset("\\`*_[]<>|~!")  # what means something mid-line
_LINE_START = re.compile(r"^(?=[#+=>-])")  # a heading, list or quote at the start
_ORDERED = re.compile(r"^(\d{1,9})(?=[.)])")  # an ordered list item at the start: 14. or 14)


def _md(value: Any, *, cell: bool = False) -> str:
    """``value`` as literal markdown text on one line: every character markdown gives a
    meaning to is escaped (no link, autolink, image, HTML, heading or code a job's text
    could make),
    ``&`` as an entity, line breaks as spaces, control characters made visible. A line
    that would start a block (a heading, a list, a quote) has its marker escaped; a
    table ``cell`` starts no block, so a number in it (``14.678``) is left as it is."""
    text = printable(str(value)).replace("\n", " ").replace("&", "&amp;")
    text = "".join(f"\\{c}" if c in _MARKDOWN_SPECIAL else c for c in text)
    text = text.replace("://", "\\://").replace("www.", "www\\.")  # no autolink either
    if cell:
        return text
    # A backslash escapes punctuation only: "14." becomes "14\." (a "\14." would show its
    # backslash, since a digit cannot be escaped).
    return _ORDERED.sub(lambda m: m.group(1) + "\\", _LINE_START.sub("\\\\", text))


def _code(value: Any) -> str:
    """``value`` as an inline code span on one line (a backtick in it becomes ``'``)."""
    return "`" + printable(str(value)).replace("\n", " ").replace("`", "'") + "`"


def _fence(lines: list[str]) -> str:
    """A code fence no line can close: backticks, one more than the longest run of them."""
    longest = max((len(run) for line in lines for run in re.findall("`+", line)), default=0)
    return "`" * max(3, longest + 1)


def markdown_summary(doc: dict[str, Any]) -> str:
    """A compact markdown summary of one drill (for GitHub's step summary).

    Text that may come from the job (the summary sentence, check messages, diagnoses, its
    output) is escaped (:func:`_md`) or fenced (:func:`_fence`): it shows as text, never
    as markdown of its own.
    """
    icon = {"PASS": "✅", "FAIL": "❌", "ERROR": "⚠️"}.get(doc["verdict"], "ℹ️")
    lines = [
        f"### {icon} RecoveryGate drill {_code(doc.get('drill'))}: {doc['verdict']}",
        "",
        _md(doc["summary"]),
        "",
        "| figure | value |",
        "| --- | --- |",
    ]
    keys: tuple[str, ...] = (
        "resumeStep",
        "expectedResumeStep",
        "lostSteps",
        "recoveryTimeSeconds",
        "maxRecoveryTimeSeconds",
        "restarts",
    )
    if doc.get("recoveryMode") == "live":
        keys = (
            "survivorStallSeconds",
            "rejoinTimeSeconds",
            "rejoinStep",
            "rejoinSource",
            "survivorsKeptTraining",
        )
    for key in keys:
        lines.append(f"| {key} | {_md(_fmt(doc.get(key)), cell=True)} |")
    breakdown = doc.get("breakdown") or {}
    if breakdown:
        lines += ["", "| recovery phase | seconds after the kill |", "| --- | --- |"]
        lines += [f"| {name} | {_fmt(value)} |" for name, value in breakdown.items()]
        lines += ["", "| phase (in the order they happen) | seconds |", "| --- | --- |"]
        took = recovery_phases(breakdown)
        lines += [f"| {label} | {_fmt(took[name])} |" for name, label, _ in RECOVERY_PHASES]
    if doc.get("htmlReport"):
        lines += ["", _html_link(doc["htmlReport"])]
    if doc.get("timelinePicture"):
        lines += ["", f"Timeline picture: `{doc['timelinePicture']}` (next to this summary)."]
    elif doc.get("timelinePictureHint"):
        lines += ["", f"No timeline picture: {_md(doc['timelinePictureHint'])}."]
    refused = [e for e in doc.get("timeline") or [] if e.get("kind") == "refused"]
    if refused:
        lines += ["", "**Job files the drill refused to read**", ""]
        lines += [f"- {_md(e.get('detail'))}" for e in refused]
    failed = [c for c in doc.get("checks", []) if c["passed"] is False]
    undecided = [c for c in doc.get("checks", []) if c["passed"] is None]
    if undecided:
        lines += ["", "**Undecided checks** (the evidence cannot decide)", ""]
        lines += [f"- `{c['name']}`: {_md(c['message'])}" for c in undecided]
    if failed:
        lines += ["", "**Failed checks**", ""]
        lines += [
            f"- `{c['name']}`: {_md(c['message'])} (expected "
            f"{_md(plain_value(c['expected']), cell=True)}, observed "
            f"{_md(plain_value(c['observed']), cell=True)})"
            for c in failed
        ]
    for diagnosis in doc.get("diagnoses") or []:
        lines += [
            "",
            f"**Diagnosis: {diagnosis['title']}** ([why and how to fix]({diagnosis['docs']}))",
            "",
            _md(diagnosis["diagnosis"]),
            "",
            f"Evidence: {_md(diagnosis['evidence'])}",
        ]
    tail = doc.get("failingWorkerTail") or []
    if tail and doc.get("verdict") in ("FAIL", "ERROR"):
        where = (doc.get("jobOutput") or {}).get(doc.get("failingWorker"))
        whole = f" (whole output: {_code(where)})" if where else ""
        shown = [printable(line) for line in tail]
        fence = _fence(shown)
        lines += [
            "",
            f"**Last lines of {_md(doc.get('failingWorker'))}**{whole}",
            "",
            fence,
            *shown,
            fence,
        ]
    return "\n".join(lines) + "\n"
