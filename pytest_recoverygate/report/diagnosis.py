"""Known failure signatures: what a failed recovery's output means, and the fix.

When a drill FAILs or ERRORs, the verdict says *what* went wrong (resumed from step 0,
never came back). Many of those failures have a cause this field knows by its output: a
line torch, gloo or Python prints, or a pattern in the drill's own figures. This module
holds that knowledge as one table, :data:`SIGNATURES`; :func:`diagnose` returns a
:class:`Diagnosis` (one paragraph: what happened and the fix, plus a link to the section of
``docs/troubleshooting.md`` that explains it) for each signature that matches.

Each signature is tested against output captured from the real thing
(``tests/diagnosis/data/``, with how each sample was made). A signature needs evidence,
never a guess: a line it quotes, or a figure of the result. A diagnosis adds to the
verdict; it never changes it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_recoverygate.engine.advice import PATTERNS, resume_option
from pytest_recoverygate.engine.machine import DrillResult, FailureReason, Verdict
from pytest_recoverygate.links import docs_link
from pytest_recoverygate.shared.textbounds import cap_lines

if TYPE_CHECKING:
    from pytest_recoverygate.config.schema import DrillConfig

__all__ = [
    "DOCS_PAGE",
    "SIGNATURES",
    "Clues",
    "Diagnosis",
    "Signature",
    "clues_from",
    "diagnose",
]

#: The page of docs/ (shipped with the package) with one section per signature.
DOCS_PAGE = "troubleshooting.md"
_READ_LIMIT = 8 * 1024 * 1024  # characters of output a diagnosis reads (the end matters most)


@dataclass(frozen=True, slots=True)
class Clues:
    """What a signature may look at: the job's output and the drill's facts, plain."""

    output: str = ""
    verdict: Verdict = Verdict.FAIL
    reasons: tuple[FailureReason, ...] = ()
    killed: bool = False  # the kill happened (so later output is of a restarted group)
    restarts: int | None = None
    resume_step: int | None = None
    expected_resume_step: int | None = None
    checkpoints_before_kill: int | None = None  # the last checkpoint seen before the kill
    env: Mapping[str, str] = field(default_factory=dict)  # what the drill adds (local)
    command: tuple[str, ...] = ()  # what the drill launches (local)
    #: how the job reports: None, reporter calls; "patterns" or a preset, its log lines
    evidence: str | None = None

    @property
    def failed(self) -> bool:
        return self.verdict in (Verdict.FAIL, Verdict.ERROR)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """One known cause: a paragraph with the fix, the evidence, and where to read more."""

    signature: str  # the anchor of its section in docs/troubleshooting.md
    title: str
    text: str
    evidence: str

    @property
    def docs(self) -> str:
        """Where to read more: its section of the shipped troubleshooting page."""
        return docs_link(DOCS_PAGE, self.signature)

    def as_dict(self) -> dict[str, str]:
        """Its ``diagnoses`` entry in report.json (the key ``diagnosis`` holds ``text``)."""
        keys = ("signature", "title", "diagnosis", "evidence", "docs")
        return {key: getattr(self, "text" if key == "diagnosis" else key) for key in keys}


@dataclass(frozen=True, slots=True)
class Signature:
    """A known failure: ``match`` returns the evidence (or None), ``explain`` the paragraph."""

    id: str
    title: str
    match: Callable[[Clues], str | None]
    explain: Callable[[Clues, str], str]


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text):  # noqa: B007 - the last match is wanted
        pass
    return found


def _first_then(lead: str, tails: str, group: int) -> str:
    """A pattern (for ``re.M``) matching a line in which ``lead`` is followed, later on
    the same line, by one of ``tails`` (a ``|`` list of literals); the match starts at the
    line's start.

    Linear in the line: the lookahead finds the line's *first* ``lead`` once (a lookahead
    is atomic, so it is never retried from a later ``lead``), and only that one is tried:
    if no tail follows the first, none follows a later one. ``[^\n]*LEAD[^\n]*TAIL``
    searched from every ``lead`` was quadratic in a line of repeated leads (40 kB: 0.2 s;
    the diagnosis reads up to 8 MiB). ``group``: the number of the lookahead's group.
    """
    return rf"^(?=([^\n]*?{re.escape(lead)}))\{group}[^\n]*(?:{tails})"


def _line_of(text: str, match: re.Match[str]) -> str:
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    line = text[start : end if end >= 0 else len(text)].strip()
    return line if len(line) <= 300 else line[:297].rsplit(" ", 1)[0] + " …"


# ------------------------------------------------------------- torchrun's TCP store

_STALE_PEER = re.compile(
    _first_then("Gloo connectFullMesh failed with", "Connection refused|timed out connecting", 1)
    + "|"
    + _first_then("ERROR failed to connect, willRetry=0", "Connection refused", 2),
    re.M,
)
_STORE_FIX = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def _tcp_store_match(clues: Clues) -> str | None:
    if not clues.killed or clues.env.get(_STORE_FIX) == "1":
        return None
    if not clues.failed and (clues.restarts or 0) < 2:
        return None  # recovered on the first restart: nothing to explain
    found = _last(_STALE_PEER, clues.output)
    return _line_of(clues.output, found) if found else None


def _tcp_store_explain(clues: Clues, evidence: str) -> str:
    lead = (
        "The job recovered, but only after "
        f"{clues.restarts} restarts: the first restarted group(s) could not connect."
        if not clues.failed
        else "After the kill, the restarted workers could not connect to each other."
    )
    return (
        f"{lead} torchrun (c10d rendezvous, --standalone included) shares its rendezvous "
        "TCP store with the workers and keeps it across restarts; gloo stores every rank's "
        "address in it, so a restarted group can read the dead group's stale address, fail "
        "to connect and hang or crash into another restart (pytorch issue 135712). Fix, "
        f"either one is enough: set {_STORE_FIX}=1 in torchrun's environment (workload.env, "
        "the pod spec, the sbatch script) for a fresh store per rendezvous round, or give "
        "each restart attempt its own key prefix: wrap torchrun's store in "
        "dist.PrefixStore(f\"attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}/\", store) "
        "before init_process_group (on several nodes prefer the environment variable)."
    )


# ------------------------------------------------------------- collective timeout

_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (?:recv|send) operation")
_NCCL_TIMEOUT = re.compile(r"Timeout\(ms\)=(\d+)")
_DEFAULT_TIMEOUTS_MS = {1_800_000: "30-minute", 600_000: "10-minute (NCCL's)"}


def _collective_match(clues: Clues) -> str | None:
    if not clues.failed:
        return None
    for pattern in (_GLOO_TIMEOUT, _NCCL_TIMEOUT):
        for found in reversed(list(pattern.finditer(clues.output))):
            if int(found.group(1)) in _DEFAULT_TIMEOUTS_MS:
                return _line_of(clues.output, found)
    return None


def _collective_explain(clues: Clues, evidence: str) -> str:
    found = _GLOO_TIMEOUT.search(evidence) or _NCCL_TIMEOUT.search(evidence)
    milliseconds = int(found.group(1)) if found else 1_800_000
    default = _DEFAULT_TIMEOUTS_MS.get(milliseconds, "default")
    return (
        f"A collective waited {milliseconds // 60_000} minutes before it failed: the "
        f"{default} default timeout of torch.distributed.init_process_group. A peer was gone "
        "or hung (a stopped or unreachable worker, a vanished node), and the surviving ranks "
        "sat in the collective for all that time instead of failing and being restarted, so "
        "the job could not recover within maxRecoveryTime. Fix: pass "
        "timeout=datetime.timedelta(seconds=N) to init_process_group with N well below "
        "maxRecoveryTime (a few times your slowest collective), so a lost peer fails the "
        "step and the launcher restarts the group."
    )


# ------------------------------------------------------------- torch.load, truncated

_TRUNCATED = re.compile(
    r"PytorchStreamReader failed reading zip archive: failed finding central directory|"
    + _first_then("PytorchStreamReader failed reading file ", "invalid header|file read failed", 1)
    + r"|unexpected EOF, expected \d{1,19} more bytes\. The file might be corrupted"
    r"|pickle data was truncated",
    re.M,
)
_EOF_IN_LOAD = re.compile(
    r"torch/serialization\.py\", line \d+, in (?:load|_legacy_load)\n"
    r"(?:[^\n]*\n){0,8}?[^\n]*\bEOFError\b[^\n]*$",
    re.M,
)
#: torch 2.13's zip reader on a zip checkpoint of more than a few KiB cut short: a bare
#: EINVAL from ``PyTorchFileReader`` inside torch.load (captured:
#: tests/diagnosis/data/torch-load-zip-large-half.log). Only inside torch.load: an EINVAL
#: anywhere else says nothing about a checkpoint.
_EINVAL_IN_LOAD = re.compile(
    r"torch/serialization\.py\", line \d+, in load\n"
    r"(?:[^\n]*\n){0,6}?[^\n]*\bPyTorchFileReader\(\w*\)[^\n]*\n"
    r"(?:[^\n]*\n){0,3}?[^\n]*\bOSError: \[Errno 22\] Invalid argument[^\n]*$",
    re.M,
)


def _truncated_match(clues: Clues) -> str | None:
    if not clues.failed:
        return None
    found = _last(_TRUNCATED, clues.output)
    if found:
        return _line_of(clues.output, found)
    eof = _last(_EOF_IN_LOAD, clues.output)
    if eof:
        frame = eof.group(0).splitlines()[0].strip()  # File ".../torch/serialization.py", …
        return f"EOFError raised in torch.load ({frame})"
    einval = _last(_EINVAL_IN_LOAD, clues.output)
    if einval:
        frame = einval.group(0).splitlines()[0].strip()
        return f"OSError [Errno 22] from torch.load's zip reader, PyTorchFileReader ({frame})"
    return None


def _truncated_explain(clues: Clues, evidence: str) -> str:
    return (
        "A worker could not load its checkpoint: torch.load read a file that ends early. "
        "A save that was cut off (the kill landed during torch.save, a full disk, a copy "
        "still in flight) left a partial file under the name the resume code picks, and "
        "every restart now fails on it. Fix: write checkpoints atomically — torch.save into "
        "a temporary file in the same folder, flush and os.fsync it, then os.replace it onto "
        "the final name (examples/local/train.py's save_checkpoint) — and let the resume "
        "code fall back to the previous checkpoint when the newest one does not load."
    )


# ------------------------------------------------------------- node-local checkpoints

_LOCAL_PATH = re.compile(
    r"(\{tmpdir\}|\{pid\}|\$\{?TMPDIR\}?|\$\{?SLURM_TMPDIR\}?|/tmp/[^\s'\",]*"
    r"|/dev/shm[^\s'\",]*|/local_scratch[^\s'\",]*|/scratch/local[^\s'\",]*"
    r"|kubernetes\.io~empty-dir[^\s'\",]*)"
)


#: An argument that names where checkpoints go (``--ckpt-dir=…``, ``--out_dir …``, a path
#: with ``checkpoint`` in it); a log folder (torchrun's ``--log-dir``) is none.
_STORAGE_ARG = re.compile(r"ckpt|checkpoint|snapshot|save|out_?dir|output|resume", re.I)
_LOG_ARG = re.compile(r"^--?(log|tee|redirect|rdzv|master|trace|profil)", re.I)
#: A job saying it starts from scratch (nanoGPT: "Initializing a new model from scratch").
_FROM_SCRATCH = re.compile(r"^[^\n]*\bfrom scratch\b[^\n]*$", re.I | re.M)


def _storage_path(command: tuple[str, ...]) -> str | None:
    """A per-process or node-local path the command gives as checkpoint storage, if any."""
    for i, part in enumerate(command):
        found = _LOCAL_PATH.search(part)
        if found is None:
            continue
        key = part if part.startswith("-") else (command[i - 1] if i else "")
        if not key.startswith("-"):
            key = ""
        if _LOG_ARG.match(key):
            continue
        if _STORAGE_ARG.search(key.split("=", 1)[0]) or _STORAGE_ARG.search(found.group(1)):
            return found.group(1)
    return None


def _not_shared_match(clues: Clues) -> str | None:
    if clues.verdict is not Verdict.FAIL:
        return None
    if FailureReason.RESTARTED_FROM_SCRATCH not in clues.reasons:
        return None
    saved = clues.expected_resume_step or clues.checkpoints_before_kill
    if not saved:
        return None
    evidence = (
        f"resumed from step 0 although the checkpoint of step {saved} was completed before the kill"
    )
    where = _storage_path(clues.command)
    if where is not None:
        evidence += f"; the command names a per-process or node-local path: {where}"
    said = _last(_FROM_SCRATCH, clues.output)
    if said is not None:
        evidence += f"; the job printed: {_line_of(clues.output, said)}"
    return evidence


def _seen_resume(clues: Clues) -> str:
    """How the drill sees a resume: a reporter call, or the trainer's load line."""
    if clues.evidence is None:
        return (
            ", and call reporter.checkpoint_loaded(step) after loading so the drill sees the resume"
        )
    return ""


def _not_shared_explain(clues: Clues, evidence: str) -> str:
    option = resume_option(clues.evidence)
    if "; the job printed: " in evidence and "the command names" not in evidence:
        fix = (
            f"Fix: {option}."
            if option is not None
            else "Fix: resume whenever a checkpoint exists (nanoGPT: init_from='resume' when "
            f"out_dir holds ckpt.pt){_seen_resume(clues)}."
        )
        return (
            "The job saved checkpoints, but the replacement trained from step 0, and the job "
            "itself said it starts from scratch (quoted in the evidence): its resume is not "
            "switched on for a restart — nanoGPT's init_from='scratch', a resume flag or "
            "path the restart does not get. The storage is not to blame unless the replacement "
            f"could not see the folder. {fix}"
        )
    resume = (
        f"check that the resume looks where the saves go ({option})"
        if option is not None
        else f"check that the resume looks where the saves go{_seen_resume(clues)}"
    )
    return (
        "The job saved checkpoints, but the replacement did not load any and trained from "
        "step 0. Either its resume never loaded (the job starts from scratch on every start, "
        "or looks elsewhere than where the saves go), or the checkpoints were where only "
        "the dead worker could see them: a per-process folder (a path with the pid, the "
        "process's temporary folder), a node-local disk (/tmp, /dev/shm, $TMPDIR, "
        "$SLURM_TMPDIR, local scratch) when the replacement runs on another node, or a "
        "pod's emptyDir, which is gone with the pod. The evidence names the path when the "
        "command gives one as checkpoint storage. Fix: checkpoint to storage every "
        "replacement sees — a shared filesystem or a PersistentVolumeClaim (ReadWriteMany "
        "across nodes), or object storage — with the same path for every restart; "
        f"{resume}."
    )


# ------------------------------------------------------------- missing folder, first start

_MISSING_DIR = re.compile(  # bounded: each error line is searched a bounded stretch
    r"(?:FileNotFoundError|NotADirectoryError): \[Errno \d{1,9}\] [^\n]{0,256}?: "
    r"'([^'\n]{1,4096})'"
    r"|RuntimeError: Parent directory (\S{1,4096}) does not exist\."
)
_MAX_CANDIDATES = 256  # the last error lines looked at (each reads the 2000 characters before it)
_LISTING = re.compile(r"\b(?:listdir|scandir|iterdir|glob|walk)\(")
_CHECKPOINTISH = re.compile(r"checkpoint|ckpt|snapshot|save", re.I)


#: A frame that opens a file to read it (the load, not a listing of its folder).
_OPENING = re.compile(r"\b(?:torch\.load|open|_open_file|safe_open|load_file|load)\(")
#: A path that names a file (an extension), not a folder.
_FILE_NAME = re.compile(r"[^/\\]\.[A-Za-z0-9]{1,12}$")


def _missing(clues: Clues) -> tuple[str, str, str] | None:
    """What a first start failed on: (``folder``, ``file`` or ``path``, the path, the
    line quoted). ``folder``: a listing of it, or torch.save into it, says the folder was
    missing; ``file``: a load of a file name found no file (whether its folder existed
    the output does not say); ``path``: a checkpoint path, nothing says which."""
    if not clues.failed or clues.checkpoints_before_kill:
        return None  # a checkpoint was saved, so the folder existed: not a first start
    for found in reversed(list(_MISSING_DIR.finditer(clues.output))[-_MAX_CANDIDATES:]):
        line = _line_of(clues.output, found)
        if found.group(2) is not None:  # torch.save into a folder nobody made
            return "folder", found.group(2), line
        path = found.group(1) or ""
        before = clues.output[max(0, found.start() - 2000) : found.start()]
        recent = "\n".join(before.splitlines()[-6:])
        if _LISTING.search(recent):
            return "folder", path, line
        if _CHECKPOINTISH.search(path):
            opened = _OPENING.search(recent) or _FILE_NAME.search(path)
            return ("file" if opened else "path"), path, line
    return None


def _missing_dir_match(clues: Clues) -> str | None:
    found = _missing(clues)
    return found[2] if found is not None else None


def _missing_dir_explain(clues: Clues, evidence: str) -> str:
    kind, path, _ = _missing(clues) or ("path", "", "")
    if kind == "folder":
        return (
            "The job failed on its first start because the checkpoint folder did not exist "
            "yet. A fresh run has no checkpoints, so nothing has created the folder: the code "
            "that looks for a checkpoint to resume from (os.listdir, glob) or the first save "
            "(torch.save does not create folders) fails, and the drill never reaches a kill. "
            "Fix: create the folder before the first save and before looking for checkpoints "
            "(os.makedirs(folder, exist_ok=True)), and treat a missing or empty folder as a "
            "start from step 0."
        )
    what = (
        f"the checkpoint file it loads, {path!r}, did not exist"
        if kind == "file"
        else f"the checkpoint path {path!r} did not exist"
    )
    option = resume_option(clues.evidence)
    fix = (
        f"Fix: {option}."
        if option is not None
        else "Fix: load a checkpoint only when one exists (os.path.exists, or list the "
        "folder), and start from step 0 when there is none."
    )
    return (
        f"The job failed on its first start because {what}: a fresh run has no checkpoint "
        "yet, and its resume code loads one unconditionally (nanoGPT's init_from='resume' "
        "does), so every start before the first save fails and the drill never reaches a "
        f"kill. {fix}"
    )


# ------------------------------------------------------------- a missing Python package

_NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
_PIP_NAMES = {"yaml": "pyyaml", "sklearn": "scikit-learn", "PIL": "pillow", "cv2": "opencv-python"}


def _no_module_match(clues: Clues) -> str | None:
    if not clues.failed:
        return None
    found = _last(_NO_MODULE, clues.output)
    return _line_of(clues.output, found) if found else None


def _no_module_explain(clues: Clues, evidence: str) -> str:
    found = _NO_MODULE.search(evidence)
    module = found.group(1).split(".", 1)[0] if found else "the module"
    package = _PIP_NAMES.get(module, module)
    return (
        f"The training job itself could not import {module!r}: the Python that runs it "
        "(the job's virtualenv, container image or module environment — not necessarily "
        "the one RecoveryGate runs in) lacks that package, so every start fails before "
        f"training. Fix: install it where the job runs, pip install {package} (for torch, "
        "the build your hardware needs, e.g. pip install torch), or point the command at "
        "the interpreter that has it."
    )


# ------------------------------------------------------------- a reporter call without a step

#: The integrations' own warning (recoverygate.integrations.ray: report() without a step).
_NO_STEP = re.compile(r"recoverygate: [^\n]*without a step[^\n]*")


def _no_step_match(clues: Clues) -> str | None:
    if not clues.failed:
        return None
    found = _last(_NO_STEP, clues.output)
    return None if found is None else _line_of(clues.output, found)


def _no_step_explain(clues: Clues, evidence: str) -> str:
    return (
        "The job's workers reported their metrics without a step, so the reporter printed "
        "no progress or checkpoint line and the drill had nothing to trigger on or judge "
        "by — however many checkpoints the job saved (the workers' own warning is the "
        "evidence). A run that ends then is not too short: it is unreported. Fix: give "
        "every report its step — with recoverygate.integrations.ray, report(metrics, "
        "checkpoint=..., step=N) or a 'step' (or 'global_step') key in the metrics (Ray's "
        "torch_linear_example.py reports only {'loss': ...}); elsewhere, "
        "reporter.progress(step) and reporter.checkpoint_completed(step)."
    )


#: Every known signature, most specific first. The id is the anchor of its section in
#: docs/troubleshooting.md (a test keeps the two in step).
SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "torchrun-shared-tcp-store",
        "torchrun's shared rendezvous TCP store (pytorch issue 135712)",
        _tcp_store_match,
        _tcp_store_explain,
    ),
    Signature(
        "collective-timeout-default",
        "a collective timeout left at its default",
        _collective_match,
        _collective_explain,
    ),
    Signature(
        "torch-load-truncated",
        "torch.load on a truncated checkpoint",
        _truncated_match,
        _truncated_explain,
    ),
    Signature(
        "checkpoints-not-shared",
        "checkpoints saved, but the replacement trained from scratch",
        _not_shared_match,
        _not_shared_explain,
    ),
    Signature(
        "missing-checkpoint-dir",
        "no checkpoint folder or file on the first start",
        _missing_dir_match,
        _missing_dir_explain,
    ),
    Signature(
        "missing-python-package",
        "a Python package missing where the job runs",
        _no_module_match,
        _no_module_explain,
    ),
    Signature(
        "reporter-without-step",
        "metrics reported without a step",
        _no_step_match,
        _no_step_explain,
    ),
)


def clues_from(result: DrillResult, output: str = "", config: DrillConfig | None = None) -> Clues:
    """The clues of one drill: its result, the job's output and what the drill launched."""
    env: Mapping[str, str] = {}
    command: tuple[str, ...] = ()
    evidence: str | None = None
    if config is not None:
        command, env = config.workload.launched_with()
        if config.evidence is not None:
            evidence = config.evidence.preset or PATTERNS
    checkpoints: list[int] = [
        step
        for e in result.timeline
        if e.kind == "checkpoint"
        and isinstance(step := e.data.get("step"), int)
        and (result.kill_time is None or e.timestamp <= result.kill_time)
    ]
    if result.trigger_checkpoint is not None:
        checkpoints.append(result.trigger_checkpoint)
    return Clues(
        output=cap_lines(output[-_READ_LIMIT:])[0],
        verdict=result.verdict,
        reasons=result.reasons,
        killed=result.kill_time is not None,
        restarts=result.restarts,
        resume_step=result.resume_step,
        expected_resume_step=result.expected_resume_step,
        checkpoints_before_kill=max(checkpoints) if checkpoints else None,
        env=env,
        command=command,
        evidence=evidence,
    )


def diagnose(clues: Clues) -> tuple[Diagnosis, ...]:
    """Every known signature the clues show, in :data:`SIGNATURES` order."""
    found: list[Diagnosis] = []
    for signature in SIGNATURES:
        evidence = signature.match(clues)
        if evidence is not None:
            found.append(
                Diagnosis(
                    signature.id, signature.title, signature.explain(clues, evidence), evidence
                )
            )
    return tuple(found)
