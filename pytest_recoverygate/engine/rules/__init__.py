"""The verdict as a rule book: one small named function per rule, one ordered table.

Each rule takes the evidence of its scope (:data:`~.rule.SCOPES`) and returns the
:class:`~pytest_recoverygate.engine.verdict.Check` it fills — passed, failed with a
reason, or undecided with what would decide it — or None where it does not apply. The
judges (``engine.recovery``, ``engine.live``) read the evidence once, run the rules of
a scope in the table's order (:func:`~.rule.run`) and combine the checks into a verdict;
the state machine decides *when* to judge. docs/verdict-rules.md is generated from
:data:`TABLE` (``scripts/verdict-rules``; :mod:`.doc` renders it).

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
        tests=(
            "tests/test_engine_faults.py::test_a_hang_noticed_too_late_fails",
            "tests/test_engine_faults.py::test_a_hang_noticed_in_time_passes_with_the_detection_in_the_breakdown",
            "tests/test_examples_fake.py::test_each_fake_example_reaches_its_verdict",
        ),
        undecided=False,
    ),
    Rule(
        "new_incarnation",
        "new_incarnation",
        "kill",
        comeback.new_incarnation,
        (R.NEVER_CAME_BACK,),
        tests=(
            "tests/test_engine.py::test_never_came_back_is_decided_at_the_slo_plus_the_grace",
            "tests/test_engine.py::test_it_passes_when_the_job_resumes_from_the_latest_checkpoint",
        ),
    ),
    Rule(
        "step_contract",
        "step_contract",
        "kill",
        resume.step_contract,
        (),
        tests=(
            "tests/test_engine.py::test_it_passes_when_the_job_resumes_from_the_latest_checkpoint",
            "tests/test_engine.py::test_a_zero_based_job_is_never_passed_and_is_told_the_fix",
        ),
    ),
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
        tests=(
            "tests/test_engine.py::test_a_replacement_that_never_trains_fails_by_what_it_loaded",
        ),
        passes=False,
    ),
    Rule(
        "never_trained_progress",
        "progress_after_resume",
        "kill",
        resume.never_trained_progress,
        (R.STOPPED_PROGRESSING,),
        tests=(
            "tests/test_engine.py::test_it_fails_when_training_stops_after_the_resume",
            "tests/test_engine.py::test_a_job_that_finishes_right_after_resuming_is_inconclusive",
            "tests/test_engine.py::test_a_replacement_that_never_trains_fails_by_what_it_loaded",
        ),
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
        tests=(
            "tests/test_engine.py::test_an_expected_checkpoint_that_never_completed_is_named",
            "tests/test_engine_faults.py::test_count_stops_at_the_first_recovery_that_fails",
            "tests/test_engine.py::test_it_fails_a_resume_from_an_older_checkpoint",
            "tests/test_engine.py::test_a_resume_beyond_any_step_reached_fails",
            "tests/test_engine.py::test_progress_below_the_loaded_step_is_steps_replayed",
            "tests/test_engine.py::test_a_zero_based_job_is_never_passed_and_is_told_the_fix",
            "tests/test_engine.py::test_it_passes_when_the_job_resumes_from_the_latest_checkpoint",
        ),
    ),
    Rule(
        "recovery_time",
        "recovery_time",
        "kill",
        comeback.recovery_time,
        (R.TOO_SLOW,),
        tests=(
            "tests/test_engine.py::test_it_fails_a_recovery_slower_than_the_slo",
            "tests/test_engine.py::test_it_passes_when_the_job_resumes_from_the_latest_checkpoint",
        ),
    ),
    Rule(
        "lost_steps",
        "lost_steps",
        "kill",
        lost.lost_steps,
        (R.LOST_TOO_MANY_STEPS,),
        tests=(
            "tests/test_engine.py::test_it_fails_when_too_many_steps_were_lost",
            "tests/test_engine.py::test_it_passes_when_the_job_resumes_from_the_latest_checkpoint",
            "tests/test_engine.py::test_lost_steps_pass_only_when_the_upper_bound_is_within_the_limit",
        ),
    ),
    Rule(
        "state_digest",
        "state_digest",
        "kill",
        digest.state_digest,
        (R.STATE_DIFFERS,),
        tests=(
            "tests/test_engine_faults.py::test_a_differing_part_is_named",
            "tests/test_engine_faults.py::test_a_matching_digest_passes",
            "tests/test_examples_fake.py::test_each_fake_example_reaches_its_verdict",
        ),
    ),
    Rule(
        "counter_went_back",
        "progress_after_resume",
        "kill",
        sustain.counter_went_back,
        (R.RESTARTED_FROM_SCRATCH, R.STEPS_REPLAYED),
        tests=(
            "tests/test_engine_adversarial.py::test_a_counter_reset_after_the_first_step_is_no_pass",
            "tests/test_engine_adversarial.py::test_count_two_a_second_recovery_that_replays_after_a_held_line_fails",
        ),
        passes=False,
        undecided=False,
    ),
    Rule(
        "sustained",
        "progress_after_resume",
        "kill",
        sustain.sustained,
        (R.STOPPED_PROGRESSING,),
        tests=(
            "tests/test_engine_adversarial.py::test_max_stall_still_fails_a_job_that_stops_for_good",
            "tests/test_engine_faults.py::test_a_matching_digest_passes",
            "tests/test_engine.py::test_a_replacement_with_one_line_and_no_stride_is_inconclusive",
        ),
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
        tests=(
            "tests/test_engine_adversarial.py::test_a_lightning_rank_that_loaded_an_older_shard_fails",
            "tests/test_engine_patterns.py::test_a_silent_rank_is_unchecked_and_fails_only_with_all_ranks",
            "tests/test_engine_patterns.py::test_a_rank_whose_shard_differs_from_the_one_it_saved_fails_with_state_digest_matches",
            "tests/test_engine_patterns.py::test_every_rank_that_loaded_the_expected_step_passes",
        ),
        undecided=False,
    ),
    Rule(
        "saved_on_preempt",
        "saved_on_preempt",
        "kill",
        faults.saved_on_preempt,
        (R.NOT_SAVED_ON_PREEMPT,),
        tests=(
            "tests/test_engine_faults.py::test_saved_on_preempt_fails_a_job_that_ignores_sigterm",
            "tests/test_engine_faults.py::test_a_checkpoint_saved_in_the_grace_period_is_the_latest_and_used",
            "tests/test_examples_fake.py::test_each_fake_example_reaches_its_verdict",
        ),
        undecided=False,
    ),
    # ------------------------------------------------------- a kill nothing followed
    Rule(
        "hangs_instead_of_failing",
        "gave_up_loudly",
        "hung",
        faults.hangs_instead_of_failing,
        (R.HUNG_INSTEAD_OF_FAILING,),
        tests=("tests/test_engine_faults.py::test_a_job_that_hangs_instead_of_giving_up_fails",),
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
        tests=(
            "tests/test_engine_faults.py::test_until_budget_exhausted_passes_a_job_that_survives_its_budget_then_gives_up",
            "tests/test_examples_fake.py::test_each_fake_example_reaches_its_verdict",
        ),
        undecided=False,
    ),
    Rule(
        "budget_matches",
        "restart_budget",
        "drill",
        faults.budget_matches,
        (R.RESTART_BUDGET_MISMATCH,),
        tests=(
            "tests/test_engine_faults.py::test_a_job_that_gives_up_before_its_budget_fails",
            "tests/test_engine_faults.py::test_until_budget_exhausted_passes_a_job_that_survives_its_budget_then_gives_up",
            "tests/test_examples_fake.py::test_each_fake_example_reaches_its_verdict",
        ),
        undecided=False,
    ),
    Rule(
        "survived_too_many",
        "restart_budget",
        "drill",
        faults.survived_too_many,
        (R.RESTART_BUDGET_MISMATCH,),
        tests=("tests/test_engine_faults.py::test_a_job_that_survives_more_than_its_budget_fails",),
        passes=False,
        undecided=False,
    ),
    Rule(
        "gives_up_within_the_drill",
        "gave_up_loudly",
        "drill",
        faults.gives_up_within_the_drill,
        (),
        tests=(
            "tests/test_engine_faults.py::test_a_job_that_never_gives_up_without_a_restart_budget_is_inconclusive",
        ),
        passes=False,
    ),
    Rule(
        "recoveries",
        "recoveries",
        "drill",
        faults.recoveries,
        (),
        tests=(
            "tests/test_engine_faults.py::test_count_stops_at_the_first_recovery_that_fails",
            "tests/test_engine_adversarial.py::test_count_two_a_second_recovery_that_replays_after_a_held_line_fails",
            "tests/test_engine_faults.py::test_spread_places_the_kills_evenly_through_the_interval",
        ),
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
        (R.INCONCLUSIVE,),
        tests=("tests/test_live.py::test_a_healed_replacement_and_training_survivors_pass",),
    ),
    Rule(
        "survivors_kept_training",
        "survivors_kept_training",
        "live",
        live.survivors_kept_training,
        (R.SURVIVORS_STALLED,),
        tests=(
            "tests/test_live.py::test_survivors_that_wait_for_the_dead_replica_fail_as_soon_as_proven",
            "tests/test_live.py::test_a_healed_replacement_and_training_survivors_pass",
        ),
    ),
    Rule(
        "rejoin_time",
        "rejoin_time",
        "live",
        live.rejoin_time,
        (R.NEVER_REJOINED,),
        tests=(
            "tests/test_live.py::test_a_replica_that_never_rejoins_fails_at_max_rejoin_time",
            "tests/test_live.py::test_a_healed_replacement_and_training_survivors_pass",
            "tests/test_live.py::test_a_survivor_that_crashed_and_restarted_is_named_as_such",
        ),
    ),
    Rule(
        "rejoin_source",
        "rejoin_source",
        "live",
        live.rejoin_source,
        (R.REJOINED_FROM_SCRATCH, R.REJOINED_FROM_CHECKPOINT),
        tests=(
            "tests/test_live.py::test_a_replacement_that_loads_its_own_checkpoint_fails",
            "tests/test_live.py::test_a_replacement_from_scratch_fails",
            "tests/test_live.py::test_a_healed_replacement_and_training_survivors_pass",
            "tests/test_live.py::test_no_heal_line_past_step_one_is_inconclusive",
        ),
    ),
    Rule(
        "heal_step",
        "heal_step",
        "live",
        live.heal_step,
        (R.HEALED_TO_OLDER_STEP,),
        tests=(
            "tests/test_live.py::test_a_heal_to_an_older_step_fails",
            "tests/test_live.py::test_a_healed_replacement_and_training_survivors_pass",
        ),
    ),
    Rule(
        "live_lost_steps",
        "lost_steps",
        "live",
        live.live_lost_steps,
        (R.LOST_TOO_MANY_STEPS,),
        tests=(
            "tests/test_live.py::test_a_heal_to_an_older_step_fails",
            "tests/test_live.py::test_a_healed_replacement_and_training_survivors_pass",
        ),
        undecided=False,
    ),
    Rule(
        "live_state_digest",
        "state_digest",
        "live",
        live.live_state_digest,
        (R.STATE_DIFFERS,),
        tests=(
            "tests/test_live_digest.py::test_a_healed_replica_with_another_state_fails_state_differs",
            "tests/test_live_digest.py::test_a_healed_replica_with_the_survivor_s_state_passes",
            "tests/test_live_digest.py::test_without_a_peer_s_digest_the_comparison_is_not_a_pass",
        ),
    ),
)


def by_name(name: str) -> Rule | None:
    """The rule of that name, or None."""
    return next((rule for rule in TABLE if rule.name == name), None)
