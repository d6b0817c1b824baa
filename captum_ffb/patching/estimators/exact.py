r"""The ``"+exact"`` variant of a linear estimator, and every node's κ.

``κ_A = ‖write_A − write_A^c‖ / ‖stream just after A writes‖`` says how far a node's patch
moves the stream. Where it exceeds ``exact_above`` a gradient at the clean point says little (a
new massive activation, a saturated norm), and ``"X+exact"`` is ``X`` except that such a node
is patched for real, one forward pass each; a component whose κ exceeds it at some position
is patched for real at every position too, for its total (patching every position at once is
not the sum of patching each). The real passes are run once for every ``"+exact"`` variant.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from captum_ffb.core.keys import NodeId, WriterKind
from captum_ffb.core.vocabulary import component_of
from captum_ffb.engine.autograd import sequence_shaped
from captum_ffb.patching.estimators.base import Estimate, Estimator, Shared, get_estimator
from captum_ffb.patching.real import Patch, RealWriters, patched_values, writer_patch

__all__ = ["ExactVariant", "RealPatched", "corrupted_writers", "exact_variant", "kappas", "node_kind", "real_patched"]


def node_kind(writer_kind: str, split: bool) -> str:
    """The kind of a writer's nodes: its own, or ``"head"`` / ``"neuron"`` for its parts."""
    if not split:
        return writer_kind
    return WriterKind(writer_kind).part_kind


def kappas(shared: Shared) -> dict[str, Tensor]:
    """Writer id → ``(n, parts)`` each node's κ (on the CPU), from the graph's own pass (once:
    kept in the shared state)."""
    return shared.once("kappa", lambda: _kappas(shared))


def _kappas(shared: Shared) -> dict[str, Tensor]:
    tape, diff = shared.tape, shared.diff
    found = {}
    for k, recorded in enumerate(tape.writers):
        after = tape.stream_after(k)[0].norm(dim=-1).clamp(min=1e-30)  # (n,)
        if recorded.parts is None:
            moved = (diff.outputs[recorded.id].norm(dim=-1) / after)[:, None]  # (n, 1)
        else:
            moved = tape.part_writes(k, diff.parts[recorded.id][None]).norm(dim=-1) / after[:, None]  # (n, p)
        found[recorded.id] = moved.detach().cpu()
    return found


@dataclass
class RealPatched:
    """The real patched passes of the nodes and components whose κ exceeds ``exact_above``.

    Attributes:
        nodes (dict): writer id → {(position, column): the node's real effect}.
        components (dict): component id → its real effect (every position patched).
        passes (int): the patched passes run.
    """

    nodes: dict[str, dict[tuple[int, int], float]] = field(default_factory=dict)
    components: dict[str, float] = field(default_factory=dict)
    passes: int = 0


def real_patched(shared: Shared) -> RealPatched:
    """Patch for real every node (of the graph) and component whose κ exceeds
    ``shared.exact_above`` (once: kept in the shared state)."""
    return shared.once("+exact", lambda: _patch_for_real(shared))


def corrupted_writers(shared: Shared) -> RealWriters:
    """The corrupted run's writers' outputs (and parts): what a real patch takes."""
    run = shared.corrupted
    return RealWriters(run.value, {w.id: sequence_shaped(w.output.detach(), w.n) for w in run.tape.writers},
                       {w.id: w.parts.detach() for w in run.tape.writers if w.parts is not None})


def _patch_for_real(shared: Shared) -> RealPatched:
    moved = kappas(shared)
    writers = {writer.id: writer for writer in shared.engine.points.read_stack()}
    base = corrupted_writers(shared)
    what: list[tuple[str, int, int] | str] = []  # (writer id, position, column) of a node; a component's id
    patches: list[Patch] = []
    for recorded in shared.tape.writers:
        kind = node_kind(recorded.kind, recorded.parts is not None)
        parts = [-1] if recorded.parts is None else list(range(shared.parts(recorded)))
        kappa = moved[recorded.id]
        for column, part in enumerate(parts):
            patch = writer_patch(writers[recorded.id], part, base)
            for p in range(shared.positions):
                node = NodeId(kind, recorded.layer, part, p)
                if node in shared.nodes and float(kappa[p, column]) > shared.exact_above:
                    what.append((recorded.id, p, column))
                    patches.append(replace(patch, position=p))
            if float(kappa[:, column].max()) > shared.exact_above:
                what.append(component_of(kind, recorded.layer, part))
                patches.append(patch)
    found = RealPatched(passes=len(patches))
    if patches:
        value = float(shared.clean.value.detach()[0])
        request = shared.request
        for where, patched in zip(what, patched_values(shared.engine, request, request.target, patches)):
            if isinstance(where, str):
                found.components[where] = value - patched
            else:
                found.nodes.setdefault(where[0], {})[where[1:]] = value - patched
    return found


class ExactVariant(Estimator):
    """``X+exact``: the linear estimator :attr:`variant_of`, with the nodes and components whose
    κ exceeds ``exact_above`` patched for real (see the module documentation)."""

    cost = "the basis's, and one forward pass per node or component whose κ exceeds exact_above"

    def passes(self, shared: Shared) -> float:
        return get_estimator(self.variant_of).passes(shared) + real_patched(shared).passes

    def seconds(self, own: float, shared: Shared, done: Mapping[str, float]) -> float:
        return done[self.variant_of] + shared.spent("+exact")

    def estimate(self, shared: Shared) -> Estimate:
        real = real_patched(shared)
        nodes = {}
        for key, values in shared.results[self.variant_of].nodes.items():
            values = values.detach().to("cpu", torch.float64, copy=True)  # one rounding to the graph's dtype
            for (p, column), effect in real.nodes.get(key, {}).items():
                values[p, column] = effect
            nodes[key] = values
        return Estimate(nodes, dict(real.components))


def exact_variant(basis: type[Estimator]) -> type[Estimator]:
    """The ``"+exact"`` variant of the linear estimator ``basis`` (a class to register)."""
    if not basis.linear:
        raise ValueError(f"only a linear estimator has a '+exact' variant, not {basis.name!r}")
    return type(f"{basis.__name__}Exact", (ExactVariant,), {
        "__doc__": f"{basis.name}, with the nodes whose κ exceeds exact_above patched for real.",
        "name": f"{basis.name}+exact", "citation": f"{basis.citation}; nodes with κ > exact_above patched for real",
        "variant_of": basis.name, "requires": (basis.name,), "__module__": basis.__module__})
