r"""Views of an :class:`~captum_ffb.graph.record.AttributionGraph`: an offline HTML page and the
JSON that circuit-tracer's frontend and Neuronpedia's graph viewer read.

The page (:func:`graph_html`) draws the kept graph as SVG, fitted to the window beside a fixed
details panel: the tokens along the bottom (every label visible), a row per block and writer
above them (attention, cross-attention, then FF; only rows with a kept node), a column per
position holding a kept writer (the others collapsed to thin columns, widened on a click),
the heads or neurons of one block at one position side by side, each labelled (``L23.H4``,
``L23.A``, ``FF29``, ``L23.N7``, ``L3.X``), the output on top at the explained position and
the bias at the left. A node's area grows with ``|value|`` (or ``|patch estimate|``, a
toggle); nodes and edges are red where positive and blue where negative (the package's one
colour scale), edges thicker where larger. Hovering shows a node's card, clicking lists its
in- and out-edges and, for a head, the writer pairs that made its score at the positions it
attends most (:meth:`~captum_ffb.graph.record.AttributionGraph.query_key_pairs`); shift-click pins,
and the pinned nodes can be shown alone or grouped into a named supernode whose edges are
its members' summed. Sliders re-prune the nodes (by influence) and edges (by ``|weight|``) in
the page; a search box finds nodes by id or token; wheel, drag and buttons zoom, pan and fit.
Everything is inline: the page requests nothing.

:func:`neuronpedia_graph` writes circuit-tracer 0.5's schema (``metadata``, ``qParams``,
``nodes``, ``links``) with only the four ``feature_type`` values circuit-tracer writes and its
viewer draws (:data:`FEATURE_TYPES`): tokens as ``embedding`` nodes; the output as the
``logit`` node, its ``feature`` the explained token's id (a contrast or a direction: the
virtual index ``n_units``, as circuit-tracer numbers a custom target) at the explained
position; every head, attention sublayer, cross-attention, FF block or neuron as a ``cross
layer transcoder`` node (the viewer's one kind of feature; ``feature`` the Cantor pairing of
its block and its index in the block, as circuit-tracer's); and the bias (the model's own
constants) as the one ``mlp reconstruction error`` node, the viewer's kind of node that
explains nothing further. There is no error node beyond it: the graph is exact.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from captum_ffb.graph.record import MAX_DICT_LINKS
from captum_ffb.io.files import write_json, write_text
from captum_ffb.viz._common import COLOUR_JS, cpu_view, display_token, display_tokens, escape, page
from captum_ffb.viz._graph_page import BODY, SCRIPT, STYLE

__all__ = ["graph_html", "neuronpedia_graph", "save_graph_html", "save_neuronpedia_graph"]

#: circuit-tracer's ``feature_type`` for each node kind of ours (circuit-tracer 0.5 writes
#: only these four: ``Node.token_node``, ``logit_node``, ``feature_node``, ``error_node``)
FEATURE_TYPES = {"token": "embedding", "output": "logit", "attention": "cross layer transcoder",
                 "head": "cross layer transcoder", "cross_attention": "cross layer transcoder",
                 "ff": "cross layer transcoder", "neuron": "cross layer transcoder",
                 "bias": "mlp reconstruction error"}


@cpu_view
def graph_html(graph: Any, title: str | None = None, query_key: dict[str, Any] | None = None) -> str:
    r"""The kept graph as one self-contained HTML page.

    Args:
        graph (AttributionGraph): the graph (pruned or not).
        title (str, optional): the page's title (default: what is explained).
        query_key (dict, optional): head node id → its query–key pairs
                    (:meth:`~captum_ffb.graph.record.AttributionGraph.query_key_pairs`; computed
                    here for the largest heads when ``None`` and the graph can split scores).

    Returns:
        str: the document.
    """
    data = graph.to_dict()
    if query_key is None:
        query_key = _query_key(graph)
    data["query_key"] = query_key
    data["labels"] = display_tokens(graph.tokens)  # the tokens as people read them
    data["output_text"] = shown = display_token(graph.output_label)
    explained = f"“{shown}”"
    if graph.probability is not None:
        explained += f" (p = {graph.probability:.3f})"
    aside = ""
    if graph.excluded_positions:  # ints in a well-formed graph; a file may carry anything
        aside = f" · set aside: the writers at position {escape(', '.join(map(str, graph.excluded_positions)))}"
    header = (f'<p class="meta">explains {escape(explained)} · value {escape(f"{graph.value:.4g}")} · '
              f'{escape(graph.granularity)} granularity · {int(graph.node_mask.sum())} of {len(graph.data)} nodes, '
              f'{int(graph.edge_mask.sum())} of {len(graph.data.weights)} edges kept, holding '
              f'{escape(_share(graph.kept_share))} of the output ({escape(_share(graph.kept_abs_share))} of its edges\' |weight|)'
              f'{aside}</p>')
    return page(title or f"Attribution graph of “{shown}”", BODY, header=header, style=STYLE,
                data={"ffb-graph-data": data}, script=[COLOUR_JS, SCRIPT])


def _query_key(graph: Any) -> dict[str, Any]:
    if getattr(graph, "scorer", None) is None or graph.granularity != "head":
        return {}
    try:
        return graph.query_key_pairs()
    except ValueError:  # a family whose attention computes its scores inline
        return {}


def _share(share: float) -> str:
    """A kept share as a percentage ("–" where it is not a number: the explained value is 0)."""
    return f"{share:.1%}" if math.isfinite(share) else "–"


def save_graph_html(graph: Any, path: str | os.PathLike, **kwargs: Any) -> Path:
    """Write :func:`graph_html` to ``path`` and return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_text(target, graph_html(graph, **kwargs))


def _cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


@cpu_view
def neuronpedia_graph(graph: Any, prompt: str, slug: str = "captum-ffb-graph", scan: str = "captum-ffb",
                      token_ids: list[int] | None = None, max_links: int | None = MAX_DICT_LINKS) -> dict[str, Any]:
    r"""The kept graph in circuit-tracer 0.5's JSON schema (what its frontend and Neuronpedia's
    graph viewer load).

    Args:
        graph (AttributionGraph): the graph.
        prompt (str): the text.
        slug (str): the graph's name in the viewer.
        scan (str): what produced it (a model's name).
        token_ids (list[int], optional): the input's token ids (in the tokens' node ids;
                    the graph's own by default).
        max_links (int, optional): refuse more kept links than this, as
                    :meth:`~captum_ffb.graph.record.AttributionGraph.to_dict` does.

    Returns:
        dict: ``{"metadata", "qParams", "nodes", "links"}``.
    """
    d = graph.data
    shown = graph.kept_links(max_links)
    ids = graph.ids()
    token_ids = token_ids if token_ids is not None else graph.token_ids
    layers = max([layer for layer in d.layers if layer >= 0], default=-1) + 1
    widths: dict[int, int] = {}
    for k in range(len(d)):
        if d.kinds[k] in ("head", "attention"):
            widths[d.layers[k]] = max(widths.get(d.layers[k], 0), d.heads[k] + 1)
    nodes, names = [], {}
    for k in graph.node_mask.nonzero()[:, 0].tolist():
        kind, layer, part, position = d.kinds[k], d.layers[k], d.heads[k], d.positions[k]
        value = float(d.values[k])
        influence = None if graph.influence is None else float(graph.influence[k])
        node: dict[str, Any] = {"feature_type": FEATURE_TYPES[kind], "activation": value, "influence": influence}
        if kind == "token":
            vocab = token_ids[position] if token_ids is not None else position
            node.update(node_id=f"E_{vocab}_{position}", feature=position, layer="E", ctx_idx=position,
                        jsNodeId=f"E_{vocab}-{position}")
        elif kind == "output":
            feature, position, label = _logit(graph)
            probability = graph.probability if graph.probability is not None else 0.0
            node.update(node_id=f"{layers + 1}_{feature}_{position}", feature=feature, layer=str(layers + 1),
                        ctx_idx=position, jsNodeId=f"L_{feature}-{position}", is_target_logit=True,
                        token_prob=probability, clerp=f'Output "{label}" (p={probability:.3f})', activation=None)
        elif kind == "bias":
            node.update(node_id="bias_0_0", feature=-1, layer="E", ctx_idx=0, jsNodeId="bias_0-0",
                        clerp="Bias: the model's own constants")
        else:
            heads = max(widths.get(layer, 1), 1)
            feature = {"head": part, "attention": 0, "cross_attention": heads, "ff": heads + 1,
                       "neuron": heads + 2 + part}[kind]
            node.update(node_id=f"{layer}_{feature}_{position}", feature=_cantor(layer, feature), layer=str(layer),
                        ctx_idx=position, jsNodeId=f"{layer}_{feature}-0",
                        clerp=ids[k].split("@")[0] + (f" @ {graph.tokens[position]}"
                                                      if 0 <= position < len(graph.tokens) else ""))
        names[ids[k]] = node["node_id"]
        nodes.append(node)
    links = [{"source": names[ids[int(s)]], "target": names[ids[int(t)]], "weight": float(w)}
             for s, t, w in zip(d.sources[shown], d.targets[shown], d.weights[shown])]
    metadata = {"slug": slug, "scan": scan, "transcoder_list": [], "prompt_tokens": list(graph.tokens),
                "prompt": prompt, "node_threshold": graph.thresholds.get("node_threshold"), "schema_version": 1}
    q_params = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": q_params, "nodes": nodes, "links": links}


def _logit(graph: Any) -> tuple[int, int, str]:
    """The logit node's ``feature``, ``ctx_idx`` and label as circuit-tracer writes them: the
    token id (a contrast's or a direction's: the virtual index ``n_units``), the explained
    position and the token as decoded (``" Paris"``, no quotes added)."""
    target = graph.target
    last = len(graph.tokens) - 1
    if target is None:  # a graph of before 0.4
        return 0, last, graph.output_label
    position = last if target.position is None else target.position
    if len(target.units) == 1:
        feature = target.units[0]
    else:
        feature = target.n_units if target.n_units is not None else 0
    if target.texts:
        label = " − ".join(target.texts)
    elif target.kind == "class":
        label = " − ".join(f"class {u}" for u in target.units)
    else:
        label = graph.output_label
    return feature, position, label


def save_neuronpedia_graph(graph: Any, path: str | os.PathLike, prompt: str, **kwargs: Any) -> Path:
    """Write :func:`neuronpedia_graph` to ``path`` and return the path."""
    return write_json(path, neuronpedia_graph(graph, prompt, **kwargs))
