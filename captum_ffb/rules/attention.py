"""Multi-head attention rule, with attention probabilities taken from the real forward pass."""

from __future__ import annotations

import torch
from torch import Tensor

from captum_ffb.core.decomposition import (
    Decomposition,
    FactoredDecomposition,
    TokenwiseDecomposition,
)
from captum_ffb.rules.base import Rule


def head_projections(
    value_weight: Tensor, output_weight: Tensor, n_heads: int
) -> tuple[Tensor, Tensor, int]:
    """Split ``W_V`` and ``W_O`` by head; returns ``(W_V per head, W_O per head, group)``.

    ``W_V`` is ``(d_in, H_kv · d_head)`` and ``W_O`` ``(H · d_head, d_out)``; with grouped-query
    attention ``H_kv < H`` and each key/value head serves ``group = H / H_kv`` query heads.
    """
    d_in, kv_width = value_weight.shape
    width, d_out = output_weight.shape
    if width % n_heads:
        raise ValueError(
            f"output projection input width {width} is not a multiple of {n_heads} heads"
        )
    head_dim = width // n_heads
    if kv_width % head_dim:
        raise ValueError(
            f"value projection width {kv_width} is not a multiple of the head size {head_dim}"
        )
    n_kv = kv_width // head_dim
    if n_heads % n_kv:
        raise ValueError(f"{n_heads} query heads cannot share {n_kv} key/value heads")
    w_v = value_weight.reshape(d_in, n_kv, head_dim)
    w_o = output_weight.reshape(n_heads, head_dim, d_out)
    return w_v, w_o, n_heads // n_kv


def _per_head(vectors: Tensor, w_v: Tensor, w_o: Tensor, group: int) -> Tensor:
    """``(…, d_in)`` vectors → ``(…, H, d_out)``: each through ``W_V^{kv(h)}`` then ``W_O^h``."""
    values = torch.einsum("...d,dke->...ke", vectors, w_v)
    if group > 1:
        values = values.repeat_interleave(group, dim=-2)
    return torch.einsum("...he,heo->...ho", values, w_o)


class Attention(Rule):
    r"""Decompose multi-head attention ``Σ_h α^h (z W_V^h + b_V^h) W_O^h + b_O``.

    ``F'[i, k] = Σ_h Σ_j α^h[i, j] (G[j, k] W_V^h) W_O^h`` for a value input decomposed as
    ``(G, g)``; the value bias ``g``, ``b_V`` and ``b_O`` go to the output bias. Rotary
    embeddings and masks only shape ``α``, which is read from the model's forward pass;
    grouped-query attention shares ``W_V`` between the heads of a group.

    Call: ``Attention()(value_input, probs, value_weight, value_bias, output_weight,
    output_bias)`` with ``value_input`` the decomposition of the attention's value input (one
    row per key position), ``probs`` the attention probabilities ``(B, H, n_out, n_keys)``,
    ``value_weight`` ``(d_in, H_kv · d_head)``, ``value_bias`` ``(H_kv · d_head,)``,
    ``output_weight`` ``(H · d_head, d_out)`` and ``output_bias`` ``(d_out,)`` (biases may
    be ``None``).

    Returns a ``FactoredDecomposition`` with one component per head (low rank for a
    token-wise input; per head and input component for a factored one), or a dense one for
    a dense input (mixed in head space first, as attention itself does).
    """

    role = "attention"

    def __call__(
        self,
        value_input: Decomposition,
        probs: Tensor,
        value_weight: Tensor,
        value_bias: Tensor | None,
        output_weight: Tensor,
        output_bias: Tensor | None,
    ) -> Decomposition:
        batch, n_heads, _, n_keys = probs.shape
        if value_input.n_out != n_keys:
            raise ValueError(
                f"attention has {n_keys} key positions, the value input has {value_input.n_out} rows"
            )
        probs = probs.to(value_input.bias.dtype)
        w_v, w_o, group = head_projections(value_weight, output_weight, n_heads)

        # The bias: value-input bias and b_V through each head, mixed by α, then b_O.
        bias = _mix_heads(probs, head_values(value_input.bias, w_v, group, value_bias), w_o)
        if output_bias is not None:
            bias = bias + output_bias

        mask = value_input.token_mask
        if isinstance(value_input, TokenwiseDecomposition):
            # Low rank: keep each head's d_head-wide values and W_O^h apart.
            values = head_values(value_input.vectors, w_v, group)  # (B, H, n, e)
            return FactoredDecomposition(probs, values, bias, mask, proj=w_o,
                                         player_mask=value_input.player_mask)
        if isinstance(value_input, FactoredDecomposition):
            k = value_input.n_components
            # mix'[(h, c)] = α^h · mix_c ; basis'[(h, c), j] = basis_c[j] W_V^h W_O^h
            mix = torch.matmul(probs[:, :, None], value_input.mix[:, None]).flatten(1, 2)
            basis = _per_head(value_input.basis, w_v, w_o, group)  # (B, K, n_in, H, d)
            basis = basis.permute(0, 3, 1, 2, 4).reshape(batch, n_heads * k, value_input.n_in, -1)
            return FactoredDecomposition(mix, basis, bias, mask, player_mask=value_input.player_mask)
        # Dense (B, n_keys, P, d): values per head, mixed over keys, then W_O^h.
        terms = value_input.terms
        n_players, head_dim = terms.shape[2], w_v.shape[2]
        values = torch.matmul(terms, w_v.flatten(1))  # (B, n_keys, P, H_kv·e)
        values = values.unflatten(-1, (w_v.shape[1], head_dim))
        if group > 1:
            values = values.repeat_interleave(group, dim=3)
        values = values.permute(0, 3, 1, 2, 4).reshape(batch, n_heads, n_keys, n_players * head_dim)
        mixed = torch.matmul(probs, values).unflatten(-1, (n_players, head_dim))
        mixed = mixed.permute(0, 2, 3, 1, 4).reshape(batch, probs.shape[2], n_players, n_heads * head_dim)
        out = torch.matmul(mixed, w_o.flatten(0, 1))
        return Decomposition(out, bias, mask, player_mask=value_input.player_mask)


def head_values(vectors: Tensor, w_v: Tensor, group: int, value_bias: Tensor | None = None) -> Tensor:
    """``(B, n, d_in)`` vectors → per-head values ``(B, H, n, d_head)`` (+ ``b_V``)."""
    values = torch.einsum("bnd,dke->bkne", vectors, w_v)
    if value_bias is not None:
        values = values + value_bias.reshape(w_v.shape[1], 1, w_v.shape[2])
    if group > 1:
        values = values.repeat_interleave(group, dim=1)
    return values


def _mix_heads(probs: Tensor, values: Tensor, w_o: Tensor) -> Tensor:
    """``Σ_h (α^h values^h) W_O^h``: ``(B, H, n, n)``, ``(B, H, n, e)`` → ``(B, n, d_out)``."""
    return torch.einsum("bhie,heo->bio", torch.matmul(probs, values), w_o)
