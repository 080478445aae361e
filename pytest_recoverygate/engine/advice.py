"""What a job is told to change, in its own terms.

A job that calls the reporter is told which call to make; a job drilled from its own log
lines (``evidence:``, docs/evidence.md) cannot make one, so it is told which of its lines
the drill reads, or which of its trainer's own options decides the thing at fault.
``evidence`` below is :attr:`~pytest_recoverygate.engine.spec.DrillSpec.evidence`: None
(reporter calls), ``"patterns"`` (the user's patterns, no preset) or a preset's name.

Pure: text in, text out.
"""

from __future__ import annotations

__all__ = [
    "PATTERNS",
    "load_fix",
    "loss_fix",
    "resume_option",
    "save_fix",
    "steps_fix",
]

#: ``DrillSpec.evidence`` of a job drilled from the user's own patterns (no preset).
PATTERNS = "patterns"

#: The line each preset reads a load from (docs/evidence.md, "Presets").
_LOAD_LINE = {
    "nanogpt": "nanoGPT's 'Resuming training from …' line and the 'step N:' evaluation "
    "line it prints next",
    "torchtitan": "torchtitan's 'Loading the checkpoint from …/step-N.' line",
    "megatron": "Megatron's 'successfully loaded checkpoint from … at iteration N' line",
    "litgpt": "litgpt's 'Resuming training from …/step-0000000N/…' line",
}
#: The line each preset reads a completed save from.
_SAVE_LINE = {
    "nanogpt": "nanoGPT's 'saving checkpoint to …' line after a 'step N:' evaluation line, "
    "completed by the next 'iter' line",
    "torchtitan": "torchtitan's 'Finished saving the checkpoint in …' line (not printed "
    "with --checkpoint.async_mode)",
    "megatron": "Megatron's 'successfully saved checkpoint from iteration N' line",
    "litgpt": "litgpt's 'Saving checkpoint to …/step-0000000N/…' line, completed by the "
    "next step line",
}
#: The line each preset reads a step from.
_STEP_LINE = {
    "nanogpt": "nanoGPT's 'iter N: loss …' line (from master_process)",
    "torchtitan": "torchtitan's 'step: N  loss: …' line",
    "megatron": "Megatron's 'iteration N/ …' line (printed on the last rank)",
    "litgpt": "litgpt's '… iter N step M | loss train: …' line",
}
#: The trainer's own options that make a restarted job resume.
_RESUME = {
    "nanogpt": "nanoGPT resumes only with init_from='resume', which fails while out_dir "
    "has no ckpt.pt yet: start the first run with init_from='scratch', then restart with "
    "'resume' (or choose 'resume' whenever out_dir/ckpt.pt exists)",
    "torchtitan": "torchtitan resumes from the newest step-N folder of its checkpoint "
    "folder with --checkpoint.enable, when every restart gets the same "
    "--checkpoint.folder under the same --job.dump_folder on storage it can see",
    "megatron": "Megatron resumes with --load naming the folder --save writes to, on "
    "storage every restart can see",
    "litgpt": "litgpt resumes with --resume auto (or --resume true); its default, "
    "--resume false, starts every restart from scratch",
}


def load_fix(evidence: str | None) -> str:
    """How to make a load visible to the drill (with the step the loaded state holds)."""
    if evidence is None:
        return "call reporter.checkpoint_loaded(step) after loading"
    line = _LOAD_LINE.get(evidence)
    if line is not None:
        return (
            f"the drill reads the load from {line}: the job must print it when it loads "
            "(or give evidence.patterns a checkpointLoaded pattern for the line it prints)"
        )
    return (
        "give evidence.patterns a checkpointLoaded pattern that matches the line the job "
        "prints when it loads, with the step the loaded checkpoint holds"
    )


def save_fix(evidence: str | None) -> str:
    """How to make a durable save visible to the drill as soon as it is durable."""
    if evidence is None:
        return (
            "call reporter.checkpoint_completed(step) as soon as the checkpoint is durable "
            "on the rank that writes it"
        )
    line = _SAVE_LINE.get(evidence)
    if line is not None:
        return f"the drill reads a completed save from {line}"
    return (
        "give evidence.patterns a checkpointCompleted pattern for the line the job prints "
        "once a checkpoint is durable, with its step"
    )


def steps_fix(evidence: str | None) -> str:
    """How to make steps and saves visible at all (nothing with a step was read)."""
    if evidence is None:
        return (
            "Call the reporter with a step (reporter.progress(step), "
            "reporter.checkpoint_completed(step)); with recoverygate.integrations.ray, pass "
            "report(metrics, step=N) or put 'step' in the metrics (its workers warn "
            "'report() without a step' on stderr when they do not)"
        )
    line = _STEP_LINE.get(evidence)
    what = (
        f"{line}, and the saves from {_SAVE_LINE[evidence]}"
        if line is not None
        else "the lines your evidence.patterns match"
    )
    return (
        f"The drill reads the steps from {what}: check that the job prints them through "
        "sys.stdout or sys.stderr of a Python process with the reporter installed (the "
        "start-up hook does not see a logging.FileHandler, nor bytes written past "
        "sys.stdout)"
    )


def loss_fix(evidence: str | None) -> str:
    """How to give the drill the step's loss."""
    if evidence is None:
        return "reporter.progress(step, loss=loss) (a float or a 0-d tensor)"
    return "a (?P<loss>…) group in the progress pattern, on the line that prints the loss"


def resume_option(evidence: str | None) -> str | None:
    """The trainer's own option that makes a restart resume, for a preset; else None."""
    return _RESUME.get(evidence or "")
