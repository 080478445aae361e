"""Rules of a fault on the checkpoint storage (StorageFault): the fault met the job's
saves, a failed save was never counted (nor passed over in silence), the last durable
checkpoint was kept until a newer one was durable, a stalled storage did not hold the job
forever, and the job trained on once the storage was healthy again.

What the job did after the fault, when it failed loudly (or ``killAfter`` killed it), is
a recovery like any other: the ``kill`` rules judge it, the expected resume step being
the newest *durable* checkpoint (a save the fault hit is never one).
"""

from __future__ import annotations

from pytest_recoverygate.engine.rules.evidence import StorageEvidence
from pytest_recoverygate.engine.storage import StorageRecord
from pytest_recoverygate.engine.verdict import Check, FailureReason, format_seconds

__all__ = [
    "failed_save_not_counted",
    "fault_hit",
    "last_good_kept",
    "stall_handled",
    "trained_after_lift",
]

R = FailureReason


def _op(record: StorageRecord) -> str:
    """The first operation the fault hit, as a phrase: ``its write of X failed with
    ENOSPC 1.08s after the fault was armed``."""
    hit = record.hit
    if hit is None:
        return "no operation"
    after = format_seconds(max(hit.hit - (record.armed_at or hit.hit), 0.0))
    what = f"its {hit.op} of {hit.path or 'the folder'}"
    if hit.error == "held":
        return f"{what} was held from {after} after the fault was armed"
    if hit.error == "delayed":
        return f"{what} was delayed from {after} after the fault was armed"
    return f"{what} failed with {hit.error} {after} after the fault was armed"


def _save(record: StorageRecord) -> str:
    hit = record.hit
    return f"the save of step {hit.step}" if hit is not None and hit.step is not None else "a save"


def fault_hit(ev: StorageEvidence) -> Check:
    """The fault met the job: an operation under ``path`` failed, was held or was delayed
    while it was in effect. Nothing met by the end is undecided: the job writes (or reads)
    its checkpoints elsewhere, or never saved while the fault held."""
    record, spec = ev.record, ev.record.spec
    expected = f"an operation under {spec.path} meets the {spec.mode} fault"
    if record.hit is not None:
        return Check(
            "fault_hit",
            True,
            expected,
            {"failed": record.failed, "held": record.stalled, "first": _op(record)},
            f"the {spec.mode} fault met {_save(record) if spec.during == 'save' else 'the load'}"
            f": {_op(record)}",
        )
    writes = sum(1 for f in record.files.values() if record.in_effect(f.written))
    seen = (
        f"the job wrote {writes} file(s) there and none of their operations met it"
        if writes
        else "the job made no operation there that the fault acts on"
    )
    return Check(
        "fault_hit",
        None,
        expected,
        None,
        f"inconclusive: the {spec.mode} fault on {spec.path} met nothing ({seen}): the job "
        "keeps its checkpoints elsewhere, or did not save while the fault held; set "
        "injectFailure.path to the folder its saves write",
        R.INCONCLUSIVE,
    )


def failed_save_not_counted(ev: StorageEvidence) -> Check | None:
    """``during: save``: the save the fault hit was never counted: not reported complete
    (``checkpoint_completed``), no small file moved to name its step (a ``latest``
    pointer), and the job either failed loudly or said so (``checkpoint_failed``, a
    retry) — training on in silence past a failed save fails too."""
    record = ev.record
    hit = record.hit
    if record.spec.during != "save" or hit is None or hit.error in ("held", "delayed"):
        return None
    expected = "the failed save is not counted: the job fails loudly, or says so"
    save = _save(record)
    problems: list[str] = []
    for step, at, _ in record.swallowed:
        problems.append(
            f"checkpoint_completed({step}) came {format_seconds(max(at - hit.hit, 0.0))} later"
        )
        short = [
            f"{name} {event.detail}"
            for name, event in record.audit.items()
            if event.detail in ("missing", "short", "unreadable")
            and name in record.made_of.get(step, ())
        ]
        if short:
            problems.append(f"its files read back: {', '.join(short[:4])}")
    if record.pointer is not None:
        name, text, _ = record.pointer
        state = record.files.get(name)
        shown = (
            f"now -> {text}" if state is not None and state.link else f"it reads {text.strip()!r}"
        )
        problems.append(f"{name} was moved to name it ({shown})")
    if problems:
        return Check(
            "failed_save_not_counted",
            False,
            expected,
            "; ".join(problems),
            f"{save} failed ({_op(record)}) but was counted: " + "; ".join(problems),
            R.SAVE_FAILURE_SWALLOWED,
        )
    ended = hit.ended
    if record.job_failed is not None:
        at, shown = record.job_failed
        return Check(
            "failed_save_not_counted",
            True,
            expected,
            "failed loudly",
            f"{save} failed ({_op(record)}) and the job failed loudly "
            f"{format_seconds(max(at - hit.hit, 0.0))} later ({shown})",
        )
    if ended is not None and ended[1] in ("reported failed", "retried and completed"):
        said = record.said_failed.get(hit.step) if hit.step is not None else None
        how = f"checkpoint_failed({hit.step})" + (f": {said[1]}" if said and said[1] else "")
        return Check(
            "failed_save_not_counted",
            True,
            expected,
            ended[1],
            f"{save} failed ({_op(record)}) and the job said so ({how})"
            if ended[1] == "reported failed"
            else f"{save} failed ({_op(record)}) and the job retried it once the storage was "
            "healthy (its checkpoint completed after the lift)",
        )
    if ev.restarted:
        return None  # killAfter landed before the job said anything: the recovery decides
    moved_on = ended is not None or record.progress_after_lift
    if moved_on and ev.final:
        last = record.last_progress
        upto = f" to step {last[0]}" if last is not None else ""
        return Check(
            "failed_save_not_counted",
            False,
            expected,
            "trained on in silence",
            f"{save} failed ({_op(record)}) and the job neither failed nor said so: it "
            f"trained on{upto} without a checkpoint_failed line or a retry. A failed save "
            "must fail the job or be reported (reporter.checkpoint_failed(step, error), or an "
            "evidence pattern checkpointFailed)",
            R.SAVE_FAILURE_SWALLOWED,
        )
    return None


def last_good_kept(ev: StorageEvidence) -> Check | None:
    """``during: save``: the newest checkpoint that was durable when the fault struck kept
    all its files until a newer checkpoint was durable (retention that removes, truncates
    or replaces it first leaves none, or an older one, when the new save fails)."""
    record = ev.record
    if record.spec.during != "save" or record.hit is None:
        return None
    durable = record.durable
    expected = "the last durable checkpoint kept until a newer one is durable"
    if durable is None or not record.made_of.get(durable):
        why = (
            "no checkpoint was durable before the fault"
            if durable is None
            else f"the files of checkpoint {durable} were not seen being written (the storage "
            "layer was mounted after its save)"
        )
        return Check(
            "last_good_checkpoint_kept", True, expected, None, f"not checked: {why}", checked=False
        )
    files = record.made_of[durable]
    if record.deleted is not None:
        name, at, how = record.deleted
        armed = record.armed_at or at
        left = [s for s in record.durable_steps() if s < durable and record.intact(s)]
        shared = sorted(s for s, names in record.made_of.items() if name in names)
        after = (
            f"only checkpoint {max(left)}, an older one, was left"
            if left
            else "no durable checkpoint was left"
        )
        if len(shared) > 1:  # rewritten at every save: an index older checkpoints need too
            after = (
                f"{name} was part of checkpoints {', '.join(map(str, shared))} alike (the "
                "job rewrites it at each save), so no checkpoint is sure to be left"
            )
        return Check(
            "last_good_checkpoint_kept",
            False,
            expected,
            f"{name} {how}",
            f"checkpoint {durable}, the last durable one, lost {name} ({how}) "
            f"{format_seconds(max(at - armed, 0.0))} after the fault was armed, before a newer "
            f"checkpoint was durable: when {_save(record)} failed, {after}",
            R.LAST_GOOD_CHECKPOINT_DELETED,
        )
    return Check(
        "last_good_checkpoint_kept",
        True,
        expected,
        files[:8],
        f"checkpoint {durable}'s {len(files)} file(s) were kept while {_save(record)} "
        + ("failed" if record.hit.error not in ("held", "delayed") else f"was {record.hit.error}"),
    )


def stall_handled(ev: StorageEvidence) -> Check | None:
    """``mode: stall``: within ``maxStall`` of the first held operation the job failed
    loudly, trained on, or the storage came back and it trained on (a stall shorter than
    ``maxStall``); waiting that long on it fails (it waits forever on its storage, or at a
    barrier behind a rank that does)."""
    record = ev.record
    began = record.stall_began
    if record.spec.mode != "stall" or began is None:
        return None
    limit = ev.stall_limit
    expected = f"the job fails or goes on within {format_seconds(limit)} of a held operation"
    outcomes: list[tuple[float, str]] = []
    if record.job_failed is not None:
        outcomes.append((record.job_failed[0], f"it failed loudly ({record.job_failed[1]})"))
    if record.progress_after_stall is not None:
        step, at = record.progress_after_stall
        outcomes.append((at, f"it trained on (step {step})"))
    if outcomes:
        at, what = min(outcomes)
        waited = at - began
        ok = waited <= limit
        return Check(
            "storage_stall_handled",
            ok,
            expected,
            round(waited, 6),
            f"{format_seconds(waited)} after the storage began to hold the job's operations "
            f"({_op(record)}), {what}"
            + ("" if ok else f": longer than maxStall {format_seconds(limit)}"),
            None if ok else R.STALLED_ON_STORAGE,
        )
    if ev.now - began >= limit:
        return Check(
            "storage_stall_handled",
            False,
            expected,
            round(ev.now - began, 6),
            f"the job neither failed nor trained for {format_seconds(ev.now - began)} after "
            f"the storage began to hold its operations ({_op(record)}; maxStall "
            f"{format_seconds(limit)}): it waits "
            "on its storage, or at a barrier behind a rank that does, with no timeout",
            R.STALLED_ON_STORAGE,
        )
    return None


def trained_after_lift(ev: StorageEvidence) -> Check | None:
    """Without a restart: once the storage was healthy again the job kept training for the
    sustain window (``expectations.sustain``); a stall past the stall limit fails."""
    record, window = ev.record, ev.window
    if ev.restarted or record.lifted_at is None:
        return None
    spec = ev.spec
    expected = f"training for {spec.sustain.describe()} after the fault was lifted"
    if window is None:
        if ev.now - record.lifted_at >= ev.stall_limit or ev.final:
            return Check(
                "trained_after_lift",
                False if ev.now - record.lifted_at >= ev.stall_limit else None,
                expected,
                None,
                f"no step followed the lift ({record.lift_why}) for "
                f"{format_seconds(ev.now - record.lifted_at)}",
                R.STOPPED_PROGRESSING
                if ev.now - record.lifted_at >= ev.stall_limit
                else R.INCONCLUSIVE,
            )
        return None
    observed = {
        "steps": window.last[0] - window.start[0],
        "seconds": round(window.last[1] - window.start[1], 6),
        "lines": window.lines,
    }
    if window.held(spec.sustain, window.start[0] - 1):
        return Check(
            "trained_after_lift",
            True,
            expected,
            observed,
            f"trained {observed['steps']} steps over "
            f"{format_seconds(window.last[1] - window.start[1])} after the storage was healthy "
            f"again ({record.lift_why})",
        )
    if ev.now - window.last[1] >= window.stall_limit:
        return Check(
            "trained_after_lift",
            False,
            expected,
            observed,
            f"training stopped after the lift: its last step was {window.last[0]}, and none "
            f"followed for {format_seconds(ev.now - window.last[1])}",
            R.STOPPED_PROGRESSING,
        )
    if not ev.final:
        return None
    return Check(
        "trained_after_lift",
        None,
        expected,
        observed,
        f"inconclusive: the sustain window ({spec.sustain.describe()}) after the lift was "
        "not held by the drill's deadline",
        R.INCONCLUSIVE,
    )
