"""The test cluster handle shared by the slurm tests (a module, so tests can import it)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class SlurmCluster:
    """The running test cluster and helpers to submit jobs to it."""

    folder: Path
    conf: str
    env: dict[str, str]
    submitted: list[str] = field(default_factory=list)

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        proc = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed: {proc.stderr or proc.stdout}")
        return proc.stdout

    def submit(
        self,
        script: str,
        *sbatch_args: str,
        workdir: Path,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """sbatch a script (text) from ``workdir``; returns the job id."""
        path = workdir / f"job-{len(self.submitted)}.sh"
        path.write_text(script)
        merged = {**self.env, **(env or {})}
        proc = subprocess.run(
            ["sbatch", "--parsable", *sbatch_args, str(path)],
            cwd=workdir,
            env=merged,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        job_id = proc.stdout.strip().split(";")[0]
        self.submitted.append(job_id)
        return job_id

    def job_field(self, job_id: str, key: str) -> str:
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        for token in out.split():
            if token.startswith(f"{key}="):
                return token.split("=", 1)[1]
        return ""

    def wait_state(self, job_id: str, state: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.job_field(job_id, "JobState") == state:
                return
            time.sleep(0.2)
        raise AssertionError(
            f"job {job_id} not {state} after {timeout} s: {self.job_field(job_id, 'JobState')}"
        )

    def cancel_all(self) -> None:
        if self.submitted:
            self.run("scancel", *self.submitted, check=False)
            self.submitted.clear()
