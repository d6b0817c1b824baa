"""Baselines to put next to the decomposition's maps, and the tools to compare them.

* token-to-token maps of one layer from attention weights, attention norms (Kobayashi et al.
  2020), Captum's gradient methods and Shapley values over the layer's input tokens
  (:func:`baseline_maps`);
* the paper's App. E, IG against Shapley values for the FF activation
  (:func:`activation_study`);
* agreement of maps: 1 − Spearman ρ, Pearson r, top-k overlap (:func:`compare`,
  :func:`compare_methods`);
* activation patching, one patched pass per component: what an attribution graph's patching
  estimates estimate (:func:`activation_patching`);
* both studies on a piece of text, as ``captum-ffb compare`` runs them
  (:func:`compare_with_baselines`, :func:`activation_study_by_length`).
"""

from captum_ffb._deprecation import moved_names
from captum_ffb.attr.patching import PatchingResult, activation_patching, component_id
from captum_ffb.baselines.activation import (
    ACTIVATION_METHODS,
    ActivationStudy,
    activation_decomposition,
    activation_rule,
    activation_study,
    scopes_with_activation,
)
from captum_ffb.baselines.attention import attention_norm_maps, attention_weight_maps
from captum_ffb.baselines.captured import CapturedLayer, LayerFunction, capture_layer
from captum_ffb.baselines.compare import ComparisonTable, compare, compare_methods, spearman
from captum_ffb.baselines.gradients import (
    GRADIENT_METHODS,
    completeness_residual,
    gradient_map,
    gradient_maps,
    gradient_vectors,
)
from captum_ffb.baselines.maps import ALIASES, BASELINES, baseline_maps, resolve_baselines
from captum_ffb.baselines.shapley import shapley_maps, shapley_vectors
from captum_ffb.baselines.study import (
    BaselineComparison,
    LengthStudy,
    activation_study_by_length,
    compare_with_baselines,
    text_lengths,
)
from captum_ffb.rules.shapley import SHAPLEY_METHODS, shapley_values

__all__ = [
    "ACTIVATION_METHODS",
    "ALIASES",
    "BASELINES",
    "GRADIENT_METHODS",
    "SHAPLEY_METHODS",
    "ActivationStudy",
    "BaselineComparison",
    "ComparisonTable",
    "CapturedLayer",
    "LayerFunction",
    "LengthStudy",
    "PatchingResult",
    "activation_decomposition",
    "activation_patching",
    "activation_rule",
    "activation_study",
    "activation_study_by_length",
    "attention_norm_maps",
    "attention_weight_maps",
    "baseline_maps",
    "capture_layer",
    "compare",
    "compare_methods",
    "compare_with_baselines",
    "component_id",
    "completeness_residual",
    "gradient_map",
    "gradient_maps",
    "gradient_vectors",
    "resolve_baselines",
    "scopes_with_activation",
    "shapley_maps",
    "shapley_values",
    "shapley_vectors",
    "spearman",
    "text_lengths",
]

#: ``LayerContext`` (0.3) is :class:`CapturedLayer`: "context" names long contexts only.
__getattr__ = moved_names(__name__, {"LayerContext": ("captum_ffb.baselines.captured", "CapturedLayer")})
