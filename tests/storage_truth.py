"""A StorageFault drill's verdict held to the job's own records, on every backend.

The storage examples' jobs (examples/local/storage/train_storage.py, examples/ray/
train_ray.py) write, with ``RECOVERYGATE_GROUND_TRUTH=<base>``, one JSON line per thing
they did to ``<base>.<rank>.<pid>.jsonl``: each step, each save started, failed (its
error), durable (the saver's own proof), reported complete, each checkpoint removed, the
step loaded. :class:`Run` reads them beside the drill's report; :func:`left_behind` finds
what a drill left (a mount, a layer process, an owner record, a process of its job).
Shared by tests/local, tests/slurm and tests/ray.
"""

from __future__ import annotations

import json
import os
import signal
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from pytest_recoverygate.shared.lock import lock_dir
from pytest_recoverygate.storage.layer import RECORD_PREFIX, our_mounts

__all__ = ["Run", "left_behind", "read_truth", "record_for_the_docs"]


def read_truth(base: Path, rank: int = 0) -> dict[int, list[dict[str, Any]]]:
    """``rank``'s records under ``<base>.<rank>.*.jsonl``, per process (pid), in order."""
    truth: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(base.parent.glob(f"{base.name}.{rank}.*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            truth[row["pid"]].append(row)
    return dict(truth)


@dataclass(frozen=True)
class Run:
    """One drill: its report, exit code, output, and the saving rank's records."""

    report: dict[str, Any]
    code: int
    output: str
    truth: dict[int, list[dict[str, Any]]]  # the saving rank's records, per process (pid)

    def explain(self) -> str:
        return (
            f"\nexit {self.code}\nsummary: {self.report.get('summary')}\nreasons: "
            f"{self.report.get('reasons')}\noutput tail:\n"
            + "\n".join(self.output.splitlines()[-25:])
        )

    @property
    def processes(self) -> list[list[dict[str, Any]]]:
        """The saving rank's processes, oldest first."""
        return sorted(self.truth.values(), key=lambda rows: rows[0]["t"])

    def events(self, process: list[dict[str, Any]], event: str) -> list[int]:
        return [row["step"] for row in process if row["event"] == event]

    @property
    def storage(self) -> dict[str, Any]:
        return dict(self.report["recoveries"][0]["faultDetails"]["storage"])


def record_for_the_docs(name: str, report: dict[str, Any], wall: float) -> None:
    """With RECOVERYGATE_FAULT_TABLE=FILE, one JSON line per drill: docs/faults.md's
    StorageFault figures come from a run, never typed in."""
    out = os.environ.get("RECOVERYGATE_FAULT_TABLE")
    if not out:
        return
    recoveries = report.get("recoveries") or [{}]
    storage = (recoveries[0].get("faultDetails") or {}).get("storage") or {}
    line = {
        "example": name,
        "verdict": report.get("verdict"),
        "reasons": report.get("reasons"),
        "wall": round(wall, 1),
        "resumeStep": report.get("resumeStep"),
        "recoveryTimeSeconds": report.get("recoveryTimeSeconds"),
        "breakdown": recoveries[0].get("breakdown"),
        "storage": {k: storage.get(k) for k in (
            "firstOperation", "operationsFailed", "operationsHeld", "operationsDelayed",
            "saveHit", "saveEnded", "armedAt", "liftedAt", "liftedBecause", "jobDid", "audit",
            "lastDurableCheckpoint",
        )},
    }  # fmt: skip
    with open(out, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def left_behind(mark: str, folder: Path) -> list[str]:
    """What a drill left (other drills may run beside it): a storage layer's mount over
    its folder, that layer's process or owner record, a process of its job (one whose
    environment carries ``RG_E2E_MARK=mark``; each process then killed, so one leak fails
    one test)."""
    mine = str(folder.resolve())
    found = [f"mount {target} ({source})" for target, source in our_mounts() if target == mine]
    for record in lock_dir().glob(f"{RECORD_PREFIX}*.json"):
        try:
            if json.loads(record.read_text()).get("folder") == mine:
                found.append(f"record {record}")
        except (OSError, ValueError):
            continue
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if "pytest_recoverygate.storage.fs" in cmdline and str(folder) in cmdline:
                found.append(f"layer {proc.pid} {cmdline}")
                proc.kill()
            elif proc.environ().get("RG_E2E_MARK") == mark:
                found.append(f"job {proc.pid} {proc.status()} {cmdline}")
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found
