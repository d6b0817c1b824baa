r"""What a model's numbers are, in a few bytes: what binds a graph (and every result a later
call computes from the model again) to the weights it was built on. Two measures, each for its
purpose:

* **The fingerprint** (:func:`weights_fingerprint`), for files: per tensor of the model, its
  parameters then its buffers (rotary ``inv_freq`` tables, position ids, fixed masks), its
  name, shape, dtype and the SHA-256 of its bytes. It sees every bit, in order: an edited
  weight, two weights swapped, a NaN where a number was, a buffer changed; it is the same for
  the same weights on any device and in any process, so a graph file keeps it and a model
  loaded later is compared with it (:func:`fingerprint_difference`). One read of the weights,
  hashed on two threads: 0.16 s for SmolLM2-135M in float32 on two CPU cores.
* **The stamp** (:func:`weights_stamp`), for a model in memory: per tensor, its storage, its
  version counter (bumped by every in-place change, a swap included) and the wrapping sum of
  its bits (which sees a change made through ``.data`` that alters any bit's sum, a NaN
  included). 0.02 s for SmolLM2-135M: a graph takes it when it is built and compares it before
  every later pass of the model (:func:`check_unchanged`); a change through ``.data`` that
  keeps every tensor's sum of bits (a permutation within a tensor) is the one it misses, and
  the fingerprint, taken when the graph is saved or bound, sees that too.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb._private import version_counter

__all__ = ["Fingerprint", "Stamp", "check_unchanged", "fingerprint_difference", "weights_fingerprint",
           "weights_stamp"]

#: ``((name, shape, dtype, sha256 hex), ...)``: parameters, then buffers.
Fingerprint = tuple[tuple[str, tuple[int, ...], str, str], ...]
#: Above this many bytes, tensors are hashed on two threads (``hashlib`` releases the GIL).
_THREADED_BYTES = 1 << 26


def _digest(tensor: Tensor) -> str:
    """The SHA-256 of ``tensor``'s bytes (row-major), ``"meta"`` where it holds none."""
    data = tensor.detach()
    if data.device.type == "meta":
        return "meta"
    flat = data.reshape(-1).contiguous().cpu()
    if flat.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(memoryview(flat.view(torch.uint8).numpy())).hexdigest()


def weights_fingerprint(model: nn.Module) -> Fingerprint:
    """``model``'s fingerprint: per parameter, then per buffer, ``(name, shape, dtype,
    SHA-256 of its bytes)`` (shared tensors once)."""
    named = _named_tensors(model)
    size = sum(t.numel() * t.element_size() for _, t in named)
    if size > _THREADED_BYTES and len(named) > 1:
        with ThreadPoolExecutor(2) as pool:
            digests = list(pool.map(_digest, (t for _, t in named)))
    else:
        digests = [_digest(t) for _, t in named]
    return tuple((name, tuple(t.shape), str(t.dtype).removeprefix("torch."), digest)
                 for (name, t), digest in zip(named, digests))


def fingerprint_difference(saved: Sequence[Sequence[Any]], found: Sequence[Sequence[Any]]) -> str | None:
    """Where two fingerprints differ, in words (``None``: the same weights and buffers; a
    buffer of zeros that only one of them has, as a wrapper's zero bias, is no difference)."""
    saved_rows = [(str(r[0]), tuple(int(s) for s in r[1]), str(r[2]), str(r[3])) for r in saved]
    found_rows = [(str(r[0]), tuple(int(s) for s in r[1]), str(r[2]), str(r[3])) for r in found]
    # a buffer of zeros only one side has (a wrapper's zero bias of a bias-free layer) adds nothing
    saved_rows = [r for r in saved_rows if not (r[0] not in {f[0] for f in found_rows} and _zeros(r))]
    found_rows = [r for r in found_rows if not (r[0] not in {f[0] for f in saved_rows} and _zeros(r))]
    saved_names = [r[0] for r in saved_rows]
    found_names = [r[0] for r in found_rows]
    if saved_names != found_names:
        missing = [n for n in saved_names if n not in set(found_names)]
        extra = [n for n in found_names if n not in set(saved_names)]
        if missing:
            return f"it has no {_kind(missing[0])} {_name(missing[0])}"
        if extra:
            return f"it has a {_kind(extra[0])} {_name(extra[0])} the graph's model had not"
        return "its tensors come in another order"
    for (name, shape, dtype, digest), (_, now_shape, now_dtype, now_digest) in zip(saved_rows, found_rows):
        if (shape, dtype) != (now_shape, now_dtype):
            return (f"{_kind(name)} {_name(name)} is {list(now_shape)} {now_dtype}, the graph's model had "
                    f"{list(shape)} {dtype}")
        if digest != now_digest:
            return f"{_kind(name)} {_name(name)} holds other values"
    return None


def _zeros(row: tuple[str, tuple[int, ...], str, str]) -> bool:
    """Whether the fingerprint row ``row`` is a buffer of zeros (of at most 64 MiB)."""
    name, shape, dtype, digest = row
    kind = getattr(torch, dtype, None)
    if not name.startswith("buffer:") or not isinstance(kind, torch.dtype):
        return False
    size = math.prod(shape) * torch.empty(0, dtype=kind).element_size()
    if size > 1 << 26:
        return False
    return hashlib.sha256(bytes(size)).hexdigest() == digest


def _kind(name: str) -> str:
    return "buffer" if name.startswith("buffer:") else "parameter"


def _name(name: str) -> str:
    return name.removeprefix("buffer:")


# --------------------------------------------------------------------------- the stamp
#: ``((name, storage, version), ...), (bit sum, ...)``: parameters, then buffers.
Stamp = tuple[tuple[tuple[str, int, int], ...], tuple[int, ...]]
#: the integer type of each element size, to read a tensor's bits as
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _named_tensors(model: nn.Module) -> list[tuple[str, Tensor]]:
    return [*model.named_parameters(), *(("buffer:" + name, b) for name, b in model.named_buffers())]


def _bit_sum(t: Tensor) -> Tensor:
    """``t``'s bits summed as integers, wrapping: exact and the same in any order (any thread
    count, any device's reduction), and as fast as a sum in the tensor's own type."""
    kind = _BITS.get(t.element_size(), torch.uint8)
    total = torch.int64 if kind is torch.int64 else torch.int32
    return t.reshape(-1).view(kind).sum(dtype=total).to(torch.int64)


def weights_stamp(model: nn.Module) -> Stamp:
    """``model``'s stamp (see the module): cheap, for comparing a model in memory with itself."""
    named = [(name, t.detach()) for name, t in _named_tensors(model)]
    by_device: dict[torch.device, list[Tensor]] = {}
    for _, t in named:
        if t.device.type != "meta":
            by_device.setdefault(t.device, []).append(_bit_sum(t))
    sums = tuple(value for found in by_device.values() for value in torch.stack(found).tolist())
    return tuple((name, t.data_ptr(), version_counter(t)) for name, t in named), sums


def check_unchanged(model: nn.Module, stamp: Stamp, what: str) -> None:
    """A one-line ``ValueError`` unless ``model``'s weights are those of ``stamp`` (taken when a
    graph was built): ``what`` (its score splits, its edges' estimates) would describe another
    model."""
    now = weights_stamp(model)
    if now == stamp:
        return
    where = ""
    names = [row[0] for row in now[0]]
    if names == [row[0] for row in stamp[0]] and len(now[1]) == len(stamp[1]) == len(names):
        changed = [k for k in range(len(names)) if now[0][k] != stamp[0][k] or now[1][k] != stamp[1][k]]
        where = f" ({_kind(names[changed[0]])} {_name(names[changed[0]])} holds other values)" if changed else ""
    raise ValueError(f"the model's weights changed since this graph was built{where}: its {what} would "
                     "describe another model; build the graph again")
