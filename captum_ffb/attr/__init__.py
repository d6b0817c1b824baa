"""Captum attributions built on the decomposition: layer maps and whole-model contributions."""

from captum_ffb.attr.components import ComponentAttribution, FFQuestion
from captum_ffb.attr.graph import AttributionGraph, GraphTarget, HookSite
from captum_ffb.attr.layer_norm_decomposition import (
    DEFAULT_MEMORY_BUDGET,
    LayerNormDecomposition,
)
from captum_ffb.attr.llm import LLMNormAttribution, NormLLMAttributionResult
from captum_ffb.attr.norm_decomposition import ExplainedReadOuts, NormDecomposition
from captum_ffb.readouts import Contrast, Direction

__all__ = [
    "AttributionGraph",
    "DEFAULT_MEMORY_BUDGET",
    "ComponentAttribution",
    "Contrast",
    "Direction",
    "ExplainedReadOuts",
    "FFQuestion",
    "GraphTarget",
    "HookSite",
    "LLMNormAttribution",
    "LayerNormDecomposition",
    "NormDecomposition",
    "NormLLMAttributionResult",
]
