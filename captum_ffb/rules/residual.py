"""Residual rule: ``z ↦ f(z) + z``."""

from __future__ import annotations

from captum_ffb.decomposition import Decomposition


def residual(branch: Decomposition, skip: Decomposition) -> Decomposition:
    r"""Decompose ``branch + skip`` by adding the two decompositions term by term.

    Args:
        branch (Decomposition): decomposition of the sub-block's output ``f(z)``.
        skip (Decomposition): decomposition of what the residual connection bypasses.

    Returns:
        Decomposition of the sum; compact forms are kept where both allow it.
    """
    return branch + skip
