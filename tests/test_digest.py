"""state_digest: the fingerprint of training state a drill compares across a resume.

We test these aspects, with real torch objects (a small model, Adam, a scheduler, CPU):

- identities: a module digests like its state dict; the live objects after a load digest
  like the state that was saved; a torch.save / torch.load round trip; another process
  with the same seed; another thread count; a non-contiguous or unaligned tensor like its
  contiguous copy;
- the choice on order: mapping key order does not count, list and tuple order does;
- sensitivity: one element anywhere (the last of a large tensor too), two swapped
  elements in different blocks, a missing or extra key, a re-created optimizer, a reset
  scheduler, another RNG state, a dtype or shape change, -0.0 and NaN payloads;
- the documented blind spot (elements permuted within one 4 KiB block) is real;
- parts: names from the objects' kinds or a mapping's keys, straight into the reporter;
- errors: unsupported objects and unusable part names raise, naming where and why;
- isolation: the reporter loads the module only on use, and it imports neither torch nor
  NumPy for plain values.
"""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import textwrap
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import recoverygate
import torch
from recoverygate import digest as digest_module
from recoverygate import reporter, wire
from recoverygate.digest import BLOCK_BYTES, state_digest
from torch import nn

from tests.patience import JOB, within

REPORTER_PATH = str(Path(recoverygate.__file__).resolve().parent.parent)


def make_training(seed: int = 0, steps: int = 3) -> tuple[nn.Module, Any, Any]:
    """A small model trained a few steps with Adam and a StepLR scheduler."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for _ in range(steps):
        loss = model(torch.randn(8, 32)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return model, optimizer, scheduler


def fresh_like(model: nn.Module) -> tuple[nn.Module, Any, Any]:
    clone = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(clone.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return clone, optimizer, scheduler


def checkpoint(model: nn.Module, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }


def round_trip(state: object, tmp_path: Path) -> Any:
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    return torch.load(path, weights_only=True)


# ---------------------------------------------------------------------------- identities


def test_a_digest_is_16_hex_digits() -> None:
    value = state_digest(make_training()[0])
    assert len(value) == 16
    int(value, 16)


def test_a_module_digests_like_its_state_dict() -> None:
    model, optimizer, scheduler = make_training()
    assert state_digest(model) == state_digest(model.state_dict())
    assert state_digest(optimizer) == state_digest(optimizer.state_dict())
    assert state_digest(scheduler) == state_digest(scheduler.state_dict())


def test_the_state_survives_torch_save_and_load(tmp_path: Path) -> None:
    model, optimizer, scheduler = make_training()
    state = checkpoint(model, optimizer, scheduler)
    assert state_digest(round_trip(state, tmp_path)) == state_digest(state)


def test_live_objects_after_a_correct_resume_digest_like_the_saved_state(tmp_path: Path) -> None:
    model, optimizer, scheduler = make_training()
    saved = state_digest(model, optimizer, scheduler, parts=True)
    loaded = round_trip(checkpoint(model, optimizer, scheduler), tmp_path)
    clone, clone_optimizer, clone_scheduler = fresh_like(model)
    clone.load_state_dict(loaded["model"])
    clone_optimizer.load_state_dict(loaded["optimizer"])
    clone_scheduler.load_state_dict(loaded["scheduler"])
    assert state_digest(clone, clone_optimizer, clone_scheduler, parts=True) == saved


@pytest.mark.slow  # a torch process of its own
def test_the_same_seed_in_another_process_gives_the_same_digest() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        import torch
        from tests.test_digest import make_training
        from recoverygate.reporter import state_digest
        model, optimizer, scheduler = make_training(seed=5)
        torch.set_num_threads(1)  # digest with another thread count than this process, too
        print(state_digest(model, optimizer, scheduler, torch.get_rng_state()))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    model, optimizer, scheduler = make_training(seed=5)
    expected = state_digest(model, optimizer, scheduler, torch.get_rng_state())
    assert result.stdout.strip() == expected


def test_the_thread_count_does_not_change_the_digest_of_a_large_tensor() -> None:
    big = torch.randn(3_000_001)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = state_digest(big)
        torch.set_num_threads(max(threads, 2))
        many = state_digest(big)
    finally:
        torch.set_num_threads(threads)
    assert one == many


def test_a_non_contiguous_or_unaligned_tensor_digests_like_its_copy() -> None:
    base = torch.randn(1000, 700)
    transposed = base.t()
    assert not transposed.is_contiguous()
    assert state_digest(transposed) == state_digest(transposed.contiguous())
    unaligned = base.reshape(-1)[1:]  # storage offset of 4 bytes: no int64 view in place
    assert unaligned.storage_offset() == 1
    assert state_digest(unaligned) == state_digest(unaligned.clone())


def test_gradients_and_requires_grad_are_not_state() -> None:
    model = make_training()[0]
    before = state_digest(model)
    model(torch.randn(2, 32)).sum().backward()
    assert state_digest(model) == before
    weight = nn.Parameter(torch.ones(3))
    assert state_digest(weight) == state_digest(torch.ones(3))


# ---------------------------------------------------------------------------- order


def test_mapping_key_order_does_not_count() -> None:
    state = make_training()[0].state_dict()
    reordered = OrderedDict(reversed(list(state.items())))
    assert list(reordered) != list(state)
    assert state_digest(reordered) == state_digest(state)
    assert state_digest({"a": 1, "b": 2}) == state_digest({"b": 2, "a": 1})


def test_list_and_tuple_order_counts_and_a_list_is_not_a_tuple() -> None:
    assert state_digest([1, 2]) != state_digest([2, 1])
    assert state_digest((1, 2)) != state_digest([1, 2])
    groups = make_training()[1].state_dict()["param_groups"][0]["params"]
    assert state_digest(groups) != state_digest(list(reversed(groups)))


# ---------------------------------------------------------------------------- sensitivity


def changed(tensor: torch.Tensor, index: int) -> torch.Tensor:
    out = tensor.clone()
    flat = out.view(-1)
    flat[index] = flat[index] + 1
    return out


@pytest.mark.parametrize("size", [3, 1024, 1024 + 3, 1_000_003])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_changed_element_anywhere_changes_the_digest(size: int, where: str) -> None:
    tensor = torch.randn(size)
    index = {"first": 0, "middle": size // 2, "last": size - 1}[where]
    assert state_digest(changed(tensor, index)) != state_digest(tensor)


def test_the_last_element_of_a_large_tensor_in_whole_blocks_counts() -> None:
    tensor = torch.randn(BLOCK_BYTES // 4 * 300)  # exactly 300 blocks: no partial tail
    assert state_digest(changed(tensor, tensor.numel() - 1)) != state_digest(tensor)


def test_a_one_ulp_change_and_a_bfloat16_change_are_seen() -> None:
    tensor = torch.randn(500_000)
    nudged = tensor.clone()
    nudged[123_457] = torch.nextafter(nudged[123_457], torch.tensor(float("inf")))
    assert state_digest(nudged) != state_digest(tensor)
    half = tensor.to(torch.bfloat16)
    assert state_digest(changed(half, half.numel() - 1)) != state_digest(half)


def test_two_elements_swapped_across_blocks_are_seen() -> None:
    tensor = torch.randn(100_000)
    swapped = tensor.clone()
    swapped[[10, 90_000]] = tensor[[90_000, 10]]
    # A plain sum over the tensor would not see it; the vector of block sums does.
    assert state_digest(swapped) != state_digest(tensor)


def test_a_permutation_within_one_block_is_the_documented_blind_spot() -> None:
    # Documented in the module docstring and docs/state-digest.md: the price of block sums.
    tensor = torch.randn(100_000, dtype=torch.float64)  # one element per 64-bit word
    swapped = tensor.clone()
    swapped[[8, 9]] = tensor[[9, 8]]  # both in the first 4 KiB block
    assert state_digest(swapped) == state_digest(tensor)
    small = torch.randn(64, dtype=torch.float64)  # a tensor under 4 KiB is hashed whole
    small_swapped = small.clone()
    small_swapped[[8, 9]] = small[[9, 8]]
    assert state_digest(small_swapped) != state_digest(small)


def test_a_missing_or_extra_key_changes_the_digest() -> None:
    state = make_training()[0].state_dict()
    missing = OrderedDict(state)
    del missing["1.bias"]
    extra = OrderedDict(state, extra=torch.zeros(1))
    assert len({state_digest(state), state_digest(missing), state_digest(extra)}) == 3


def test_an_optimizer_re_created_after_loading_is_seen(tmp_path: Path) -> None:
    model, optimizer, _ = make_training()
    saved = state_digest(optimizer)
    loaded = round_trip(optimizer.state_dict(), tmp_path)
    recreated = torch.optim.Adam(model.parameters(), lr=1e-2)  # the bug: moments empty
    assert recreated.state_dict()["state"] == {}
    assert state_digest(recreated) != saved
    restored = torch.optim.Adam(model.parameters(), lr=1e-2)
    restored.load_state_dict(loaded)
    assert state_digest(restored) == saved


def test_a_scheduler_that_starts_over_is_seen() -> None:
    _, optimizer, scheduler = make_training(steps=3)
    saved = scheduler.state_dict()
    fresh = dict(saved, last_epoch=0)
    recounted = dict(saved, _step_count=1)
    digests = {state_digest(saved), state_digest(fresh), state_digest(recounted)}
    assert len(digests) == 3
    new = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)  # never loaded
    assert state_digest(new) != state_digest(saved)


def test_a_load_that_matched_nothing_is_seen(tmp_path: Path) -> None:
    model = make_training()[0]
    saved = state_digest(model)
    ddp_style = {f"module.{key}": value for key, value in model.state_dict().items()}
    clone = fresh_like(model)[0]
    result = clone.load_state_dict(round_trip(ddp_style, tmp_path), strict=False)
    assert result.missing_keys  # strict=False: the bug goes unnoticed by torch
    assert state_digest(clone) != saved


def test_another_rng_state_is_seen_for_torch_numpy_and_python() -> None:
    torch.manual_seed(1)
    state = torch.get_rng_state()
    torch.rand(1)
    assert state_digest(torch.get_rng_state()) != state_digest(state)
    generator = torch.Generator().manual_seed(3)
    before = state_digest(generator)
    torch.rand(1, generator=generator)
    assert state_digest(generator) != before
    rng = np.random.default_rng(3)
    before = state_digest(rng)
    rng.random()
    assert state_digest(rng) != before
    legacy = np.random.RandomState(3)
    assert state_digest(legacy) == state_digest(np.random.RandomState(3).get_state())
    legacy.rand()
    assert state_digest(legacy) != state_digest(np.random.RandomState(3))
    python = random.Random(3)
    before = state_digest(python)
    python.random()
    assert state_digest(python) != before
    assert state_digest(random.Random(3)) == state_digest(random.Random(3).getstate())


def test_the_same_bytes_with_another_dtype_or_shape_are_seen() -> None:
    tensor = torch.randn(64, 64)
    assert state_digest(tensor.view(torch.int32)) != state_digest(tensor)
    assert state_digest(tensor.reshape(32, 128)) != state_digest(tensor)
    assert state_digest(tensor.reshape(-1)) != state_digest(tensor)
    assert state_digest(tensor.double()) != state_digest(tensor)
    assert state_digest(tensor.to(torch.bfloat16)) != state_digest(tensor.to(torch.float16))


def test_negative_zero_and_nan_payloads_count_as_their_bytes() -> None:
    zeros = torch.zeros(10_000)
    negative = zeros.clone()
    negative[-1] = -0.0
    assert state_digest(negative) != state_digest(zeros)
    nans = torch.full((10_000,), float("nan"))
    other = nans.clone()
    other.view(torch.int32)[5_000] += 1  # another NaN: float sums could never tell
    assert state_digest(other) != state_digest(nans)


def test_plain_values_carry_their_type() -> None:
    values = [1, 1.0, True, "1", b"1", [1], (1,), {1}, None, 1 + 0j, np.int64(1), {"1": 1}]
    assert len({state_digest(value) for value in values}) == len(values)
    assert state_digest(0) != state_digest(False)
    assert state_digest("é") == state_digest("é")


def test_numpy_arrays_and_scalars() -> None:
    array = np.random.default_rng(0).standard_normal(100_003)
    assert state_digest(array) == state_digest(array.copy())
    bumped = array.copy()
    bumped[-1] += 1
    assert state_digest(bumped) != state_digest(array)
    assert state_digest(array.astype(np.float32)) != state_digest(array)
    assert state_digest(array[::2]) == state_digest(np.ascontiguousarray(array[::2]))
    assert state_digest(np.float32(1.5)) != state_digest(np.float64(1.5))
    assert state_digest(np.array(["a", None], dtype=object)) != state_digest(
        np.array(["a", 1], dtype=object)
    )


def test_random_getstate_and_numpy_get_state_work_as_plain_values() -> None:
    random.seed(1)
    np.random.seed(1)
    before = state_digest([random.getstate(), np.random.get_state()])
    random.random()
    assert state_digest([random.getstate(), np.random.get_state()]) != before


def test_a_sparse_tensor_digests_its_coalesced_contents() -> None:
    indices = torch.tensor([[0, 2, 0], [1, 0, 1]])
    values = torch.tensor([1.0, 2.0, 3.0])
    sparse = torch.sparse_coo_tensor(indices, values, (3, 3), check_invariants=True)
    same = torch.sparse_coo_tensor(
        indices[:, [1, 0, 2]], values[[1, 0, 2]], (3, 3), check_invariants=True
    )
    assert state_digest(sparse) == state_digest(same)
    assert state_digest(sparse) != state_digest(sparse.to_dense())


def test_the_device_path_and_the_host_path_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    # CPU tensors are summed with NumPy, tensors on an accelerator with torch on the device;
    # forcing torch's path on the CPU shows both write the same sums (the GPU stand-in).
    model, optimizer, _ = make_training()
    tensors = [
        torch.randn(1_000_003),
        torch.randn(4096, 3).t(),
        torch.arange(7),
        torch.randn(100_000).to(torch.bfloat16),
        torch.randn(2048).reshape(-1)[1:],
    ]
    host = state_digest(model, optimizer, tensors)
    monkeypatch.setattr(digest_module, "_numpy", lambda: None)
    assert state_digest(model, optimizer, tensors) == host


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_tensor_on_the_gpu_digests_like_on_the_cpu() -> None:
    tensor = torch.randn(1_000_003)
    assert state_digest(tensor.cuda()) == state_digest(tensor)


# ---------------------------------------------------------------------------- parts


def test_parts_are_named_after_the_objects_kinds() -> None:
    model, optimizer, scheduler = make_training()
    generator = torch.Generator().manual_seed(0)
    parts = state_digest(model, optimizer, scheduler, generator, {"epoch": 3}, [1], parts=True)
    assert list(parts) == ["model", "optimizer", "scheduler", "rng", "extra", "extra.1"]
    assert parts["model"] == state_digest(model)
    assert parts["extra"] == state_digest({"epoch": 3})


def test_a_single_mapping_names_the_parts_by_its_keys() -> None:
    model, optimizer, _ = make_training()
    parts = state_digest(
        {"model": model, "optimizer": optimizer, "rng/torch": torch.get_rng_state()}, parts=True
    )
    assert parts == {
        "model": state_digest(model),
        "optimizer": state_digest(optimizer),
        "rng/torch": state_digest(torch.get_rng_state()),
    }


def test_parts_go_straight_into_the_reporter_and_come_back_from_the_parser() -> None:
    model, optimizer, scheduler = make_training()
    parts = state_digest(model, optimizer, scheduler, parts=True)
    out = io.StringIO()
    reporter.configure(stream=out)
    try:
        reporter.checkpoint_completed(30, digest=parts)
        reporter.checkpoint_loaded(30, digest=state_digest(model))
    finally:
        reporter.configure()
    records, malformed = wire.parse_text(out.getvalue())
    assert malformed == 0
    completed, loaded = records[1], records[2]
    assert dict(completed.parts) == parts
    assert completed.digest == wire.combine_parts(tuple(sorted(parts.items())))
    assert loaded.digest == state_digest(model)


def test_part_names_the_wire_cannot_carry_are_refused() -> None:
    with pytest.raises(ValueError, match="part name 'has space'"):
        state_digest({"has space": 1}, parts=True)
    with pytest.raises(ValueError, match="part name 1"):
        state_digest({1: 1}, parts=True)
    with pytest.raises(ValueError, match="17 parts, at most 16"):
        state_digest({f"p{i}": i for i in range(17)}, parts=True)


# ---------------------------------------------------------------------------- errors


def test_an_unsupported_object_raises_a_type_error_saying_where() -> None:
    model = make_training()[0]
    with pytest.raises(TypeError, match=r"builtins\.object .*at \['extra'\]\['hooks'\]\[1\]"):
        state_digest({"model": model, "extra": {"hooks": [1, object()]}})
    with pytest.raises(TypeError, match=r"part 'extra', at \[0\]"):
        state_digest(model, [object()], parts=True)
    with pytest.raises(TypeError, match="at the top level"):
        state_digest(lambda: None)
    with pytest.raises(TypeError, match="at least one object"):
        state_digest()


def test_a_meta_tensor_or_a_cycle_raises_instead_of_vouching_for_nothing() -> None:
    with pytest.raises(TypeError, match="meta device"):
        state_digest(torch.empty(3, device="meta"))
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(TypeError, match="nested more than 64 levels"):
        state_digest(loop)
    with pytest.raises(TypeError, match="SystemRandom"):
        state_digest(random.SystemRandom())


# ---------------------------------------------------------------------------- isolation


def test_the_reporter_loads_the_digest_module_only_when_it_is_used() -> None:
    code = """
        import sys
        from recoverygate import reporter
        reporter.progress(1)
        reporter.checkpoint_completed(1, digest={"model": "ab"})
        print("recoverygate.digest" in sys.modules, "hashlib" in sys.modules)
        value = reporter.state_digest({"step": 1, "lr": [0.1, 0.01], "name": "run"})
        print("recoverygate.digest" in sys.modules, "torch" in sys.modules,
              "numpy" in sys.modules, len(value))
        from recoverygate.reporter import state_digest
        print(state_digest is reporter.state_digest)
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={"PYTHONPATH": REPORTER_PATH, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if not line.startswith("RECOVERYGATE")]
    # hashlib comes with the first parts line (the combined digest), the module only on use.
    assert lines == ["False True", "True False False 16", "True"]


def test_the_module_exports_state_digest_and_its_constants() -> None:
    assert digest_module.__all__ == ["BLOCK_BYTES", "DIGEST_HEX_CHARS", "MAX_DEPTH", "state_digest"]
    assert reporter.state_digest is state_digest


@pytest.mark.slow  # a torch process of its own
def test_a_dtensor_digests_its_local_shard(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import os
        import torch, torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        from recoverygate.reporter import state_digest
        dist.init_process_group(
            "gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1
        )
        mesh = init_device_mesh("cpu", (1,))
        plain = torch.randn(300, 50)
        sharded = distribute_tensor(plain, mesh, [Shard(0)])
        again = distribute_tensor(plain.clone(), mesh, [Shard(0)])
        assert state_digest(sharded) == state_digest(again)
        sharded.to_local().view(-1)[-1] += 1
        assert state_digest(sharded) != state_digest(again)
        dist.destroy_process_group()
        print("ok", flush=True)
        # Gloo's threads can abort the interpreter's teardown after this ("terminate called
        # without an active exception", SIGABRT after "ok", in one full CI run): that is
        # torch's exit, not what this test checks, so the process ends here.
        os._exit(0)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


# ---------------------------------------------------------------------------- the doc's loop

DOC = Path(__file__).resolve().parent.parent / "docs" / "state-digest.md"


def documented_loop() -> str:
    text = DOC.read_text()
    start = text.index("```python\n# state-digest example")
    body = text[start:].split("\n", 1)[1]
    return body[: body.index("```")]


def run_loop(code: str, checkpoint: Path, total: int) -> list[wire.Record]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"RANK", "SLURM_PROCID", "RECOVERYGATE_RANKS"}
    }
    env.update(CKPT=str(checkpoint), TOTAL_STEPS=str(total), PYTHONPATH=REPORTER_PATH)
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=within(JOB),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records, malformed = wire.parse_text(result.stdout)
    assert malformed == 0
    return records


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, wire.Record]:
    """The documented loop run to step 200 from scratch: its checkpoint and last event."""
    checkpoint = tmp_path_factory.mktemp("first") / "checkpoint.pt"
    records = run_loop(documented_loop(), checkpoint, 200)
    completed = [r for r in records if r.event == "checkpoint_completed"]
    assert [r.step for r in completed] == [100, 200]
    assert [r.step for r in records if r.event == "checkpoint_started"] == [100, 200]
    return checkpoint.read_bytes(), completed[-1]


BUGS = {
    "none": ("", ""),
    "model": (
        '    model.load_state_dict(ckpt["model"])\n',
        '    model.load_state_dict({"module." + k: v for k, v in ckpt["model"].items()},'
        " strict=False)\n",
    ),
    "optimizer": ('    optimizer.load_state_dict(ckpt["optimizer"])\n', ""),
    "scheduler": ('    scheduler.load_state_dict(ckpt["scheduler"])\n', ""),
    "rng": ('    torch.set_rng_state(ckpt["rng"]["torch"])\n', ""),
}


@pytest.mark.slow  # torch processes running the documented loop
@pytest.mark.parametrize("bug", list(BUGS))
def test_the_documented_loop_resumes_with_the_saved_state_or_names_the_part_that_is_not(
    bug: str, first_run: tuple[bytes, wire.Record], tmp_path: Path
) -> None:
    saved, completed = first_run
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(saved)
    old, new = BUGS[bug]
    code = documented_loop()
    if old:
        assert old in code
        code = code.replace(old, new)
    records = run_loop(code, checkpoint, 300)
    loaded = next(r for r in records if r.event == "checkpoint_loaded")
    assert loaded.step == 200
    assert next(r.step for r in records if r.event == "progress") == 201  # the step is right
    assert completed.parts and {name for name, _ in loaded.parts} == {
        "model",
        "optimizer",
        "rng",
        "scheduler",
    }
    differ = {
        name for (name, a), (_, b) in zip(completed.parts, loaded.parts, strict=True) if a != b
    }
    if bug == "none":
        assert loaded.digest == completed.digest
        assert differ == set()
    else:
        assert loaded.digest != completed.digest
        assert differ == {bug}
