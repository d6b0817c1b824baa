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

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from captum_ffb.engine.graph import GraphData, node_id

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
                    patching it from the baseline run (``baseline_inputs``).
        patch_kappa (Tensor, optional): ``(N,)`` each node's κ, how far its patch moves the
                    stream relative to the stream (:mod:`captum_ffb.attr.patching`).
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

    @classmethod
    def of(cls, data: GraphData, tokens: list[str], output_label: str, granularity: str, **extra: Any
           ) -> AttributionGraph:
        """The unpruned graph of ``data``."""
        nodes = torch.ones(len(data), dtype=torch.bool)
        if data.left_out is not None:  # writer nodes whose edges were not computed (max_nodes) are not shown
            has = torch.zeros(len(data), dtype=torch.bool)
            has[data.targets] = True
            has[data.sources] = True
            nodes &= has | torch.tensor([k in ("token", "bias", "output") for k in data.kinds])
        return cls(data, tokens, output_label, granularity, nodes, torch.ones(len(data.weights), dtype=torch.bool),
                   **extra)

    # ------------------------------------------------------------------ reading it
    @property
    def value(self) -> float:
        """The explained output's value."""
        return float(self.data.values[self.data.output])

    def ids(self) -> list[str]:
        """Every node's id (see :func:`~captum_ffb.engine.graph.node_id`)."""
        d = self.data
        return [node_id(k, layer, part, p) for k, layer, part, p in zip(d.kinds, d.layers, d.heads, d.positions)]

    def index(self, node: str) -> int:
        """The index of the node ``node`` (an id)."""
        try:
            return self.ids().index(node)
        except ValueError:
            raise ValueError(f"no node {node!r} in this graph") from None

    def flow(self) -> tuple[Tensor, Tensor]:
        """``(in-flow, out-flow)`` of every node over the whole graph (the bias edges, the
        direct edges to the output and what ``max_nodes`` left out included): each equals the
        node's value, except at the writer nodes whose edges ``max_nodes`` did not compute
        (they have none)."""
        d = self.data
        inflow = torch.zeros(len(d), dtype=d.weights.dtype).index_add_(0, d.targets, d.weights)
        if d.left_out is not None:
            inflow = inflow + d.left_out.to(inflow.dtype)
        outflow = torch.zeros(len(d), dtype=d.weights.dtype).index_add_(0, d.sources, d.weights)
        return inflow, outflow

    def flow_residual(self) -> float:
        """The largest ``|in-flow − value|`` over the writer nodes whose edges were computed and
        the output, and, when every node's edges were (``max_nodes`` not reached), the largest
        ``|out-flow − value|`` over the tokens and the writers too: zero up to rounding."""
        d = self.data
        inflow, outflow = self.flow()
        writers = torch.tensor([k not in ("token", "bias", "output") for k in d.kinds])
        receives = writers.clone() if d.computed is None else writers & d.computed
        receives[d.output] = True
        residual = float((inflow - d.values)[receives].abs().max())
        if d.computed is None:
            sends = writers | torch.tensor([k == "token" for k in d.kinds])
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
        """Patching estimates summed over positions: component id (``block.<l>.head.<h>``,
        ``block.<l>.attention``, ``block.<l>.ff``) → the estimated effect of patching the
        component at every position (what :func:`~captum_ffb.baselines.activation_patching`
        measures): the nodes' estimates added over positions, except for the components the
        estimator patched for real at every position (``"atp+exact"``, where some node's κ
        exceeds ``exact_above``), whose effect is that pass's."""
        if estimator not in self.patch_estimates:
            known = ", ".join(self.patch_estimates) or "none: build the graph with baseline_inputs"
            raise ValueError(f"estimator must be one of {known}, got {estimator!r}")
        d = self.data
        found: dict[str, float] = {}
        for k, value in enumerate(self.patch_estimates[estimator].tolist()):
            if d.kinds[k] in ("head", "attention", "ff", "neuron"):
                name = node_id(d.kinds[k], d.layers[k], d.heads[k], 0).rsplit(".", 1)[0]
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
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie between 0 and 1, got {value}")
        d = self.data
        keep = self.node_mask.nonzero()[:, 0]
        position = torch.full((len(d),), -1, dtype=torch.long)
        position[keep] = torch.arange(len(keep))
        edges = self.edge_mask & (position[d.sources] >= 0) & (position[d.targets] >= 0)
        size = len(keep)
        adjacency = torch.zeros(size, size, dtype=torch.float64)
        adjacency.index_put_((position[d.targets[edges]], position[d.sources[edges]]),
                             d.weights[edges].double(), accumulate=True)
        weights = torch.zeros(size, dtype=torch.float64)
        weights[position[d.output]] = 1.0
        influence = _influence(_normalised(adjacency), weights)
        always = torch.tensor([d.kinds[int(i)] in ("token", "bias", "output") for i in keep])
        chosen = (influence >= _threshold(influence, node_threshold)) | always
        pruned = adjacency.clone()
        pruned[~chosen] = 0
        pruned[:, ~chosen] = 0
        normalised = _normalised(pruned)
        scores = normalised * (_influence(normalised, weights) + weights)[:, None]
        edge_keep = scores >= _threshold(scores[scores > 0].flatten(), edge_threshold)
        edge_keep &= pruned != 0
        for _ in range(size):  # nodes without an in-edge (writers) or an out-edge go, until none does
            before = chosen.clone()
            has_out = edge_keep.any(0)
            has_in = edge_keep.any(1)
            writer = ~always
            chosen &= ~writer | (has_out & has_in)
            edge_keep &= chosen[:, None] & chosen[None, :]
            if torch.equal(before, chosen):
                break
        node_mask = torch.zeros(len(d), dtype=torch.bool)
        node_mask[keep[chosen]] = True
        kept_edges = edges.clone()
        kept_edges[edges] = edge_keep[position[d.targets[edges]], position[d.sources[edges]]]
        full_influence = torch.zeros(len(d), dtype=torch.float64)
        full_influence[keep] = influence
        return replace(self, node_mask=node_mask, edge_mask=kept_edges, influence=full_influence,
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
        return {"granularity": self.granularity, "value": self.value, "output": self.output_label,
                "tokens": self.tokens, "n_source": self.n_source, "kept_share": self.kept_share, "thresholds": self.thresholds,
                "nodes": nodes, "links": links + list(self.qk_links)}


def _normalised(matrix: Tensor) -> Tensor:
    """Absolute weights, each row (a node's in-edges) summing to 1."""
    found = matrix.abs()
    return found / found.sum(dim=1, keepdim=True).clamp(min=1e-30)


def _influence(adjacency: Tensor, weights: Tensor, steps: int = 10_000) -> Tensor:
    """``w A + w A² + …``: each node's influence on the nodes ``weights`` weighs (the graph is
    acyclic, so the sum ends)."""
    current = weights @ adjacency
    total = current.clone()
    for _ in range(steps):
        if not bool(current.any()):
            return total
        current = current @ adjacency
        total += current
    raise RuntimeError("the influence did not converge: the graph has a cycle")


def _threshold(scores: Tensor, share: float) -> Tensor:
    """The score above which ``share`` of the scores' total lies."""
    if scores.numel() == 0:
        return torch.tensor(float("inf"))
    ordered = scores.sort(descending=True).values
    cumulative = ordered.cumsum(0) / ordered.sum().clamp(min=1e-30)
    index = min(int(torch.searchsorted(cumulative, torch.tensor(share, dtype=cumulative.dtype))), len(ordered) - 1)
    return ordered[index]


def attribution_graph(nd: Any, inputs: Any, target: Any = None, *, granularity: str = "head",
                      prune: bool = True, node_threshold: float = NODE_THRESHOLD,
                      edge_threshold: float = EDGE_THRESHOLD, max_nodes: int | None = None,
                      baseline_inputs: Any = None, additional_forward_args: Any = None,
                      forward_kwargs: dict[str, Any] | None = None, reference: Any = None,
                      rules: Any = None, exact_above: float | None = None) -> AttributionGraph:
    r"""The exact attribution graph of one output of one input (what
    :meth:`~captum_ffb.attr.NormDecomposition.attribute_graph` returns).

    Args:
        nd (NormDecomposition): the bound model.
        inputs (Tensor): ``(1, n)`` token ids.
        target (int, str, ReadOut, optional): as in ``attribute`` (``None``: the prediction).
        granularity (str): ``"sublayer"``, ``"head"`` (default) or ``"neuron"``.
        prune (bool): prune as circuit-tracer does (:meth:`~captum_ffb.attr.AttributionGraph.prune`).
        node_threshold, edge_threshold (float): the pruning's shares of influence kept.
        max_nodes (int, optional): compute edges for this many writer nodes only (largest
                    ``|value|``); what the others send is reported as left out (default:
                    :data:`~captum_ffb.attr.graph.DEFAULT_MAX_NODES` when pruning, every node when not).
        baseline_inputs (Tensor, optional): a corrupted input of the same length: every
                    node then carries patching estimates (:mod:`captum_ffb.attr.patching`).
        exact_above (float, optional): the κ above which ``"atp+exact"`` patches a node for
                    real (default :data:`~captum_ffb.attr.patching.EXACT_ABOVE`;
                    ``math.inf``: never).
        additional_forward_args, forward_kwargs, reference, rules: as in ``attribute``.

    Returns:
        AttributionGraph: pruned unless ``prune=False``; flow is conserved either way
        (pruning only hides nodes and edges, ``kept_share`` says how much of the output the
        kept graph holds).
    """
    from captum_ffb.engine.graph import GRAPH_GRANULARITIES, build_graph, covectors, graph_pass

    if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1):
        raise ValueError(f"max_nodes must be a positive number of nodes, got {max_nodes!r}")
    for name, share in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must lie between 0 and 1, got {share}")
    if granularity not in GRAPH_GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRAPH_GRANULARITIES)}, got {granularity!r}")
    engine = nd.engine
    reference = nd.reference if reference is None else reference
    request = nd._request(inputs, additional_forward_args, forward_kwargs, reference)
    if request.batch_size != 1:
        raise ValueError("inputs: an attribution graph explains one input at a time (a batch of 1)")
    chosen = nd._rules(rules)
    if getattr(chosen.get("attention"), "credits_scores", False):
        raise ValueError("rules: an attribution graph freezes the attention probabilities (the paper's "
                         "rules); its query–key pairs come from score_split")
    head_target = resolved_target(nd, request, target)
    if baseline_inputs is not None:
        engine.refuse_two_stacks("patching estimates")
    from captum_ffb.attr.patching import EXACT_ABOVE

    exact_above = EXACT_ABOVE if exact_above is None else exact_above
    if isinstance(exact_above, bool) or not isinstance(exact_above, (int, float)) or not exact_above > 0:
        raise ValueError(f"exact_above must be a positive number (math.inf: never patch for real), got {exact_above!r}")
    tape = graph_pass(engine, request, head_target, chosen, granularity)
    found = covectors(tape)
    players = _players(engine, request, tape, reference, head_target)
    limit = max_nodes if max_nodes is not None else (DEFAULT_MAX_NODES if prune else None)
    data = build_graph(tape, found, players, max_nodes=limit)
    tokens, ids = _token_labels(nd, request, tape)
    label = _label(nd, head_target)
    graph = AttributionGraph.of(data, tokens, label, granularity, probability=_probability(tape.output, head_target),
                                token_ids=ids, n_source=None if tape.source_inputs is None else tape.source_inputs.shape[1])
    if baseline_inputs is not None:
        from captum_ffb.attr.patching import patch_estimates

        graph.patch_estimates, graph.patch_kappa, graph.patch_components = patch_estimates(nd, request, head_target, tape, found, data,
                                                                   baseline_inputs, granularity, exact_above)
    from captum_ffb.attr.scores import ScoreSplitter

    graph.scorer = ScoreSplitter(nd, request, chosen, head_target, granularity, players)
    return graph.prune(node_threshold, edge_threshold) if prune else graph


def _token_labels(nd: Any, request: Any, tape: Any) -> tuple[list[str], list[int] | None]:
    """The players' labels in the layout, and their token ids (``None`` where the source is
    audio: its players are frames)."""
    source = request.args[0]
    if source.is_floating_point():  # a speech encoder's frames
        ids = None
        labels = [f"frame {j}" for j in range(tape.source_inputs.shape[1])]
    else:
        ids = source[0].tolist()
        labels = nd.tokenizer.convert_ids_to_tokens(ids) if nd.tokenizer is not None else [str(i) for i in ids]
    if tape.source_inputs is not None:
        target = request.kwargs["decoder_input_ids"][0].tolist()
        labels = labels + (nd.tokenizer.convert_ids_to_tokens(target) if nd.tokenizer is not None
                           else [str(i) for i in target])
        ids = None if ids is None else ids + target
    return labels, ids


def _players(engine: Any, request: Any, tape: Any, reference: Any, target: Any) -> list[Any]:
    """Each segment's players (:class:`~captum_ffb.engine.graph.Players`) as ``attribute``
    measures them: the chosen reference, or for the centred one the positions the explained
    output sees (all of an encoder–decoder's source)."""
    from captum_ffb.engine.graph import Players

    leaves = [leaf.detach() for leaf in tape.leaves]
    masks = engine._masks(request, [x.shape[:2] for x in leaves])
    seen = engine._shared(reference, request.read_mask, target)
    found = []
    for k, (x, mask) in enumerate(zip(leaves, masks)):
        if seen is not None:
            found.append(Players(mask, None, (seen if k == len(leaves) - 1 else mask).to(x.device)))
        else:
            found.append(Players(mask, engine._reference(reference, x, mask, request.args, request.kwargs)))
    return found


def resolved_target(nd: Any, request: Any, target: Any) -> Any:
    """``target`` of one request as the engine reads it (``None`` or an open read-out: the
    model's prediction)."""
    from captum_ffb.readouts import ClassLogit, NextToken, ReadOut

    if target is None or (isinstance(target, ReadOut) and getattr(target, "token", 0) is None):
        outputs = nd.engine.predict(request)
        readout = target if target is not None else (
            NextToken() if nd.task != "sequence_classification" else ClassLogit())
        target = nd._text_free(readout).resolve(outputs, request.read_mask.long())
    return nd._target(target, None, request.read_mask)


def _probability(output: Any, target: Any) -> float | None:
    """The model's probability of the one unit ``target`` reads (``None`` for a contrast or a
    direction)."""
    from captum_ffb.engine.head import output_logits

    if target.indices is None or target.indices.shape[1] != 1:
        return None
    try:
        logits = output_logits(output)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    logits = logits.detach().float()
    if logits.dim() == 3:
        logits = logits[0, int(target.positions.reshape(-1)[0])]
    else:
        logits = logits[0]
    return float(logits.softmax(-1)[int(target.indices[0, 0])])


def _label(nd: Any, target: Any) -> str:
    """What the graph explains, in words: the token or class whose logit is read."""
    if target.indices is None:
        return "the read-out"
    units = [int(u) for u in target.indices[0]]
    if nd.tokenizer is not None and nd.task != "sequence_classification":
        names = nd.tokenizer.convert_ids_to_tokens(units)
    else:
        names = [str(u) for u in units]
    return names[0] if len(names) == 1 else f"{names[0]} − {names[1]}"
