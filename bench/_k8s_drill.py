"""Child process of bench_scale: one Kubernetes drill against the fake API server.

``python _k8s_drill.py KUBECONFIG SELECTOR NAMESPACE``: imports everything first (the
``kubernetes`` client included: its import is start-up, not drill work), then runs the
drill through the runner and prints one JSON line: the verdict, the drill's CPU seconds
(this process, every thread: discovery, the watch, the log follower, the kill, cleanup),
the CPU and wall time of each phase as the backend saw them, the peak RSS, and the CPU
time of importing the client beforehand (``kubernetes.client.CoreV1Api`` is imported
lazily and builds its models then: about 0.6 CPU-s of start-up, not drill work).
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "reporter")]

_ru = resource.getrusage(resource.RUSAGE_SELF)
_IMPORT_START = _ru.ru_utime + _ru.ru_stime
import kubernetes  # noqa: E402  (start-up cost, kept out of the drill's figures)
import kubernetes.config  # noqa: E402,F401
from kubernetes.client import CoreV1Api  # noqa: E402,F401  (imported lazily: ~0.6 CPU-s)

_ru = resource.getrusage(resource.RUSAGE_SELF)
IMPORT_CPU = _ru.ru_utime + _ru.ru_stime - _IMPORT_START

from pytest_recoverygate.config.loading import parse_config  # noqa: E402
from pytest_recoverygate.orchestrators import build_orchestrator  # noqa: E402
from pytest_recoverygate.registry.seams import RealClock  # noqa: E402
from pytest_recoverygate.runner import RunOptions, run_drill  # noqa: E402
from tests.kubernetes.fake_cluster import drill_yaml  # noqa: E402


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _Phases:
    """The real backend, with CPU and wall time noted around discover and kill."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.name = inner.name
        self.marks: dict[str, float] = {}

    def discover(self, deadline: float) -> Any:
        c0, t0 = _cpu(), time.monotonic()
        try:
            return self._inner.discover(deadline)
        finally:
            self.marks["discover_cpu_s"] = _cpu() - c0
            self.marks["discover_wall_s"] = time.monotonic() - t0

    def kill(self, worker: Any, *, dry_run: bool, fault: Any = None) -> Any:
        self.marks["kill_at_cpu_s"] = _cpu()
        self.marks["kill_at_wall"] = time.monotonic()
        if fault is None:
            return self._inner.kill(worker, dry_run=dry_run)
        return self._inner.kill(worker, dry_run=dry_run, fault=fault)

    def current_worker(self, rank: int) -> Any:
        return self._inner.current_worker(rank)

    def watch_group(self) -> Any:
        return self._inner.watch_group()

    def events(self) -> Any:
        return self._inner.events()

    def cleanup(self) -> None:
        if "verdict_at_cpu_s" not in self.marks:
            self.marks["verdict_at_cpu_s"] = _cpu()
            self.marks["verdict_at_wall"] = time.monotonic()
        self._inner.cleanup()


def main() -> None:
    kubeconfig, selector, namespace = sys.argv[1:4]
    text = drill_yaml(
        selector,
        namespace,
        kubeconfig,
        name="scale",
        max_recovery="30s",
        deadline="60s",
        recovery="60s",
    )
    with tempfile.TemporaryDirectory(prefix="rg-bench-k8s-") as tmp:
        path = Path(tmp) / "recovery-test.yaml"
        path.write_text(text)
        config = parse_config(text, path)
        clock = RealClock()
        rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        c0, t0 = _cpu(), time.monotonic()
        backend = _Phases(build_orchestrator(config, clock))
        result = run_drill(
            config, RunOptions(handle_signals=False), clock=clock, orchestrator=backend
        )
        cpu, wall = _cpu() - c0, time.monotonic() - t0
    m = backend.marks
    print(
        json.dumps(
            {
                "verdict": result.verdict.value,
                "summary": result.summary,
                "cpu_s": cpu,
                "wall_s": wall,
                "discover_cpu_s": m.get("discover_cpu_s"),
                "discover_wall_s": m.get("discover_wall_s"),
                "wait_cpu_s": m["kill_at_cpu_s"] - c0 - m["discover_cpu_s"]
                if "kill_at_cpu_s" in m
                else None,
                "recover_cpu_s": m["verdict_at_cpu_s"] - m["kill_at_cpu_s"]
                if "verdict_at_cpu_s" in m and "kill_at_cpu_s" in m
                else None,
                "recover_wall_s": m["verdict_at_wall"] - m["kill_at_wall"]
                if "verdict_at_wall" in m and "kill_at_wall" in m
                else None,
                "cleanup_cpu_s": c0 + cpu - m["verdict_at_cpu_s"]
                if "verdict_at_cpu_s" in m
                else None,
                "rss_start_mib": rss_start,
                "import_cpu_s": IMPORT_CPU,
                "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "workers": len((result.target and [result.target]) or []),
                "target": result.target.instance_id if result.target else None,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
