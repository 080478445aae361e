"""StorageFault on a running Slurm job: the folders it can be shown to use, and whether a
mount made on the drill's machine covers its folder as the target rank sees it.

A drill attaches to a Slurm job by ``jobId``/``jobName``: its config names no command and
no working folder, so the scope of a StorageFault's ``path`` is read from the job once
discovery found it (the :class:`~pytest_recoverygate.registry.seams.StorageScope` seam),
and the runner mounts the storage layer only then:

- the job's ``WorkDir``, the folder of its batch script (``Command``) and of its output
  file (``StdOut``), from ``scontrol show job``;
- the folders its batch script names (``scontrol write batch_script J -``: a path, an
  option's value, the value of ``NAME=value``; words that need the shell's expansion
  name nothing here);
- the target process's working folder and the folders its command line names, when it
  runs on this machine (its pid and start time, as discovery found them).

For a StorageFault, the target must be a process of this machine that shares the
drill's mount namespace (its pid and start time, as discovery found them, read in
``/proc`` here): a rank on
another node, or under a slurmd started in a mount namespace of its own (the test
cluster's ``--nodes N``), would never see the layer, and the drill is refused before
anything is mounted. A StickyFault ``scope: checkpoint`` writes over files instead of
mounting anything (``mount=False``): it needs the folder the job shows, seen from the
drill's machine as the job sees it (a shared file system); the files the trigger
checkpoint's save wrote there, by their times, are what proves that.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from pytest_recoverygate.engine import model
from pytest_recoverygate.errors import BackendError, DiscoveryError, PermissionDeniedError
from pytest_recoverygate.orchestrators.slurm.commands import JobGone, SlurmCommands
from pytest_recoverygate.storage.scope import (
    mount_problem,
    named_folders,
    process_words,
    start_ticks,
)

__all__ = ["MAX_SCRIPT", "JobStorage", "script_words"]

#: Characters of the batch script read for the folders it names.
MAX_SCRIPT = 1 << 16
_INSTANCE = re.compile(r"[^./@]+\.[^/@]+/(?P<pid>\d+)@(?P<start>\d+)")


def script_words(text: str) -> list[str]:
    """The words of a batch script that may name a folder: each line split as the shell
    would (comments dropped), and of ``NAME=value`` the value too."""
    words: list[str] = []
    for line in text[:MAX_SCRIPT].splitlines():
        try:
            parts = shlex.split(line, comments=True)
        except ValueError:  # an open quote: the line as blanks split it
            parts = line.split()
        for part in parts:
            words.append(part)
            name, eq, value = part.partition("=")
            if eq and not part.startswith("-") and name.isidentifier():
                words.append(value)
    return words


class JobStorage:
    """The Slurm orchestrator's :class:`~pytest_recoverygate.registry.seams.StorageScope`."""

    commands: SlurmCommands
    job_id: str | None

    def storage_scope(self, target: model.Worker, *, mount: bool = True) -> tuple[Path, ...]:
        """The folders the discovered job can be shown to use (see the module); with
        ``mount``, a DiscoveryError when ``target`` would not see a mount made here
        (without: a StickyFault's damage, written in the files, which needs no mount)."""
        match = _INSTANCE.fullmatch(target.instance_id)
        if match is None or self.job_id is None:
            raise DiscoveryError(
                f"{target.describe()} is not a Slurm worker this drill discovered; "
                "nothing was touched"
            )
        pid, start = int(match["pid"]), int(match["start"])
        shown = f"{target.describe()} (pid {pid} on {target.node or 'its node'})"
        problem = mount_problem(pid, start, shown) if mount else None
        if problem is not None:
            raise DiscoveryError(
                f"a StorageFault on slurm covers the checkpoint folder as the target rank's "
                f"node sees it, from that node: {problem}. Run the drill on that node, in "
                "the mount namespace its slurmd and the job run in (the one-node test "
                "cluster's slurmd runs in the host's), or drill the storage with "
                "orchestrator: local; nothing was mounted"
            )
        try:
            job = self.commands.show_job(self.job_id)
        except JobGone:
            raise DiscoveryError(f"Slurm job {self.job_id} ended; nothing was mounted") from None
        own = [Path(p) for p in (job.work_dir,) if p.startswith("/")]
        own += [Path(p).parent for p in (job.command, job.stdout) if p.startswith("/")]
        try:
            script = self.commands.run(["scontrol", "write", "batch_script", self.job_id, "-"])
        except (JobGone, BackendError, PermissionDeniedError):
            script = ""  # not the owner or an operator: the scope is what the rest shows
        work = own[0] if job.work_dir.startswith("/") else None
        words = [
            (work or Path("/"), word)
            for word in script_words(script)
            if work is not None or word.startswith("/")
        ]
        if start_ticks(pid) == start:  # this very process runs here: its own folders too
            words += process_words(pid)
        found = named_folders((Path("/"), str(folder)) for folder in own)
        return tuple(dict.fromkeys([*found, *named_folders(words)]))
