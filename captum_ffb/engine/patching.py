r"""Patching: real patched passes, and the estimates of what patching each node would change.

**Activation patching** (:func:`activation_patching`), the field's ground truth: for each
component ``A`` (an attention sublayer or one of its heads, an FF block) one forward pass of
the real model on the clean input with ``A``'s output replaced, at every position, by its
output in the corrupted run; the effect is ``output(clean) − output(clean, A patched)``.

**Estimates** (:func:`patch_estimates`) for every node ``A`` of a graph (a component at one
position) with clean output ``o_A`` and corrupted output ``o_A^c``: the linear estimators
``⟨G_A, o_A − o_A^c⟩`` with a gradient ``G_A`` of the explained value:

* ``"frozen"``: the frozen model's (every coefficient of the clean run fixed; exact for the
  frozen model);
* ``"atp"``: the real model's at the clean input (attribution patching, Nanda 2023; Syed et
  al. 2023);
* ``"atp+exact"``: ``"atp"``, except at the nodes whose patch moves the stream by more than
  the stream holds, ``κ_A = ‖write_A − write_A^c‖ / ‖stream just after A writes‖ >
  exact_above`` (:data:`EXACT_ABOVE`): there a gradient at the clean point says little (a
  new massive activation, a saturated norm), and the node is patched for real, one forward
  pass each; and a component whose κ exceeds it at some position is patched for real at
  every position too, for its total (patching every position at once is not the sum of
  patching each).

:data:`DEFAULT_ESTIMATOR` names the default, chosen against real activation patching on
held-out IOI prompts (``results/patching``; docs/graphs.md). Every run of the model here is a
:class:`~captum_ffb.engine.passes.ModelPass`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.graph import (
    Covectors,
    GraphData,
    GraphTape,
    StreamRecorder,
    _grad,
    _leaf_input,
    _seq,
    _split,
    part_covectors,
)
from captum_ffb.engine.head import HeadTarget, target_value
from captum_ffb.engine.passes import ModelPass
from captum_ffb.engine.points import Writer
from captum_ffb.vocabulary import check_granularity, component_of

__all__ = ["DEFAULT_ESTIMATOR", "ESTIMATORS", "EXACT_ABOVE", "Patch", "PatchEstimates", "RealWriters",
           "activation_patching", "corrupted_like", "patch_estimates", "patched_values", "real_writers"]

#: The estimators by name.
ESTIMATORS = ("frozen", "atp", "atp+exact")
#: The default estimator (chosen against activation patching on IOI: results/patching).
DEFAULT_ESTIMATOR = "atp+exact"
#: ``"atp+exact"`` patches a node for real where its κ exceeds this (chosen on the selection rows).
EXACT_ABOVE = 0.5


# --------------------------------------------------------------------------- the real model's writers
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


def _read_writers(engine: BoundModel) -> list[Writer]:
    """The writers of the stack whose output is read."""
    return engine.points.of_segment(len(engine.points.n_blocks) - 1)


def real_writers(engine: BoundModel, request: Request, target: HeadTarget, granularity: str,
                 gradients: bool = False) -> RealWriters:
    """One pass of the real model recording every writer's output (and parts), and with
    ``gradients`` the real gradient of the explained value at each (what attribution
    patching multiplies; no parameter gradient is formed)."""
    with ModelPass(engine.model, grad=gradients) as run:
        recorder = StreamRecorder(run)
        if gradients:  # the stream needs a graph: the first block reads a leaf
            run.before(engine.blocks[0], _leaf_input, with_kwargs=True)
        writers = _read_writers(engine)
        for writer in writers:
            recorder.write(writer.module, writer.id)
            if _split(writer, granularity):  # the heads (head and neuron graphs), the neurons
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
        found = RealWriters(value, {k: _seq(v, n) for k, v in recorder.outputs.items()}, parts)
        if gradients:
            names = list(recorder.outputs) + [f"{k}.parts" for k in recorder.parts]
            tensors = list(recorder.outputs.values()) + list(recorder.parts.values())
            grads = _grad(value.sum(), tensors, torch.ones_like(value.sum()))
            for name, g in zip(names, grads):
                g = _seq(g, n) if not name.endswith(".parts") else g.reshape(parts[name[:-6]].shape)
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
            args = tuple(_repeat(a, rows) for a in request.args)
            kwargs = {k: _repeat(v, rows) for k, v in request.kwargs.items()}
            output = run.run(*args, **kwargs)
        values += target_value(engine.head, output, _repeat_target(target, rows)).tolist()
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


def _repeat(value: Any, rows: int) -> Any:
    if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == 1 and rows > 1:
        return value.expand(rows, *value.shape[1:])
    return value


def _repeat_target(target: HeadTarget, rows: int) -> HeadTarget:
    return replace(target, **{f.name: _repeat(getattr(target, f.name), rows) for f in fields(target)})


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


def _patch(writer: Writer, part: int, base: RealWriters) -> Patch:
    """The patch of one writer (or one of its parts) at every position."""
    if part < 0:
        return Patch(writer.module, base.outputs[writer.id])
    parts = base.parts[writer.id]  # (1, n, p, w)
    return Patch(writer.parts, parts[:, :, part], part, parts.shape[2])


# --------------------------------------------------------------------------- activation patching
def activation_patching(engine: BoundModel, request: Request, corrupted: Request, granularity: str,
                        batch_size: int = 16, bar: Any = None) -> tuple[dict[str, float], float, float]:
    """Every component's output patched from the corrupted run, one real pass each:
    ``({component id: effect}, clean value, corrupted value)``."""
    check_granularity(granularity, "patching")
    target = request.target
    base = real_writers(engine, corrupted, target, granularity)
    names: list[str] = []
    patches: list[Patch] = []
    for writer in _read_writers(engine):
        if writer.kind == "attention" and granularity == "head":
            for head in range(writer.n_heads):
                names.append(writer.part(head))
                patches.append(_patch(writer, head, base))
        elif writer.kind in ("attention", "ff"):
            names.append(writer.id)
            patches.append(_patch(writer, -1, base))
    clean = float(real_writers(engine, request, target, "sublayer").value[0])
    values = patched_values(engine, request, target, patches, batch_size, bar)
    return {name: clean - value for name, value in zip(names, values)}, clean, float(base.value[0])


# --------------------------------------------------------------------------- estimates
@dataclass
class PatchEstimates:
    """Every node's estimated patching effect.

    Attributes:
        estimates (dict): estimator name (:data:`ESTIMATORS` and ``"default"``) → ``(N,)``
                    each node's estimate (zero for tokens, the bias and the output).
        kappa (Tensor): ``(N,)`` each node's κ.
        components (dict): estimator name → {component id: effect} for the components it
                    patched for real at every position (``"atp+exact"``).
    """

    estimates: dict[str, Tensor]
    kappa: Tensor
    components: dict[str, dict[str, float]]


def _node_index(data: GraphData) -> dict[tuple[int, str, int, int], int]:
    return {(layer, kind, part, p): k for k, (kind, layer, part, p)
            in enumerate(zip(data.kinds, data.layers, data.heads, data.positions))}


def patch_estimates(engine: BoundModel, request: Request, corrupted: Request, tape: GraphTape, found: Covectors,
                    data: GraphData, granularity: str, exact_above: float = EXACT_ABOVE) -> PatchEstimates:
    """Every node's estimated patching effect under each estimator of :data:`ESTIMATORS`
    (and ``"default"``), each node's κ, and the components ``"atp+exact"`` patched for real."""
    target = request.target
    base = real_writers(engine, corrupted, target, granularity)
    real = real_writers(engine, request, target, granularity, gradients=True)
    size = len(data)
    estimates = {name: torch.zeros(size, dtype=data.values.dtype) for name in ESTIMATORS}
    kappa = torch.zeros(size, dtype=data.values.dtype)
    covector = found.total
    index = _node_index(data)
    n = request.read_mask.shape[1]
    writers = {writer.id: writer for writer in _read_writers(engine)}
    patched: list[int | str] = []  # the nodes (by index) and components (by id) patched for real
    patches: list[Patch] = []
    for k, recorded in enumerate(tape.writers):
        after = tape.stream_after(k)[0].norm(dim=-1).clamp(min=1e-30)  # (n,)
        if recorded.parts is None:
            difference = real.outputs[recorded.key] - base.outputs[recorded.key]
            frozen = covector[recorded.key].reshape(difference.shape)
            per = {"frozen": (frozen * difference).sum(-1)[0],
                   "atp": (real.gradients[recorded.key] * difference).sum(-1)[0]}
            moved = (difference[0].norm(dim=-1) / after)[:, None]  # (n, 1)
            per = {name: values[:, None] for name, values in per.items()}
            kind, parts = recorded.kind, [-1]
        else:
            difference = real.parts[recorded.key] - base.parts[recorded.key]
            frozen = part_covectors(tape, k, covector[recorded.key])
            per = {"frozen": (frozen * difference).sum(-1)[0],
                   "atp": (real.gradients[f"{recorded.key}.parts"] * difference).sum(-1)[0]}
            moved = tape.part_writes(k, difference).norm(dim=-1) / after[:, None]  # (n, p)
            kind = "head" if recorded.kind == "attention" else "neuron"
            parts = list(range(difference.shape[2]))
        per = {name: values.detach().cpu() for name, values in per.items()}
        moved = moved.detach().cpu()
        for column, part in enumerate(parts):
            patch = _patch(writers[recorded.key], part, base)
            for p in range(n):
                node = index.get((recorded.layer, kind, part, p))
                if node is None:
                    continue
                for name, values in per.items():
                    estimates[name][node] = values[p, column]
                kappa[node] = moved[p, column]
                if float(moved[p, column]) > exact_above:
                    patched.append(node)
                    patches.append(replace(patch, position=p))
            if float(moved[:, column].max()) > exact_above:
                patched.append(component_of(kind, recorded.layer, part))
                patches.append(patch)
    estimates["atp+exact"] = estimates["atp"].clone()
    exact: dict[str, float] = {}
    if patches:
        clean = float(real.value[0])
        for what, value in zip(patched, patched_values(engine, request, target, patches)):
            if isinstance(what, str):
                exact[what] = clean - value
            else:
                estimates["atp+exact"][what] = clean - value
    estimates["default"] = estimates[DEFAULT_ESTIMATOR].clone()
    whole = {"atp+exact": exact}
    if DEFAULT_ESTIMATOR in whole:
        whole["default"] = dict(whole[DEFAULT_ESTIMATOR])
    return PatchEstimates({name: value.detach() for name, value in estimates.items()}, kappa, whole)
