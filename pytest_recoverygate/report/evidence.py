"""What a drill keeps beyond its verdict: the job's own output, and what it means.

After the drill (cleanup included) the runner asks the backend for the job's output
(:class:`~pytest_recoverygate.registry.seams.JobOutputSource`, optional) and matches
it, with the result, against the known failure signatures
(:mod:`pytest_recoverygate.report.diagnosis`). The CLI prints the failing worker's last lines and
the diagnoses under the verdict; the report keeps the output files and the diagnoses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pytest_recoverygate.engine.machine import DrillResult, Verdict
from pytest_recoverygate.errors import describe_exception
from pytest_recoverygate.registry.seams import JobOutputSource
from pytest_recoverygate.report.diagnosis import Diagnosis, clues_from, diagnose
from pytest_recoverygate.shared.joboutput import EXCERPT_LINES, JobOutput
from pytest_recoverygate.shared.jobtext import mask_secrets

if TYPE_CHECKING:
    from pytest_recoverygate.config.schema import DrillConfig
    from pytest_recoverygate.registry.seams import Orchestrator

__all__ = ["Evidence", "gather_evidence"]

_DIAGNOSED = (Verdict.PASS, Verdict.FAIL, Verdict.ERROR)


@dataclass(frozen=True, slots=True)
class Evidence:
    """The job's output (``None``: the backend keeps none) and the diagnoses it supports."""

    job_output: JobOutput | None = None
    diagnoses: tuple[Diagnosis, ...] = ()

    def failing_tail(self, lines: int = EXCERPT_LINES) -> tuple[str, tuple[str, ...]] | None:
        """The failing worker's label and its last lines (up to its last error)."""
        if self.job_output is None:
            return None
        excerpt = self.job_output.excerpt(lines)
        if excerpt is None or not excerpt[1]:
            return None
        return excerpt


def gather_evidence(
    result: DrillResult, orchestrator: Orchestrator, config: DrillConfig | None = None
) -> Evidence:
    """Read the job's output from the backend (if it keeps any) and diagnose the result.

    Never raises: a backend that fails to hand over its output costs the output, not the
    verdict. What is kept is masked (:func:`~pytest_recoverygate.shared.jobtext.mask_secrets`:
    tokens, keys, ``password=`` values) after the diagnosis has read it whole.
    """
    output: JobOutput | None = None
    if isinstance(orchestrator, JobOutputSource):
        try:
            output = orchestrator.job_output()
        except Exception as exc:
            why = describe_exception(exc)
            output = JobOutput(note=f"the job's output could not be read: {why}")
    diagnoses: tuple[Diagnosis, ...] = ()
    if result.verdict in _DIAGNOSED:
        text = output.text if output is not None else ""
        diagnoses = diagnose(clues_from(result, text, config))
    return Evidence(_masked(output), tuple(_masked_diagnosis(d) for d in diagnoses))


def _masked(output: JobOutput | None) -> JobOutput | None:
    if output is None:
        return None
    workers = tuple(replace(w, text=mask_secrets(w.text)) for w in output.workers)
    return replace(output, workers=workers)


def _masked_diagnosis(diagnosis: Diagnosis) -> Diagnosis:
    return replace(
        diagnosis, text=mask_secrets(diagnosis.text), evidence=mask_secrets(diagnosis.evidence)
    )
