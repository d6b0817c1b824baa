"""captum_ffb: exact token-to-token attribution maps for every Transformer layer.

A Captum extension implementing the decomposition of Kobayashi et al. (EMNLP 2020, 2021;
ICLR 2024): attention, residuals, norms and feed-forward blocks, exactly.

Layout: :mod:`captum_ffb.rules` (what each component does to a decomposition),
:mod:`captum_ffb.architectures` (where each family keeps its components),
:mod:`captum_ffb.engine` (capture, blocks, chains), :mod:`captum_ffb.attr` (the Captum
attributions), then analyses, baselines, views and the CLI.
"""

from captum_ffb.architectures import (
    ArchitectureSpec,
    MixtureOfExperts,
    Projection,
    UnsupportedArchitectureError,
    get_architecture,
    register_architecture,
    register_chain,
    supported_architectures,
)
from captum_ffb.attr import (
    AttributionGraph,
    Contrast,
    Direction,
    LayerNormDecomposition,
    LLMNormAttribution,
    NormDecomposition,
)
from captum_ffb.baselines.patching import activation_patching
from captum_ffb.context import ContextAttribution, context_attribution
from captum_ffb.decomposition import (
    Decomposition,
    FactoredDecomposition,
    TokenwiseDecomposition,
)
from captum_ffb.engine import Chain
from captum_ffb.engine.locking import model_lock

__version__ = "0.4.0.dev0"

__all__ = [
    "ArchitectureSpec",
    "AttributionGraph",
    "Chain",
    "ContextAttribution",
    "Contrast",
    "Decomposition",
    "Direction",
    "FactoredDecomposition",
    "LLMNormAttribution",
    "LayerNormDecomposition",
    "MixtureOfExperts",
    "NormDecomposition",
    "Projection",
    "TokenwiseDecomposition",
    "UnsupportedArchitectureError",
    "activation_patching",
    "context_attribution",
    "get_architecture",
    "model_lock",
    "register_architecture",
    "register_chain",
    "supported_architectures",
]
