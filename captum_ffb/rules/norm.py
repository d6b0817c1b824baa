"""Normalisation rules: LayerNorm and RMSNorm, with the scale read from the real input."""

from __future__ import annotations

import torch
from torch import Tensor

from captum_ffb.decomposition import Decomposition


def layer_norm(
    decomposition: Decomposition,
    real_input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
) -> Decomposition:
    r"""Decompose ``LN(y) = (y − mean(y)) / s(y) ⊙ γ + β``.

    Centring is linear and applies to every term; the scale ``s(y_i) = sqrt(var(y_i) + ε)``
    is a number per output row taken from the *real* input ``y_i``, so it is shared by all
    terms of row ``i``; ``β`` is owed to no token.

    Args:
        decomposition (Decomposition): decomposition of the norm's input ``y``.
        real_input (Tensor): the input the model really fed the norm, ``(B, n_out, d)``.
        weight (Tensor, optional): γ ``(d,)``; ``None`` for a norm without affine weights.
        bias (Tensor, optional): β ``(d,)``.
        eps (float): the norm's ε.
    """
    real = real_input.to(decomposition.bias.dtype)
    scale = torch.rsqrt(real.var(dim=-1, unbiased=False) + eps)
    out = decomposition.center_scale(scale, weight)
    if bias is not None:
        out = out.add_bias(bias)
    return out


def rms_norm(
    decomposition: Decomposition,
    real_input: Tensor,
    weight: Tensor | None,
    eps: float,
) -> Decomposition:
    r"""Decompose ``RMSNorm(y) = y / rms(y) ⊙ γ``, ``rms(y) = sqrt(mean(y²) + ε)``.

    Args:
        decomposition (Decomposition): decomposition of the norm's input ``y``.
        real_input (Tensor): the input the model really fed the norm, ``(B, n_out, d)``.
        weight (Tensor, optional): the effective γ ``(d,)`` (for Gemma-style norms that
                    compute ``1 + w``, pass ``1 + w``).
        eps (float): the norm's ε.
    """
    real = real_input.to(decomposition.bias.dtype)
    scale = torch.rsqrt(real.pow(2).mean(dim=-1) + eps)
    return decomposition.scale(scale, weight)
