r"""Attribution patching (AtP): ``⟨G_A, o_A − o_A^c⟩`` with the real model's gradient at the
clean input (Nanda 2023; Syed, Rager and Conmy 2023, "Attribution Patching Outperforms
Automated Circuit Discovery", arXiv:2310.10348); for edges, edge attribution patching."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

from captum_ffb.engine.tape import covectors
from captum_ffb.patching.estimators.base import Estimate, Estimator, Shared, register_estimator
from captum_ffb.patching.estimators.edges import Link, link_values
from captum_ffb.patching.estimators.exact import exact_variant
from captum_ffb.patching.estimators.recorded import gradients, linear_estimates, record
from captum_ffb.patching.estimators.verified import verified_variant

__all__ = ["AtP"]


@register_estimator
class AtP(Estimator):
    """The real gradient at the clean input, from the shared clean pass."""

    name = "atp"
    citation = ("Nanda 2023, 'Attribution Patching'; Syed, Rager and Conmy 2023, 'Attribution Patching "
                "Outperforms Automated Circuit Discovery', arXiv:2310.10348")
    cost = "3 (the clean and corrupted forward passes, one backward pass)"
    linear = True
    edges = True

    def passes(self, shared: Shared) -> float:
        return 3

    def seconds(self, own: float, shared: Shared, done: Mapping[str, float]) -> float:
        return shared.corrupted_seconds + shared.clean_seconds + own  # the clean pass is its own

    def estimate(self, shared: Shared) -> Estimate:
        (grads,) = gradients(shared.clean)
        return Estimate(linear_estimates(grads, shared.diff, shared.clean.tape))

    def estimate_edges(self, shared: Shared, links: Sequence[Link]) -> Tensor:
        tape = record(shared.engine, shared.request, shared.granularity, reads=True).tape
        return link_values(tape, covectors(tape), shared.diff, links)


register_estimator(exact_variant(AtP))
register_estimator(verified_variant(AtP))
