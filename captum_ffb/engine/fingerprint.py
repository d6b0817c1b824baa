r"""What a model's numbers are, in a few bytes: the fingerprint that binds a graph (and any
result a later call computes from the model again) to the weights it was built on.

Per tensor of the model, its parameters then its buffers (rotary ``inv_freq`` tables, position
ids, fixed masks): its name, shape, dtype and the SHA-256 of its bytes. The digest sees every
bit, in order: an edited weight, two weights swapped, a NaN where a number was, a buffer
changed. It is the same for the same weights on any device, in any process (the bytes are),
so a graph file keeps it and a model loaded later is compared with it
(:func:`fingerprint_difference`). The cost is one read of the weights, hashed on two threads
where they are many: 0.16 s for SmolLM2-135M in float32 on two CPU cores.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["Fingerprint", "check_unchanged", "fingerprint_difference", "weights_fingerprint"]

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
    named = [*model.named_parameters(), *(("buffer:" + name, b) for name, b in model.named_buffers())]
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


def check_unchanged(model: nn.Module, fingerprint: Fingerprint, what: str) -> None:
    """A one-line ``ValueError`` unless ``model``'s weights are those of ``fingerprint`` (a
    graph's): ``what`` (its score splits, its edges' estimates) would describe another model."""
    difference = fingerprint_difference(fingerprint, weights_fingerprint(model))
    if difference is not None:
        raise ValueError(f"the model's weights changed since this graph was built ({difference}): its {what} "
                         "would describe another model; build the graph again")
