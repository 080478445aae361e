"""The test cluster handle shared by the slurm tests (a module, so tests can import it)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.patience import PROCESS, within


@dataclass
class SlurmCluster:
    """The running test cluster and helpers to submit jobs to it."""

    folder: Path
    conf: str
    env: dict[str, str]
    submitted: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        """The cluster's node names: ``localhost``, or node1..nodeN (``--nodes N``)."""
        count = 1
        env_file = self.folder / "etc" / "cluster.env"
        if env_file.exists():
            for line in env_file.read_text().splitlines():
                if line.startswith("NODES="):
                    count = int(line.split("=", 1)[1])
        return ["localhost"] if count == 1 else [f"node{i}" for i in range(1, count + 1)]

    def on_node(self, node: str, *args: str, timeout: float = PROCESS) -> str:
        """Run a command as if on ``node``: in its slurmd's network, UTS and mount
        namespaces (``nsenter``), or here on the one-node cluster. Its stdout."""
        if self.nodes == ["localhost"]:
            return self.run(*args, check=False, timeout=timeout)
        pid = (self.folder / "run" / f"slurmd-{node}.pid").read_text().strip()
        return self.run(
            "nsenter", "-t", pid, "--net", "--uts", "--mount", *args, check=False, timeout=timeout
        )

    def listpids(self, job_id: str) -> str:
        """``scontrol listpids JOB`` on every node (it asks the local slurmd only)."""
        return "".join(self.on_node(node, "scontrol", "listpids", job_id) for node in self.nodes)

    def run(self, *args: str, check: bool = True, timeout: float = PROCESS) -> str:
        """Run a client (its stdout), waiting ``timeout`` seconds, stretched by the slack."""
        proc = subprocess.run(
            list(args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=within(timeout),
            check=False,
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
            timeout=within(PROCESS),
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

    def resume_drained(self) -> list[str]:
        """RESUME every node left DRAIN (a drill that failed before its cleanup); their names."""
        drained = []
        for row in self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).splitlines():
            parts = row.split()
            if len(parts) == 2 and parts[1].startswith("drain") and parts[0] not in drained:
                drained.append(parts[0])
                self.run("scontrol", "update", f"NodeName={parts[0]}", "State=RESUME", check=False)
        return drained

    def cancel_all(self) -> None:
        if self.submitted:
            self.run("scancel", *self.submitted, check=False)
            self.submitted.clear()
