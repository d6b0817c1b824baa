(function () {
  "use strict";
  var G = JSON.parse(document.getElementById("ffb-graph-data").textContent);
  function $(id) { return document.getElementById(id); }
  var svg = $("ffb-graph"), stage = $("ffb-stage"), detail = $("ffb-detail"), side = $("ffb-side"), card = $("ffb-card");
  var NS = svg.namespaceURI;  // the SVG namespace, read from the element the parser made
  var FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
  var n = G.tokens.length, words = G.labels || G.tokens;
  var ROW = {attention: 0, head: 0, cross_attention: 1, ff: 2, neuron: 2}, ROWNAME = ["attn", "x-attn", "FF"];
  var ALWAYS = {token: 1, bias: 1, output: 1};
  var R = 9, RMIN = 2.5, COLLAPSED = 18;

  // ------------------------------------------------------------------ nodes, edges, labels
  var byId = {}, nodes = [], links = [], outPos = n - 1;
  G.nodes.forEach(function (d) {
    var u = {id: d.id, kind: d.kind, layer: d.layer, head: d.head, position: d.position, value: d.value,
             influence: d.influence, patch: d.patch_estimate, d: d, into: [], out: []};
    if (d.kind === "output") { if (!(d.position >= 0 && d.position < n)) u.position = n - 1; outPos = u.position; }
    if (d.kind === "bias") u.position = -1;
    u.label = label(u);
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
      default: return u.name || u.id;
    }
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
           query: "", matches: []};
  var groups = {}, groupCount = 0, memberOf = {}, view = null, vb = null, drawn = {nodes: 0, edges: []};
  function unit(id) { return memberOf[id] || id; }
  function get(id) { return byId[id] || groups[id]; }
  function strength(u) { return Math.abs(hasInfluence && u.influence !== undefined ? u.influence : u.value); }
  function measureOf(u) { return S.size === "patch" && u.patch !== undefined ? u.patch : u.value; }
  // an edge's: its weight, or (size "patch") its patch estimate where the graph carries one
  function edgeMeasure(e) { return S.size === "patch" && e.patch !== undefined ? e.patch : e.weight; }

  // What is shown: the nodes holding the chosen share of the influence (tokens, the bias and
  // the output always), then the edges holding the chosen share of |weight|, writers left
  // without an edge in or out dropped; or the pinned subgraph. Grouped nodes are their group.
  function compute() {
    var keep = {};
    if (S.pinnedOnly) {
      Object.keys(S.pinned).forEach(function (id) { if (get(id)) keep[id] = true; });
    } else {
      var writers = nodes.filter(function (u) { return !ALWAYS[u.kind]; });
      nodes.forEach(function (u) { if (ALWAYS[u.kind]) keep[unit(u.id)] = true; });
      writers.sort(function (a, b) { return strength(b) - strength(a); });
      var total = writers.reduce(function (s, u) { return s + strength(u); }, 0), acc = 0;
      writers.forEach(function (u) {
        if (S.nodeShare >= 1 || !(total > 0) || acc < S.nodeShare * total * (1 - 1e-12)) keep[unit(u.id)] = true;
        acc += strength(u);
      });
    }
    var found = {}, edges = [];
    links.forEach(function (l) {
      var s = unit(l.source), t = unit(l.target);
      if (s === t || !keep[s] || !keep[t]) return;
      var k = s + "\n" + t, e = found[k];
      if (!e) { e = found[k] = {source: s, target: t, weight: 0, parts: 0}; edges.push(e); }
      e.weight += l.weight; e.parts += 1;
      if (l.patch !== undefined) e.patch = (e.patch || 0) + l.patch;
    });
    edges.sort(function (a, b) { return Math.abs(b.weight) - Math.abs(a.weight); });
    if (!S.pinnedOnly && S.edgeShare < 1) {
      var sum = edges.reduce(function (s, e) { return s + Math.abs(e.weight); }, 0), run = 0;
      edges = edges.filter(function (e) {
        var ok = run < S.edgeShare * sum * (1 - 1e-12);
        run += Math.abs(e.weight);
        return ok;
      });
    }
    if (!S.pinnedOnly && (S.nodeShare < 1 || S.edgeShare < 1)) {
      for (;;) {
        var hasIn = {}, hasOut = {};
        edges.forEach(function (e) { hasOut[e.source] = 1; hasIn[e.target] = 1; });
        var gone = Object.keys(keep).filter(function (id) {
          var u = get(id);
          return !ALWAYS[u.kind] && u.kind !== "group" && !(hasIn[id] && hasOut[id]);
        });
        if (!gone.length) break;
        gone.forEach(function (id) { delete keep[id]; });
        edges = edges.filter(function (e) { return keep[e.source] && keep[e.target]; });
      }
    }
    return {keep: keep, edges: edges};
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
    if (u.kind === "token" || u.kind === "output" || u.kind === "bias") return {row: u.kind, position: u.position};
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
    var hasOutput = false, labelW = 24;
    units.forEach(function (u) {
      var a = anchor(u);
      if (u.kind === "output") hasOutput = true;
      if (typeof a.row !== "number") return;
      rowSet[a.row] = true;
      var key = a.row + "|" + a.position;
      (cells[key] = cells[key] || []).push(u);
      need[a.position] = Math.max(need[a.position], cells[key].length);
      labelW = Math.max(labelW, Math.min(textWidth(u.label, 11, u.kind === "group" ? "600" : ""), 150));
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
    var top = hasOutput ? 50 : 14, collapsedText = 0;
    for (p = 0; p < n; p++) if (!expanded[p]) collapsedText = Math.max(collapsedText, Math.min(textWidth(String(words[p]), 11), 84));
    var bottom = R + 12 + R + 6 + Math.max(16, collapsedText + 4);
    var lineH = totalLines ? Math.max(16, Math.min(46, (H - top - bottom - 8) / totalLines)) : 46;
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
      else if (a.row === "bias") spot[u.id] = {x: left / 2, y: tokenY};
    });
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
    if (fits(found, W, H)) return found;
    var lo = 0.25, hi = 1;
    for (var i = 0; i < 9; i++) {
      var mid = (lo + hi) / 2;
      if (fits(layout(keep, W / mid, H / mid), W / mid, H / mid)) lo = mid; else hi = mid;
    }
    return layout(keep, W / lo, H / lo);
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
    drawn = {nodes: 0, edges: shown.edges.slice()};
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
        t.textContent = truncate(u.label, 11, 150);
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
      + " of " + links.length + " edges shown";
    document.body.dataset.shown = drawn.nodes;
    if (!again && (stage.clientWidth !== W || stage.clientHeight !== H)) return render(true, true);  // the bars moved
    if (refit || !vb) fit(); else setViewBox(vb);
    mark();
  }

  // ------------------------------------------------------------------ zoom, pan, fit
  function setViewBox(b) {
    vb = b;
    svg.setAttribute("viewBox", b.map(function (v) { return +v.toFixed(2); }).join(" "));
    return viewBox();
  }
  function viewBox() { return svg.getAttribute("viewBox").split(" ").map(Number); }
  function fit() {  // the whole layout, at most at its own size, centred
    var W = Math.max(stage.clientWidth, 1), H = Math.max(stage.clientHeight, 1);
    var s = Math.min(W / view.width, H / view.height, 1), w = W / s, h = H / s;
    return setViewBox([view.width / 2 - w / 2, view.height / 2 - h / 2, w, h]);
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
    var e = edgesOf(u), h = "<b>" + esc(u.label) + "</b> <span class=lbl>" + esc(u.id) + "</span><br>";
    if (u.position >= 0 && u.kind !== "output") h += "token " + esc(u.position) + " “" + esc(words[u.position]) + "”<br>";
    h += "value " + signed(u.value);
    if (u.influence !== undefined && u.kind !== "output") h += " · influence " + fmt(u.influence);
    if (u.patch !== undefined) h += " · patch estimate " + signed(u.patch);
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
  function moveCard(ev) {
    var w = card.offsetWidth, h = card.offsetHeight, x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + w > window.innerWidth - 4) x = ev.clientX - w - 14;
    if (y + h > window.innerHeight - 4) y = ev.clientY - h - 14;
    card.style.left = Math.max(4, x) + "px"; card.style.top = Math.max(4, y) + "px";
  }
  svg.addEventListener("mouseover", function (ev) {
    var d = ev.target.dataset || {};
    if (d.node !== undefined) showCard(ev, d.node);
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
  function list(items, key) {
    items = items.slice().sort(function (a, b) { return Math.abs(b.weight) - Math.abs(a.weight); });
    if (!items.length) return "<p>none kept</p>";
    var shown = items.slice(0, 15);
    return '<ol class="' + key + '">' + shown.map(function (e) {
      var other = get(e[key]), hidden = !(view && view.place[e[key]]);
      return '<li data-go="' + esc(e[key]) + '"' + (hidden ? ' class="hidden-node" title="not shown now"' : "") + "><code>"
        + esc(e[key]) + "</code> " + (other ? '<span class="lbl">' + esc(place(other)) + "</span> " : "") + signed(e.weight) + "</li>";
    }).join("") + "</ol>" + (items.length > 15 ? "<p class=note>and " + (items.length - 15) + " more</p>" : "");
  }
  function row(name, value) { return "<tr><td>" + name + "</td><td>" + value + "</td></tr>"; }
  function details(u) {
    var top = tops(), e = edgesOf(u);
    var h = '<div class="title"><span class="swatch" style="background:' + fill(u, top) + '"></span><h3>' + esc(u.label)
      + "</h3><code>" + esc(u.id) + "</code></div><table>";
    h += row("kind", esc(u.kind === "group" ? "supernode of " + u.members.length : u.kind));
    if (u.layer >= 0 && u.kind !== "group") h += row("block", esc(u.layer) + (u.head >= 0 ? ", part " + esc(u.head) : ""));
    if (u.position >= 0 && u.kind !== "group") h += row("position", esc(u.position) + " “" + esc(words[u.position]) + "”");
    if (u.kind === "output") h += row("explains", esc(u.label));
    if (u.kind === "output" && u.d) ["token_id", "negative_token_id", "class_index", "negative_class_index"].forEach(
      function (k) { if (u.d[k] !== undefined) h += row(k.replace(/_/g, " "), esc(String(u.d[k]))); });
    h += row(u.kind === "group" ? "value (sum)" : "value", signed(u.value));
    if (u.influence !== undefined && u.kind !== "output") h += row("influence", fmt(u.influence));
    if (u.patch !== undefined) h += row("patch estimate", signed(u.patch));
    var many = u.d && u.d.patch_estimates;
    if (many) Object.keys(many).forEach(function (k) { if (k !== "default") h += row("&nbsp;&nbsp;" + esc(k), signed(many[k])); });
    if (u.d && u.d.patch_kappa !== undefined) h += row("κ", fmt(u.d.patch_kappa));
    h += "</table>";
    h += '<button data-act="pin">' + (S.pinned[u.id] ? "unpin" : "pin") + "</button>";
    if (u.kind === "group") h += ' <button data-act="ungroup">ungroup</button>';
    h += "<h4>in-edges (" + e.into.length + ")</h4>" + list(e.into, "source")
      + "<h4>out-edges (" + e.out.length + ")</h4>" + list(e.out, "target");
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
    else if (go) choose(go.dataset.go);
  });
  side.addEventListener("click", function (ev) {
    var go = ev.target.closest("[data-go]");
    if (go) choose(go.dataset.go);
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape" && ev.target.tagName !== "INPUT") clear();
  });

  // classes for the chosen node, its edges and neighbours, the pinned ones, the search's matches
  function mark() {
    var near = {}, chosen = S.chosen && view && view.place[S.chosen] ? S.chosen : null;
    svg.querySelectorAll(".edge").forEach(function (p) {
      var hot = chosen && (p.dataset.source === chosen || p.dataset.target === chosen);
      p.classList.toggle("faded", !!chosen && !hot);
      p.classList.toggle("hot", !!hot);
      if (hot) { near[p.dataset.source] = 1; near[p.dataset.target] = 1; }
    });
    var matched = {};
    S.matches.forEach(function (id) { matched[unit(id)] = 1; });
    svg.querySelectorAll("[data-node]").forEach(function (c) {
      var id = c.dataset.node;
      c.classList.toggle("chosen", id === chosen);
      c.classList.toggle("pinned", !!S.pinned[id]);
      c.classList.toggle("match", !!matched[id]);
      c.classList.toggle("dim", !!chosen && !near[id] && id !== chosen);
    });
    svg.querySelectorAll("[data-label]").forEach(function (t) {
      t.classList.toggle("dim", !!chosen && !near[t.dataset.label] && t.dataset.label !== chosen);
    });
    var q = S.query.toLowerCase();
    svg.querySelectorAll("[data-token]").forEach(function (t) {
      t.classList.toggle("match", !!q && String(words[+t.dataset.token]).toLowerCase().indexOf(q) >= 0);
    });
    sideHtml();
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
  function group(ids, name) {
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
    if (nodeShare !== undefined && nodeShare !== null) S.nodeShare = Math.max(0, Math.min(1, +nodeShare));
    if (edgeShare !== undefined && edgeShare !== null) S.edgeShare = Math.max(0, Math.min(1, +edgeShare));
    $("ffb-node-share").value = S.nodeShare; $("ffb-edge-share").value = S.edgeShare;
    $("ffb-node-share-text").textContent = Math.round(S.nodeShare * 100) + "%";
    $("ffb-edge-share-text").textContent = Math.round(S.edgeShare * 100) + "%";
    render(true);
    if (S.chosen) choose(S.chosen);
    return {nodes: drawn.nodes, edges: drawn.edges.length};
  }
  function search(q) {
    S.query = (q || "").trim();
    $("ffb-search").value = q || "";
    var low = S.query.toLowerCase();
    S.matches = !low ? [] : nodes.filter(function (u) {
      return u.id.toLowerCase().indexOf(low) >= 0 || String(u.label).toLowerCase().indexOf(low) >= 0;
    }).map(function (u) { return u.id; });
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
      + "cross-attention, FF: a row each where a node is kept), the output on top, the bias at the left. Labels: "
      + "<code>L23.H4</code> head 4 of block 23, <code>L23.A</code> an attention sublayer, <code>FF29</code> an FF block, "
      + "<code>L5.N12</code> a neuron. A node's size grows with |value| (its total effect on the output); nodes and edges "
      + 'are red where positive, blue where negative.</p><div class="legend"><span>−' + fmt(t.value)
      + '</span><span class="bar diverging"></span><span>+' + fmt(t.value) + "</span></div>"
      + "<p class=note>Hover a node for its card; click for its details here; shift-click pins it. Wheel or the "
      + "buttons zoom, dragging pans, <b>fit</b> shows it all. The sliders keep the nodes holding that share of the "
      + "influence and the edges holding that share of |weight|. Pin nodes and press <b>group</b> to make a supernode "
      + "(its edges the sums of its members'). Click an upright token to widen its column.</p>";
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
    resizing = setTimeout(function () { render(true); }, 80);
  });

  detail.innerHTML = help();
  render(true);
  window.ffbGraph = {
    data: G, choose: choose, clear: clear, pin: pin, pinned: function () { return Object.keys(S.pinned); },
    showPinned: showPinned, group: group, ungroup: ungroup, threshold: threshold, search: search, size: size,
    expand: expand, fit: fit, zoom: zoom, pan: pan, viewBox: viewBox, label: function (id) { var u = get(id); return u ? u.label : null; },
    nodes: function () { return drawn.nodes; }, edges: function () { return drawn.edges.length; },
    edgeList: function () { return drawn.edges.map(function (e) { return {source: e.source, target: e.target, weight: e.weight, patch: e.patch}; }); },
    layout: function () { return view; }
  };
  document.body.dataset.state = "drawn";
})();
