"""Render a ``run_all.py --json`` document as the Markdown tables of RESULTS.md.

``python bench/markdown.py results.json``: the machine, one table of every target, the
notes of every figure, and the scale table (16 to 4,096 pods).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    number = float(value)
    if number == 0:
        return "0"
    if abs(number) >= 1000:
        return f"{number:,.0f}"
    if abs(number) >= 10:
        return f"{number:.1f}"
    if abs(number) >= 0.1:
        return f"{number:.3f}"
    return f"{number:.2g}"


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    out = [
        f"- machine: {m['nproc']} CPUs ({m['cpu']}), Python {m['python']}, {m['platform']}",
        f"- finished {m['date']}, load average then {m['loadavg']}"
        + (" (quick mode)" if doc.get("quick") else ""),
        "",
        "| benchmark | target | measured | limit | ratio | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for bench in doc["benchmarks"]:
        for r in bench["results"]:
            if r["passed"] is None:
                continue
            verdict = "pass" if r["passed"] else "**MISS**"
            name = r["name"].replace("|", "\\|")
            out.append(
                f"| {bench['bench']} | {name} | {_num(r['measured'])} {r['unit']} | "
                f"{r['op']} {_num(r['limit'])} | {_num(r['ratio'])} | {verdict} |"
            )
    for bench in doc["benchmarks"]:
        out += [
            "",
            f"### {bench['bench']} ({bench['seconds']} s, load at the end "
            f"{bench['machine']['loadavg']})",
            "",
        ]
        for r in bench["results"]:
            tag = "info" if r["passed"] is None else ("pass" if r["passed"] else "MISS")
            limit = "" if r["limit"] is None else f" (limit {r['op']} {_num(r['limit'])})"
            note = f" — {r['note']}" if r["note"] else ""
            out.append(
                f"- [{tag}] {r['name'].strip()}: {_num(r['measured'])} {r['unit']}{limit}{note}"
            )
        if bench["bench"] == "scale":
            rows = [
                r["extra"]
                for r in bench["results"]
                if r["passed"] is None and "nodes" in r.get("extra", {})
            ]
            out += [
                "",
                "| pods | verdict | drill CPU s | discovery CPU s | kill→verdict CPU s "
                "| kill→verdict wall s | peak RSS MiB | fake server CPU s |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for e in rows:
                out.append(
                    f"| {e['nodes']:,} | {e['verdict']} | {e['cpu_s']:.3f} | "
                    f"{e['discover_cpu_s']:.3f} | {e['recover_cpu_s']:.3f} | "
                    f"{e['recover_wall_s']:.3f} | {e['maxrss_mib']:.0f} | "
                    f"{e['server_cpu_s']:.2f} |"
                )
    return "\n".join(out)


if __name__ == "__main__":
    print(render(json.loads(Path(sys.argv[1]).read_text())))
