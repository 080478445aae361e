"""The pytest plugin: options, the ``drill`` marker, the ``recovery_drill`` fixture,
drill items collected from ``--drill-config``, JUnit figures and live progress lines.

Everything a drill does happens in :func:`pytest_recoverygate.runner.run_drill`; this
module only translates between pytest and the runner.

JUnit XML: pytest's default ``junit_family`` is ``xunit2``, whose schema has no
per-testcase ``<properties>`` (``record_property`` warns there). So each drill's verdict
and figures are written as *testsuite* properties named ``recoverygate.<test>.<figure>``
(valid in every family), the failure message carries the verdict and failed checks, and
with ``junit_family=xunit1``/``legacy`` the figures are also testcase properties.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest
from recoverygate import __version__

from pytest_recoverygate.shared.jobtext import printable

if TYPE_CHECKING:
    from pytest_recoverygate.config.schema import DrillConfig
    from pytest_recoverygate.engine.machine import DrillResult
    from pytest_recoverygate.report.evidence import Evidence
    from pytest_recoverygate.runner import Status

__all__ = [
    "HELP_BASELINE",
    "HELP_CONFIG",
    "HELP_DRY_RUN",
    "HELP_MAX_REGRESSION",
    "HELP_REPORT_DIR",
    "HELP_YES",
    "MARKER",
    "DrillFailed",
    "DrillFile",
    "DrillItem",
    "RecoveryDrill",
]

HELP_CONFIG = "run the drill in this recovery-test.yaml as a test item (repeatable)"
HELP_DRY_RUN = "run drills minus the kill: no destructive call is made"
HELP_YES = (
    "confirm kills without asking (without it a drill whose config has "
    "safety.requireConfirm fails when named by --drill-config, and is skipped otherwise)"
)
HELP_REPORT_DIR = (
    "write each drill's report.json, events.jsonl, summary, picture and the job's output "
    "here, in a folder named after the drill"
)
HELP_BASELINE = (
    "compare each drill with its report in this folder (an earlier --drill-report-dir "
    "run); a drill whose figures regressed beyond --drill-max-regression fails"
)
HELP_MAX_REGRESSION = (
    "allowances for --drill-baseline, e.g. recoveryTime=20%,lostSteps=0,checkpointLoaded=2s "
    "(without them the comparison is shown, never fails)"
)
MARKER = (
    "drill(config=None, *, dry_run=None, overrides=None): a recovery drill; `config` is a "
    "recovery-test.yaml path (relative to the test file), `overrides` maps dotted YAML keys "
    "to values (e.g. {'expectations.maxRecoveryTime': '30s'})"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("recoverygate", "RecoveryGate recovery drills")
    group.addoption("--drill-config", action="append", default=[], metavar="FILE", help=HELP_CONFIG)
    group.addoption("--dry-run", action="store_true", default=None, help=HELP_DRY_RUN)
    group.addoption("--drill-yes", action="store_true", default=None, help=HELP_YES)
    group.addoption("--drill-report-dir", default=None, metavar="DIR", help=HELP_REPORT_DIR)
    parser.addini("drill_config", HELP_CONFIG, type="paths", default=[])
    parser.addini("drill_dry_run", HELP_DRY_RUN, type="bool", default=False)
    parser.addini("drill_yes", HELP_YES, type="bool", default=False)
    parser.addini("drill_report_dir", HELP_REPORT_DIR, default="")
    group.addoption("--drill-baseline", default=None, metavar="DIR", help=HELP_BASELINE)
    group.addoption(
        "--drill-max-regression", default=None, metavar="FIG=ALLOW,...", help=HELP_MAX_REGRESSION
    )
    parser.addini("drill_baseline", HELP_BASELINE, default="")
    parser.addini("drill_max_regression", HELP_MAX_REGRESSION, default="")


_RESULTS = pytest.StashKey[list[tuple[str, "DrillResult"]]]()
_SKIPPED = pytest.StashKey[list[tuple[str, str]]]()  # (test id, why) of every skipped drill
_EVIDENCE = pytest.StashKey[dict[str, "Evidence"]]()  # test id -> the job's output, diagnoses
_REPORT_NAMES = pytest.StashKey[dict[str, str]]()  # report folder name -> the test that has it
_BASELINE_NOTES = pytest.StashKey[list[tuple[str, str]]]()  # (test id, the comparison's note)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    config.stash[_RESULTS] = []
    config.stash[_SKIPPED] = []
    config.stash[_EVIDENCE] = {}
    config.stash[_REPORT_NAMES] = {}
    for path in _config_paths(config):
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "does not exist"
            raise pytest.UsageError(
                f"--drill-config/drill_config: {path} {what}; give the path of a "
                "recovery-test.yaml file"
            )
    report_dir = _report_dir(config)
    if report_dir is not None and report_dir.exists() and not report_dir.is_dir():
        raise pytest.UsageError(
            f"--drill-report-dir/drill_report_dir: {report_dir} is a file; give a folder"
        )
    config.stash[_BASELINE_NOTES] = []
    baseline = _baseline_dir(config)
    if baseline is not None and not baseline.is_dir():
        what = "is a file" if baseline.exists() else "does not exist"
        raise pytest.UsageError(
            f"--drill-baseline/drill_baseline: {baseline} {what}; give the folder an earlier "
            "--drill-report-dir run wrote"
        )
    _allowances(config)  # a bad allowance is a usage error before anything runs


def _baseline_dir(config: pytest.Config) -> Path | None:
    value = config.getoption("drill_baseline") or config.getini("drill_baseline")
    return Path(str(value)).resolve() if value else None


def _allowances(config: pytest.Config) -> dict[str, Any]:
    from pytest_recoverygate.errors import BaselineError
    from pytest_recoverygate.report.compare import parse_allowances

    option = config.getoption("drill_max_regression")
    where = "--drill-max-regression" if option else "drill_max_regression"
    text = str(option or config.getini("drill_max_regression") or "")
    try:
        return dict(parse_allowances(text, where))
    except BaselineError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One block per drill: verdict, figures and the recovery breakdown; then every drill
    that was skipped, and why (shown without ``-rs``: a skipped drill proved nothing)."""
    results = config.stash.get(_RESULTS, [])
    skipped = config.stash.get(_SKIPPED, [])
    verbosity = config.get_verbosity()
    notes = config.stash.get(_BASELINE_NOTES, [])
    if not ((results or notes) and verbosity >= 0) and not (skipped and verbosity >= -1):
        return
    from pytest_recoverygate.report.terminal import figure_lines

    terminalreporter.section("recoverygate drills")
    for nodeid, note in config.stash.get(_BASELINE_NOTES, []):
        terminalreporter.write_line(f"BASELINE {nodeid}: {note}")
    for nodeid, why in skipped:
        terminalreporter.write_line(f"SKIPPED {nodeid}: {why}", yellow=True)
    if verbosity < 0:
        return
    for nodeid, result in results:
        terminalreporter.write_line(printable(f"{result.verdict.value} {nodeid}: {result.summary}"))
        for line in figure_lines(result):
            terminalreporter.write_line(f"  {line}")
        evidence = config.stash.get(_EVIDENCE, {}).get(nodeid)
        for diagnosis in evidence.diagnoses if evidence is not None else ():
            terminalreporter.write_line(f"  diagnosis: {diagnosis.title} ({diagnosis.docs})")


def _dry_run(config: pytest.Config) -> bool:
    option = config.getoption("dry_run")
    return bool(option) if option is not None else bool(config.getini("drill_dry_run"))


def _confirmed(config: pytest.Config) -> bool:
    option = config.getoption("drill_yes")
    return bool(option) if option is not None else bool(config.getini("drill_yes"))


def _config_paths(config: pytest.Config) -> list[Path]:
    given = [Path(p).resolve() for p in config.getoption("drill_config")]
    return given or [Path(p) for p in config.getini("drill_config")]


def _report_dir(config: pytest.Config) -> Path | None:
    value = config.getoption("drill_report_dir") or config.getini("drill_report_dir")
    return Path(str(value)).resolve() if value else None


def pytest_report_header(config: pytest.Config) -> list[str]:
    paths = _config_paths(config)
    drills = ", ".join(_describe_config(p) for p in paths) if paths else "from markers only"
    kills = (
        "dry run (no kill)"
        if _dry_run(config)
        else (
            "confirmed (--drill-yes)"
            if _confirmed(config)
            else "need --drill-yes unless safety.requireConfirm is false"
        )
    )
    return [f"recoverygate {__version__}: drills: {drills}; kills: {kills}"]


def _describe_config(path: Path) -> str:
    try:
        from pytest_recoverygate.config.loading import load_config

        loaded = load_config(path)
    except Exception:
        return f"{path} (invalid)"
    return f"{path} ({loaded.workload.orchestrator})"


# ---------------------------------------------------------------- drill items


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Add one item per ``--drill-config`` file, collected through a :class:`DrillFile` so
    that pytest reports and counts it like any other ("collected N items")."""
    seen = {item.nodeid for item in items}
    for path in _config_paths(config):
        try:
            shown = path.relative_to(config.rootpath).as_posix()
        except ValueError:
            shown = path.as_posix()
        if f"{shown}::drill" in seen:
            continue
        collector = DrillFile.from_parent(session, path=path, nodeid=shown)
        for item in session.genitems(collector):
            if item.nodeid not in seen:
                items.append(item)
                seen.add(item.nodeid)


class DrillFailed(Exception):
    """A drill's verdict was FAIL or ERROR (pytest shows the verdict block)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class DrillFile(pytest.File):
    """A recovery-test.yaml named by ``--drill-config``: it holds one :class:`DrillItem`."""

    def collect(self) -> list[pytest.Item]:
        return [
            DrillItem.from_parent(
                self,
                name=f"drill[{self.path.name}]",
                nodeid=f"{self.nodeid}::drill",
                config_path=self.path,
            )
        ]


class DrillItem(pytest.Item):
    """One recovery-test.yaml run as a test.

    The file was asked for by name, so a drill that cannot run is a failure, never a
    skip: a kill nobody confirmed fails with how to confirm it.
    """

    def __init__(self, *, config_path: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.add_marker("drill")

    def runtest(self) -> None:
        _run_and_judge(
            self,
            self.config_path,
            dry_run=None,
            overrides=None,
            raise_on_fail=True,
            asked_by_file=True,
        )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, DrillFailed):
            return excinfo.value.text
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.config_path, 0, f"drill: {self.config_path}"


# ---------------------------------------------------------------- the fixture


class RecoveryDrill:
    """What the ``recovery_drill`` fixture gives a test: ``run()`` returns the result."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self.result: DrillResult | None = None
        #: after run(): the job's output and the diagnoses of known failure signatures
        self.evidence: Evidence | None = None

    def _marker_kwargs(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for marker in reversed(list(self._request.node.iter_markers("drill"))):
            if marker.args:
                merged["config"] = marker.args[0]
            merged.update(marker.kwargs)
        return merged

    def run(
        self,
        config: str | Path | None = None,
        *,
        dry_run: bool | None = None,
        overrides: dict[str, Any] | None = None,
        check: bool = False,
    ) -> DrillResult:
        """Run the drill and return its result (``check=True`` fails the test on FAIL)."""
        kwargs = self._marker_kwargs()
        chosen = config if config is not None else kwargs.get("config")
        if chosen is not None:
            path = Path(chosen)
            if not path.is_absolute():
                path = Path(self._request.node.path).parent / path
        else:
            paths = _config_paths(self._request.config)
            if not paths:
                _skip_drill(
                    self._request.node,
                    "no drill config: pass --drill-config=FILE or "
                    "@pytest.mark.drill(config='recovery-test.yaml')",
                )
            path = paths[0]
        merged_overrides = {**(kwargs.get("overrides") or {}), **(overrides or {})}
        dry = dry_run if dry_run is not None else kwargs.get("dry_run")
        self.result = _run_and_judge(
            self._request.node,
            path.resolve(),
            dry_run=dry,
            overrides=merged_overrides or None,
            raise_on_fail=check,
        )
        self.evidence = self._request.config.stash.get(_EVIDENCE, {}).get(self._request.node.nodeid)
        return self.result


@pytest.fixture
def recovery_drill(request: pytest.FixtureRequest) -> RecoveryDrill:
    """Run a recovery drill from a test; see :class:`RecoveryDrill`."""
    return RecoveryDrill(request)


# ---------------------------------------------------------------- shared


def _load(path: Path, overrides: dict[str, Any] | None) -> DrillConfig:
    from pytest_recoverygate.config.loading import load_config
    from pytest_recoverygate.errors import ConfigError

    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        raise DrillFailed(f"invalid drill config:\n{exc}") from None


def _skip_drill(node: pytest.Item, why: str) -> NoReturn:
    """Skip a drill test, and remember it for the terminal summary."""
    node.config.stash.setdefault(_SKIPPED, []).append((node.nodeid, why))
    pytest.skip(why)


def _unconfirmed(path: Path) -> str:
    return (
        f"{path}: safety.requireConfirm is true and nothing confirmed the kill, so the drill "
        "did not run. Confirm kills with --drill-yes (or drill_yes = true in the pytest ini "
        "file), set safety.requireConfirm: false in the drill config, or try it first with "
        "--dry-run"
    )


def _report_folder(node: pytest.Item, drill_name: str) -> str:
    """The drill's own folder under --drill-report-dir: its name (``name:`` in the YAML,
    by default the file's stem), with the test's name added when two tests run it."""

    def safe(text: str) -> str:
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in text).strip(".") or "drill"

    taken = node.config.stash.setdefault(_REPORT_NAMES, {})
    candidates = [safe(drill_name), f"{safe(drill_name)}-{safe(node.name)}"]
    for name in candidates:
        if taken.get(name, node.nodeid) == node.nodeid:
            taken[name] = node.nodeid
            return name
    number = 2
    while f"{candidates[-1]}-{number}" in taken:
        number += 1
    taken[f"{candidates[-1]}-{number}"] = node.nodeid
    return f"{candidates[-1]}-{number}"


def _run_and_judge(
    node: pytest.Item,
    path: Path,
    *,
    dry_run: bool | None,
    overrides: dict[str, Any] | None,
    raise_on_fail: bool,
    asked_by_file: bool = False,
) -> DrillResult:
    from pytest_recoverygate.engine.machine import Verdict
    from pytest_recoverygate.errors import (
        ConfirmationRequired,
        DrillInterrupted,
        ReportError,
        UsageError,
    )
    from pytest_recoverygate.report.terminal import print_result
    from pytest_recoverygate.runner import RunOptions, run_drill

    pconfig = node.config
    drill_config = _load(path, overrides)
    report_dir = _report_dir(pconfig)

    def keep(evidence: Evidence) -> None:
        pconfig.stash.setdefault(_EVIDENCE, {})[node.nodeid] = evidence

    folder = _report_folder(node, drill_config.name)
    options = RunOptions(
        # --dry-run / drill_dry_run can only turn the kill off, never back on.
        dry_run=_dry_run(pconfig) or bool(dry_run),
        confirmed=_confirmed(pconfig),
        observer=_TerminalProgress(pconfig, node.nodeid),
        report_dir=report_dir / folder if report_dir is not None else None,
        on_evidence=keep,
    )
    try:
        result = run_drill(drill_config, options)
    except ConfirmationRequired:
        if asked_by_file:  # a CI gate that ran nothing must not be green
            raise DrillFailed(_unconfirmed(path)) from None
        # a drill test in an ordinary unit-test run never kills by surprise
        _skip_drill(node, _unconfirmed(path))
    except UsageError as exc:
        raise DrillFailed(printable(f"the drill cannot run: {exc}")) from None
    except ReportError as exc:
        _record_junit(node, exc.result)
        raise DrillFailed(printable(str(exc))) from None
    except DrillInterrupted:
        raise KeyboardInterrupt from None
    _record_junit(node, result)
    pconfig.stash.setdefault(_RESULTS, []).append((node.nodeid, result))
    regression = None if options.dry_run else _against_baseline(node, result, drill_config, folder)
    if result.verdict in (Verdict.FAIL, Verdict.ERROR) and raise_on_fail:
        import io

        buffer = io.StringIO()
        evidence = pconfig.stash.get(_EVIDENCE, {}).get(node.nodeid)
        print_result(result, buffer, evidence, report_dir=options.report_dir)
        raise DrillFailed(buffer.getvalue().strip() + (f"\n\n{regression}" if regression else ""))
    if regression is not None and raise_on_fail:
        raise DrillFailed(regression)
    return result


def _against_baseline(
    node: pytest.Item, result: DrillResult, drill_config: DrillConfig, folder: str
) -> str | None:
    """Compare the drill with its report in ``--drill-baseline``; the failure text when a
    figure regressed beyond its allowance, else None. The table (or why there is none)
    goes to the JUnit properties and the terminal summary either way."""
    baseline = _baseline_dir(node.config)
    if baseline is None:
        return None
    from pytest_recoverygate.errors import BaselineError
    from pytest_recoverygate.report.compare import compare, format_table, load_report
    from pytest_recoverygate.report.files import result_to_dict

    notes = node.config.stash.setdefault(_BASELINE_NOTES, [])
    path = baseline / folder
    if not (path / "report.json").is_file():
        note = f"no baseline ({path / 'report.json'} does not exist): nothing to compare, passes"
        notes.append((node.nodeid, note))
        _junit_property(node, "baseline", note)
        return None
    try:
        base = load_report(path, "baseline")
        comparison = compare(
            base,
            result_to_dict(result, drill_config),
            _allowances(node.config),
            base_name="baseline",
            new_name="this run",
            where="--drill-max-regression/drill_max_regression",
        )
    except BaselineError as exc:
        raise DrillFailed(f"the baseline cannot be used: {exc}") from None
    table = format_table(comparison)
    text = "\n".join([f"compared with the baseline {path}:", *comparison.warnings, table])
    _junit_property(node, "baseline", text)
    _junit_property(node, "baseline.regressed", ",".join(r.figure for r in comparison.regressed))
    if comparison.regressed:
        names = ", ".join(r.figure for r in comparison.regressed)
        notes.append((node.nodeid, f"regressed against {path}: {names}"))
        return f"the drill regressed against its baseline ({names}):\n{text}"
    notes.append((node.nodeid, f"compared with {path}: {table.splitlines()[-1]}"))
    return None


def _junit_property(node: pytest.Item, key: str, value: str) -> None:
    family = str(node.config.getini("junit_family"))
    if family in ("xunit1", "legacy"):
        node.user_properties.append((key, value))
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - pytest internals moved
        return
    xml = node.config.stash.get(xml_key, None)
    if xml is not None:
        xml.add_global_property(f"recoverygate.{node.nodeid}.{key}", value)


def _record_junit(node: pytest.Item, result: DrillResult) -> None:
    from pytest_recoverygate.report.files import cost_figures, figures

    values = {k: ("" if v is None else v) for k, v in figures(result).items()}
    values["summary"] = result.summary
    values.update({f"breakdown.{k}": ("" if v is None else v) for k, v in result.breakdown.items()})
    values.update({f"costs.{k}": ("" if v is None else v) for k, v in cost_figures(result).items()})
    replay = result.replay or {}  # issue 33: expectations.replay's figures
    values.update(
        {f"replay.{k}": ("" if v is None else v) for k, v in replay.items() if k != "steps"}
    )
    # Each check's state: passed, failed, undecided or unchecked (it verified nothing).
    values.update({f"check.{c.name}": c.status for c in result.checks})
    family = str(node.config.getini("junit_family"))
    if family in ("xunit1", "legacy"):
        node.user_properties.extend(values.items())
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - pytest internals moved
        return
    xml = node.config.stash.get(xml_key, None)
    if xml is not None:
        for key, value in values.items():
            xml.add_global_property(f"recoverygate.{node.nodeid}.{key}", value)


class _TerminalProgress:
    """Phase changes as terminal lines, visible without ``-s``; ``-q`` quietens them."""

    def __init__(self, config: pytest.Config, nodeid: str) -> None:
        self._reporter = config.pluginmanager.get_plugin("terminalreporter")
        self._quiet = config.get_verbosity() < 0
        self._nodeid = nodeid

    def __call__(self, status: Status) -> None:
        if self._quiet or self._reporter is None or not status.phase_changed:
            return
        step = f" (step {status.step})" if status.step is not None else ""
        self._reporter.write_line(
            printable(f"recoverygate {self._nodeid}: [{status.phase.value}] {status.message}{step}")
        )
