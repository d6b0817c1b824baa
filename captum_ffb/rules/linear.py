"""Linear rule: ``z ↦ z W + c``."""

from __future__ import annotations

from torch import Tensor

from captum_ffb.decomposition import Decomposition


def linear(decomposition: Decomposition, weight: Tensor, bias: Tensor | None = None) -> Decomposition:
    r"""Decompose ``z W + c`` given a decomposition of ``z``.

    Every term is mapped by ``W``; the constant ``c`` joins the bias (it is owed to no token).

    Args:
        decomposition (Decomposition): decomposition of the input vectors.
        weight (Tensor): ``(d_in, d_out)`` (the transpose of ``nn.Linear.weight``).
        bias (Tensor, optional): ``(d_out,)``.

    Returns:
        Decomposition of the output vectors, in the cheapest form the input allows.
    """
    if weight.shape[0] != decomposition.dim:
        raise ValueError(
            f"weight expects vectors of width {weight.shape[0]}, the decomposition has "
            f"width {decomposition.dim}"
        )
    return decomposition.linear(weight, bias)
