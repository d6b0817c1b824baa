"""captum_ffb: exact token-to-token attribution maps for every Transformer layer.

A Captum extension implementing the decomposition of Kobayashi et al. (EMNLP 2020, 2021;
ICLR 2024): attention, residuals, norms and feed-forward blocks, exactly.

Layout, floor by floor: :mod:`captum_ffb.core` (the vocabulary, versions, decompositions),
:mod:`captum_ffb.architectures` (where each family keeps its components) and
:mod:`captum_ffb.io` (files and pages out), :mod:`captum_ffb.rules` (what each component
does to a decomposition), :mod:`captum_ffb.engine` (the machinery: passes, capture,
linearisation, blocks, chains), :mod:`captum_ffb.explained` (the model, the explained
scalar, the result), the features (:mod:`captum_ffb.patching`,
:mod:`captum_ffb.components`, :mod:`captum_ffb.graph`), :mod:`captum_ffb.attr` (the Captum
attributions, the doors), then texts, jobs, studies, long contexts, views and the CLI.
"""

from captum_ffb._deprecation import install_moved_modules
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
    AnswerLogProbability,
    AttributionGraph,
    Contrast,
    Direction,
    LayerNormDecomposition,
    LLMNormAttribution,
    NormDecomposition,
    TopLogits,
)
from captum_ffb.attr.patching import activation_patching
from captum_ffb.core.decomposition import (
    Decomposition,
    FactoredDecomposition,
    TokenwiseDecomposition,
)
from captum_ffb.core.versions import (
    __version__ as __version__,  # setup.cfg reads it from core.versions
)
from captum_ffb.engine import Chain
from captum_ffb.engine.locking import model_lock
from captum_ffb.long_context.attribution import ContextAttribution, context_attribution

install_moved_modules()  # the module paths before 0.4 import for one release


__all__ = [
    "AnswerLogProbability",
    "TopLogits",
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
