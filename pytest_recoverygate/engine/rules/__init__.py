"""The verdict as a rule book: one small named function per rule, one ordered table.

Each rule takes the evidence of its scope (:data:`~.rule.SCOPES`) and returns the
:class:`~pytest_recoverygate.engine.verdict.Check` it fills — passed, failed with a
reason, or undecided with what would decide it — or None where it does not apply. The
judges (``engine.recovery``, ``engine.live``) read the evidence once, run the rules of
a scope in the table's order (:func:`~.rule.run`) and combine the checks into a verdict;
the state machine decides *when* to judge. docs/verdict-rules.md is generated from
:data:`TABLE` (``python -m pytest_recoverygate.engine.rules --doc``).

Adding a rule: one function in the module of what it judges, one row here (in the place
its check belongs in the report), and its pinning scenario tests in ``tests=``.
"""

from __future__ import annotations

from pytest_recoverygate.engine.rules import (
    comeback,
    digest,
    faults,
    live,
    lost,
    ranks,
    resume,
    sustain,
)
from pytest_recoverygate.engine.rules.rule import SCOPES, Rule, run
from pytest_recoverygate.engine.verdict import FailureReason

__all__ = ["SCOPES", "TABLE", "Rule", "by_name", "run"]

R = FailureReason

#: Every rule of the verdict, in the order its checks appear in a report.
TABLE: tuple[Rule, ...] = (
    # ----------------------------------------------------------- each kill (restart mode)
    Rule(
        "detected",
        "hang_detected",
        "kill",
        comeback.detected,
        (R.HANG_NOT_DETECTED,),
        tests=(),
        undecided=False,
    ),
    Rule(
        "new_incarnation",
        "new_incarnation",
        "kill",
        comeback.new_incarnation,
        (R.NEVER_CAME_BACK,),
        tests=(),
    ),
    Rule("step_contract", "step_contract", "kill", resume.step_contract, (), tests=()),
    Rule(
        "never_trained_resume",
        "resume_step",
        "kill",
        resume.never_trained_resume,
        (
            R.NEVER_CAME_BACK,
            R.RESTARTED_FROM_SCRATCH,
            R.RESUMED_FROM_OLDER_CHECKPOINT,
            R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
        ),
        tests=(),
        passes=False,
    ),
    Rule(
        "never_trained_progress",
        "progress_after_resume",
        "kill",
        resume.never_trained_progress,
        (R.STOPPED_PROGRESSING,),
        tests=(),
        passes=False,
    ),
    Rule(
        "resume_step",
        "resume_step",
        "kill",
        resume.resume_step,
        (
            R.RESTARTED_FROM_SCRATCH,
            R.RESUMED_FROM_OLDER_CHECKPOINT,
            R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
            R.CHECKPOINT_NEVER_COMPLETED,
            R.STEPS_REPLAYED,
        ),
        tests=(),
    ),
    Rule("recovery_time", "recovery_time", "kill", comeback.recovery_time, (R.TOO_SLOW,), tests=()),
    Rule("lost_steps", "lost_steps", "kill", lost.lost_steps, (R.LOST_TOO_MANY_STEPS,), tests=()),
    Rule("state_digest", "state_digest", "kill", digest.state_digest, (R.STATE_DIFFERS,), tests=()),
    Rule(
        "counter_went_back",
        "progress_after_resume",
        "kill",
        sustain.counter_went_back,
        (R.RESTARTED_FROM_SCRATCH, R.STEPS_REPLAYED),
        tests=(),
        passes=False,
        undecided=False,
    ),
    Rule(
        "sustained",
        "progress_after_resume",
        "kill",
        sustain.sustained,
        (R.STOPPED_PROGRESSING,),
        tests=(),
    ),
    Rule(
        "all_ranks_resumed",
        "all_ranks_resumed",
        "kill",
        ranks.all_ranks_resumed,
        (
            R.RESTARTED_FROM_SCRATCH,
            R.RESUMED_FROM_OLDER_CHECKPOINT,
            R.RESUMED_FROM_UNEXPECTED_CHECKPOINT,
            R.STATE_DIFFERS,
        ),
        tests=(),
        undecided=False,
    ),
    Rule(
        "saved_on_preempt",
        "saved_on_preempt",
        "kill",
        faults.saved_on_preempt,
        (R.NOT_SAVED_ON_PREEMPT,),
        tests=(),
        undecided=False,
    ),
    # ------------------------------------------------------- a kill nothing followed
    Rule(
        "hangs_instead_of_failing",
        "gave_up_loudly",
        "hung",
        faults.hangs_instead_of_failing,
        (R.HUNG_INSTEAD_OF_FAILING,),
        tests=(),
        passes=False,
        undecided=False,
    ),
    # ------------------------------------------------------- the drill over its kills
    Rule(
        "gave_up_loudly",
        "gave_up_loudly",
        "drill",
        faults.gave_up_loudly,
        (),
        tests=(),
        undecided=False,
    ),
    Rule(
        "budget_matches",
        "restart_budget",
        "drill",
        faults.budget_matches,
        (R.RESTART_BUDGET_MISMATCH,),
        tests=(),
        undecided=False,
    ),
    Rule(
        "survived_too_many",
        "restart_budget",
        "drill",
        faults.survived_too_many,
        (R.RESTART_BUDGET_MISMATCH,),
        tests=(),
        passes=False,
        undecided=False,
    ),
    Rule(
        "gives_up_within_the_drill",
        "gave_up_loudly",
        "drill",
        faults.gives_up_within_the_drill,
        (),
        tests=(),
        passes=False,
    ),
    Rule(
        "recoveries",
        "recoveries",
        "drill",
        faults.recoveries,
        (),
        tests=(),
        undecided=False,
        note="a failure carries the reason of the first failed check of the first kill "
        "that did not pass",
    ),
    # ------------------------------------------------------- the kill of a live recovery
    Rule(
        "target_killed",
        "target_killed",
        "live",
        live.target_killed,
        (),
        tests=(),
    ),
    Rule(
        "survivors_kept_training",
        "survivors_kept_training",
        "live",
        live.survivors_kept_training,
        (R.SURVIVORS_STALLED,),
        tests=(),
    ),
    Rule("rejoin_time", "rejoin_time", "live", live.rejoin_time, (R.NEVER_REJOINED,), tests=()),
    Rule(
        "rejoin_source",
        "rejoin_source",
        "live",
        live.rejoin_source,
        (R.REJOINED_FROM_SCRATCH, R.REJOINED_FROM_CHECKPOINT),
        tests=(),
    ),
    Rule("heal_step", "heal_step", "live", live.heal_step, (R.HEALED_TO_OLDER_STEP,), tests=()),
    Rule(
        "live_lost_steps",
        "lost_steps",
        "live",
        live.live_lost_steps,
        (R.LOST_TOO_MANY_STEPS,),
        tests=(),
        undecided=False,
    ),
    Rule(
        "live_state_digest",
        "state_digest",
        "live",
        live.live_state_digest,
        (R.STATE_DIFFERS,),
        tests=(),
    ),
)


def by_name(name: str) -> Rule | None:
    """The rule of that name, or None."""
    return next((rule for rule in TABLE if rule.name == name), None)
