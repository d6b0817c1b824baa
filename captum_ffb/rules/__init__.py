"""Per-module rules: each maps a decomposition of a module's input to one of its output.

A rule knows one kind of component and nothing about models: weights, attention
probabilities and real totals are passed in by the chain that wires the rules together.
Chains call them by role (:data:`ROLES`); pass ``rules={role: rule}`` to an attribution to
use another rule, a subclass of your own, or any callable with the role's signature.
"""

from captum_ffb.rules.activation import (
    GatedIGActivation,
    IGActivation,
    LinearisedActivation,
    LinearisedGatedActivation,
    NoTokenActivation,
    NoTokenGatedActivation,
    activation_coefficients,
    gate_mean_value,
    mean_value_closed_form,
)
from captum_ffb.rules.attention import Attention
from captum_ffb.rules.attention_scores import (
    AttnLRPAttention,
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
    "activation_coefficients",
    "check_rules",
    "gate_mean_value",
    "is_linear_in_players",
    "mean_value_closed_form",
    "shapley_values",
    "default_rules",
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
