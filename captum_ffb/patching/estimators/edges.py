r"""The estimates of a graph's edges: each link ``A@p → B@q``'s estimated *path-patching*
effect, ``output(clean) − output(clean with only the target's input seeing the source's
corrupted write)``, by every estimator with ``edges`` (:func:`edge_estimates`); each linear one
is ``⟨J_Bᵀ G_B[q], δ_A[p]⟩`` (:func:`link_values`) with its own covectors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from captum_ffb.engine.autograd import sequence_shaped
from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.tape import (
    Covectors,
    GraphTape,
    part_covectors,
    part_pulled_back,
    pulled_back,
)
from captum_ffb.patching.estimators.base import EAP_IG_STEPS, Shared, estimator_names, get_estimator
from captum_ffb.patching.estimators.recorded import Differences, Recorded, differences, record

__all__ = ["ALL", "Link", "NodeKey", "edge_estimator_names", "edge_estimates", "link_of", "link_values", "writer_key"]

#: Node keys: ``(kind, layer, part, position)`` as in a graph's node table.
NodeKey = tuple[str, int, int, int]
#: The position of a node that stands for its component at every position.
ALL = -1


@dataclass(frozen=True)
class Link:
    """An edge of a graph: ``source`` writes the stream where ``target`` reads it.

    Attributes:
        source (tuple): ``(kind, layer, part, position)``: a ``"token"``, ``"head"``,
                    ``"attention"`` or ``"ff"`` node.
        target (tuple): a ``"head"``, ``"attention"`` or ``"ff"`` node, or ``("output", -1,
                    -1, -1)``.
    """

    source: NodeKey
    target: NodeKey


def writer_key(kind: str, layer: int) -> str:
    """The id of the writer a node of ``kind`` in block ``layer`` belongs to."""
    return f"block.{layer}.{'ff' if kind in ('ff', 'neuron') else 'attention'}"


def edge_estimator_names() -> tuple[str, ...]:
    """The registered estimators that estimate edges."""
    return tuple(name for name in estimator_names() if get_estimator(name).edges)


def edge_estimates(engine: BoundModel, request: Request, corrupted: Request, granularity: str,
                   links: Sequence[Link], estimators: Sequence[str], rules: Mapping[str, Callable] | None = None,
                   steps: int = EAP_IG_STEPS, clean: Recorded | None = None, corrupted_run: Recorded | None = None
                   ) -> dict[str, Tensor]:
    r"""Each link's estimated *path-patching* effect, ``output(clean) − output(clean with only
    the target's input seeing the source's corrupted write)``, under each estimator of
    ``estimators`` (those with ``edges``): for the linear ones ``⟨J_Bᵀ G_B[q], δ_A[p]⟩`` for a
    link ``A@p → B@q`` (``J_B`` ``B``'s map from the stream it reads to its output at ``q``,
    ``G_B`` the covector at that output; for ``B`` the output, ``A``'s direct covector): the
    frozen model's (``"frozen"``, the graph's edge weights with the write replaced by the
    patch; with ``rules``), the real model's at the clean input (``"atp"``: edge attribution
    patching, Syed et al. 2023), RelP's (``"relp"``) or EAP-IG's (the real ones averaged over
    ``steps`` interpolated passes, ``"eap-ig"``). Returns name → ``(k,)``."""
    if granularity == "neuron":
        raise ValueError("edge patching estimates are for head and sublayer graphs")
    known = edge_estimator_names()
    refused = [name for name in estimators if name not in known]
    if refused:
        raise ValueError(f"no edge estimator {refused[0]!r} ({', '.join(known)})")
    chosen = [get_estimator(name) for name in estimators]
    clean = clean if clean is not None else record(engine, request, granularity)
    corrupted_run = corrupted_run if corrupted_run is not None else record(engine, corrupted, granularity, grad=False)
    shared = Shared(engine=engine, request=request, granularity=granularity, clean=clean, corrupted=corrupted_run,
                    diff=differences(clean, corrupted_run), steps=steps, rules=rules)
    return {estimator.name: estimator.estimate_edges(shared, links) for estimator in chosen}


def link_values(tape: GraphTape, cov: Covectors, diff: Differences, links: Sequence[Link]) -> Tensor:
    """``⟨J_Bᵀ G_B[q], δ_A[p]⟩`` for each link, from one recorded pass with separate reads
    (``record(..., reads=True)``) and its covectors ``cov``; a position ``ALL`` (``-1``) sums over
    the positions (a source's write at every position, a target's output at every one: the
    position-agnostic edges of a component graph). The targets of one writer are pulled back
    together (one batched vector–Jacobian product)."""
    index = {w.id: k for k, w in enumerate(tape.writers)}
    values = torch.zeros(len(links), dtype=torch.float64)
    by_target: dict[NodeKey, list[int]] = {}
    for k, link in enumerate(links):
        by_target.setdefault(link.target, []).append(k)
    by_writer: dict[str, list[NodeKey]] = {}
    for target in by_target:
        by_writer.setdefault("output" if target[0] == "output" else writer_key(target[0], target[1]), []).append(target)
    for key, targets in by_writer.items():
        for target, pulled in zip(targets, _pulled(tape, cov, index, key, targets)):
            for k in by_target[target]:
                values[k] = _link_value(pulled, diff, links[k].source)
    return values


def _pulled(tape: GraphTape, cov: Covectors, index: dict[str, int], key: str, targets: list[NodeKey]
            ) -> list[dict[str, Tensor]]:
    """For each target node of one writer (or of the output): the covectors its cotangent
    pulls back to every earlier writer's output and to the first block's input (``(n, d)``)."""
    if key == "output":
        pulled = {w.id: sequence_shaped(cov.direct[w.id].detach(), w.n)[0] for w in tape.writers}
        pulled["inputs"] = cov.direct["inputs"].detach()[0]
        return [pulled] * len(targets)
    i = index[key]
    writer = tape.writers[i]
    total = cov.total[writer.id]
    if targets[0][0] == "head":
        gz = part_covectors(tape, i, total)  # (1, n, p, w)
        cot = torch.zeros((len(targets), *gz.shape), dtype=gz.dtype, device=gz.device)
        for row, (_, _, part, q) in enumerate(targets):
            where = slice(None) if q == ALL else q
            cot[row, 0, where, part] = gz[0, where, part]
        _, back = part_pulled_back(tape, i, cot)
    else:
        seq = sequence_shaped(total, writer.n)
        cot = torch.zeros((len(targets), *seq.shape), dtype=seq.dtype, device=seq.device)
        for row, (_, _, _, q) in enumerate(targets):
            where = slice(None) if q == ALL else q
            cot[row, 0, where] = seq[0, where]
        _, back = pulled_back(tape, i, cot.reshape(len(targets), *total.shape))
    found = []
    for row in range(len(targets)):
        pulled = {w.id: sequence_shaped(c[row], w.n)[0] for w, c in zip(tape.writers[:i], back[:i])}
        pulled["inputs"] = back[i][row, 0]
        found.append(pulled)
    return found


def _link_value(pulled: dict[str, Tensor], diff: Differences, source: NodeKey) -> float:
    """``⟨covector, δ⟩`` at a source node (its position, or all of them)."""
    s_kind, s_layer, s_part, p = source
    where = slice(None) if p == ALL else p
    if s_kind == "token":
        covector, delta = pulled["inputs"][where], diff.inputs[where]
    else:
        key = writer_key(s_kind, s_layer)
        if key not in pulled:
            return 0.0  # a source after its target: no edge
        covector = pulled[key][where]
        delta = diff.writes[key][where, s_part] if s_kind == "head" else diff.outputs[key][where]
    return float((covector.double() * delta.double()).sum())


def link_of(kinds: Sequence[str], layers: Sequence[int], heads: Sequence[int], positions: Sequence[int],
            source: int, target: int) -> Link:
    """The :class:`Link` of a graph's edge between node indices ``source`` and ``target``."""
    def key(k: int) -> NodeKey:
        return (kinds[k], int(layers[k]), int(heads[k]), int(positions[k]))

    return Link(key(source), key(target))
