"""``RECOVERYGATE_AUTO``: the start-up hook that adds the callbacks to every Trainer.

We test these aspects:
- packaging: the reporter's wheel carries ``recoverygate-auto.pth`` at its root, and a
  wheel install and an editable install (``pip install -e reporter``, which places files
  differently) both put it where Python runs it: with the variable set the finder is on
  ``sys.meta_path`` at start-up, with it unset nothing at all is imported;
- the patch, in a fresh interpreter of this environment: an HF ``Trainer`` and a
  Lightning ``Trainer`` (both package names) built by unmodified code get exactly one
  callback; one added by hand is not doubled; ``0``, empty and a list naming the other
  framework leave the Trainer alone; ``uninstall()`` restores the original
  ``__init__``. Each of these starts an interpreter that imports a framework (about 5 s),
  so they are marked ``e2e``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from recoverygate.integrations import auto

from tests.patience import CLUSTER, JOB, within

ROOT = Path(__file__).resolve().parents[2]
REPORTER = ROOT / "reporter"
PTH = REPORTER / "recoverygate-auto.pth"
FINDER_ON = (
    "import sys; print(any(type(f).__name__ == '_Finder' for f in sys.meta_path), "
    "'recoverygate' in sys.modules)"
)


def python(code: str, *, auto_value: str | None, exe: str = sys.executable) -> str:
    env = {k: v for k, v in os.environ.items() if k != auto.ENV}
    env["HF_HUB_OFFLINE"] = "1"
    if auto_value is not None:
        env[auto.ENV] = auto_value
    proc = subprocess.run(
        [exe, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=within(JOB),
        check=False,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def fresh_venv(path: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=within(JOB)
    )
    return path / "bin" / "python"


def pip_into(target_python: Path, *args: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(target_python),
            "install",
            "--quiet",
            "--no-deps",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=within(CLUSTER),
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow  # builds the reporter's wheel
def test_the_wheel_carries_the_hook_at_its_root(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(tmp_path),
            str(REPORTER),
        ],
        check=True,
        timeout=within(CLUSTER),
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("recoverygate_reporter-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("recoverygate-auto.pth") == PTH.read_bytes()
        names = archive.namelist()
    assert "recoverygate/integrations/auto.py" in names
    assert "recoverygate/integrations/transformers.py" in names


@pytest.mark.slow  # a fresh virtualenv, an install into it and interpreters started there
@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
def test_an_install_runs_the_hook_only_when_the_variable_is_set(
    tmp_path: Path,
    editable: bool,
) -> None:
    exe = fresh_venv(tmp_path / "venv")
    pip_into(exe, *(["-e", str(REPORTER)] if editable else [str(REPORTER)]))
    site = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
    assert (site / "recoverygate-auto.pth").read_bytes() == PTH.read_bytes()
    assert python(FINDER_ON, auto_value="1", exe=str(exe)) == "True True"
    assert python(FINDER_ON, auto_value=None, exe=str(exe)) == "False False"
    assert python(FINDER_ON, auto_value="0", exe=str(exe)) == "False False"
    located = python(
        "import recoverygate.integrations.auto as a; print(a.__file__)",
        auto_value=None,
        exe=str(exe),
    )
    assert located.startswith(str(REPORTER) if editable else str(site))


HF_TRAINER = """
import sys
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
{extra}
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, n_positions=8, vocab_size=16))
args = TrainingArguments(output_dir=sys.argv[-1] if len(sys.argv) > 1 else "/tmp/rg-auto",
                         report_to=[], use_cpu=True)
trainer = Trainer(model=model, args=args{callbacks})
print(sorted(type(cb).__name__ for cb in trainer.callback_handler.callbacks
             if "RecoveryGate" in type(cb).__name__))
"""

LIGHTNING_TRAINER = """
import {package} as pl
trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
cbs = [cb for cb in trainer.callbacks if "RecoveryGate" in type(cb).__name__]
print(len(cbs), all(isinstance(cb, pl.Callback) for cb in cbs))
"""


@pytest.mark.e2e
def test_an_unmodified_hf_trainer_gets_exactly_one_callback() -> None:
    pytest.importorskip("transformers")
    code = HF_TRAINER.format(extra="", callbacks="")
    assert python(code, auto_value="1") == "['RecoveryGateCallback']"
    assert python(code, auto_value="0") == "[]"
    assert python(code, auto_value="lightning") == "[]"


@pytest.mark.e2e
def test_a_callback_added_by_hand_is_not_doubled() -> None:
    pytest.importorskip("transformers")
    code = HF_TRAINER.format(
        extra="from recoverygate.integrations.transformers import RecoveryGateCallback",
        callbacks=", callbacks=[RecoveryGateCallback(digest=False)]",
    )
    assert python(code, auto_value="1") == "['RecoveryGateCallback']"


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("package", "on", "off"),
    [("lightning.pytorch", "1", "transformers"), ("pytorch_lightning", "lightning", None)],
)
def test_an_unmodified_lightning_trainer_gets_exactly_one_callback(
    package: str,
    on: str,
    off: str | None,
) -> None:
    pytest.importorskip(package)
    code = LIGHTNING_TRAINER.format(package=package)
    assert python(code, auto_value=on) == "1 True"
    assert python(code, auto_value=off) == "0 True"


@pytest.mark.e2e
def test_uninstall_restores_the_original_init() -> None:
    pytest.importorskip("lightning")
    code = (
        "import lightning.pytorch as pl\n"
        "from recoverygate.integrations import auto\n"
        "patched = auto.patched()\n"
        "auto.uninstall()\n"
        "trainer = pl.Trainer(accelerator='cpu', logger=False, enable_progress_bar=False)\n"
        "print(patched, auto.patched(), auto.installed(),"
        " sum('RecoveryGate' in type(cb).__name__ for cb in trainer.callbacks))\n"
    )
    assert python(code, auto_value="1") == ("['lightning.pytorch.trainer.trainer'] [] False 0")


def test_wanted_reads_the_variable() -> None:
    assert auto.wanted("1") == {"transformers", "lightning", "ray", "torchft"}
    assert auto.wanted("true") == {"transformers", "lightning", "ray", "torchft"}
    assert auto.wanted("lightning, transformers") == {"transformers", "lightning"}
    assert auto.wanted("lightning") == {"lightning"}
    assert auto.wanted("torchft") == {"torchft"}
    for off in ("", "0", "off", "no", "false", "nonsense"):
        assert auto.wanted(off) == frozenset()
