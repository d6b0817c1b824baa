"""captum_ffb: exact token-to-token attribution maps for every Transformer layer.

A Captum extension implementing the layer decomposition of Kobayashi et al. (EMNLP 2020,
2021; ICLR 2024): attention, residuals, norms and feed-forward blocks, exactly.
"""

from captum_ffb.architectures import (
    ArchitectureSpec,
    Projection,
    UnsupportedArchitectureError,
    get_architecture,
    register_architecture,
    supported_architectures,
)
from captum_ffb.attr import LayerNormDecomposition
from captum_ffb.decomposition import (
    Decomposition,
    FactoredDecomposition,
    TokenwiseDecomposition,
)

__version__ = "0.1.0"

__all__ = [
    "ArchitectureSpec",
    "Decomposition",
    "FactoredDecomposition",
    "LayerNormDecomposition",
    "Projection",
    "TokenwiseDecomposition",
    "UnsupportedArchitectureError",
    "get_architecture",
    "register_architecture",
    "supported_architectures",
]
