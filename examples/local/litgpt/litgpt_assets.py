"""Run ``litgpt`` (``python -m litgpt``) after building the files its pretraining reads.

litgpt 0.5.13 pretrains on CPU as it ships; what it lacks here is a tokenizer (its
recipes download one from the Hugging Face hub) and text to train on. ``--assets DIR``
builds both there first, the same on every call, with nothing downloaded: a BPE tokenizer
(``DIR/tokenizer``: ``tokenizer.json`` and ``tokenizer_config.json``) and 400 documents of
made-up words (``DIR/data/*.txt``, for ``--data TextFiles``, whose first file is the
validation split). ``{tmpdir}`` in any argument
is the machine's temporary folder. Every other argument goes to litgpt unchanged::

    torchrun --nproc-per-node=1 litgpt_assets.py --assets={tmpdir}/lit pretrain \\
        --config=model.yaml --tokenizer_dir={tmpdir}/lit/tokenizer --data=TextFiles \\
        --data.train_data_path={tmpdir}/lit/data --out_dir={tmpdir}/lit/out --resume=auto ...
"""

from __future__ import annotations

import json
import os
import random
import runpy
import sys
import tempfile
from pathlib import Path


def build_assets(folder: Path) -> None:
    """The tokenizer and the documents: the same on every call, written once."""
    if (folder / "tokenizer" / "tokenizer_config.json").exists():
        return
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = random.Random(0)
    words = [
        "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(500)
    ]
    # doc000 is --data TextFiles' validation split: long enough for a few batches
    docs = [" ".join(rng.choice(words) for _ in range(4000 if i == 0 else 400)) for i in range(400)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "<s>", "</s>"]
    tokenizer.train_from_iterator(
        docs, trainers.BpeTrainer(vocab_size=1000, special_tokens=special)
    )
    files = {folder / "data" / f"doc{i:03d}.txt": doc for i, doc in enumerate(docs)}
    files[folder / "tokenizer" / "tokenizer.json"] = tokenizer.to_str()
    files[folder / "tokenizer" / "tokenizer_config.json"] = json.dumps(
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": special[1],
            "eos_token": special[2],
            "add_bos_token": True,
        }
    )  # written last: its presence says the rest is there
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = folder / f".{path.name}.{os.getpid()}"
        aside.write_text(text, encoding="utf-8")
        os.replace(aside, path)


def main() -> None:
    args = [a.replace("{tmpdir}", tempfile.gettempdir()) for a in sys.argv[1:]]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched
    for arg in [a for a in args if a.startswith("--assets=")]:
        build_assets(Path(arg.split("=", 1)[1]))
        args.remove(arg)
    sys.argv = ["litgpt", *args]
    runpy.run_module("litgpt", run_name="__main__")


if __name__ == "__main__":
    main()
