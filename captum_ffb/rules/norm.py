"""Normalisation rules: LayerNorm and RMSNorm, with the scale read from the real input.

Both are linear in the terms once the per-row scale is fixed from the real input, so both
are linear in the players; :meth:`frozen_scale` gives that scale to the one-backward-pass
route.
"""

from __future__ import annotations

import torch
from torch import Tensor

from captum_ffb.core.decomposition import Decomposition
from captum_ffb.rules.base import Rule
from captum_ffb.rules.fused import fused


@fused
def _layer_norm_scale(real_input: Tensor, eps: float) -> Tensor:
    """``1 / sqrt(var(y_i) + ε)`` per row."""
    return torch.rsqrt(real_input.var(dim=-1, unbiased=False) + eps)


@fused
def _rms_scale(real_input: Tensor, eps: float) -> Tensor:
    """``1 / sqrt(mean(y_i²) + ε)`` per row."""
    return torch.rsqrt(real_input.pow(2).mean(dim=-1) + eps)


class LayerNorm(Rule):
    r"""Decompose ``LN(y) = (y − mean(y)) / s(y) ⊙ γ + β``.

    Centring is linear and applies to every term; the scale ``s(y_i) = sqrt(var(y_i) + ε)``
    is a number per output row taken from the *real* input ``y_i``, so it is shared by all
    terms of row ``i``; ``β`` is owed to no token.

    Call: ``LayerNorm()(decomposition, real_input, weight, bias, eps)`` with ``real_input``
    the input the model really fed the norm ``(B, n_out, d)``, ``weight`` γ and ``bias`` β
    ``(d,)`` (either may be ``None``) and the norm's ``eps``.

    Examples::

        >>> out = LayerNorm()(dec, real_input, ln.weight, ln.bias, ln.eps)
        >>> torch.allclose(out.total(), ln(real_input), atol=1e-5)   # when real_input = dec.total()
    """

    role = "norm"
    centres = True

    def frozen_scale(self, real_input: Tensor, eps: float) -> Tensor:
        """``1 / s(y_i)`` per row ``(B, n)``, from the real input."""
        return _layer_norm_scale(real_input, eps)

    def __call__(
        self,
        decomposition: Decomposition,
        real_input: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
    ) -> Decomposition:
        scale = self.frozen_scale(real_input.to(decomposition.bias.dtype), eps)
        out = decomposition.center_scale(scale, weight)
        return out if bias is None else out.add_bias(bias)


class RMSNorm(Rule):
    r"""Decompose ``RMSNorm(y) = y / rms(y) ⊙ γ``, ``rms(y) = sqrt(mean(y²) + ε)``.

    Call as :class:`LayerNorm`. For Gemma-style norms that compute ``1 + w`` pass ``1 + w``
    as ``weight``; a ``bias`` (no RMSNorm of the registered families has one) is owed to no
    token.
    """

    role = "norm"
    centres = False

    def frozen_scale(self, real_input: Tensor, eps: float) -> Tensor:
        """``1 / rms(y_i)`` per row ``(B, n)``, from the real input."""
        return _rms_scale(real_input, eps)

    def __call__(
        self,
        decomposition: Decomposition,
        real_input: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
    ) -> Decomposition:
        scale = self.frozen_scale(real_input.to(decomposition.bias.dtype), eps)
        out = decomposition.scale(scale, weight)
        return out if bias is None else out.add_bias(bias)
