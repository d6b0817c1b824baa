r"""An attribution graph as the JSON file Neuronpedia's graph viewer (and circuit-tracer's
local one) reads, and the viewer state such a file carries back.

The file follows Neuronpedia's own schema (``apps/webapp/app/api/graph/graph-schema.json`` in
its repository; the tests validate against a vendored copy): ``metadata`` (``slug``,
``scan``, ``prompt_tokens``, ``prompt``, the pruning's settings), ``qParams`` (pinned nodes,
supernodes, the clicked node), ``nodes``, ``links``, and ``qk_only_nodes`` for query–key
contributors that the pruning left out.

What the fields mean, as circuit-tracer writes them:

- a node's ``influence`` is its **cumulative** share: the nodes sorted by their influence on
  the output, largest first, and each given the running sum of the sorted influences divided
  by their total. The viewer keeps the nodes with ``influence <= threshold``, so its pruning
  slider keeps the most influential first (the raw influence would keep the least);
- ``prompt_tokens`` are the tokens as text (each token id decoded alone, ``⏎`` for a line
  break, ``→`` for a tab, ``↵`` for a carriage return), not the tokenizer's pieces (``ĠE``);
- ``scan`` names the model; it is a name the user chose, else ``captum-ffb``, never a path.

Node kinds map onto the four ``feature_type`` values the viewer draws (:data:`FEATURE_TYPES`):
tokens are ``embedding`` nodes, the output the ``logit`` node, every head, attention
sublayer, cross-attention, FF block or neuron a ``cross layer transcoder`` node, the bias (the
model's own constants) the one ``mlp reconstruction error`` node. A head node carries
``qk_tracing_results`` where the graph can split its scores: the writer pairs (query side,
key side) that make its score at the keys it attends most, and their sums by query and by key
writer.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from captum_ffb.graph.record import MAX_DICT_LINKS
from captum_ffb.io.files import write_json
from captum_ffb.viz._common import cpu_view

__all__ = ["FEATURE_TYPES", "NeuronpediaState", "cumulative_influence", "neuronpedia_graph",
           "neuronpedia_token", "read_neuronpedia_state", "save_neuronpedia_graph"]

#: circuit-tracer's ``feature_type`` for each node kind of ours (it writes only these four:
#: ``Node.token_node``, ``logit_node``, ``feature_node``, ``error_node``)
FEATURE_TYPES = {"token": "embedding", "output": "logit", "logit": "logit", "attention": "cross layer transcoder",
                 "head": "cross layer transcoder", "cross_attention": "cross layer transcoder",
                 "ff": "cross layer transcoder", "neuron": "cross layer transcoder",
                 "bias": "mlp reconstruction error"}

#: the largest Neuronpedia file :func:`read_neuronpedia_state` reads, in bytes
MAX_STATE_BYTES = 256 * 2**20
#: the most pinned ids, supernodes and members of one supernode it accepts
MAX_PINS = 10_000
_CONTROLS = {"\n": "⏎", "\t": "→", "\r": "↵"}


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table): the printable bytes
    stand for themselves, the others for the characters from U+0100 on, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


_BYTES = _byte_level_alphabet()


def neuronpedia_token(piece: str, tokenizer: Any = None, token_id: int | None = None) -> str:
    r"""A token as circuit-tracer writes it in ``prompt_tokens``: decoded alone, line breaks,
    tabs and carriage returns as ``⏎``, ``→`` and ``↵``.

    With a ``tokenizer`` and the ``token_id``, the tokenizer decodes it. Without, a byte-level
    BPE piece (``ĠParis``, ``Ċ``, ``Ã©``) is decoded from its bytes, a SentencePiece piece
    (``▁Paris``, ``<0x0A>``) from its markers; anything else is kept as it is.

    Args:
        piece (str): the token as the tokenizer writes it (``convert_ids_to_tokens``).
        tokenizer (optional): a Hugging Face tokenizer.
        token_id (int, optional): the token's id.
    """
    text = None
    if tokenizer is not None and token_id is not None:
        try:
            text = tokenizer.decode([int(token_id)])
        except Exception:  # a tokenizer that cannot decode this id alone: decode the piece
            text = None
    if not isinstance(text, str):
        text = _decoded_piece(piece)
    return "".join(_CONTROLS.get(ch, ch) for ch in text)


def _decoded_piece(piece: str) -> str:
    if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # SentencePiece's byte fallback
        try:
            return bytes([int(piece[3:5], 16)]).decode("utf-8", errors="replace")
        except ValueError:
            return piece
    if "▁" in piece:
        return piece.replace("▁", " ")
    if piece and all(ch in _BYTES for ch in piece) and any(ord(ch) >= 256 or ch in "ÃÂ" for ch in piece):
        return bytes(_BYTES[ch] for ch in piece).decode("utf-8", errors="replace")
    return piece


def cumulative_influence(influence: Tensor) -> Tensor:
    r"""circuit-tracer's ``influence`` field: the nodes sorted by influence, largest first,
    each given the running sum of the sorted influences over their total (the most
    influential node has the smallest value, the least influential 1).

    Args:
        influence (Tensor): ``(N,)`` each node's influence on the output.

    Returns:
        Tensor: ``(N,)`` float64.
    """
    values = influence.detach().double().cpu()
    order = torch.argsort(values, descending=True, stable=True)
    total = float(values.sum())
    running = torch.cumsum(values[order], 0) / (total if total > 0 else 1.0)
    found = torch.empty_like(values)
    found[order] = running
    return found


@dataclass
class NeuronpediaState:
    r"""What a Neuronpedia file's ``qParams`` say, in our node ids.

    Attributes:
        pinned (list[str]): the pinned nodes.
        supernodes (list[tuple[str, list[str]]]): each supernode's name and members.
        clicked (str, optional): the chosen node.
        unknown (list[str]): Neuronpedia ids the graph has no node for (left out above).
    """

    pinned: list[str] = field(default_factory=list)
    supernodes: list[tuple[str, list[str]]] = field(default_factory=list)
    clicked: str | None = None
    unknown: list[str] = field(default_factory=list)


def _cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


class _Names:
    """Neuronpedia's node id, ``jsNodeId``, ``feature``, ``layer`` and label of each node."""

    def __init__(self, graph: Any, token_ids: list[int] | None, tokens: list[str]) -> None:
        d = graph.data
        self.graph, self.tokens, self.token_ids = graph, tokens, token_ids
        self.layers = max([layer for layer in d.layers if layer >= 0], default=-1) + 1
        self.widths: dict[int, int] = {}
        for k in range(len(d)):
            if d.kinds[k] in ("head", "attention"):
                self.widths[d.layers[k]] = max(self.widths.get(d.layers[k], 0), d.heads[k] + 1)
        self.ours = graph.ids()
        self.theirs = [self.node(k)["node_id"] for k in range(len(d))]
        self.by_theirs = dict(zip(self.theirs, self.ours))
        self.by_ours = dict(zip(self.ours, self.theirs))

    def node(self, k: int) -> dict[str, Any]:
        d, graph = self.graph.data, self.graph
        kind, layer, part, position = d.kinds[k], d.layers[k], d.heads[k], d.positions[k]
        if kind == "token":
            vocab = self.token_ids[position] if self.token_ids is not None else position
            return {"node_id": f"E_{vocab}_{position}", "feature": position, "layer": "E", "ctx_idx": position,
                    "jsNodeId": f"E_{vocab}-{position}", "clerp": self.tokens[position]}
        if kind == "output" and "logit" in d.kinds:  # their sum: not written (see neuronpedia_graph)
            return {"node_id": f"sum_{position}", "feature": -1, "layer": str(self.layers + 2), "ctx_idx": position,
                    "jsNodeId": f"sum-{position}", "clerp": "the logits' sum"}
        if kind == "output":
            feature, position, label = _logit(graph)
            probability = graph.probability if graph.probability is not None else 0.0
            return {"node_id": f"{self.layers + 1}_{feature}_{position}", "feature": feature,
                    "layer": str(self.layers + 1), "ctx_idx": position, "jsNodeId": f"L_{feature}-{position}",
                    "is_target_logit": True, "token_prob": probability,
                    "clerp": f'Output "{label}" (p={probability:.3f})'}
        if kind == "logit":  # one of several outputs: circuit-tracer's logit nodes
            fields = graph._logit_fields(k)
            probability = float(fields.get("probability", 0.0))
            label = neuronpedia_token(fields["token"]) if "token" in fields else str(part)
            return {"node_id": f"{self.layers + 1}_{part}_{position}", "feature": part,
                    "layer": str(self.layers + 1), "ctx_idx": position, "jsNodeId": f"L_{part}-{position}",
                    "is_target_logit": part == _first_unit(graph), "token_prob": probability,
                    "clerp": f'Output "{label}" (p={probability:.3f})'}
        if kind == "bias":
            return {"node_id": "bias_0_0", "feature": -1, "layer": "E", "ctx_idx": 0, "jsNodeId": "bias_0-0",
                    "clerp": "Bias: the model's own constants"}
        heads = max(self.widths.get(layer, 1), 1)
        feature = {"head": part, "attention": 0, "cross_attention": heads, "ff": heads + 1,
                   "neuron": heads + 2 + part}[kind]
        where = f" @ {self.tokens[position]}" if 0 <= position < len(self.tokens) else ""
        writes = graph.lens.get(k)  # what it writes: the token its write promotes most
        writes = f" ↑ {_marked(writes[0][0])}" if writes and writes[0] else ""
        return {"node_id": f"{layer}_{feature}_{position}", "feature": _cantor(layer, feature), "layer": str(layer),
                "ctx_idx": position, "jsNodeId": f"{layer}_{feature}-0",
                "clerp": self.ours[k].split("@")[0] + where + writes}

    def written(self, k: int) -> bool:
        """Whether node ``k`` is written: not the output of several outputs (their sum)."""
        d = self.graph.data
        return not (d.kinds[k] == "output" and "logit" in d.kinds)

    def theirs_of(self, node: str) -> str:
        """Neuronpedia's id of one of our node ids (or of one of theirs, unchanged)."""
        if node in self.by_ours:
            return self.by_ours[node]
        if node in self.by_theirs:
            return node
        raise ValueError(f"the graph has no node {node!r}")

    def drawn_of(self, node: str) -> list[str]:
        """Neuronpedia's ids of what stands for one of our nodes in the file: itself, or for the
        unwritten sum of several outputs, their logit nodes."""
        theirs = self.theirs_of(node)
        d = self.graph.data
        k = self.theirs.index(theirs)
        if self.written(k):
            return [theirs]
        logits = [j for j in range(len(d)) if d.kinds[j] == "logit"]
        first = _first_unit(self.graph)  # the target logit first
        return [self.theirs[j] for j in sorted(logits, key=lambda j: d.heads[j] != first)]


def _marked(text: str) -> str:
    """Decoded text with line breaks, tabs and carriage returns as circuit-tracer marks them."""
    return text.replace("\n", "⏎").replace("\t", "→").replace("\r", "↵")


def _first_unit(graph: Any) -> int | None:
    """The most probable of several outputs' units (circuit-tracer's target logit)."""
    target = graph.target
    if target is None or not target.units:
        return None
    return max(zip(target.coefficients, target.units))[1]


def _logit(graph: Any) -> tuple[int, int, str]:
    """The logit node's ``feature``, ``ctx_idx`` and label as circuit-tracer writes them: the
    token id (a contrast's or a direction's: the virtual index ``n_units``), the explained
    position and the token decoded (``" Paris"``)."""
    target = graph.target
    last = len(graph.tokens) - 1
    if target is None:  # a graph of before 0.4
        return 0, last, neuronpedia_token(graph.output_label)
    position = last if target.position is None else target.position
    if len(target.units) == 1:
        feature = target.units[0]
    else:
        feature = target.n_units if target.n_units is not None else 0
    if target.kind == "answer":  # an answer's log-probability: the answer's text
        text = "".join(target.texts) if target.texts else graph.output_label
        label = f"log p({neuronpedia_token(text)})"
    elif target.texts:
        label = " − ".join(neuronpedia_token(t) for t in target.texts)
    elif target.kind == "class":
        label = " − ".join(f"class {u}" for u in target.units)
    else:
        label = neuronpedia_token(graph.output_label)
    return feature, position, label


def _prompt_tokens(graph: Any, tokenizer: Any, token_ids: list[int] | None) -> list[str]:
    ids = token_ids if token_ids is not None and len(token_ids) == len(graph.tokens) else None
    return [neuronpedia_token(str(piece), tokenizer, None if ids is None else ids[p])
            for p, piece in enumerate(graph.tokens)]


def _influence(graph: Any) -> Tensor:
    """Each node's influence on the output, as the pruning computed it (an unpruned graph's
    computed here over every node and edge)."""
    if graph.influence is not None:
        return graph.influence
    from captum_ffb.graph.build import prune_masks

    every = torch.ones(len(graph.data), dtype=torch.bool, device=graph.data.values.device)
    return prune_masks(graph.data, every, graph.edge_mask, 1.0, 1.0)[2]


def query_key_of(graph: Any) -> dict[str, Any]:
    """The query–key pairs of the graph's largest heads, where it can split scores (``{}``
    where it cannot: a graph read from a file, a family computing its scores inline)."""
    if getattr(graph, "scorer", None) is None or graph.granularity != "head":
        return {}
    try:
        return graph.query_key_pairs()
    except ValueError:
        return {}


@cpu_view
def neuronpedia_graph(graph: Any, prompt: str, slug: str = "captum-ffb-graph", scan: str | None = None,
                      token_ids: list[int] | None = None, max_links: int | None = MAX_DICT_LINKS,
                      tokenizer: Any = None, pinned: Any = (), supernodes: Any = (), clicked: str | None = None,
                      query_key: dict[str, Any] | None = None) -> dict[str, Any]:
    r"""The kept graph as a Neuronpedia graph file (Neuronpedia's schema; circuit-tracer's
    local viewer reads it too).

    Args:
        graph (AttributionGraph): the graph.
        prompt (str): the text.
        slug (str): the graph's name in the viewer.
        scan (str, optional): the model's name as the viewer shows it (a name, not a path;
                    default ``"captum-ffb"``).
        token_ids (list[int], optional): the input's token ids (the graph's own by default).
        max_links (int, optional): refuse more kept links than this, as
                    :meth:`~captum_ffb.graph.record.AttributionGraph.to_dict` does.
        tokenizer (optional): decodes each token for ``prompt_tokens`` and the labels (without
                    one, byte-level BPE and SentencePiece pieces are decoded from their marks).
        pinned (list[str]): nodes to pin in the viewer (our ids or Neuronpedia's).
        supernodes (list): ``(name, [node, ...])`` groups to draw as one.
        clicked (str, optional): the node chosen in the viewer.
        query_key (dict, optional): head node id → its query–key pairs
                    (:meth:`~captum_ffb.graph.record.AttributionGraph.query_key_pairs`; computed
                    here for the largest heads when ``None`` and the graph can split scores;
                    ``{}`` for none).

    Returns:
        dict: ``{"metadata", "qParams", "nodes", "links", "qk_only_nodes"}``.
    """
    if scan is not None and (not isinstance(scan, str) or not scan.strip() or "/" in scan or "\\" in scan):
        raise ValueError(f"scan names the model for the viewer (a name, not a path), got {scan!r}")
    d = graph.data
    shown = graph.kept_links(max_links)
    token_ids = token_ids if token_ids is not None else graph.token_ids
    names = _Names(graph, token_ids, _prompt_tokens(graph, tokenizer, token_ids))
    shares = cumulative_influence(_influence(graph))
    kept = [k for k in graph.node_mask.nonzero()[:, 0].tolist() if names.written(k)]
    nodes = []
    for k in kept:
        node = {"feature_type": FEATURE_TYPES[d.kinds[k]], **names.node(k)}
        node["activation"] = None if d.kinds[k] == "output" else float(d.values[k])
        node["influence"] = float(shares[k])
        nodes.append(node)
    links = [{"source": names.theirs[int(s)], "target": names.theirs[int(t)], "weight": float(w)}
             for s, t, w in zip(d.sources[shown], d.targets[shown], d.weights[shown]) if names.written(int(t))]
    qk_only = _attach_query_key(graph, names, nodes, set(kept), query_key)
    thresholds = {name: graph.thresholds[name] for name in ("node_threshold", "edge_threshold")
                  if isinstance(graph.thresholds.get(name), (int, float))}
    metadata: dict[str, Any] = {
        "slug": slug, "scan": scan or "captum-ffb", "transcoder_list": [], "prompt_tokens": names.tokens,
        "prompt": prompt, "info": _info(), "pruning_settings": thresholds}
    if "node_threshold" in thresholds:
        metadata["node_threshold"] = thresholds["node_threshold"]
    if isinstance(graph.thresholds.get("max_nodes"), int):
        metadata["generation_settings"] = {"max_feature_nodes": graph.thresholds["max_nodes"]}
    q_params = _q_params(names, pinned, supernodes, clicked)
    found = {"metadata": metadata, "qParams": q_params, "nodes": nodes, "links": links}
    if qk_only:
        found["qk_only_nodes"] = qk_only
    return found


def _info() -> dict[str, Any]:
    from captum_ffb.core.versions import __version__

    return {"generator": {"name": "captum_ffb", "version": __version__},
            "create_time_ms": int(time.time() * 1000)}


def _q_params(names: _Names, pinned: Any, supernodes: Any, clicked: str | None) -> dict[str, Any]:
    pins = list(dict.fromkeys(theirs for node in pinned for theirs in names.drawn_of(str(node))))
    groups = []
    for group in supernodes:
        if not isinstance(group, (tuple, list)) or len(group) != 2 or not isinstance(group[0], str):
            raise ValueError(f"a supernode is (name, [node, ...]), got {group!r}")
        members = (theirs for node in group[1] for theirs in names.drawn_of(str(node)))
        groups.append([group[0], *dict.fromkeys(members)])
    chosen = "" if clicked is None else names.drawn_of(str(clicked))[0]  # the sum's: the target logit
    return {"pinnedIds": pins, "supernodes": groups, "linkType": "both", "clickedId": chosen, "sg_pos": ""}


def _attach_query_key(graph: Any, names: _Names, nodes: list[dict[str, Any]], kept: set[int],
                      query_key: dict[str, Any] | None) -> dict[str, Any]:
    """Put each split head's ``qk_tracing_results`` on its node; return the contributors the
    pruning left out (``qk_only_nodes``)."""
    if query_key is None:
        query_key = query_key_of(graph)
    if not query_key:
        return {}
    index = {node: k for k, node in enumerate(names.ours)}
    by_id = {node["node_id"]: node for node in nodes}
    outside: dict[str, Any] = {}
    for head, entries in query_key.items():
        if head not in index or names.theirs[index[head]] not in by_id:
            continue
        pairs, by_query, by_key = [], defaultdict(float), defaultdict(float)
        for entry in entries:
            for pair in entry["pairs"]:
                if pair["query"] not in index or pair["key"] not in index:
                    continue
                query, key = names.theirs_of(pair["query"]), names.theirs_of(pair["key"])
                pairs.append([query, key, float(pair["value"])])
                by_query[query] += float(pair["value"])
                by_key[key] += float(pair["value"])
                for node in (pair["query"], pair["key"]):
                    k = index[node]
                    if k not in kept:
                        outside[names.theirs[k]] = {"feature_type": FEATURE_TYPES[graph.data.kinds[k]],
                                                    **names.node(k), "activation": float(graph.data.values[k])}
        largest = sorted(pairs, key=lambda p: -abs(p[2]))

        def top(sums: dict[str, float]) -> list[list[Any]]:
            return [[node, value] for node, value in sorted(sums.items(), key=lambda kv: -abs(kv[1]))]

        by_id[names.theirs[index[head]]]["qk_tracing_results"] = {
            "pair_wise_contributors": largest, "top_q_marginal_contributors": top(by_query),
            "top_k_marginal_contributors": top(by_key)}
    return outside


def save_neuronpedia_graph(graph: Any, path: str | os.PathLike, prompt: str, **kwargs: Any) -> Path:
    """Write :func:`neuronpedia_graph` to ``path`` and return the path."""
    return write_json(path, neuronpedia_graph(graph, prompt, **kwargs))


def read_neuronpedia_state(source: str | os.PathLike | dict[str, Any], graph: Any = None) -> NeuronpediaState:
    r"""The pins, supernodes and chosen node a Neuronpedia graph file carries (its
    ``qParams``), in our node ids when ``graph`` is the graph it was written from.

    Only ``qParams`` is read; a file over ``MAX_STATE_BYTES`` (256 MB), or with more than
    ``MAX_PINS`` (10,000) pins, supernodes or members, is refused, as is anything not of the
    schema's types.

    Args:
        source (str, PathLike or dict): the file, or its parsed JSON.
        graph (AttributionGraph, optional): maps Neuronpedia's ids back to ours (without it
                    the ids stay Neuronpedia's).

    Returns:
        NeuronpediaState
    """
    data = _read_state_json(source) if not isinstance(source, dict) else source
    params = data.get("qParams", {}) if isinstance(data, dict) else None
    if not isinstance(params, dict):
        raise ValueError("a Neuronpedia graph file is a JSON object whose qParams is an object")
    names = None if graph is None else _Names(graph, graph.token_ids, list(graph.tokens))
    state = NeuronpediaState()

    def ours(node: Any, what: str) -> str | None:
        if not isinstance(node, str) or len(node) > 200:
            raise ValueError(f"qParams.{what} holds {_short(node)}: node ids are strings")
        if names is None:
            return node
        if node in names.by_theirs:
            return names.by_theirs[node]
        state.unknown.append(node)
        return None

    pins = _bounded_list(params.get("pinnedIds", []), "pinnedIds")
    state.pinned = [n for n in (ours(node, "pinnedIds") for node in pins) if n is not None]
    for group in _bounded_list(params.get("supernodes", []), "supernodes"):
        group = _bounded_list(group, "supernodes[...]")
        if not group or not isinstance(group[0], str) or len(group[0]) > 200:
            raise ValueError("qParams.supernodes holds a group that does not start with its name")
        members = [n for n in (ours(node, "supernodes") for node in group[1:]) if n is not None]
        state.supernodes.append((group[0], members))
    clicked = params.get("clickedId", "")
    if clicked not in ("", None):
        state.clicked = ours(clicked, "clickedId")
    return state


def _read_state_json(source: str | os.PathLike) -> Any:
    path = Path(source)
    size = path.stat().st_size
    if size > MAX_STATE_BYTES:
        raise ValueError(f"{path} has {size:,} bytes: a Neuronpedia graph file is read up to {MAX_STATE_BYTES:,}")
    try:
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a JSON file: {error}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"JSON has no {name}")


def _bounded_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"qParams.{what} must be a list, got {_short(value)}")
    if len(value) > MAX_PINS:
        raise ValueError(f"qParams.{what} has {len(value):,} entries, more than {MAX_PINS:,}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
