"""``report.html``: one drill on one self-contained page.

The page is rendered from the report document (``report.json``), the timeline picture's
SVG text and the job's output, and nothing else: no network, no script, no external
style or font (a Content-Security-Policy meta tag forbids all of them, so even a mistake
here could not load or run anything). Order: the verdict first, then the summary, the
timeline (inline SVG), the recovery breakdown, every check with expected and observed,
the costs, the diagnoses, every recovery of a ``count: N`` drill, the job's output tails
and the files of the folder. Everything that comes from the job or the report is escaped
(:func:`html.escape`); job output is decoded with replacement characters, and a huge line
is cut with a marker saying how much was left out. ``@media print`` keeps it printable.

Pure: strings in, a string out; :func:`pytest_recoverygate.report.files.write_html_report`
reads the folder and writes the page.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "HTML_FILE",
    "OUTPUT_LINE_LIMIT",
    "OUTPUT_TAIL_LINES",
    "plain_value",
    "render_report",
    "svg_for_inline",
]

HTML_FILE = "report.html"
OUTPUT_TAIL_LINES = 120  # lines of each worker's output on the page (the folder has it all)
OUTPUT_LINE_LIMIT = 2000  # characters of one output line on the page

_VERDICT_COLORS = {"PASS": "#1a7f37", "FAIL": "#cf222e", "ERROR": "#9a6700"}

_CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
  margin: 0 auto; padding: 24px; max-width: 1100px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid var(--line);
  padding-bottom: 4px; }
h3 { font-size: 14px; margin: 16px 0 6px; }
.verdict { border-radius: 8px; padding: 14px 18px; color: #fff; }
.verdict .big { font-size: 30px; font-weight: 700; letter-spacing: 1px; }
.verdict p { margin: 4px 0 0; font-size: 16px; }
.meta { color: var(--muted); margin: 8px 0 0; }
table { border-collapse: collapse; width: 100%; margin: 4px 0; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line);
  vertical-align: top; overflow-wrap: break-word; }
td:last-child { width: auto; } td.bars { width: 40%; }
th { background: var(--bg); font-weight: 600; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
.ok { color: #1a7f37; font-weight: 600; } .fail { color: #cf222e; font-weight: 700; }
.undecided { color: #9a6700; font-weight: 700; }
.unchecked { color: #57606a; font-style: italic; }
.bar { height: 12px; background: #0969da; border-radius: 2px; min-width: 1px; }
.figure svg { width: 100%; height: auto; border: 1px solid var(--line); }
pre { background: var(--bg); border: 1px solid var(--line); padding: 8px; font-size: 12px;
  line-height: 1.35; white-space: pre-wrap; overflow-wrap: anywhere; max-height: 480px;
  overflow: auto; }
.cut { color: var(--muted); font-style: italic; }
.diagnosis { border-left: 4px solid #cf222e; padding: 4px 12px; background: #fff8f8; }
.note { color: var(--muted); }
@media print {
  body { padding: 0; max-width: none; font-size: 11px; }
  .verdict { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  pre { max-height: none; overflow: visible; }
  h2 { break-after: avoid; } table, .figure, .diagnosis { break-inside: avoid; }
}
"""

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _e(value: Any) -> str:
    """A value as escaped text (None as a dash)."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}"
    return html.escape(str(value), quote=True)


#: How deep :func:`plain_value` spells out nested mappings and lists (a report is input).
_PLAIN_DEPTH = 4


def plain_value(value: Any, depth: int = 0) -> str:
    """A check's expected or observed value as words, not Python's repr: a mapping as
    ``key value, key value`` (nested ones in parentheses), a list comma-separated, a
    number as the report holds it (every digit), None as a dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if depth >= _PLAIN_DEPTH and isinstance(value, Mapping | list | tuple):
        return "…"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k} {plain_value(v, depth + 1)}" for k, v in value.items())
        return f"({inner})" if depth else inner
    if isinstance(value, list | tuple):
        inner = ", ".join(plain_value(v, depth + 1) for v in value)
        return f"[{inner}]" if depth else inner
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _seconds(value: Any) -> str:
    return (
        f"{value:.3f}s" if isinstance(value, int | float) and not isinstance(value, bool) else "—"
    )


def _check_status(check: Mapping[str, Any]) -> str:
    """A check's state: ok, FAIL, undecided, or not checked (``checked: false``; reports
    written before that field read as before)."""
    if check.get("checked") is False:
        return '<span class="unchecked">not checked</span>'
    passed = check.get("passed")
    if passed is True:
        return '<span class="ok">ok</span>'
    if passed is False:
        return '<span class="fail">FAIL</span>'
    return '<span class="undecided">undecided</span>'


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A table from cells that are already HTML."""
    out = ["<table><thead><tr>", *(f"<th>{h}</th>" for h in head), "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>")
        out += [
            f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
            for i, c in enumerate(row)
        ]
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


_PROLOG = re.compile(r"^\s*(<\?xml[^>]*\?>\s*)?(<!DOCTYPE[^>]*>\s*)?", re.IGNORECASE)


def svg_for_inline(svg: str) -> str | None:
    """The SVG document without its XML prolog and doctype, ready to sit in the page; None
    when it is not an SVG or holds anything active (a script, an event handler, a link
    out), which matplotlib's never does."""
    body = _PROLOG.sub("", svg, count=1)
    if not body.lstrip().startswith("<svg"):
        return None
    if re.search(r"<script|<foreignObject|\son\w+\s*=|href\s*=\s*[\"'](?!#)", body, re.IGNORECASE):
        return None
    return body


def _output_tail(text: str) -> str:
    """The last lines of one worker's output, escaped, huge lines cut visibly."""
    lines = text.splitlines()
    out: list[str] = []
    if len(lines) > OUTPUT_TAIL_LINES:
        out.append(
            f'<span class="cut">[{len(lines) - OUTPUT_TAIL_LINES} earlier line(s) are in the '
            "file]</span>"
        )
        lines = lines[-OUTPUT_TAIL_LINES:]
    for line in lines:
        if len(line) > OUTPUT_LINE_LIMIT:
            more = len(line) - OUTPUT_LINE_LIMIT
            out.append(
                html.escape(line[:OUTPUT_LINE_LIMIT])
                + f'<span class="cut"> … [line cut here: {more} more characters in the file]'
                "</span>"
            )
        else:
            out.append(html.escape(line))
    return "\n".join(out)


def _verdict_block(doc: Mapping[str, Any]) -> str:
    verdict = str(doc.get("verdict"))
    color = _VERDICT_COLORS.get(verdict, "#59636e")
    return (
        f'<section class="verdict" style="background:{color}">'
        f'<div class="big">{_e(verdict)}</div><p>{_e(doc.get("summary"))}</p></section>'
    )


def _summary(doc: Mapping[str, Any]) -> str:
    target = doc.get("target") or {}
    lost = _e(doc.get("lostSteps"))
    bound = doc.get("lostStepsUpperBound")
    if bound is not None and bound != doc.get("lostSteps"):
        lost += f" (up to {_e(bound)})"
    rows = [
        [
            "resume step",
            f"{_e(doc.get('resumeStep'))} (expected {_e(doc.get('expectedResumeStep'))})",
        ],
        [
            "recovery time",
            f"{_seconds(doc.get('recoveryTimeSeconds'))} "
            f"(SLO {_seconds(doc.get('maxRecoveryTimeSeconds'))})",
        ],
        ["lost steps", lost],
        ["restarts", _e(doc.get("restarts"))],
        ["trigger checkpoint", _e(doc.get("triggerCheckpoint"))],
        [
            "target",
            _e(
                f"rank {target.get('rank')} ({target.get('name')} on {target.get('node')}, "
                f"instance {target.get('instanceId')})"
                if target
                else None
            ),
        ],
        ["backend", _e(doc.get("orchestrator"))],
        ["config", _e(doc.get("config"))],
    ]
    notes = "".join(f"<li>{_e(n)}</li>" for n in doc.get("notes") or [])
    return _table(["figure", "value"], rows) + (f'<ul class="note">{notes}</ul>' if notes else "")


def _breakdown(doc: Mapping[str, Any]) -> str:
    breakdown = doc.get("breakdown") or {}
    if not breakdown:
        return '<p class="note">No recovery breakdown (the drill did not get that far).</p>'
    numbers = [v for v in breakdown.values() if isinstance(v, int | float)]
    span = max([*numbers, doc.get("recoveryTimeSeconds") or 0.0, 1e-9])
    rows: list[list[str]] = []
    previous = 0.0
    for phase, at in breakdown.items():
        if isinstance(at, int | float):
            took, previous_at = max(at - previous, 0.0), previous
            previous = at
            bar = (
                f'<div style="margin-left:{100 * previous_at / span:.1f}%;'
                f'width:{100 * took / span:.1f}%" class="bar"></div>'
            )
            rows.append([_e(phase), _seconds(at), f"+{took:.3f}s", bar])
        else:
            rows.append([_e(phase), "unknown", "—", ""])
    return _table(
        ["phase", "after the kill", "took", f'<span class="note">0 … {span:.2f}s</span>'],
        rows,
        numeric=(1, 2),
    ).replace('<td><div style="margin', '<td class="bars"><div style="margin')


def _checks(checks: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            f"<code>{_e(c.get('name'))}</code>",
            _check_status(c),
            _e(plain_value(c.get("expected"))),
            _e(plain_value(c.get("observed"))),
            _e(c.get("message")),
        ]
        for c in checks
    ]
    if not rows:
        return '<p class="note">No checks were decided.</p>'
    return _table(["check", "result", "expected", "observed", "message"], rows)


def _replay_mark(row: Mapping[str, Any], first: Any, mode: Any) -> str:
    """A compared step's mark: the first divergent, another that did not match (outside
    the tolerance, or its data differs), or none (it matched)."""
    if row.get("step") == first:
        return "<b>first divergent</b>"
    matches = row.get("matches")  # reports before it: the values as printed
    if matches is None:
        matches = repr(row.get("killed")) == repr(row.get("replacement"))
    if matches:
        return ""
    return "outside the tolerance" if mode == "tolerance" else "differs"


def _replay(doc: Mapping[str, Any]) -> list[str]:
    """expectations.replay: each recovery's compared steps, the two runs side by side."""
    out: list[str] = []
    for recovery in doc.get("recoveries") or []:
        replay = recovery.get("replay") or {}
        if not replay.get("steps"):
            continue
        first = replay.get("firstDivergentStep")
        rows = [
            [
                _e(row.get("step")),
                _e(plain_value(row.get("killed"))),  # every digit: they decide
                _e(plain_value(row.get("replacement"))),
                _e(row.get("killedData", "")),
                _e(row.get("replacementData", "")),
                _replay_mark(row, first, replay.get("mode")),
            ]
            for row in replay["steps"]
        ]
        out.append(
            f"<p>recovery {_e(recovery.get('index'))}: {_e(replay.get('mode'))}, "
            f"{_e(replay.get('stepsCompared'))} steps compared, first divergent step "
            f"{_e(first)}, max abs diff {_e(plain_value(replay.get('maxAbsDiff')))}, max rel "
            f"diff {_e(plain_value(replay.get('maxRelDiff')))}</p>"
        )
        out.append(
            _table(
                ["step", "killed run", "replacement", "killed data", "replacement data", ""],
                rows,
                numeric=(0, 1, 2),
            )
        )
    return ["<h2>Replay</h2>", *out] if out else []


def _costs(doc: Mapping[str, Any]) -> str:
    costs = doc.get("costs") or {}
    rows: list[list[str]] = []
    for key, value in costs.items():
        if key in ("perKill", "missing"):
            continue
        if isinstance(value, Mapping):
            shown = ", ".join(f"{k} {_e(v)}" for k, v in value.items())
            rows.append([_e(key), shown])
        else:
            rows.append([_e(key), _e(value)])
    missing = costs.get("missing") or {}
    rows += [[_e(f"missing: {k}"), _e(v)] for k, v in missing.items()]
    if not rows:
        return '<p class="note">No costs were measured.</p>'
    return _table(["cost", "value"], rows)


def _diagnoses(doc: Mapping[str, Any]) -> str:
    found = doc.get("diagnoses") or []
    if not found:
        return '<p class="note">No known failure signature in the job\'s output.</p>'
    parts = []
    for d in found:
        docs = str(d.get("docs") or "")
        link = (
            f' (<a href="{_e(docs)}">why and how to fix</a>)'
            if docs.startswith(("https://", "http://", "docs/"))
            else ""
        )
        parts.append(
            f'<div class="diagnosis"><h3>{_e(d.get("title"))}{link}</h3>'
            f"<p>{_e(d.get('diagnosis'))}</p><p>Evidence: <code>{_e(d.get('evidence'))}</code>"
            "</p></div>"
        )
    return "".join(parts)


def _recoveries(doc: Mapping[str, Any]) -> str:
    recoveries = doc.get("recoveries") or []
    rows = []
    for r in recoveries:
        failed = [c for c in r.get("checks") or [] if c.get("passed") is not True]
        rows.append(
            [
                _e(r.get("index")),
                _e(r.get("fault")),
                _e(r.get("verdict")),
                _e(r.get("triggerCheckpoint")),
                f"{_e(r.get('resumeStep'))} / {_e(r.get('expectedResumeStep'))}",
                _e(r.get("lostSteps")),
                _seconds(r.get("recoveryTimeSeconds")),
                _e(r.get("summary"))
                + "".join(
                    f"<br>{_check_status(c)} <code>{_e(c.get('name'))}</code>: "
                    f"{_e(c.get('message'))}"
                    for c in failed
                ),
            ]
        )
    return _table(
        [
            "#",
            "fault",
            "verdict",
            "after checkpoint",
            "resumed / expected",
            "lost steps",
            "recovery",
            "summary",
        ],
        rows,
        numeric=(0, 3, 5, 6),
    )


def _outputs(doc: Mapping[str, Any], outputs: Mapping[str, str]) -> str:
    if not outputs:
        note = doc.get("jobOutputNote") or "no output of the job was captured"
        return f'<p class="note">{_e(note)}</p>'
    files = doc.get("jobOutput") or {}
    failing = doc.get("failingWorker")
    order = sorted(outputs, key=lambda label: (label != failing, label))
    parts = []
    for label in order:
        where = files.get(label)
        link = f' — whole output: <a href="{_e(where)}">{_e(where)}</a>' if where else ""
        mark = " (the failing worker)" if label == failing else ""
        parts.append(f"<h3>{_e(label)}{mark}{link}</h3><pre>{_output_tail(outputs[label])}</pre>")
    return "".join(parts)


def _files(doc: Mapping[str, Any], files: Sequence[str]) -> str:
    if not files:
        return ""
    items = "".join(f'<li><a href="{_e(f)}">{_e(f)}</a></li>' for f in files)
    return f"<h2>Files of this report</h2><ul>{items}</ul>"


def render_report(
    doc: Mapping[str, Any],
    *,
    timeline_svg: str | None = None,
    outputs: Mapping[str, str] | None = None,
    files: Sequence[str] = (),
) -> str:
    """The whole page. ``outputs`` maps a worker's label to its output (decoded text);
    ``files`` are the folder's files to link (relative paths)."""
    verdict = str(doc.get("verdict"))
    drill = doc.get("drill") or "drill"
    started = doc.get("startedAt")
    when = ""
    if isinstance(started, int | float):
        import datetime

        stamp = datetime.datetime.fromtimestamp(started, tz=datetime.timezone.utc)
        when = f" · started {stamp.strftime('%Y-%m-%d %H:%M:%S')} UTC"
        finished = doc.get("finishedAt")
        if isinstance(finished, int | float):
            when += f" · took {finished - started:.1f}s"
    svg = svg_for_inline(timeline_svg) if timeline_svg else None
    if svg is not None:
        timeline = f'<div class="figure">{svg}</div>'
    else:
        hint = doc.get("timelinePictureHint") or "no timeline picture was drawn"
        timeline = f'<p class="note">{_e(hint)}</p>'
    sections = [
        _verdict_block(doc),
        f'<p class="meta">drill <b>{_e(drill)}</b> on {_e(doc.get("orchestrator"))}{when}</p>',
        "<h2>Summary</h2>",
        _summary(doc),
        "<h2>Timeline</h2>",
        timeline,
        "<h2>Recovery breakdown</h2>",
        _breakdown(doc),
        "<h2>Checks</h2>",
        _checks(doc.get("checks") or []),
        *_replay(doc),
        "<h2>Costs of a failure</h2>",
        _costs(doc),
        "<h2>Diagnosis</h2>",
        _diagnoses(doc),
    ]
    if len(doc.get("recoveries") or []) > 1:
        sections += [f"<h2>Every recovery ({len(doc['recoveries'])})</h2>", _recoveries(doc)]
    sections += ["<h2>Job output (last lines)</h2>", _outputs(doc, outputs or {})]
    sections.append(_files(doc, files))
    title = f"{verdict} · RecoveryGate drill {drill}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(sections)
        + "</body></html>\n"
    )
