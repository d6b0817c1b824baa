"""Residual rule: ``z ↦ f(z) + z``."""

from __future__ import annotations

from captum_ffb.core.decomposition import Decomposition
from captum_ffb.rules.base import Rule


class Residual(Rule):
    r"""Decompose ``branch + skip`` by adding the two decompositions term by term.

    Call: ``Residual()(branch, skip)``: the decompositions of the sub-block's output ``f(z)``
    and of what the residual connection bypasses. Compact forms are kept where both allow it.
    """

    role = "residual"

    def __call__(self, branch: Decomposition, skip: Decomposition) -> Decomposition:
        return branch + skip
