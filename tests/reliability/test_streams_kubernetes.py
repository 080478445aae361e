"""Watch and log streams under faults: a drill sees every training event exactly once.

On the fake API server because the real one cannot be made to cut a watch or a log stream
after K lines, end a watch with 410 Gone, or replay a log's backlog out of order on cue.

We test these aspects, one table row each (a fault kind, and K where it applies), with a
whole drill through ``run_drill`` against a training job on the fake API server:

- log streams cut K lines after the backlog they replay: the adapter reopens the stream
  every K new lines, with ``sinceSeconds`` overlapping what it already read, so every
  reopen re-sends seconds of lines it has seen (duplicated, and older than the last one);
- the same, with the backlog's last lines sent once more newest first (out of order);
- watch streams cut every K events (resume from the last resourceVersion delivered);
- watch streams ended by a 410 ``ERROR`` event after K events (re-list, then watch);
- all of those at once;
- and a row without faults, the reference.

For each row: the verdict is PASS, resumed from the step the job really resumed from (the
same as without faults); the engine's event log (``events.jsonl`` of the report) holds no
(incarnation, event, step) twice; and it misses nothing the job wrote up to the last line
the engine saw (compared with the lines the fake job actually put in its log); the group
events (victim gone, its replacement) reach it once each. The faults
must really have fired (reopened streams, re-lists), so no row can pass vacuously.

Known limit, on purpose not a row: a log stream cut after K lines *counting the replay*
never advances when K is below the replay (the adapter reopens with ``sinceSeconds`` plus
a 5 s margin against clock skew; the Python client has no ``sinceTime``), so the cut is
placed K lines past the backlog.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from recoverygate import wire

from pytest_recoverygate.config.loading import parse_config
from pytest_recoverygate.engine.machine import Verdict
from pytest_recoverygate.runner import RunOptions, run_drill
from tests.kubernetes.fake_apiserver import FakeApiServer, Fault, RequestInfo
from tests.kubernetes.fake_cluster import FakeTrainingJob, job_drill_yaml
from tests.reliability.conftest import Figures

pytestmark = pytest.mark.kubernetes

REPLAY = 20  # lines of the backlog sent again, newest first
#: How long the replacement stays Pending (index: the watch is faulted): the new incarnation
#: starts after it, and the drill ends soon after that, so this is the time a watch cut
#: every few events (each reconnect waits ~0.1-0.2 s) has to report the replacement.
REPLACEMENT_PENDING_FOR = (0.5, 1.5)


@dataclass(frozen=True)
class Row:
    """One fault kind: what the log and the watch requests of the drill's namespace get."""

    name: str
    log: Fault | None = None
    watch: Fault | None = None
    reopened_logs: int = 0  # at least this many log requests (the stream really was cut)
    rewatched: int = 0  # at least this many watch requests
    relisted: int = 0  # at least this many lists after discovery's


def log_cut(k: int, replay: int = 0) -> Fault:
    return Fault(drop_after_new_lines=k, replay_backwards=replay)


ROWS = [
    Row("no faults"),
    *[
        Row(f"log cut {k} lines after its replay", log=log_cut(k), reopened_logs=3)
        for k in (1, 3, 10)
    ],
    *[
        Row(
            f"log cut {k} lines after its replay, replay resent backwards",
            log=log_cut(k, REPLAY),
            reopened_logs=3,
        )
        for k in (1, 10)
    ],
    *[
        Row(f"watch cut every {k} events", watch=Fault(drop_after_lines=k), rewatched=2)
        for k in (1, 3, 10)
    ],
    *[
        Row(
            f"watch ends with 410 after {k} events",
            watch=Fault(expire_after_lines=k),
            rewatched=2,
            relisted=1,
        )
        for k in (1, 3)
    ],
    Row(
        "everything at once",
        log=log_cut(3, REPLAY),
        watch=Fault(drop_after_lines=2),
        reopened_logs=3,
        rewatched=2,
    ),
    Row(
        "everything at once, 410s",
        log=log_cut(1, REPLAY),
        watch=Fault(expire_after_lines=2),
        reopened_logs=3,
        rewatched=2,
        relisted=1,
    ),
]


class Router:
    """The server's fault hook: each namespace gets its row's faults on every request."""

    def __init__(self, server: FakeApiServer) -> None:
        self.rows: dict[str, Row] = {}
        self.injected: Counter[str] = Counter()
        self._lock = threading.Lock()
        server.fault_hook = self

    def __call__(self, info: RequestInfo) -> Fault | None:
        with self._lock:
            row = self.rows.get(info.namespace)
            fault = None
            if row is not None and info.resource == "pods/log":
                fault = row.log
            elif row is not None and info.verb == "watch":
                fault = row.watch
            if fault is not None:
                self.injected[fault.describe()] += 1
            return fault


@pytest.fixture(scope="module")
def server() -> Iterator[FakeApiServer]:
    # Bookmarks every 50 ms keep the watch streams busy, so "cut every K events" fires
    # all along the drill, not only when the pods change.
    with FakeApiServer(bookmark_interval=0.05) as api:
        yield api


@pytest.fixture(scope="module")
def router(server: FakeApiServer) -> Router:
    return Router(server)


def drill_text(job: FakeTrainingJob, kubeconfig: Path) -> str:
    options = {"after": 60, "max_recovery": "20s", "max_lost_steps": 10000}
    return job_drill_yaml(job, kubeconfig, name="stream-drill", **options)


Key = tuple[str, str, "int | None"]  # (incarnation, event, step)


def written_events(job: FakeTrainingJob) -> list[tuple[float, Key]]:
    """What the job really put in its log: (kubelet time, event key), in order."""
    out = []
    for ts, line in list(job.written):
        records, malformed = wire.parse_text(line)
        assert malformed == 0 and len(records) == 1, line
        record = records[0]
        out.append((ts, (record.inc, record.event, record.step)))
    return out


@pytest.mark.slow  # a drill on the fake API server per row, its streams cut all along (2-3 s)
@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_every_event_is_seen_exactly_once_and_the_verdict_holds(
    server: FakeApiServer, router: Router, row: Row, tmp_path: Path, figures: Figures
) -> None:
    namespace = "streams-" + str(ROWS.index(row))
    job = FakeTrainingJob(
        server,
        kind="pytorchjob",
        name=f"job-{namespace}",
        namespace=namespace,
        nodes=2,
        step_time=0.01,
        checkpoint_every=5,
        recreate_delay=0.02,
        start_delay=REPLACEMENT_PENDING_FOR[row.watch is not None],
    )
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    router.rows[namespace] = row
    try:
        job.start()
        text = drill_text(job, kubeconfig)
        path = tmp_path / "recovery-test.yaml"
        path.write_text(text)
        report = tmp_path / "report"
        result = run_drill(
            parse_config(text, path), RunOptions(handle_signals=False, report_dir=report)
        )
    finally:
        router.rows.pop(namespace, None)
        job.stop()
    requests = [r for r in server.requests if r.namespace == namespace]
    where = f"{row.name}: {result.verdict.value} {result.summary}"

    # The verdict is the one the job deserves, as without faults.
    assert result.verdict is Verdict.PASS, where
    written = written_events(job)
    loaded = [key[2] for _, key in written if key[1] == "checkpoint_loaded"]
    assert loaded and result.resume_step == loaded[0] == result.expected_resume_step, where

    # Every event the engine saw, exactly once, and none missing up to the last one it saw.
    seen_log = [json.loads(line) for line in (report / "events.jsonl").read_text().splitlines()]
    seen = [(e["inc"], e["event"], e["step"]) for e in seen_log]
    twice = [key for key, n in Counter(seen).items() if n > 1]
    assert twice == [], f"{where}: seen more than once: {twice[:5]}"
    last = max(e["received"] for e in seen_log)
    expected = [key for ts, key in written if ts <= last + 1e-6]
    missing = [key for key in expected if key not in set(seen)]
    assert missing == [], f"{where}: {len(missing)} events never reached the engine: {missing[:5]}"
    assert set(seen) <= {key for _, key in written}, where
    assert len(job.incarnations) == 2 and {k[0] for k in seen} == set(job.incarnations), where
    progress = [(inc, step) for _, inc, step in result.progress]
    assert len(progress) == len(set(progress)), where

    # Group events, across resumed watches and re-lists: each once, none invented. (A
    # replacement may be seen Pending or only Running: a re-list shows the state of the
    # moment, and the drill may end before the watch reports Running.)
    group = Counter(e.kind for e in result.timeline if e.kind.startswith("group:"))
    assert group["group:worker_gone"] == 1, f"{where}: {dict(group)}"
    replacement = group["group:replacement_pending"] + group["group:replacement_running"]
    assert replacement >= 1, f"{where}: {dict(group)}"
    assert all(n == 1 for n in group.values()), f"{where}: {dict(group)}"

    # The faults really fired: streams were reopened, watches resumed, lists redone.
    logs = sum(1 for r in requests if r.resource == "pods/log")
    watches = sum(1 for r in requests if r.verb == "watch")
    lists = sum(1 for r in requests if r.verb == "list")
    assert logs >= max(row.reopened_logs, 1), f"{where}: only {logs} log requests"
    assert watches >= max(row.rewatched, 1), f"{where}: only {watches} watch requests"
    assert lists - 1 >= row.relisted, f"{where}: only {lists - 1} re-lists"
    faults = sum(1 for r in requests if r.fault)
    figures.add("k8s_stream_drills")
    figures.add("faults_injected", faults)
