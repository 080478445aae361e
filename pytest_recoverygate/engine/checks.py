"""The checks of one recovery, as the ledger's evidence decides them (pure).

Each function takes the :class:`~pytest_recoverygate.engine.ledger.Ledger` (what the job's lines
prove) and returns one :class:`~pytest_recoverygate.engine.verdict.Check`, passed, failed or
undecided with the fix: the step contract, the resume step (a FAIL only on what holds
whatever the reporting grid), a replacement that never trained, lost steps against their
bounds, the loaded state's digest, and the detection of a hang or a cut link.
"""

from __future__ import annotations

from pytest_recoverygate.engine.ledger import Inc, Ledger, Resume, steps_text
from pytest_recoverygate.engine.verdict import Check, FailureReason, StepContract, format_seconds

__all__ = [
    "contract_check",
    "detection_check",
    "digest_check",
    "lost",
    "lost_check",
    "no_progress_checks",
    "resume_check",
    "steps_text",
    "unless_proven",
]

R = FailureReason


def contract_check(ledger: Ledger, contract: StepContract) -> Check:
    if contract.problem is not None:
        return Check(
            "step_contract",
            None,
            "progress(n) after the n-th completed step",
            contract.describe(),
            f"the job breaks the step contract, so the resume cannot be judged: {contract.problem}",
            R.INCONCLUSIVE,
        )
    return Check(
        "step_contract",
        True,
        "progress(n) after the n-th completed step",
        contract.describe(),
        f"step contract: {contract.describe()}",
    )


def resume_check(
    ledger: Ledger,
    inc: Inc,
    resume: Resume,
    expected: int | None,
    floor: int | None,
    *,
    explicit: bool,
    contract: StepContract,
) -> Check:
    """The resume step's check, as the evidence reads (see :func:`unless_proven`)."""
    observed = resume.step
    first = inc.first[0] if inc.first else None
    completed = sorted({c.step for c in ledger.before(inc)})
    torn = ledger.torn()
    name = "resume_step"

    def check(passed: bool | None, message: str, reason: FailureReason | None) -> Check:
        if passed and resume.loaded is None and observed is not None and first is not None:
            # Inferred from progress alone: the first step also fits a replacement that
            # loaded a newer checkpoint and redid steps. Only a PASS needs to rule it out.
            inside = [c for c in completed if observed < c <= first]
            if inside:
                return Check(
                    name,
                    None,
                    expected,
                    observed,
                    (
                        f"the replacement's first step ({first}) fits a resume from step "
                        f"{observed} as well as one that loaded checkpoint {inside[-1]} and "
                        "redid steps: call reporter.checkpoint_loaded(step) after loading so "
                        "the drill knows which"
                    ),
                    R.INCONCLUSIVE,
                )
        return Check(name, passed, expected, observed, message, reason)

    if resume.replayed and contract.problem is not None and first == resume.loaded:
        # A job that breaks the contract (progress(epoch)) reports the loaded step as
        # its first step after a correct resume too: no proof of a replay.
        return check(
            None,
            (
                f"loaded checkpoint {resume.loaded} and then reported step {first}, but the "
                "job breaks the step contract (see step_contract), so that cannot be "
                "told from a correct resume"
            ),
            R.INCONCLUSIVE,
        )
    reported = {c.step for c in ledger.checkpoints}
    if (
        resume.replayed
        and first is not None
        and first == resume.loaded
        and resume.loaded not in reported
    ):
        # Its load line names a step no checkpoint_completed named, and its first step is
        # that step: a silent save of it done again, or a load line naming the next step
        # to run (the state of the step before): the lines cannot tell which.
        return check(
            None,
            (
                f"the replacement's load line names step {resume.loaded}, which was never "
                f"reported saved, and its first step was {first}: either it loaded a "
                f"checkpoint of step {first} saved without a report and did that step again, "
                f"or its load line names the next step to run (the state of step {first - 1}). "
                "Make it decidable: call reporter.checkpoint_loaded(step) with the step the "
                "loaded checkpoint holds (the one checkpoint_completed reported for it)"
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
        return check(
            False,
            (
                f"loaded checkpoint {resume.loaded}, but the first step reported after it was "
                f"{first}: steps {first}–{resume.loaded} were done again{hint}"
            ),
            R.STEPS_REPLAYED,
        )
    scratch_sig = contract.fresh_start and first == contract.first_step
    if (
        observed is None
        and resume.upper is not None
        and expected is not None
        and resume.upper < expected
        and (contract.problem is None or scratch_sig)
    ):
        # Whatever the reporting grid: a process whose first line says it had completed
        # ``upper`` steps (or fewer) resumed from no later than that.
        older = [c for c in completed if 0 < c <= resume.upper]
        if not older:
            return Check(
                name,
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
            name,
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
    if observed is None:
        return check(None, resume.undecided or "the resume step is unknown", R.INCONCLUSIVE)
    cut = ledger.cut()
    loaded_by = ledger.load_window(inc)[1]
    durable = {
        c.step for c in ledger.checkpoints if c.time <= loaded_by and (c.lineage or c.inc) != inc.id
    }
    newer = expected is None or observed > expected
    if observed in cut and observed not in durable and observed > 0 and newer:
        # Only a step newer than every durable checkpoint: a resume from an older one
        # (or from 0) is a proven failure whether or not that save was torn.
        # Loaded a save the kill cut before its completion was reported. A torn file, or
        # one complete on disk whose report came late: the evidence cannot tell them
        # apart, so this is no FAIL (and certainly no PASS).
        never = "and never completed" if observed in torn else "before it was reported complete"
        return check(
            None,
            (
                f"the replacement resumed from step {observed}, whose save started "
                f"{format_seconds(cut[observed])} before the kill and was cut {never}: "
                "either it loaded a torn checkpoint, or the checkpoint was complete and "
                "the job reports checkpoint_completed later than it becomes durable (after "
                "a barrier, at the next hook). Make it decidable: call "
                "reporter.checkpoint_completed(step) as soon as the checkpoint is durable "
                "on the rank that writes it"
            ),
            R.INCONCLUSIVE,
        )
    scratch = observed == 0 and (expected or 0) > 0
    fresh_signature = inc.loaded is None and contract.fresh_start and first == contract.first_step
    if contract.problem is not None and not (scratch and fresh_signature):
        shown = [f"a 0 before step {first}"] if inc.zero_dropped else []
        if inc.first_lines > 1:
            shown.append(f"step {first} printed {inc.first_lines} times")
        held = (
            f"; its first lines ({' and '.join(shown)}) read as lines of the state it held, "
            "not as epochs: if a metrics thread prints them, report progress only after a "
            "step and call reporter.checkpoint_loaded(step) after loading"
            if shown and inc.loaded is None
            else ""
        )
        return check(
            None,
            (
                f"the replacement resumed from step {observed} by the job's own count, but "
                "the job breaks the step contract (see step_contract), so that count cannot "
                f"be trusted{held}"
            ),
            R.INCONCLUSIVE,
        )
    if resume.undecided is not None:
        return check(None, resume.undecided, R.INCONCLUSIVE)
    if expected is None:
        return check(
            False,
            f"resumed from step {observed}, but no checkpoint was seen to expect",
            R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
        )
    how = "loaded" if resume.loaded is not None else "resumed from"
    if explicit:
        if observed == expected:
            return check(True, f"resumed from step {observed} as expected", None)
        if expected not in completed:
            return check(
                False,
                (
                    f"resumed from step {observed}, expected step {expected} — checkpoint "
                    f"{expected} was never completed; completed: {steps_text(completed)}"
                ),
                R.CHECKPOINT_NEVER_COMPLETED,
            )
    else:
        durable = {c.step for c in ledger.checkpoints if c.time <= ledger.load_window(inc)[1]}
        lowest = floor if floor is not None else expected
        if observed in durable and observed >= lowest:
            return check(True, f"resumed from the latest checkpoint, step {observed}", None)
        unreported = ledger.unreported_shards(ledger.load_window(inc)[1])
        newer_ones = sorted(c for c in durable if c > observed)
        if (
            observed in durable
            and observed not in unreported
            and newer_ones
            and all(c in unreported for c in newer_ones)
        ):
            # Every newer checkpoint lacks another rank's report of its own shard (the
            # kill cut its save or its report): the newest complete one may be this.
            ranks = sorted({r for c in newer_ones for r in unreported[c]})
            return check(
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
        if observed > max(completed, default=-1):
            reach = ledger.reach_bound()
            if reach is not None and observed <= reach:
                # A checkpoint nobody reported complete: a survivor's silent save after
                # the kill, or a torn file. Only checkpoint_completed makes it evidence.
                return check(
                    None,
                    (
                        f"{how} checkpoint {observed}, which the drill never saw completed "
                        f"(newer than every checkpoint seen, {expected}, and within the "
                        f"steps the job reached, at most {reach}): a complete checkpoint "
                        "written without a report, or a torn one. Make it decidable: call "
                        "reporter.checkpoint_completed(step) for every checkpoint the job "
                        "writes, on the rank that writes it"
                    ),
                    R.INCONCLUSIVE,
                )
            return check(
                False,
                (
                    f"resumed from step {observed}, expected step {expected} — beyond any "
                    f"step the job can have reached"
                    + (f" (at most {reach})" if reach is not None else "")
                ),
                R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
            )
    if observed == 0:
        what = "loaded checkpoint 0" if resume.loaded == 0 else "loaded no checkpoint"
        return check(
            False,
            (
                f"resumed from step 0, expected step {expected} — the job restarted from "
                f"scratch ({what})"
            ),
            R.RESTARTED_FROM_SCRATCH,
        )
    if observed > expected:
        return check(
            False,
            (
                f"resumed from step {observed}, expected step {expected} — the job resumed "
                "from a checkpoint newer than expected"
            ),
            R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
        )
    if observed in completed:
        alt = (
            ""
            if resume.loaded is not None
            else " (or it loaded a newer one and redid steps: call checkpoint_loaded "
            "to tell them apart)"
        )
        return check(
            False,
            (
                f"resumed from step {observed}, expected step {expected} — the job resumed "
                f"from an older checkpoint{alt}"
            ),
            R.RESUMED_FROM_OLDER_CHECKPOINT,
        )
    if resume.loaded is not None:
        return check(
            False,
            (
                f"loaded checkpoint {observed}, expected step {expected} — no checkpoint of "
                f"step {observed} was completed (completed: {steps_text(completed)})"
            ),
            R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
        )
    above = [c for c in completed if c > observed]
    return check(
        False,
        (
            f"resumed from step {observed}, expected step {expected} — no checkpoint exists "
            f"at step {observed}, so steps {observed + 1}–{above[0] if above else expected} "
            "were done again (a resume off by one, such as range(stored_epoch, …)?)"
        ),
        R.STEPS_REPLAYED,
    )


def unless_proven(
    verdict: Check, resume: Resume, expected: int | None, contract: StepContract
) -> Check:
    """:func:`resume_check`'s FAIL made undecided where it rests on a step inferred from
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
            f"{verdict.message}; call reporter.checkpoint_loaded(step) after loading so "
            "the drill knows",
            R.INCONCLUSIVE,
        )
    return verdict


def no_progress_checks(
    ledger: Ledger, inc: Inc, expected: int | None, ended: str, finished_ok: bool
) -> list[Check]:
    if inc.loaded is None:
        if finished_ok:
            return [
                Check(
                    "resume_step",
                    None,
                    expected,
                    None,
                    "inconclusive: the job finished right after it came back, before any "
                    "training step; lengthen the run",
                    R.INCONCLUSIVE,
                )
            ]
        return [
            Check(
                "resume_step",
                False,
                expected,
                None,
                f"never came back: a new incarnation started but reported no training step "
                f"— {ended}",
                R.NEVER_CAME_BACK,
            )
        ]
    checks: list[Check] = []
    if expected is not None and inc.loaded != expected:
        checks.append(
            Check(
                "resume_step",
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
        )
    if finished_ok:
        checks.append(
            Check(
                "progress_after_resume",
                None,
                f"a step after {inc.loaded}",
                None,
                "inconclusive: the job finished right after resuming, before any step past "
                f"checkpoint {inc.loaded}; lengthen the run",
                R.INCONCLUSIVE,
            )
        )
    else:
        checks.append(
            Check(
                "progress_after_resume",
                False,
                f"a step after {inc.loaded}",
                None,
                f"training stopped progressing after resuming from step {inc.loaded} ({ended})",
                R.STOPPED_PROGRESSING,
            )
        )
    return checks


def lost(ledger: Ledger, resume: Resume, judged: Inc | None) -> tuple[int | None, int | None]:
    """(proven, upper bound) of the steps done before the kill and done again after it."""
    if resume.step is None:
        return None, None
    proven, bound = ledger.last_before_kill(judged)
    lo = None if proven is None else max(proven - resume.step, 0)
    hi = None if bound is None else max(bound - resume.step, 0)
    return lo, hi


def lost_check(lost: tuple[int | None, int | None], limit: int) -> Check:
    lo, hi = lost
    observed = lo if hi is None or hi == lo else f"{lo}–{hi}"
    if hi is not None and hi <= limit:
        return Check(
            "lost_steps",
            True,
            f"<= {limit}",
            observed,
            f"lost {observed} step(s) (limit {limit})",
        )
    if lo is not None and lo > limit:
        return Check(
            "lost_steps",
            False,
            f"<= {limit}",
            observed,
            f"lost too many steps: {lo} > {limit}"
            + (f" (at most {hi})" if hi is not None and hi != lo else ""),
            R.LOST_TOO_MANY_STEPS,
        )
    span = (
        "an unknown number of"
        if lo is None
        else (f"at least {lo}" if hi is None else f"between {lo} and {hi}")
    )
    return Check(
        "lost_steps",
        None,
        f"<= {limit}",
        observed,
        f"the job lost {span} steps against a limit of {limit}: the last step before the "
        "kill is not known precisely enough; report progress on every step "
        "(RECOVERYGATE_PROGRESS_INTERVAL=0) to narrow the bound to a step or two, or "
        "allow that much more in maxLostSteps",
        R.INCONCLUSIVE,
    )


def digest_check(ledger: Ledger, inc: Inc, resume: Resume) -> Check | None:
    """The loaded state against the state saved at that step (stateDigestMatches)."""
    step = resume.loaded
    if step is None:
        return Check(
            "state_digest",
            None,
            "the saved state",
            None,
            "stateDigestMatches needs the replacement to report "
            "checkpoint_loaded(step, digest=…); it reported no checkpoint_loaded",
            R.INCONCLUSIVE,
        )
    saved = [c for c in ledger.checkpoints if c.step == step and c.digest is not None]
    if inc.loaded_digest is None:
        return Check(
            "state_digest",
            None,
            saved[-1].digest if saved else None,
            None,
            f"stateDigestMatches: the replacement loaded checkpoint {step} without a "
            "digest: pass digest=reporter.state_digest(...) to checkpoint_loaded",
            R.INCONCLUSIVE,
        )
    if not saved:
        return Check(
            "state_digest",
            None,
            None,
            inc.loaded_digest,
            f"stateDigestMatches: checkpoint {step} was saved without a digest (or its "
            "save was not seen): pass digest= to checkpoint_completed",
            R.INCONCLUSIVE,
        )
    want = saved[-1]
    if want.digest == inc.loaded_digest:
        return Check(
            "state_digest",
            True,
            want.digest,
            inc.loaded_digest,
            f"the loaded state equals the state saved at step {step}",
        )
    differ = [
        name for name, value in inc.loaded_parts if dict(want.parts).get(name) not in (None, value)
    ]
    missing = [name for name, _ in want.parts if name not in dict(inc.loaded_parts)]
    what = (
        ", ".join(
            [f"{name} state differs" for name in differ]
            + [f"{name} state missing" for name in missing]
        )
        or "the digests differ"
    )
    return Check(
        "state_digest",
        False,
        want.digest,
        inc.loaded_digest,
        f"loaded checkpoint {step} but the state differs from the one saved at step {step}: {what}",
        R.STATE_DIFFERS,
    )


def detection_check(
    ledger: Ledger,
    detected: float | None,
    limit: float | None,
    deadline_passed: bool,
    what: str = "the hung worker",
) -> Check:
    expected = f"<= {format_seconds(limit)}" if limit is not None else "noticed"
    if detected is None:
        return Check(
            "hang_detected",
            False if deadline_passed else None,
            expected,
            None,
            f"the job never noticed {what}: no rank failed and nothing was "
            "restarted (is the collective timeout left at its 30-minute default? set "
            "init_process_group(timeout=…) or a watchdog)",
            R.HANG_NOT_DETECTED if deadline_passed else R.INCONCLUSIVE,
        )
    ok = limit is None or detected <= limit
    return Check(
        "hang_detected",
        ok,
        expected,
        round(detected, 6),
        f"the job noticed {what} after {format_seconds(detected)}"
        + ("" if ok else f" > {format_seconds(limit or 0.0)}"),
        None if ok else R.HANG_NOT_DETECTED,
    )
