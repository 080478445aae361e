"""Replay equivalence: the killed run is the golden reference (``expectations.replay``).

After a resume from checkpoint L the replacement redoes the steps L+1..K that the killed
run had already done before the kill. If everything was restored (model, optimizer, LR
scheduler, RNG states, the data loader's position, the grad scaler) it computes the same
losses: bitwise on a deterministic CPU job, within a tolerance on GPUs. This module
compares the two runs' per-step losses (``reporter.progress(step, loss=, data=)``) and
says what that proves:

- ``report`` (the default): the figures only; never a check, never the verdict;
- ``exact``: every step both runs reported with a loss must have the same loss (and the
  same ``data`` fingerprint, where both gave one);
- a tolerance ``{rtol, atol, maxDivergentSteps}``: |new - old| <= atol + rtol * |old| on
  all but ``maxDivergentSteps`` of the compared steps.

A step whose ``data`` fingerprints differ diverged whatever its loss (the batch is not the
same one). Nothing to compare under ``exact`` or a tolerance is inconclusive, with what
would make it decidable (the ``loss`` argument, a ``delay``).

Pure: plain values in, a :class:`~pytest_recoverygate.engine.verdict.Check` and the
figures out. :func:`reference` picks the two runs' points from the ledger; :func:`judge`
is the rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_recoverygate.engine.ledger import Inc, Ledger
from pytest_recoverygate.engine.rules.evidence import KillEvidence
from pytest_recoverygate.engine.spec import ReplayMode, ReplaySpec
from pytest_recoverygate.engine.verdict import Check, FailureReason

__all__ = [
    "CHECK",
    "MAX_POINTS",
    "WHAT_TO_CHECK",
    "Point",
    "ReplayFigures",
    "ReplaySpec",
    "judge",
    "judge_kill",
    "points_of",
    "reference",
    "replay_figures",
    "replay_matches",
]

R = FailureReason

#: The check's name in the report.
CHECK = "replay_matches"
#: The most (step -> loss, data) points the ledger keeps per incarnation (oldest dropped).
MAX_POINTS = 4096  # the ledger's _MAX_REPLAY_POINTS
#: What a resume must restore for the steps it redoes to match.
WHAT_TO_CHECK = (
    "check what the resume restores: the data loader's position (sampler epoch and "
    "offset; a DataLoader iterator created at the resume draws from the global RNG, "
    "give it generator=), the RNG states (torch, CUDA, numpy, python), the LR scheduler, "
    "the optimizer and the grad scaler"
)

#: One reported step: its loss and its batch fingerprint, each None when not given.
Point = tuple[float | None, str | None]


@dataclass(frozen=True, slots=True)
class ReplayFigures:
    """The comparison of one recovery (the report's ``replay``).

    ``first_divergent_step`` is None when no step diverged beyond the allowance;
    ``max_rel_diff`` is relative to the killed run's value; ``data_matched`` is None when
    no compared step had a fingerprint from both runs; ``steps`` holds every compared
    step as (step, killed run's point, replacement's point), values as reported.
    """

    mode: ReplayMode
    steps_compared: int
    first_divergent_step: int | None
    divergent_steps: int
    max_abs_diff: float | None
    max_rel_diff: float | None
    data_matched: bool | None
    steps: tuple[tuple[int, Point, Point], ...] = ()
    resumed_from: int | None = None
    killed_at: int | None = None  # the killed run's last step with a loss

    def as_dict(self) -> dict[str, Any]:
        rows = []
        for step, (old, old_data), (new, new_data) in self.steps:
            row: dict[str, Any] = {"step": step, "killed": _json(old), "replacement": _json(new)}
            if old_data is not None or new_data is not None:
                row["killedData"], row["replacementData"] = old_data, new_data
            rows.append(row)
        return {
            "mode": self.mode,
            "stepsCompared": self.steps_compared,
            "firstDivergentStep": self.first_divergent_step,
            "divergentSteps": self.divergent_steps,
            "maxAbsDiff": _json(self.max_abs_diff),
            "maxRelDiff": _json(self.max_rel_diff),
            "dataMatched": self.data_matched,
            "resumedFrom": self.resumed_from,
            "killedRunLastStep": self.killed_at,
            "steps": rows,
        }


def _json(value: float | None) -> float | str | None:
    """A float the JSON report can hold (NaN and infinities as text, like the wire)."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


# ---------------------------------------------------------------------------- evidence


def points_of(inc: Inc) -> Mapping[int, Point]:
    """The (loss, data) points an incarnation reported, by step."""
    return inc.replay_points


def reference(ledger: Ledger, kill_index: int, kill_time: float, judged: Inc) -> Inc | None:
    """The killed run: the reporting rank's incarnation before kill ``kill_index``.

    With torchrun the whole group restarts, so it is that rank's old process even when
    another rank was the target. Of the workers seen before the kill, the one whose last
    progress line before it is the newest; None when none reported a loss or data.
    """
    best: Inc | None = None
    for inc in ledger.order:
        if inc is judged or inc.born >= kill_index or ledger.is_child(inc):
            continue
        if not inc.replay_points or inc.first_seen > kill_time or inc.last is None:
            continue
        if best is None or (best.last is not None and inc.last[1] > best.last[1]):
            best = inc
    return best


# ---------------------------------------------------------------------------- the rule


def judge(
    killed: Mapping[int, Point],
    replacement: Mapping[int, Point],
    spec: ReplaySpec,
    *,
    resumed_from: int | None = None,
) -> tuple[Check | None, ReplayFigures | None]:
    """Compare the steps both runs reported with a loss; the check (None with ``report``)
    and the figures (None when neither run reported a loss and nothing is judged).

    Only steps past ``resumed_from`` are replayed steps: a line of the replacement at or
    below the step it resumed from is the state it loaded, or a step it should not have
    redone (which the resume checks judge), never a replay of the killed run's.
    """
    floor = -1 if resumed_from is None else resumed_from
    common = sorted(
        step
        for step, (loss, _) in replacement.items()
        if step > floor and loss is not None and step in killed and killed[step][0] is not None
    )
    killed_losses = [s for s, (loss, _) in killed.items() if loss is not None]
    killed_at = max(killed_losses, default=None)
    if not common:
        if not spec.judges:
            return None, None
        return _nothing(killed, replacement, resumed_from, killed_at), ReplayFigures(
            spec.mode, 0, None, 0, None, None, None, (), resumed_from, killed_at
        )
    figures = _figures(
        killed, replacement, spec, common, resumed_from=resumed_from, killed_at=killed_at
    )
    if not spec.judges:
        return None, figures
    return _check(spec, figures), figures


def _figures(
    killed: Mapping[int, Point],
    replacement: Mapping[int, Point],
    spec: ReplaySpec,
    common: list[int],
    *,
    resumed_from: int | None,
    killed_at: int | None,
) -> ReplayFigures:
    divergent: list[int] = []
    abs_diffs: list[float] = []
    rel_diffs: list[float] = []
    data_seen = data_ok = 0
    rows: list[tuple[int, Point, Point]] = []
    for step in common:
        old, new = killed[step], replacement[step]
        rows.append((step, old, new))
        old_loss, new_loss = old[0], new[0]
        assert old_loss is not None
        assert new_loss is not None
        same_data = True
        if old[1] is not None and new[1] is not None:
            data_seen += 1
            same_data = old[1] == new[1]
            data_ok += same_data
        if not same_data or not spec.matches(old_loss, new_loss):
            divergent.append(step)
        diff = abs(new_loss - old_loss)
        if math.isfinite(diff):
            abs_diffs.append(diff)
            if old_loss != 0:
                rel_diffs.append(diff / abs(old_loss))
    first = divergent[0] if len(divergent) > spec.allowance else None
    return ReplayFigures(
        spec.mode,
        len(common),
        first,
        len(divergent),
        max(abs_diffs, default=None),
        max(rel_diffs, default=None),
        None if not data_seen else data_ok == data_seen,
        tuple(rows),
        resumed_from,
        killed_at,
    )


def _span(figures: ReplayFigures) -> str:
    first, last = figures.steps[0][0], figures.steps[-1][0]
    return f"step {first}" if first == last else f"steps {first}-{last}"


def _check(spec: ReplaySpec, figures: ReplayFigures) -> Check:
    expected = spec.describe()
    observed = {
        "stepsCompared": figures.steps_compared,
        "divergentSteps": figures.divergent_steps,
        "firstDivergentStep": figures.first_divergent_step,
        "maxAbsDiff": _json(figures.max_abs_diff),
    }
    n = figures.steps_compared
    if figures.first_divergent_step is None:
        how = (
            "bit for bit"
            if spec.mode == "exact"
            else f"within the tolerance ({figures.divergent_steps} outside it, "
            f"{spec.max_divergent_steps} allowed)"
        )
        return Check(
            CHECK,
            True,
            expected,
            observed,
            f"the replacement redid {n} step{'s' if n != 1 else ''} of the killed run "
            f"({_span(figures)}) {how}",
        )
    step = figures.first_divergent_step
    row = next(r for r in figures.steps if r[0] == step)
    (old, old_data), (new, new_data) = row[1], row[2]
    data = ""
    if old_data is not None and new_data is not None and old_data != new_data:
        data = (
            f"; its data differs (batch fingerprint {old_data!r} then {new_data!r}): the "
            "data loader's position was not restored"
        )
    return Check(
        CHECK,
        False,
        expected,
        observed,
        f"replay diverged at step {step}: the killed run's loss was {old!r}, the "
        f"replacement's {new!r}{data}; {figures.divergent_steps} of {n} compared steps "
        f"({_span(figures)}) diverged"
        + (f" ({spec.max_divergent_steps} allowed)" if spec.mode == "tolerance" else "")
        + f" — {WHAT_TO_CHECK}",
        R.REPLAY_DIVERGED,
    )


def _nothing(
    killed: Mapping[int, Point],
    replacement: Mapping[int, Point],
    resumed_from: int | None,
    killed_at: int | None,
) -> Check:
    """Inconclusive: no step both runs reported with a loss; why, and the fix."""
    has_old = any(loss is not None for loss, _ in killed.values())
    has_new = any(loss is not None for loss, _ in replacement.values())
    if not has_old and not has_new:
        why = (
            "the job reports no loss: pass it, reporter.progress(step, loss=loss) "
            "(a float or a 0-d tensor)"
        )
    elif not has_old or not has_new:
        which = "the killed run" if not has_old else "the replacement"
        why = f"{which} reported no loss: pass loss= to reporter.progress on every run"
    elif resumed_from is not None and killed_at is not None and killed_at <= resumed_from:
        why = (
            f"the killed run's last step with a loss was {killed_at}, not past the step it "
            f"resumed from ({resumed_from}): the kill came before any replayed step was "
            "reported; give injectFailure a delay (or keep expectations.replaySteps above 0)"
        )
    else:
        why = (
            "the replacement reported no step the killed run had reported with a loss: the "
            "reporter prints the first RECOVERYGATE_REPLAY_WINDOW steps after a checkpoint "
            "and a load; keep it above the steps between the checkpoint and the kill, or "
            "give injectFailure a shorter delay"
        )
    return Check(
        CHECK,
        None,
        "replayed steps reported with a loss by both runs",
        {"stepsCompared": 0},
        f"inconclusive: nothing to compare for replay: {why}",
        R.INCONCLUSIVE,
    )


def judge_kill(
    ledger: Ledger,
    spec: ReplaySpec,
    *,
    kill_index: int,
    kill_time: float,
    judged: Inc,
    resumed_from: int | None,
) -> tuple[Check | None, dict[str, Any] | None]:
    """The replay check and the report's figures of one kill, from the ledger."""
    old = reference(ledger, kill_index, kill_time, judged)
    killed = points_of(old) if old is not None else {}
    check, figures = judge(killed, points_of(judged), spec, resumed_from=resumed_from)
    return check, None if figures is None else figures.as_dict()


def _of_kill(ev: KillEvidence) -> tuple[Check | None, dict[str, Any] | None]:
    if not ev.trained or ev.inc is None or ev.settled is None:
        return None, None
    return judge_kill(
        ev.ledger,
        ev.spec.replay,
        kill_index=ev.kill.index,
        kill_time=ev.kill.time,
        judged=ev.inc,
        resumed_from=ev.settled.step,
    )


def replay_matches(ev: KillEvidence) -> Check | None:
    """The replacement redid the steps the killed run had done after the resume step with
    the same losses (``exact``: equal, and equal ``data`` fingerprints where both runs gave
    one; a tolerance: ``|new - old| <= atol + rtol*|old|`` on all but
    ``maxDivergentSteps``). Nothing to compare (no loss, or no replayed step reported
    before the kill) is undecided; ``report`` (the default) never fills the check."""
    return _of_kill(ev)[0]


def replay_figures(ev: KillEvidence) -> dict[str, Any] | None:
    """The report's ``replay`` figures of one kill (every mode, ``report`` included)."""
    return _of_kill(ev)[1]
