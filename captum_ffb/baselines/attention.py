"""Attention-based baselines: raw attention weights and attention norms (Kobayashi et al. 2020)."""

from __future__ import annotations

import torch
from torch import Tensor

from captum_ffb.baselines.captured import CapturedLayer, mask_maps
from captum_ffb.core.decomposition import Decomposition, FactoredDecomposition
from captum_ffb.rules import Attention

REDUCTIONS = ("mean", "sum")


def attention_weight_maps(context: CapturedLayer, reduce: str = "mean") -> Tensor:
    r"""The layer's attention probabilities combined over heads, ``(B, n, n)``.

    ``M[b, i, j] = mean_h α^h[b, i, j]`` (``reduce="mean"``) or ``Σ_h α^h[b, i, j]``
    (``"sum"``), with the probabilities of the model's own forward pass; padded rows and
    columns are zero.

    Args:
        context (CapturedLayer): from :func:`~captum_ffb.baselines.capture_layer`.
        reduce (str): ``"mean"`` or ``"sum"`` over heads.
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    probs = context.block.probs
    maps = probs.mean(dim=1) if reduce == "mean" else probs.sum(dim=1)
    return mask_maps(maps, context.token_mask)


def attention_norm_maps(context: CapturedLayer, include_value_bias: bool = False) -> Tensor:
    r"""Attention norms ``‖Σ_h α^h[i, j] f^h(x_j)‖`` (Kobayashi et al., 2020), ``(B, n, n)``.

    ``x_j`` is the real input of the value projection (the block input, or its first norm's
    output in Pre-LN blocks) and ``f^h(x) = x W_V^h W_O^h``. This is the map of the
    attention-only decomposition (``captum_ffb.rules.attention()`` applied to the identity
    decomposition of the value input), where the value bias belongs to no token. With
    ``include_value_bias=True``, ``f^h(x) = (x W_V^h + b_V^h) W_O^h`` as in the 2020 paper.

    Args:
        context (CapturedLayer): from :func:`~captum_ffb.baselines.capture_layer`.
        include_value_bias (bool): count ``b_V`` in each token's transformed vector.
    """
    block = context.block
    probs = block.probs
    value_input = context.value_input()
    w_v, b_v, w_o, b_o = block.attention_weights()
    if not include_value_bias or b_v is None:
        identity = Decomposition.identity(value_input, context.token_mask)
        return Attention()(identity, probs, w_v, b_v, w_o, b_o).maps()
    n_heads = probs.shape[1]
    head_dim = w_o.shape[0] // n_heads
    values = value_input @ w_v + b_v  # (B, n, H_kv · d_head)
    batch, n, _ = values.shape
    values = values.reshape(batch, n, -1, head_dim)
    group = n_heads // values.shape[2]
    if group > 1:
        values = values.repeat_interleave(group, dim=2)
    basis = torch.einsum("bjhe,heo->bhjo", values, w_o.reshape(n_heads, head_dim, -1))
    bias = torch.zeros(batch, n, basis.shape[-1], dtype=basis.dtype, device=basis.device)
    return FactoredDecomposition(probs, basis, bias, context.token_mask).maps()
