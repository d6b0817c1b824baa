r"""``AttributionGraph``: an exact attribution graph of the stock model, its pruning and its
exports (the engine's numbers, :mod:`captum_ffb.engine.graph`, behind one object).

Nodes: the tokens (players, measured from the chosen reference), each writer of the residual
stream at each position (an attention sublayer or its heads, an FF block or its neurons),
the bias (the model's own bias terms) and the explained output. Every node's value is its
total effect on the output; every edge is exact; every node conserves flow (its in-edges
and its bias edge add up to its value, its out-edges and its direct edge to the output too):
no error node. Pruning follows circuit-tracer's (node influence, then edge influence, with
the thresholds as parameters) and says what share of the output the kept graph holds.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from captum_ffb.engine.graph import GraphData, prune_masks
from captum_ffb.vocabulary import component_of, node_id, old_node_id

#: circuit-tracer's defaults: keep the nodes that hold this share of the influence on the
#: output, then the edges that hold this share.
NODE_THRESHOLD, EDGE_THRESHOLD = 0.8, 0.98
#: A pruned graph computes the edges of this many writer nodes (those of largest ``|value|``;
#: the rest send what they send as "left out"): pruning keeps far fewer, and the edges are
#: the graph's cost. An unpruned graph computes every node's edges unless told otherwise.
DEFAULT_MAX_NODES = 256


@dataclass
class AttributionGraph:
    r"""An exact attribution graph of one explained output.

    Attributes:
        data (~captum_ffb.engine.graph.GraphData): every node and edge (the engine's numbers).
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
                    stream relative to the stream (:mod:`captum_ffb.engine.patching`).
        patch_components (dict): estimator name → {component id: effect} for the components
                    that estimator patched for real at every position (``"atp+exact"``).
        thresholds (dict): the pruning's parameters.
        scorer (Any, optional): computes score splits (:meth:`score_split`), bound to the
                    model and the input.
        qk_links (list): the query–key pairs attached as links of their own kind.
        probability (float, optional): the model's probability of the explained token (or
                    class), when one unit is read.
        token_ids (list[int], optional): the input's token ids.
        n_source (int, optional): an encoder–decoder's source length (positions
                    ``0 … n_source − 1`` are the source's, the rest the target's).
        patch_seconds (dict): estimator name → the seconds its node estimates took.
        patch_passes (dict): estimator name → the model passes they ran (a ``"+exact"``
                    estimator's real patched passes included).
        edge_patcher (Any, optional): computes the edges' patching estimates
                    (:meth:`edge_patch_estimates`), bound to the model and the two inputs.
        edge_patches (dict): estimator name → ``(E,)`` the edges' estimates computed so far
                    (``nan`` where not computed).
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
    scorer: Any = None
    qk_links: list[dict[str, Any]] = field(default_factory=list)
    probability: float | None = None
    token_ids: list[int] | None = None
    n_source: int | None = None
    patch_seconds: dict[str, float] = field(default_factory=dict)
    patch_passes: dict[str, float] = field(default_factory=dict)
    edge_patcher: Any = None
    edge_patches: dict[str, Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls, data: GraphData, tokens: list[str], output_label: str, granularity: str, **extra: Any
           ) -> AttributionGraph:
        """The unpruned graph of ``data``."""
        device = data.values.device
        nodes = torch.ones(len(data), dtype=torch.bool, device=device)
        if data.left_out is not None:  # writer nodes whose edges were not computed (max_nodes) are not shown
            has = torch.zeros(len(data), dtype=torch.bool, device=device)
            has[data.targets] = True
            has[data.sources] = True
            nodes &= has | torch.tensor([k in ("token", "bias", "output") for k in data.kinds], device=device)
        return cls(data, tokens, output_label, granularity, nodes,
                   torch.ones(len(data.weights), dtype=torch.bool, device=device),
                   **extra)

    # ------------------------------------------------------------------ reading it
    @property
    def value(self) -> float:
        """The explained output's value."""
        return float(self.data.values[self.data.output])

    def ids(self) -> list[str]:
        """Every node's id (:func:`~captum_ffb.vocabulary.node_id`: ``token@<p>``,
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
        writers = torch.tensor([k not in ("token", "bias", "output") for k in d.kinds], device=d.values.device)
        receives = writers.clone() if d.computed is None else writers & d.computed
        receives[d.output] = True
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
        """The share of the output's value its kept in-edges carry (1 before pruning)."""
        d = self.data
        into = (d.targets == d.output) & self.edge_mask
        return float(d.weights[into].sum()) / self.value if self.value else float("nan")

    def component_estimates(self, estimator: str = "default") -> dict[str, float]:
        """Patching estimates summed over positions: component id (``block.<l>.attention.head.<h>``,
        ``block.<l>.attention``, ``block.<l>.ff``) → the estimated effect of patching the
        component at every position (what :func:`~captum_ffb.baselines.activation_patching`
        measures): the nodes' estimates added over positions, except for the components the
        estimator patched for real at every position (``"atp+exact"``, where some node's κ
        exceeds ``exact_above``), whose effect is that pass's."""
        if estimator not in self.patch_estimates:
            known = ", ".join(self.patch_estimates) or "none: build the graph with corrupted_inputs"
            raise ValueError(f"estimator must be one of {known}, got {estimator!r}")
        d = self.data
        found: dict[str, float] = {}
        for k, value in enumerate(self.patch_estimates[estimator].tolist()):
            if d.kinds[k] in ("head", "attention", "ff", "neuron"):
                name = component_of(d.kinds[k], d.layers[k], d.heads[k])
                found[name] = found.get(name, 0.0) + value
        found.update(self.patch_components.get(estimator, {}))
        return found

    # ------------------------------------------------------------------ pruning
    def prune(self, node_threshold: float = NODE_THRESHOLD, edge_threshold: float = EDGE_THRESHOLD) -> AttributionGraph:
        """The graph pruned as circuit-tracer prunes: nodes by their influence on the output
        (absolute edge weights, each node's in-edges normalised, influence summed over
        paths) until ``node_threshold`` of it is kept, then edges by their influence until
        ``edge_threshold``; tokens, the bias and the output always stay; nodes left without
        an edge go."""
        for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number between 0 and 1, got {type(value).__name__}")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie between 0 and 1, got {value}")
        node_mask, edge_mask, influence = prune_masks(self.data, self.node_mask, self.edge_mask, node_threshold,
                                                      edge_threshold)
        return replace(self, node_mask=node_mask, edge_mask=edge_mask, influence=influence,
                       thresholds={"node_threshold": node_threshold, "edge_threshold": edge_threshold})

    # ------------------------------------------------------------------ query–key pairs
    def score_split(self, layer: int, head: int, query_position: int, key_position: int) -> dict[Any, float]:
        """``{(query node id, key node id): value}``: the pre-softmax score of head ``head`` of
        block ``layer`` at query position ``query_position`` and key position
        ``key_position`` split exactly over pairs of writers at the two positions (with the
        norm scales frozen a score is bilinear in them; rotary is a fixed rotation per
        position), the bias terms under ``"bias"``; the values add up to the model's score."""
        if self.scorer is None:
            raise ValueError("this graph has no score splitter (it was built without the model)")
        return self.scorer(layer, head, query_position, key_position)

    def attention(self, layer: int, head: int, query_position: int) -> Tensor:
        """``(n,)`` where head ``head`` of block ``layer`` looks from ``query_position``: its
        attention probabilities over the key positions."""
        if self.scorer is None:
            raise ValueError("this graph has no score splitter (it was built without the model)")
        return self.scorer.probabilities(layer, head, query_position)

    def query_key_pairs(self, heads: int = 12, keys: int = 2, top: int = 5) -> dict[str, list[dict[str, Any]]]:
        """For the ``heads`` kept head nodes of largest ``|value|``: at the ``keys`` key
        positions the head attends most, the score's ``top`` writer pairs. Head node id →
        ``[{"key_position", "probability", "score", "pairs": [{"query", "key", "value"}]}]``
        (``score`` the whole pre-softmax score, the pairs' values add up to it with the rest)."""
        d = self.data
        chosen = [k for k in self.node_mask.nonzero()[:, 0].tolist() if d.kinds[k] == "head"]
        chosen = sorted(chosen, key=lambda k: -abs(float(d.values[k])))[:heads]
        found: dict[str, list[dict[str, Any]]] = {}
        for k in chosen:
            layer, head, position = d.layers[k], d.heads[k], d.positions[k]
            probabilities = self.attention(layer, head, position)
            entries = []
            for key in probabilities.argsort(descending=True)[:keys].tolist():
                split = self.score_split(layer, head, position, key)
                pairs = sorted(split.items(), key=lambda kv: -abs(kv[1]))[:top]
                entries.append({"key_position": key, "probability": float(probabilities[key]),
                                "score": sum(split.values()),
                                "pairs": [{"query": q, "key": s, "value": v} for (q, s), v in pairs]})
            found[node_id("head", layer, head, position)] = entries
        return found

    def attach_score_pairs(self, layer: int, head: int, query_position: int, key_position: int,
                           top: int = 5) -> list[dict[str, Any]]:
        """Add the ``top`` query–key pairs of a head's score (by ``|value|``) as links of their
        own kind (``"qk"``) to the graph's dict; returns them."""
        split = self.score_split(layer, head, query_position, key_position)
        pairs = sorted(((k, v) for k, v in split.items() if isinstance(k, tuple)), key=lambda kv: -abs(kv[1]))[:top]
        found = [{"source": q, "target": k, "weight": v, "kind": "qk", "head": node_id("head", layer, head, query_position)}
                 for (q, k), v in pairs]
        self.qk_links.extend(found)
        return found

    # ------------------------------------------------------------------ exports
    def to_dict(self) -> dict[str, Any]:
        """``{"nodes": [...], "links": [...], ...}``: every kept node (``id``, ``kind``,
        ``layer``, ``head``, ``position``, ``value``, with ``token``, ``influence`` and
        ``patch_estimate`` where known) and every kept edge (``source``, ``target``,
        ``weight``; query–key links with ``"kind": "qk"``)."""
        d = self.data
        ids = self.ids()
        nodes = []
        for k in self.node_mask.nonzero()[:, 0].tolist():
            node = {"id": ids[k], "kind": d.kinds[k], "layer": d.layers[k], "head": d.heads[k],
                    "position": d.positions[k], "value": float(d.values[k])}
            if d.kinds[k] == "token":
                node["token"] = self.tokens[d.positions[k]]
            if d.kinds[k] == "output":
                node["token"] = self.output_label
            if self.influence is not None:
                node["influence"] = float(self.influence[k])
            if self.patch_estimates and d.kinds[k] not in ("token", "bias", "output"):
                node["patch_estimate"] = float(self.patch_estimates["default"][k])
                node["patch_estimates"] = {name: float(v[k]) for name, v in self.patch_estimates.items()}
                node["patch_kappa"] = float(self.patch_kappa[k])
            nodes.append(node)
        shown = self.node_mask[d.sources] & self.node_mask[d.targets] & self.edge_mask
        links = [{"source": ids[int(s)], "target": ids[int(t)], "weight": float(w)}
                 for s, t, w in zip(d.sources[shown], d.targets[shown], d.weights[shown])]
        if self.edge_patcher is not None:  # the shown edges' patch estimates (the default estimator's)
            estimates = self.edge_patch_estimates(edges=shown.nonzero()[:, 0])[shown]
            for link, value in zip(links, estimates.tolist()):
                if value == value:  # not nan (the bias's edges have none)
                    link["patch_estimate"] = value
        return {"granularity": self.granularity, "value": self.value, "output": self.output_label,
                "tokens": self.tokens, "n_source": self.n_source, "kept_share": self.kept_share, "thresholds": self.thresholds,
                "nodes": nodes, "links": links + list(self.qk_links)}

    # ------------------------------------------------------------------ edges' patch estimates
    def edge_patch_estimates(self, estimator: str | None = None, edges: Tensor | None = None) -> Tensor:
        """``(E,)`` each edge's estimated *path-patching* effect (``output(inputs) − output(inputs
        with only the target's computation seeing the source's write from the corrupted run)``,
        what the edge weights are for the frozen model), aligned with ``data.sources`` and
        ``data.targets``: for the kept edges (or the indices ``edges``), ``nan`` elsewhere and on
        the bias's edges. ``estimator``: one of
        :data:`~captum_ffb.engine.patching.EDGE_ESTIMATORS` (default
        :data:`~captum_ffb.engine.patching.DEFAULT_EDGE_ESTIMATOR`). Computed on first use (one
        pass of the model and one vector–Jacobian product per target node) and kept."""
        from captum_ffb.engine.patching import DEFAULT_EDGE_ESTIMATOR, EDGE_ESTIMATORS

        if self.edge_patcher is None:
            raise ValueError("this graph has no edge patch estimates: build it with corrupted_inputs (at head or "
                             "sublayer granularity)")
        name = DEFAULT_EDGE_ESTIMATOR if estimator in (None, "default") else estimator
        if name not in EDGE_ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(EDGE_ESTIMATORS)}, got {estimator!r}")
        d = self.data
        if edges is None:
            edges = (self.edge_mask & self.node_mask[d.sources] & self.node_mask[d.targets]).nonzero()[:, 0]
        edges = torch.as_tensor(edges, dtype=torch.long).reshape(-1)
        known = self.edge_patches.setdefault(name, torch.full((len(d.weights),), float("nan"), dtype=torch.float64))
        missing = edges[torch.isnan(known[edges]) & ~_bias_edges(d, edges)]
        if len(missing):
            known[missing] = self.edge_patcher.estimates(d, missing, (name,))[name]
        found = torch.full((len(d.weights),), float("nan"), dtype=torch.float64)
        found[edges] = known[edges]
        return found

    def edge_path_patching(self, edges: Tensor, batch_size: int = 16) -> Tensor:
        """``(len(edges),)`` the real path-patching effect of the edges ``edges`` (indices into
        ``data.sources``), one forward pass each (:func:`~captum_ffb.engine.patching.path_patching`):
        what :meth:`edge_patch_estimates` estimates."""
        if self.edge_patcher is None:
            raise ValueError("this graph has no corrupted input: build it with corrupted_inputs")
        return self.edge_patcher.real(self.data, torch.as_tensor(edges, dtype=torch.long).reshape(-1), batch_size)


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


def output_label(tokenizer: Any, task: str, target: Any) -> str:
    """What a graph explains, in words: the token or class whose logit is read."""
    if target.indices is None:
        return "the read-out"
    units = [int(u) for u in target.indices[0]]
    if tokenizer is not None and task != "sequence_classification":
        names = tokenizer.convert_ids_to_tokens(units)
    else:
        names = [str(u) for u in units]
    return names[0] if len(names) == 1 else f"{names[0]} − {names[1]}"
