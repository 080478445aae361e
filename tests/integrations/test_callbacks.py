"""The integrations in one process, on the real frameworks: what each line says and when.

No torchrun: a tiny HF Trainer, a tiny Lightning fit and DCP saves run in this process,
the reporter prints into a stream that checks the files on disk at the moment each line
is written. About 20 s, most of it importing the frameworks. We test these aspects:
- HF: one progress line per optimizer step under gradient accumulation, with the loss
  the Trainer logs (logging_steps=1: each step's, once); a checkpoint
  reported only once its folder is complete (trainer state and marker in place); a
  resume reports the restored step with the digest that was saved; a failing hook never
  raises into training; ``last_complete_checkpoint`` skips partial folders, with and
  without markers;
- Lightning: the same three (each progress line with the batch's loss), and an
  ``AsyncCheckpointIO`` save reported only once the
  file is written;
- DCP: ``save`` reports started before any file and completed after ``.metadata``;
  ``async_save`` reports completed only when its future resolves, and never for a save
  that failed; ``load`` reports the step with the digest saved;
- the integration modules import no framework until a class is used.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO, cast

import pytest
from recoverygate import reporter
from recoverygate.integrations import _common

from tests.patience import JOB, PROMPT, eventually, within

pytestmark = pytest.mark.filterwarnings("ignore")  # the frameworks' own deprecations

SENTINEL = "RECOVERYGATE/v1 "


class CheckingStream(io.TextIOBase):
    """Collects the reporter's events; ``check(event)`` runs as each line is written."""

    def __init__(self, check: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.check = check
        self.failures: list[str] = []

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.startswith(SENTINEL):
                event = json.loads(line[len(SENTINEL) :])
                self.events.append(event)
                if self.check is not None:
                    try:
                        self.check(event)
                    except AssertionError as error:
                        self.failures.append(f"{event}: {error}")
        return len(text)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]


@pytest.fixture
def lines() -> Iterator[Callable[..., CheckingStream]]:
    def make(check: Callable[[dict[str, Any]], None] | None = None) -> CheckingStream:
        stream = CheckingStream(check)
        reporter.configure(stream=cast("TextIO", stream), ranks="all", rank=0, min_interval=0)
        return stream

    yield make
    reporter.configure()


# ------------------------------------------------------------------------- transformers


def hf_trainer(
    output_dir: Path,
    *,
    max_steps: int,
    callback: Any = None,
    grad_accum: int = 3,
    logging_steps: int = 10_000,
) -> Any:
    transformers = pytest.importorskip("transformers")
    import torch
    from recoverygate.integrations.transformers import RecoveryGateCallback

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 1000

        def __getitem__(self, index: int) -> dict[str, Any]:
            ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(index))
            return {"input_ids": ids, "labels": ids.clone()}

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=8, vocab_size=64)
    )
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=grad_accum,
        save_strategy="steps",
        save_steps=2,
        logging_steps=logging_steps,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    return transformers.Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(),
        callbacks=[callback or RecoveryGateCallback()],
    )


def test_hf_runs_on_the_expected_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    expected = os.environ.get("RECOVERYGATE_EXPECT_TRANSFORMERS")  # set by scripts/test
    if expected:
        assert transformers.__version__ == expected


def test_hf_reports_each_optimizer_step_once_and_a_checkpoint_only_when_complete(
    tmp_path: Path,
    lines: Callable[..., CheckingStream],
) -> None:
    def folder_is_complete(event: dict[str, Any]) -> None:
        if event["event"] == "checkpoint_completed":
            folder = tmp_path / f"checkpoint-{event['step']}"
            assert (folder / "trainer_state.json").exists()
            assert _common.is_complete_marker(str(folder), event["step"])

    stream = lines(folder_is_complete)
    hf_trainer(tmp_path, max_steps=4).train()
    assert stream.failures == []
    assert [e["step"] for e in stream.of("progress")] == [1, 2, 3, 4]  # not 12 micro-batches
    assert [e["step"] for e in stream.of("checkpoint_started")] == [2, 4]
    assert [e["step"] for e in stream.of("checkpoint_completed")] == [2, 4]
    kinds = [e["event"] for e in stream.events if e["event"] != "start"]
    assert kinds.index("checkpoint_started") < kinds.index("checkpoint_completed")
    assert set(stream.of("checkpoint_completed")[0]["parts"]) == {"model", "optimizer", "scheduler"}


def test_hf_passes_the_loss_it_logs_on_each_step_s_line(
    tmp_path: Path,
    lines: Callable[..., CheckingStream],
) -> None:
    stream = lines()
    trainer = hf_trainer(tmp_path, max_steps=4, logging_steps=1)
    trainer.train()
    logged = {row["step"]: row["loss"] for row in trainer.state.log_history if "loss" in row}
    progress = stream.of("progress")
    assert [e["step"] for e in progress] == [1, 2, 3, 4]  # each step once, with its loss
    assert {e["step"]: e["loss"] for e in progress} == logged


def test_hf_resume_reports_the_restored_step_with_the_saved_digest(
    tmp_path: Path,
    lines: Callable[..., CheckingStream],
) -> None:
    from recoverygate.integrations.transformers import last_complete_checkpoint

    stream = lines()
    hf_trainer(tmp_path, max_steps=4).train()
    saved = stream.of("checkpoint_completed")[-1]
    stream = lines()
    resume = last_complete_checkpoint(tmp_path)
    assert resume == str(tmp_path / "checkpoint-4")
    hf_trainer(tmp_path, max_steps=6).train(resume_from_checkpoint=resume)
    loaded = stream.of("checkpoint_loaded")
    assert [e["step"] for e in loaded] == [4]
    assert loaded[0]["parts"] == saved["parts"]
    assert stream.of("progress")[0]["step"] == 5


def test_an_hf_hook_that_fails_never_raises_into_training(
    capsys: pytest.CaptureFixture[str],
    lines: Callable[..., CheckingStream],
) -> None:
    pytest.importorskip("transformers")
    from recoverygate.integrations.transformers import RecoveryGateCallback

    callback = RecoveryGateCallback()
    assert callback.on_step_end(None, object(), None) is None  # no global_step: an error
    assert callback.on_step_end(None, object(), None) is None
    err = capsys.readouterr().err
    assert err.count("recoverygate: RecoveryGateCallback (on_step_end)") == 1


def make_folder(
    root: Path, step: int, *, marker: bool = False, trainer_state: str | None = None
) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    if trainer_state is not None:
        (folder / "trainer_state.json").write_text(trainer_state)
    if marker:
        (folder / _common.MARKER_NAME).write_text(json.dumps({"step": step}))
    return folder


def test_last_complete_checkpoint_skips_a_newest_folder_without_its_marker(
    tmp_path: Path,
) -> None:
    from recoverygate.integrations.transformers import last_complete_checkpoint

    make_folder(tmp_path, 10, marker=True, trainer_state='{"global_step": 10}')
    make_folder(tmp_path, 20, trainer_state='{"global_step": 20}')  # rank 1 not done yet
    make_folder(tmp_path, 5, marker=True, trainer_state='{"global_step": 5}')
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")


def test_last_complete_checkpoint_without_markers_reads_the_trainer_state(
    tmp_path: Path,
) -> None:
    from recoverygate.integrations.transformers import last_complete_checkpoint

    make_folder(tmp_path, 10, trainer_state='{"global_step": 10}')
    make_folder(tmp_path, 20, trainer_state='{"global_st')  # torn mid-write
    make_folder(tmp_path, 30)  # the save got no further than the model
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    assert last_complete_checkpoint(tmp_path / "missing") is None
    assert last_complete_checkpoint(tmp_path / "checkpoint-30") is None


# ---------------------------------------------------------------------------- lightning


def lightning_fit(
    ckpt_dir: Path,
    *,
    max_steps: int,
    ckpt_path: str | None = None,
    plugins: list[Any] | None = None,
) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    import torch
    from recoverygate.integrations.lightning import RecoveryGateCallback

    class Module(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            opt = torch.optim.Adam(self.parameters(), lr=1e-2)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    data = torch.utils.data.TensorDataset(torch.randn(400, 4))
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        accumulate_grad_batches=2,
        callbacks=[
            pl.callbacks.ModelCheckpoint(
                dirpath=ckpt_dir,
                filename="{step}",
                every_n_train_steps=2,
                save_top_k=-1,
                save_last=True,
            ),
            RecoveryGateCallback(),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        plugins=plugins,
    )
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=4), ckpt_path=ckpt_path)


def test_lightning_reports_each_optimizer_step_once_and_a_checkpoint_once_written(
    tmp_path: Path,
    lines: Callable[..., CheckingStream],
) -> None:
    def file_is_written(event: dict[str, Any]) -> None:
        if event["event"] == "checkpoint_completed":
            assert (tmp_path / f"step={event['step']}.ckpt").exists()
            assert (tmp_path / "last.ckpt").exists()

    stream = lines(file_is_written)
    lightning_fit(tmp_path, max_steps=4)
    assert stream.failures == []
    assert [e["step"] for e in stream.of("progress")] == [1, 2, 3, 4]  # not 8 micro-batches
    losses = [e.get("loss") for e in stream.of("progress")]
    assert all(isinstance(loss, float) and loss > 0 for loss in losses), losses
    assert [e["step"] for e in stream.of("checkpoint_started")] == [2, 4]  # last.ckpt: no 2nd
    assert [e["step"] for e in stream.of("checkpoint_completed")] == [2, 4]

    saved = stream.of("checkpoint_completed")[-1]
    stream = lines()
    lightning_fit(tmp_path, max_steps=6, ckpt_path="last")
    loaded = stream.of("checkpoint_loaded")
    assert [e["step"] for e in loaded] == [4]
    assert loaded[0]["parts"] == saved["parts"]
    assert stream.of("progress")[0]["step"] == 5


def test_lightning_async_checkpoint_io_is_reported_once_the_file_is_written(
    tmp_path: Path,
    lines: Callable[..., CheckingStream],
) -> None:
    pytest.importorskip("lightning")
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    def file_is_written(event: dict[str, Any]) -> None:
        if event["event"] == "checkpoint_completed":
            assert (tmp_path / f"step={event['step']}.ckpt").exists()

    stream = lines(file_is_written)
    lightning_fit(tmp_path, max_steps=4, plugins=[AsyncCheckpointIO()])
    assert stream.failures == []
    assert [e["step"] for e in stream.of("checkpoint_completed")] == [2, 4]


# --------------------------------------------------------------------------------- dcp


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def dcp_state() -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    return {"model": model.state_dict(), "extra": torch.arange(4)}


def test_dcp_save_reports_started_before_any_file_and_completed_after_the_metadata(
    tmp_path: Path,
    lines: Callable[..., CheckingStream],
    process_group: None,
) -> None:
    from recoverygate.integrations import dcp

    folder = tmp_path / "step-7"

    def ordering(event: dict[str, Any]) -> None:
        if event["event"] == "checkpoint_started":
            assert not folder.exists() or not os.listdir(folder)
        if event["event"] == "checkpoint_completed":
            assert (folder / ".metadata").exists()

    stream = lines(ordering)
    state = dcp_state()
    dcp.save(state, step=7, digest=True, checkpoint_id=str(folder))
    assert stream.failures == []
    assert [e["event"] for e in stream.events][1:] == ["checkpoint_started", "checkpoint_completed"]
    saved = stream.of("checkpoint_completed")[0]
    assert set(saved["parts"]) == {"model", "extra"}

    import torch

    restored = {
        "model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
        "extra": torch.zeros(4, dtype=torch.int64),
    }
    dcp.load(restored, step=7, digest=True, checkpoint_id=str(folder))
    loaded = stream.of("checkpoint_loaded")
    assert loaded[0]["step"] == 7
    assert loaded[0]["parts"] == saved["parts"]


def test_dcp_async_save_reports_completed_only_when_the_future_resolves(
    tmp_path: Path,
    lines: Callable[..., CheckingStream],
    process_group: None,
) -> None:
    from recoverygate.integrations import dcp

    folder = tmp_path / "step-3"

    def durable(event: dict[str, Any]) -> None:
        if event["event"] == "checkpoint_completed":
            assert (folder / ".metadata").exists()

    stream = lines(durable)
    future = dcp.async_save(dcp_state(), step=3, checkpoint_id=str(folder))
    future.result(timeout=within(JOB))
    # done callbacks run right after the result is set
    eventually(lambda: stream.of("checkpoint_completed"), "the completed line", PROMPT)
    assert stream.failures == []
    assert [e["step"] for e in stream.of("checkpoint_started")] == [3]
    assert [e["step"] for e in stream.of("checkpoint_completed")] == [3]


def test_a_failed_dcp_async_save_is_never_reported_completed(
    tmp_path: Path,
    lines: Callable[..., CheckingStream],
    process_group: None,
) -> None:
    from recoverygate.integrations import dcp

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    stream = lines()
    future = dcp.async_save(dcp_state(), step=3, checkpoint_id=str(blocker / "step-3"))
    with pytest.raises(BaseException, match="Not a directory"):  # a CheckpointException
        future.result(timeout=within(JOB))
    assert [e["step"] for e in stream.of("checkpoint_started")] == [3]
    assert stream.of("checkpoint_completed") == []


# --------------------------------------------------------------------------- laziness


def test_the_integration_modules_import_no_framework_until_a_class_is_used() -> None:
    code = (
        "import sys\n"
        "import recoverygate.integrations.transformers, recoverygate.integrations.lightning\n"
        "import recoverygate.integrations.pytorch_lightning, recoverygate.integrations.dcp\n"
        "import recoverygate.integrations.auto\n"
        "heavy = [m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RECOVERYGATE_AUTO"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=within(JOB),
    ).stdout
    assert out.strip() == "[]"


def test_a_digest_everywhere_runs_on_a_silent_rank_and_is_sent_by_none(
    lines: Callable[..., CheckingStream],
) -> None:
    calls = []

    class Gathering:  # a state_dict() that would be a collective under FSDP
        def state_dict(self) -> dict[str, int]:
            calls.append(1)
            return {"x": 1}

    reporter.configure(
        stream=cast("TextIO", CheckingStream()), ranks="1", rank=0
    )  # this rank is silent
    assert _common.digest_of({"model": Gathering()}, "t") is None
    assert calls == []
    assert _common.digest_of({"model": Gathering()}, "t", everywhere=True) is None
    assert calls == [1]
    lines()  # this rank prints again
    assert set(_common.digest_of({"model": Gathering()}, "t") or {}) == {"model"}
