r"""The frozen estimator: ``⟨G_A, o_A − o_A^c⟩`` with the frozen model's covector (every
coefficient of the clean run fixed: the graph's own), exact for the frozen model; for edges,
the graph's edge weights with the write replaced by the patch."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from captum_ffb.engine.autograd import sequence_shaped
from captum_ffb.engine.tape import covectors, part_covectors
from captum_ffb.patching.estimators.base import Estimate, Estimator, Shared, register_estimator
from captum_ffb.patching.estimators.edges import Link, link_values
from captum_ffb.patching.estimators.exact import exact_variant
from captum_ffb.patching.estimators.recorded import record

__all__ = ["Frozen"]


@register_estimator
class Frozen(Estimator):
    """The frozen model's gradient, read off the graph's own pass (its covectors)."""

    name = "frozen"
    citation = "the frozen model's exact first order (this library: the graph's own covectors)"
    cost = "3 (the graph's own pass, and the clean and corrupted forward passes)"
    linear = True
    edges = True

    def passes(self, shared: Shared) -> float:
        return 3

    def estimate(self, shared: Shared) -> Estimate:
        tape, found, diff = shared.tape, shared.found, shared.diff
        nodes = {}
        for k, recorded in enumerate(tape.writers):
            if recorded.parts is None:
                frozen = sequence_shaped(found.total[recorded.id], recorded.n)[0]
                nodes[recorded.id] = (frozen * diff.outputs[recorded.id]).sum(-1)[:, None]
            else:
                frozen = part_covectors(tape, k, found.total[recorded.id])[0]
                nodes[recorded.id] = (frozen * diff.parts[recorded.id]).sum(-1)
        return Estimate(nodes)

    def estimate_edges(self, shared: Shared, links: Sequence[Link]) -> Tensor:
        rules = shared.rules or shared.engine.rules()
        tape = record(shared.engine, shared.request, shared.granularity, rules=rules, reads=True).tape
        return link_values(tape, covectors(tape), shared.diff, links)


register_estimator(exact_variant(Frozen))
