r"""Gradient Interaction Modifications (GIM; Edin, Csordás, Ruotsalo, Wu, Maistro, Huang and
Maaløe 2025, "GIM: Improved Interpretability for Large Language Models", arXiv:2505.17630):
``⟨G_A, o_A − o_A^c⟩`` with ``G`` the gradient of the explained value with three changes to
the backward pass, the forward pass left as it is:

* the norms' statistics (LayerNorm's standard deviation, RMSNorm's root mean square) detached:
  the norms' default rule on the one-backward-pass route (scale frozen);
* the attention softmax differentiated at temperature ``T`` (2 by default): its backward is
  ``g_in = s_T ⊙ (g_out − ⟨g_out, s_T⟩)`` with ``s_T = softmax(z / T)`` and ``z`` the
  softmax's real input (the capped scores where the family caps them), with no ``1/T``;
* the gradients reaching the attention's queries, keys and values scaled by ¼, ¼ and ½.

Activations and gates keep their real derivative (:class:`~captum_ffb.rules.LinearisedActivation`,
:class:`~captum_ffb.rules.LinearisedGatedActivation`). The authors' package (``gim-explain``)
applies the same changes to a PyTorch model; ``tests/patching/test_gim.py`` checks these rules
against its pieces on a Llama. Two forward passes (clean, corrupted) and one backward pass, no
real patched pass.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from captum_ffb.engine.bound import BoundModel
from captum_ffb.patching.estimators.base import register_estimator
from captum_ffb.patching.estimators.eap_ig import EAPIG
from captum_ffb.patching.estimators.exact import exact_variant
from captum_ffb.patching.estimators.relp import RelP
from captum_ffb.rules import LinearisedActivation, LinearisedGatedActivation
from captum_ffb.rules.attention_scores import (
    ScoreCreditingAttention,
    SoftmaxLinearisation,
    masked_softmax,
    soft_capped,
)

__all__ = ["GIM", "GIMIG", "GIMAttention", "gim_rules"]


class GIMAttention(ScoreCreditingAttention):
    r"""GIM's attention as a rule by role, for the one-backward-pass route: the values'
    gradient ``value_scale · αᵀ g`` (α the real probabilities), and the scores' through the
    softmax's backward at ``temperature``, ``s_T ⊙ (G − ⟨G, s_T⟩)`` with
    ``s_T = softmax(t(s) / T)`` (``t`` the family's soft-capping, whose real slope is kept),
    then onto queries and keys in full, each scaled by ``query_key_scale``. With
    ``temperature=1, value_scale=1, query_key_scale=1`` it is the attention's own derivative
    (:class:`~captum_ffb.patching.estimators.relp.GradientAttention`). Only its ``linearised``
    route is used: its forward route is not a decomposition.

    Args:
        temperature (float): the softmax's temperature in the backward pass (GIM's 2).
        value_scale (float): the factor of the values' gradient (GIM's ½).
        query_key_scale (float): the factor of the queries' and keys' gradients (GIM's ¼).
    """

    def __init__(self, temperature: float = 2.0, value_scale: float = 0.5,
                 query_key_scale: float = 0.25) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature!r}")
        self.temperature = float(temperature)
        self.value_scale = float(value_scale)
        self.query_key_scale = float(query_key_scale)

    def __repr__(self) -> str:
        return (f"GIMAttention(temperature={self.temperature}, value_scale={self.value_scale}, "
                f"query_key_scale={self.query_key_scale})")

    def value_coefficients(self, probs: Tensor, allowed: Tensor) -> Tensor:
        return self.value_scale * probs

    def softmax_map(self, scores: Tensor, allowed: Tensor, probs: Tensor | None, softcap: float | None,
                    remainder: bool = True) -> tuple[SoftmaxLinearisation, Tensor | None]:
        capped, slope = soft_capped(scores, softcap)
        if self.temperature == 1.0 and probs is not None:
            tempered = probs
        else:  # the softmax's input, capped scores, divided by T
            tempered = masked_softmax(capped / self.temperature, allowed)
        # the route's backward applies ¼ (half to the values' side, half to queries vs keys): 4 undoes it
        weight = 4.0 * self.query_key_scale
        # a gradient, not a decomposition: nothing is owed to no player
        return SoftmaxLinearisation([weight], [tempered * allowed], [slope]), None


def gim_rules(engine: BoundModel, temperature: float = 2.0) -> dict[str, Callable]:
    """GIM's backward changes as rules by role for ``engine``'s model: the norms' default
    (scale frozen: their statistics detached), the real derivative of element-wise
    activations and gates (:class:`~captum_ffb.rules.LinearisedActivation`,
    :class:`~captum_ffb.rules.LinearisedGatedActivation`) and :class:`GIMAttention` at
    ``temperature``; only the roles the model's chains call."""
    rules = dict(engine.rules())
    if "activation" in rules:
        rules["activation"] = LinearisedActivation()
    if "gated_activation" in rules:
        rules["gated_activation"] = LinearisedGatedActivation()
    rules["attention"] = GIMAttention(temperature)
    return rules


@register_estimator
class GIM(RelP):
    """The gradient of a pass with GIM's backward changes (:func:`gim_rules`): RelP's passes
    with other rules."""

    name = "gim"
    citation = ("Edin, Csordás, Ruotsalo, Wu, Maistro, Huang and Maaløe 2025, 'GIM: Improved "
                "Interpretability for Large Language Models', arXiv:2505.17630")

    def rules(self, engine: BoundModel) -> dict[str, Callable]:
        return gim_rules(engine)


register_estimator(exact_variant(GIM))


@register_estimator
class GIMIG(EAPIG):
    """GIM's gradients (:func:`gim_rules`) averaged along EAP-IG's path: at each of the
    ``steps`` points ``x^c + k/steps (x − x^c)`` of the input embeddings, the gradient of the
    linearised model of that pass (its coefficients, and GIM's tempered softmax, at that
    point). EAP-IG's cost; ``steps=1`` is :class:`GIM`."""

    name = "gim-ig"
    citation = (f"{GIM.citation}; along the path of {EAPIG.citation}")

    def rules(self, engine: BoundModel) -> dict[str, Callable]:
        return gim_rules(engine)


register_estimator(exact_variant(GIMIG))
