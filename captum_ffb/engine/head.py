r"""The head: what follows the last block (the final norm, a pooler, the output layer, a
logit scale or soft-capping), bound to a model, and the explained value it reads.

:func:`resolve_head` binds a model's registered :class:`HeadSpec`; a read-out
(:mod:`captum_ffb.explained.readouts`) makes it concrete as a :class:`HeadTarget` (output rows,
coefficients, the position read or a pooling). :func:`head_forward` carries the last
block's decomposition through the head's rules (the forward route); :func:`target_value`
reads the explained value from the model's own output, and :func:`linearised_target_value`
with its frozen-model gradient (the backward route). This is the one place the head is
computed, for every model shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.architectures.activations import ACTIVATIONS
from captum_ffb.architectures.heads import HeadActivation, HeadNorm, HeadSpec, get_head, task_of
from captum_ffb.architectures.spec import ArchitectureSpec, Projection
from captum_ffb.core.decomposition import Decomposition
from captum_ffb.engine.block import (
    config_of,
    has_path,
    norm_parameters,
    projection_weights,
    resolve,
)
from captum_ffb.engine.frozen import ACTIVE, frozen_value
from captum_ffb.engine.model import base_model_of, final_norm_of


def resolve_in(model: nn.Module, path: str) -> Any:
    """``path`` below the task model, else below its base model; ``None`` when absent."""
    for root in (model, base_model_of(model)):
        if has_path(root, path):
            return resolve(root, path)
    return None


@dataclass
class ResolvedHead:
    """A task model's head bound to its modules.

    Attributes:
        task (str): ``"causal_lm"``, ``"sequence_classification"`` or ``"base"``.
        spec (HeadSpec): the declarative head.
        final_norm (nn.Module, optional): the final norm, when applied.
        steps (list): ``("linear", module, projection)``, ``("activation", fn, None)`` and
                    ``("norm", module, None)``.
        output (nn.Module, optional): the output layer (``None`` for a base model).
        softcap (float, optional): the final ``c·tanh(logit / c)``.
        scale (float, optional): the factor on the logits before any soft-capping.
        logits_bias (Tensor, optional): ``(units,)`` added to every row of logits after the
                    output layer (BART's and Marian's ``final_logits_bias``).
    """

    task: str
    spec: HeadSpec
    final_norm: nn.Module | None
    steps: list[tuple[str, Any, Projection | None]] = field(default_factory=list)
    output: nn.Module | None = None
    softcap: float | None = None
    scale: float | None = None
    logits_bias: Tensor | None = None

    def modules(self) -> dict[str, nn.Module]:
        """Role → module whose input and output the forward route reads."""
        out: dict[str, nn.Module] = {}
        if self.final_norm is not None:
            out["final_norm"] = self.final_norm
        for position, (kind, item, _) in enumerate(self.steps):
            if kind in ("linear", "norm"):
                out[f"head:{position}"] = item
        if self.output is not None:
            out["output"] = self.output
        return out

    def linearised_steps(self) -> list[tuple[str, Any]]:
        """The steps with the output layer last, for ``linearise``."""
        steps = [(kind, item) for kind, item, _ in self.steps]
        if self.output is not None:
            steps.append(("linear", self.output))
        return steps


def resolve_head(model: nn.Module, spec: ArchitectureSpec) -> ResolvedHead:
    """The head of ``model`` (a task model or a base model) from the registered heads."""
    config = config_of(model)
    task = task_of(model)
    head = get_head(config.model_type, task)
    reason = head.unsupported(config) if head.unsupported is not None else None
    if reason:
        raise ValueError(f"{type(model).__name__}: {reason}")
    norm = final_norm_of(model, spec) if head.final_norm else None
    steps: list[tuple[str, Any, Projection | None]] = []
    for layer in head.layers:
        if isinstance(layer, Projection):
            module = resolve_in(model, layer.path)
            if module is None:
                continue  # a layer this configuration does not have (OPT's project_out)
            steps.append(("linear", module, layer))
        elif isinstance(layer, HeadNorm):
            steps.append(("norm", resolve_in(model, layer.path), None))
        elif isinstance(layer, HeadActivation):
            fn = resolve_in(model, layer.path) if layer.path else ACTIVATIONS.get(layer.function or "")
            if fn is None:
                raise ValueError(f"cannot find the head activation {layer.path or layer.function!r}")
            steps.append(("activation", fn, None))
    output = None
    if task != "base":
        output = model.get_output_embeddings() if head.output is None else resolve_in(model, head.output)
        if not isinstance(output, nn.Linear):
            raise ValueError(f"the output layer of {type(model).__name__} is not a linear layer")
    softcap = getattr(config, head.softcap, None) if head.softcap else None
    scale = None if head.scale is None else float(head.scale(config))
    logits_bias = resolve_in(model, head.logits_bias) if head.logits_bias else None
    return ResolvedHead(task, head, norm, steps, output, softcap, scale,
                        logits_bias if isinstance(logits_bias, Tensor) else None)


def element_wise_rule(rules: Mapping[str, Callable]) -> Callable:
    """The rule for a head's element-wise activations: the model's ``"activation"`` rule, or
    the default one for families whose feed-forward is gated."""
    from captum_ffb.rules import IGActivation

    return rules.get("activation") or IGActivation()


def _rows_at(tensor: Tensor, positions: Tensor) -> Tensor:
    """``tensor[b, positions[b]]`` for a ``(B, n, …)`` tensor: ``(B, …)``, or ``(B, K, …)`` for
    positions ``(B, K)``."""
    if positions.dim() == 2:
        return tensor[torch.arange(tensor.shape[0], device=tensor.device)[:, None], positions.to(tensor.device)]
    index = positions.reshape(-1, *([1] * (tensor.dim() - 1))).expand(-1, 1, *tensor.shape[2:])
    return tensor.gather(1, index).squeeze(1)


def _at(real: Tensor, positions: Tensor | None, n: int) -> Tensor:
    """A head module's real tensor at the read position: ``(B, w)``."""
    if real.dim() == 3 and positions is not None and real.shape[1] == n:
        return _rows_at(real, positions)
    return real.reshape(real.shape[0], -1) if real.dim() == 2 else real[:, -1]


@dataclass
class HeadTarget:
    """What the head explains, per example: ``Σ_k coef_k · out_k`` at a position or pooling.

    Attributes:
        weights (Tensor): ``(B, K, w)`` output rows (or a direction).
        biases (Tensor): ``(B, K)``.
        coefficients (Tensor): ``(B, K)``, e.g. ``(1, −1)`` for a contrast.
        indices (Tensor, optional): ``(B, K)`` the output units, to read real logits.
        positions (Tensor, optional): ``(B,)`` the position read (``None``: pooled).
        pooling (Tensor, optional): ``(B, n)`` weights over positions (mean pooling).
        mix (Tensor, optional): ``(B, K, V)`` each term as a mixture of the output's units
                    (its logit ``Σ_v mix[k, v] · logit_v``; a log-probability's normaliser);
                    ``indices`` then names the explained units only, and ``positions`` may
                    be ``(B, K)``, a position per term.
        offset (float): a constant the read-out adds, which the bias player holds (a
                    log-probability's value at uniform logits).
    """

    weights: Tensor
    biases: Tensor
    coefficients: Tensor
    indices: Tensor | None = None
    positions: Tensor | None = None
    pooling: Tensor | None = None
    mix: Tensor | None = None
    offset: float = 0.0


def _read_units(logits: Tensor, target: HeadTarget) -> Tensor:
    """``(B, K)`` the target's terms in its logits: ``(B, V)`` at its position, or ``(B, K, V)``
    where each term has a position of its own; its units, or its mixtures of them."""
    if target.mix is not None:
        mix = target.mix.to(device=logits.device, dtype=logits.dtype)
        return torch.einsum("bkv,bkv->bk" if logits.dim() == 3 else "bv,bkv->bk", logits, mix)
    return logits.gather(1, target.indices)


def _read_rows(logits: Tensor, target: HeadTarget) -> Tensor:
    """A causal LM's ``(B, n, V)`` logits at the target's position ``(B, V)``, or at each
    term's position ``(B, K, V)`` (``positions`` of shape ``(B, K)``)."""
    if logits.dim() != 3:
        return logits
    positions = target.positions.to(logits.device)
    if positions.dim() == 2:
        rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
        return logits[rows, positions]
    return logits.gather(1, positions.reshape(-1, 1, 1).expand(-1, 1, logits.shape[-1]))[:, 0]


def head_forward(
    last: Decomposition,
    head: ResolvedHead,
    target: HeadTarget,
    rules: Mapping[str, Callable],
    real: Mapping[tuple[str, str], Tensor],
    spec: ArchitectureSpec,
    config: Any,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    r"""Contributions ``(B, P)`` and bias ``(B,)`` of the target, from the decomposition of
    the last block's output through the head's rules.

    Args:
        last (Decomposition): the last block's output over the players.
        head (ResolvedHead): the head.
        target (HeadTarget): what to explain.
        rules (Mapping): role → rule.
        real (Mapping): the captured ``(role, "input" | "output")`` tensors of the head.
        spec (ArchitectureSpec): the family's spec (norm kind and parameters).
        config (Any): the model's config.
        dtype (torch.dtype): the decomposition's precision.
    """
    n = last.n_out
    if target.positions is not None and target.positions.dim() == 2 and head.steps:
        raise ValueError("terms read at several positions (an answer's log-probability) need a head without "
                         "layers of its own between the final norm and the output layer")
    dec = _head_input(last, head, target, rules, real, spec, config, dtype)
    dec = _head_steps(dec, head, target, rules, real, spec, config, dtype, n)
    terms, bias = _target_logits(dec, head, target, rules, real, dtype, n)
    coefficients = target.coefficients.to(dtype)
    contributions = torch.einsum("bkp,bk->bp", terms, coefficients)
    return contributions, (bias * coefficients).sum(-1) + target.offset


def _cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    return t.detach().to(dtype)


def _head_input(last: Decomposition, head: ResolvedHead, target: HeadTarget,
                rules: Mapping[str, Callable], real: Mapping[tuple[str, str], Tensor],
                spec: ArchitectureSpec, config: Any, dtype: torch.dtype) -> Decomposition:
    """The last block's decomposition at the read position (or pooled), through the final norm
    when the head applies it: ``(B, 1, P, d)`` terms."""

    def final_norm(dec: Decomposition, real_input: Tensor) -> Decomposition:
        weight, bias, eps = norm_parameters(head.final_norm, spec, config)
        return rules["norm"](dec, _cast(real_input, dtype),
                             None if weight is None else _cast(weight, dtype),
                             None if bias is None else _cast(bias, dtype), eps)

    if target.positions is not None:
        pos = target.positions

        def rows(tensor: Tensor) -> Tensor:  # (B, 1, …) at the read position, (B, K, …) at each term's
            found = _rows_at(tensor, pos)
            return found if pos.dim() == 2 else found[:, None]

        dec = Decomposition(rows(last.terms), rows(last.bias), None, last.player_mask)
        if head.final_norm is not None:
            dec = final_norm(dec, rows(real[("final_norm", "input")]))
        return dec
    dec = last
    if head.final_norm is not None:
        dec = final_norm(dec, real[("final_norm", "input")])
    weights = target.pooling.to(dtype)
    return Decomposition(torch.einsum("bi,bipd->bpd", weights, dec.terms)[:, None],
                         torch.einsum("bi,bid->bd", weights, dec.bias)[:, None],
                         None, last.player_mask)


def _head_steps(dec: Decomposition, head: ResolvedHead, target: HeadTarget,
                rules: Mapping[str, Callable], real: Mapping[tuple[str, str], Tensor],
                spec: ArchitectureSpec, config: Any, dtype: torch.dtype, n: int) -> Decomposition:
    """The decomposition through the head's steps (linear layers, norms, activations), each
    activation at the real output of the step before it."""
    previous: Tensor | None = None
    for position, (kind, item, projection) in enumerate(head.steps):
        if kind == "linear":
            w, c = projection_weights(item, projection, config)
            dec = rules["linear"](dec, _cast(w, dtype), None if c is None else _cast(c, dtype))
            previous = _at(_cast(real[(f"head:{position}", "output")], dtype), target.positions, n)
        elif kind == "norm":
            weight, bias, eps = norm_parameters(item, spec, config)
            real_input = _at(_cast(real[(f"head:{position}", "input")], dtype), target.positions, n)
            dec = rules["norm"](dec, real_input[:, None],
                                None if weight is None else _cast(weight, dtype),
                                None if bias is None else _cast(bias, dtype), eps)
            previous = _at(_cast(real[(f"head:{position}", "output")], dtype), target.positions, n)
        else:
            dec = element_wise_rule(rules)(dec, item, previous[:, None])
    return dec


def _target_logits(dec: Decomposition, head: ResolvedHead, target: HeadTarget,
                   rules: Mapping[str, Callable], real: Mapping[tuple[str, str], Tensor],
                   dtype: torch.dtype, n: int) -> tuple[Tensor, Tensor]:
    """Terms ``(B, K, P)`` and bias ``(B, K)`` of the target's logits: the output rows, the
    logit scale, then any soft-capping through the activation rule."""
    weights = target.weights.to(dtype)
    if dec.terms.shape[1] > 1:  # each term read at a position of its own
        terms = torch.einsum("bkpd,bkd->bkp", dec.terms, weights)
        bias = torch.einsum("bkd,bkd->bk", dec.bias, weights) + target.biases.to(dtype)
    else:
        terms = torch.einsum("bpd,bkd->bkp", dec.terms[:, 0], weights)
        bias = torch.einsum("bd,bkd->bk", dec.bias[:, 0], weights) + target.biases.to(dtype)
    factor = 1.0 if head.scale is None else head.scale
    terms, bias = terms * factor, bias * factor
    if head.softcap is None:
        return terms, bias
    cap = float(head.softcap)
    pre = (terms.sum(-1) + bias).detach()  # the decomposition's own pre-cap logits
    if target.indices is not None and head.output is not None and ("output", "output") in real:
        pre = factor * _at(_cast(real[("output", "output")], dtype), target.positions, n).gather(1, target.indices)
    scalar = Decomposition(terms.transpose(1, 2)[:, None], bias[:, None], None)  # (B, 1, P, K)

    def softcap(t: Tensor) -> Tensor:
        return cap * torch.tanh(t / cap)

    scalar = element_wise_rule(rules)(scalar, softcap, pre[:, None])
    return scalar.terms[:, 0].transpose(1, 2), scalar.bias[:, 0]


# --------------------------------------------------------------------------- the value read
def output_logits(outputs: Any) -> Tensor:
    """The logits of a model's outputs (``.logits``, or the first element, or the tensor)."""
    logits = getattr(outputs, "logits", None)
    if logits is None:
        logits = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
    return logits


def output_hidden_states(outputs: Any) -> Tensor:
    """The last hidden state of a model's outputs (``.last_hidden_state``, or the first
    element, or the tensor)."""
    hidden = getattr(outputs, "last_hidden_state", None)
    if hidden is None:
        hidden = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
    return hidden


def _pool(hidden: Tensor, target: HeadTarget) -> Tensor:
    if target.positions is not None:
        return hidden.gather(1, target.positions.reshape(-1, 1, 1).expand(-1, 1, hidden.shape[-1]))[:, 0]
    return torch.einsum("bi,bid->bd", target.pooling.to(hidden.dtype), hidden)


def target_value(head: ResolvedHead, output: Any, target: HeadTarget, dtype: torch.dtype = torch.float32,
                 hidden: Tensor | None = None) -> Tensor:
    """``(B,)`` the value of a resolved target (:meth:`ReadOut.head_target`) in the model's own
    output: ``Σ_k coef_k · logit_k`` at its position, or a base model's direction on its pooled
    hidden states."""
    if head.task == "base":
        hidden = output_hidden_states(output) if hidden is None else hidden
        pooled = _pool(hidden.to(dtype), target)
        return (pooled[:, None] * target.weights).sum(-1)[:, 0] + target.biases[:, 0]
    logits = _read_rows(output_logits(output).to(dtype), target)
    return (_read_units(logits, target) * target.coefficients).sum(-1) + target.offset


def linearised_target_value(head: ResolvedHead, output_layer: Tensor, target: HeadTarget, rules: Any) -> Tensor:
    """``Σ_k coef_k · logit_k`` read from the output layer's output with its graph (the
    one-backward-pass route); the head's logit scale applies first, then a final
    soft-capping passes through the activation rule's frozen slope."""
    chosen = _read_units(_read_rows(output_layer, target), target)
    if head.scale is not None:
        chosen = chosen * head.scale
    if head.softcap is not None:
        cap = float(head.softcap)

        def softcap(t: Tensor) -> Tensor:
            return cap * torch.tanh(t / cap)

        slope = frozen_value("softcap", head, lambda: element_wise_rule(rules).slope(
            softcap, chosen.detach().float())).to(chosen.dtype)
        store = ACTIVE.get()
        if store is not None and store.replaying:  # the recorded frozen map, linear in the logit
            chosen = chosen * slope
        else:
            chosen = softcap(chosen.detach()) + (chosen - chosen.detach()) * slope
    return (chosen * target.coefficients.to(chosen.dtype)).sum(-1) + target.offset
