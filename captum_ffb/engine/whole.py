"""The whole model: players, the forward propagation through every block, and the head.

The players are the first block's input vectors (one per position, or groups of positions)
plus the bias player. Block after block, each chain starts from the previous block's output
decomposition (:func:`propagate`); after the last block the head's rules turn the
decomposition into one scalar per player (:func:`head_forward`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from captum_ffb.architectures.activations import ACTIVATIONS
from captum_ffb.architectures.heads import HeadActivation, HeadNorm, HeadSpec, get_head, task_of
from captum_ffb.architectures.spec import ArchitectureSpec, Projection
from captum_ffb.decomposition import Decomposition, TokenwiseDecomposition, stack_rows
from captum_ffb.engine.block import (
    Block,
    config_of,
    has_path,
    norm_parameters,
    projection_weights,
    resolve,
)
from captum_ffb.engine.chains import Chain
from captum_ffb.engine.layers import iter_scopes, row_chunks
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
    """

    task: str
    spec: HeadSpec
    final_norm: nn.Module | None
    steps: list[tuple[str, Any, Projection | None]] = field(default_factory=list)
    output: nn.Module | None = None
    softcap: float | None = None
    scale: float | None = None

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
    return ResolvedHead(task, head, norm, steps, output, softcap, scale)


def element_wise_rule(rules: Mapping[str, Callable]) -> Callable:
    """The rule for a head's element-wise activations: the model's ``"activation"`` rule, or
    the default one for families whose feed-forward is gated."""
    from captum_ffb.rules import IGActivation

    return rules.get("activation") or IGActivation()


# --------------------------------------------------------------------------- players
def player_start(x: Tensor, groups: Tensor, players: Sequence[int], token_mask: Tensor | None,
                 reference: Tensor | None = None, shared: Tensor | None = None) -> Decomposition:
    r"""The decomposition of the first block's input over the chosen players.

    ``F[b, i, k] = x[b, i] − r[b, i]`` if position ``i`` belongs to player ``players[k]``,
    else 0, and ``b[b, i] = r[b, i]`` (the reference, owed to no player; zero by default).
    With ``shared`` (the ``"centered"`` reference: a ``(B, n)`` mask of the positions the
    explained output sees, ``V``), the players are measured from their mean over ``V``, ``x̄``,
    and that mean is theirs: at every position of ``V``, player ``k`` also holds
    ``(1/|V|) Σ_{i ∈ k ∩ V} x[b, i]``, its part of the mean; the bias player starts at 0
    (``reference`` is not used).

    Args:
        x (Tensor): the first block's input ``(B, n, d)``.
        groups (Tensor): the player of each position ``(B, n)`` (long).
        players (Sequence[int]): the players to keep, as columns.
        token_mask (Tensor, optional): ``(B, n)``; padded positions belong to no player.
        reference (Tensor, optional): ``(B, n, d)`` the reference input ``r`` of the real
                    positions (see :func:`reference_inputs`).
        shared (Tensor, optional): ``(B, n)`` the positions the centred reference averages.
    """
    ids = torch.as_tensor(list(players), dtype=torch.long, device=x.device)
    n = x.shape[1]
    bias = torch.zeros_like(x)
    if shared is not None:
        return _centered_start(x, groups, ids, token_mask, shared)
    if reference is not None:
        bias = reference.to(x.dtype).expand_as(x)
        if token_mask is not None:
            bias = bias * token_mask[:, :, None].to(x.dtype)
    if len(ids) == n and torch.equal(groups, torch.arange(n, device=x.device).expand_as(groups)) \
            and torch.equal(ids, torch.arange(n, device=x.device)):
        # every position its own player: the identity, in its compact form (the fast paths)
        if reference is None:
            return Decomposition.identity(x, token_mask)
        return TokenwiseDecomposition(x - bias, bias, token_mask)
    member = groups[:, :, None] == ids[None, None, :]  # (B, n, P)
    if token_mask is not None:
        member = member & token_mask[:, :, None].bool()
    terms = (x - bias)[:, :, None, :] * member[..., None].to(x.dtype)
    player_mask = member.any(dim=1)
    return Decomposition(terms, bias.clone(), token_mask, player_mask=player_mask)


def _centered_start(x: Tensor, groups: Tensor, ids: Tensor, token_mask: Tensor | None,
                    visible: Tensor) -> Decomposition:
    """``F[b, i, k] = [i ∈ k] (x_i − v_i x̄) + v_i (1/|V|) Σ_{i' ∈ k ∩ V} x_i'``, ``v`` the mask of
    ``V`` and ``x̄`` the mean over ``V`` (see :func:`player_start`)."""
    real = torch.ones(x.shape[:2], dtype=x.dtype, device=x.device) if token_mask is None \
        else token_mask.to(x.dtype)
    seen = visible.to(x.dtype) * real
    count = seen.sum(1).clamp_min(1)
    mean = torch.einsum("bn,bnd->bd", seen, x) / count[:, None]
    member = (groups[:, :, None] == ids[None, None, :]) & real[:, :, None].bool()  # (B, n, P)
    share = torch.einsum("bnp,bnd->bpd", member.to(x.dtype) * seen[:, :, None], x) / count[:, None, None]
    own = x - seen[:, :, None] * mean[:, None, :]
    terms = own[:, :, None, :] * member[..., None].to(x.dtype) + seen[:, :, None, None] * share[:, None, :, :]
    return Decomposition(terms, torch.zeros_like(x), token_mask, player_mask=member.any(dim=1))


def visible_positions(token_mask: Tensor, positions: Tensor | None, causal: bool) -> Tensor:
    """``(B, n)`` the real positions an output read at ``positions`` (``(B,)``; ``None``:
    pooled) sees: those up to it in a causal model, all of them otherwise."""
    if positions is None or not causal:
        return token_mask
    n = token_mask.shape[1]
    return token_mask * (torch.arange(n, device=token_mask.device)[None, :] <= positions[:, None]).to(token_mask.dtype)


def shared_mean(gradient: Tensor, inputs: Tensor, visible: Tensor) -> Tensor:
    """``(B, n)``: ``(1/|V|) Σ_{j ∈ V} L_j(x_k) = ḡ·x_k`` at each position ``k`` of ``V`` (``ḡ``
    the mean gradient over ``V``): each token's part of the output of the mean input, the
    backward route's counterpart of the centred start (:func:`player_start`)."""
    seen = visible.to(gradient.dtype)
    mean_gradient = torch.einsum("bn,bnd->bd", seen, gradient) / seen.sum(1, keepdim=True).clamp_min(1)
    return torch.einsum("bd,bnd->bn", mean_gradient, inputs.to(gradient.dtype)) * seen


def token_contributions(gradient: Tensor, inputs: Tensor, reference: Tensor | None, seen: Tensor | None) -> Tensor:
    """``(B, n)`` each player's contribution from the read-out's gradient at the first block's
    input: ``⟨g_j, x_j − r_j⟩``, or for the centred reference (``seen``: the positions averaged)
    ``⟨g_j, x_j − x̄⟩ + ḡ·x_j``."""
    if seen is not None:
        seen = seen.to(inputs.dtype)
        mean = torch.einsum("bn,bnd->bd", seen, inputs) / seen.sum(1, keepdim=True).clamp_min(1)
        return (gradient * (inputs - mean[:, None])).sum(-1) + shared_mean(gradient, inputs, seen)
    return (gradient * (inputs if reference is None else inputs - reference.to(inputs.dtype))).sum(-1)


#: The reference inputs :func:`reference_inputs` understands by name.
REFERENCES = ("zero", "mean", "centered")


def is_centered(reference: Any) -> bool:
    """Whether ``reference`` names the centred reference: players measured from the mean of
    the real positions' inputs, that mean's output shared back to the tokens it averages."""
    return isinstance(reference, str) and reference == "centered"


def reference_inputs(reference: str | int | Tensor | None, x: Tensor, token_mask: Tensor | None,
                     token_inputs: Callable[[int], Tensor] | None = None) -> Tensor | None:
    r"""The reference ``r`` ``(B, n, d)`` the players are measured from (``c_j = L_j(x_j − r_j)``;
    ``Σ_j L_j(r_j)`` goes to the bias player), or ``None`` for zero.

    Args:
        reference (str, int or Tensor, optional): ``"zero"`` (or ``None``); ``"mean"`` (and
                    ``"centered"``), each row's mean first-block input over its real tokens; a token id, the
                    first-block input the model gives that token at each position
                    (``token_inputs`` computes it); a tensor ``(d,)``, ``(n, d)`` or
                    ``(B, n, d)``.
        x (Tensor): the first block's input ``(B, n, d)``.
        token_mask (Tensor, optional): ``(B, n)``, 1 for real tokens.
        token_inputs (Callable, optional): token id → the first block's input ``(B, n, d)``
                    for a sequence of that token.
    """
    if reference is None or (isinstance(reference, str) and reference == "zero"):
        return None
    if isinstance(reference, str):
        if reference not in ("mean", "centered"):
            raise ValueError(f"reference must be one of {REFERENCES}, a token id or a tensor, got {reference!r}")
        weights = torch.ones(x.shape[:2], dtype=x.dtype, device=x.device) if token_mask is None \
            else token_mask.to(x.dtype)
        mean = torch.einsum("bn,bnd->bd", weights, x) / weights.sum(1, keepdim=True).clamp_min(1)
        return mean[:, None, :].expand_as(x)
    if isinstance(reference, int) and not isinstance(reference, bool):
        if token_inputs is None:
            raise ValueError("a token id as reference needs the model's embeddings")
        return token_inputs(reference).to(x.dtype)
    if isinstance(reference, Tensor):
        r = reference.to(device=x.device, dtype=x.dtype)
        if r.shape[-1] != x.shape[-1] or r.dim() > 3:
            raise ValueError(f"a reference tensor ends with the width {x.shape[-1]}: (d,), (n, d) or (B, n, d)")
        return r.expand_as(x)
    raise TypeError(f"reference must be 'zero', 'mean', a token id or a tensor, got {type(reference).__name__}")


def propagate(
    blocks: Sequence[Block],
    chain: Chain,
    rules: Mapping[str, Callable],
    start: Decomposition,
    budget: int,
    progress: Any = None,
    prepare: Callable[[Block], Block] | None = None,
) -> Iterator[Decomposition]:
    """The decomposition of every block's output, block after block, from ``start`` (the
    first block's input over the players); rows are chunked to ``budget`` bytes.
    ``prepare`` turns each block into one the chains can run (e.g.
    :func:`~captum_ffb.engine.layers.replay_block` after a light capture), one at a time."""
    current = start
    for block in blocks:
        if prepare is not None:
            block = prepare(block)
        chunks = row_chunks(block, None, budget, current.n_in)
        parts = [dec.dense() for _, _, dec in
                 iter_scopes(block, chain, rules, [chain.output_scope], chunks, current)]
        current = stack_rows(parts)
        if progress is not None:
            progress.update(1)
        yield current


# --------------------------------------------------------------------------- head
def _rows_at(tensor: Tensor, positions: Tensor) -> Tensor:
    """``tensor[b, positions[b]]`` for a ``(B, n, …)`` tensor."""
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
    """

    weights: Tensor
    biases: Tensor
    coefficients: Tensor
    indices: Tensor | None = None
    positions: Tensor | None = None
    pooling: Tensor | None = None


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

    def cast(t: Tensor) -> Tensor:
        return t.detach().to(dtype)

    def final_norm(dec: Decomposition, real_input: Tensor) -> Decomposition:
        if head.final_norm is None:
            return dec
        weight, bias, eps = norm_parameters(head.final_norm, spec, config)
        return rules["norm"](dec, cast(real_input), None if weight is None else cast(weight),
                             None if bias is None else cast(bias), eps)

    if target.positions is not None:
        pos = target.positions
        dec = Decomposition(_rows_at(last.terms, pos)[:, None], _rows_at(last.bias, pos)[:, None],
                            None, last.player_mask)
        if head.final_norm is not None:
            dec = final_norm(dec, _rows_at(real[("final_norm", "input")], pos)[:, None])
    else:
        dec = last
        if head.final_norm is not None:
            dec = final_norm(dec, real[("final_norm", "input")])
        weights = target.pooling.to(dtype)
        dec = Decomposition(torch.einsum("bi,bipd->bpd", weights, dec.terms)[:, None],
                            torch.einsum("bi,bid->bd", weights, dec.bias)[:, None],
                            None, last.player_mask)
    previous: Tensor | None = None
    for position, (kind, item, projection) in enumerate(head.steps):
        if kind == "linear":
            w, c = projection_weights(item, projection, config)
            dec = rules["linear"](dec, cast(w), None if c is None else cast(c))
            previous = _at(cast(real[(f"head:{position}", "output")]), target.positions, n)
        elif kind == "norm":
            weight, bias, eps = norm_parameters(item, spec, config)
            real_input = _at(cast(real[(f"head:{position}", "input")]), target.positions, n)
            dec = rules["norm"](dec, real_input[:, None], None if weight is None else cast(weight),
                                None if bias is None else cast(bias), eps)
            previous = _at(cast(real[(f"head:{position}", "output")]), target.positions, n)
        else:
            dec = element_wise_rule(rules)(dec, item, previous[:, None])
    terms = torch.einsum("bpd,bkd->bkp", dec.terms[:, 0], target.weights.to(dtype))
    bias = torch.einsum("bd,bkd->bk", dec.bias[:, 0], target.weights.to(dtype)) + target.biases.to(dtype)
    factor = 1.0 if head.scale is None else head.scale
    terms, bias = terms * factor, bias * factor
    if head.softcap is not None:
        cap = float(head.softcap)
        pre = (terms.sum(-1) + bias).detach()  # the decomposition's own pre-cap logits
        if target.indices is not None and head.output is not None and ("output", "output") in real:
            pre = factor * _at(cast(real[("output", "output")]), target.positions, n).gather(1, target.indices)
        scalar = Decomposition(terms.transpose(1, 2)[:, None], bias[:, None], None)  # (B, 1, P, K)

        def softcap(t: Tensor) -> Tensor:
            return cap * torch.tanh(t / cap)

        scalar = element_wise_rule(rules)(scalar, softcap, pre[:, None])
        terms, bias = scalar.terms[:, 0].transpose(1, 2), scalar.bias[:, 0]
    coefficients = target.coefficients.to(dtype)
    contributions = torch.einsum("bkp,bk->bp", terms, coefficients)
    return contributions, (bias * coefficients).sum(-1)
