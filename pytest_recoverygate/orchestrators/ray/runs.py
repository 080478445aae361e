"""This drill's Train run, read from the dashboard: Train's runs fetched, the drill's own
chosen among them, waited for until its worker group runs; ``submissionId``'s Ray Job
checked to be running.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_recoverygate.errors import DiscoveryError
from pytest_recoverygate.orchestrators.ray.state import TrainRun, first_words, parse_runs

if TYPE_CHECKING:
    from pytest_recoverygate.orchestrators.ray.cluster import ClusterLink
    from pytest_recoverygate.registry.seams import Clock

__all__ = ["POLL_INTERVAL", "RUNS_PATH", "TrainRuns"]

POLL_INTERVAL = 0.3  # seconds between looks at Train's state
RUNS_PATH = "/api/train/v2/runs/v1"


class TrainRuns:
    """The run of this drill's driver (or of ``submission_id``'s Job), as last read."""

    def __init__(self, cluster: ClusterLink, *, submission_id: str | None, clock: Clock) -> None:
        self._cluster = cluster
        self.submission_id = submission_id
        self._clock = clock
        self._lock = threading.Lock()
        self._run: TrainRun | None = None
        self.run_id: str | None = None
        self.job_id: str | None = None  # submissionId: its Ray job, as the Jobs API names it
        self.driver_pid: int | None = None  # the driver the drill launched
        self.own_cluster = False  # the driver started the cluster: every run is ours

    def latest(self) -> TrainRun | None:
        """The run as last read (not read again)."""
        with self._lock:
            return self._run

    def hold(self, run: TrainRun) -> None:
        with self._lock:
            self._run = run

    def fetch_runs(self) -> list[TrainRun] | None:
        """Train's runs, or None when its state cannot be read right now."""
        try:
            return parse_runs(self._cluster.get(RUNS_PATH))
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")[:300]
            if exc.code in (401, 403):
                raise DiscoveryError(
                    f"the Ray dashboard at {self._cluster.dashboard} refused the drill's client "
                    f"(HTTP {exc.code}: {body}); give the cluster's token as RAY_AUTH_TOKEN "
                    "(or in ~/.ray/auth_token)"
                ) from None
            return None  # 500 until Train's state actor exists
        except (OSError, ValueError):
            return None

    def mine(self, runs: list[TrainRun]) -> TrainRun | None:
        """The run of this drill's driver (or Job): the newest one that is ours."""
        if self.run_id is not None:
            return next((r for r in runs if r.run_id == self.run_id), None)
        if self.submission_id is not None:
            ours = [r for r in runs if r.submission_id == self.submission_id]
        else:
            ours = [r for r in runs if r.driver_pid == self.driver_pid]
            if not ours and self.own_cluster:
                ours = list(runs)  # a cluster of our own: every run is ours
        return max(ours, key=lambda r: r.start_ns) if ours else None

    def fetch(self) -> TrainRun | None:
        """The run read again; the last one read when Train's state cannot be read now."""
        runs = self.fetch_runs()
        if runs is None:
            with self._lock:
                return self._run
        run = self.mine(runs)
        if run is not None:
            with self._lock:
                self._run = run
        return run

    def wait_for_group(
        self,
        deadline: float,
        *,
        check_driver: Callable[[str], None],
        launched: str,
        output_tail: Callable[[], str],
    ) -> TrainRun:
        """The run once its current attempt runs; ``launched`` names what should start it."""
        if self.submission_id is not None:
            self.check_job()
        seen = "no Train run"
        while True:
            runs = self.fetch_runs()
            run = self.mine(runs) if runs is not None else None
            if run is not None:
                current = run.current
                seen = f"run {run.name!r} {run.status}" + (
                    f", attempt {current.status}" if current else ""
                )
                if run.terminal:
                    raise DiscoveryError(
                        f"the Train run {run.name!r} ended ({run.status}) before the drill "
                        f"could see its workers: {first_words(run.detail, 400)}"
                    )
                if current is not None and current.running:
                    self.run_id = run.run_id
                    return run
            check_driver("before Train's worker group was running")
            if self._clock.now() >= deadline:
                raise DiscoveryError(
                    f"no running Train worker group appeared before the discovery deadline "
                    f"(seen: {seen}); does `{launched}` "
                    f"call TorchTrainer.fit()? last output:\n{output_tail()}"
                )
            time.sleep(POLL_INTERVAL)

    def check_job(self) -> None:
        """``submissionId``: the Ray Job must be running (nothing is killed otherwise)."""
        try:
            assert self.submission_id is not None
            job = self._cluster.get(f"/api/jobs/{urllib.parse.quote(self.submission_id, safe='')}")
        except urllib.error.HTTPError as exc:
            raise DiscoveryError(
                f"workload.submissionId {self.submission_id!r}: the cluster at "
                f"{self._cluster.address} has no such Ray Job (HTTP {exc.code}); "
                "`ray job list` names the running ones"
            ) from None
        except (OSError, ValueError) as exc:
            raise DiscoveryError(
                f"workload.submissionId {self.submission_id!r}: the Jobs API at "
                f"{self._cluster.dashboard} did not answer: {exc}"
            ) from None
        status = str(job.get("status", "")) if isinstance(job, dict) else ""
        if isinstance(job, dict) and job.get("job_id"):
            self.job_id = str(job["job_id"])  # its driver's Ray job: the workers' job
        if status != "RUNNING":
            raise DiscoveryError(
                f"workload.submissionId {self.submission_id!r} is not running (its status is "
                f"{status or 'unknown'}); give the id of a RUNNING Ray Job (`ray job list`)"
            )
