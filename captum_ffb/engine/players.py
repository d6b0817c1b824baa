r"""The players and what they are measured from: a decomposition's start over the players, the
references, and each player's contribution from a read-out's gradient.

The players are the first block's input vectors of each stack (one per position, or groups
of positions) plus the bias player. An encoder–decoder's players are laid out
``[source | target]``: the encoder's first-block inputs, then the decoder's
(:func:`joint`). A player is measured from a *reference* (:func:`reference_inputs`); the
default, ``"centered"``, measures each token from the mean of the positions the explained
output sees and shares that mean's own output back to the tokens it averages, so that the
bias player keeps only the model's own bias terms. The centred arithmetic lives here once,
for the forward route (:func:`player_start`) and the backward route
(:func:`token_contributions`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from captum_ffb.core.decomposition import Decomposition, TokenwiseDecomposition


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


def joint(decomposition: Decomposition, before: int, after: int, before_mask: Tensor | None = None,
          after_mask: Tensor | None = None) -> Decomposition:
    """``decomposition`` over ``before`` more players, its own, then ``after`` more (the
    others own nothing of it), with the joint player mask: how one stack's decomposition
    joins the layout ``[source | target]``."""
    dense = decomposition.dense()
    terms = dense.terms
    batch, n, own, width = terms.shape
    masks = (before_mask, dense.player_mask, after_mask)
    players = None
    if any(mask is not None for mask in masks):
        players = torch.cat([terms.new_ones(batch, size) if mask is None else mask.to(terms.dtype)
                             for mask, size in zip(masks, (before, own, after))], dim=1)
    terms = torch.cat([terms.new_zeros(batch, n, before, width), terms,
                       terms.new_zeros(batch, n, after, width)], dim=2)
    return Decomposition(terms, dense.bias, dense.token_mask, players)
