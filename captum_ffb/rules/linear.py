"""Linear rule: ``z ↦ z W + c``."""

from __future__ import annotations

from torch import Tensor

from captum_ffb.core.decomposition import Decomposition
from captum_ffb.rules.base import Rule


class Linear(Rule):
    r"""Decompose ``z W + c`` given a decomposition of ``z``.

    Every term is mapped by ``W``; the constant ``c`` joins the bias (it is owed to no
    token). The result keeps the cheapest storage form the input allows.

    Call: ``Linear()(decomposition, weight, bias=None)`` with ``weight`` ``(d_in, d_out)``
    (the transpose of ``nn.Linear.weight``) and ``bias`` ``(d_out,)``.

    Examples::

        >>> out = Linear()(dec, layer.weight.t(), layer.bias)
    """

    role = "linear"

    def __call__(self, decomposition: Decomposition, weight: Tensor, bias: Tensor | None = None) -> Decomposition:
        if weight.shape[0] != decomposition.dim:
            raise ValueError(
                f"weight expects vectors of width {weight.shape[0]}, the decomposition has "
                f"width {decomposition.dim}"
            )
        return decomposition.linear(weight, bias)
