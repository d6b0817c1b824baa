"""The real model's passes: every writer's output recorded (:func:`real_writers`), and
patched passes (:func:`patched_values`), each edit a :class:`Patch` of a module's output or of
one part of its input, every row of a batch the input with its own patch. Every run of the
model here is a :class:`~captum_ffb.engine.passes.ModelPass`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.engine.autograd import leaf_input, sequence_shaped, vjp
from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.head import HeadTarget, target_value
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.points import Writer
from captum_ffb.engine.tape import StreamRecorder, splits_parts

__all__ = ["Patch", "RealWriters", "corrupted_like", "patched_values", "real_writers", "repeat_rows", "repeat_target",
           "writer_patch"]


@dataclass
class RealWriters:
    """The writers' outputs (and parts) in a pass of the real model, with the real gradient of
    the explained value at them where asked.

    Attributes:
        value (Tensor): ``(B,)`` the explained value.
        outputs (dict): writer id → ``(B, n, d)`` its output.
        parts (dict): writer id → ``(B, n, p, w)`` its parts (granularities finer than sublayers).
        gradients (dict): writer id → the real gradient at its output (and ``"<id>.parts"``
                    at its parts), when asked.
    """

    value: Tensor
    outputs: dict[str, Tensor]
    parts: dict[str, Tensor]
    gradients: dict[str, Tensor] = field(default_factory=dict)



def real_writers(engine: BoundModel, request: Request, target: HeadTarget, granularity: str,
                 gradients: bool = False) -> RealWriters:
    """One pass of the real model recording every writer's output (and parts), and with
    ``gradients`` the real gradient of the explained value at each (what attribution
    patching multiplies; no parameter gradient is formed)."""
    with ModelPass(engine.model, grad=gradients) as run:
        recorder = StreamRecorder(run)
        if gradients:  # the stream needs a graph: the first block reads a leaf
            run.before(engine.blocks[0], leaf_input, with_kwargs=True)
        writers = engine.points.read_stack()
        for writer in writers:
            recorder.write(writer.module, writer.id)
            if splits_parts(writer, granularity):  # the heads (head and neuron graphs), the neurons
                recorder.part(writer.parts, writer.id)
        output = run.run(*request.args, **request.kwargs)
        with torch.set_grad_enabled(gradients):
            value = target_value(engine.head, output, target)
        batch, n = request.read_mask.shape
        parts = {}
        for writer in writers:
            raw = recorder.parts.get(writer.id)
            if raw is not None:
                part = raw.reshape(batch, -1, raw.shape[-1]) if raw.dim() == 2 else raw
                split = writer.n_heads if writer.kind == "attention" else part.shape[-1]
                parts[writer.id] = part.reshape(batch, part.shape[1], split, -1)
        found = RealWriters(value, {k: sequence_shaped(v, n) for k, v in recorder.outputs.items()}, parts)
        if gradients:
            names = list(recorder.outputs) + [f"{k}.parts" for k in recorder.parts]
            tensors = list(recorder.outputs.values()) + list(recorder.parts.values())
            grads = vjp(value.sum(), tensors, torch.ones_like(value.sum()))
            for name, g in zip(names, grads):
                g = sequence_shaped(g, n) if not name.endswith(".parts") else g.reshape(parts[name[:-6]].shape)
                found.gradients[name] = g.detach()
        found.outputs = {k: v.detach() for k, v in found.outputs.items()}
        found.parts = {k: v.detach() for k, v in found.parts.items()}
        found.value = value.detach()
    return found


# --------------------------------------------------------------------------- patched passes
@dataclass
class Patch:
    """One edit of a patched pass: a module's output (or one part of its input) replaced by
    its value in the corrupted run, at every position or at one.

    Attributes:
        module (nn.Module): the module patched.
        value (Tensor): ``(1, n, w)`` the replacement (its output, or the part's slice).
        part (int): ``-1``: the module's output; ``≥ 0``: that part of its input (a head's
                    slice of the output projection's input, a neuron of the down projection's).
        n_parts (int): how many parts its input splits into.
        position (int, optional): the position patched (``None``: all).
    """

    module: nn.Module
    value: Tensor
    part: int = -1
    n_parts: int = 0
    position: int | None = None


def patched_values(engine: BoundModel, request: Request, target: HeadTarget, patches: Sequence[Patch],
                   batch_size: int = 16, bar: Any = None) -> list[float]:
    """The explained value in one real forward pass per patch, ``batch_size`` patches to a
    batch (each row of the batch the input with its own patch)."""
    n = request.read_mask.shape[1]
    values: list[float] = []
    for start in range(0, len(patches), batch_size):
        chunk = list(patches[start:start + batch_size])
        rows = len(chunk)
        with ModelPass(engine.model) as run:
            _install(run, chunk, rows, n)
            args = tuple(repeat_rows(a, rows) for a in request.args)
            kwargs = {k: repeat_rows(v, rows) for k, v in request.kwargs.items()}
            output = run.run(*args, **kwargs)
        values += target_value(engine.head, output, repeat_target(target, rows)).tolist()
        if bar is not None:
            bar.update(rows)
    return values


def _install(run: ModelPass, chunk: list[Patch], rows: int, n: int) -> None:
    """The patches of one batch, each on its own row, installed on the pass."""
    groups: dict[tuple[int, bool], list[tuple[int, Patch]]] = {}
    for row, patch in enumerate(chunk):
        groups.setdefault((id(patch.module), patch.part >= 0), []).append((row, patch))
    for (_, before), edits in groups.items():
        module = edits[0][1].module
        if before:
            def pre(mod: nn.Module, args: Any, edits: list[tuple[int, Patch]] = edits) -> Any:
                x = args[0].clone(memory_format=torch.contiguous_format)
                view = x.reshape(rows, n, edits[0][1].n_parts, -1)
                for row, patch in edits:
                    where = slice(None) if patch.position is None else patch.position
                    view[row, where, patch.part] = patch.value.reshape(n, -1)[where].to(x.dtype)
                return (x, *args[1:])
            run.before(module, pre)
        else:
            def post(mod: nn.Module, args: Any, output: Any, edits: list[tuple[int, Patch]] = edits) -> Any:
                kept = output[0] if isinstance(output, tuple) else output
                new = kept.clone(memory_format=torch.contiguous_format)
                view = new.reshape(rows, n, -1)
                for row, patch in edits:
                    where = slice(None) if patch.position is None else patch.position
                    view[row, where] = patch.value.reshape(n, -1)[where].to(new.dtype)
                return (new, *output[1:]) if isinstance(output, tuple) else new
            run.after(module, post)


def repeat_rows(value: Any, rows: int) -> Any:
    """``value`` with its batch of one repeated to ``rows`` rows (a tensor; anything else as it is)."""
    if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == 1 and rows > 1:
        return value.expand(rows, *value.shape[1:])
    return value


def repeat_target(target: HeadTarget, rows: int) -> HeadTarget:
    """``target`` for a batch of ``rows`` copies of one input."""
    return replace(target, **{f.name: repeat_rows(getattr(target, f.name), rows) for f in fields(target)})


def corrupted_like(corrupted_inputs: Any, request: Request, name: str = "corrupted_inputs") -> Tensor:
    """``corrupted_inputs`` as a ``(1, n)`` tensor of the request's inputs' shape (a corrupted
    prompt of the same length), or a ``ValueError`` naming the parameter."""
    device = request.args[0].device
    corrupted = corrupted_inputs if isinstance(corrupted_inputs, Tensor) else \
        torch.as_tensor(corrupted_inputs, device=device)
    corrupted = corrupted[None] if corrupted.dim() == 1 else corrupted
    if tuple(corrupted.shape) != tuple(request.args[0].shape):
        raise ValueError(f"{name} must have the inputs' shape {tuple(request.args[0].shape)} (a corrupted "
                         f"prompt of the same length), got {tuple(corrupted.shape)}")
    return corrupted.to(device)


def writer_patch(writer: Writer, part: int, base: RealWriters) -> Patch:
    """The patch of one writer (or one of its parts) at every position."""
    if part < 0:
        return Patch(writer.module, base.outputs[writer.id])
    parts = base.parts[writer.id]  # (1, n, p, w)
    return Patch(writer.parts, parts[:, :, part], part, parts.shape[2])
