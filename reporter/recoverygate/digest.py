"""Fingerprint training state: ``reporter.state_digest(model, optimizer, scheduler)``.

A drill proves a resume came back at the right *step*; a digest proves it came back with
the right *state*. Compute one when a checkpoint is saved and one after it is loaded
(after every ``load_state_dict``), send them with ``checkpoint_completed`` and
``checkpoint_loaded``, and the drill compares the two (docs/state-digest.md).

What it reads. Objects with a ``state_dict()`` method (``nn.Module``, optimizers, LR
schedulers, ``GradScaler``, any ``Stateful``) are read through it, so
``state_digest(model) == state_digest(model.state_dict())`` and the live objects after a
load digest like the state dicts that were saved. Also: tensors, NumPy arrays and
scalars, RNGs (``torch.Generator``, NumPy ``Generator``/``RandomState``/bit generators,
``random.Random``, by their state) and their raw states, and plain Python values
(``dict``/``list``/``tuple``/``set``, ``int``/``float``/``complex``/``str``/``bytes``/
``bool``/``None``), nested. Anything else raises :class:`TypeError` naming the object and
where it was found: ``state_digest`` is called explicitly, off the hot path, and a digest
that silently skipped part of the state would vouch for state it never saw. (The
reporter's checkpoint calls, in contrast, never raise.)

How tensors are read (the design, chosen by measurement; bench/bench_digest.py and
docs/state-digest.md have the figures). Every byte is read, but not every byte is hashed:

- a tensor's bytes are viewed as 64-bit words and summed modulo 2**64 per 4 KiB block
  (512 words) with one row-sum of the ``(blocks, 512)`` view; the vector of block sums,
  then the bytes of the last partial block, go into the hash. A tensor of less than
  4 KiB (biases, norms, RNG states, scalars) is hashed whole. On the host the sums are
  NumPy's (single-threaded: torch's OpenMP sum ran 5x slower when other processes shared
  the cores, and no global thread setting is touched); on an accelerator they are
  torch's, on the device, and only the sums (1/512 of the bytes) are copied back;
- header of every tensor: dtype and shape; device, ``requires_grad`` and storage
  sharing are not state and are left out, so the same values digest alike on any device;
- integer sums are exact and associative: the same bytes give the same sums whatever
  the thread count, the summation order or the device (CPU and CUDA agree); NaN
  payloads and -0.0 count as the bytes they are (float sums would not);
- everything goes through BLAKE2b (8-byte digest, personalised ``RecoveryGate/v1``).

What it sees: any change confined to one 4 KiB block (one element anywhere, the last
one of a huge tensor included, a zeroed or torn page), blocks moved or swapped, a dtype
or shape change, a missing or extra key, empty optimizer moments, a reset scheduler
step, a different RNG state. What it cannot see (the price of reading at memory speed
instead of hashing every byte): elements permuted *within* one 4 KiB block, and changes
inside one block that cancel exactly modulo 2**64 (``+d`` on one word and ``-d`` on
another). No state-restoring bug we know of does either; a full hash would see them too
and costs 3-5x (CRC-32 on every core) to 24x (BLAKE2b) more.

Canonical form of plain values: every value carries a type tag and a length, so ``1``,
``1.0``, ``True``, ``"1"`` and ``[1]`` differ, and a list differs from a tuple. Mapping
keys are sorted (by their encoding): ``load_state_dict`` matches keys by name, never by
position, and an optimizer maps parameters through the ordered ``params`` lists, which
stay ordered; so state dicts that differ only in key order (a safetensors round trip
sorts them) digest alike. List and tuple order always counts.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from collections.abc import Callable, Mapping, Set
from typing import TYPE_CHECKING, Any, Literal, overload

from recoverygate import wire

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["BLOCK_BYTES", "DIGEST_HEX_CHARS", "MAX_DEPTH", "state_digest"]

#: Tensor and array bytes are summed in blocks of this many bytes (512 64-bit words).
BLOCK_BYTES = 4096
_BLOCK_WORDS = BLOCK_BYTES // 8
#: Hex digits of a digest (8 bytes of BLAKE2b).
DIGEST_HEX_CHARS = 16
#: Deeper nesting than this is refused (a cycle, most likely).
MAX_DEPTH = 64
_PERSON = b"RecoveryGate/v1"

_Put = Callable[[bytes | memoryview], object]  # a hasher's update()


class _Unsupported(TypeError):
    """An object state_digest cannot read; carries the path where it was found."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what
        self.path: list[str] = []


@overload
def state_digest(*objects: object, parts: Literal[False] = False) -> str: ...


@overload
def state_digest(*objects: object, parts: Literal[True]) -> dict[str, str]: ...


@overload
def state_digest(*objects: object, parts: bool) -> str | dict[str, str]: ...


def state_digest(*objects: object, parts: bool = False) -> str | dict[str, str]:
    """A 16-hex-digit fingerprint of ``objects``, or one per part with ``parts=True``.

    ``state_digest(model, optimizer, scheduler)`` digests the three together;
    ``state_digest(model, optimizer, scheduler, parts=True)`` returns
    ``{"model": ..., "optimizer": ..., "scheduler": ...}``, ready for
    ``reporter.checkpoint_completed(step, digest=...)``, so a drill can say which part
    differs. Part names come from the objects' kinds (``model``, ``optimizer``,
    ``scheduler``, ``rng``, else ``extra``; repeats are numbered ``model.1``), or, when
    the only object is a mapping, from its keys::

        state_digest({"model": model, "optimizer": opt, "rng": torch.get_rng_state()},
                     parts=True)

    Raises TypeError for an object it cannot read (with where it was found), ValueError
    for part names the wire cannot carry (more than 16, or not ``[A-Za-z0-9_.:/-]{1,64}``).
    """
    if not objects:
        raise TypeError("state_digest() needs at least one object to fingerprint")
    if not parts:
        return _digest(objects[0] if len(objects) == 1 else objects)
    named = _named_parts(objects)
    return {name: _digest(value, where=f"part {name!r}") for name, value in named}


# ---------------------------------------------------------------------------- parts


def _role(obj: object) -> str:
    """The part name an object gets from its kind."""
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.nn.Module):
            return "model"
        if isinstance(obj, torch.optim.Optimizer):
            return "optimizer"
        if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
            return "scheduler"
        if isinstance(obj, torch.Generator):
            return "rng"
    if _rng_state_of(obj) is not None:
        return "rng"
    return "extra"


def _named_parts(objects: tuple[object, ...]) -> list[tuple[str, object]]:
    if len(objects) == 1 and isinstance(objects[0], Mapping):
        named = list(objects[0].items())
        for name, _ in named:
            if type(name) is not str or not wire.is_part_name(name):
                raise ValueError(
                    f"state_digest(parts=True): part name {name!r} cannot go on the wire; "
                    f"use 1 to {wire.MAX_PART_NAME_CHARS} characters from A-Z a-z 0-9 _ . : / -"
                )
    else:
        named = []
        seen: dict[str, int] = {}
        for obj in objects:
            role = _role(obj)
            count = seen.get(role, 0)
            seen[role] = count + 1
            named.append((role if count == 0 else f"{role}.{count}", obj))
    if len(named) > wire.MAX_DIGEST_PARTS:
        raise ValueError(
            f"state_digest(parts=True): {len(named)} parts, at most "
            f"{wire.MAX_DIGEST_PARTS} fit on the wire; group them, e.g. "
            '{"model": model, "optimizer": optimizer} rather than one part per tensor'
        )
    return named


# ---------------------------------------------------------------------------- walking


def _digest(obj: object, where: str = "") -> str:
    hasher = hashlib.blake2b(digest_size=DIGEST_HEX_CHARS // 2, person=_PERSON)
    try:
        _feed(hasher.update, obj, 0)
    except _Unsupported as error:
        path = "".join(error.path) or "the top level"
        prefix = f"{where}, " if where else ""
        raise TypeError(
            f"state_digest cannot fingerprint {error.what} ({prefix}at {path}); pass "
            "its state instead: a state_dict(), tensors, arrays, numbers, strings"
        ) from None
    return hasher.hexdigest()


def _feed(put: _Put, obj: object, depth: int) -> None:
    """Write ``obj``'s canonical encoding through ``put`` (a hasher's ``update``)."""
    kind = type(obj)
    # Exact types first: they are most of a state dict's leaves.
    if obj is None:
        put(b"N")
    elif kind is bool:
        put(b"T" if obj else b"F")
    elif kind is int:
        put(b"i%d;" % obj)  # type: ignore[str-format]
    elif kind is float:
        put(b"f" + struct.pack("<d", obj))
    elif kind is str:
        data = obj.encode("utf-8", "surrogatepass")  # type: ignore[attr-defined]
        put(b"s%d:" % len(data))
        put(data)
    elif kind is dict:
        _feed_mapping(put, obj, depth)  # type: ignore[arg-type]
    elif kind is list or kind is tuple:
        _feed_sequence(put, obj, depth, b"[" if kind is list else b"(")  # type: ignore[arg-type]
    elif kind is bytes:
        put(b"b%d:" % len(obj))  # type: ignore[arg-type]
        put(obj)  # type: ignore[arg-type]
    else:
        _feed_other(put, obj, depth)


def _check_depth(depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise _Unsupported(f"a value nested more than {MAX_DEPTH} levels deep (a cycle?)")


def _feed_mapping(put: _Put, obj: Mapping[Any, Any], depth: int) -> None:
    _check_depth(depth)
    items = []
    for key, value in obj.items():
        items.append((_key_bytes(key), key, value))
    items.sort(key=lambda item: item[0])
    put(b"{%d:" % len(items))
    for encoded, key, value in items:
        put(encoded)
        try:
            _feed(put, value, depth + 1)
        except _Unsupported as error:
            error.path.insert(0, f"[{key!r}]")
            raise
    put(b"}")


def _feed_sequence(put: _Put, obj: list[Any] | tuple[Any, ...], depth: int, tag: bytes) -> None:
    _check_depth(depth)
    if len(obj) > 8 and all(type(item) is int for item in obj):
        # Long runs of ints (random.getstate(), sampler permutations): one token.
        text = ",".join(map(str, obj)).encode("ascii")
        put(tag + b"I%d:" % len(text))
        put(text)
        return
    put(tag + b"%d:" % len(obj))
    for index, item in enumerate(obj):
        try:
            _feed(put, item, depth + 1)
        except _Unsupported as error:
            error.path.insert(0, f"[{index}]")
            raise
    put(b"]" if tag == b"[" else b")")


def _key_bytes(key: object) -> bytes:
    """A mapping key's encoding, used both to sort the items and in the hash."""
    kind = type(key)
    if kind is str:
        data = key.encode("utf-8", "surrogatepass")  # type: ignore[attr-defined]
        return b"s%d:%s" % (len(data), data)
    if kind is int:
        return b"i%d;" % key  # type: ignore[str-format]
    sub = hashlib.blake2b(digest_size=16, person=_PERSON)
    _feed(sub.update, key, MAX_DEPTH - 8)  # keys are small: a shallow budget is plenty
    return b"k" + sub.digest()


def _feed_other(put: _Put, obj: object, depth: int) -> None:
    _check_depth(depth)
    torch = sys.modules.get("torch")  # an object of a module never imported is not of it
    if torch is not None:
        if isinstance(obj, torch.Tensor):
            _feed_tensor(put, obj, torch)
            return
        if isinstance(obj, torch.Generator):
            _feed(put, obj.get_state(), depth + 1)
            return
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(obj, numpy.ndarray):
            _feed_array(put, obj, numpy, depth)
            return
        if isinstance(obj, numpy.generic):
            put(b"a" + obj.dtype.str.encode("ascii") + b":")
            put(obj.tobytes())
            return
    state = _rng_state_of(obj)
    if state is not None:
        _feed(put, state(), depth + 1)
        return
    state_dict = getattr(obj, "state_dict", None)
    if callable(state_dict):
        _feed(put, state_dict(), depth + 1)
        return
    if isinstance(obj, Mapping):
        _feed_mapping(put, obj, depth)
    elif isinstance(obj, (list, tuple)):  # namedtuples, torch.Size
        _feed_sequence(put, obj, depth, b"[" if isinstance(obj, list) else b"(")
    elif isinstance(obj, Set):
        _feed_set(put, obj)
    elif isinstance(obj, (bytearray, memoryview)):
        data = bytes(obj)
        put(b"b%d:" % len(data))
        put(data)
    elif isinstance(obj, bool):
        put(b"T" if obj else b"F")
    elif isinstance(obj, int):  # IntEnum and other int subclasses: their value
        put(b"i%d;" % int(obj))
    elif isinstance(obj, float):
        put(b"f" + struct.pack("<d", float(obj)))
    elif isinstance(obj, complex):
        put(b"c" + struct.pack("<dd", obj.real, obj.imag))
    elif isinstance(obj, str):
        data = str(obj).encode("utf-8", "surrogatepass")
        put(b"s%d:" % len(data))
        put(data)
    else:
        kind = type(obj)
        raise _Unsupported(f"an object of type {kind.__module__}.{kind.__qualname__}")


def _feed_set(put: _Put, obj: Iterable[object]) -> None:
    members = sorted(_key_bytes(member) for member in obj)
    put(b"<%d:" % len(members))
    for member in members:
        put(member)
    put(b">")


def _rng_state_of(obj: object) -> Callable[[], object] | None:
    """The state getter of a Python or NumPy random generator, else None."""
    random = sys.modules.get("random")
    if random is not None and isinstance(obj, random.Random):
        if isinstance(obj, random.SystemRandom):
            return None  # it has no state: getstate() raises
        return obj.getstate  # type: ignore[no-any-return]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(obj, numpy.random.RandomState):
            return obj.get_state  # type: ignore[no-any-return]
        if isinstance(obj, numpy.random.Generator):
            return lambda: obj.bit_generator.state
        if isinstance(obj, numpy.random.BitGenerator):
            return lambda: obj.state
    return None


# ---------------------------------------------------------------------------- tensors


#: dtype -> its header bytes (``str(dtype)`` once per dtype, not once per tensor).
_DTYPE_TAGS: dict[Any, bytes] = {}


def _feed_tensor(put: _Put, tensor: Any, torch: Any) -> None:
    if type(tensor) in (torch.Tensor, torch.nn.Parameter) and _feed_plain_cpu(put, tensor, torch):
        return
    to_local = getattr(tensor, "to_local", None)
    if callable(to_local) and hasattr(tensor, "placements"):  # DTensor: this rank's shard
        put(b"D" + repr(tuple(tensor.shape)).encode("ascii"))
        tensor = to_local()
    if tensor.layout is torch.sparse_coo:
        tensor = tensor.detach().coalesce()
        put(b"C" + str(tensor.dtype).encode("ascii") + repr(tuple(tensor.shape)).encode())
        _feed_tensor(put, tensor.indices(), torch)
        _feed_tensor(put, tensor.values(), torch)
        return
    if tensor.layout is not torch.strided:
        raise _Unsupported(f"a tensor with layout {tensor.layout}")
    if tensor.is_meta:
        raise _Unsupported("a tensor on the meta device (it holds no data)")
    if tensor.is_quantized:
        raise _Unsupported("a quantized tensor (digest t.int_repr(), t.q_scale(), ...)")
    put(b"t" + str(tensor.dtype).encode("ascii") + repr(tuple(tensor.shape)).encode("ascii"))
    tensor = tensor.detach().resolve_conj().resolve_neg()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    try:
        data = tensor.reshape(-1).view(torch.uint8)
    except RuntimeError:  # an offset that forbids the view in place: copy it first
        try:
            data = tensor.reshape(-1).clone().view(torch.uint8)
        except RuntimeError:
            raise _Unsupported(f"a {tensor.dtype} tensor (its bytes cannot be read)") from None
    if data.device.type == "cpu":
        numpy = _numpy()
        if numpy is not None:
            # NumPy on the host: single-threaded, so no OpenMP team to stall when other
            # processes share the cores (torch's 2-thread sum ran 5x slower then), and
            # no global thread setting to touch. Memory-bound either way.
            _feed_bytes(put, data.numpy(), numpy)
            return
    size = data.numel()
    whole = size - size % BLOCK_BYTES
    if whole:
        blocks = data[:whole]
        try:
            words = blocks.view(torch.int64)
        except RuntimeError:  # storage offset not a multiple of 8 bytes
            words = blocks.clone().view(torch.int64)
        sums = words.view(-1, _BLOCK_WORDS).sum(dim=1)  # on the device; wraps modulo 2**64
        put(b"S%d:" % sums.numel())
        put(_host_bytes(sums))
    put(b"R%d:" % (size - whole))
    if size > whole:
        put(_host_bytes(data[whole:]))


def _feed_plain_cpu(put: _Put, tensor: Any, torch: Any) -> bool:
    """The common case, fed exactly like the general path below but with fewer calls per
    tensor (the digest of a state dict is mostly per-tensor overhead once the sums run at
    memory speed): a dense, contiguous, real CPU tensor that NumPy can view. False: not
    that case, nothing fed."""
    numpy = _numpy()
    if (
        numpy is None
        or tensor.device.type != "cpu"
        or tensor.layout is not torch.strided
        or tensor.is_quantized
        or tensor.is_complex()
        or tensor.is_neg()
        or not tensor.is_contiguous()
    ):
        return False
    dtype = tensor.dtype
    tag = _DTYPE_TAGS.get(dtype)
    if tag is None:
        tag = _DTYPE_TAGS[dtype] = b"t" + str(dtype).encode("ascii")
    if tensor.requires_grad:
        tensor = tensor.detach()
    try:
        data = tensor.reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, TypeError):  # an offset that forbids the view, a dtype NumPy lacks
        return False
    put(tag + repr(tuple(tensor.shape)).encode("ascii"))
    _feed_bytes(put, data, numpy)
    return True


def _numpy() -> Any:
    """NumPy, if it can be imported (torch CPU tensors are read through it)."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        try:
            import numpy  # only when a CPU tensor needs it
        except ImportError:
            return None
    return numpy


def _host_bytes(tensor: Any) -> bytes | memoryview:
    """The bytes of a small 1-d tensor (block sums, a tail), copied to the host."""
    tensor = tensor.cpu()
    try:
        return memoryview(tensor.contiguous().numpy()).cast("B")
    except (RuntimeError, TypeError, ValueError):  # torch built without NumPy
        if tensor.dtype.itemsize == 1:
            return bytes(tensor.tolist())
        return struct.pack(f"<{tensor.numel()}q", *tensor.tolist())


def _feed_bytes(put: _Put, data: Any, numpy: Any) -> None:
    """The block sums and the tail of a 1-d uint8 array (the layout torch's path writes)."""
    size = data.size
    whole = size - size % BLOCK_BYTES
    if whole:
        words = data[:whole].view(numpy.uint64).reshape(-1, _BLOCK_WORDS)
        sums = numpy.add.reduce(words, axis=1, dtype=numpy.uint64)  # exact: wraps mod 2**64
        put(b"S%d:" % sums.size)
        put(sums.astype("<u8", copy=False).data)
    put(b"R%d:" % (size - whole))
    if size > whole:
        put(data[whole:].data)


def _feed_array(put: _Put, array: Any, numpy: Any, depth: int) -> None:
    dtype = array.dtype
    name = dtype.str if dtype.fields is None else repr(dtype.descr)
    put(b"A" + name.encode("ascii") + repr(array.shape).encode("ascii"))
    if dtype.hasobject:
        _feed(put, array.tolist(), depth + 1)
        return
    _feed_bytes(put, numpy.ascontiguousarray(array).reshape(-1).view(numpy.uint8), numpy)
