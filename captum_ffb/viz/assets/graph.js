(function () {
  "use strict";
  var G = JSON.parse(document.getElementById("ffb-graph-data").textContent);
  function $(id) { return document.getElementById(id); }
  var svg = $("ffb-graph"), stage = $("ffb-stage"), detail = $("ffb-detail"), side = $("ffb-side"), card = $("ffb-card");
  var NS = svg.namespaceURI;  // the SVG namespace, read from the element the parser made
  var FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
  var n = G.tokens.length, words = G.labels || G.tokens;
  var ROW = {attention: 0, head: 0, cross_attention: 1, ff: 2, neuron: 2}, ROWNAME = ["attn", "x-attn", "FF"];
  var ALWAYS = {token: 1, bias: 1, output: 1, logit: 1};
  var R = 9, RMIN = 2.5, COLLAPSED = 18;

  // ------------------------------------------------------------------ nodes, edges, labels
  var byId = {}, nodes = [], links = [], outPos = n - 1;
  G.nodes.forEach(function (d) {
    var u = {id: d.id, kind: d.kind, layer: d.layer, head: d.head, position: d.position, value: d.value,
             influence: d.influence, patch: d.patch_estimate, d: d, into: [], out: []};
    if (d.kind === "output") { if (!(d.position >= 0 && d.position < n)) u.position = n - 1; outPos = u.position; }
    if (d.kind === "bias") u.position = -1;
    u.label = label(u);
    u.writes = lens(d);
    byId[u.id] = u; nodes.push(u);
  });
  G.links.forEach(function (e) {
    if (e.kind) return;  // query–key links are listed on their head, not drawn
    var s = byId[e.source], t = byId[e.target];
    if (!s || !t) return;
    var l = {source: e.source, target: e.target, weight: e.weight, patch: e.patch_estimate};
    s.out.push(l); t.into.push(l); links.push(l);
  });
  var hasPatch = nodes.some(function (u) { return u.patch !== undefined; });
  var hasInfluence = nodes.some(function (u) { return !ALWAYS[u.kind] && u.influence; });
  function label(u) {
    var h = u.head >= 0 ? u.head : null;
    switch (u.kind) {
      case "head": return "L" + u.layer + ".H" + h;
      case "attention": return "L" + u.layer + ".A" + (h === null ? "" : h);
      case "cross_attention": return "L" + u.layer + ".X" + (h === null ? "" : h);
      case "ff": return "FF" + u.layer;
      case "neuron": return "L" + u.layer + ".N" + h;
      case "token": return words[u.position] !== undefined ? words[u.position] : "token " + u.position;
      case "bias": return "bias";
      case "output": return G.output_text || G.output || "output";
      case "logit":  // one of several outputs: its token and probability
        return (typeof u.d.token === "string" ? JSON.stringify(u.d.token) : "#" + u.d.token_id)
          + (typeof u.d.probability === "number" ? " p=" + u.d.probability.toFixed(2) : "");
      default: return u.name || u.id;
    }
  }
  // What a writer writes, read through the unembedding (a logit lens of its write): the
  // tokens it promotes most, then those it suppresses most (strings only, at most 10 each).
  function lens(d) {
    function strings(a) {
      return Array.isArray(a) ? a.filter(function (t) { return typeof t === "string"; }).slice(0, 10) : [];
    }
    var up = strings(d.promotes), down = strings(d.suppresses);
    return up.length || down.length ? {promotes: up, suppresses: down} : null;
  }
  // a node's label as drawn: the name its user gave it, else its place and the token its write
  // promotes most ("L23.H4 ↑Paris")
  function shownLabel(u) {
    if (S.names[u.id]) return S.names[u.id];
    return u.writes && u.writes.promotes.length ? u.label + " ↑" + u.writes.promotes[0] : u.label;
  }
  function place(u) {  // "L23.H4 at 9 “of”"
    if (u.kind === "token" || u.kind === "bias" || u.kind === "output" || !(u.position >= 0)) return u.label;
    return u.label + " at " + u.position + " “" + words[u.position] + "”";
  }
  function fmt(v) {
    if (v === undefined || v === null || v !== v) return "–";
    v = Number(v);  // a number's text, whatever a file carries
    if (v !== v) return "–";
    return Math.abs(v) >= 1000 || (Math.abs(v) < 0.001 && v !== 0) ? v.toExponential(2) : (+v.toPrecision(3)).toString();
  }
  function signed(v) { return '<span class="' + (v >= 0 ? "pos" : "neg") + '">' + fmt(v) + "</span>"; }
  function esc(s) { return String(s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }

  // ------------------------------------------------------------------ the page's state
  var S = {nodeShare: 1, edgeShare: 1, pinnedOnly: false, size: "value", chosen: null, pinned: {}, expanded: {},
           query: "", matches: [], positions: {}, hover: null, lists: {}, names: {}, sub: false, sg: {}};
  var groups = {}, groupCount = 0, memberOf = {}, view = null, vb = null, drawn = {nodes: 0, edges: []};
  function unit(id) { return memberOf[id] || id; }
  function get(id) { return byId[id] || groups[id]; }
  function strength(u) { return Math.abs(hasInfluence && u.influence !== undefined ? u.influence : u.value); }
  function measureOf(u) { return S.size === "patch" && u.patch !== undefined ? u.patch : u.value; }
  // an edge's: its weight, or (size "patch") its patch estimate where the graph carries one
  function edgeMeasure(e) { return S.size === "patch" && e.patch !== undefined ? e.patch : e.weight; }

  // Where a unit sits along the stream: tokens and the bias first, writers by (block, row),
  // the output last (a group where its largest member does). Edges run from lower to higher.
  function rank(u) {
    if (u.kind === "group") return rank(get(u.rep));
    if (u.kind === "token" || u.kind === "bias") return -1;
    if (u.kind === "output") return 1e9;
    if (u.kind === "logit") return 1e9 - 1;
    return u.layer * 3 + (ROW[u.kind] !== undefined ? ROW[u.kind] : 2);
  }
  // every drawn link between units (a group's summed over its members), one per pair
  function unitEdges() {
    var found = {}, edges = [];
    links.forEach(function (l) {
      var s = unit(l.source), t = unit(l.target);
      if (s === t) return;
      var k = s + "\n" + t, e = found[k];
      if (!e) { e = found[k] = {source: s, target: t, weight: 0, parts: 0}; edges.push(e); }
      e.weight += l.weight; e.parts += 1;
      if (l.patch !== undefined) e.patch = (e.patch || 0) + l.patch;
    });
    return edges;
  }
  function byAbs(a, b) { return Math.abs(b.weight) - Math.abs(a.weight); }

  // What is shown: the writers holding the chosen share of the influence (tokens, the bias, the
  // output and the pinned nodes always); of each shown node's in-edges from shown nodes, those holding the
  // chosen share of its |weight| (its largest always); then, for every shown writer with no
  // route to the output (or from the tokens) through what is shown, its strongest route
  // added, edge by edge, with the nodes it passes. Or the pinned subgraph. Grouped nodes are
  // their group.
  function compute() {
    var keep = {}, all = unitEdges();
    if (S.pinnedOnly) {
      Object.keys(S.pinned).forEach(function (id) { if (get(id)) keep[id] = true; });
      return {keep: keep, edges: all.filter(function (e) { return keep[e.source] && keep[e.target]; }).sort(byAbs), added: 0};
    }
    var writers = nodes.filter(function (u) { return !ALWAYS[u.kind]; });
    nodes.forEach(function (u) { if (ALWAYS[u.kind]) keep[unit(u.id)] = true; });
    writers.sort(function (a, b) { return strength(b) - strength(a); });
    var total = writers.reduce(function (s, u) { return s + strength(u); }, 0), acc = 0;
    writers.forEach(function (u) {
      if (S.nodeShare >= 1 || !(total > 0) || acc < S.nodeShare * total * (1 - 1e-12)) keep[unit(u.id)] = true;
      acc += strength(u);
    });
    Object.keys(S.pinned).forEach(function (id) { if (get(id)) keep[unit(id)] = true; });
    var edges = all.filter(function (e) { return keep[e.source] && keep[e.target]; });
    if (S.edgeShare < 1) edges = shareOfEach(edges, S.edgeShare);
    var added = connect(keep, edges, all);
    return {keep: keep, edges: edges.sort(byAbs), added: added};
  }
  function shareOfEach(edges, share) {  // per target, the in-edges holding `share` of its |weight|
    var into = {}, kept = [];
    edges.forEach(function (e) { (into[e.target] = into[e.target] || []).push(e); });
    Object.keys(into).forEach(function (t) {
      var list = into[t].sort(byAbs), sum = list.reduce(function (s, e) { return s + Math.abs(e.weight); }, 0), run = 0;
      list.forEach(function (e, i) {
        if (i === 0 || run < share * sum * (1 - 1e-12)) kept.push(e);
        run += Math.abs(e.weight);
      });
    });
    return kept;
  }
  // Shown writers cut off from the output (or from the tokens) get their strongest route
  // back: the largest out-edge (in-edge) to a later (earlier) unit, step by step, until a unit
  // that reaches the output (is reached from the tokens). Returns how many nodes it added.
  function connect(keep, edges, all) {
    var outOf = {}, inTo = {}, have = {}, added = 0;
    all.forEach(function (e) {
      (outOf[e.source] = outOf[e.source] || []).push(e); (inTo[e.target] = inTo[e.target] || []).push(e);
    });
    edges.forEach(function (e) { have[e.source + "\n" + e.target] = true; });
    function closure(starts, forward) {  // what the starts reach along the shown edges
      var seen = {}, stack = starts.slice(), next = {};
      edges.forEach(function (e) {
        var a = forward ? e.source : e.target, b = forward ? e.target : e.source;
        (next[a] = next[a] || []).push(b);
      });
      starts.forEach(function (id) { seen[id] = true; });
      while (stack.length) (next[stack.pop()] || []).forEach(function (b) { if (!seen[b]) { seen[b] = true; stack.push(b); } });
      return seen;
    }
    function mend(forward) {
      var ends = Object.keys(keep).filter(function (id) {
        var k = get(id).kind;
        return forward ? k === "output" : k === "token" || k === "bias";
      });
      var reached = closure(ends, !forward);  // forward: what reaches the output
      var stuck = Object.keys(keep).filter(function (id) { return !ALWAYS[get(id).kind] && !reached[id]; });
      stuck.sort(function (a, b) { return forward ? rank(get(b)) - rank(get(a)) : rank(get(a)) - rank(get(b)); });
      stuck.forEach(function (id) {
        var at = id, route = [];
        for (var step = 0; !reached[at] && step < 4096; step++) {
          var here = rank(get(at)), choices = ((forward ? outOf : inTo)[at] || []).filter(function (e) {
            var r = rank(get(forward ? e.target : e.source));
            return forward ? r > here : r < here;
          }).sort(byAbs);
          if (!choices.length) break;
          route.push(choices[0]);
          at = forward ? choices[0].target : choices[0].source;
        }
        if (!reached[at]) return;
        route.forEach(function (e) {
          var k = e.source + "\n" + e.target;
          if (!have[k]) { have[k] = true; edges.push(e); }
          [e.source, e.target].forEach(function (u) { if (!keep[u]) { keep[u] = true; added += 1; } reached[u] = true; });
        });
        reached[id] = true;
      });
    }
    mend(true);
    mend(false);
    return added;
  }

  // ------------------------------------------------------------------ layout
  var ctx = document.createElement("canvas").getContext("2d");
  var widths = {};
  function textWidth(s, px, weight) {
    var key = px + (weight || "") + "|" + s;
    if (widths[key] === undefined) { ctx.font = (weight || "") + " " + px + "px " + FONT; widths[key] = ctx.measureText(s).width; }
    return widths[key];
  }
  function anchor(u) {  // where a node sits: {row, position} (a group where its largest member does)
    if (u.kind === "group") return anchor(get(u.rep));
    if (u.kind === "token" || u.kind === "output" || u.kind === "bias" || u.kind === "logit") return {row: u.kind, position: u.position};
    return {row: u.layer * 3 + (ROW[u.kind] !== undefined ? ROW[u.kind] : 2), position: u.position};
  }
  function order(a, b) {
    var x = a.kind === "group" ? get(a.rep) : a, y = b.kind === "group" ? get(b.rep) : b;
    return x.layer - y.layer || (ROW[x.kind] || 0) - (ROW[y.kind] || 0) || x.head - y.head || (x.id < y.id ? -1 : 1);
  }
  function truncate(s, px, width) {
    if (textWidth(s, px) <= width) return s;
    while (s.length > 1 && textWidth(s + "…", px) > width) s = s.slice(0, -1);
    return s + "…";
  }

  function layout(keep, W, H) {
    var units = Object.keys(keep).map(get), cells = {}, rowSet = {}, need = [], p, k;
    for (p = 0; p < n; p++) need[p] = 0;
    var hasOutput = false, labelW = 24, logitNodes = [];
    units.forEach(function (u) {
      var a = anchor(u);
      if (u.kind === "output") hasOutput = true;
      if (u.kind === "logit") logitNodes.push(u);
      if (typeof a.row !== "number") return;
      rowSet[a.row] = true;
      var key = a.row + "|" + a.position;
      (cells[key] = cells[key] || []).push(u);
      need[a.position] = Math.max(need[a.position], cells[key].length);
      labelW = Math.max(labelW, Math.min(textWidth(shownLabel(u), 11, u.kind === "group" ? "600" : ""), 150));
    });
    var rows = Object.keys(rowSet).map(Number).sort(function (a, b) { return a - b; });
    var rowNames = rows.map(function (r) { return "L" + Math.floor(r / 3) + " " + ROWNAME[r % 3]; });
    var left = Math.max(44, 14 + Math.max.apply(null, [0].concat(rowNames.map(function (s) { return textWidth(s, 10.5); }))));
    var slot = 2 * R + 6 + labelW + 8, right = 12;
    // columns: widths from the width the page has
    var expanded = [], desired = [], minimum = [], tokW = [], fixed = 0;
    for (p = 0; p < n; p++) {
      tokW[p] = Math.min(textWidth(String(words[p]), 12) + 12, 120);
      expanded[p] = need[p] > 0 || !!S.expanded[p] || (hasOutput && p === outPos);
      if (!expanded[p]) { fixed += COLLAPSED; continue; }
      minimum[p] = need[p] > 0 ? slot : Math.max(36, Math.min(tokW[p], 90));
      desired[p] = Math.max(need[p] * slot, Math.min(tokW[p], 120), minimum[p]);
    }
    var budget = W - left - right - fixed, open = [], sumDesired = 0;
    for (p = 0; p < n; p++) if (expanded[p]) { open.push(p); sumDesired += desired[p]; }
    var width = [];
    if (sumDesired <= budget) {
      var extra = open.length ? (budget - sumDesired) / open.length : 0;
      open.forEach(function (q) { width[q] = Math.min(desired[q] + extra, Math.max(desired[q] * 2.2, 170)); });
    } else {  // the widest columns give way, down to one node a line
      var sorted = open.map(function (q) { return desired[q]; }).sort(function (a, b) { return a - b; }), cap = 0, used = 0;
      for (k = 0; k < sorted.length; k++) {
        var c = (budget - used) / (sorted.length - k);
        if (sorted[k] >= c) { cap = c; break; }
        used += sorted[k]; cap = sorted[k];
      }
      open.forEach(function (q) { width[q] = Math.max(Math.min(desired[q], cap), minimum[q]); });
    }
    var x0 = [], x = left, perLine = [];
    for (p = 0; p < n; p++) {
      if (!expanded[p]) width[p] = COLLAPSED;
      x0[p] = x; x += width[p];
      perLine[p] = Math.max(1, Math.floor((width[p] + 0.01) / slot));
    }
    var totalW = x + right;
    // rows: heights from the height the page has
    var lines = rows.map(function (r) {
      var most = 1;
      for (var q = 0; q < n; q++) {
        var cell = cells[r + "|" + q];
        if (cell) most = Math.max(most, Math.ceil(cell.length / perLine[q]));
      }
      return most;
    });
    var totalLines = lines.reduce(function (a, b) { return a + b; }, 0);
    var top = (hasOutput ? 50 : 14) + (logitNodes.length ? 40 : 0), collapsedText = 0;
    for (p = 0; p < n; p++) if (!expanded[p]) collapsedText = Math.max(collapsedText, Math.min(textWidth(String(words[p]), 11), 84));
    var bottom = R + 12 + R + 6 + Math.max(16, collapsedText + 4);
    var lineH = totalLines ? Math.max(16, Math.min(totalLines > 6 ? 46 : 90, (H - top - bottom - 8) / totalLines)) : 46;
    var rmax = Math.max(4, Math.min(R, (lineH - 3) / 2));
    var spot = {}, rowBands = [], y = top + totalLines * lineH;
    rows.forEach(function (r, i) {
      var h = lines[i] * lineH, yTop = y - h;
      rowBands.push({row: r, name: rowNames[i], top: yTop, height: h});
      for (var q = 0; q < n; q++) {
        var cell = cells[r + "|" + q];
        if (!cell) continue;
        cell.sort(order);
        var per = Math.min(cell.length, perLine[q]), count = Math.ceil(cell.length / per);
        var xs = x0[q] + (width[q] - per * slot) / 2, ys = yTop + (lines[i] - count) * lineH / 2;
        cell.forEach(function (u, j) {
          spot[u.id] = {x: xs + (j % per) * slot + R + 3, y: ys + Math.floor(j / per) * lineH + lineH / 2, anchor: "start"};
        });
      }
      y = yTop;
    });
    var tokenY = top + totalLines * lineH + R + 12;
    units.forEach(function (u) {
      var a = anchor(u);
      if (a.row === "token") spot[u.id] = {x: x0[a.position] + width[a.position] / 2, y: tokenY};
      else if (a.row === "output") spot[u.id] = {x: x0[outPos] + width[outPos] / 2, y: 24};
      else if (a.row === "logit") spot[u.id] = logitSpot(u);
      else if (a.row === "bias") spot[u.id] = {x: left / 2, y: tokenY};
    });
    function logitSpot(u) {  // several outputs side by side below the output, around its column
      logitNodes.sort(function (a, b) { return Math.abs(b.value) - Math.abs(a.value); });
      var gap = Math.max.apply(null, logitNodes.map(function (v) { return textWidth(shownLabel(v), 11); })) + 2 * R + 14;
      var k = logitNodes.indexOf(u), m = logitNodes.length, centre = x0[outPos] + width[outPos] / 2;
      var first = Math.max(left + R, Math.min(centre - (m - 1) * gap / 2, totalW - right - (m - 1) * gap - gap));
      return {x: first + k * gap, y: 64};
    }
    return {place: spot, rows: rowBands, x0: x0, cols: width, expanded: expanded, left: left, top: top,
            tokenY: tokenY, lineH: lineH, rmax: rmax, width: totalW, height: tokenY + R + 6 + Math.max(16, collapsedText + 4) + 6,
            writerBottom: top + totalLines * lineH};
  }

  // ------------------------------------------------------------------ drawing
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    (parent || svg).appendChild(e);
    return e;
  }
  function tops() {
    var value = 0, patch = 0;
    nodes.forEach(function (u) {
      if (u.kind === "output" || u.kind === "bias") return;
      value = Math.max(value, Math.abs(u.value));
      if (u.patch !== undefined) patch = Math.max(patch, Math.abs(u.patch));
    });
    return {value: value, patch: patch};
  }
  function radius(u, top, rmax) {
    if (u.kind === "output") return rmax + 1;
    var usesPatch = S.size === "patch" && u.patch !== undefined, scale = usesPatch ? top.patch : top.value;
    return RMIN + (rmax - RMIN) * Math.sqrt(Math.min(1, Math.abs(measureOf(u)) / (scale || 1)));
  }
  function fill(u, top) {
    if (u.kind === "output") return "#ffffff";
    var usesPatch = S.size === "patch" && u.patch !== undefined;
    return ffbColour.css(ffbColour.diverging(measureOf(u), usesPatch ? top.patch : top.value));
  }

  // The layout for the stage's size; when it needs more room than that (rows of 16 px, columns
  // of one node a line), the largest scale s < 1 at which a layout for (W / s, H / s) fits.
  function arrange(keep, W, H) {
    function fits(L, w, h) { return L.width <= w + 0.5 && L.height <= h + 0.5; }
    var found = layout(keep, W, H);
    found.scale = 1;
    if (fits(found, W, H)) return found;
    var lo = 0.25, hi = 1;
    for (var i = 0; i < 9; i++) {
      var mid = (lo + hi) / 2;
      if (fits(layout(keep, W / mid, H / mid), W / mid, H / mid)) lo = mid; else hi = mid;
    }
    found = layout(keep, W / lo, H / lo);
    found.scale = lo;
    return found;
  }

  // On load, a graph whose whole drawing would shrink its labels below 9 px (a whole graph's
  // pruning of hundreds of nodes) starts with the largest node share whose drawing keeps them
  // legible; the nodes slider at 100% shows everything. Returns the share chosen (1: all).
  // The rule's share stays the page's own until the nodes slider moves (or a shared state sets
  // it): a stage made narrower or wider (the subgraph panel, the window) applies it again.
  var LEGIBLE = 9 / 11, legibleShare = 1, autoNodes = false;
  function relegible() { if (autoNodes) legibleShare = legible(); }
  function legible() {
    var W = Math.max(stage.clientWidth, 200), H = Math.max(stage.clientHeight, 160);
    function scaleAt(share) { S.nodeShare = share; return arrange(compute().keep, W, H).scale; }
    if (scaleAt(1) >= LEGIBLE) { S.nodeShare = 1; return 1; }
    var lo = 0.02, hi = 1;
    for (var i = 0; i < 7; i++) {
      var mid = (lo + hi) / 2;
      if (scaleAt(mid) >= LEGIBLE) lo = mid; else hi = mid;
    }
    S.nodeShare = Math.floor(lo * 100) / 100 || 0.01;
    controls();
    return S.nodeShare;
  }

  function render(refit, again) {
    var shown = compute(), W = Math.max(stage.clientWidth, 200), H = Math.max(stage.clientHeight, 160);
    view = arrange(shown.keep, W, H);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var L = view, top = tops(), back = el("g", {"class": "back"}), edgeLayer = el("g", {"class": "edges"});
    var nodeLayer = el("g", {"class": "nodes"}), labelLayer = el("g", {"class": "labels"});
    var stripe = 0;
    for (var p = 0; p < n; p++) {
      if (L.expanded[p] && stripe++ % 2 === 0) {
        el("rect", {"class": "stripe", x: L.x0[p], y: L.top - 6, width: L.cols[p], height: L.writerBottom - L.top + 12}, back);
      }
    }
    L.rows.forEach(function (b) {
      el("line", {"class": "rowline", x1: L.left - 4, x2: L.width - 8, y1: b.top + b.height, y2: b.top + b.height}, back);
      el("text", {"class": "rowlabel", x: L.left - 8, y: b.top + b.height / 2 + 3.5, "text-anchor": "end"}, back).textContent = b.name;
    });
    if (G.n_source) {  // an encoder–decoder: the source's columns, then the target's
      var xs = L.x0[G.n_source];
      el("line", {x1: xs, x2: xs, y1: 4, y2: L.height - 4, stroke: "#8c959f", "stroke-dasharray": "4 3"}, back);
      el("text", {"class": "rowlabel", x: xs - 5, y: 12, "text-anchor": "end"}, back).textContent = "source";
      el("text", {"class": "rowlabel", x: xs + 5, y: 12}, back).textContent = "target";
    }
    // edges, weakest first so that the strong ones are drawn over them
    var wTop = shown.edges.reduce(function (m, e) { return Math.max(m, Math.abs(edgeMeasure(e))); }, 0) || 1;
    drawn = {nodes: 0, edges: shown.edges.slice(), added: shown.added};
    shown.edges.slice().reverse().forEach(function (e) {
      var s = L.place[e.source], t = L.place[e.target];
      if (!s || !t) return;
      var m = edgeMeasure(e), a = Math.abs(m) / wTop, mid = (s.y + t.y) / 2;
      var c = ffbColour.diverging((m < 0 ? -1 : 1) * Math.max(Math.abs(m), 0.45 * wTop), wTop);
      var path = el("path", {"class": "edge", d: "M" + s.x + "," + s.y + " C" + s.x + "," + mid + " " + t.x + "," + mid
        + " " + t.x + "," + t.y, stroke: ffbColour.css(c), "stroke-width": (0.5 + 4 * a).toFixed(2),
        "stroke-opacity": (0.12 + 0.78 * Math.sqrt(a)).toFixed(2)}, edgeLayer);
      path.dataset.source = e.source; path.dataset.target = e.target; path.dataset.weight = e.weight;
    });
    // nodes and their labels
    Object.keys(shown.keep).forEach(function (id) {
      var u = get(id), at = L.place[id];
      if (!at) return;
      var r = radius(u, top, L.rmax);
      var c = el("circle", {"class": "node kind-" + u.kind, cx: at.x.toFixed(2), cy: at.y.toFixed(2), r: r.toFixed(2),
                            fill: fill(u, top)}, nodeLayer);
      c.dataset.node = id;
      drawn.nodes += 1;
      if (u.kind === "token") return;
      var t;
      if (u.kind === "output") {
        var textOut = "→ " + u.label, right = at.x + r + 6 + textWidth(textOut, 13, "600") > L.width;
        t = el("text", {"class": "olabel", x: at.x + (right ? -(r + 6) : r + 6), y: at.y + 4.5,
                        "text-anchor": right ? "end" : "start"}, labelLayer);
        t.textContent = right ? u.label + " ←" : textOut;
      } else if (u.kind === "bias") {
        t = el("text", {"class": "nlabel", x: at.x, y: at.y + R + 14, "text-anchor": "middle"}, labelLayer);
        t.textContent = "bias";
      } else {
        t = el("text", {"class": "nlabel kind-" + u.kind, x: (at.x + r + 3.5).toFixed(2), y: (at.y + 3.8).toFixed(2)}, labelLayer);
        t.textContent = truncate(shownLabel(u), 11, 150);
      }
      t.dataset.label = id;
    });
    // every token's label, shown or not, along the bottom (upright in a collapsed column)
    for (var q = 0; q < n; q++) {
      var cx = L.x0[q] + L.cols[q] / 2, y0 = L.tokenY + R + 6, tl;
      if (L.expanded[q]) {
        tl = el("text", {"class": "tlabel", x: cx, y: y0 + 10, "text-anchor": "middle"}, labelLayer);
        tl.textContent = truncate(String(words[q]), 12, Math.max(L.cols[q] - 6, 14));
      } else {
        tl = el("text", {"class": "tlabel collapsed", x: cx + 4, y: y0, "text-anchor": "end",
                         transform: "rotate(-90 " + (cx + 4) + " " + y0 + ")"}, labelLayer);
        tl.textContent = truncate(String(words[q]), 11, 84);
      }
      tl.dataset.token = q;
    }
    $("ffb-counts").textContent = drawn.nodes + " of " + nodes.length + " nodes · " + drawn.edges.length
      + " of " + links.length + " edges shown" + (shown.added ? " · " + shown.added + " added to keep their routes" : "")
      + (legibleShare < 1 && S.nodeShare === legibleShare ? " · labels kept legible (nodes at 100%: all)" : "")
      + " · sizes: " + sizing();
    document.body.dataset.shown = drawn.nodes;
    if (!again && (stage.clientWidth !== W || stage.clientHeight !== H)) return render(true, true);  // the bars moved
    if (refit || !vb) fit(); else setViewBox(vb);
    drawSub();
    mark();
  }

  // ------------------------------------------------------------------ zoom, pan, fit
  function setViewBox(b) {
    vb = b;
    svg.setAttribute("viewBox", b.map(function (v) { return +v.toFixed(2); }).join(" "));
    return viewBox();
  }
  function viewBox() { return svg.getAttribute("viewBox").split(" ").map(Number); }
  // The drawing (its nodes and their labels, the tokens, the rows' names) centred in the stage,
  // up to twice the layout's own size: after every filter the view is fitted again, so what
  // is left fills the stage. From the layout's numbers, not the browser's text boxes.
  function drawingBox() {
    var L = view, x0 = Infinity, x1 = -Infinity, y0 = L.tokenY, r = L.rmax + 1;
    Object.keys(L.place).forEach(function (id) {
      var u = get(id), at = L.place[id], w = 0;
      if (u.kind === "output") w = 6 + textWidth("→ " + u.label, 13, "600");
      else if (u.kind !== "token" && u.kind !== "bias") w = 3.5 + Math.min(textWidth(shownLabel(u), 11), 150);
      x0 = Math.min(x0, at.x - r); x1 = Math.max(x1, Math.min(at.x + r + w, L.width)); y0 = Math.min(y0, at.y - r);
    });
    for (var p = 0; p < n; p++) {
      var c = L.x0[p] + L.cols[p] / 2, half = L.expanded[p] ? Math.min(textWidth(String(words[p]), 12), L.cols[p] - 6) / 2 : 8;
      x0 = Math.min(x0, c - half); x1 = Math.max(x1, c + half);
    }
    L.rows.forEach(function (b) { x0 = Math.min(x0, L.left - 8 - textWidth(b.name, 10.5)); });
    return [x0 - 6, y0 - 22, x1 + 6, L.height];  // room above for the counts line
  }
  function fit() {
    var W = Math.max(stage.clientWidth, 1), H = Math.max(stage.clientHeight, 1), box = drawingBox();
    var bw = box[2] - box[0], bh = box[3] - box[1];
    var s = Math.min(W / bw, H / bh, 2), w = W / s, h = H / s, cx = (box[0] + box[2]) / 2, cy = (box[1] + box[3]) / 2;
    return setViewBox([cx - w / 2, cy - h / 2, w, h]);
  }
  function zoom(f, cx, cy) {
    if (cx === undefined) { cx = vb[0] + vb[2] / 2; cy = vb[1] + vb[3] / 2; }
    return setViewBox([cx - (cx - vb[0]) / f, cy - (cy - vb[1]) / f, vb[2] / f, vb[3] / f]);
  }
  function pan(dx, dy) {  // by screen pixels
    var k = vb[2] / Math.max(stage.clientWidth, 1);
    return setViewBox([vb[0] - dx * k, vb[1] - dy * k, vb[2], vb[3]]);
  }
  function toUser(ev) {
    var m = svg.getScreenCTM(), pt = svg.createSVGPoint();
    pt.x = ev.clientX; pt.y = ev.clientY;
    return pt.matrixTransform(m.inverse());
  }
  svg.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var at = toUser(ev);
    zoom(Math.pow(1.0015, -ev.deltaY), at.x, at.y);
  }, {passive: false});
  var drag = null;
  svg.addEventListener("mousedown", function (ev) {
    if (ev.button !== 0 || (ev.target.dataset && (ev.target.dataset.node !== undefined || ev.target.dataset.token !== undefined))) return;
    drag = {x: ev.clientX, y: ev.clientY, moved: 0};
    stage.classList.add("panning");
  });
  window.addEventListener("mousemove", function (ev) {
    if (!drag) return;
    var dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    drag.moved += Math.abs(dx) + Math.abs(dy); drag.x = ev.clientX; drag.y = ev.clientY;
    pan(dx, dy);
  });
  window.addEventListener("mouseup", function () {
    if (!drag) return;
    var still = drag.moved < 3;
    drag = null; stage.classList.remove("panning");
    if (still) clear();
  });

  // ------------------------------------------------------------------ hover card
  function top3(list, key) {
    return list.slice().sort(function (a, b) { return Math.abs(b.weight) - Math.abs(a.weight); }).slice(0, 3).map(function (e) {
      var o = get(e[key]);
      return esc(o ? place(o) : e[key]) + " " + signed(e.weight);
    }).join("<br>");
  }
  function cardHtml(u) {
    var e = edgesOf(u), h = "<b>" + esc(shownLabel(u)) + "</b> <span class=lbl>" + esc(u.id) + "</span><br>";
    if (u.position >= 0 && u.kind !== "output") h += "token " + esc(u.position) + " “" + esc(words[u.position]) + "”<br>";
    if (u.writes) h += writesHtml(u.writes) + "<br>";
    h += "value " + signed(u.value);
    if (u.influence !== undefined && u.kind !== "output") h += " · influence " + fmt(u.influence);
    if (u.patch !== undefined) h += " · patch estimate (" + esc(estimator("nodes")) + ") " + signed(u.patch);
    if (e.into.length) h += '<br><span class=lbl>top in-edges</span><br>' + top3(e.into, "source");
    if (e.out.length) h += '<br><span class=lbl>top out-edges</span><br>' + top3(e.out, "target");
    return h;
  }
  function showCard(ev, id) {
    var u = get(id);
    if (!u) return;
    card.innerHTML = cardHtml(u);
    card.style.display = "block";
    moveCard(ev);
  }
  function moveCard(ev) {  // beside the pointer, inside the stage (never over the details panel)
    var box = stage.getBoundingClientRect(), w = card.offsetWidth, h = card.offsetHeight;
    var x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + w > box.right - 4) x = ev.clientX - w - 14;
    if (y + h > box.bottom - 4) y = ev.clientY - h - 14;
    card.style.left = Math.max(box.left + 4, Math.min(x, box.right - w - 4)) + "px";
    card.style.top = Math.max(box.top + 4, Math.min(y, box.bottom - h - 4)) + "px";
  }
  svg.addEventListener("mouseover", function (ev) {
    var d = ev.target.dataset || {};
    if (d.node !== undefined) { showCard(ev, d.node); S.hover = d.node; mark(); }
    else if (d.token !== undefined) {
      var p = +d.token, wide = view.expanded[p];
      card.innerHTML = "<b>" + esc(words[p]) + "</b> <span class=lbl>position " + esc(p) + "</span>"
        + (!wide ? "<br>click to widen its column" : S.expanded[p] ? "<br>click to narrow its column" : "");
      card.style.display = "block";
      moveCard(ev);
    }
  });
  svg.addEventListener("mousemove", function (ev) { if (card.style.display === "block") moveCard(ev); });
  svg.addEventListener("mouseout", function (ev) {
    var d = ev.target.dataset || {};
    if (d.node !== undefined || d.token !== undefined) card.style.display = "none";
    if (d.node !== undefined && S.hover) { S.hover = null; mark(); }
  });
  svg.addEventListener("click", function (ev) {
    var d = ev.target.dataset || {};
    if (d.node !== undefined) {
      if (ev.shiftKey) pin(d.node); else choose(d.node);
    } else if (d.token !== undefined) {
      var p = +d.token;
      if (!view.expanded[p] || S.expanded[p]) expand(p);
      else { var tok = nodes.filter(function (u) { return u.kind === "token" && u.position === p; })[0]; if (tok) choose(unit(tok.id)); }
    }
  });

  // ------------------------------------------------------------------ selection, details
  function edgesOf(u) {  // a node's kept edges (a group's: its members' summed per other node)
    if (u.kind !== "group") return {into: u.into, out: u.out};
    var into = {}, out = {};
    links.forEach(function (l) {
      var s = unit(l.source), t = unit(l.target);
      if (s === t) return;
      if (t === u.id) into[s] = (into[s] || 0) + l.weight;
      if (s === u.id) out[t] = (out[t] || 0) + l.weight;
    });
    return {into: Object.keys(into).map(function (k) { return {source: k, target: u.id, weight: into[k]}; }),
            out: Object.keys(out).map(function (k) { return {source: u.id, target: k, weight: out[k]}; })};
  }
  function list(items, key, name) {  // a node's edges, largest first: 15, or all once asked
    items = items.slice().sort(function (a, b) { return Math.abs(b.weight) - Math.abs(a.weight); });
    if (!items.length) return "<p>none kept</p>";
    var shown = S.lists[name] ? items : items.slice(0, 15);
    return '<ol class="' + key + '" data-list="' + name + '">' + shown.map(function (e) {
      var other = get(e[key]), hidden = !(view && view.place[e[key]]);
      return '<li data-go="' + esc(e[key]) + '"' + (hidden ? ' class="hidden-node" title="not shown now"' : "") + "><code>"
        + esc(e[key]) + "</code> " + (other ? '<span class="lbl">' + esc(place(other)) + "</span> " : "") + signed(e.weight) + "</li>";
    }).join("") + "</ol>" + (items.length > 15 ? '<button data-act="more" data-list="' + name + '">'
      + (S.lists[name] ? "show the largest 15" : "show all " + items.length) + "</button>" : "");
  }
  function writesHtml(w) {  // the logit lens of a write: promoted ↑, suppressed ↓
    function toks(a) { return a.map(function (t) { return "<code>" + esc(t) + "</code>"; }).join(" "); }
    return (w.promotes.length ? '<span class="pos">↑</span> ' + toks(w.promotes.slice(0, 5)) : "")
      + (w.suppresses.length ? ' <span class="neg">↓</span> ' + toks(w.suppresses.slice(0, 5)) : "");
  }
  // the estimator behind the patch estimates of "nodes" or "edges" (the file's words, as text)
  function estimator(what) {
    var named = G.patch_estimators || {};
    return typeof named[what] === "string" ? named[what] : "default";
  }
  // what the sizes of nodes and edges show now, naming the estimator where one is used
  function sizing() {
    if (S.size !== "patch") return "|value| and exact edge weights";
    var edgesToo = links.some(function (l) { return l.patch !== undefined; });
    return "|patch estimate| by " + estimator("nodes") + (edgesToo ? ", edges by " + estimator("edges") : ", edges by exact weight");
  }
  function row(name, value) { return "<tr><td>" + name + "</td><td>" + value + "</td></tr>"; }
  function details(u) {
    var top = tops(), e = edgesOf(u);
    var h = '<div class="title"><span class="swatch" style="background:' + fill(u, top) + '"></span><h3>' + esc(shownLabel(u))
      + "</h3><code>" + esc(u.id) + "</code></div>";
    if (u.kind !== "token" && u.kind !== "output" && u.kind !== "bias") {
      h += '<label class="rename">label <input data-act="name" type="text" maxlength="200" value="' + esc(S.names[u.id] || "")
        + '" placeholder="' + esc(u.writes && u.writes.promotes.length ? u.label + " ↑" + u.writes.promotes[0] : u.label)
        + '" aria-label="this node\'s label"></label>';
    }
    h += "<table>";
    if (u.writes) h += row("writes", writesHtml(u.writes));
    h += row("kind", esc(u.kind === "group" ? "supernode of " + u.members.length : u.kind));
    if (u.layer >= 0 && u.kind !== "group") h += row("block", esc(u.layer) + (u.head >= 0 ? ", part " + esc(u.head) : ""));
    if (u.position >= 0 && u.kind !== "group") h += row("position", esc(u.position) + " “" + esc(words[u.position]) + "”");
    if (u.kind === "output") h += row("explains", esc(u.label));
    if (u.kind === "logit") h += row("one of several outputs", "token id " + esc(String(u.d.token_id)) + ", probability "
      + fmt(u.d.probability) + "; its value p·logit");
    if (u.kind === "output" && u.d) ["token_id", "negative_token_id", "class_index", "negative_class_index"].forEach(
      function (k) { if (u.d[k] !== undefined) h += row(k.replace(/_/g, " "), esc(String(u.d[k]))); });
    h += row(u.kind === "group" ? "value (sum)" : "value", signed(u.value));
    if (u.influence !== undefined && u.kind !== "output") h += row("influence", fmt(u.influence));
    if (u.patch !== undefined) h += row("patch estimate (" + esc(estimator("nodes")) + ")", signed(u.patch));
    var many = u.d && u.d.patch_estimates;
    if (many) Object.keys(many).forEach(function (k) { if (k !== "default") h += row("&nbsp;&nbsp;" + esc(k), signed(many[k])); });
    if (u.d && u.d.patch_kappa !== undefined) h += row("κ", fmt(u.d.patch_kappa));
    h += "</table>";
    h += '<button data-act="pin">' + (S.pinned[u.id] ? "unpin" : "pin") + "</button>";
    if (u.kind === "group") h += ' <button data-act="ungroup">ungroup</button>';
    h += "<h4>in-edges (" + e.into.length + ")</h4>" + list(e.into, "source", "in")
      + "<h4>out-edges (" + e.out.length + ")</h4>" + list(e.out, "target", "out");
    if (u.kind === "group") {
      h += "<h4>members</h4><ol class=\"members\">" + u.members.map(function (m) {
        return '<li data-go="' + esc(m) + '"><code>' + esc(m) + '</code> <span class="lbl">' + esc(place(byId[m])) + "</span></li>";
      }).join("") + "</ol>";
    }
    var qk = (G.query_key || {})[u.id];
    if (qk) {
      h += "<h4>why it attends there: query–key pairs</h4>";
      qk.forEach(function (k) {
        h += "<p>key position " + esc(k.key_position) + " (<code>" + esc(G.tokens[k.key_position]) + "</code>), probability "
          + fmt(k.probability) + ", score " + signed(k.score) + '</p><ol class="qk">' + k.pairs.map(function (p) {
            return "<li><code>" + esc(p.query) + "</code> · <code>" + esc(p.key) + "</code> " + signed(p.value) + "</li>";
          }).join("") + "</ol>";
      });
    }
    return h;
  }
  function choose(id) {
    var u = get(id);
    if (!u) return false;
    S.chosen = id;
    detail.innerHTML = details(u);
    document.body.dataset.chosen = id;
    mark();
    return true;
  }
  function clear() {
    S.chosen = null;
    detail.innerHTML = help();
    delete document.body.dataset.chosen;
    mark();
  }
  detail.addEventListener("click", function (ev) {
    var act = ev.target.closest("[data-act]"), go = ev.target.closest("[data-go]");
    if (act && act.dataset.act === "pin" && S.chosen) { pin(S.chosen); choose(S.chosen); }
    else if (act && act.dataset.act === "ungroup" && S.chosen) ungroup(S.chosen);
    else if (act && act.dataset.act === "more") { S.lists[act.dataset.list] = !S.lists[act.dataset.list]; choose(S.chosen); }
    else if (go) choose(go.dataset.go);
  });
  detail.addEventListener("change", function (ev) {
    if (ev.target.dataset && ev.target.dataset.act === "name" && S.chosen) rename(S.chosen, ev.target.value);
  });
  detail.addEventListener("keydown", function (ev) {
    if (ev.key === "Enter" && ev.target.dataset && ev.target.dataset.act === "name") ev.target.blur();
  });
  side.addEventListener("click", function (ev) {
    var go = ev.target.closest("[data-go]");
    if (go) choose(go.dataset.go);
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape" && ev.target.tagName !== "INPUT") clear();
  });

  // The paths through a node along the shown edges, weighted: downstream, each node passes
  // on what reached it in proportion to its out-edges' |size|; upstream, in proportion to its
  // in-edges'. ``flow`` per edge (key "source\ntarget") is the share of the node's paths that
  // runs along it (0–1), ``hops`` its distance from the node; ``share`` per node likewise.
  function paths(id) {
    var edges = drawn.edges, inAbs = {}, outAbs = {}, flow = {}, hops = {}, share = {}, dist = {};
    edges.forEach(function (e) {
      var a = Math.abs(edgeMeasure(e));
      inAbs[e.target] = (inAbs[e.target] || 0) + a; outAbs[e.source] = (outAbs[e.source] || 0) + a;
    });
    function spread(forward) {
      var got = {}, far = {};
      got[id] = 1; far[id] = 0;
      var order = edges.slice().sort(function (a, b) {
        return forward ? rank(get(a.source)) - rank(get(b.source)) : rank(get(b.target)) - rank(get(a.target));
      });
      order.forEach(function (e) {
        var from = forward ? e.source : e.target, to = forward ? e.target : e.source, f = got[from];
        if (!f) return;
        var part = f * Math.abs(edgeMeasure(e)) / ((forward ? outAbs : inAbs)[from] || 1);
        if (!(part > 1e-6)) return;
        var k = e.source + "\n" + e.target;
        flow[k] = (flow[k] || 0) + part; hops[k] = far[from] + 1;
        got[to] = (got[to] || 0) + part;
        far[to] = Math.min(far[to] === undefined ? Infinity : far[to], far[from] + 1);
      });
      Object.keys(got).forEach(function (u) {
        share[u] = Math.max(share[u] || 0, Math.min(1, got[u]));
        dist[u] = Math.min(dist[u] === undefined ? Infinity : dist[u], far[u]);
      });
    }
    spread(true);
    spread(false);
    return {flow: flow, hops: hops, share: share, hops_to: dist};
  }
  var LIT = 0.02;  // a path's share below which it is not lit

  // classes for the node in focus (hovered, else chosen) and its paths, the pinned nodes,
  // the search's matches
  function mark() {
    var chosen = S.chosen && view && view.place[S.chosen] ? S.chosen : null;
    var focus = S.hover && view && view.place[S.hover] ? S.hover : chosen, lit = focus ? paths(focus) : null;
    svg.querySelectorAll(".edge").forEach(function (p) {
      var f = lit ? lit.flow[p.dataset.source + "\n" + p.dataset.target] || 0 : 0, on = f >= LIT;
      p.classList.toggle("faded", !!lit && !on);
      p.classList.toggle("hot", on);
      p.style.strokeOpacity = on ? (0.35 + 0.65 * Math.sqrt(f)).toFixed(2) : "";
      if (on) p.dataset.hops = lit.hops[p.dataset.source + "\n" + p.dataset.target]; else delete p.dataset.hops;
    });
    function near(id) { return !lit || id === focus || (lit.share[id] || 0) >= LIT; }
    var matched = {};
    S.matches.forEach(function (id) { matched[unit(id)] = 1; });
    svg.querySelectorAll("[data-node]").forEach(function (c) {
      var id = c.dataset.node;
      c.classList.toggle("chosen", id === chosen);
      c.classList.toggle("hovered", id === S.hover);
      c.classList.toggle("pinned", !!S.pinned[id]);
      c.classList.toggle("match", !!matched[id]);
      c.classList.toggle("dim", !near(id));
    });
    svg.querySelectorAll("[data-label]").forEach(function (t) { t.classList.toggle("dim", !near(t.dataset.label)); });
    svg.querySelectorAll("[data-token]").forEach(function (t) { t.classList.toggle("match", !!S.positions[t.dataset.token]); });
    sideHtml();
    remember();
  }

  // ------------------------------------------------------------------ pins, supernodes
  function pin(id) {
    var k = unit(id);
    if (!get(k)) return false;
    if (S.pinned[k]) delete S.pinned[k]; else S.pinned[k] = true;
    if (S.pinnedOnly) render(true); else mark();
    return !!S.pinned[k];
  }
  function showPinned(on) {
    S.pinnedOnly = on === undefined ? !S.pinnedOnly : !!on;
    $("ffb-pinned-view").setAttribute("aria-pressed", S.pinnedOnly ? "true" : "false");
    render(true);
    return S.pinnedOnly;
  }
  function group(ids, name, quiet) {
    var members = [];
    (ids || []).forEach(function (id) {
      var g = groups[id] || groups[unit(id)];
      (g ? g.members : [id]).forEach(function (m) {
        var u = byId[m];
        if (u && u.kind !== "output" && u.kind !== "bias" && members.indexOf(m) < 0) members.push(m);
      });
    });
    if (members.length < 2) return null;
    members.forEach(function (m) { if (groups[memberOf[m]]) ungroup(memberOf[m], true); });
    var id = "group:" + (++groupCount), sum = function (f) { return members.reduce(function (s, m) { return s + f(byId[m]); }, 0); };
    var writers = members.filter(function (m) { return !ALWAYS[byId[m].kind]; }), pool = writers.length ? writers : members;
    var rep = pool.slice().sort(function (a, b) { return Math.abs(byId[b].value) - Math.abs(byId[a].value); })[0];
    var g = {id: id, kind: "group", name: name || "group " + groupCount, members: members, rep: rep, head: -1,
             layer: byId[rep].layer, position: byId[rep].position, value: sum(function (u) { return u.value; })};
    g.label = g.name;
    if (members.every(function (m) { return byId[m].influence !== undefined; })) g.influence = sum(function (u) { return u.influence; });
    if (members.every(function (m) { return byId[m].patch !== undefined; })) g.patch = sum(function (u) { return u.patch; });
    groups[id] = g;
    var pinned = members.some(function (m) { return S.pinned[m]; });
    members.forEach(function (m) { memberOf[m] = id; delete S.pinned[m]; });
    if (pinned) S.pinned[id] = true;
    if (S.chosen && memberOf[S.chosen]) S.chosen = id;
    if (quiet) return id;
    render(true);
    choose(id);
    return id;
  }
  function ungroup(id, quiet) {
    var g = groups[id];
    if (!g) return false;
    g.members.forEach(function (m) { delete memberOf[m]; if (S.pinned[id]) S.pinned[m] = true; });
    delete S.pinned[id];
    delete groups[id];
    if (!quiet) { render(true); if (S.chosen === id) clear(); }
    return true;
  }

  // ------------------------------------------------------------------ thresholds, search, size
  function threshold(nodeShare, edgeShare) {
    if (nodeShare !== undefined && nodeShare !== null) {
      S.nodeShare = Math.max(0, Math.min(1, +nodeShare));
      autoNodes = false;
    }
    if (edgeShare !== undefined && edgeShare !== null) S.edgeShare = Math.max(0, Math.min(1, +edgeShare));
    controls();
    render(true);
    if (S.chosen) choose(S.chosen);
    return {nodes: drawn.nodes, edges: drawn.edges.length};
  }
  // Nodes by id, label or name; tokens by their text and positions by number ("12", "@12",
  // "pos 12"): a matched position rings its token and every node at it.
  function search(q) {
    S.query = (q || "").trim();
    $("ffb-search").value = q || "";
    var low = S.query.toLowerCase(), at = {}, number = /^(?:@|pos(?:ition)?\s*)?(\d+)$/.exec(low);
    if (number && +number[1] < n) at[+number[1]] = true;
    if (low) for (var p = 0; p < n; p++) if (String(words[p]).toLowerCase().indexOf(low) >= 0) at[p] = true;
    S.positions = at;
    var found = !low ? [] : nodes.filter(function (u) {
      if (u.position >= 0 && at[u.position] && u.kind !== "output") return true;
      return !number && (u.id.toLowerCase().indexOf(low) >= 0 || String(shownLabel(u)).toLowerCase().indexOf(low) >= 0);
    });
    found.sort(function (a, b) { return (a.kind === "token") - (b.kind === "token") || strength(b) - strength(a); });
    S.matches = found.map(function (u) { return u.id; });
    Object.keys(groups).forEach(function (id) {
      if (low && groups[id].name.toLowerCase().indexOf(low) >= 0) S.matches.push(id);
    });
    mark();
    return S.matches.slice();
  }
  function size(mode) {
    if (mode === "patch" && !hasPatch) return S.size;
    if (mode === "value" || mode === "patch") S.size = mode;
    $("ffb-size").value = S.size;
    render(false);
    if (S.chosen) choose(S.chosen);
    return S.size;
  }
  function expand(p) {
    if (S.expanded[p]) delete S.expanded[p]; else S.expanded[p] = true;
    render(true);
    return !!S.expanded[p];
  }

  // ------------------------------------------------------------------ the panel's other half
  function help() {
    var t = tops();
    return "<h3>Attribution graph</h3><p class=note>Tokens along the bottom, blocks upwards (attention, "
      + "cross-attention, FF: a row each where a node is kept), the output on top (several outputs: a logit node "
      + "each below it), the bias at the left. Labels: "
      + "<code>L23.H4</code> head 4 of block 23, <code>L23.A</code> an attention sublayer, <code>FF29</code> an FF block, "
      + "<code>L5.N12</code> a neuron, then the token its write promotes most (↑, read through the unembedding). "
      + "A node's size grows with |value| (its total effect on the output); nodes and edges "
      + 'are red where positive, blue where negative.</p><div class="legend"><span>−' + fmt(t.value)
      + '</span><span class="bar diverging"></span><span>+' + fmt(t.value) + "</span></div>"
      + "<p class=note>Hover a node to light its paths to the output and from the tokens (weighted: the share of its "
      + "paths along each edge); click for its details here; shift-click pins it. Wheel or the "
      + "buttons zoom, dragging pans, <b>fit</b> shows it all. The sliders keep the nodes holding that share of the "
      + "influence and, into each node, the edges holding that share of its |weight|; pinned nodes stay, and a kept node "
      + "keeps its strongest route to the output. Pin nodes and press <b>group</b> to make a supernode (its edges the sums of its members'), "
      + "or open the <b>subgraph panel</b> and drag them. Search a token, a position (<code>@12</code>) or an id. "
      + "Name a node in its details. The address keeps the view: copy it to share it. Click an upright token to widen "
      + "its column.</p>";
  }
  function sideHtml() {
    var pins = Object.keys(S.pinned), gs = Object.keys(groups), h = "";
    h += "<p><b>pinned</b> (" + pins.length + ")" + (pins.length ? "" : ": none; shift-click a node") + "</p>";
    if (pins.length) h += "<ul>" + pins.map(function (id) {
      return '<li data-go="' + esc(id) + '"><code>' + esc(id) + "</code> " + esc(place(get(id))) + "</li>"; }).join("") + "</ul>";
    if (gs.length) h += "<p><b>supernodes</b></p><ul>" + gs.map(function (id) {
      return '<li data-go="' + esc(id) + '">' + esc(groups[id].name) + " (" + groups[id].members.length + ")</li>"; }).join("") + "</ul>";
    side.innerHTML = h;
  }

  // ------------------------------------------------------------------ labels the user gives
  function rename(id, text) {
    var u = get(id);
    if (!u || u.kind === "token" || u.kind === "output" || u.kind === "bias") return null;
    text = String(text === undefined || text === null ? "" : text).trim().slice(0, 200);
    if (text) S.names[id] = text; else delete S.names[id];
    render(true);  // the label's width changes the layout
    if (S.chosen === id) choose(id);
    return shownLabel(u);
  }

  // ------------------------------------------------------------------ the subgraph panel
  // The pinned nodes beside the main graph, with the edges between them (a group's summed),
  // laid out by stream order (upwards) and position (rightwards) until a node is dragged.
  var sub = $("ffb-subgraph"), subDrag = null;
  function subgraph(on) {
    S.sub = on === undefined ? !S.sub : !!on;
    $("ffb-sub").hidden = !S.sub;
    $("ffb-sub-view").setAttribute("aria-pressed", S.sub ? "true" : "false");
    relegible();
    render(true);
    return S.sub;
  }
  function subPlaces(ids) {  // unit id → [x, y] in 0–1 (y downwards), dragged places first
    var ranks = [], cols = [], at = {};
    ids.forEach(function (id) {
      var u = get(id), r = rank(u), p = u.position >= 0 ? u.position : -1;
      if (ranks.indexOf(r) < 0) ranks.push(r);
      if (cols.indexOf(p) < 0) cols.push(p);
    });
    ranks.sort(function (a, b) { return a - b; }); cols.sort(function (a, b) { return a - b; });
    var cells = {}, key = {};
    ids.forEach(function (id) {
      var u = get(id), k = ranks.indexOf(rank(u)) + "|" + cols.indexOf(u.position >= 0 ? u.position : -1);
      key[id] = k; (cells[k] = cells[k] || []).push(id);
    });
    ids.forEach(function (id) {  // a cell's nodes side by side across its column, staggered up and down
      var parts = key[id].split("|"), i = +parts[0], j = +parts[1], cell = cells[key[id]], c = cell.indexOf(id);
      var x = (j + (c + 0.5) / cell.length) / cols.length, y = 1 - (i + 0.5) / ranks.length;
      if (cell.length === 1) x += (i % 2 ? 0.18 : -0.18) / cols.length;  // rows alternate: long edges stay apart
      if (cell.length > 1) y += (c % 2 ? 0.25 : -0.25) / ranks.length;
      at[id] = S.sg[id] || [x, y];
    });
    return at;
  }
  function drawSub() {
    while (sub.firstChild) sub.removeChild(sub.firstChild);
    if (!S.sub) return;
    var ids = Object.keys(S.pinned).filter(get), W = Math.max(sub.clientWidth, 80), H = Math.max(sub.clientHeight, 80);
    sub.setAttribute("viewBox", "0 0 " + W + " " + H);
    if (!ids.length) {
      el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", "class": "rowlabel"}, sub).textContent = "shift-click nodes to pin them here";
      return;
    }
    var at = subPlaces(ids), pad = 30, top = tops(), keep = {};
    function xy(id) { return [pad + at[id][0] * (W - 2 * pad), pad + at[id][1] * (H - 2 * pad)]; }
    ids.forEach(function (id) { keep[id] = true; });
    var edges = unitEdges().filter(function (e) { return keep[e.source] && keep[e.target]; });
    var wTop = edges.reduce(function (m, e) { return Math.max(m, Math.abs(edgeMeasure(e))); }, 0) || 1;
    var edgeLayer = el("g", {"class": "edges"}, sub), nodeLayer = el("g", {"class": "nodes"}, sub);
    edges.forEach(function (e) {
      var s = xy(e.source), t = xy(e.target), m = edgeMeasure(e), a = Math.abs(m) / wTop;
      var c = ffbColour.diverging((m < 0 ? -1 : 1) * Math.max(Math.abs(m), 0.45 * wTop), wTop);
      var path = el("path", {"class": "edge", d: "M" + s[0] + "," + s[1] + " L" + t[0] + "," + t[1], stroke: ffbColour.css(c),
        "stroke-width": (0.8 + 4 * a).toFixed(2), "stroke-opacity": (0.3 + 0.65 * Math.sqrt(a)).toFixed(2)}, edgeLayer);
      path.dataset.source = e.source; path.dataset.target = e.target;
    });
    ids.forEach(function (id) {
      var u = get(id), p = xy(id);
      var c = el("circle", {"class": "node kind-" + u.kind, cx: p[0].toFixed(1), cy: p[1].toFixed(1),
                            r: radius(u, top, 9).toFixed(2), fill: fill(u, top)}, nodeLayer);
      c.dataset.subNode = id;
      var text = truncate(shownLabel(u), 11, 160), left = p[0] + 12 + textWidth(text, 11) > W;  // kept inside
      var t = el("text", {"class": "nlabel", x: (left ? p[0] - 12 : p[0] + 12).toFixed(1), y: (p[1] + 4).toFixed(1),
                          "text-anchor": left ? "end" : "start"}, nodeLayer);
      t.textContent = text;
    });
  }
  function subPoint(ev) {
    var b = sub.getBoundingClientRect(), pad = 30;
    return [Math.max(0, Math.min(1, (ev.clientX - b.left - pad) / Math.max(b.width - 2 * pad, 1))),
            Math.max(0, Math.min(1, (ev.clientY - b.top - pad) / Math.max(b.height - 2 * pad, 1)))];
  }
  sub.addEventListener("mousedown", function (ev) {
    var id = ev.target.dataset && ev.target.dataset.subNode;
    if (ev.button !== 0 || !id) return;
    ev.preventDefault();
    subDrag = {id: id, moved: 0, x: ev.clientX, y: ev.clientY};
  });
  window.addEventListener("mousemove", function (ev) {
    if (!subDrag) return;
    subDrag.moved += Math.abs(ev.clientX - subDrag.x) + Math.abs(ev.clientY - subDrag.y);
    subDrag.x = ev.clientX; subDrag.y = ev.clientY;
    S.sg[subDrag.id] = subPoint(ev);
    drawSub();
  });
  window.addEventListener("mouseup", function () {
    if (!subDrag) return;
    var id = subDrag.id, still = subDrag.moved < 3;
    subDrag = null;
    if (still) choose(id); else remember();
  });
  function subLayoutReset() { S.sg = {}; drawSub(); remember(); }

  // ------------------------------------------------------------------ a shareable state
  // Pins, supernodes, thresholds, the size, the chosen node, the user's labels, the subgraph
  // panel and its dragged places, kept in the address's fragment (#state=<JSON>) as they
  // change; a page opened with one restores it. The fragment is a stranger's text: only the
  // names below are read, ids must be the graph's, numbers are clamped, strings cut short.
  var restoring = false, hashTimer = null, written = "";
  function state() {
    var o = {}, gs = Object.keys(groups), index = {};
    gs.forEach(function (id, i) { index[id] = "group:" + (i + 1); });
    function named(id) { return index[id] || id; }
    if (gs.length) o.supernodes = gs.map(function (id) { return [groups[id].name, groups[id].members.slice()]; });
    var pins = Object.keys(S.pinned).map(named);
    if (pins.length) o.pinned = pins;
    if (S.nodeShare < 1) o.nodes = +S.nodeShare.toFixed(4);
    if (S.edgeShare < 1) o.edges = +S.edgeShare.toFixed(4);
    if (S.size !== "value") o.size = S.size;
    if (S.pinnedOnly) o.pinned_only = true;
    if (S.chosen) o.chosen = named(S.chosen);
    var names = {};
    Object.keys(S.names).forEach(function (id) { names[named(id)] = S.names[id]; });
    if (Object.keys(names).length) o.labels = names;
    if (S.sub) o.subgraph = true;
    var sg = {};
    Object.keys(S.sg).forEach(function (id) { sg[named(id)] = S.sg[id].map(function (v) { return +v.toFixed(4); }); });
    if (Object.keys(sg).length) o.places = sg;
    return o;
  }
  function address() {
    var o = state();
    return Object.keys(o).length ? "#state=" + encodeURIComponent(JSON.stringify(o)) : "";
  }
  function writeHash() {
    clearTimeout(hashTimer);
    var text = address();
    if (text === written) return location.href;
    written = text;
    try { history.replaceState(null, "", text || location.pathname + location.search); } catch (e) { /* no address to change */ }
    return location.href;
  }
  function remember() {
    if (restoring) return;
    clearTimeout(hashTimer);
    hashTimer = setTimeout(writeHash, 120);
  }
  function readHash() {
    var m = /^#state=([^#]{1,200000})$/.exec(location.hash || "");
    if (!m) return null;
    try {
      var o = JSON.parse(decodeURIComponent(m[1]));
      return o && typeof o === "object" && !Array.isArray(o) ? o : null;
    } catch (e) { return null; }
  }
  function share(v) { return typeof v === "number" && isFinite(v) ? Math.max(0, Math.min(1, v)) : 1; }
  function restore(o) {
    if (!o || typeof o !== "object" || Array.isArray(o)) return false;
    restoring = true;
    autoNodes = false;
    try {
      Object.keys(groups).forEach(function (id) { ungroup(id, true); });
      groupCount = 0; S.pinned = {}; S.names = {}; S.sg = {}; S.chosen = null;
      var made = {};
      (Array.isArray(o.supernodes) ? o.supernodes.slice(0, 1000) : []).forEach(function (g, i) {
        if (!Array.isArray(g) || !Array.isArray(g[1])) return;
        var members = g[1].slice(0, 10000).filter(function (m) { return typeof m === "string" && byId[m]; });
        var id = group(members, typeof g[0] === "string" ? g[0].slice(0, 200) : "", true);
        if (id) made["group:" + (i + 1)] = id;
      });
      function ours(id) { return typeof id === "string" ? (made[id] || (byId[id] ? unit(id) : null)) : null; }
      (Array.isArray(o.pinned) ? o.pinned.slice(0, 10000) : []).forEach(function (id) { if (ours(id)) S.pinned[ours(id)] = true; });
      S.nodeShare = share(o.nodes); S.edgeShare = share(o.edges);
      S.size = o.size === "patch" && hasPatch ? "patch" : "value";
      S.pinnedOnly = o.pinned_only === true;
      S.sub = o.subgraph === true;
      var labels = o.labels && typeof o.labels === "object" ? o.labels : {};
      Object.keys(labels).slice(0, 10000).forEach(function (id) {
        var k = ours(id), u = k && get(k);
        if (u && !ALWAYS[u.kind] && typeof labels[id] === "string" && labels[id].trim()) S.names[k] = labels[id].trim().slice(0, 200);
      });
      var places = o.places && typeof o.places === "object" ? o.places : {};
      Object.keys(places).slice(0, 10000).forEach(function (id) {
        var v = places[id];
        if (ours(id) && Array.isArray(v) && v.length === 2 && v.every(function (x) { return typeof x === "number" && isFinite(x); })) {
          S.sg[ours(id)] = [share(v[0]), share(v[1])];
        }
      });
      controls();
      render(true);
      if (ours(o.chosen)) choose(ours(o.chosen)); else clear();
    } finally { restoring = false; }
    writeHash();
    return true;
  }
  function controls() {  // the tool bar as the state says
    $("ffb-node-share").value = S.nodeShare; $("ffb-edge-share").value = S.edgeShare;
    $("ffb-node-share-text").textContent = Math.round(S.nodeShare * 100) + "%";
    $("ffb-edge-share-text").textContent = Math.round(S.edgeShare * 100) + "%";
    $("ffb-size").value = S.size;
    $("ffb-pinned-view").setAttribute("aria-pressed", S.pinnedOnly ? "true" : "false");
    $("ffb-sub").hidden = !S.sub;
    $("ffb-sub-view").setAttribute("aria-pressed", S.sub ? "true" : "false");
  }

  // ------------------------------------------------------------------ controls
  $("ffb-search").addEventListener("input", function () { search(this.value); });
  $("ffb-search").addEventListener("keydown", function (ev) {
    if (ev.key !== "Enter") return;
    var found = search(this.value), shown = found.filter(function (id) { return view.place[unit(id)]; });
    if (found.length) choose(unit((shown.length ? shown : found)[0]));
  });
  $("ffb-node-share").addEventListener("input", function () { threshold(+this.value, null); });
  $("ffb-edge-share").addEventListener("input", function () { threshold(null, +this.value); });
  if (!hasPatch) $("ffb-size-wrap").style.display = "none";
  if (G.patch_estimators) {  // name the estimators behind the patch estimates (text, not markup)
    var named = [];
    if (G.patch_estimators.nodes) named.push("nodes: " + G.patch_estimators.nodes);
    if (G.patch_estimators.edges) named.push("edges: " + G.patch_estimators.edges);
    var option = $("ffb-size").querySelector("option[value=patch]");
    option.textContent = "|patch estimate| (" + named.join(", ") + ")";
    $("ffb-size-wrap").title = "patch estimates by " + named.join(", ");
  }
  $("ffb-size").addEventListener("change", function () { size(this.value); });
  $("ffb-pinned-view").addEventListener("click", function () { showPinned(); });
  $("ffb-group").addEventListener("click", function () {
    var ids = Object.keys(S.pinned);
    if (ids.length < 2 && S.chosen) ids.push(S.chosen);
    if (group(ids, $("ffb-group-name").value.trim())) $("ffb-group-name").value = "";
  });
  $("ffb-zoom-in").addEventListener("click", function () { zoom(1.25); });
  $("ffb-zoom-out").addEventListener("click", function () { zoom(0.8); });
  $("ffb-fit").addEventListener("click", function () { fit(); });
  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () { relegible(); render(true); }, 80);
  });

  $("ffb-sub-view").addEventListener("click", function () { subgraph(); });
  $("ffb-sub-reset").addEventListener("click", subLayoutReset);
  window.addEventListener("hashchange", function () { if (location.hash !== written && readHash()) restore(readHash()); });

  detail.innerHTML = help();
  autoNodes = !readHash();
  legibleShare = autoNodes ? legible() : 1;
  render(true);
  if (readHash()) restore(readHash());
  window.ffbGraph = {
    data: G, choose: choose, clear: clear, pin: pin, pinned: function () { return Object.keys(S.pinned); },
    showPinned: showPinned, group: group, ungroup: ungroup, threshold: threshold, search: search, size: size,
    expand: expand, fit: fit, zoom: zoom, pan: pan, viewBox: viewBox, label: function (id) { var u = get(id); return u ? u.label : null; },
    nodes: function () { return drawn.nodes; }, edges: function () { return drawn.edges.length; },
    edgeList: function () { return drawn.edges.map(function (e) { return {source: e.source, target: e.target, weight: e.weight, patch: e.patch}; }); },
    layout: function () { return view; }, paths: paths, subgraph: subgraph, rename: rename,
    shownLabel: function (id) { var u = get(id); return u ? shownLabel(u) : null; }, state: state, restore: restore,
    address: writeHash, sizing: sizing
  };
  document.body.dataset.state = "drawn";
})();
