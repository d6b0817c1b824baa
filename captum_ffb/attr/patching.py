r"""Patching estimates: what patching each node's output from a corrupted run would change,
from one clean and one corrupted pass, plus a real patched pass for the few nodes where a
gradient cannot be trusted.

For a node ``A`` (a component at one position) with clean output ``o_A`` and output
``o_A^b`` in the baseline (corrupted) run, the linear estimators are ``⟨G_A, o_A − o_A^b⟩``
with a gradient ``G_A`` of the explained value:

* ``"frozen"``: the frozen model's (every coefficient of the clean run fixed; exact for the
  frozen model);
* ``"atp"``: the real model's at the clean input (attribution patching, Nanda 2023; Syed et
  al. 2023);
* ``"atp+exact"``: ``"atp"``, except at the nodes whose patch moves the stream by more than
  the stream holds, ``κ_A = ‖write_A − write_A^b‖ / ‖stream just after A writes‖ >
  exact_above`` (:data:`EXACT_ABOVE`): there a gradient at the clean point says little
  (a new massive activation, a saturated norm), and the node is patched for real, one
  forward pass each; and a component whose κ exceeds it at some position is patched for
  real at every position too, for its total (:meth:`~captum_ffb.attr.AttributionGraph.component_estimates`:
  patching every position at once is not the sum of patching each).

:data:`DEFAULT_ESTIMATOR` names the default, chosen against real activation patching on
held-out IOI prompts (``results/patching``; docs/graphs.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.engine.passes import ModelPass

__all__ = ["DEFAULT_ESTIMATOR", "ESTIMATORS", "EXACT_ABOVE", "Patch", "patch_estimates", "patched_values"]

#: The estimators by name.
ESTIMATORS = ("frozen", "atp", "atp+exact")
#: The default estimator (chosen against activation patching on IOI: results/patching).
DEFAULT_ESTIMATOR = "atp+exact"
#: ``"atp+exact"`` patches a node for real where its κ exceeds this (chosen on the selection rows).
EXACT_ABOVE = 0.5


@dataclass
class Patch:
    """One edit of a patched pass: a module's output (or one part of its input) replaced by
    its value in the baseline run, at every position or at one.

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


def patched_values(engine: Any, request: Any, target: Any, patches: Sequence[Patch], batch_size: int = 16,
                   bar: Any = None) -> list[float]:
    """The explained value in one real forward pass per patch, ``batch_size`` patches to a
    batch (each row of the batch the input with its own patch)."""
    from captum_ffb.engine.head import target_value

    n = request.read_mask.shape[1]
    values: list[float] = []
    for start in range(0, len(patches), batch_size):
        chunk = list(patches[start:start + batch_size])
        rows = len(chunk)
        with ModelPass(engine.model) as run:
            _register(run, chunk, rows, n)
            args = tuple(_repeat(a, rows) for a in request.args)
            kwargs = {k: _repeat(v, rows) for k, v in request.kwargs.items()}
            output = run.run(*args, **kwargs)
        values += target_value(engine.head, output, _repeat_target(target, rows)).tolist()
        if bar is not None:
            bar.update(rows)
    return values


def _register(run: ModelPass, chunk: list[Patch], rows: int, n: int) -> None:
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


def _repeat_target(target: Any, rows: int) -> Any:
    return replace(target, **{f.name: _repeat(getattr(target, f.name), rows) for f in fields(target)})


def patch_estimates(nd: Any, request: Any, target: Any, tape: Any, found: Any, data: Any, baseline_inputs: Any,
                    granularity: str, exact_above: float = EXACT_ABOVE
                    ) -> tuple[dict[str, Tensor], Tensor, dict[str, dict[str, float]]]:
    """Every node's estimated patching effect under each estimator of :data:`ESTIMATORS`
    (and ``"default"``), each node's κ, and the components ``"atp+exact"`` patched for real.

    Returns:
        tuple: ``({estimator: (N,)}, (N,) κ, {estimator: {component id: effect}})``; the
        node values are zero for tokens, the bias and the output.
    """
    from captum_ffb.engine.graph import node_id, part_covectors, real_writers

    engine = nd.engine
    baseline = baseline_like(baseline_inputs, request)
    corrupt = nd._request(baseline, request.args[1:] or None, request.kwargs)
    base = real_writers(engine, corrupt, target, granularity)
    real = real_writers(engine, request, target, granularity, gradients=True)
    size = len(data)
    estimates = {name: torch.zeros(size, dtype=data.values.dtype) for name in ESTIMATORS}
    kappa = torch.zeros(size, dtype=data.values.dtype)
    covector = found.total
    index = _node_index(data)
    n = request.read_mask.shape[1]
    patched: list[int | str] = []  # the nodes (by index) and components (by id) patched for real
    patches: list[Patch] = []
    for k, writer in enumerate(tape.writers):
        after = tape.stream_after(k)[0].norm(dim=-1).clamp(min=1e-30)  # (n,)
        if writer.parts is None:
            difference = real.outputs[writer.key] - base.outputs[writer.key]
            frozen = covector[writer.key].reshape(difference.shape)
            per = {"frozen": (frozen * difference).sum(-1)[0], "atp": (real.gradients[writer.key] * difference).sum(-1)[0]}
            moved = (difference[0].norm(dim=-1) / after)[:, None]  # (n, 1)
            per = {name: values[:, None] for name, values in per.items()}
            kind, parts = writer.kind, [-1]
        else:
            difference = real.parts[writer.key] - base.parts[writer.key]
            frozen = part_covectors(tape, k, covector[writer.key])
            per = {"frozen": (frozen * difference).sum(-1)[0],
                   "atp": (real.gradients[f"{writer.key}.parts"] * difference).sum(-1)[0]}
            moved = tape.part_writes(k, difference).norm(dim=-1) / after[:, None]  # (n, p)
            kind = "head" if writer.kind == "attention" else "neuron"
            parts = list(range(difference.shape[2]))
        for column, part in enumerate(parts):
            patch = _patch(engine, writer, part, base)
            for p in range(n):
                node = index.get((writer.layer, kind, part, p))
                if node is None:
                    continue
                for name, values in per.items():
                    estimates[name][node] = values[p, column]
                kappa[node] = moved[p, column]
                if float(moved[p, column]) > exact_above:
                    patched.append(node)
                    patches.append(replace(patch, position=p))
            if float(moved[:, column].max()) > exact_above:
                patched.append(node_id(kind, writer.layer, part, 0).rsplit(".", 1)[0])
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
    return {name: value.detach() for name, value in estimates.items()}, kappa, whole


def baseline_like(baseline_inputs: Any, request: Any) -> Tensor:
    """``baseline_inputs`` as a ``(1, n)`` tensor of the request's inputs' shape (a corrupted
    prompt of the same length), or a ``ValueError`` naming the parameter."""
    baseline = torch.as_tensor(baseline_inputs)
    baseline = baseline[None] if baseline.dim() == 1 else baseline
    if tuple(baseline.shape) != tuple(request.args[0].shape):
        raise ValueError(f"baseline_inputs must have the inputs' shape {tuple(request.args[0].shape)} (a corrupted "
                         f"prompt of the same length), got {tuple(baseline.shape)}")
    return baseline


def writer_module(engine: Any, layer: int, kind: str, part: bool = False) -> nn.Module:
    """The module whose output is a writer's write (``part``: whose input holds its parts: the
    output projection of an attention, the down projection of an FF)."""
    from captum_ffb.engine.block import watched_modules

    block = engine.blocks[layer]
    roles = watched_modules(block, engine.family.for_block(block))
    if part:
        return roles["attn_out"] if kind in ("attention", "head") else roles["ff_out"]
    return (roles.get("attention_post_norm") or roles["attn_out"]) if kind == "attention" else roles["ff"]


def _patch(engine: Any, writer: Any, part: int, base: Any) -> Patch:
    """The patch of one writer (or one of its parts) at every position."""
    if part < 0:
        return Patch(writer_module(engine, writer.layer, writer.kind), base.outputs[writer.key])
    parts = base.parts[writer.key]  # (1, n, p, w)
    return Patch(writer_module(engine, writer.layer, writer.kind, part=True), parts[:, :, part], part, parts.shape[2])


def _node_index(data: Any) -> dict[tuple[int, str, int, int], int]:
    return {(layer, kind, part, p): k for k, (kind, layer, part, p)
            in enumerate(zip(data.kinds, data.layers, data.heads, data.positions))}

