"""Captum attributions built on the decomposition: layer maps and whole-model contributions."""

from captum_ffb.attr.layer_norm_decomposition import (
    DEFAULT_MEMORY_BUDGET,
    LayerNormDecomposition,
)
from captum_ffb.attr.llm import LLMNormAttribution, NormLLMAttributionResult
from captum_ffb.attr.norm_decomposition import ExplainedReadOuts, NormDecomposition
from captum_ffb.components.table import ComponentAttribution, FFQuestion
from captum_ffb.explained.readouts import AnswerLogProbability, Contrast, Direction, TopLogits
from captum_ffb.graph.record import AttributionGraph, GraphTarget, HookSite

__all__ = [
    "AnswerLogProbability",
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
    "TopLogits",
]
