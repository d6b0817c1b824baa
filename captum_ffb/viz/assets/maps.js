(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("ffb-data").textContent);
  var n = data.labels.length;
  var AMP = "FF-amp";
  var ramp = ffbColour.ramp, rgb = ffbColour.css;

  function decode(b64) {
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var k = 0; k < bin.length; k++) bytes[k] = bin.charCodeAt(k);
    return new Float32Array(bytes.buffer);
  }
  var maps = {};
  data.layers.forEach(function (layer) {
    maps[layer] = {};
    data.scopes.forEach(function (s) { maps[layer][s] = decode(data.maps[layer][s]); });
  });
  var ampCache = {};
  function columnNormalised(m) {
    var out = new Float32Array(n * n);
    for (var j = 0; j < n; j++) {
      var total = 0;
      for (var i = 0; i < n; i++) total += m[i * n + j];
      var d = total === 0 ? 1 : total;
      for (var i2 = 0; i2 < n; i2++) out[i2 * n + j] = m[i2 * n + j] / d;
    }
    return out;
  }
  function ffAmp(layer) {
    if (!data.ff_pair) return null;
    if (!ampCache[layer]) {
      var before = columnNormalised(maps[layer][data.ff_pair[0]]);
      var after = columnNormalised(maps[layer][data.ff_pair[1]]);
      var out = new Float32Array(n * n);
      for (var k = 0; k < n * n; k++) out[k] = after[k] - before[k];
      ampCache[layer] = out;
    }
    return ampCache[layer];
  }
  function rowNormalised(m) {
    var out = new Float32Array(n * n);
    for (var i = 0; i < n; i++) {
      var total = 0;
      for (var j = 0; j < n; j++) total += m[i * n + j];
      var d = total === 0 ? 1 : total;
      for (var j2 = 0; j2 < n; j2++) out[i * n + j2] = m[i * n + j2] / d;
    }
    return out;
  }
  function matrix(layer, scope, norm) {
    if (scope === AMP) return ffAmp(layer);
    var m = maps[layer][scope];
    if (norm === "row") return rowNormalised(m);
    if (norm === "column") return columnNormalised(m);
    return m;
  }
  function range(m, scope, hideDiag) {
    var lo = Infinity, hi = -Infinity;
    for (var i = 0; i < n; i++) for (var j = 0; j < n; j++) {
      if (hideDiag && i === j) continue;
      var v = m[i * n + j];
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    if (scope === AMP) { var b = Math.max(Math.abs(lo), Math.abs(hi)) || 1; return [-b, b]; }
    return [0, hi > 0 ? hi : 1];
  }
  function colour(scope, v, lo, hi, grey) {
    if (scope === AMP) return ramp(ffbColour.DIVERGING, (v - lo) / (hi - lo));
    return ramp(grey ? ffbColour.MUTED : ffbColour.SEQUENTIAL, (v - lo) / (hi - lo));
  }
  // An n x n image of a map, one pixel per cell, scaled up without smoothing by the caller.
  function cells(m, scope, lo, hi, hideDiag, grey) {
    var off = document.createElement("canvas");
    off.width = n; off.height = n;
    var ctx = off.getContext("2d"), img = ctx.createImageData(n, n);
    for (var i = 0; i < n; i++) for (var j = 0; j < n; j++) {
      var p = (i * n + j) * 4, c = (hideDiag && i === j) ? [200, 200, 200] : colour(scope, m[i * n + j], lo, hi, grey);
      img.data[p] = c[0]; img.data[p + 1] = c[1]; img.data[p + 2] = c[2]; img.data[p + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    return off;
  }

  var state = { layer: data.layers[0], scope: data.scopes[data.scopes.length - 1], overlay: false, hideDiag: false, norm: "none" };
  if (data.initial_layer !== null && data.layers.indexOf(data.initial_layer) >= 0) state.layer = data.initial_layer;
  if (data.initial_scope) state.scope = data.initial_scope;
  var allScopes = data.scopes.concat(data.ff_pair ? [AMP] : []);
  (function readHash() {
    var h = (window.location.hash || "").replace(/^#/, "");
    h.split("&").forEach(function (kv) {
      var p = kv.split("="), k = p[0], v = decodeURIComponent(p[1] || "");
      if (k === "layer" && data.layers.indexOf(Number(v)) >= 0) state.layer = Number(v);
      if (k === "scope" && allScopes.indexOf(v) >= 0) state.scope = v;
      if (k === "overlay") state.overlay = v === "1" && !!data.ff_pair;
      if (k === "diag") state.hideDiag = v === "0";
      if (k === "norm" && ["none", "row", "column"].indexOf(v) >= 0) state.norm = v;
    });
  })();

  var canvas = document.getElementById("ffb-map"), tooltip = document.getElementById("ffb-tooltip");
  var cursor = document.getElementById("ffb-cursor");
  var geo = null;

  function layout() {
    var cell = Math.max(2, Math.min(40, Math.floor(640 / n)));
    var font = Math.max(8, Math.min(13, cell - 3));
    var every = Math.max(1, Math.ceil((font + 2) / cell));
    var probe = canvas.getContext("2d");
    probe.font = font + "px system-ui, sans-serif";
    var widest = 0;
    data.labels.forEach(function (t) { widest = Math.max(widest, probe.measureText(t).width); });
    var margin = Math.min(150, Math.ceil(widest) + 10);
    return { cell: cell, font: font, every: every, left: margin + 18, top: margin + 18, size: cell * n };
  }

  function drawMain() {
    var m = matrix(state.layer, state.scope, state.norm);
    var r = range(m, state.scope, state.hideDiag), lo = r[0], hi = r[1];
    var amp = state.overlay && state.scope !== AMP ? ffAmp(state.layer) : null;
    geo = layout();
    var dpr = window.devicePixelRatio || 1, W = geo.left + geo.size + 8, H = geo.top + geo.size + 8;
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
    canvas.style.width = W + "px"; canvas.style.height = H + "px";
    var ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(cells(m, state.scope, lo, hi, state.hideDiag, !!amp), geo.left, geo.top, geo.size, geo.size);
    ctx.strokeStyle = "#d0d7de"; ctx.lineWidth = 1;
    ctx.strokeRect(geo.left - 0.5, geo.top - 0.5, geo.size + 1, geo.size + 1);
    if (amp) drawOverlay(ctx, amp);
    ctx.fillStyle = "#1f2328"; ctx.font = geo.font + "px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    for (var k = 0; k < n; k += geo.every) {
      var c = geo.cell * (k + 0.5), label = data.labels[k];
      ctx.textAlign = "right"; ctx.fillText(label, geo.left - 5, geo.top + c);
      ctx.save(); ctx.translate(geo.left + c, geo.top - 5); ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left"; ctx.fillText(label, 0, 0); ctx.restore();
    }
    ctx.fillStyle = "#656d76"; ctx.font = "11px system-ui, sans-serif"; ctx.textAlign = "center";
    ctx.fillText("input token j \u2192", geo.left + geo.size / 2, 9);
    ctx.save(); ctx.translate(9, geo.top + geo.size / 2); ctx.rotate(-Math.PI / 2);
    ctx.fillText("output token i \u2192", 0, 0); ctx.restore();
    drawLegend(lo, hi, !!amp);
    canvas.dataset.signature = signature(ctx);
    canvas.dataset.layer = state.layer; canvas.dataset.scope = state.scope;
    canvas.dataset.overlay = amp ? "1" : "0";
  }

  function drawOverlay(ctx, amp) {
    var order = [], top = 0;
    for (var k = 0; k < n * n; k++) { var a = Math.abs(amp[k]); if (a > top) top = a; }
    if (top === 0) return;
    for (var k2 = 0; k2 < n * n; k2++) if (Math.abs(amp[k2]) >= 0.05 * top) order.push(k2);
    order.sort(function (x, y) { return Math.abs(amp[y]) - Math.abs(amp[x]); });
    order = order.slice(0, 600);
    order.forEach(function (k) {
      var i = Math.floor(k / n), j = k % n, v = amp[k];
      var radius = Math.max(1, 0.48 * geo.cell * Math.sqrt(Math.abs(v) / top));
      ctx.beginPath();
      ctx.arc(geo.left + geo.cell * (j + 0.5), geo.top + geo.cell * (i + 0.5), radius, 0, 2 * Math.PI);
      ctx.fillStyle = v > 0 ? "rgba(214,39,40,0.78)" : "rgba(31,119,180,0.78)";
      ctx.fill();
    });
  }

  function drawLegend(lo, hi, grey) {
    var bar = document.getElementById("ffb-colorbar"), ctx = bar.getContext("2d");
    bar.width = 160; bar.height = 12;
    for (var x = 0; x < 160; x++) {
      ctx.fillStyle = rgb(colour(state.scope, lo + (hi - lo) * x / 159, lo, hi, grey));
      ctx.fillRect(x, 0, 1, 12);
    }
    document.getElementById("ffb-lo").textContent = fmt(lo);
    document.getElementById("ffb-hi").textContent = fmt(hi);
    var note = document.getElementById("ffb-legend-note");
    if (state.scope === AMP) note.textContent = "red: FF amplifies j \u2192 i; blue: FF dampens it";
    else if (grey) note.textContent = "grey: " + state.scope + "; dots: FF-amp (red amplified, blue dampened)";
    else note.textContent = state.norm === "none" ? "\u2016F_i(x_j)\u2016" : state.norm + "-normalised \u2016F_i(x_j)\u2016";
  }

  function signature(ctx) {
    var px = ctx.getImageData(0, 0, ctx.canvas.width, ctx.canvas.height).data, h = 2166136261 >>> 0;
    for (var k = 0; k < px.length; k += 7) { h ^= px[k]; h = Math.imul(h, 16777619) >>> 0; }
    return h.toString(16);
  }

  function fmt(v) {
    if (v === 0) return "0";
    var a = Math.abs(v);
    return (a >= 1000 || a < 0.001) ? v.toExponential(2) : v.toPrecision(3);
  }

  function drawThumbs() {
    var box = document.getElementById("ffb-thumbs");
    box.textContent = "";
    var side = Math.max(64, Math.min(110, 2 * n));
    allScopes.forEach(function (scope) {
      var fig = document.createElement("figure"), c = document.createElement("canvas");
      fig.className = scope === state.scope ? "active" : "";
      fig.title = "show " + scope;
      fig.dataset.scope = scope;
      c.width = side; c.height = side;
      var m = matrix(state.layer, scope, state.norm), r = range(m, scope, state.hideDiag);
      var ctx = c.getContext("2d");
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(cells(m, scope, r[0], r[1], state.hideDiag, false), 0, 0, side, side);
      var cap = document.createElement("figcaption");
      cap.textContent = scope;
      fig.appendChild(c); fig.appendChild(cap);
      fig.addEventListener("click", function () { set({ scope: scope }); });
      box.appendChild(fig);
    });
  }

  function drawInfo() {
    var info = document.getElementById("ffb-info"), what = data.help[state.scope] || "";
    var delta = state.scope === AMP ? null : data.delta[state.layer][state.scope];
    info.innerHTML = "";
    var head = document.createElement("div"), name = document.createElement("b");
    name.textContent = state.scope;
    head.appendChild(name);
    head.appendChild(document.createTextNode(" \u2014 layer " + state.layer));
    var formula = document.createElement("div");
    formula.className = "formula"; formula.textContent = what;
    info.appendChild(head); info.appendChild(formula);
    if (delta !== null && delta !== undefined) {
      var d = document.createElement("div");
      d.className = "delta"; d.textContent = "completeness residual: " + fmt(delta);
      info.appendChild(d);
    }
  }

  function syncControls() {
    document.querySelectorAll("#ffb-layers button").forEach(function (b) {
      b.setAttribute("aria-pressed", String(Number(b.dataset.layer) === state.layer));
    });
    document.querySelectorAll("#ffb-scopes button").forEach(function (b) {
      b.setAttribute("aria-pressed", String(b.dataset.scope === state.scope));
    });
    var ov = document.getElementById("ffb-overlay");
    ov.checked = state.overlay; ov.disabled = !data.ff_pair || state.scope === AMP;
    document.getElementById("ffb-hidediag").checked = state.hideDiag;
    var norm = document.getElementById("ffb-norm");
    norm.value = state.norm; norm.disabled = state.scope === AMP;
  }

  function render() {
    hide();
    syncControls(); drawMain(); drawThumbs(); drawInfo();
    document.body.dataset.state = [state.layer, state.scope, state.overlay ? 1 : 0, state.hideDiag ? 1 : 0, state.norm].join("|");
    try {
      var hash = "#layer=" + state.layer + "&scope=" + encodeURIComponent(state.scope) + (state.overlay ? "&overlay=1" : "") + (state.hideDiag ? "&diag=0" : "") + (state.norm !== "none" ? "&norm=" + state.norm : "");
      if (window.location.hash !== hash) history.replaceState(null, "", hash);
    } catch (e) { /* file:// pages in some browsers refuse replaceState */ }
  }

  function set(changes) {
    Object.keys(changes).forEach(function (k) { state[k] = changes[k]; });
    render();
  }

  function button(parent, text, attrs, onClick) {
    var b = document.createElement("button");
    b.type = "button"; b.textContent = text;
    Object.keys(attrs).forEach(function (k) { b.dataset[k] = attrs[k]; });
    b.addEventListener("click", onClick);
    parent.appendChild(b);
  }
  var layerBox = document.getElementById("ffb-layers"), scopeBox = document.getElementById("ffb-scopes");
  data.layers.forEach(function (layer) { button(layerBox, String(layer), { layer: layer }, function () { set({ layer: layer }); }); });
  allScopes.forEach(function (scope) { button(scopeBox, scope, { scope: scope }, function () { set({ scope: scope }); }); });
  document.getElementById("ffb-overlay").addEventListener("change", function (e) { set({ overlay: e.target.checked }); });
  document.getElementById("ffb-hidediag").addEventListener("change", function (e) { set({ hideDiag: e.target.checked }); });
  document.getElementById("ffb-norm").addEventListener("change", function (e) { set({ norm: e.target.value }); });

  var tokenBox = document.getElementById("ffb-tokens");
  data.labels.forEach(function (t, k) {
    var s = document.createElement("span");
    s.className = "token"; s.textContent = t; s.title = "token " + k + ": " + data.tokens[k];
    s.dataset.index = k;
    tokenBox.appendChild(s);
  });
  function mark(i, j) {
    tokenBox.querySelectorAll(".token").forEach(function (s, k) {
      s.classList.toggle("out", k === i); s.classList.toggle("in", k === j && k !== i);
    });
  }

  canvas.addEventListener("mousemove", function (e) {
    if (!geo) return;
    var rect = canvas.getBoundingClientRect();
    var x = e.clientX - rect.left - geo.left, y = e.clientY - rect.top - geo.top;
    var j = Math.floor(x / geo.cell), i = Math.floor(y / geo.cell);
    if (x < 0 || y < 0 || i >= n || j >= n) { hide(); return; }
    cursor.style.display = "block";
    cursor.style.left = (geo.left + geo.cell * j - 1) + "px"; cursor.style.top = (geo.top + geo.cell * i - 1) + "px";
    cursor.style.width = cursor.style.height = (geo.cell + 2) + "px";
    var m = matrix(state.layer, state.scope, state.norm), v = m[i * n + j];
    tooltip.innerHTML = "";
    var line = document.createElement("div");
    line.textContent = "output " + i + " \u201c" + data.labels[i] + "\u201d \u2190 input " + j + " \u201c" + data.labels[j] + "\u201d";
    var val = document.createElement("div");
    val.textContent = state.scope + ": ";
    val.appendChild(document.createElement("b")).textContent = fmt(v);
    tooltip.appendChild(line); tooltip.appendChild(val);
    if (state.overlay && state.scope !== AMP && data.ff_pair) {
      var a = document.createElement("div");
      a.innerHTML = "FF-amp: <b></b>"; a.lastChild.textContent = fmt(ffAmp(state.layer)[i * n + j]);
      tooltip.appendChild(a);
    }
    tooltip.style.display = "block";
    tooltip.style.left = (e.clientX - rect.left + 14) + "px";
    tooltip.style.top = (e.clientY - rect.top + 14) + "px";
    mark(i, j);
  });
  function hide() { tooltip.style.display = "none"; cursor.style.display = "none"; mark(-1, -1); }
  canvas.addEventListener("mouseleave", hide);
  document.addEventListener("keydown", function (e) {
    if (e.target && (e.target.tagName === "SELECT" || e.target.tagName === "INPUT")) return;
    var li = data.layers.indexOf(state.layer), si = allScopes.indexOf(state.scope);
    if (e.key === "ArrowRight" && li < data.layers.length - 1) set({ layer: data.layers[li + 1] });
    else if (e.key === "ArrowLeft" && li > 0) set({ layer: data.layers[li - 1] });
    else if (e.key === "ArrowDown" && si < allScopes.length - 1) set({ scope: allScopes[si + 1] });
    else if (e.key === "ArrowUp" && si > 0) set({ scope: allScopes[si - 1] });
    else return;
    e.preventDefault();
  });

  window.ffbView = {
    state: function () { return Object.assign({}, state); },
    set: set,
    value: function (layer, scope, i, j) { return matrix(layer, scope, "none")[i * n + j]; },
    signature: function () { return canvas.dataset.signature; },
    geometry: function () { return geo ? { left: geo.left, top: geo.top, cell: geo.cell, n: n } : null; }
  };
  render();
})();
