r"""``AttributionGraph``: an exact attribution graph of the stock model, its pruning and its
exports (the engine's numbers, :mod:`captum_ffb.engine.tape`, behind one object).

Nodes: the tokens (players, measured from the chosen reference), each writer of the residual
stream at each position (an attention sublayer or its heads, an FF block or its neurons),
the bias (the model's own bias terms) and the explained output. Every node's value is its
total effect on the output; every edge is exact; every node conserves flow (its in-edges
and its bias edge add up to its value, its out-edges and its direct edge to the output too):
no error node. Pruning follows circuit-tracer's (node influence, then edge influence, with
the thresholds as parameters) and says what share of the output the kept graph holds.

A graph is saved to one file and loaded again (:meth:`AttributionGraph.save`,
:meth:`AttributionGraph.load`, :mod:`captum_ffb.graph.files`), ranks its components and
nodes (:meth:`AttributionGraph.ranking`) and names the TransformerLens hook of each node
(:meth:`AttributionGraph.hook_name`).
"""

from __future__ import annotations

import heapq
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from captum_ffb.core.keys import ENDS, is_writer_node
from captum_ffb.core.pieces import token_text
from captum_ffb.core.vocabulary import component_of, node_id, old_node_id
from captum_ffb.graph.bound import bound_engine, bound_scorer, origin_of
from captum_ffb.graph.build import GraphData, prune_masks
from captum_ffb.graph.files import read_graph, save_graph
from captum_ffb.graph.target import GraphTarget, HookSite
from captum_ffb.patching.patches import DEFAULT_EDGE_ESTIMATOR, DEFAULT_ESTIMATOR, EDGE_ESTIMATORS

#: circuit-tracer's defaults: keep the nodes that hold this share of the influence on the
#: output, then the edges that hold this share.
NODE_THRESHOLD, EDGE_THRESHOLD = 0.8, 0.98
#: A pruned graph computes the edges of this many writer nodes (those of largest ``|value|``;
#: the rest send what they send as "left out"): pruning keeps far fewer, and the edges are
#: the graph's cost. An unpruned graph computes every node's edges unless told otherwise.
DEFAULT_MAX_NODES = 256
#: :meth:`~captum_ffb.graph.record.AttributionGraph.to_dict` refuses more kept links than this (a link is about 2.5 kB
#: as a dict and in JSON: 5.2 GB for SmolLM2's 2.1 M at 10 tokens); prune, or ``save()``.
MAX_DICT_LINKS = 500_000
#: What :meth:`AttributionGraph.ranking` ranks by, and at which level.
RANK_BY, RANK_LEVELS = ("value", "patch"), ("component", "node")


@dataclass(frozen=True, repr=False)
class AttributionGraph:
    r"""An exact attribution graph of one explained output: a passive record (data only).

    What needs the model (score splits, edge estimates, path patching) is a bound graph's
    (:class:`BoundGraph`: :meth:`bind`, or what ``attribute_graph`` returns); views and
    pruning return new graphs.

    Attributes:
        data (~captum_ffb.graph.build.GraphData): every node and edge (the engine's numbers).
        tokens (list[str]): the input tokens (labels of the token nodes).
        output_label (str): what is explained, in words (a token, a class).
        granularity (str): ``"sublayer"``, ``"head"`` or ``"neuron"``.
        node_mask (Tensor): ``(N,)`` bool, the nodes kept (all of them before pruning).
        edge_mask (Tensor): ``(E,)`` bool, the edges kept.
        influence (Tensor, optional): ``(N,)`` each node's influence on the output
                    (circuit-tracer's, after pruning).
        patch_estimates (dict): estimator name → ``(N,)`` each node's estimated effect of
                    patching it from the corrupted run (``corrupted_inputs``).
        patch_kappa (Tensor, optional): ``(N,)`` each node's κ, how far its patch moves the
                    stream relative to the stream (:mod:`captum_ffb.patching.patches`).
        patch_components (dict): estimator name → {component id: effect} for the components
                    that estimator patched for real at every position (``"atp+exact"``,
                    ``"atp+verify"``).
        thresholds (dict): the pruning's parameters.
        qk_links (list): the query–key pairs attached as links of their own kind.
        probability (float, optional): the model's probability of the explained token (or
                    class), when one unit is read.
        token_ids (list[int], optional): the input's token ids.
        n_source (int, optional): an encoder–decoder's source length (positions
                    ``0 … n_source − 1`` are the source's, the rest the target's).
        target (GraphTarget, optional): what is explained (units, position, texts).
        excluded_positions (tuple[int, ...]): positions whose writer nodes are set aside from
                    pruning and ranking (an attention sink's, ``exclude_positions=``).
        origin (dict, optional): what :meth:`bind` needs to bind a loaded graph to its model
                    again (the input, reference, rules and the weights' fingerprint).
        patch_seconds (dict): estimator name → the seconds its node estimates took.
        patch_passes (dict): estimator name → the model passes they ran (a ``"+exact"``
                    estimator's real patched passes included).
        edge_patches (dict): estimator name → ``(E,)`` the edges' estimates known (``nan``
                    where not computed).
        lens (dict): node index → ``(promoted, suppressed)``: the tokens (as text) its write
                    promotes and suppresses most through the unembedding
                    (:mod:`captum_ffb.graph.lens`; writer nodes of a causal LM only).
    """

    data: GraphData
    tokens: list[str]
    output_label: str
    granularity: str
    node_mask: Tensor
    edge_mask: Tensor
    influence: Tensor | None = None
    patch_estimates: dict[str, Tensor] = field(default_factory=dict)
    patch_kappa: Tensor | None = None
    patch_components: dict[str, dict[str, float]] = field(default_factory=dict)
    thresholds: dict[str, Any] = field(default_factory=dict)
    qk_links: list[dict[str, Any]] = field(default_factory=list)
    probability: float | None = None
    token_ids: list[int] | None = None
    n_source: int | None = None
    target: GraphTarget | None = None
    excluded_positions: tuple[int, ...] = ()
    origin: dict[str, Any] | None = None
    patch_seconds: dict[str, float] = field(default_factory=dict)
    patch_passes: dict[str, float] = field(default_factory=dict)
    edge_patches: dict[str, Tensor] = field(default_factory=dict)
    lens: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)

    @classmethod
    def of(cls, data: GraphData, tokens: list[str], output_label: str, granularity: str, **extra: Any
           ) -> AttributionGraph:
        """The unpruned graph of ``data``."""
        device = data.values.device
        return cls(data, tokens, output_label, granularity, _shown(data),
                   torch.ones(len(data.weights), dtype=torch.bool, device=device),
                   **extra)

    def __repr__(self) -> str:
        """One line: what is explained, the value, the granularity, what is kept."""
        d = self.data
        share = self.kept_share
        extra = [f"patch estimates: {', '.join(self.patch_estimates)}"] if self.patch_estimates else []
        if self.excluded_positions:
            extra.append(f"positions set aside: {', '.join(map(str, self.excluded_positions))}")
        extra.append("bound to its model" if self.bound else "not bound to a model")
        target = self.target
        contrast = target is not None and target.texts and target.kind != "answer" and \
            tuple(target.coefficients) == (1.0, -1.0)
        label = " − ".join(target.texts) if contrast else self.output_label
        return (f"{type(self).__name__}({label!r}, value {self.value:.4g}, {self.granularity} granularity, "
                f"{len(self.tokens)} tokens, {int(self.node_mask.sum())} of {len(d)} nodes and "
                f"{int(self.edge_mask.sum())} of {len(d.weights)} edges kept"
                + (f" ({share:.1%} of the value)" if math.isfinite(share) else "") + "; " + "; ".join(extra) + ")")

    # ------------------------------------------------------------------ reading it
    @property
    def value(self) -> float:
        """The explained output's value."""
        return float(self.data.values[self.data.output])

    def ids(self) -> list[str]:
        """Every node's id (:func:`~captum_ffb.core.vocabulary.node_id`: ``token@<p>``,
        ``block.<l>.attention.head.<h>@<p>``, ``block.<l>.ff@<p>``, ``bias``, ``output``)."""
        d = self.data
        return [node_id(k, layer, part, p) for k, layer, part, p in zip(d.kinds, d.layers, d.heads, d.positions)]

    def index(self, node: str) -> int:
        """The index of the node ``node`` (an id; an id of before 0.4, ``block.3.head.2.5``,
        is read with a ``DeprecationWarning``)."""
        if not isinstance(node, str):
            raise TypeError(f"node must be a node id (a string), got {type(node).__name__}")
        ids = self.ids()
        if node not in ids:
            renamed = old_node_id(node)
            if renamed is not None and renamed in ids:
                warnings.warn(f"node id {node!r} is {renamed!r} now (ids are '<component>@<position>'); the old "
                              "ids stop working in 0.5", DeprecationWarning, stacklevel=3)
                node = renamed
        try:
            return ids.index(node)
        except ValueError:
            raise ValueError(f"no node {node!r} in this graph") from None

    def flow(self) -> tuple[Tensor, Tensor]:
        """``(in-flow, out-flow)`` of every node over the whole graph (the bias edges, the
        direct edges to the output and what ``max_nodes`` left out included): each equals the
        node's value, except at the writer nodes whose edges ``max_nodes`` did not compute
        (they have none)."""
        d = self.data
        inflow = d.weights.new_zeros(len(d)).index_add_(0, d.targets, d.weights)
        if d.left_out is not None:
            inflow = inflow + d.left_out.to(inflow.dtype)
        outflow = d.weights.new_zeros(len(d)).index_add_(0, d.sources, d.weights)
        return inflow, outflow

    def flow_residual(self) -> float:
        """The largest ``|in-flow − value|`` over the writer nodes whose edges were computed and
        the output, and, when every node's edges were (``max_nodes`` not reached), the largest
        ``|out-flow − value|`` over the tokens and the writers too: zero up to rounding."""
        d = self.data
        inflow, outflow = self.flow()
        writers = torch.tensor([is_writer_node(k) for k in d.kinds], device=d.values.device)
        receives = writers.clone() if d.computed is None else writers & d.computed
        receives[d.output] = True
        receives |= torch.tensor([k == "logit" for k in d.kinds], device=d.values.device)
        residual = float((inflow - d.values)[receives].abs().max())
        if d.computed is None:
            sends = writers | torch.tensor([k == "token" for k in d.kinds], device=d.values.device)
            residual = max(residual, float((outflow - d.values)[sends].abs().max()))
        return residual

    def edges_of(self, node: str) -> dict[str, list[tuple[str, float]]]:
        """A node's kept edges: ``{"in": [(source, weight)], "out": [(target, weight)]}``,
        largest first."""
        k = self.index(node)
        ids = self.ids()
        d = self.data
        kept = self.edge_mask
        into = [(ids[int(s)], float(w)) for s, t, w, m in zip(d.sources, d.targets, d.weights, kept) if m and int(t) == k]
        out = [(ids[int(t)], float(w)) for s, t, w, m in zip(d.sources, d.targets, d.weights, kept) if m and int(s) == k]
        return {"in": sorted(into, key=lambda e: -abs(e[1])), "out": sorted(out, key=lambda e: -abs(e[1]))}

    @property
    def kept_share(self) -> float:
        """The share of the output's value its kept in-edges carry (1 before pruning): the
        signed sum of the kept direct edges into the output over the value. Signed edges
        cancel, so a pruned graph may hold more than 100% (it dropped edges that pull the
        other way; a contrast ``logit(A) − logit(B)`` does so readily) or less than 0%:
        :attr:`kept_abs_share` is the share of the output's edges' ``|weight|``, between 0
        and 1."""
        d = self.data
        into = _into_output(d) & self.edge_mask
        return float(d.weights[into].sum()) / self.value if self.value else float("nan")

    @property
    def kept_abs_share(self) -> float:
        """The share of ``Σ |weight|`` over the output's in-edges that its kept in-edges carry
        (what ``max_nodes`` left out counted among the in-edges): between 0 and 1, 1 before
        pruning when every node's edges were computed."""
        d = self.data
        into = _into_output(d)
        total = float(d.weights[into].abs().sum())
        if d.left_out is not None:
            total += sum(abs(float(d.left_out[k])) for k in _sinks(d))
        kept = float(d.weights[into & self.edge_mask & self.node_mask[d.sources]].abs().sum())
        return kept / total if total else float("nan")

    def component_estimates(self, estimator: str = "default") -> dict[str, float]:
        """Patching estimates summed over positions: component id (``block.<l>.attention.head.<h>``,
        ``block.<l>.attention``, ``block.<l>.ff``) → the estimated effect of patching the
        component at every position (what :func:`~captum_ffb.baselines.activation_patching`
        measures): the nodes' estimates added over positions, except for the components the
        estimator patched for real at every position (``"atp+exact"``, where some node's κ
        exceeds ``exact_above``; ``"atp+verify"``, those and the ones its estimates flag),
        whose effect is that pass's."""
        self._check_estimator(estimator, "component_estimates")
        d = self.data
        found: dict[str, float] = {}
        for k, value in enumerate(self.patch_estimates[estimator].tolist()):
            if d.kinds[k] in ("head", "attention", "ff", "neuron"):
                name = component_of(d.kinds[k], d.layers[k], d.heads[k])
                found[name] = found.get(name, 0.0) + value
        found.update(self.patch_components.get(estimator, {}))
        return found

    # ------------------------------------------------------------------ pruning
    def prune(self, node_threshold: float = NODE_THRESHOLD, edge_threshold: float = EDGE_THRESHOLD, *,
              exclude_positions: Sequence[int] | None = None) -> AttributionGraph:
        """The graph pruned as circuit-tracer prunes: nodes by their influence on the output
        (absolute edge weights, each node's in-edges normalised, influence summed over
        paths) until ``node_threshold`` of it is kept, then edges by their influence until
        ``edge_threshold``; tokens, the bias and the output always stay; nodes left without
        an edge go.

        Pruning starts again from every node whose edges were computed (a pruned or loaded
        graph is re-pruned, not pruned further). The shares are of the influence of the nodes
        whose edges were computed: a graph built with ``max_nodes`` (the default of
        ``attribute_graph(prune=True)``: 256 writers) prunes among those only, and so keeps
        fewer nodes than the graph of every node pruned with the same thresholds (docs/graphs.md,
        "Which graph is the circuit").

        Args:
            node_threshold, edge_threshold (float): the shares of influence kept.
            exclude_positions (list[int], optional): positions whose writer nodes are set
                        aside (an attention sink's, e.g. ``[0]``): pruning runs on the graph
                        without them, and :meth:`ranking` skips them (``None``: the graph's
                        own :attr:`excluded_positions`; ``()``: none).
        """
        for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number between 0 and 1, got {type(value).__name__}")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie between 0 and 1, got {value}")
        excluded = self.excluded_positions if exclude_positions is None else \
            check_positions(exclude_positions, len(self.tokens))
        candidates = _shown(self.data) & ~self._at_positions(excluded)
        every_edge = torch.ones_like(self.edge_mask)
        node_mask, edge_mask, influence = prune_masks(self.data, candidates, every_edge, node_threshold,
                                                      edge_threshold)
        computed = None if self.data.computed is None else int(self.data.computed.sum())
        return replace(self, node_mask=node_mask, edge_mask=edge_mask, influence=influence,
                       thresholds={"node_threshold": node_threshold, "edge_threshold": edge_threshold,
                                   "max_nodes": computed},
                       excluded_positions=excluded)

    def _at_positions(self, positions: Sequence[int]) -> Tensor:
        """``(N,)`` bool: the writer nodes at ``positions``."""
        d = self.data
        chosen = set(positions)
        return torch.tensor([is_writer_node(k) and p in chosen for k, p in zip(d.kinds, d.positions)],
                            dtype=torch.bool, device=d.values.device)

    # ------------------------------------------------------------------ query–key pairs
    def score_split(self, layer: int, head: int, query_position: int, key_position: int) -> dict[Any, float]:
        """``{(query node id, key node id): value}``: the pre-softmax score of head ``head`` of
        block ``layer`` at query position ``query_position`` and key position
        ``key_position`` split exactly over pairs of writers at the two positions (with the
        norm scales frozen a score is bilinear in them; rotary is a fixed rotation per
        position), the bias terms under ``"bias"``; the values add up to the model's score."""
        raise _not_bound("score splits")

    def attention(self, layer: int, head: int, query_position: int) -> Tensor:
        """``(n,)`` where head ``head`` of block ``layer`` looks from ``query_position``: its
        attention probabilities over the key positions."""
        raise _not_bound("attention probabilities")

    def query_key_pairs(self, heads: int = 12, keys: int = 2, top: int = 5) -> dict[str, list[dict[str, Any]]]:
        """For the ``heads`` kept head nodes of largest ``|value|``: at the ``keys`` key
        positions the head attends most, the score's ``top`` writer pairs. Head node id →
        ``[{"key_position", "probability", "score", "pairs": [{"query", "key", "value"}]}]``
        (``score`` the whole pre-softmax score, the pairs' values add up to it with the rest)."""
        for name, value in (("heads", heads), ("keys", keys), ("top", top)):
            _count(value, name)
        d = self.data
        chosen = [k for k in self.node_mask.nonzero()[:, 0].tolist() if d.kinds[k] == "head"]
        chosen = sorted(chosen, key=lambda k: -abs(float(d.values[k])))[:heads]
        found: dict[str, list[dict[str, Any]]] = {}
        for k in chosen:
            layer, head, position = d.layers[k], d.heads[k], d.positions[k]
            probabilities = self.attention(layer, head, position)
            entries = []
            seen = [key for key in probabilities.argsort(descending=True)[:keys].tolist()
                    if float(probabilities[key]) > 0]  # a masked key takes no part
            for key in seen:
                split = self.score_split(layer, head, position, key)
                pairs = heapq.nlargest(top, split.items(), key=lambda kv: abs(kv[1]))
                entries.append({"key_position": key, "probability": float(probabilities[key]),
                                "score": sum(split.values()),
                                "pairs": [{"query": q, "key": s, "value": v} for (q, s), v in pairs]})
            found[node_id("head", layer, head, position)] = entries
        return found

    def attach_score_pairs(self, layer: int, head: int, query_position: int, key_position: int,
                           top: int = 5) -> list[dict[str, Any]]:
        """The ``top`` query–key pairs of a head's score attached as links (a bound graph's:
        :meth:`BoundGraph.attach_score_pairs`)."""
        raise _not_bound("score splits")

    # ------------------------------------------------------------------ exports
    def to_dict(self, max_links: int | None = MAX_DICT_LINKS) -> dict[str, Any]:
        """``{"nodes": [...], "links": [...], ...}``: every kept node (``id``, ``kind``,
        ``layer``, ``head``, ``position``, ``value``, with ``token``, ``influence`` and
        ``patch_estimate`` where known; the output node at the explained position, with its
        ``token_id`` or ``class_index``) and every kept edge (``source``, ``target``,
        ``weight``; query–key links with ``"kind": "qk"``). A new dict: changing it changes
        nothing of the graph; a share that is not a number (the value 0) is ``None``.

        Args:
            max_links (int, optional): refuse (a ``ValueError``) a graph keeping more links
                        than this (:data:`~captum_ffb.graph.record.MAX_DICT_LINKS`): as dicts
                        they would not fit in memory; prune it, or write it with
                        :meth:`save`. ``None``: no limit.
        """
        d = self.data
        shown = self.kept_links(_limit(max_links, "max_links"))
        ids = self.ids()
        nodes = []
        for k in self.node_mask.nonzero()[:, 0].tolist():
            node = {"id": ids[k], "kind": d.kinds[k], "layer": d.layers[k], "head": d.heads[k],
                    "position": d.positions[k], "value": float(d.values[k])}
            if d.kinds[k] == "token":
                node["token"] = self.tokens[d.positions[k]]
            if d.kinds[k] == "output":
                node["token"] = self.output_label
                node.update(self._output_fields())
            if d.kinds[k] == "logit":
                node.update(self._logit_fields(k))
            if self.influence is not None:
                node["influence"] = float(self.influence[k])
            if self.patch_estimates and is_writer_node(d.kinds[k]):
                node["patch_estimate"] = float(self.patch_estimates["default"][k])
                node["patch_estimates"] = {name: float(v[k]) for name, v in self.patch_estimates.items()}
                if self.patch_kappa is not None:
                    node["patch_kappa"] = float(self.patch_kappa[k])
            if k in self.lens:
                node["promotes"], node["suppresses"] = (list(t) for t in self.lens[k])
            nodes.append(node)
        links = [{"source": ids[int(s)], "target": ids[int(t)], "weight": float(w)}
                 for s, t, w in zip(d.sources[shown], d.targets[shown], d.weights[shown])]
        if self.has_edge_estimates:  # the shown edges' patch estimates (the default's)
            estimates = self.edge_patch_estimates(edges=shown.nonzero()[:, 0])[shown]
            for link, value in zip(links, estimates.tolist()):
                if value == value:  # not nan (the bias's edges have none)
                    link["patch_estimate"] = value
        share, absolute = self.kept_share, self.kept_abs_share
        named = {}  # the estimators behind the patch estimates the view carries
        if self.patch_estimates:
            named["nodes"] = DEFAULT_ESTIMATOR
        if self.has_edge_estimates:
            named["edges"] = DEFAULT_EDGE_ESTIMATOR
        return {"granularity": self.granularity, "value": self.value, "output": self.output_label,
                **({"patch_estimators": named} if named else {}),
                "tokens": list(self.tokens), "n_source": self.n_source,
                "kept_share": share if math.isfinite(share) else None,
                "kept_abs_share": absolute if math.isfinite(absolute) else None, "thresholds": dict(self.thresholds),
                "excluded_positions": list(self.excluded_positions),
                "nodes": nodes, "links": links + [dict(link) for link in self.qk_links]}

    def kept_links(self, max_links: int | None = None) -> Tensor:
        """``(E,)`` bool: the kept edges between kept nodes; a ``ValueError`` saying what to do
        instead when they are more than ``max_links`` (see :meth:`to_dict`)."""
        max_links = _limit(max_links, "max_links")
        d = self.data
        shown = self.node_mask[d.sources] & self.node_mask[d.targets] & self.edge_mask
        count = int(shown.sum())
        if max_links is not None and count > max_links:
            raise ValueError(f"this graph keeps {count:,} links (about {count * 2.5e3 / 1e9:.1f} GB as dicts and "
                             f"JSON, over max_links={max_links:,}): prune it (graph.prune()) or write it with "
                             "graph.save(path), whose arrays stream to disk")
        return shown

    def _output_fields(self) -> dict[str, Any]:
        """The output node's explained position and unit(s): ``token_id`` (or ``class_index``),
        and for a contrast the subtracted one's as ``negative_token_id``."""
        target = self.target
        if target is None:
            return {}
        found: dict[str, Any] = {"position": -1 if target.position is None else target.position}
        name = "token_id" if target.kind == "token" else "class_index"
        if target.kind in ("token", "class") and len(target.units) > 2 or tuple(target.coefficients) not in (
                (1.0,), (1.0, -1.0)):  # several outputs: a logit node each
            found[f"{name}s"] = list(target.units)
        elif target.kind in ("token", "class") and target.units:
            found[name] = target.units[0]
            if len(target.units) == 2:
                found[f"negative_{name}"] = target.units[1]
        return found

    def _logit_fields(self, k: int) -> dict[str, Any]:
        """A logit node's token (as the tokenizer decodes it), token id and probability."""
        target, unit = self.target, self.data.heads[k]
        found: dict[str, Any] = {"token_id": unit}
        if target is not None and unit in target.units:
            i = target.units.index(unit)
            found["probability"] = float(target.coefficients[i])
            if target.texts:
                found["token"] = target.texts[i]
        return found

    # ------------------------------------------------------------------ rankings
    def ranking(self, by: str = "value", level: str = "component", top: int | None = 20,
                estimator: str = "default") -> list[tuple[str, float]]:
        """The components (or nodes) of largest ``|score|``, largest first: ``[(id, score)]``.

        Every writer node the graph computed a value for is ranked, kept by the pruning or
        not (all of them: ``max_nodes`` limits only whose edges are computed), except those
        at :attr:`excluded_positions`. Tokens, the bias and the output are not ranked.

        Args:
            by (str): ``"value"`` (each node's total effect on the output) or ``"patch"``
                        (its patching estimate, ``estimator``'s; the graph needs
                        ``corrupted_inputs``).
            level (str): ``"component"`` (``block.23.attention.head.4``: its nodes summed over
                        positions; by patch, a component the estimator patched for real at
                        every position takes that pass's effect, unless positions are
                        excluded) or ``"node"`` (``block.23.attention.head.4@7``).
            top (int, optional): how many (``None``: all).
            estimator (str): the patching estimator (``by="patch"``).
        """
        if by not in RANK_BY:
            raise ValueError(f"by must be one of {', '.join(RANK_BY)}, got {by!r}")
        if level not in RANK_LEVELS:
            raise ValueError(f"level must be one of {', '.join(RANK_LEVELS)}, got {level!r}")
        if top is not None:
            _count(top, "top")
        d = self.data
        if by == "value":
            scores = d.values.tolist()
        else:
            self._check_estimator(estimator, "ranking by patch")
            scores = self.patch_estimates[estimator].tolist()
        aside = set(self.excluded_positions)
        writers = [k for k, kind in enumerate(d.kinds) if kind not in ENDS and d.positions[k] not in aside]
        found: dict[str, float] = {}
        if level == "node":
            ids = self.ids()
            found = {ids[k]: scores[k] for k in writers}
        else:
            for k in writers:
                name = component_of(d.kinds[k], d.layers[k], d.heads[k])
                found[name] = found.get(name, 0.0) + scores[k]
            if by == "patch" and not aside:
                found.update(self.patch_components.get(estimator, {}))
        # largest |score| first, ties in the graph's order; a score that is no number (nan) last
        ranked = sorted(found.items(), key=lambda kv: (math.isnan(kv[1]), -abs(kv[1]) if kv[1] == kv[1] else 0.0))
        return ranked if top is None else ranked[:top]

    def _check_estimator(self, estimator: Any, what: str) -> None:
        """A one-line ``ValueError`` unless the graph has ``estimator``'s node estimates."""
        if not self.patch_estimates:
            raise ValueError(f"{what} needs patch estimates, and this graph has none: build it with "
                             "corrupted_inputs= (--corrupted on the command line)")
        if not isinstance(estimator, str) or estimator not in self.patch_estimates:
            raise ValueError(f"estimator must be one of {', '.join(self.patch_estimates)}, got {estimator!r} "
                             "(build the graph with estimators=[...] for the others)")

    # ------------------------------------------------------------------ TransformerLens
    def hook_name(self, node: str) -> HookSite:
        """Where node ``node`` can be patched in a TransformerLens model (a ``TransformerBridge``
        of the same model; :class:`~captum_ffb.graph.target.HookSite`): a head ``block.23.attention.head.4@7`` at
        ``blocks.23.attn.hook_z``, position 7, head 4; an attention sublayer at
        ``blocks.<l>.hook_attn_out``; an FF block at ``blocks.<l>.hook_mlp_out``; a neuron at
        ``blocks.<l>.mlp.hook_post``, its index; a token at ``blocks.0.hook_resid_pre`` (a token
        node is the first block's input, position embeddings included); the output at
        ``unembed.hook_out`` (the logits), the explained position and unit. The bias node (the
        model's own constants) and an encoder–decoder's nodes have none: a ``ValueError``."""
        k = self.index(node)
        d = self.data
        kind, layer, part, position = d.kinds[k], d.layers[k], d.heads[k], d.positions[k]
        if self.n_source is not None:
            raise ValueError("hook names are TransformerLens's for one-stack models; this graph is an "
                             "encoder–decoder's")
        if kind == "bias":
            raise ValueError("the bias node is the model's own constants: no hook carries it alone")
        if kind == "logit":  # one of several outputs: its unit's logit
            return HookSite("unembed.hook_out", position, part)
        if kind == "output":
            target = self.target
            if target is None:
                raise ValueError("this graph does not record what it explains (built before 0.4)")
            if target.kind != "token":
                read = "a classifier's class (read by its score head)" if target.kind == "class" else \
                    "a direction read from the hidden states"
                raise ValueError(f"the output node is {read}, not a logit of the unembedding: no TransformerLens "
                                 "hook carries it")
            unit = target.units[0] if len(target.units) == 1 else None
            return HookSite("unembed.hook_out", len(self.tokens) - 1 if target.position is None else target.position,
                            unit)
        names = {"token": ("blocks.0.hook_resid_pre", None), "head": (f"blocks.{layer}.attn.hook_z", part),
                 "attention": (f"blocks.{layer}.hook_attn_out", None), "ff": (f"blocks.{layer}.hook_mlp_out", None),
                 "neuron": (f"blocks.{layer}.mlp.hook_post", part)}
        if kind not in names:
            raise ValueError(f"a {kind} node has no TransformerLens hook")
        name, index = names[kind]
        return HookSite(name, position, index)

    # ------------------------------------------------------------------ files and binding
    def save(self, path: str | os.PathLike, compress: bool = True) -> Path:
        """Write the graph to one ``.npz`` file (:mod:`captum_ffb.graph.files`: a zip of
        arrays and ``metadata.json``; edges are streamed to disk, never held as dicts), with
        what :meth:`bind` needs to bind it to its model again and the edges' patch estimates
        known (a bound graph's :meth:`BoundGraph.edge_patch_estimates` computes them; saving
        runs no model); returns the path."""
        return save_graph(self, path, compress=compress)

    @classmethod
    def load(cls, path: str | os.PathLike, model: Any = None, rules: Any = None) -> AttributionGraph:
        """A graph written by :meth:`save`; with ``model`` (the same weights, or a
        ``ValueError``), bound to it (:meth:`bind`)."""
        graph = AttributionGraph(**read_graph(path))
        return graph if model is None else graph.bind(model, rules)

    @property
    def bound(self) -> bool:
        """Whether the graph is bound to its model (score splits and edge estimates work)."""
        return False

    def bind(self, model: Any, rules: Any = None) -> BoundGraph:
        """This graph bound to ``model`` (an ``nn.Module``, a ``LoadedModel``, a
        ``NormDecomposition``, a TransformerLens bridge or an nnsight model): a new
        :class:`BoundGraph` on which :meth:`score_split`, :meth:`attention` and
        :meth:`query_key_pairs` work; refused (a ``ValueError``) where the weights are not
        those the graph was built on, or the graph was built with other rules than ``rules``
        (the defaults when ``None``). The graph itself stays as it was."""
        engine, chosen = bound_engine(model, rules)
        scorer = bound_scorer(self, engine, chosen)
        return BoundGraph(**_fields_of(self, edge_patches=dict(self.edge_patches), qk_links=list(self.qk_links)),
                          scorer=scorer)

    # ------------------------------------------------------------------ edges' patch estimates
    @property
    def has_edge_estimates(self) -> bool:
        """Whether edge patch estimates are known (or, bound, can be computed)."""
        return bool(self.edge_patches)

    def edge_patch_estimates(self, estimator: str | None = None, edges: Any = None) -> Tensor:
        """``(E,)`` each edge's estimated *path-patching* effect (``output(inputs) − output(inputs
        with only the target's computation seeing the source's write from the corrupted run)``,
        what the edge weights are for the frozen model), aligned with ``data.sources`` and
        ``data.targets``: for the kept edges (or ``edges``: indices, or a bool mask of the
        edges), ``nan`` elsewhere and on the bias's edges. ``estimator``: one of
        :data:`~captum_ffb.patching.patches.EDGE_ESTIMATORS` (default
        :data:`~captum_ffb.patching.patches.DEFAULT_EDGE_ESTIMATOR`). A passive graph gives
        those it knows (a loaded graph: those it was saved with; ``nan`` for the rest); a
        bound graph computes the missing ones on first use (:class:`BoundGraph`)."""
        name, edges = self._edge_request(estimator, edges)
        return self._known_edges(name, edges)

    def _edge_request(self, estimator: str | None, edges: Any) -> tuple[str, Tensor]:
        if not self.has_edge_estimates:
            raise ValueError("this graph has no edge patch estimates: build it with corrupted_inputs (at head or "
                             "sublayer granularity)")
        name = DEFAULT_EDGE_ESTIMATOR if estimator in (None, "default") else estimator
        if name not in EDGE_ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(EDGE_ESTIMATORS)}, got {estimator!r}")
        d = self.data
        if edges is None:
            return name, (self.edge_mask & self.node_mask[d.sources] & self.node_mask[d.targets]).nonzero()[:, 0]
        return name, edge_selection(edges, len(d.weights))

    def _known_edges(self, name: str, edges: Tensor) -> Tensor:
        found = torch.full((len(self.data.weights),), float("nan"), dtype=torch.float64)
        if name in self.edge_patches:
            found[edges] = self.edge_patches[name][edges]
        return found

    def edge_path_patching(self, edges: Any, batch_size: int = 16) -> Tensor:
        """``(k,)`` the real path-patching effect of the ``k`` edges ``edges`` (a bound graph's:
        :meth:`BoundGraph.edge_path_patching`)."""
        edge_selection(edges, len(self.data.weights))
        _count(batch_size, "batch_size")
        raise _not_bound("path patching")


@dataclass(frozen=True, repr=False)
class BoundGraph(AttributionGraph):
    r"""An attribution graph bound to its model: the record, and the handles that run the
    model for it (what ``attribute_graph`` returns, and :meth:`AttributionGraph.bind`).

    Attributes:
        scorer (ScoreSplitter, optional): computes score splits (:meth:`score_split`), bound
                    to the model and the input.
        edge_patcher (EdgePatcher, optional): computes the edges' patching estimates
                    (:meth:`edge_patch_estimates`), bound to the model and the two inputs.

    Edge estimates computed and query–key pairs attached are kept in this graph's own
    ``edge_patches`` and ``qk_links`` (a graph pruned from it shares them).
    """

    scorer: Any = field(default=None, compare=False)
    edge_patcher: Any = field(default=None, compare=False)

    @property
    def bound(self) -> bool:
        return self.scorer is not None or self.edge_patcher is not None

    def record(self) -> AttributionGraph:
        """The passive graph: this graph's data, with what binding it again needs (its origin)."""
        origin = self.origin if self.scorer is None or not hasattr(self.scorer, "request") else \
            origin_of(self.scorer)
        return AttributionGraph(**_fields_of(self, origin=origin))

    def save(self, path: str | os.PathLike, compress: bool = True) -> Path:
        """Write the graph's record (:meth:`record`: with what binding it again needs) to one
        ``.npz`` file, as :meth:`AttributionGraph.save`; returns the path."""
        return save_graph(self.record(), path, compress=compress)

    def score_split(self, layer: int, head: int, query_position: int, key_position: int) -> dict[Any, float]:
        if self.scorer is None:
            raise ValueError("this graph has no score splitter (it was built without the model)")
        return self.scorer(layer, head, query_position, key_position)

    def attention(self, layer: int, head: int, query_position: int) -> Tensor:
        if self.scorer is None:
            raise ValueError("this graph has no score splitter (it was built without the model)")
        return self.scorer.probabilities(layer, head, query_position)

    def attach_score_pairs(self, layer: int, head: int, query_position: int, key_position: int,
                           top: int = 5) -> list[dict[str, Any]]:
        """Add the ``top`` query–key pairs of a head's score (by ``|value|``) between nodes the
        graph keeps as links of their own kind (``"qk"``) to the graph's dict (once: a pair
        attached before is not added again); returns them."""
        _count(top, "top")
        split = self.score_split(layer, head, query_position, key_position)
        kept = {identifier for identifier, shown in zip(self.ids(), self.node_mask.tolist()) if shown}
        pairs = sorted(((pair, v) for pair, v in split.items() if pair[0] in kept and pair[1] in kept),
                       key=lambda kv: -abs(kv[1]))[:top]
        head_id = node_id("head", layer, head, query_position)
        found = [{"source": q, "target": k, "weight": v, "kind": "qk", "head": head_id} for (q, k), v in pairs]
        attached = {(link["source"], link["target"], link["head"]) for link in self.qk_links}
        self.qk_links.extend(link for link in found if (link["source"], link["target"], link["head"]) not in attached)
        return [dict(link) for link in found]

    @property
    def has_edge_estimates(self) -> bool:
        return self.edge_patcher is not None or bool(self.edge_patches)

    def edge_patch_estimates(self, estimator: str | None = None, edges: Any = None) -> Tensor:
        """As :meth:`AttributionGraph.edge_patch_estimates`, the missing estimates computed
        first (one pass of the model and one vector–Jacobian product per target node) and
        kept."""
        name, edges = self._edge_request(estimator, edges)
        d = self.data
        known = self.edge_patches.setdefault(name, torch.full((len(d.weights),), float("nan"), dtype=torch.float64))
        missing = edges[torch.isnan(known[edges]) & ~_bias_edges(d, edges)]
        if len(missing) and self.edge_patcher is not None:
            known[missing] = self.edge_patcher.estimates(d, missing, (name,))[name]
        return self._known_edges(name, edges)

    def edge_path_patching(self, edges: Any, batch_size: int = 16) -> Tensor:
        """``(k,)`` the real path-patching effect of the ``k`` edges ``edges`` (indices into
        ``data.sources``, or a bool mask of the edges), one forward pass each
        (:func:`~captum_ffb.patching.patches.path_patching`): what :meth:`edge_patch_estimates`
        estimates."""
        chosen = edge_selection(edges, len(self.data.weights))
        _count(batch_size, "batch_size")
        if self.edge_patcher is None:
            raise ValueError("this graph has no corrupted input: build it with corrupted_inputs")
        return self.edge_patcher.real(self.data, chosen, batch_size)


def _not_bound(what: str) -> ValueError:
    return ValueError(f"{what} need the model: this graph is not bound to one (bound = graph.bind(model), or "
                      "AttributionGraph.load(path, model=...))")


def _fields_of(graph: AttributionGraph, **changed: Any) -> dict[str, Any]:
    """The record's fields of ``graph`` (a bound graph's handles left out), ``changed`` replaced."""
    return {f.name: changed.get(f.name, getattr(graph, f.name)) for f in fields(AttributionGraph)}


def _sinks(d: GraphData) -> list[int]:
    """The nodes the direct edges go into: the logit nodes of several outputs, else the output."""
    logits = [k for k, kind in enumerate(d.kinds) if kind == "logit"]
    return logits or [d.output]


def _into_output(d: GraphData) -> Tensor:
    """``(E,)`` the edges carrying the output's value: into the output (or its logit nodes), from
    the bias, the tokens and the writers."""
    into = torch.zeros(len(d), dtype=torch.bool, device=d.targets.device)
    into[_sinks(d)] = True
    return into[d.targets]


def _shown(data: GraphData) -> Tensor:
    """``(N,)`` bool: the nodes an unpruned graph shows (all but the writers whose edges
    ``max_nodes`` did not compute)."""
    device = data.values.device
    nodes = torch.ones(len(data), dtype=torch.bool, device=device)
    if data.left_out is not None:
        has = torch.zeros(len(data), dtype=torch.bool, device=device)
        has[data.targets] = True
        has[data.sources] = True
        nodes &= has | torch.tensor([k in ENDS for k in data.kinds], device=device)
    return nodes


def check_positions(positions: Any, n: int, name: str = "exclude_positions") -> tuple[int, ...]:
    """Positions checked (integers in ``0 … n − 1``, negative ones counted from the end),
    sorted and without repeats; a one-line ``TypeError`` or ``ValueError`` naming ``name``."""
    if hasattr(positions, "tolist") and not isinstance(positions, (str, bytes)):  # a tensor or an array
        positions = positions.tolist()
    if isinstance(positions, (str, bytes)) or not isinstance(positions, Sequence):
        raise TypeError(f"{name} must be a list of positions (e.g. [0]), got {type(positions).__name__}")
    found = set()
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, int):
            raise TypeError(f"{name} must hold integer positions, got {p!r}")
        if not -n <= p < n:
            raise ValueError(f"{name}: position {p} is outside the input's {n} positions")
        found.add(p % n)
    return tuple(sorted(found))


def _limit(value: Any, name: str) -> int | None:
    """A limit argument: ``None`` (no limit) or a non-negative integer (a ``TypeError`` or
    ``ValueError`` naming it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number of links or None (no limit), got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be at least 0 (None: no limit), got {value}")
    return value


def _count(value: Any, name: str) -> int:
    """A count argument: a positive integer (a ``TypeError`` or ``ValueError`` naming it)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive integer, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value

def edge_selection(edges: Any, n_edges: int, name: str = "edges") -> Tensor:
    """Edges chosen by index (integers in ``0 … n_edges − 1``) or by a bool mask of length
    ``n_edges``, as a ``(k,)`` long tensor of indices; a one-line ``TypeError`` or
    ``ValueError`` naming ``name`` for floats, negative or out-of-range indices, a mask of
    another length."""
    if isinstance(edges, (bool, float, str, bytes)) or edges is None:
        raise TypeError(f"{name} must be edge indices or a bool mask of the edges, got {type(edges).__name__}")
    try:
        chosen = edges.detach().cpu() if isinstance(edges, Tensor) else torch.as_tensor(edges, device="cpu")
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be edge indices or a bool mask of the edges, got {type(edges).__name__}") from None
    if chosen.dtype == torch.bool:
        if chosen.dim() != 1 or len(chosen) != n_edges:
            raise ValueError(f"{name}: a bool mask must have one entry per edge ({n_edges}), got shape "
                             f"{tuple(chosen.shape)}")
        return chosen.nonzero()[:, 0]
    if chosen.is_floating_point() or chosen.is_complex():
        raise TypeError(f"{name} must be integer edge indices (or a bool mask), got {str(chosen.dtype)[6:]}")
    chosen = chosen.long().reshape(-1)
    if chosen.numel() and (int(chosen.min()) < 0 or int(chosen.max()) >= n_edges):
        bad = int(chosen.min()) if int(chosen.min()) < 0 else int(chosen.max())
        raise ValueError(f"{name}: edge {bad} is outside the graph's {n_edges} edges (0 … {n_edges - 1})")
    return chosen


def _bias_edges(d: GraphData, edges: Tensor) -> Tensor:
    return (d.sources[edges] == d.bias) | (d.targets[edges] == d.bias)


def attribution_graph(nd: Any, inputs: Any, target: Any = None, **options: Any) -> AttributionGraph:
    """``nd.attribute_graph(inputs, target, **options)`` (its name before 0.4; a
    ``DeprecationWarning``, gone in 0.5)."""
    warnings.warn("attribution_graph(nd, ...) is nd.attribute_graph(...) now; the function goes in 0.5",
                  DeprecationWarning, stacklevel=2)
    return nd.attribute_graph(inputs, target, **options)


def token_labels(tokenizer: Any, request: Any, n_source: int | None) -> tuple[list[str], list[int] | None]:
    """The players' labels in the layout, and their token ids (``None`` where the source is
    audio: its players are frames)."""
    source = request.args[0]
    if source.is_floating_point():  # a speech encoder's frames
        ids = None
        labels = [f"frame {j}" for j in range(int(n_source or 0))]
    else:
        ids = source[0].tolist()
        labels = tokenizer.convert_ids_to_tokens(ids) if tokenizer is not None else [str(i) for i in ids]
    if n_source is not None:
        target = request.kwargs["decoder_input_ids"][0].tolist()
        labels = labels + (tokenizer.convert_ids_to_tokens(target) if tokenizer is not None
                           else [str(i) for i in target])
        ids = None if ids is None else ids + target
    return labels, ids


def graph_target(tokenizer: Any, engine: Any, target: Any, offset: int = 0) -> GraphTarget:
    """The :class:`~captum_ffb.graph.target.GraphTarget` of a resolved head target (``engine``: the bound model;
    ``offset``: the read stack's first position in the layout, an encoder–decoder's source
    length)."""
    task = engine.task
    units = () if target.indices is None else tuple(int(u) for u in target.indices[0])
    kind = "direction" if not units else ("class" if task == "sequence_classification" else "token")
    coefficients = tuple(float(c) for c in target.coefficients[0])
    position = None if target.positions is None else int(target.positions[0].reshape(-1).max()) + offset
    texts = None
    if target.mix is not None:  # a log-probability: an answer's tokens, each counted once
        kind, coefficients = "answer", (1.0,) * len(units)
    if kind in ("token", "answer") and tokenizer is not None:
        texts = tuple(tokenizer.decode([u]) for u in units)
    head = engine.head.output
    n_units = None if head is None else int(head.weight.shape[0])
    return GraphTarget(kind, units, coefficients, position, texts, n_units)


def output_label(tokenizer: Any, task: str, target: Any) -> str:
    """What a graph explains, in words: the token whose logit is read as the tokenizer decodes
    it, quoted (``' Paris'``, the same from every entry point), or the class."""
    if target.indices is None:
        return "the read-out"
    units = [int(u) for u in target.indices[0]]
    if target.mix is not None:  # a log-probability: of a token, or of an answer of several
        text = tokenizer.decode(units) if tokenizer is not None else " ".join(map(str, units))
        return f"log p({text!r})"
    if tokenizer is not None and task != "sequence_classification":
        names = [repr(token_text(tokenizer, u)) for u in units]
    else:
        names = [str(u) for u in units]
    if len(names) == 1:
        return names[0]
    if len(names) == 2 and [float(c) for c in target.coefficients[0]] == [1.0, -1.0]:
        return f"{names[0]} − {names[1]}"
    return "Σ p·logit of " + ", ".join(names)  # several outputs, each logit weighted by its probability
