r"""EAP-IG (Hanna, Pezzelle and Belinkov, 2024, "Have Faith in Faithfulness: Going Beyond
Circuit Overlap When Finding Model Mechanisms", arXiv:2403.17806): ``⟨G_A, o_A − o_A^c⟩`` with
``G`` the gradient averaged along the straight path of the *input embeddings* (the first
block's input) from the corrupted input to the clean one,
``G = (1/m) Σ_{k=1..m} ∂output/∂o_A (x^c + k/m (x − x^c))``; the paper's formula (its code
sums ``k = 0 … m − 1``; ``k = m`` is the clean point, so ``m = 1`` is attribution patching).
``m`` forward and backward passes and the corrupted forward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from torch import Tensor

from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.tape import covectors
from captum_ffb.patching.estimators.base import (
    EAP_IG_STEPS,
    Estimate,
    Estimator,
    Shared,
    register_estimator,
)
from captum_ffb.patching.estimators.edges import Link, link_values
from captum_ffb.patching.estimators.exact import exact_variant
from captum_ffb.patching.estimators.recorded import Differences, gradients, linear_estimates, record

__all__ = ["EAP_IG_STEPS", "EAPIG", "eap_ig_gradients"]


def eap_ig_gradients(engine: BoundModel, request: Request, granularity: str, diff: Differences,
                     steps: int = EAP_IG_STEPS, rules: Mapping[str, Callable] | None = None) -> dict[str, Tensor]:
    """EAP-IG's covectors: the real gradients at the writers (and parts) averaged over
    ``steps`` passes from ``x^c + k/steps (x − x^c)``, ``k = 1 … steps`` (with ``rules``,
    the gradients of the linearised model of each pass)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    total: dict[str, Tensor] = {}
    for k in range(1, steps + 1):
        start = diff.corrupted_inputs + (k / steps) * (diff.clean_inputs - diff.corrupted_inputs)
        (found,) = gradients(record(engine, request, granularity, rules=rules, start=start))
        for name, g in found.items():
            total[name] = total[name] + g if name in total else g.clone()
    return {name: g / steps for name, g in total.items()}


@register_estimator
class EAPIG(Estimator):
    """The real gradients averaged over ``steps`` interpolated passes (:func:`eap_ig_gradients`)."""

    name = "eap-ig"
    citation = ("Hanna, Pezzelle and Belinkov 2024, 'Have Faith in Faithfulness: Going Beyond Circuit "
                "Overlap When Finding Model Mechanisms', arXiv:2403.17806")
    cost = "1 + 2·steps (the corrupted forward pass; a forward and a backward pass per step)"
    linear = True
    edges = True

    def passes(self, shared: Shared) -> float:
        return 1 + 2 * shared.steps

    def rules(self, engine: BoundModel) -> dict[str, Callable] | None:
        """The rules of the passes whose gradients it averages (``None``: the real model's
        own; an estimator of another rule set along the same path changes only this)."""
        return None

    def estimate(self, shared: Shared) -> Estimate:
        grads = eap_ig_gradients(shared.engine, shared.request, shared.granularity, shared.diff, shared.steps,
                                 self.rules(shared.engine))
        return Estimate(linear_estimates(grads, shared.diff, shared.clean.tape))

    def estimate_edges(self, shared: Shared, links: Sequence[Link]) -> Tensor:
        diff, steps = shared.diff, shared.steps
        rules = self.rules(shared.engine)
        total = None
        for k in range(1, steps + 1):
            start = diff.corrupted_inputs + (k / steps) * (diff.clean_inputs - diff.corrupted_inputs)
            tape = record(shared.engine, shared.request, shared.granularity, rules=rules, start=start,
                          reads=True).tape
            values = link_values(tape, covectors(tape), diff, links)
            total = values if total is None else total + values
        return total / steps


register_estimator(exact_variant(EAPIG))
