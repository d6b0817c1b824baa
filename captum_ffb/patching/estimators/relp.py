r"""Relevance patching (RelP; Rezaei Jafari, Eberle, Khakzar and Nanda, 2025, "RelP: Faithful
and Efficient Circuit Discovery via Relevance Patching", arXiv:2508.21258): ``⟨G_A, o_A − o_A^c⟩``
with ``G`` the gradient of a pass run with the layer-wise relevance propagation rules of its
authors' released code (github.com/FarnoushRJ/RelP, whose default rule set is ``['LN-rule',
'Identity-rule', 'Half-rule']``): the norms' scales detached (the LN-rule, Ali et al. 2022),
every element-wise activation passing relevance in proportion, slope ``g(S)/S`` (the identity
rule), a gate ``g(A) ⊙ B`` splitting its relevance in half between its two factors (the half
rule), linear layers by the 0-rule (plain gradient × input) and the attention softmax
differentiated as it is (their optional ``AH-rule``, the probabilities detached, is
``relp_rules(engine, ah_rule=True)``, the same as the frozen estimator with the half rule on
gates). Two forward passes (clean, corrupted) and one backward pass, no real patched pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from captum_ffb.engine.bound import BoundModel
from captum_ffb.engine.tape import covectors
from captum_ffb.patching.estimators.base import Estimate, Estimator, Shared, register_estimator
from captum_ffb.patching.estimators.edges import Link, link_values
from captum_ffb.patching.estimators.exact import exact_variant
from captum_ffb.patching.estimators.recorded import gradients, linear_estimates, record
from captum_ffb.rules import IGActivation, UniformGatedActivation
from captum_ffb.rules.attention_scores import (
    ScoreCreditingAttention,
    SoftmaxLinearisation,
    masked_softmax,
    soft_capped,
)

__all__ = ["GradientAttention", "RelP", "relp_rules"]


class GradientAttention(ScoreCreditingAttention):
    r"""The attention's own derivative as a rule by role: the values weighted by the real
    probabilities, and the scores through the softmax's Jacobian at the real scores,
    ``∂/∂q`` and ``∂/∂k`` of ``q·k`` in full (no uniform split). On the one-backward-pass
    route it makes a linearised pass differentiate attention exactly as the real model does
    while its norms, activations and gates follow other rules: RelP without the optional
    AH-rule. (Its forward route is not a decomposition: only ``linearised`` is used.)"""

    def value_coefficients(self, probs: Tensor, allowed: Tensor) -> Tensor:
        return probs

    def softmax_map(self, scores: Tensor, allowed: Tensor, probs: Tensor | None, softcap: float | None,
                    remainder: bool = True) -> tuple[SoftmaxLinearisation, Tensor | None]:
        _, slope = soft_capped(scores, softcap)
        if probs is None:
            probs = masked_softmax(soft_capped(scores, softcap)[0], allowed)
        # the rules' backward applies ¼ (half to the values' side, half to queries vs keys): 4 undoes it
        return SoftmaxLinearisation([4.0], [probs * allowed], [slope]), None


def relp_rules(engine: BoundModel, ah_rule: bool = False) -> dict[str, Callable]:
    """RelP's propagation rules by role for ``engine``'s model: the norms' default (scale
    frozen: the LN-rule), the identity rule on element-wise activations
    (:class:`~captum_ffb.rules.IGActivation`'s ``g(S)/S``), the identity and half rules on a
    gate (:class:`~captum_ffb.rules.UniformGatedActivation`) and the attention's own
    derivative (:class:`GradientAttention`), or with ``ah_rule`` the probabilities frozen."""
    rules = dict(engine.rules())
    rules["activation"] = IGActivation()
    rules["gated_activation"] = UniformGatedActivation()
    if not ah_rule:  # with it, the default attention rule: the probabilities frozen
        rules["attention"] = GradientAttention()
    return rules


@register_estimator
class RelP(Estimator):
    """The gradient of a pass with RelP's rules (:func:`relp_rules`)."""

    name = "relp"
    citation = ("Rezaei Jafari, Eberle, Khakzar and Nanda 2025, 'RelP: Faithful and Efficient Circuit "
                "Discovery via Relevance Patching', arXiv:2508.21258")
    cost = "3 (the clean and corrupted forward passes; a pass with its rules, forward and backward)"
    linear = True
    edges = True

    def passes(self, shared: Shared) -> float:
        return 3

    def rules(self, engine: BoundModel) -> dict[str, Callable]:
        """The rules of the pass whose gradient it reads (an estimator of another rule set
        subclasses it and changes only this)."""
        return relp_rules(engine)

    def estimate(self, shared: Shared) -> Estimate:
        found = record(shared.engine, shared.request, shared.granularity, rules=self.rules(shared.engine))
        (grads,) = gradients(found)
        return Estimate(linear_estimates(grads, shared.diff, found.tape))

    def estimate_edges(self, shared: Shared, links: Sequence[Link]) -> Tensor:
        rules = self.rules(shared.engine)
        tape = record(shared.engine, shared.request, shared.granularity, rules=rules, reads=True).tape
        return link_values(tape, covectors(tape), shared.diff, links)


register_estimator(exact_variant(RelP))
