r"""Views of an :class:`~captum_ffb.attr.AttributionGraph`: an offline HTML page and the
JSON that circuit-tracer's frontend and Neuronpedia's graph viewer read.

The page (:func:`graph_html`) draws the kept graph as SVG: the tokens along the bottom, a row
per block and writer above them (attention, cross-attention, then FF; heads or neurons side
by side within their position's column; only rows with a kept node), the output on top and
the bias at the left. A node's area grows with
``|value|``; an edge is red where its weight is positive and blue where negative (the
package's one colour scale), thicker where larger. Clicking a node lists its in- and
out-edges and, for a head, the writer pairs that made its score at the positions it
attends most (:meth:`~captum_ffb.attr.AttributionGraph.query_key_pairs`). Everything
is inline: the page requests nothing.

:func:`neuronpedia_graph` writes circuit-tracer 0.5's schema (``metadata``, ``qParams``,
``nodes``, ``links``): tokens as ``embedding`` nodes, the output as the ``logit`` node, the
model's own components as nodes of their own ``feature_type`` (``attention``, ``attention
head``, ``cross attention``, ``mlp``, ``mlp neuron``) and the bias as ``bias``. There is no error node: the graph
is exact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from captum_ffb.outputs import write_json, write_text
from captum_ffb.viz._common import COLOUR_JS, escape, page

__all__ = ["graph_html", "neuronpedia_graph", "save_graph_html", "save_neuronpedia_graph"]

#: circuit-tracer's ``feature_type`` for each node kind of ours
FEATURE_TYPES = {"token": "embedding", "output": "logit", "attention": "attention", "head": "attention head",
                 "cross_attention": "cross attention", "ff": "mlp", "neuron": "mlp neuron", "bias": "bias"}

_STYLE = """
#ffb-graph-wrap { display: flex; flex-wrap: wrap; gap: 14px; align-items: flex-start; }
#ffb-graph { border: 1px solid var(--line); background: #fff; flex: none; }
#ffb-graph .node { cursor: pointer; stroke: #333; stroke-width: .6; }
#ffb-graph .node.chosen { stroke: #000; stroke-width: 2.5; }
#ffb-graph .edge { fill: none; }
#ffb-graph .edge.faded { opacity: .08; }
#ffb-graph text { font-size: 11px; fill: var(--ink); }
#ffb-graph text.row { fill: var(--muted); font-size: 10px; }
#ffb-panel { min-width: 300px; max-width: 420px; font-size: 12.5px; }
#ffb-panel h3 { font-size: 14px; margin: 0 0 .3em; }
#ffb-panel ol { padding-left: 1.4em; margin: .2em 0 .6em; }
#ffb-panel .pos { color: #b2182b; } #ffb-panel .neg { color: #2166ac; }
"""

_SCRIPT = r"""
(function () {
  "use strict";
  var G = JSON.parse(document.getElementById("ffb-graph-data").textContent);
  var svg = document.getElementById("ffb-graph"), panel = document.getElementById("ffb-panel");
  var NS = "http://www.w3.org/2000/svg";  // the SVG namespace's name, not a request
  var n = G.tokens.length, parts = {}, rowOf = {}, rows = [];
  var ROW = {attention: 0, head: 0, cross_attention: 1, ff: 2, neuron: 2}, LABEL = ["attention", "cross-attention", "FF"];
  G.nodes.forEach(function (d) {
    if (d.layer >= 0 && rowOf[d.layer + "." + ROW[d.kind]] === undefined) {
      rowOf[d.layer + "." + ROW[d.kind]] = -1; rows.push([d.layer, ROW[d.kind]]);
    }
    if (d.head >= 0) { var k = d.layer + "." + d.kind; parts[k] = Math.max(parts[k] || 0, d.head + 1); }
  });
  rows.sort(function (a, b) { return a[0] - b[0] || a[1] - b[1]; });
  rows.forEach(function (r, i) { rowOf[r[0] + "." + r[1]] = i; });
  var col = Math.max(64, Math.min(120, 900 / Math.max(n, 1))), rowH = 46, left = 120, bottom = 70;
  var width = left + col * n + 20, height = bottom + rowH * (rows.length + 1) + 30;
  svg.setAttribute("width", width); svg.setAttribute("height", height);
  var byId = {}, top = 0;
  G.nodes.forEach(function (d) {
    if (d.kind !== "output" && d.kind !== "bias") top = Math.max(top, Math.abs(d.value));
  });
  function place(d) {
    var y, x = left + col * (d.position + 0.5);
    if (d.kind === "token") y = height - bottom + 18;
    else if (d.kind === "output") { x = left + col * (n - 0.5); y = 24; }
    else if (d.kind === "bias") { x = 30; y = height - bottom + 18; }
    else {
      y = height - bottom - rowH * (rowOf[d.layer + "." + ROW[d.kind]] + 1);
      if (d.head >= 0) { var m = parts[d.layer + "." + d.kind]; x += (d.head + 0.5 - m / 2) * (col * 0.8 / m); }
    }
    return [x, y];
  }
  function radius(d) {
    if (d.kind === "output") return 10;
    return 2.5 + 11 * Math.sqrt(Math.min(1, Math.abs(d.value) / (top || 1)));
  }
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    (parent || svg).appendChild(e);
    return e;
  }
  rows.forEach(function (r, i) {
    var y = height - bottom - rowH * (i + 1);
    el("line", {x1: left, x2: width - 10, y1: y, y2: y, stroke: "#eee"});
    el("text", {x: 4, y: y + 4, "class": "row"}).textContent = "block " + r[0] + " " + LABEL[r[1]];
  });
  if (G.n_source) {  // an encoder–decoder: the source's columns, then the target's
    var xs = left + col * G.n_source;
    el("line", {x1: xs, x2: xs, y1: 10, y2: height - 10, stroke: "#999", "stroke-dasharray": "4 3"});
    el("text", {x: xs - 6, y: height - 6, "text-anchor": "end", "class": "row"}).textContent = "source";
    el("text", {x: xs + 6, y: height - 6, "class": "row"}).textContent = "target";
  }
  var edgeLayer = el("g", {}), nodeLayer = el("g", {});
  G.nodes.forEach(function (d) { d.xy = place(d); d.r = radius(d); d.into = []; d.out = []; byId[d.id] = d; });
  var wTop = 0;
  G.links.forEach(function (e) { if (!e.kind) wTop = Math.max(wTop, Math.abs(e.weight)); });
  var edges = [];
  G.links.forEach(function (e) {
    if (e.kind) return;  // query–key links are listed on their head, not drawn
    var s = byId[e.source], t = byId[e.target];
    if (!s || !t) return;
    s.out.push(e); t.into.push(e);
    var c = ffbColour.diverging((e.weight < 0 ? -1 : 1) * Math.max(Math.abs(e.weight), 0.45 * wTop), wTop);
    var mid = (s.xy[1] + t.xy[1]) / 2;
    var path = el("path", {"class": "edge", d: "M" + s.xy[0] + "," + s.xy[1] + " C" + s.xy[0] + "," + mid + " " + t.xy[0]
      + "," + mid + " " + t.xy[0] + "," + t.xy[1], stroke: ffbColour.css(c),
      "stroke-width": 0.4 + 3.5 * Math.abs(e.weight) / (wTop || 1), "stroke-opacity": 0.75}, edgeLayer);
    path.dataset.source = e.source; path.dataset.target = e.target;
    edges.push(path);
  });
  G.nodes.forEach(function (d) {
    var fill = d.kind === "token" || d.kind === "output" || d.kind === "bias" ? "#f6f8fa"
      : ffbColour.css(ffbColour.diverging(d.value, top));
    var c = el("circle", {"class": "node", cx: d.xy[0], cy: d.xy[1], r: d.r, fill: fill}, nodeLayer);
    c.dataset.id = d.id;
    el("title", {}, c).textContent = d.id + "  value " + fmt(d.value);
    c.addEventListener("click", function () { choose(d.id); });
    if (d.kind === "token" || d.kind === "output" || d.kind === "bias") {
      el("text", {x: d.xy[0], y: d.xy[1] + (d.kind === "output" ? -14 : 26), "text-anchor": "middle"}, nodeLayer)
        .textContent = d.kind === "bias" ? "bias" : d.token;
    }
  });
  function fmt(v) { return Math.abs(v) >= 1000 || (Math.abs(v) < 0.001 && v !== 0) ? v.toExponential(2) : (+v.toPrecision(3)).toString(); }
  function signed(v) { return '<span class="' + (v >= 0 ? "pos" : "neg") + '">' + fmt(v) + "</span>"; }
  function text(s) { var t = document.createElement("span"); t.textContent = s; return t.innerHTML; }
  function list(items, key) {
    items = items.slice().sort(function (a, b) { return Math.abs(b.weight) - Math.abs(a.weight); }).slice(0, 15);
    if (!items.length) return "<p>none kept</p>";
    return '<ol class="' + key + '">' + items.map(function (e) {
      return "<li><code>" + text(e[key]) + "</code> " + signed(e.weight) + "</li>";
    }).join("") + "</ol>";
  }
  function choose(id) {
    var d = byId[id];
    if (!d) return false;
    svg.querySelectorAll(".node.chosen").forEach(function (c) { c.classList.remove("chosen"); });
    svg.querySelector('.node[data-id="' + id + '"]').classList.add("chosen");
    edges.forEach(function (p) { p.classList.toggle("faded", p.dataset.source !== id && p.dataset.target !== id); });
    var h = "<h3><code>" + text(id) + "</code></h3><p>value " + signed(d.value)
      + (d.patch_estimate !== undefined ? " · patch estimate " + signed(d.patch_estimate) : "")
      + (d.influence !== undefined ? " · influence " + fmt(d.influence) : "") + "</p>"
      + "<h4>in-edges</h4>" + list(d.into, "source") + "<h4>out-edges</h4>" + list(d.out, "target");
    var qk = (G.query_key || {})[id];
    if (qk) {
      h += "<h4>why it attends there: query–key pairs</h4>";
      qk.forEach(function (k) {
        h += "<p>key position " + k.key_position + " (<code>" + text(G.tokens[k.key_position]) + "</code>), probability "
          + fmt(k.probability) + ", score " + signed(k.score) + '</p><ol class="qk">' + k.pairs.map(function (p) {
            return "<li><code>" + text(p.query) + "</code> · <code>" + text(p.key) + "</code> " + signed(p.value) + "</li>";
          }).join("") + "</ol>";
      });
    }
    panel.innerHTML = h;
    document.body.dataset.chosen = id;
    return true;
  }
  window.ffbGraph = { choose: choose, nodes: function () { return svg.querySelectorAll(".node").length; },
                      edges: function () { return edges.length; }, data: G };
  document.body.dataset.state = "drawn";
})();
"""


def graph_html(graph: Any, title: str | None = None, query_key: dict[str, Any] | None = None) -> str:
    r"""The kept graph as one self-contained HTML page.

    Args:
        graph (AttributionGraph): the graph (pruned or not).
        title (str, optional): the page's title (default: what is explained).
        query_key (dict, optional): head node id → its query–key pairs
                    (:meth:`~captum_ffb.attr.AttributionGraph.query_key_pairs`; computed
                    here for the largest heads when ``None`` and the graph can split scores).

    Returns:
        str: the document.
    """
    data = graph.to_dict()
    if query_key is None:
        query_key = _query_key(graph)
    data["query_key"] = query_key
    explained = f"“{graph.output_label}”"
    if graph.probability is not None:
        explained += f" (p = {graph.probability:.3f})"
    header = (f'<p class="meta">explains {escape(explained)} · value {graph.value:.4g} · '
              f'{graph.granularity} granularity · {int(graph.node_mask.sum())} of {len(graph.data)} nodes, '
              f'{int(graph.edge_mask.sum())} of {len(graph.data.weights)} edges kept, holding '
              f'{graph.kept_share:.1%} of the output</p>'
              '<p class="note">Tokens at the bottom, blocks upwards (attention, cross-attention, FF), the output on top. '
              'A node\'s size grows with |value| (its total effect on the output); edges are red where '
              'positive, blue where negative. Click a node for its edges (and a head\'s query–key pairs).</p>')
    body = ('<div id="ffb-graph-wrap"><div class="scroll"><svg id="ffb-graph"></svg></div>'
            '<div id="ffb-panel"><p class="note">Click a node.</p></div></div>')
    return page(title or f"Attribution graph of {graph.output_label}", body, header=header, style=_STYLE,
                data={"ffb-graph-data": data}, script=[COLOUR_JS, _SCRIPT])


def _query_key(graph: Any) -> dict[str, Any]:
    if graph.scorer is None or graph.granularity != "head":
        return {}
    try:
        return graph.query_key_pairs()
    except ValueError:  # a family whose attention computes its scores inline
        return {}


def save_graph_html(graph: Any, path: str | os.PathLike, **kwargs: Any) -> Path:
    """Write :func:`graph_html` to ``path`` and return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_text(target, graph_html(graph, **kwargs))


def _cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


def neuronpedia_graph(graph: Any, prompt: str, slug: str = "captum-ffb-graph", scan: str = "captum-ffb",
                      token_ids: list[int] | None = None) -> dict[str, Any]:
    r"""The kept graph in circuit-tracer 0.5's JSON schema (what its frontend and Neuronpedia's
    graph viewer load).

    Args:
        graph (AttributionGraph): the graph.
        prompt (str): the text.
        slug (str): the graph's name in the viewer.
        scan (str): what produced it (a model's name).
        token_ids (list[int], optional): the input's token ids (in the tokens' node ids;
                    the graph's own by default).

    Returns:
        dict: ``{"metadata", "qParams", "nodes", "links"}``.
    """
    d = graph.data
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
                        jsNodeId=f"E_{vocab}-{position}", clerp=f"Emb: {graph.tokens[position]}")
        elif kind == "output":
            position = len(graph.tokens) - 1
            probability = graph.probability if graph.probability is not None else 0.0
            node.update(node_id=f"{layers + 1}_0_{position}", feature=0, layer=str(layers + 1), ctx_idx=position,
                        jsNodeId=f"L_0-{position}", is_target_logit=True, token_prob=probability,
                        clerp=f'Output "{graph.output_label}" (p={probability:.3f})')
        elif kind == "bias":
            node.update(node_id="bias_0_0", feature=-2, layer="E", ctx_idx=0, jsNodeId="bias-0",
                        clerp="the model's own bias terms")
        else:
            heads = max(widths.get(layer, 1), 1)
            feature = {"head": part, "attention": 0, "cross_attention": heads, "ff": heads + 1,
                       "neuron": heads + 2 + part}[kind]
            node.update(node_id=f"{layer}_{feature}_{position}", feature=_cantor(layer, feature), layer=str(layer),
                        ctx_idx=position, jsNodeId=f"{layer}_{feature}-0",
                        clerp=ids[k] + (f" @ {graph.tokens[position]}" if 0 <= position < len(graph.tokens) else ""))
        names[ids[k]] = node["node_id"]
        nodes.append(node)
    shown = graph.node_mask[d.sources] & graph.node_mask[d.targets] & graph.edge_mask
    links = [{"source": names[ids[int(s)]], "target": names[ids[int(t)]], "weight": float(w)}
             for s, t, w in zip(d.sources[shown], d.targets[shown], d.weights[shown])]
    metadata = {"slug": slug, "scan": scan, "transcoder_list": [], "prompt_tokens": list(graph.tokens),
                "prompt": prompt, "node_threshold": graph.thresholds.get("node_threshold"), "schema_version": 1}
    q_params = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": q_params, "nodes": nodes, "links": links}


def save_neuronpedia_graph(graph: Any, path: str | os.PathLike, prompt: str, **kwargs: Any) -> Path:
    """Write :func:`neuronpedia_graph` to ``path`` and return the path."""
    return write_json(path, neuronpedia_graph(graph, prompt, **kwargs))
