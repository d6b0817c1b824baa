"""Captum attributions built on the layer decomposition."""

from captum_ffb.attr.layer_norm_decomposition import (
    DEFAULT_MEMORY_BUDGET,
    LayerNormDecomposition,
)

__all__ = ["DEFAULT_MEMORY_BUDGET", "LayerNormDecomposition"]
