"""Rules of the resume: the step contract, the resume step, a replacement that never trained.

The resume step's rule is a chain: each stage below either decides the check or passes
it on (``None``), in the order the evidence is strongest first — a proven replay, a
first step that holds whatever the reporting grid, a cut save, a broken contract, the
expected step (named or ``latest``), and last what the step inferred proves.
:func:`unless_proven` then turns a FAIL that rests on the grid alone into an undecided
check.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pytest_recoverygate.engine.advice import load_fix, save_fix
from pytest_recoverygate.engine.ledger import Ledger
from pytest_recoverygate.engine.records import Inc, Resume
from pytest_recoverygate.engine.rules import wording
from pytest_recoverygate.engine.rules.evidence import KillEvidence
from pytest_recoverygate.engine.rules.wording import steps_text
from pytest_recoverygate.engine.verdict import Check, FailureReason, StepContract, format_seconds

__all__ = [
    "never_trained_progress",
    "never_trained_resume",
    "resume_step",
    "settle",
    "step_contract",
    "unless_proven",
]

R = FailureReason
NAME = "resume_step"


def step_contract(ev: KillEvidence) -> Check:
    """The job keeps the step contract (``progress(n)`` after the n-th completed step, as
    its first incarnation showed); a job that breaks it leaves the resume undecided. A
    metrics thread's 0, then 1 (its samples around a slow first step) breaks nothing."""
    contract = ev.contract
    if contract.breach is not None:
        return Check(
            "step_contract",
            None,
            "progress(n) after the n-th completed step",
            contract.describe(),
            "the job breaks the step contract, so the resume cannot be judged: "
            + wording.breach(contract.breach),
            R.INCONCLUSIVE,
        )
    return Check(
        "step_contract",
        True,
        "progress(n) after the n-th completed step",
        contract.describe(),
        f"step contract: {contract.describe()}",
    )


@dataclass(frozen=True, slots=True)
class _Resumed:
    """What the resume step's stages read, once."""

    ledger: Ledger
    inc: Inc
    resume: Resume
    expected: int | None
    floor: int | None
    explicit: bool
    contract: StepContract
    observed: int | None
    first: int | None
    completed: list[int]
    torn: set[int]
    evidence: str | None = None  # how the job reports (engine/advice.py)


def _read(ev: KillEvidence) -> _Resumed:
    inc, resume = ev.inc, ev.resume
    assert inc is not None
    assert resume is not None
    return _Resumed(
        ev.ledger,
        inc,
        resume,
        ev.expected,
        ev.floor,
        ev.explicit,
        ev.contract,
        resume.step,
        inc.first[0] if inc.first else None,
        sorted({c.step for c in ev.ledger.before(inc)}),
        set(ev.ledger.torn()),
        ev.spec.evidence,
    )


def _check(r: _Resumed, passed: bool | None, message: str, reason: FailureReason | None) -> Check:
    """The check, except a PASS on a step inferred from progress alone that a replacement
    which loaded a newer checkpoint and redid steps fits as well (then undecided)."""
    observed, first = r.observed, r.first
    if passed and r.resume.loaded is None and observed is not None and first is not None:
        # Inferred from progress alone: the first step also fits a replacement that
        # loaded a newer checkpoint and redid steps. Only a PASS needs to rule it out.
        inside = [c for c in r.completed if observed < c <= first]
        if inside:
            return Check(
                NAME,
                None,
                r.expected,
                observed,
                (
                    f"the replacement's first step ({first}) fits a resume from step "
                    f"{observed} as well as one that loaded checkpoint {inside[-1]} and "
                    f"redid steps: {load_fix(r.evidence)} so the drill knows which"
                ),
                R.INCONCLUSIVE,
            )
    return Check(NAME, passed, r.expected, observed, message, reason)


def _replayed(r: _Resumed) -> Check | None:
    """A first step at or below the loaded one: steps done again (unless the contract is
    broken, when a correct resume reads the same)."""
    resume, first, contract = r.resume, r.first, r.contract
    if resume.replayed and contract.breach is not None and first == resume.loaded:
        # A job that breaks the contract (progress(epoch)) reports the loaded step as
        # its first step after a correct resume too: no proof of a replay.
        return _check(
            r,
            None,
            (
                f"loaded checkpoint {resume.loaded} and then reported step {first}, but the "
                "job breaks the step contract (see step_contract), so that cannot be "
                "told from a correct resume"
            ),
            R.INCONCLUSIVE,
        )
    if resume.replayed:
        assert first is not None
        # One step done again, the loaded one: the classic off-by-one resume.
        hint = (
            " (a resume off by one, such as range(stored_epoch, …) with the index of the "
            "epoch just finished stored?)"
            if first == resume.loaded
            else " (progress went backwards after the resume)"
        )
        return _unreported_load(r) or _check(
            r,
            False,
            (
                f"loaded checkpoint {resume.loaded}, but the first step reported after it was "
                f"{first}: steps {first}–{resume.loaded} were done again{hint}"
            ),
            R.STEPS_REPLAYED,
        )
    return None


def _unreported_load(r: _Resumed) -> Check | None:
    """A load line naming a step no ``checkpoint_completed`` named, followed by that step
    as the first step: a silent save of it done again, or a load line naming the next
    step to run (the state of the step before): the lines cannot tell which."""
    resume, first = r.resume, r.first
    reported = {c.step for c in r.ledger.checkpoints}
    if first is None or first != resume.loaded or resume.loaded in reported:
        return None
    return _check(
        r,
        None,
        (
            f"the replacement's load line names step {resume.loaded}, which was never "
            f"reported saved, and its first step was {first}: either it loaded a "
            f"checkpoint of step {first} saved without a report and did that step again, "
            f"or its load line names the next step to run (the state of step {first - 1}). "
            "Make it decidable: "
            + (
                "call reporter.checkpoint_loaded(step) with the step the loaded checkpoint "
                "holds (the one checkpoint_completed reported for it)"
                if r.evidence is None
                else load_fix(r.evidence)
            )
        ),
        R.INCONCLUSIVE,
    )


def _below_expected(r: _Resumed) -> Check | None:
    """A first line that says the process had completed at most ``upper`` steps, below
    the expected step: an older checkpoint or scratch, whatever the reporting grid."""
    resume, expected, contract, first = r.resume, r.expected, r.contract, r.first
    scratch_sig = contract.fresh_start and first == contract.first_step
    if not (
        r.observed is None
        and resume.upper is not None
        and expected is not None
        and resume.upper < expected
        and (contract.breach is None or scratch_sig)
    ):
        return None
    # Whatever the reporting grid: a process whose first line says it had completed
    # ``upper`` steps (or fewer) resumed from no later than that.
    older = [c for c in r.completed if 0 < c <= resume.upper]
    if not older:
        return Check(
            NAME,
            False,
            expected,
            0,
            (
                f"resumed from step 0, expected step {expected} — the job restarted "
                f"from scratch (its first step was {first}, and no checkpoint at or "
                "below it was completed)"
            ),
            R.RESTARTED_FROM_SCRATCH,
        )
    return Check(
        NAME,
        False,
        expected,
        f"<= {resume.upper}",
        (
            f"resumed from step {resume.upper} or earlier, expected step {expected} — "
            f"its first step was {first}: the job resumed from an older checkpoint "
            f"(at most {older[-1]}) or from scratch"
        ),
        R.RESUMED_FROM_OLDER_CHECKPOINT,
    )


def _cut_save(r: _Resumed) -> Check | None:
    """A resume from a step whose save the kill cut before its completion was reported,
    newer than every durable checkpoint: a torn file or a late report, undecided."""
    observed, expected, ledger, inc = r.observed, r.expected, r.ledger, r.inc
    assert observed is not None
    cut = ledger.cut()
    loaded_by = ledger.load_window(inc)[1]
    durable = {
        c.step for c in ledger.checkpoints if c.time <= loaded_by and (c.lineage or c.inc) != inc.id
    }
    # A named step the kill cut counts too: naming it proves no save of it complete.
    newer = expected is None or observed > expected or (r.explicit and observed == expected)
    if not (observed in cut and observed not in durable and observed > 0 and newer):
        return None
    # Only a step newer than every durable checkpoint (or the one named): a resume from
    # an older one (or from 0) is a proven failure whether or not that save was torn.
    # Loaded a save the kill cut before its completion was reported. A torn file, or
    # one complete on disk whose report came late: the evidence cannot tell them
    # apart, so this is no FAIL (and certainly no PASS).
    never = "and never completed" if observed in r.torn else "before it was reported complete"
    return _check(
        r,
        None,
        (
            f"the replacement resumed from step {observed}, whose save started "
            f"{format_seconds(cut[observed])} before the kill and was cut {never}: "
            "either it loaded a torn checkpoint, or the checkpoint was complete and "
            "the job reports checkpoint_completed later than it becomes durable (after "
            f"a barrier, at the next hook). Make it decidable: {save_fix(r.evidence)}"
        ),
        R.INCONCLUSIVE,
    )


def _untrusted(r: _Resumed) -> Check | None:
    """A count the broken contract makes untrustworthy (unless it is a plain restart from
    scratch), a resume the ledger left undecided, or no checkpoint to expect."""
    observed, expected, contract, inc = r.observed, r.expected, r.contract, r.inc
    scratch = observed == 0 and (expected or 0) > 0
    fresh_signature = inc.loaded is None and contract.fresh_start and r.first == contract.first_step
    if contract.breach is not None and not (scratch and fresh_signature):
        return _check(
            r,
            None,
            (
                f"the replacement resumed from step {observed} by the job's own count, but "
                "the job breaks the step contract (see step_contract), so that count cannot "
                f"be trusted{_held_lines(r)}"
            ),
            R.INCONCLUSIVE,
        )
    if r.resume.undecided is not None:
        return _check(r, None, wording.undecided(r.resume.undecided), R.INCONCLUSIVE)
    if expected is None:
        return _check(
            r,
            False,
            f"resumed from step {observed}, but no checkpoint was seen to expect",
            R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
        )
    return None


def _held_lines(r: _Resumed) -> str:
    """Its first lines that read as lines of the state it held (a 0 before its first
    step, its first step printed several times), without checkpoint_loaded: the fix."""
    inc, first = r.inc, r.first
    shown = [f"a 0 before step {first}"] if inc.zero_dropped else []
    if inc.first_lines > 1:
        shown.append(f"step {first} printed {inc.first_lines} times")
    if not shown or inc.loaded is not None:
        return ""
    return (
        f"; its first lines ({' and '.join(shown)}) read as lines of the state it held, "
        "not as epochs: if a metrics thread prints them, report progress only after a "
        "step and call reporter.checkpoint_loaded(step) after loading"
    )


def _named(r: _Resumed) -> Check | None:
    """``resumeFromCheckpoint: step-N``: that step passes; one never completed fails."""
    observed, expected = r.observed, r.expected
    if observed == expected:
        return _check(r, True, f"resumed from step {observed} as expected", None)
    if expected not in r.completed:
        return _check(
            r,
            False,
            (
                f"resumed from step {observed}, expected step {expected} — checkpoint "
                f"{expected} was never completed; completed: {steps_text(r.completed)}"
            ),
            R.CHECKPOINT_NEVER_COMPLETED,
        )
    return None


def _shard_unreported(r: _Resumed, durable: set[int]) -> Check | None:
    """``latest``: every newer checkpoint lacks another rank's report of its shard."""
    observed, ledger = r.observed, r.ledger
    assert observed is not None
    how = "loaded" if r.resume.loaded is not None else "resumed from"
    unreported = ledger.unreported_shards(ledger.load_window(r.inc)[1])
    newer_ones = sorted(c for c in durable if c > observed)
    if not (
        observed in durable
        and observed not in unreported
        and newer_ones
        and all(c in unreported for c in newer_ones)
    ):
        return None
    # Every newer checkpoint lacks another rank's report of its own shard (the
    # kill cut its save or its report): the newest complete one may be this.
    ranks = sorted({rank for c in newer_ones for rank in unreported[c]})
    return _check(
        r,
        None,
        (
            f"{how} checkpoint {observed}, the newest one every rank reported "
            f"complete; checkpoint {steps_text(newer_ones, 3)} was reported "
            f"complete by the reporting rank but never by rank(s) "
            f"{', '.join(map(str, ranks))}, which reported their own save of "
            "earlier checkpoints: either that shard was torn and "
            f"{observed} is the latest complete checkpoint, or it was complete "
            "and the job resumed from an older one. Make it decidable: report "
            "checkpoint_completed(step) once every rank's shard is durable "
            "(after a barrier), or set injectFailure.delay so the kill does not "
            "cut a save"
        ),
        R.INCONCLUSIVE,
    )


def _beyond_seen(r: _Resumed) -> Check | None:
    """``latest``: a step newer than every checkpoint seen: a silent save (within the
    steps the job reached, undecided) or one beyond any step it reached (FAIL)."""
    observed, expected, ledger = r.observed, r.expected, r.ledger
    assert observed is not None
    if not observed > max(r.completed, default=-1):
        return None
    how = "loaded" if r.resume.loaded is not None else "resumed from"
    reach = ledger.reach_bound()
    if reach is not None and observed <= reach:
        # A checkpoint nobody reported complete: a survivor's silent save after
        # the kill, or a torn file. Only checkpoint_completed makes it evidence.
        return _check(
            r,
            None,
            (
                f"{how} checkpoint {observed}, which the drill never saw completed "
                f"(newer than every checkpoint seen, {expected}, and within the "
                f"steps the job reached, at most {reach}): a complete checkpoint "
                "written without a report, or a torn one. Make it decidable: "
                + (
                    "call reporter.checkpoint_completed(step) for every checkpoint the job "
                    "writes, on the rank that writes it"
                    if r.evidence is None
                    else save_fix(r.evidence)
                )
            ),
            R.INCONCLUSIVE,
        )
    return _check(
        r,
        False,
        (
            f"resumed from step {observed}, expected step {expected} — beyond any "
            f"step the job can have reached" + (f" (at most {reach})" if reach is not None else "")
        ),
        R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
    )


def _durable_by_load(ledger: Ledger, inc: Inc) -> set[int]:
    """The checkpoints durable by ``inc``'s load (its first step, when it reported none),
    less those a StorageFault proved not durable."""
    loaded_by = ledger.load_window(inc)[1]
    return {
        c.step
        for c in ledger.checkpoints
        if c.time <= loaded_by and c.step not in ledger.not_durable
    }


def _latest(r: _Resumed) -> Check | None:
    """``resumeFromCheckpoint: latest``: a checkpoint durable before the load and no older
    than the floor passes."""
    observed, expected, ledger = r.observed, r.expected, r.ledger
    assert observed is not None
    assert expected is not None
    durable = _durable_by_load(ledger, r.inc)
    lowest = r.floor if r.floor is not None else expected
    if observed in durable and observed >= lowest:
        return _check(r, True, f"resumed from the latest checkpoint, step {observed}", None)
    return _shard_unreported(r, durable) or _beyond_seen(r)


def _wrong_step(r: _Resumed) -> Check:
    """What a resume from another step than expected proves: scratch, a newer or an
    older checkpoint, a step no checkpoint holds (loaded), or steps done again."""
    observed, expected, resume, completed = r.observed, r.expected, r.resume, r.completed
    assert observed is not None
    assert expected is not None
    if observed == 0:
        what = "loaded checkpoint 0" if resume.loaded == 0 else "loaded no checkpoint"
        return _check(
            r,
            False,
            (
                f"resumed from step 0, expected step {expected} — the job restarted from "
                f"scratch ({what})"
            ),
            R.RESTARTED_FROM_SCRATCH,
        )
    if observed > expected:
        why = (
            f"checkpoint {observed} is not durable (a failed save, or damaged at rest)"
            if observed in r.ledger.not_durable
            else "the job resumed from a checkpoint newer than expected"
        )
        return _check(
            r,
            False,
            f"resumed from step {observed}, expected step {expected} — {why}",
            R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
        )
    if observed in completed:
        alt = (
            ""
            if resume.loaded is not None
            else " (or it loaded a newer one and redid steps: call checkpoint_loaded "
            "to tell them apart)"
        )
        return _check(
            r,
            False,
            (
                f"resumed from step {observed}, expected step {expected} — the job resumed "
                f"from an older checkpoint{alt}"
            ),
            R.RESUMED_FROM_OLDER_CHECKPOINT,
        )
    return _no_such_checkpoint(r)


def _no_such_checkpoint(r: _Resumed) -> Check:
    observed, expected, completed = r.observed, r.expected, r.completed
    assert observed is not None
    if r.resume.loaded is not None:
        return _check(
            r,
            False,
            (
                f"loaded checkpoint {observed}, expected step {expected} — no checkpoint of "
                f"step {observed} was completed (completed: {steps_text(completed)})"
            ),
            R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
        )
    above = [c for c in completed if c > observed]
    return _check(
        r,
        False,
        (
            f"resumed from step {observed}, expected step {expected} — no checkpoint exists "
            f"at step {observed}, so steps {observed + 1}–{above[0] if above else expected} "
            "were done again (a resume off by one, such as range(stored_epoch, …)?)"
        ),
        R.STEPS_REPLAYED,
    )


def _resume_check(ev: KillEvidence) -> Check:
    """The resume step's check, as the evidence reads (see :func:`unless_proven`)."""
    r = _read(ev)
    decided = _replayed(r) or _below_expected(r)
    if decided is not None:
        return decided
    if r.observed is None:
        why = r.resume.undecided
        unknown = "the resume step is unknown" if why is None else wording.undecided(why)
        return _check(r, None, unknown, R.INCONCLUSIVE)
    decided = _cut_save(r) or _untrusted(r)
    if decided is None:
        decided = _named(r) if r.explicit else _latest(r)
    return decided or _wrong_step(r)


def resume_step(ev: KillEvidence) -> Check | None:
    """The replacement resumed from the expected step: the step named by
    ``resumeFromCheckpoint``, or with ``latest`` a checkpoint durable before its load and
    no older than the newest one durable before it started. A FAIL needs proof whatever
    the reporting grid (a load line, a replay, a first step below the expected one); a
    replay of the loaded step alone names the off-by-one resume, unless a metrics thread
    printed it (progress only from threads that print no checkpoint, in the first run
    and after the load: the state it holds). Undecided: a load line
    naming a step no checkpoint_completed named followed by that step (a silent save
    done again, or a load line naming the next step to run), a replacement without
    checkpoint_loaded whose first lines may be a metrics thread ticking the state it
    holds (a 0 before its first step, its first step printed more than once, at a
    checkpoint's step), a resume from a save the kill cut, newer than every durable checkpoint (a
    torn save or a late report: ``KillDuringCheckpoint``), a job that breaks the step
    contract, a newer checkpoint another rank never reported complete, or one the drill
    never saw completed within the steps the job reached."""
    if not ev.trained:
        return None
    assert ev.resume is not None
    return unless_proven(_resume_check(ev), ev.resume, ev.expected, ev.contract, ev.spec.evidence)


def settle(ev: KillEvidence) -> Resume | None:
    """The resume once the resume rule proved it: a step unknown to the ledger that the
    rule proved to be 0 (nothing at or below the first line but step 0) becomes 0."""
    resume = ev.resume
    if resume is None or resume.step is not None or not ev.trained:
        return resume
    check = resume_step(ev)
    if check is not None and check.observed == 0 and check.passed is False:
        # Proven whatever the grid: nothing at or below its first line but step 0.
        return dataclasses.replace(resume, step=0, undecided=None)
    return resume


def unless_proven(
    verdict: Check,
    resume: Resume,
    expected: int | None,
    contract: StepContract,
    evidence: str | None = None,
) -> Check:
    """:func:`_resume_check`'s FAIL made undecided where it rests on a step inferred from
    the reporting grid (nothing loaded, nothing replayed, no upper bound below the
    expected step, the checkpoint not merely never completed): no proof, so no FAIL."""
    if (
        verdict.passed is False
        and resume.loaded is None
        and not resume.replayed
        and verdict.reason is not R.CHECKPOINT_NEVER_COMPLETED
        and not (resume.upper is not None and expected is not None and resume.upper < expected)
    ):
        # The failure rests on a step inferred from the reporting grid, not on what
        # holds whatever the grid: no proof, so no FAIL.
        return Check(
            verdict.name,
            None,
            verdict.expected,
            verdict.observed,
            f"inferred from the job's reporting grid ({contract.grid}), not proven: "
            f"{verdict.message}; {load_fix(evidence)} so the drill knows",
            R.INCONCLUSIVE,
        )
    return verdict


def never_trained_resume(ev: KillEvidence) -> Check | None:
    """A replacement that never trained past its resume: one that loaded nothing never
    came back (undecided when the job finished right after it came back; nothing claimed
    in a judgement before the end); one that loaded another step than expected resumed
    from the wrong checkpoint (with ``latest``, not one that loaded a checkpoint durable by
    its load and no older than the floor: that load was right, and a failure is the
    progress rule's)."""
    inc, expected = ev.inc, ev.expected
    if inc is None or ev.past is not None:
        return None
    if inc.loaded is None and not ev.final and ev.kill.job_ended is None:
        return None  # another check's failure was proven early: time decides nothing here
    if inc.loaded is None:
        if ev.finished_ok:
            return Check(
                NAME,
                None,
                expected,
                None,
                "inconclusive: the job finished right after it came back, before any "
                "training step; lengthen the run",
                R.INCONCLUSIVE,
            )
        return Check(
            NAME,
            False,
            expected,
            None,
            f"never came back: a new incarnation started but reported no training step "
            f"— {ev.ended}",
            R.NEVER_CAME_BACK,
        )
    if expected is not None and inc.loaded != expected and not _latest_loaded(ev, inc):
        return Check(
            NAME,
            False,
            expected,
            inc.loaded,
            f"loaded checkpoint {inc.loaded}, expected step {expected}",
            R.RESTARTED_FROM_SCRATCH
            if inc.loaded == 0
            else R.RESUMED_FROM_OLDER_CHECKPOINT
            if inc.loaded < expected
            else R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
        )
    return None


def _latest_loaded(ev: KillEvidence, inc: Inc) -> bool:
    """``resumeFromCheckpoint: latest``: the step ``inc`` loaded was durable by its load
    and no older than the floor, as :func:`_latest` holds a replacement that trained (a
    save that became durable after the replacement started was not there to load)."""
    if ev.explicit or inc.loaded is None:
        return False
    lowest = ev.floor if ev.floor is not None else ev.expected
    return inc.loaded in _durable_by_load(ev.ledger, inc) and (
        lowest is None or inc.loaded >= lowest
    )


def never_trained_progress(ev: KillEvidence) -> Check | None:
    """A replacement that loaded a checkpoint but made no step past it stopped
    progressing (undecided when the job finished right after resuming; nothing claimed in
    a judgement before the end)."""
    inc = ev.inc
    if inc is None or ev.past is not None or inc.loaded is None:
        return None
    if not ev.final and ev.kill.job_ended is None:
        return None  # another check's failure was proven early: time decides nothing here
    if ev.finished_ok:
        return Check(
            "progress_after_resume",
            None,
            f"a step after {inc.loaded}",
            None,
            "inconclusive: the job finished right after resuming, before any step past "
            f"checkpoint {inc.loaded}; lengthen the run",
            R.INCONCLUSIVE,
        )
    return Check(
        "progress_after_resume",
        False,
        f"a step after {inc.loaded}",
        None,
        f"training stopped progressing after resuming from step {inc.loaded} ({ev.ended})",
        R.STOPPED_PROGRESSING,
    )
