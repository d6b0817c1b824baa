"""Per-module rules: each maps a decomposition of a module's input to one of its output.

A rule knows one kind of component and nothing about models: weights, attention
probabilities and real totals are passed in by the chain that wires the rules together.
"""

from captum_ffb.rules.activation import (
    activation,
    activation_coefficients,
    gated_activation,
)
from captum_ffb.rules.attention import attention
from captum_ffb.rules.linear import linear
from captum_ffb.rules.norm import layer_norm, rms_norm
from captum_ffb.rules.residual import residual

__all__ = [
    "activation",
    "activation_coefficients",
    "attention",
    "gated_activation",
    "layer_norm",
    "linear",
    "residual",
    "rms_norm",
]
