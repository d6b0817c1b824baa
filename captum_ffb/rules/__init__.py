"""Per-module rules: each maps a decomposition of a module's input to one of its output.

A rule knows one kind of component and nothing about models: weights, attention
probabilities and real totals are passed in by the chain that wires the rules together.
Chains call them by role (``ROLES``); pass ``rules={role: rule}`` to an attribution to
use another rule, a subclass of your own, or any callable with the role's signature.
"""

from typing import Any

from captum_ffb.rules.activation import (
    GatedIGActivation,
    IGActivation,
    LinearisedActivation,
    LinearisedGatedActivation,
    NoTokenActivation,
    NoTokenGatedActivation,
    UniformGatedActivation,
    activation_coefficients,
    gate_mean_value,
    mean_value_closed_form,
)
from captum_ffb.rules.attention import Attention
from captum_ffb.rules.attention_scores import (
    AttnLRPAttention,
    CompleteAttnLRPAttention,
    IGAttention,
    ScoreCreditingAttention,
    ScorePath,
)
from captum_ffb.rules.base import ROLES, Rule, TimedRule, check_rules, is_linear_in_players
from captum_ffb.rules.linear import Linear
from captum_ffb.rules.norm import LayerNorm, RMSNorm
from captum_ffb.rules.residual import Residual
from captum_ffb.rules.shapley import ShapleyActivation, shapley_values

__all__ = [
    "ROLES",
    "Attention",
    "AttnLRPAttention",
    "CompleteAttnLRPAttention",
    "IGAttention",
    "ScoreCreditingAttention",
    "ScorePath",
    "GatedIGActivation",
    "IGActivation",
    "LayerNorm",
    "Linear",
    "LinearisedActivation",
    "LinearisedGatedActivation",
    "NoTokenActivation",
    "NoTokenGatedActivation",
    "RMSNorm",
    "Residual",
    "Rule",
    "ShapleyActivation",
    "TimedRule",
    "UniformGatedActivation",
    "activation_coefficients",
    "check_rules",
    "gate_mean_value",
    "is_linear_in_players",
    "mean_value_closed_form",
    "shapley_values",
    "attnlrp_rules",
    "default_rules",
    "whole_model_rules",
]


def default_rules(norm: str = "layer_norm") -> dict[str, Rule]:
    """The paper's rules for every role; ``norm`` picks LayerNorm or RMSNorm."""
    return {
        "linear": Linear(),
        "attention": Attention(),
        "residual": Residual(),
        "norm": RMSNorm() if norm == "rms_norm" else LayerNorm(),
        "activation": IGActivation(),
        "gated_activation": GatedIGActivation(),
    }


def whole_model_rules(norm: str = "layer_norm") -> dict[str, Rule]:
    """The whole-model default rules (:class:`~captum_ffb.attr.NormDecomposition`): the paper's
    rules for every role (frozen attention probabilities), the same as the layer maps'.

    The whole model's default also measures the players from the input's mean token, that
    mean's output shared back to the tokens (``reference="centered"``, see
    :meth:`~captum_ffb.attr.NormDecomposition.attribute`); with it, these rules ranked annotated
    evidence best of the complete candidates and kept the sentiment protocols
    (``results/evidence``). AttnLRP's attention stays available by name
    (``rules={"attention": AttnLRPAttention()}``: it owes the softmax's linearisation remainder
    to no token), as do :class:`CompleteAttnLRPAttention` and :class:`IGAttention`.
    """
    return default_rules(norm)


def attnlrp_rules(model: Any = None) -> dict[str, Rule]:
    r"""The rules by role that reproduce AttnLRP (Achtibat et al., ICML 2024; ``lxt``'s
    efficient rules) in this framework, for every role a model's chain calls.

    - attention: :class:`AttnLRPAttention` (uniform rule on ``α·V`` and ``q·kᵀ``, the
      softmax linearised at the real scores; what that leaves goes to the bias player);
    - gated feed-forward: :class:`UniformGatedActivation` (identity rule on the activation,
      uniform rule on the product); element-wise activations: :class:`IGActivation`, whose
      closed form ``g(S)/S`` is the identity rule;
    - norms: :class:`RMSNorm` or :class:`LayerNorm` with the scale frozen (lxt detaches the
      standard deviation: the identity rule); linear layers and residuals: :class:`Linear`,
      :class:`Residual` (gradient × input, no ε).

    The contributions equal the relevances of ``lxt``'s patched model (``inputs_embeds ×
    gradient``) up to float rounding; here the part AttnLRP's rules do not pass on is
    owed to the bias player, so ``Σ_j c_j + c_bias`` is still the real output.

    Args:
        model (nn.Module, str or ArchitectureSpec, optional): the model (or its
                    ``model_type``, or its family's spec) whose roles and norm kind to use;
                    default: a Llama-style decoder (RMSNorm, gated feed-forward).

    Examples::

        >>> nd = NormDecomposition(llama, rules=attnlrp_rules(llama))
        >>> relevance = nd.attribute(ids, target=token)
    """
    norm, gated, element_wise = "rms_norm", True, False
    if model is not None:
        from captum_ffb.architectures import ArchitectureSpec, get_architecture, model_type_of

        if isinstance(model, ArchitectureSpec):
            spec = model
        else:
            model_type = model if isinstance(model, str) else model_type_of(model)
            if model_type is None:
                raise ValueError("cannot tell the model's family: give its model_type")
            spec = get_architecture(model_type)
        norm = spec.norm
        gated = spec.moe is not None or spec.ff_gate is not None
        element_wise = spec.ff_in is not None and spec.ff_gate is None
    rules: dict[str, Rule] = {
        "linear": Linear(),
        "attention": AttnLRPAttention(),
        "residual": Residual(),
        "norm": RMSNorm() if norm == "rms_norm" else LayerNorm(),
    }
    if gated:
        rules["gated_activation"] = UniformGatedActivation()
    if element_wise:
        rules["activation"] = IGActivation()
    return rules

