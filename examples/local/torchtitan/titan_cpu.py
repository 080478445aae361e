"""Run torchtitan's own trainer on CPU, unchanged but for three things it needs a GPU for.

torchtitan 0.3.0 (``pip install torch==2.13.0 torchtitan==0.3.0 triton==3.9.0``) does not
train on a CPU-only machine as it ships, and its debug configuration reads a test
tokenizer and dataset that only its source tree has. This entry point changes exactly
what stops it, and nothing the drill reads:

1. the device: with no accelerator torchtitan falls back to ``cuda``
   (``tools/utils.py``); here it is ``cpu``, with a stand-in for the few
   ``torch.cuda``-style calls it makes (set_device, memory statistics);
2. the attention kernel: language models use FlexAttention, which has no backward pass on
   CPU in torch 2.13; here the same block mask is made dense and given to
   ``scaled_dot_product_attention``;
3. ``torch.distributed.set_timeout``, newer than torch 2.13, called after the first step
   to raise the process group's timeout: here it does nothing.

The training loop, the data loader, the checkpointer (DCP, ``step-N`` folders), the
resume, and every line printed are torchtitan's own. ``--assets DIR`` builds a tiny
tokenizer and a synthetic ``c4_test``-style dataset there first (nothing is downloaded),
and ``{tmpdir}`` in any argument is the machine's temporary folder. Every other argument
goes to ``python -m torchtitan.train``::

    torchrun --nproc-per-node=2 titan_cpu.py --assets={tmpdir}/titan \\
        --module llama3 --config llama3_debugmodel --hf_assets_path={tmpdir}/titan/tokenizer \\
        --dataloader.dataset_path={tmpdir}/titan/c4_test --dump_folder={tmpdir}/titan/out ...
"""

from __future__ import annotations

import json
import os
import random
import runpy
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


def build_assets(folder: Path) -> None:
    """A BPE tokenizer and 200 documents of made-up words: the same on every call."""
    if (folder / "c4_test" / "data.json").exists():
        return
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = random.Random(0)
    words = [
        "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(500)
    ]
    docs = [" ".join(rng.choice(words) for _ in range(400)) for _ in range(200)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]
    tokenizer.train_from_iterator(
        docs, trainers.BpeTrainer(vocab_size=1000, special_tokens=special)
    )
    # every rank may build them at once: each file is written aside and renamed into place
    files = {
        folder / "tokenizer" / "tokenizer.json": tokenizer.to_str(),
        folder / "tokenizer" / "tokenizer_config.json": json.dumps(
            {
                "bos_token": special[1],
                "eos_token": special[2],
                "add_bos_token": True,
                "add_eos_token": True,
            }
        ),
        folder / "c4_test" / "data.json": "".join(json.dumps({"text": d}) + "\n" for d in docs),
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = folder / f".{path.name}.{os.getpid()}"
        aside.write_text(text, encoding="utf-8")
        os.replace(aside, path)


class _Capacity:
    total_memory = 16 << 30


def _on_cpu() -> None:
    import torchtitan.tools.utils as utils

    cpu = types.SimpleNamespace(
        set_device=lambda *_: None,
        current_device=lambda: 0,
        device_count=lambda: 1,
        is_available=lambda: True,
        synchronize=lambda *_: None,
        empty_cache=lambda: None,
        get_device_name=lambda *_: "cpu",
        get_device_properties=lambda *_: _Capacity(),
        reset_peak_memory_stats=lambda *_: None,
        memory_stats=lambda *_: {
            "active_bytes.all.peak": 0,
            "reserved_bytes.all.peak": 0,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        },
    )
    # before the modules that copy them at import
    utils.device_type, utils.device_module = "cpu", cpu

    from torch.nn.attention.flex_attention import create_mask
    from torchtitan.models.common.attention import FlexAttention

    def dense(
        q: Any, k: Any, v: Any, *, block_mask: Any, scale: Any, enable_gqa: bool, **_: Any
    ) -> Any:
        mask = create_mask(
            block_mask.mask_mod, q.shape[0], 1, q.shape[2], k.shape[2], device=q.device
        )
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa
        )
        return out, types.SimpleNamespace(lse=None)

    FlexAttention._compiled_flex_attn = staticmethod(dense)
    if not hasattr(torch.distributed, "set_timeout"):
        torch.distributed.set_timeout = lambda *_, **__: None


def main() -> None:
    args = [a.replace("{tmpdir}", tempfile.gettempdir()) for a in sys.argv[1:]]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    for arg in [a for a in args if a.startswith("--assets=")]:
        folder = Path(arg.split("=", 1)[1])
        build_assets(folder)
        os.environ.setdefault("HF_DATASETS_CACHE", str(folder / "cache"))  # before its import
        args.remove(arg)
    _on_cpu()
    sys.argv = ["torchtitan.train", *args]
    runpy.run_module("torchtitan.train", run_name="__main__")


if __name__ == "__main__":
    main()
