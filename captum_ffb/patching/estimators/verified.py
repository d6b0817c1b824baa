r"""The ``"+verify"`` variant: ``"X+exact"``, then the components the estimates flag most
patched for real, as the second stage of AtP* (Kramár et al. 2024, arXiv:2403.00745) verifies
attribution patching's candidates by real patching.

Each component (a head, an attention sublayer, an FF block, a neuron: every position at once)
not already patched for real by ``"X+exact"`` gets a score from two estimates of its effect,
``X``'s ``a`` and the frozen model's ``f`` (both summed over positions):
``|a − f| + (|a| + |f|) / 2``, large where the estimates are large or disagree. The
``verify_top`` components of largest score of each kind
(:data:`~captum_ffb.patching.patches.VERIFY_TOP` by default), and of the others the one whose
patch moves the stream most (the largest κ over its positions, see
:mod:`~captum_ffb.patching.estimators.exact`), are patched for real, one forward pass each, and
their effect is that pass's. The disagreement flags some components that each estimate alone
misses; κ flags the first FF block responding to a swapped token far from linearly where both
estimates are small (``results/patching``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from captum_ffb.core.vocabulary import component_of
from captum_ffb.patching.estimators.base import Estimate, Estimator, Shared, get_estimator
from captum_ffb.patching.estimators.exact import corrupted_writers, kappas, node_kind, real_patched
from captum_ffb.patching.real import patched_values, writer_patch

__all__ = ["Verified", "VerifiedVariant", "verified", "verified_variant", "verify_scores"]


@dataclass
class Verified:
    """The components a ``"+verify"`` estimator patched for real.

    Attributes:
        components (dict): component id → its real effect (every position patched).
        passes (int): the patched passes run.
    """

    components: dict[str, float] = field(default_factory=dict)
    passes: int = 0


def _component_sums(estimate: Estimate, shared: Shared) -> dict[str, float]:
    """Component id → the estimate's node values summed over positions."""
    found = {}
    for recorded in shared.tape.writers:
        values = estimate.nodes[recorded.id]  # (n, parts)
        kind = node_kind(recorded.kind, recorded.parts is not None)
        for column in range(values.shape[1]):
            part = -1 if recorded.parts is None else column
            found[component_of(kind, recorded.layer, part)] = float(values[:, column].sum())
    return found


def verify_scores(basis: Mapping[str, float], frozen: Mapping[str, float]) -> dict[str, float]:
    """Component id → ``|a − f| + (|a| + |f|) / 2`` from two estimates ``a`` (``basis``) and
    ``f`` (``frozen``) of its effect."""
    return {c: abs(basis[c] - frozen[c]) + (abs(basis[c]) + abs(frozen[c])) / 2 for c in basis}


def verified(shared: Shared, basis: str) -> Verified:
    """Patch for real the ``shared.verify_top`` components of each kind that ``basis``'s and
    the frozen estimates flag most (:func:`verify_scores`), and of the others the one of
    largest κ, among those ``"+exact"`` did not patch (once per basis: kept in the shared
    state); ``verify_top=0``: none."""
    return shared.once(f"+verify {basis}", lambda: _verify(shared, basis))


def _verify(shared: Shared, basis: str) -> Verified:
    done = real_patched(shared).components
    scores = verify_scores(_component_sums(shared.results[basis], shared),
                           _component_sums(shared.results["frozen"], shared))
    writers = {writer.id: writer for writer in shared.engine.points.read_stack()}
    moved = kappas(shared)
    by_kind: dict[str, list[tuple[float, float, str, str, int]]] = {}
    for recorded in shared.tape.writers:
        kind = node_kind(recorded.kind, recorded.parts is not None)
        parts = [-1] if recorded.parts is None else list(range(shared.parts(recorded)))
        for column, part in enumerate(parts):
            component = component_of(kind, recorded.layer, part)
            if component not in done:
                kappa = float(moved[recorded.id][:, column].max())
                by_kind.setdefault(kind, []).append((scores[component], kappa, component, recorded.id, part))
    chosen = []
    if shared.verify_top > 0:
        for rows in by_kind.values():
            ranked = sorted(rows, key=lambda row: -row[0])
            rest = ranked[shared.verify_top:]
            chosen += ranked[:shared.verify_top] + sorted(rest, key=lambda row: -row[1])[:1]
    found = Verified(passes=len(chosen))
    if chosen:
        base = corrupted_writers(shared)
        patches = [writer_patch(writers[writer_id], part, base) for *_, writer_id, part in chosen]
        value = float(shared.clean.value.detach()[0])
        patched = patched_values(shared.engine, shared.request, shared.request.target, patches)
        found.components = {row[2]: value - p for row, p in zip(chosen, patched)}
    return found


class VerifiedVariant(Estimator):
    """``X+verify``: ``X+exact`` with the components its estimates flag most patched for real
    (see the module documentation)."""

    basis: ClassVar[str]
    cost = ("X+exact's, the frozen pass (the graph's own), and one forward pass per verified component "
            "(verify_top + 1 of each kind)")

    def passes(self, shared: Shared) -> float:
        frozen = 0 if self.basis == "frozen" else 2  # the graph's own pass, forward and backward
        return get_estimator(self.variant_of).passes(shared) + frozen + verified(shared, self.basis).passes

    def seconds(self, own: float, shared: Shared, done: Mapping[str, float]) -> float:
        return done[self.variant_of] + shared.spent(f"+verify {self.basis}")

    def estimate(self, shared: Shared) -> Estimate:
        exact = shared.results[self.variant_of]
        components = dict(exact.components or {})
        components.update(verified(shared, self.basis).components)
        return Estimate(exact.nodes, components)


def verified_variant(basis: type[Estimator]) -> type[Estimator]:
    """The ``"+verify"`` variant of the linear estimator ``basis`` (a class to register; its
    ``"+exact"`` variant registered first)."""
    if not basis.linear:
        raise ValueError(f"only a linear estimator has a '+verify' variant, not {basis.name!r}")
    exact = f"{basis.name}+exact"
    return type(f"{basis.__name__}Verified", (VerifiedVariant,), {
        "__doc__": f"{exact}, with the components its and the frozen estimates flag most patched for real.",
        "name": f"{basis.name}+verify",
        "citation": f"{basis.citation}; the flagged components patched for real (AtP*'s second stage, "
                    "Kramár et al. 2024, arXiv:2403.00745)",
        "basis": basis.name, "variant_of": exact, "requires": (exact, basis.name, "frozen"),
        "__module__": basis.__module__})
