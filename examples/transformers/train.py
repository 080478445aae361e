"""An HF Trainer job for RecoveryGate drills: a tiny GPT-2 on synthetic tokens, on CPU.

Run it under torchrun (2 ranks; accelerate picks gloo on CPU)::

    torchrun --standalone --nproc-per-node=2 --max-restarts=3 train.py --output-dir=./out

What it shows:

- one line makes it drillable: ``callbacks=[RecoveryGateCallback()]`` (progress per
  optimizer step, a checkpoint reported only once every rank's part is written, the
  resume step and state digests). ``--no-callback`` leaves it out: the job is then an
  unmodified HF script, drillable with ``RECOVERYGATE_AUTO=1`` in its environment;
- resuming: ``--resume=complete`` (the default) resumes from
  ``last_complete_checkpoint(output_dir)``, which skips a partial newest folder;
  ``--resume=hf`` uses ``get_last_checkpoint`` (returns a partial folder after a torn
  save); ``--resume=none`` never resumes (a bug a drill must catch);
- ``--output-dir`` may contain ``{tmpdir}`` and ``{pid}``: ``{tmpdir}/out-{pid}`` is
  per-process storage, the node-local-checkpoint bug (a restarted worker finds nothing).

Nothing is downloaded: the model is built from a ``GPT2Config`` and the data are random
tokens that depend only on the example's index.

With ``RG_TEST_HOLD=<file>`` (the test suite's barrier, tests/patience.py) a save of the
step the file names (``save N``: N or later) parks between the weights and the optimizer
while the file exists: a test aims a kill into a torn folder with no time window to hit.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing to download; never try
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint

SEQUENCE = 16
VOCAB = 128
#: The test suite's barrier (see :func:`hold`): the file's path.
HOLD_ENV = "RG_TEST_HOLD"


def hold(what: str, step: int) -> None:
    """With ``RG_TEST_HOLD=<file>`` reading ``save N``: a save of step N or later parks
    here while the file exists, and ``<file>.parked.<pid>`` says which process parked (as
    examples/local/train.py's). Without the variable or the file: nothing."""
    path = os.environ.get(HOLD_ENV)
    if not path:
        return
    try:
        kind, _, at = Path(path).read_text().strip().partition(" ")
    except OSError:
        return
    if kind != what or step < int(at):
        return
    Path(f"{path}.parked.{os.getpid()}").write_text(f"{what} {step}\n")
    while os.path.exists(path):
        time.sleep(0.05)


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random tokens, a pure function of the index: a resumed run sees the same data."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        ids = torch.randint(0, VOCAB, (SEQUENCE,), generator=generator)
        return {"input_ids": ids, "labels": ids.clone()}


class StepTime(TrainerCallback):
    """Sleep after each optimizer step, so a drill has time to watch the run; and in each
    save before it is marked complete, as a bigger model's save on slow storage takes."""

    def __init__(self, seconds: float, save_seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.save_seconds = save_seconds

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.seconds > 0:
            time.sleep(self.seconds)

    def on_save(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.save_seconds > 0:  # runs before RecoveryGateCallback's marker
            time.sleep(self.save_seconds)


class SlowWrite(Trainer):
    """A Trainer whose save pauses between the weights and the optimizer (``--write-time``,
    or parked at the test suite's hold): for that long the checkpoint folder is torn."""

    write_seconds = 0.0

    def _save_optimizer_and_scheduler(self, output_dir):  # type: ignore[no-untyped-def]
        hold("save", self.state.global_step)
        if self.write_seconds > 0:
            time.sleep(self.write_seconds)
        super()._save_optimizer_and_scheduler(output_dir)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output-dir", default="./out", help="the Trainer's output_dir; {tmpdir} and {pid} expand"
    )
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument(
        "--grad-accum",
        type=int,
        default=2,
        help="gradient accumulation: micro-batches per optimizer step",
    )
    parser.add_argument(
        "--step-time", type=float, default=0.05, help="seconds of sleep after each optimizer step"
    )
    parser.add_argument(
        "--save-time",
        type=float,
        default=0.0,
        help="seconds each save takes before it is marked complete (slow storage)",
    )
    parser.add_argument(
        "--write-time",
        type=float,
        default=0.0,
        help="seconds each save pauses after the weights, before the optimizer (a torn folder)",
    )
    parser.add_argument("--resume", choices=("complete", "hf", "none"), default="complete")
    parser.add_argument(
        "--no-callback",
        action="store_true",
        help="leave the callback out (for RECOVERYGATE_AUTO=1)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    output_dir = args.output_dir.format(tmpdir=tempfile.gettempdir(), pid=os.getpid())
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            n_layer=1,
            n_head=2,
            n_embd=32,
            n_positions=SEQUENCE,
            vocab_size=VOCAB,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    training_args = TrainingArguments(
        output_dir=output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=3,
        logging_steps=1_000_000,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo" if "RANK" in os.environ else None,
        ddp_timeout=60,  # the default, 1800 s, leaves a survivor hanging for 30 minutes
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    callbacks: list[TrainerCallback] = [StepTime(args.step_time, args.save_time)]
    if not args.no_callback:
        from recoverygate.integrations.transformers import RecoveryGateCallback

        callbacks.append(RecoveryGateCallback())
    SlowWrite.write_seconds = args.write_time
    trainer = SlowWrite(
        model=model, args=training_args, train_dataset=Tokens(100_000), callbacks=callbacks
    )
    resume: str | None = None
    if args.resume == "complete":
        from recoverygate.integrations.transformers import last_complete_checkpoint

        resume = last_complete_checkpoint(output_dir)
    elif args.resume == "hf" and os.path.isdir(output_dir):
        resume = get_last_checkpoint(output_dir)
    trainer.train(resume_from_checkpoint=resume)
    if torch.distributed.is_initialized():
        # An orderly teardown, in three steps (each seen to hang or abort without it):
        # - every rank meets here, so no collective is still in flight in gloo's threads;
        # - the trainer and its DDP model go while the process group is alive: freeing the
        #   DDP reducer ends its gloo group, whose thread may still be freeing an
        #   all_gather's tensors and wait for the GIL the freeing thread holds (a deadlock
        #   at exit, 2 runs in 3 after a restart, py-spy showed both threads);
        # - then the process group ends (left to the interpreter's exit, gloo's threads can
        #   abort: "terminate called without an active exception").
        torch.distributed.barrier()
        time.sleep(0.1)  # the GIL left free while gloo's threads free what they ran
        del trainer, model
        gc.collect()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
