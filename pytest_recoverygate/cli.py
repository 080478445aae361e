"""``recoverygate`` (and ``kubectl recoverygate``): a thin shell over the runner.

Exit codes: 0 PASS (or a clean dry run), 1 FAIL, 2 invalid config or usage, 3 ERROR
(the drill could not run), 130 interrupted (after cleanup); ``rejudge`` exits with the
verdict it replays (an interrupted drill's as 3) and 2 on a transcript it cannot use.
Heavy modules (pydantic, the backends) are imported only after the arguments are parsed,
so ``--help`` is fast and never imports kubernetes or torch.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypeAlias

from recoverygate import __version__

from pytest_recoverygate.engine.verdict import EXIT_CODES, EXIT_USAGE, Verdict
from pytest_recoverygate.links import docs_link
from pytest_recoverygate.report.terminal import print_result, shorten
from pytest_recoverygate.shared.jobtext import printable

if TYPE_CHECKING:
    from pytest_recoverygate.config.schema import DrillConfig
    from pytest_recoverygate.engine.model import Worker, Workload
    from pytest_recoverygate.report.evidence import Evidence
    from pytest_recoverygate.runner import Status

__all__ = [
    "DESCRIPTION",
    "EPILOG",
    "LiveStatus",
    "compare_command",
    "explain_command",
    "goodput_command",
    "history_command",
    "kubectl_main",
    "main",
    "print_effective_config",
    "print_result",
    "rejudge_command",
    "shorten",
    "sweep_command",
]

#: The exit codes, from the one table (:data:`pytest_recoverygate.engine.verdict.EXIT_CODES`).
EXIT_PASS = EXIT_CODES[Verdict.PASS]
EXIT_ERROR = EXIT_CODES[Verdict.ERROR]
EXIT_INTERRUPTED = EXIT_CODES[Verdict.INTERRUPTED]

DESCRIPTION = (
    "Chaos drills for distributed training: kill one worker of a running job and prove it "
    "resumes from its latest checkpoint within the recovery SLO."
)
EPILOG = (
    "exit codes: 0 PASS (or dry run), 1 FAIL, 2 invalid config or usage, "
    "3 ERROR (the drill could not run), 130 interrupted"
)


def _switch(parser: argparse.ArgumentParser, *names: str, help: str) -> None:
    """An option that takes no value: true when given."""
    parser.add_argument(*names, action="store_true", help=help)


#: The subcommands of the parser (argparse names the type privately).
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _run_parser(sub)
    _goodput_parser(sub)
    _compare_parser(sub)
    _history_parser(sub)
    _explain_parser(sub)
    _rejudge_parser(sub)
    sweep = sub.add_parser(
        "sweep",
        help="remove what a SIGKILLed drill left behind",
        description="Find the owner records of drills that no longer run (a drill "
        "SIGKILLed, or killed by the OOM killer, cannot clean up) and remove what each "
        "left: a local multi-node drill's processes in its network namespaces, the "
        f"namespaces and its folder ({docs_link('nodes.md')}); a StorageFault's mount over "
        "the checkpoint folder and its layer process (faults.md); a StickyFault's poison "
        "file; a Slurm job a drill submitted (workload.script), cancelled if it still "
        f"carries that drill's mark ({docs_link('slurm.md')}). A running drill's, and "
        "what no record names, are left alone.",
        epilog="exit codes: 0 nothing left behind, 3 something could not be removed",
    )
    _switch(sweep, "--dry-run", help="only say what would be removed")
    return parser


def _run_parser(sub: Commands) -> None:
    run = sub.add_parser(
        "run", help="run a drill", description="Run the drill a config describes.", epilog=EPILOG
    )
    run.add_argument("-f", "--file", required=True, type=Path, help="recovery-test.yaml")
    _switch(run, "--dry-run", help="run the whole flow minus the kill; issue no destructive call")
    _switch(
        run,
        "--yes",
        "-y",
        help="confirm the kill without asking (needed when not on a terminal "
        "and safety.requireConfirm is true)",
    )
    run.add_argument("--report", type=Path, metavar="PATH", help="write the JSON report here")
    run.add_argument(
        "--report-dir",
        type=Path,
        metavar="DIR",
        help="write report.json, events.jsonl, summary.md and the timeline picture into DIR",
    )
    _switch(run, "-q", "--quiet", help="no live progress; print only the verdict block")
    validate = sub.add_parser("validate", help="check a config without touching anything")
    validate.add_argument("-f", "--file", required=True, type=Path, help="recovery-test.yaml")


def _goodput_parser(sub: Commands) -> None:
    goodput = sub.add_parser(
        "goodput",
        help="project a drill's measured failure cost to a large run",
        description="From a drill's report.json (its measured step time, checkpoint "
        "interval, save stall and recovery time), the expected goodput of the job at a "
        "scale and the checkpoint interval that maximises it (" + docs_link("goodput.md") + ").",
    )
    goodput.add_argument("report", type=Path, help="a drill's report.json")
    goodput.add_argument("--gpus", type=int, required=True, help="GPUs of the projected run")
    rate = goodput.add_mutually_exclusive_group()
    rate.add_argument(
        "--mtbf-hours",
        type=float,
        metavar="H",
        help="mean time between failures of the whole job at that scale",
    )
    rate.add_argument(
        "--failures-per-gpu-hour",
        type=float,
        metavar="F",
        help="failures per GPU-hour (default: Llama 3 405B's, 419 in 54 days on 16,384 GPUs)",
    )
    goodput.add_argument(
        "--interval",
        metavar="DURATION|Nsteps",
        help="also evaluate this checkpoint interval (e.g. 30m, 500steps)",
    )
    goodput.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="write goodput.png/.svg (goodput against the interval) here",
    )


def _compare_parser(sub: Commands) -> None:
    compare = sub.add_parser(
        "compare",
        help="compare a drill's figures with a baseline report",
        description="Figure by figure (recovery time and each phase, lost steps, lost "
        "work, save stall, step time): base, new, change. Exit 1 when the verdict "
        "regressed (base PASS, new FAIL or ERROR) and, with --max-regression, when a figure "
        f"got worse than its allowance ({docs_link('reports.md')}).",
        epilog="exit codes: 0 no regression, 1 the verdict regressed or a figure regressed "
        "beyond its allowance, 2 bad input (a missing file, no drill report, an unknown "
        "figure or allowance)",
    )
    compare.add_argument("base", type=Path, help="the baseline: a report.json or report folder")
    compare.add_argument("new", type=Path, help="the new run: a report.json or report folder")
    compare.add_argument(
        "--max-regression",
        action="append",
        default=[],
        metavar="FIG=ALLOW,...",
        help="allowances, e.g. recoveryTime=20%%,lostSteps=0,checkpointLoaded=2s (repeatable)",
    )
    _switch(
        compare,
        "--strict",
        help="refuse to compare reports of different drills or backends (exit 2)",
    )
    _switch(compare, "--markdown", help="print the table as markdown (for a CI comment)")


def _history_parser(sub: Commands) -> None:
    history = sub.add_parser(
        "history",
        help="draw the trend of many runs of a drill",
        description="From report folders (each a --report-dir folder, or a folder of "
        "them): OUT/history.png and .svg (recovery time stacked by phase, lost steps, the "
        "SLO, failures marked) and OUT/history.md.",
    )
    history.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="report folders")
    history.add_argument("-o", "--output", type=Path, required=True, metavar="OUT")
    _switch(
        history,
        "--by-start",
        help="order the runs by their start time (default: in the order given)",
    )
    history.add_argument(
        "--drill", metavar="NAME", help="only this drill's reports (when the folders hold several)"
    )


def _explain_parser(sub: Commands) -> None:
    explain = sub.add_parser(
        "explain",
        help="name the rule that decided each check of a drill's report",
        description="For each check of a drill's report.json: its outcome, the rule of "
        "the verdict that decided it and the condition that rule holds the evidence to "
        f"({docs_link('verdict-rules.md')}).",
        epilog="exit codes: 0 explained, 2 bad input (a missing file, not JSON, no drill report)",
    )
    explain.add_argument("report", type=Path, help="a drill's report.json (or its folder)")


def _rejudge_parser(sub: Commands) -> None:
    rejudge = sub.add_parser(
        "rejudge",
        help="judge a drill again from its transcript, without running it",
        description="Replay a drill's transcript.jsonl (every call the drill made into the "
        "engine) through a fresh engine with no clock, and print the verdict, the checks and "
        "the differences from the report the drill wrote; with -f, under that config's "
        f"expectations instead ({docs_link('reports.md')}).",
        epilog="exit codes: 0 PASS (or dry run), 1 FAIL, 3 ERROR (an interrupted drill's "
        "too), 2 bad input (a missing or malformed transcript, another version, an invalid "
        "config)",
    )
    rejudge.add_argument(
        "transcript",
        type=Path,
        metavar="REPORT_DIR|transcript.jsonl",
        help="a report folder (--report-dir) or its transcript.jsonl",
    )
    rejudge.add_argument(
        "-f",
        "--file",
        type=Path,
        metavar="recovery-test.yaml",
        help="judge under this config's expectations (maxRecoveryTime, maxLostSteps, replay, "
        "sustain, ...); the fault, trigger and job stay the transcript's",
    )
    _switch(rejudge, "--json", help="print the rejudged report and the differences as JSON")


#: What reading a report that is not one raises (a field of another type, a value that
#: is no number): bad input, exit 2, never a traceback.
_SHAPE_ERRORS = (TypeError, ValueError, AttributeError, KeyError, RecursionError, OverflowError)


def _misshapen(exc: BaseException) -> str:
    return (
        f"this JSON is no report recoverygate wrote ({type(exc).__name__}: {exc}); give the "
        "report.json that recoverygate run --report/--report-dir wrote"
    )


def compare_command(args: argparse.Namespace, name: str) -> int:
    """``recoverygate compare BASE NEW``: the table; 1 when the verdict or a figure
    regressed."""
    from pytest_recoverygate.errors import BaselineError
    from pytest_recoverygate.report import compare as baseline

    try:
        allowances = {}
        for text in args.max_regression:
            allowances.update(baseline.parse_allowances(text, "--max-regression"))
        base = baseline.load_report(args.base, "BASE")
        new = baseline.load_report(args.new, "NEW")
        comparison = baseline.compare(base, new, allowances, base_name="base", new_name="new")
        table = baseline.format_table(comparison, markdown=args.markdown)
    except BaselineError as exc:
        print(printable(f"{name} compare: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except _SHAPE_ERRORS as exc:  # a JSON crafted past load_report's checks
        print(printable(f"{name} compare: {_misshapen(exc)}"), file=sys.stderr)
        return EXIT_USAGE
    for warning in map(printable, comparison.warnings):  # the reports' own text
        if args.strict:
            print(f"{name} compare: {warning}; refused (--strict)", file=sys.stderr)
            return EXIT_USAGE
        print(f"{name} compare: warning: {warning}", file=sys.stderr)
    print(printable(f"base: {args.base}\nnew:  {args.new}"))
    print(table)
    regressed = comparison.regressed or comparison.verdict_regressed
    return EXIT_CODES[Verdict.FAIL] if regressed else EXIT_PASS


def sweep_command(args: argparse.Namespace, name: str) -> int:
    """``recoverygate sweep``: what dead drills left (a multi-node drill's namespaces, a
    StorageFault's mount, a StickyFault's poison, a Slurm job a drill submitted), removed
    (or listed)."""
    from pytest_recoverygate.errors import DrillError
    from pytest_recoverygate.orchestrators.local.sweep import sweep
    from pytest_recoverygate.orchestrators.slurm.submit import sweep as sweep_slurm_jobs
    from pytest_recoverygate.storage.layer import sweep as sweep_storage
    from pytest_recoverygate.storage.poison import sweep as sweep_poison

    try:
        report = sweep(dry_run=args.dry_run)
        storage = sweep_storage(dry_run=args.dry_run)
        poison = sweep_poison(dry_run=args.dry_run)
        jobs = sweep_slurm_jobs(dry_run=args.dry_run)
    except (DrillError, OSError) as exc:
        print(printable(f"{name} sweep: {exc}"), file=sys.stderr)
        return EXIT_ERROR
    nothing = [line for line in report.lines if line.startswith("nothing to sweep")]
    lines = [line for line in report.lines if line not in nothing]
    lines += storage.lines + poison.lines + jobs.lines
    for line in lines or nothing:
        print(printable(line))
    if report.problems or storage.problems or poison.problems or jobs.problems:
        print(f"{name} sweep: not everything could be removed (see above)", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_PASS


def explain_command(args: argparse.Namespace, name: str) -> int:
    """``recoverygate explain REPORT.json``: each check's rule and its condition."""
    from pytest_recoverygate.errors import BaselineError
    from pytest_recoverygate.report.explain import explain_report

    try:
        lines = explain_report(args.report)
    except BaselineError as exc:
        print(printable(f"{name} explain: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except _SHAPE_ERRORS as exc:  # a JSON crafted past load_report's checks
        print(printable(f"{name} explain: {_misshapen(exc)}"), file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(lines))
    return EXIT_PASS


def rejudge_command(args: argparse.Namespace, name: str) -> int:
    """``recoverygate rejudge REPORT_DIR|transcript.jsonl [-f CONFIG] [--json]``: the
    verdict replayed from the transcript; its exit code is the verdict's."""
    import json

    from pytest_recoverygate.errors import ConfigError, TranscriptError
    from pytest_recoverygate.transcript.rejudge import as_json, rejudge, text_lines

    other = None
    if args.file is not None:
        from pytest_recoverygate.config.loading import load_config
        from pytest_recoverygate.config.schema import spec_from_config

        try:
            other = spec_from_config(load_config(args.file))
        except ConfigError as exc:
            print(f"{name} rejudge: invalid config:\n{exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        judged = rejudge(args.transcript, other)
    except TranscriptError as exc:
        print(printable(f"{name} rejudge: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except _SHAPE_ERRORS as exc:  # a transcript crafted past the reader's checks
        print(
            printable(f"{name} rejudge: {args.transcript}: this is no transcript recoverygate "
                      f"wrote ({type(exc).__name__}: {exc})"),
            file=sys.stderr,
        )  # fmt: skip
        return EXIT_USAGE
    if args.json:
        print(json.dumps(as_json(judged, args.file), indent=2, default=str))
        return judged.exit_code
    head, tail = text_lines(judged, args.file)
    print(printable("\n".join(head)))
    print_result(judged.result, sys.stdout)
    print(printable("\n".join(tail)))
    return judged.exit_code


def history_command(args: argparse.Namespace, name: str) -> int:
    """``recoverygate history DIR... -o OUT``: the trend picture and table."""
    from pytest_recoverygate.errors import BaselineError
    from pytest_recoverygate.report.history import collect_runs, write_history

    try:
        runs = collect_runs(args.dirs, by_start=args.by_start, drill=args.drill)
        written = write_history(runs, args.output)
    except BaselineError as exc:
        print(f"{name} history: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{len(runs)} run(s) of {runs[0].drill!r}: " + ", ".join(str(p) for p in written))
    return EXIT_PASS


def goodput_command(args: argparse.Namespace, name: str) -> int:
    """``recoverygate goodput REPORT.json --gpus N``: the projection, printed."""
    import json

    from pytest_recoverygate.durations import parse_duration
    from pytest_recoverygate.engine import goodput

    try:
        doc = json.loads(args.report.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"{name} goodput: cannot read {args.report}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        inputs = goodput.inputs_from_report(doc)
        interval: float | None = None
        if args.interval:
            text = args.interval.replace(" ", "")
            if text.endswith("steps") and text[:-5].isdigit():
                if not inputs.interval_steps:
                    raise goodput.ProjectionError(
                        "--interval in steps needs the checkpoint interval "
                        "in steps, which the report lacks"
                    )
                interval = int(text[:-5]) * inputs.interval_seconds / inputs.interval_steps
            else:
                try:
                    interval = parse_duration(text)
                except ValueError as exc:
                    raise goodput.ProjectionError(
                        f"--interval {args.interval!r}: {exc}; write a "
                        "duration (30m) or a step count (500steps)"
                    ) from None
        projection = goodput.project(
            inputs,
            args.gpus,
            mtbf_hours=args.mtbf_hours,
            failures_per_gpu_hour=args.failures_per_gpu_hour,
            interval=interval,
        )
    except goodput.ProjectionError as exc:
        print(f"{name} goodput: {args.report}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(goodput.format_projection(projection)))
    if args.plot is not None:
        from pytest_recoverygate.report.charts import PLOT_HINT, write_goodput_picture

        pictures = write_goodput_picture(projection, args.plot)
        print(
            f"  picture: {', '.join(str(p) for p in pictures)}"
            if pictures
            else f"  no picture: {PLOT_HINT}"
        )
    return EXIT_PASS


class LiveStatus:
    """Phase, step and elapsed time: one updating line on a TTY, timestamped lines if not."""

    def __init__(self, stream: TextIO, quiet: bool = False) -> None:
        self.stream = stream
        self.quiet = quiet
        self.tty = stream.isatty()
        self._width = 0

    def __call__(self, status: Status) -> None:
        if self.quiet:
            return
        text = self._format(status)
        if self.tty:
            pad = max(self._width - len(text), 0)
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
            if status.phase_changed and status.phase.name == "DONE":
                self.stream.write("\n")
        elif status.phase_changed or status.phase.name != "WAITING_FOR_CHECKPOINT":
            stamp = time.strftime("%H:%M:%S")
            self.stream.write(f"{stamp} {text}\n")
        self.stream.flush()

    @staticmethod
    def _format(status: Status) -> str:
        parts = [f"[{status.phase.value}]", printable(shorten(status.message))]
        if status.step is not None:
            parts.append(f"step {status.step}")
        if status.since_kill is not None and status.max_recovery_time is not None:
            parts.append(f"{status.since_kill:.1f}s since kill / SLO {status.max_recovery_time:g}s")
        else:
            parts.append(f"{status.elapsed:.1f}s elapsed")
        return " · ".join(parts)


def _ask(stream_in: TextIO, stream_out: TextIO) -> object:
    def confirm(target: Worker, workload: Workload) -> bool:
        stream_out.write(
            printable(
                f"\nAbout to SIGKILL-equivalent {target.describe()} of {workload.job} when "
                f"the trigger checkpoint completes.\nProceed? [y/N] "
            )
        )
        stream_out.flush()
        answer = stream_in.readline().strip().lower()
        return answer in ("y", "yes")

    return confirm


def print_effective_config(config: DrillConfig, stream: TextIO) -> None:
    """``validate``'s output: that the file is valid, then the config as the drill will
    run it, defaults filled in, as YAML (``env`` values redacted)."""
    import yaml

    from pytest_recoverygate.config.loading import RUN_TIME_DEFAULTS, dump_effective

    stream.write(
        f"# {config.source_path}: valid ({config.workload.orchestrator} drill "
        f"'{config.name}')\n# the effective config, defaults filled in:\n"
    )
    stream.write(yaml.safe_dump(dump_effective(config), sort_keys=False, allow_unicode=True))
    failure = config.inject_failure
    unset = {"targetRank": failure.target_rank, "delay": failure.delay}
    for line in RUN_TIME_DEFAULTS.get(failure.type, ()):
        if unset.get(line.split(":", 1)[0], 0) is None:
            stream.write(f"# injectFailure.{line} (decided when the drill runs)\n")
    if config.evidence is not None:
        import shlex

        value = config.evidence.environment()
        stream.write(
            "# evidence: a job the drill launches gets this in its environment; give it to "
            "a job the drill attaches to yourself:\n"
            f"# export RECOVERYGATE_AUTO={shlex.quote(value)}\n"
        )
    stream.flush()


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of ``recoverygate`` and ``kubectl-recoverygate``."""
    name = prog or Path(sys.argv[0]).name or "recoverygate"
    if name.startswith("kubectl-"):
        name = "kubectl recoverygate"
    parser = _parser(name)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE

    if args.command == "goodput":
        return goodput_command(args, name)
    if args.command == "compare":
        return compare_command(args, name)
    if args.command == "history":
        return history_command(args, name)
    if args.command == "explain":
        return explain_command(args, name)
    if args.command == "sweep":
        return sweep_command(args, name)
    if args.command == "rejudge":
        return rejudge_command(args, name)

    from pytest_recoverygate.config.loading import load_config
    from pytest_recoverygate.errors import (
        ConfigError,
        DrillInterrupted,
        ReportError,
        UsageError,
    )

    try:
        config = load_config(args.file)
    except ConfigError as exc:
        print(f"{name}: invalid config:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "validate":
        print_effective_config(config, sys.stdout)
        return EXIT_PASS

    from pytest_recoverygate.runner import RunOptions, run_drill

    interactive = sys.stdin.isatty()
    kept: list[Evidence] = []
    options = RunOptions(
        dry_run=args.dry_run,
        confirmed=args.yes,
        confirm=_ask(sys.stdin, sys.stderr) if interactive else None,  # type: ignore[arg-type]
        observer=LiveStatus(sys.stderr, quiet=args.quiet),
        report_path=args.report,
        report_dir=args.report_dir,
        on_evidence=kept.append,
    )
    try:
        result = run_drill(config, options)
    except UsageError as exc:
        print(printable(f"{name}: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except DrillInterrupted as exc:
        print(printable(f"{name}: {exc}; cleanup done"), file=sys.stderr)
        return EXIT_INTERRUPTED
    except ReportError as exc:
        # the verdict first: it is what happened
        print_result(exc.result, sys.stdout, kept[0] if kept else None)
        print(printable(f"{name}: {exc}"), file=sys.stderr)
        return EXIT_ERROR
    print_result(result, sys.stdout, kept[0] if kept else None, report_dir=args.report_dir)
    return result.exit_code


def kubectl_main() -> int:
    """``kubectl recoverygate …`` (kubectl finds ``kubectl-recoverygate`` on PATH)."""
    return main(prog="kubectl-recoverygate")


if __name__ == "__main__":
    sys.exit(main())
