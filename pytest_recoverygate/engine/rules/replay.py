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
from dataclasses import dataclass, replace
from typing import Any

from pytest_recoverygate.engine.advice import loss_fix
from pytest_recoverygate.engine.caps import MAX_REPLAY_POINTS, MAX_STEP_LINES
from pytest_recoverygate.engine.ledger import Ledger
from pytest_recoverygate.engine.records import Inc
from pytest_recoverygate.engine.rules.evidence import KillEvidence
from pytest_recoverygate.engine.spec import ReplayMode, ReplaySpec
from pytest_recoverygate.engine.verdict import Check, FailureReason

__all__ = [
    "CHECK",
    "MAX_POINTS",
    "WHAT_TO_CHECK",
    "Point",
    "ReplayFigures",
    "judge",
    "judge_kill",
    "points_of",
    "printed_decimals",
    "reference",
    "replacements",
    "replay_figures",
    "replay_matches",
]

R = FailureReason

#: The check's name in the report.
CHECK = "replay_matches"
#: The most steps the ledger keeps per incarnation (oldest dropped).
MAX_POINTS = MAX_REPLAY_POINTS
#: What a resume must restore for the steps it redoes to match.
WHAT_TO_CHECK = (
    "check what the resume restores: the data loader's position (sampler epoch and "
    "offset; a DataLoader iterator created at the resume draws from the global RNG, "
    "give it generator=), the RNG states (torch, CUDA, numpy, python), the LR scheduler, "
    "the optimizer and the grad scaler"
)

#: One reported line of a step: its loss and its batch fingerprint, each None when not given.
Point = tuple[float | None, str | None]
#: Every line one run reported for one step, in order (a step reported once: one line).
Lines = tuple[Point, ...]
#: The most lines the ledger keeps per step; a step with that many is not compared.
MAX_LINES = MAX_STEP_LINES


@dataclass(frozen=True, slots=True)
class ReplayFigures:
    """The comparison of one recovery (the report's ``replay``).

    ``first_divergent_step`` is the first step beyond the allowance (the
    ``maxDivergentSteps + 1``-th divergent step; under ``exact`` the first), None when
    the divergent steps stay within it; ``max_rel_diff`` is relative to the killed run's
    value; ``data_matched`` is None when no compared step had a fingerprint from both
    runs; ``steps`` holds every compared step as (step, killed run's point, replacement's
    point), values as reported (of a step reported more than once, its first differing
    line, else its first); ``steps_skipped``: steps both runs reported that cannot be
    compared (a different number of lines); ``finite_losses``: compared lines whose two
    losses are finite numbers; ``diverged``: the compared steps that did not match (outside
    the tolerance, or whose data differs); ``printed_decimals``: the losses were read from
    lines the job printed with that many decimals (the fewest of either run), so equal
    ones are equal to that precision only, None when the job passed its losses itself.
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
    steps_skipped: int = 0
    lines_per_step: int = 1
    finite_losses: int = 0
    diverged: tuple[int, ...] = ()
    printed_decimals: int | None = None

    def as_dict(self) -> dict[str, Any]:
        rows = []
        for step, (old, old_data), (new, new_data) in self.steps:
            row: dict[str, Any] = {
                "step": step,
                "killed": _json(old),
                "replacement": _json(new),
                "matches": step not in self.diverged,
            }
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
            "stepsSkipped": self.steps_skipped,
            "linesPerStep": self.lines_per_step,
            "lossDecimals": self.printed_decimals,
            "steps": rows,
        }


def _json(value: float | None) -> float | str | None:
    """A float the JSON report can hold (NaN and infinities as text, like the wire)."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


# ---------------------------------------------------------------------------- evidence


def points_of(inc: Inc) -> Mapping[int, Lines]:
    """The (loss, data) lines an incarnation reported, by step."""
    return inc.replay_points


def printed_decimals(*incs: Inc | None) -> int | None:
    """The fewest decimals the losses of ``incs`` were printed with (read from log lines),
    None when none of them read its losses from a line."""
    found = [i.loss_decimals for i in incs if i is not None and i.loss_decimals is not None]
    return min(found, default=None)


def _candidates(ledger: Ledger, kill_index: int, kill_time: float, judged: Inc) -> list[Inc]:
    found = [
        inc
        for inc in ledger.order
        if inc is not judged
        and inc.born < kill_index
        and not ledger.is_child(inc)
        and not ledger.rankless.stands_in(inc.rank)
        and inc.replay_points
        and inc.first_seen <= kill_time
        and _last_before(inc, kill_time) is not None
        and (judged.rank is None or inc.rank is None or inc.rank == judged.rank)
    ]
    ranked = [inc for inc in found if inc.rank is not None]
    # issue 41: a process that named no rank stands for the judged rank only when no
    # process of that rank reported
    return ranked if judged.rank is not None and ranked else found


def _last_before(inc: Inc, kill_time: float) -> float | None:
    """When the incarnation printed its last progress line at or before the kill (None:
    none): its lines after the kill are not the killed run's (a survivor, or a process
    relaying the replacement's lines)."""
    if inc.last is not None and inc.last[1] <= kill_time:
        return inc.last[1]
    before = [at for _, at in inc.points if at <= kill_time]  # its first steps only
    for line in (inc.before_kill, inc.advanced):
        if line is not None and line[1] <= kill_time:
            before.append(line[1])
    return max(before, default=None)


def reference(ledger: Ledger, kill_index: int, kill_time: float, judged: Inc) -> Inc | None:
    """The killed run: the judged replacement's rank's incarnation before kill ``kill_index``.

    With torchrun the whole group restarts, so it is that rank's old process even when
    another rank was the target. Of that rank's workers seen before the kill (those that
    named no rank only when no worker of that rank reported; any rank's when the
    replacement names none), the one whose last progress line *before the kill* is the
    newest; None when none reported a loss or data.
    """
    best: Inc | None = None
    best_at = -math.inf
    for inc in _candidates(ledger, kill_index, kill_time, judged):
        at = _last_before(inc, kill_time)
        if at is not None and at > best_at:
            best, best_at = inc, at
    return best


def replacements(ledger: Ledger, kill_index: int, judged: Inc) -> list[Inc]:
    """Every other worker that came back for kill ``kill_index`` with a loss or data:
    another rank's (``reportingRank: all``), or an earlier replacement of the judged
    rank that ended (each is compared with its rank's killed run)."""
    return [
        inc
        for inc in ledger.order
        if inc is not judged
        and inc.born == kill_index
        and not ledger.is_child(inc)
        and not ledger.rankless.stands_in(inc.rank)
        and inc.replay_points
    ]


# ---------------------------------------------------------------------------- the rule


def _lines(value: Point | Lines) -> Lines:
    """A step's lines (a single :data:`Point` is a step reported once)."""
    if value and not isinstance(value[0], tuple):
        return (value,)
    return value


def _pairs_ok(old: Lines, new: Lines) -> bool:
    """Whether every line pair has something to compare (two losses or two fingerprints)."""
    return all(
        (a[0] is not None and b[0] is not None) or (a[1] is not None and b[1] is not None)
        for a, b in zip(old, new, strict=True)
    )


def _select(
    killed: Mapping[int, Lines], replacement: Mapping[int, Lines], floor: int
) -> tuple[list[int], int, int]:
    """The steps compared, the steps both reported that are not, and the lines per step.

    A job may report a step more than once (a line per micro-batch); past the reporter's
    replay window the rate limit keeps only some of them, and which depends on timing. So
    a step is compared only when both runs reported it with the job's full number of lines
    (the most either run reported for a step); a step with fewer lines on either side (a
    sample, the killed run's last step cut by the kill, a step still being reported) or
    a different number of lines is skipped, never judged.
    """
    both = sorted(s for s in replacement if s > floor and s in killed)
    per_step = max((max(len(killed[s]), len(replacement[s])) for s in both), default=1)
    compared = [
        s
        for s in both
        if len(killed[s]) == len(replacement[s]) == per_step < MAX_LINES
        and _pairs_ok(killed[s], replacement[s])
    ]
    return compared, len(both) - len(compared), per_step


def judge(
    killed: Mapping[int, Point | Lines],
    replacement: Mapping[int, Point | Lines],
    spec: ReplaySpec,
    *,
    resumed_from: int | None = None,
    printed: int | None = None,
    evidence: str | None = None,
) -> tuple[Check | None, ReplayFigures | None]:
    """Compare the steps both runs reported; the check (None with ``report``) and the
    figures (None when neither run reported a loss or data and nothing is judged).

    Only steps past ``resumed_from`` are replayed steps: a line of the replacement at or
    below the step it resumed from is the state it loaded, or a step it should not have
    redone (which the resume checks judge), never a replay of the killed run's.
    ``printed``: the losses were read from lines printed with that many decimals;
    ``evidence``: how the job reports (the fix a message gives, engine/advice.py).
    """
    old = {step: _lines(v) for step, v in killed.items()}
    new = {step: _lines(v) for step, v in replacement.items()}
    floor = -1 if resumed_from is None else resumed_from
    common, skipped, per_step = _select(old, new, floor)
    killed_at = max((s for s, ls in old.items() if any(p[0] is not None for p in ls)), default=None)
    if not common:
        if not spec.judges:
            return None, None
        reason = _why_nothing(
            old,
            new,
            resumed_from=resumed_from,
            killed_at=killed_at,
            skipped=skipped,
            per_step=per_step,
            evidence=evidence,
        )
        why = _nothing(reason, skipped)
        return why, ReplayFigures(
            spec.mode, 0, None, 0, None, None, None, (), resumed_from, killed_at, skipped, per_step
        )
    figures = _figures(old, new, spec, common, (resumed_from, killed_at, skipped, per_step))
    figures = replace(figures, printed_decimals=printed)
    if not spec.judges:
        return None, figures
    return _check(spec, figures, evidence), figures


def _compare(
    old: Lines, new: Lines, spec: ReplaySpec, acc: dict[str, Any]
) -> tuple[bool, Point, Point]:
    """Whether one step's lines all match; the row to show (its first differing line)."""
    row: tuple[Point, Point] | None = None
    for a, b in zip(old, new, strict=True):
        same = True
        if a[1] is not None and b[1] is not None:
            acc["data_seen"] += 1
            same = a[1] == b[1]
            acc["data_ok"] += same
        if a[0] is not None and b[0] is not None:
            same = spec.matches(a[0], b[0]) and same
            diff = abs(b[0] - a[0])
            if math.isfinite(diff):
                acc["finite"] += 1
                acc["abs"].append(diff)
                if a[0] != 0:
                    acc["rel"].append(diff / abs(a[0]))
        if not same and row is None:
            row = (a, b)
    shown = row or (old[0], new[0])
    return row is None, shown[0], shown[1]


def _figures(
    killed: Mapping[int, Lines],
    replacement: Mapping[int, Lines],
    spec: ReplaySpec,
    common: list[int],
    where: tuple[int | None, int | None, int, int],
) -> ReplayFigures:
    resumed_from, killed_at, skipped, per_step = where
    acc: dict[str, Any] = {"data_seen": 0, "data_ok": 0, "finite": 0, "abs": [], "rel": []}
    divergent: list[int] = []
    rows: list[tuple[int, Point, Point]] = []
    for step in common:
        same, old, new = _compare(killed[step], replacement[step], spec, acc)
        rows.append((step, old, new))
        if not same:
            divergent.append(step)
    allowance = spec.allowance
    return ReplayFigures(
        spec.mode,
        len(common),
        divergent[allowance] if len(divergent) > allowance else None,
        len(divergent),
        max(acc["abs"], default=None),
        max(acc["rel"], default=None),
        None if not acc["data_seen"] else acc["data_ok"] == acc["data_seen"],
        tuple(rows),
        resumed_from,
        killed_at,
        skipped,
        per_step,
        acc["finite"],
        tuple(divergent),
    )


def _span(figures: ReplayFigures) -> str:
    first, last = figures.steps[0][0], figures.steps[-1][0]
    return f"step {first}" if first == last else f"steps {first}-{last}"


def _observed(figures: ReplayFigures) -> dict[str, Any]:
    return {
        "stepsCompared": figures.steps_compared,
        "divergentSteps": figures.divergent_steps,
        "firstDivergentStep": figures.first_divergent_step,
        "maxAbsDiff": _json(figures.max_abs_diff),
    }


def _check(spec: ReplaySpec, figures: ReplayFigures, evidence: str | None = None) -> Check:
    n = figures.steps_compared
    if figures.first_divergent_step is not None:
        return _diverged(spec, figures)
    if not figures.finite_losses:
        return _unproven(spec, figures, evidence)
    decimals = figures.printed_decimals
    how = (
        "bit for bit"
        if spec.mode == "exact"
        else f"within the tolerance ({figures.divergent_steps} outside it, "
        f"{spec.max_divergent_steps} allowed)"
    )
    if decimals is not None and spec.mode == "exact":
        how = (
            f"equal to the {decimals} printed decimal{'s' if decimals != 1 else ''} (the "
            "losses were read from the job's lines: a difference below that precision "
            "cannot be seen)"
        )
    return Check(
        CHECK,
        True,
        spec.describe(),
        _observed(figures),
        f"the replacement redid {n} step{'s' if n != 1 else ''} of the killed run "
        f"({_span(figures)}) {how}",
    )


def _unproven(spec: ReplaySpec, figures: ReplayFigures, evidence: str | None) -> Check:
    """Inconclusive: the compared steps agree, but no finite loss was compared."""
    n = figures.steps_compared
    what = f"{n} compared step{'s' if n != 1 else ''} ({_span(figures)})"
    if (
        figures.data_matched is not None
        and figures.max_abs_diff is None
        and not any(old[0] is not None for _, old, _ in figures.steps)
    ):
        why = (
            f"the batch fingerprints of {what} matched, but no loss was compared: the data "
            f"position was restored, nothing shows the training state was; pass the loss: "
            f"{loss_fix(evidence)}"
        )
    else:
        why = (
            f"every loss of {what} is NaN or infinite in both runs: nothing finite shows "
            "the replacement trains the same; compare steps before the loss diverges "
            "(an earlier checkpoint, a delay)"
        )
    return Check(
        CHECK,
        None,
        spec.describe(),
        _observed(figures),
        f"inconclusive: replay not proven: {why}",
        R.INCONCLUSIVE,
    )


def _diverged(spec: ReplaySpec, figures: ReplayFigures) -> Check:
    step = figures.first_divergent_step
    n = figures.steps_compared
    row = next(r for r in figures.steps if r[0] == step)
    (old, old_data), (new, new_data) = row[1], row[2]
    what = f"the killed run's loss was {old!r}, the replacement's {new!r}"
    if old is None or new is None:
        what = "the batch differs"
    data = ""
    if old_data is not None and new_data is not None and old_data != new_data:
        data = (
            f"; its data differs (batch fingerprint {old_data!r} then {new_data!r}): the "
            "data loader's position was not restored"
        )
    allowed = f" ({spec.max_divergent_steps} allowed)" if spec.mode == "tolerance" else ""
    return Check(
        CHECK,
        False,
        spec.describe(),
        _observed(figures),
        f"replay diverged at step {step}: {what}{data}; {figures.divergent_steps} of {n} "
        f"compared steps ({_span(figures)}) diverged{allowed} — {WHAT_TO_CHECK}",
        R.REPLAY_DIVERGED,
    )


def _nothing(reason: str, skipped: int) -> Check:
    """Inconclusive: no step both runs reported comparably; why (``reason``), and the fix."""
    return Check(
        CHECK,
        None,
        "replayed steps reported with a loss by both runs",
        {"stepsCompared": 0, "stepsSkipped": skipped},
        f"inconclusive: nothing to compare for replay: {reason}",
        R.INCONCLUSIVE,
    )


def _why_nothing(
    killed: Mapping[int, Lines],
    replacement: Mapping[int, Lines],
    *,
    resumed_from: int | None,
    killed_at: int | None,
    skipped: int,
    per_step: int,
    evidence: str | None = None,
) -> str:
    loss_old = any(p[0] is not None for ls in killed.values() for p in ls)
    loss_new = any(p[0] is not None for ls in replacement.values() for p in ls)
    data_both = any(p[1] is not None for ls in killed.values() for p in ls) and any(
        p[1] is not None for ls in replacement.values() for p in ls
    )
    floor = -1 if resumed_from is None else resumed_from
    if not loss_old and not loss_new and not data_both:
        return f"the job reports no loss: pass it, {loss_fix(evidence)}"
    if loss_old != loss_new and not data_both:
        which = "the killed run" if not loss_old else "the replacement"
        fix = "pass loss= to reporter.progress" if evidence is None else loss_fix(evidence)
        return f"{which} reported no loss: {fix} on every run"
    if skipped:
        return (
            f"the {skipped} step{'s' if skipped != 1 else ''} both runs reported past the "
            f"resume {'were' if skipped != 1 else 'was'} reported a different number of times "
            f"(the job reports up to {per_step} lines per step) or without a loss on one side: "
            "a step is compared only when both runs printed all its lines with the same "
            "fields; report each step once, e.g. after the optimizer step"
        )
    old_steps = sorted(s for s in killed if s > floor)
    new_steps = sorted(s for s in replacement if s > floor)
    if not old_steps:
        return (
            f"the killed run's last step with a loss was {killed_at}, not past the step it "
            f"resumed from ({resumed_from}): the kill came before any replayed step was "
            "reported; give injectFailure a delay (or keep expectations.replaySteps above 0)"
        )
    last_old = old_steps[-1]
    if new_steps and new_steps[0] > last_old:
        return (
            f"the replacement resumed from {resumed_from} and its first reported step was "
            f"{new_steps[0]}, past the killed run's last ({last_old}): it did not redo the "
            f"steps {old_steps[0]}-{last_old} the killed run reported (or did not report them)"
        )
    return (
        f"the replacement reported none of the steps the killed run reported past "
        f"{resumed_from} ({old_steps[0]}-{last_old}); both runs must report the same steps "
        "(the reporter prints every call of the first RECOVERYGATE_REPLAY_WINDOW after a "
        "checkpoint and a load: keep it above the steps between the checkpoint and the kill)"
    )


def judge_kill(
    ledger: Ledger,
    spec: ReplaySpec,
    *,
    kill_index: int,
    kill_time: float,
    judged: Inc,
    resumed_from: int | None,
    evidence: str | None = None,
) -> tuple[Check | None, dict[str, Any] | None]:
    """The replay check and the report's figures of one kill, from the ledger: the judged
    replacement against its rank's killed run; when that holds (or cannot decide), every
    other replacement of the kill against its own rank's (the first that diverged fails
    the check, named by its rank)."""

    def one(inc: Inc, start: int | None) -> tuple[Check | None, ReplayFigures | None]:
        old = reference(ledger, kill_index, kill_time, inc)
        killed = points_of(old) if old is not None else {}
        printed = printed_decimals(old, inc)
        return judge(
            killed, points_of(inc), spec, resumed_from=start, printed=printed, evidence=evidence
        )

    check, figures = one(judged, resumed_from)
    if spec.judges and (check is None or check.passed is not False):
        for other in replacements(ledger, kill_index, judged):
            start = other.loaded if other.loaded is not None else resumed_from
            found = one(other, start)[0]
            if found is not None and found.passed is False:
                who = (
                    f"rank {other.rank}" if other.rank != judged.rank else "an earlier replacement"
                )
                check = replace(found, message=f"{who} (incarnation {other.id}): {found.message}")
                break
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
        evidence=ev.spec.evidence,
    )


def replay_matches(ev: KillEvidence) -> Check | None:
    """The replacement redid the steps the killed run had done after the resume step the
    same way: each replacement of the kill against its own rank's killed run, every line
    of a step (a step is compared only when both runs printed all its lines: the most
    either printed for a step); ``exact``: the same bits, and equal ``data``
    fingerprints where both runs gave one; a tolerance: ``|new - old| <= atol +
    rtol*|old|`` on all but ``maxDivergentSteps`` (the first step beyond them is the
    first divergent). A step whose fingerprints differ diverged, with or without a loss.
    Undecided: nothing to compare (no loss, no replayed step reported before the kill,
    steps reported a different number of times), or agreement with no finite loss
    compared (only NaN, or only fingerprints). ``report`` (the default) never fills it."""
    return _of_kill(ev)[0]


def replay_figures(ev: KillEvidence) -> dict[str, Any] | None:
    """The report's ``replay`` figures of one kill (every mode, ``report`` included)."""
    return _of_kill(ev)[1]
