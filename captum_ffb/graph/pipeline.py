"""The graph feature's one entry: :func:`build` runs the recorded pass, its covectors, every node
and edge, and (with a corrupted run) the nodes' patching estimates, for a bound model."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from captum_ffb.core.vocabulary import check_granularity
from captum_ffb.engine.bound import BoundModel, Request
from captum_ffb.engine.fingerprint import weights_stamp
from captum_ffb.engine.tape import (
    covectors,
    graph_pass,
    players_of,
    target_probability,
    unit_covectors,
)
from captum_ffb.graph.build import GraphData, build_graph
from captum_ffb.graph.lens import Lens, write_lens
from captum_ffb.graph.score_split import ScoreSplitter
from captum_ffb.patching.patches import (
    EXACT_ABOVE,
    VERIFY_TOP,
    PatchEstimates,
    check_estimators,
    patch_estimates,
)

__all__ = ["BuiltGraph", "GraphOptions", "build", "check_graph_options"]


@dataclass(frozen=True)
class GraphOptions:
    """What a graph is built with (checked at the door).

    Attributes:
        rules (Mapping): the rules by role (the attention's freezes the probabilities).
        granularity (str): ``"sublayer"``, ``"head"`` or ``"neuron"``.
        max_nodes (int, optional): the edges of at most this many writer nodes are computed.
        corrupted (Request, optional): the corrupted run of the patching estimates.
        exact_above (float): a ``"+exact"`` estimator patches for real above this κ.
        verify_top (int): the components of each kind a ``"+verify"`` estimator patches for real.
        exclude_positions (tuple[int, ...]): the writers ``max_nodes`` chooses last.
        estimators (tuple[str, ...], optional): the patching estimators (``None``: the default).
        logits (bool): the target sums several logits (:class:`~captum_ffb.explained.readouts.TopLogits`):
                    a ``logit`` node each, whose direct edges are split by the unit.
    """

    rules: Mapping[str, Callable]
    granularity: str
    max_nodes: int | None = None
    corrupted: Request | None = None
    exact_above: float = EXACT_ABOVE
    exclude_positions: tuple[int, ...] = ()
    estimators: Sequence[str] | None = field(default=None)
    logits: bool = False
    verify_top: int = VERIFY_TOP


@dataclass
class BuiltGraph:
    """An attribution graph as the engine computed it.

    Attributes:
        data (GraphData): every node and edge (on the CPU).
        splitter (ScoreSplitter): splits the heads' scores (bound to the model and the input).
        estimates (PatchEstimates, optional): the nodes' patching estimates (with a corrupted run).
        probability (float, optional): the model's probability of the explained unit.
        n_source (int, optional): an encoder–decoder's source length.
        lens (dict): node index → the token ids its write promotes and suppresses
                    (:func:`~captum_ffb.graph.lens.write_lens`).
    """

    data: GraphData
    splitter: ScoreSplitter
    estimates: PatchEstimates | None
    probability: float | None
    n_source: int | None
    lens: Lens = field(default_factory=dict)


def build(engine: BoundModel, request: Request, options: GraphOptions) -> BuiltGraph:
    """The exact attribution graph of ``request.target`` (batch of one): one frozen pass with
    every writer reading the stream through a leaf of its own, its covectors, every node and
    edge (:func:`~captum_ffb.graph.build.build_graph`, the edges of at most ``max_nodes``
    writer nodes), with a corrupted run the nodes' patching estimates, and the splitter of
    the heads' scores, both bound to the model's weights as they are now (their stamp)."""
    stamp = weights_stamp(engine.model)
    tape = graph_pass(engine, request, request.target, options.rules, options.granularity)
    engine.check_players(request, tape.leaves)
    found = covectors(tape)
    players = players_of(engine, request, tape)
    logits = []
    if options.logits:
        position = int(request.target.positions.reshape(-1)[0])
        units = [int(u) for u in request.target.indices[0]]  # the vocabulary's ids (the tape's may be re-indexed)
        logits = [(unit, position, term, split) for unit, (term, split) in zip(units, unit_covectors(engine, tape))]
    data = build_graph(tape, found, players, max_nodes=options.max_nodes,
                       exclude_positions=options.exclude_positions,
                       memory_budget=getattr(engine, "memory_budget", None), logits=logits)
    estimates = None
    if options.corrupted is not None:
        engine.refuse_two_stacks("patching estimates")
        estimates = patch_estimates(engine, request, options.corrupted, tape, found, data, options.granularity,
                                    options.exact_above, options.estimators, stamp=stamp,
                                    verify_top=options.verify_top)
    n_source = None if tape.source_inputs is None else int(tape.source_inputs.shape[1])
    lens = write_lens(engine, tape, data.kinds, data.layers, data.heads, data.positions, data.values,
                      computed=data.computed)
    splitter = ScoreSplitter(engine, request, options.rules, options.granularity, players, stamp)
    probability = target_probability(tape.output, tape.target)
    if probability is None and tape.target.mix is not None:  # an answer's log-probability: its probability
        probability = math.exp(float(tape.value.detach().reshape(-1)[0]))
    return BuiltGraph(data, splitter, estimates, probability, n_source, lens)


def check_graph_options(granularity: str, prune: Any, node_threshold: Any, edge_threshold: Any, max_nodes: Any,
                        corrupted: bool, exact_above: Any, estimators: Any, verify_top: Any = None
                        ) -> tuple[float, tuple[str, ...], int]:
    """:meth:`~captum_ffb.attr.NormDecomposition.attribute_graph`'s options checked (one-line errors naming each):
    returns ``exact_above`` and ``verify_top`` (their defaults filled in) and the estimators to compute."""
    if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1):
        raise ValueError(f"max_nodes must be a positive number of nodes, got {max_nodes!r}")
    for name, share in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if isinstance(share, bool) or not isinstance(share, (int, float)):
            raise TypeError(f"{name} must be a number between 0 and 1, got {type(share).__name__}")
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must lie between 0 and 1, got {share}")
    if not isinstance(prune, bool):
        raise TypeError(f"prune must be True or False, got {prune!r}")
    check_granularity(granularity, "graph")
    if not corrupted:
        given = [name for name, value in (("estimators", estimators), ("exact_above", exact_above),
                                          ("verify_top", verify_top)) if value is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} {'set' if len(given) > 1 else 'sets'} up patching "
                             "estimates, which need corrupted_inputs (a corrupted input of the same length)")
    exact_above = EXACT_ABOVE if exact_above is None else exact_above
    if isinstance(exact_above, bool) or not isinstance(exact_above, (int, float)) or not exact_above > 0:
        raise ValueError(f"exact_above must be a positive number (math.inf: never patch for real), got "
                         f"{exact_above!r}")
    verify_top = VERIFY_TOP if verify_top is None else verify_top
    if isinstance(verify_top, bool) or not isinstance(verify_top, int) or verify_top < 0:
        raise ValueError(f"verify_top must be a number of components (0: none), got {verify_top!r}")
    return exact_above, check_estimators(estimators), verify_top
