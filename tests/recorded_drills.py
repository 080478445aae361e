"""The twin drills whose verdicts every run re-decides from their recordings, and where
those recordings are.

A twin is a live drill whose fault, backend and way of killing another live drill of the
suite already exercises on real processes (its *sibling*, named beside it): what the twin
adds is a verdict, the engine's reading of a job that recovers otherwise (a save straight
to the final path, a budget that differs, a job that never loads, ...). That reading is
what this file keeps in every run. Each twin was run live once by ``scripts/test
--record-twins`` (the same test, its assertions and all, on real processes), which kept
its drills' report folders, transcript and report, in ``tests/fixtures/drills/<test>/``
when the test passed. ``tests/test_drill_recordings.py`` rejudges every one of them in the
quick lane, through a fresh engine with no clock: every answer as recorded, the report
value for value. A change of the engine that would change a twin's verdict, reasons,
figures or checks fails there, in seconds, without the minutes of its drill.

The drill lanes leave the twins out (they are marked ``recorded``, as the truth corpus'
replayed drills are: tests/conftest.py adds the mark from :data:`TWINS`);
``scripts/test --full`` runs them live with everything else, and ``scripts/test
--record-twins`` runs them live and records them again.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

__all__ = ["RECORDINGS", "RECORD_ENV", "TWINS", "record", "recording_folder"]

ROOT = Path(__file__).resolve().parent.parent
#: Where the twins' recordings live, one folder per test.
RECORDINGS = ROOT / "tests" / "fixtures" / "drills"
#: Set (to any value) by ``scripts/test --record-twins``: a passing twin's drills are
#: recorded into :data:`RECORDINGS`, replacing what was there.
RECORD_ENV = "RECOVERYGATE_RECORD_TWINS"

_FAULTS = "tests/local/test_local_faults.py::"
_STORAGE = "tests/local/test_local_storage.py::"
_RAY = "tests/ray/test_ray_drills.py::"
_SLURM = "tests/slurm/test_slurm_drills.py::"
_SLURM_RF = "tests/slurm/test_slurm_recovery_faults.py::"
_LIGHTNING = "tests/integrations/test_lightning_drills.py::"
_HF = "tests/integrations/test_transformers_drills.py::"
_TORN = "tests/integrations/test_torn_checkpoint_drills.py::"
_REPLAY = "tests/local/test_replay_drills.py::"
_TORCHFT = "tests/local/test_torchft_drills.py::"

#: Each twin (its pytest node id) and the sibling that keeps its fault and backend live.
TWINS: dict[str, str] = {
    # the fault catalogue on torchrun
    _FAULTS + "test_a_kill_mid_save_of_a_direct_save_crash_loops_and_fails": _FAULTS
    + "test_a_kill_mid_save_of_an_atomic_checkpoint_resumes_from_the_last_completed",
    _FAULTS + "test_a_job_that_ignores_sigterm_fails_saved_on_preempt": _FAULTS
    + "test_a_job_that_saves_on_sigterm_resumes_from_that_checkpoint",
    _FAULTS + "test_a_hang_with_the_default_timeout_is_never_noticed_and_fails": _FAULTS
    + "test_a_hang_with_a_short_collective_timeout_is_noticed_and_recovers",
    _FAULTS + "test_the_job_survives_its_restart_budget_then_gives_up_loudly": _FAULTS
    + "test_three_kills_each_judged_each_after_the_previous_recovery",
    _FAULTS + "test_a_restart_budget_other_than_the_launchers_fails": _FAULTS
    + "test_three_kills_each_judged_each_after_the_previous_recovery",
    _FAULTS + "test_a_kill_just_before_the_next_checkpoint_loses_the_worst_case": _FAULTS
    + "test_three_kills_each_judged_each_after_the_previous_recovery",
    _FAULTS + "test_four_kills_spread_over_the_interval_give_the_cost_distribution": _FAULTS
    + "test_three_kills_each_judged_each_after_the_previous_recovery",
    _FAULTS + "test_matching_digests_pass": _REPLAY
    + "test_a_job_that_restores_everything_replays_bit_for_bit",
    _FAULTS
    + "test_a_resume_that_loses_part_of_the_state_fails_on_that_part"
    + "[state-digest-fresh-optimizer.yaml-optimizer]": _REPLAY
    + "test_a_job_that_restores_everything_replays_bit_for_bit",
    _FAULTS
    + "test_a_resume_that_loses_part_of_the_state_fails_on_that_part"
    + "[state-digest-reset-scheduler.yaml-scheduler]": _REPLAY
    + "test_a_job_that_restores_everything_replays_bit_for_bit",
    _FAULTS + "test_a_second_kill_inside_the_load_of_a_direct_staging_is_not_reentrant": _FAULTS
    + "test_a_second_kill_inside_the_load_is_survived_by_an_atomic_staging",
    _FAULTS + "test_an_unbounded_restart_budget_crash_loops_on_a_poisoned_step": _FAULTS
    + "test_a_bounded_restart_budget_stops_retrying_a_poisoned_step",
    # StorageFault on torchrun
    _STORAGE + "test_an_atomic_saver_fails_loudly_and_resumes_from_the_last_durable"
    "[atomic-eio.yaml]": _STORAGE
    + "test_an_atomic_saver_fails_loudly_and_resumes_from_the_last_durable[atomic-enospc.yaml]",
    _STORAGE + "test_an_atomic_saver_fails_loudly_and_resumes_from_the_last_durable"
    "[atomic-readonly.yaml]": _STORAGE
    + "test_an_atomic_saver_fails_loudly_and_resumes_from_the_last_durable[atomic-enospc.yaml]",
    _STORAGE + "test_a_saver_that_skips_a_failed_save_says_so_and_trains_on": _STORAGE
    + "test_a_writer_thread_that_reports_a_failed_save_complete_fails",
    _STORAGE + "test_a_latest_link_moved_before_the_save_fails": _STORAGE
    + "test_a_writer_thread_that_reports_a_failed_save_complete_fails",
    _STORAGE + "test_retention_that_removes_the_last_checkpoint_first_fails": _STORAGE
    + "test_a_writer_thread_that_reports_a_failed_save_complete_fails",
    _STORAGE + "test_a_stall_behind_a_barrier_without_a_timeout_fails_at_max_stall": _STORAGE
    + "test_a_stall_behind_a_barrier_with_a_timeout_fails_loudly_and_recovers",
    _STORAGE + "test_a_stall_shorter_than_max_stall_passes": _STORAGE
    + "test_a_stall_behind_a_barrier_with_a_timeout_fails_loudly_and_recovers",
    _STORAGE + "test_a_load_slower_than_the_slo_fails_naming_the_load": _STORAGE
    + "test_a_slow_load_within_the_slo_passes",
    _STORAGE + "test_a_job_that_trusts_a_silently_damaged_checkpoint_fails_by_its_digest": _STORAGE
    + "test_a_job_that_verifies_on_load_falls_back_past_the_damaged_checkpoint",
    _STORAGE + "test_a_job_that_trusts_a_truncated_checkpoint_crash_loops": _STORAGE
    + "test_a_job_that_verifies_on_load_falls_back_past_the_damaged_checkpoint",
    _STORAGE + "test_a_job_that_drops_a_damaged_checkpoint_for_step_0_has_no_fallback": _STORAGE
    + "test_a_job_that_verifies_on_load_falls_back_past_the_damaged_checkpoint",
    # Ray Train
    _RAY + "test_the_twin_without_get_checkpoint_fails_as_restarted_from_scratch": _RAY
    + "test_the_example_passes_resuming_from_the_latest_registered_checkpoint",
    _RAY + "test_until_budget_exhausted_is_held_to_max_failures": _RAY
    + "test_the_example_passes_resuming_from_the_latest_registered_checkpoint",
    _RAY + "test_preempt_a_job_that_saves_on_sigterm_resumes_from_that_save": _RAY
    + "test_the_example_passes_resuming_from_the_latest_registered_checkpoint",
    _RAY + "test_preempt_a_job_that_leaves_sigterm_to_ray_fails_not_saved": _RAY
    + "test_the_example_passes_resuming_from_the_latest_registered_checkpoint",
    _RAY + "test_hang_with_a_short_gloo_timeout_is_detected_at_trains_restart_decision": (
        "tests/reliability/test_hang_ray.py::"
        "test_a_hang_drill_ended_during_the_hang_continues_the_worker_first[exception-3]"
    ),
    _RAY + "test_hang_with_the_default_gloo_timeout_is_not_detected": (
        "tests/reliability/test_hang_ray.py::"
        "test_a_hang_drill_ended_during_the_hang_continues_the_worker_first[exception-3]"
    ),
    _RAY + "test_kill_during_checkpoint_the_twin_that_loads_the_newest_folder_fails": _RAY
    + "test_the_example_passes_resuming_from_the_latest_registered_checkpoint",
    _RAY + "test_kill_during_checkpoint_resumes_from_the_last_registered_checkpoint": _RAY
    + "test_the_example_passes_resuming_from_the_latest_registered_checkpoint",
    # Slurm
    _SLURM + "test_srun_loop_recovers_with_a_new_step": _SLURM
    + "test_srun_loop_recovers_from_a_requeue",
    _SLURM + "test_node_local_checkpoints_fail_the_drill": _SLURM
    + "test_torchrun_in_step_recovers",
    _SLURM + "test_a_job_that_does_not_come_back_fails_the_drill": _SLURM
    + "test_torchrun_in_step_recovers",
    _SLURM + "test_a_preempted_job_that_ignores_sigterm_fails_saved_on_preempt": _SLURM
    + "test_a_preempted_job_that_saves_on_sigterm_resumes_from_that_save",
    _SLURM + "test_a_two_node_job_with_node_local_checkpoints_fails": _SLURM
    + "test_a_two_node_job_resumes_from_shared_storage_off_a_drained_node",
    _SLURM_RF + "test_a_second_kill_inside_the_load_of_a_direct_staging_is_not_reentrant": _SLURM_RF
    + "test_a_second_kill_inside_the_load_is_survived_by_an_atomic_staging",
    _SLURM_RF + "test_an_unbounded_restart_budget_crash_loops_on_a_poisoned_step": _SLURM_RF
    + "test_a_bounded_restart_budget_stops_retrying_a_poisoned_step",
    _SLURM_RF + "test_a_job_that_trusts_a_silently_damaged_checkpoint_fails_by_its_digest": (
        _SLURM_RF + "test_a_job_that_verifies_on_load_falls_back_past_the_damaged_checkpoint"
    ),
    # the frameworks and trainers
    "tests/local/test_litgpt_drills.py::test_its_resume_false_twin_fails_restarted_from_scratch": (
        "tests/local/test_litgpt_drills.py::test_litgpt_with_resume_auto_resumes_and_replays_its_losses"
    ),
    "tests/local/test_torchtitan_drills.py::"
    "test_its_twin_that_leaves_the_data_loader_out_fails_replay_diverged": (
        "tests/local/test_torchtitan_drills.py::"
        "test_torchtitan_as_it_ships_resumes_and_replays_its_losses"
    ),
    _LIGHTNING + "test_the_pytorch_lightning_package_with_recoverygate_auto_passes": _LIGHTNING
    + "test_an_unmodified_lightning_script_with_recoverygate_auto_passes",
    _LIGHTNING + "test_per_process_checkpoint_storage_fails_as_a_restart_from_scratch": _LIGHTNING
    + "test_a_lightning_fit_with_the_callback_passes_and_resumes_the_saved_state",
    _LIGHTNING + "test_a_fit_that_never_resumes_fails_as_a_restart_from_scratch": _LIGHTNING
    + "test_a_lightning_fit_with_the_callback_passes_and_resumes_the_saved_state",
    _HF + "test_a_per_process_output_dir_fails_as_a_restart_from_scratch": _HF
    + "test_a_trainer_with_the_callback_passes_and_resumes_the_saved_state",
    _HF + "test_a_trainer_that_never_resumes_fails_as_a_restart_from_scratch": _HF
    + "test_a_trainer_with_the_callback_passes_and_resumes_the_saved_state",
    _TORN + "test_an_hf_trainer_resuming_from_get_last_checkpoint_fails": _TORN
    + "test_an_hf_trainer_resuming_from_the_last_complete_checkpoint_passes",
    _TORN + "test_a_lightning_fit_resuming_from_last_passes": _TORN
    + "test_an_hf_trainer_resuming_from_the_last_complete_checkpoint_passes",
    "tests/integrations/test_dcp_drills.py::test_a_dcp_job_passes_and_its_lines_follow_the_files"
    "[async]": "tests/integrations/test_dcp_drills.py::"
    "test_a_dcp_job_passes_and_its_lines_follow_the_files[sync]",
    _REPLAY + "test_a_resume_that_forgets_one_thing_fails_at_its_first_divergent_step"
    "[forget-data.yaml]": _REPLAY
    + "test_a_resume_that_forgets_one_thing_fails_at_its_first_divergent_step[forget-optimizer.yaml]",
    _REPLAY + "test_a_resume_that_forgets_one_thing_fails_at_its_first_divergent_step"
    "[forget-generator.yaml]": _REPLAY
    + "test_a_resume_that_forgets_one_thing_fails_at_its_first_divergent_step[forget-optimizer.yaml]",
    _REPLAY + "test_a_resume_that_forgets_one_thing_fails_at_its_first_divergent_step"
    "[forget-rng.yaml]": _REPLAY
    + "test_a_resume_that_forgets_one_thing_fails_at_its_first_divergent_step[forget-optimizer.yaml]",
    _REPLAY + "test_a_resume_that_forgets_one_thing_fails_at_its_first_divergent_step"
    "[forget-scheduler.yaml]": _REPLAY
    + "test_a_resume_that_forgets_one_thing_fails_at_its_first_divergent_step[forget-optimizer.yaml]",
    # Kubernetes (the real cluster): the same TrainJob, rank 0 on its node-local emptyDir
    "tests/kubernetes/test_kubernetes_jobs.py::"
    "test_a_trainjob_that_loses_rank_0_with_node_local_checkpoints_fails_from_scratch": (
        "tests/kubernetes/test_kubernetes_jobs.py::"
        "test_a_trainjob_that_loses_rank_1_passes_and_its_replacement_has_a_new_name"
    ),
    # Kubernetes (the real cluster): KillDuringRecovery, the staged load cut by the second
    # DELETE, straight to the final name
    "tests/kubernetes/test_kubernetes_reentry.py::"
    "test_a_second_delete_inside_the_load_of_a_direct_staging_is_not_reentrant": (
        "tests/kubernetes/test_kubernetes_reentry.py::"
        "test_a_second_delete_inside_the_load_is_survived_by_an_atomic_staging"
    ),
    # torchft's live recovery
    _TORCHFT + "test_the_min_replica_size_2_twin_fails_survivors_stalled": _TORCHFT
    + "test_the_example_passes_survivors_train_on_and_the_replica_heals_from_a_peer",
    _TORCHFT + "test_the_no_heal_twin_fails_rejoined_from_scratch": _TORCHFT
    + "test_the_example_passes_survivors_train_on_and_the_replica_heals_from_a_peer",
    _TORCHFT + "test_the_heal_applies_nothing_twin_fails_state_differs": _TORCHFT
    + "test_the_example_passes_survivors_train_on_and_the_replica_heals_from_a_peer",
}


def recording_folder(nodeid: str) -> Path:
    """Where the twin ``nodeid``'s drills are recorded."""
    return RECORDINGS / re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.removeprefix("tests/"))[:180]


#: What of a report folder a recording keeps: the transcript the engine is replayed from
#: and the report it must reproduce.
KEPT = ("transcript.jsonl", "report.json")


def record(nodeid: str, ran: list[Path], wall: float) -> Path:
    """Record the report folders ``ran`` of the passing twin ``nodeid`` (each as
    ``<n>-<folder name>/``, in the order the test ran them), replacing what was there."""
    folder = recording_folder(nodeid)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    drills = []
    for n, report_dir in enumerate(ran):
        kept = folder / f"{n}-{report_dir.name}"
        kept.mkdir()
        for name in KEPT:
            shutil.copyfile(report_dir / name, kept / name)
        drills.append(kept.name)
    meta = {
        "test": nodeid,
        "sibling": TWINS[nodeid],
        "drills": drills,
        "recordedAt": time.strftime("%Y-%m-%d", time.gmtime()),
        "testSeconds": round(wall, 1),
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", "utf-8")
    return folder
