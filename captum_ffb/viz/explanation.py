"""Views of an :class:`~captum_ffb.explain.Explanation`: a PNG and an offline HTML page.

The PNG colours each token by its signed contribution (a diverging colormap centred on zero)
twice: on the scale of all tokens, and on the scale of the tokens after the first one, with
the first token greyed out, because the first position often takes a large share (the
attention sink) and would wash out every other colour. When several outputs are explained
(generation), each panel is a heat map: one row per generated token, one column per input
token.

The HTML page holds two tabs: *Contributions* (the same two scales, switched by a toggle,
with a colour legend under each output) and *Whole model* (the ``‖F_i(x_j)‖`` maps after
every block, chosen with a slider, with token labels, a colour scale and a hover readout);
a third, *Components*, when the explanation carries a tokens × components table
(:func:`~captum_ffb.viz.components.components_html`).
Tokens are shown as people read them (:func:`~captum_ffb.texts.text.display_token`).
Everything, data and script, is inside the file: it opens offline.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from captum_ffb.explain import Explanation
from captum_ffb.io.files import write_text
from captum_ffb.viz._common import COLOUR_JS, cpu_view, page
from captum_ffb.viz.components import components_html
from captum_ffb.viz.figures import figure_class, require_matplotlib


def _check(explanation: Any) -> Explanation:
    if not isinstance(explanation, Explanation):
        raise TypeError(f"expected an Explanation from captum_ffb.explain, got {type(explanation).__name__}")
    return explanation


def _title(explanation: Explanation, step: int | None = None) -> str:
    import textwrap

    what = textwrap.fill("Explained: " + explanation.explained, 95)
    if explanation.steps == 0:
        return what
    t = 0 if step is None else step
    share = float(explanation.token_share()[t])
    return (f"{what}\n\"{explanation.target_labels[t]}\": value {float(explanation.values[t]):.3f} "
            f"= Σ tokens {float(explanation.contributions[t].sum()):.3f} + bias {float(explanation.bias[t]):.3f} "
            f"(token share {'–' if share != share else f'{share:.0%}'}; delta {float(explanation.delta[t]):.1e}); "
            f"first-token share {float(explanation.first_token_share()[t]):.0%}")


@cpu_view
def plot_contributions(explanation: Explanation, cmap: str = "RdBu_r") -> Any:
    r"""A figure of the contributions, with and without the first token's scale.

    Args:
        explanation (Explanation): from :func:`captum_ffb.explain.explain_text`.
        cmap (str): a diverging matplotlib colormap, centred on zero.

    Returns:
        matplotlib Figure (two panels; heat maps when several outputs are explained).
    """
    require_matplotlib()
    from matplotlib.colors import TwoSlopeNorm

    explanation = _check(explanation)
    if explanation.steps == 0:
        raise ValueError("this explanation has no contributions (only maps): plot the maps instead")
    values = explanation.contributions.detach().float().cpu()
    labels = explanation.labels
    n = values.shape[1]
    Figure = figure_class()
    if explanation.steps == 1:
        figure = Figure(figsize=(max(8.0, 0.7 * n), 3.8), layout="constrained")
        axes = figure.subplots(2, 1)
        for ax, skip_first in zip(axes, (False, True)):
            row = values[0]
            scale = float(row[1:].abs().max() if skip_first and n > 1 else row.abs().max()) or 1.0
            norm = TwoSlopeNorm(0.0, -scale, scale)
            image = ax.imshow(row[None].numpy(), cmap=cmap, norm=norm, aspect="auto")
            if skip_first:
                ax.add_patch(_grey(ax))
            ax.set_yticks([])
            ax.set_xticks(range(n), labels, rotation=60, ha="right", fontsize=8)
            for j in range(n):
                dark = abs(float(row[j])) > 0.6 * scale and not (skip_first and j == 0)
                ax.text(j, 0, f"{float(row[j]):.2g}", ha="center", va="center", fontsize=7,
                        color="white" if dark else "black", zorder=3)
            ax.set_title("scale of every token" if not skip_first
                         else "scale of the tokens after the first (the first greyed out)", fontsize=9)
            figure.colorbar(image, ax=ax, fraction=0.02)
        figure.suptitle(_title(explanation), fontsize=9)
        return figure
    figure = Figure(figsize=(max(7.0, 0.45 * n), 1.0 + 0.35 * explanation.steps * 2),
                    layout="constrained")
    axes = figure.subplots(1, 2)
    for ax, skip_first in zip(axes, (False, True)):
        scale = float(values[:, 1:].abs().max() if skip_first and n > 1 else values.abs().max()) or 1.0
        image = ax.imshow(values.numpy(), cmap=cmap, norm=TwoSlopeNorm(0.0, -scale, scale), aspect="auto")
        if skip_first:
            ax.add_patch(_grey(ax, rows=explanation.steps))
        ax.set_xticks(range(n), labels, rotation=70, ha="right", fontsize=7)
        ax.set_yticks(range(explanation.steps), [t.strip() or t for t in explanation.target_labels],
                      fontsize=7)
        ax.set_xlabel("input token")
        ax.set_ylabel("generated token")
        ax.set_title("scale of every token" if not skip_first else "without the first token's scale",
                     fontsize=9)
        figure.colorbar(image, ax=ax, fraction=0.03)
    shares = explanation.first_token_share()
    import textwrap

    figure.suptitle(f"{textwrap.fill('Explained: ' + explanation.explained, 95)}\nlargest delta {float(explanation.delta.max()):.1e}; "
                    f"first-token share {float(shares.mean()):.0%} on average", fontsize=9)
    return figure


def _grey(ax: Any, rows: int = 1) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((-0.5, -0.5), 1.0, rows, facecolor="0.8", edgecolor="0.5", hatch="//", zorder=2)


def _payload(explanation: Explanation) -> dict[str, Any]:
    """The page's data: tokens and targets only as people read them (the JSON keeps both);
    the components tab carries its own."""
    data = explanation.to_dict()
    del data["tokens"]
    data.pop("components", None)
    for output in data["outputs"]:
        output["target"] = output.pop("target_label")
    data["target_labels"] = explanation.target_labels
    return data


@cpu_view
def explanation_html(explanation: Explanation, title: str | None = None) -> str:
    r"""A self-contained HTML page of an explanation (offline: no CDN, no network).

    Args:
        explanation (Explanation): from :func:`captum_ffb.explain.explain_text`.
        title (str, optional): the page title.

    Returns:
        str: the HTML document.
    """
    explanation = _check(explanation)
    table = explanation.components
    tab = "" if table is None else '<button id="tab-k">Components</button>'
    components = "" if table is None else f'<section id="components" style="display:none">{components_html(table)}</section>'
    body = f"""<div class="tabs"><button id="tab-c" class="on">Contributions</button><button id="tab-m">Whole model</button>{tab}</div>
<section id="contrib">
 <p class="meta" id="explained"></p>
 <label><input type="checkbox" id="nofirst"> colours on the scale of the tokens after the first one</label>
 <p class="meta" id="legend-note">Colour: a token's signed contribution to the output. Red tokens raise
 it, blue tokens lower it, white ones leave it unchanged; the colour is full at the largest
 |contribution| of the row (the scale under each heading). Hover a token for its value.</p>
 <div id="rows"></div>
</section>
<section id="whole" style="display:none">
 <p class="meta">‖F<sub>i</sub>(x<sub>j</sub>)‖ after a block, over the original input tokens: output token i down, input token j across.
 Darker cells: more of output token i's vector comes from input token j. Hover a cell for its value.</p>
 <label>block <input type="range" id="block" min="0" value="0"> <span id="blockname"></span></label>
 <div class="legend" id="map-legend"><span id="map-lo">0</span><span class="bar sequential"></span><span id="map-hi"></span>
  <span>‖F<sub>i</sub>(x<sub>j</sub>)‖, this block's scale</span></div>
 <div class="scroll"><canvas id="map" aria-label="whole-model token-to-token map"></canvas></div>
</section>
{components}
<div id="tip" class="tip"></div>"""
    return page(title or "Which tokens drove this output", body, header='<div class="meta" id="meta"></div>\n',
                style=_STYLE, data={"data": _payload(explanation)}, script=[COLOUR_JS, _SCRIPT])


def save_explanation_html(explanation: Explanation, path: str | os.PathLike,
                          title: str | None = None) -> Path:
    """Write :func:`explanation_html` to ``path``; returns the path."""
    return write_text(path, explanation_html(explanation, title))


#: The page's own rules (after the shared stylesheet).
_STYLE = """
.tabs button { padding: .35em .9em; margin-right: .3em; border: 1px solid #999; background: #f4f4f4; cursor: pointer; }
.tabs button.on { background: #333; color: #fff; }
.tok { display: inline-block; margin: 2px; padding: 3px 5px; border-radius: 3px; border: 1px solid #ccc;
 font-family: ui-monospace, monospace; font-size: 13px; }
.tok.first { outline: 2px dashed #888; }
#map { display: block; }
"""

_SCRIPT = """(function(){
const D = JSON.parse(document.getElementById('data').textContent);
const $ = id => document.getElementById(id);
$('meta').textContent = D.model + ' · ' + D.model_type + ' · ' + D.task + ' · ' + D.labels.length + ' tokens · route ' + D.route;
$('explained').textContent = 'Explained: ' + D.explained + '.';
function fmt(v){
  if (v === 0) return '0';
  const a = Math.abs(v);
  return (a >= 1000 || a < 0.001) ? v.toExponential(2) : v.toPrecision(3);
}
function legend(scale, skip){
  const box = document.createElement('div'), bar = document.createElement('span');
  box.className = 'legend';
  bar.className = 'bar diverging';
  const lo = document.createElement('span'), hi = document.createElement('span'), note = document.createElement('span');
  lo.textContent = '\u2212' + fmt(scale) + ' (lowers)'; hi.textContent = '+' + fmt(scale) + ' (raises)';
  note.textContent = skip ? 'scale of the tokens after the first (the first greyed out)' : 'scale of every token';
  box.append(lo, bar, hi, note);
  return box;
}
function drawRows(){
  const skip = $('nofirst').checked, box = $('rows');
  box.innerHTML = '';
  if (!D.outputs.length){ box.textContent = 'No output is explained for this model: see the Whole model tab.'; return; }
  D.outputs.forEach(o => {
    const c = o.contributions;
    let scale = 0;
    c.forEach((v, j) => { if (!(skip && j === 0)) scale = Math.max(scale, Math.abs(v)); });
    const div = document.createElement('div');
    const head = document.createElement('p');
    head.className = 'meta';
    head.textContent = '\u201c' + o.target + '\u201d: value ' + o.value.toFixed(4) + ' = Σ tokens ' +
      o.tokens.toFixed(4) + ' + bias ' + o.bias.toFixed(4) + ' (token share ' +
      (o.token_share === null ? '–' : (100 * o.token_share).toFixed(0) + '%') +
      '; delta ' + o.convergence_delta.toExponential(1) + '); first token ' +
      o.first_token.toFixed(4) + ', first-token share ' + (100 * o.first_token_share).toFixed(0) + '%';
    div.appendChild(head);
    div.appendChild(legend(scale, skip));
    c.forEach((v, j) => {
      if (j >= D.labels.length) return;
      const s = document.createElement('span');
      s.className = 'tok' + (j === 0 ? ' first' : '');
      s.textContent = D.labels[j];
      s.dataset.value = v;
      const c = (skip && j === 0) ? [221, 221, 221] : ffbColour.diverging(v, scale);
      s.style.background = ffbColour.css(c);
      s.style.color = ffbColour.ink(c);
      s.title = D.labels[j] + ': ' + v.toFixed(5);
      div.appendChild(s);
    });
    box.appendChild(div);
  });
}
$('nofirst').addEventListener('change', drawRows);
const maps = D.maps || [];
const slider = $('block');
slider.max = Math.max(0, maps.length - 1);
let geo = null;
function drawMap(){
  const canvas = $('map'), k = +slider.value;
  $('blockname').textContent = maps.length ? ('after block ' + (k + 1) + ' of ' + maps.length) : 'no maps were computed';
  if (!maps.length){ $('map-legend').style.display = 'none'; canvas.width = canvas.height = 0; return; }
  const m = maps[k], n = m.length, labels = D.labels.slice(0, n);
  const cell = Math.max(14, Math.min(32, Math.floor(640 / n))), font = Math.min(12, cell - 2);
  const ctx = canvas.getContext('2d');
  ctx.font = font + 'px ui-monospace,monospace';
  let widest = 0; labels.forEach(t => { widest = Math.max(widest, ctx.measureText(t).width); });
  const margin = Math.ceil(Math.min(widest, 160)) + 8, left = margin + 16, top = margin + 16;
  canvas.width = left + n * cell + 2; canvas.height = top + n * cell + 2;
  canvas.dataset.block = k;
  let hi = 0; m.forEach(r => r.forEach(v => { hi = Math.max(hi, v); }));
  $('map-hi').textContent = fmt(hi);
  ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++){
    ctx.fillStyle = ffbColour.css(ffbColour.sequential(m[i][j], hi));
    ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
  }
  ctx.strokeStyle = '#bbb'; ctx.strokeRect(left - 0.5, top - 0.5, n * cell + 1, n * cell + 1);
  ctx.fillStyle = '#222'; ctx.font = font + 'px ui-monospace,monospace'; ctx.textBaseline = 'middle';
  const drawn = [];
  function clip(t){ return ctx.measureText(t).width <= 160 ? t : t.slice(0, 18) + '\u2026'; }
  labels.forEach((t, q) => {
    const c = cell * (q + 0.5);
    ctx.textAlign = 'right'; ctx.fillText(clip(t), left - 4, top + c);
    ctx.save(); ctx.translate(left + c, top - 4); ctx.rotate(-Math.PI / 2);
    ctx.textAlign = 'left'; ctx.fillText(clip(t), 0, 0); ctx.restore();
    drawn.push(t);
  });
  ctx.fillStyle = '#666'; ctx.font = '11px system-ui,sans-serif'; ctx.textAlign = 'left';
  ctx.fillText('input token j \u2192', left, 8);
  ctx.save(); ctx.translate(8, top); ctx.rotate(Math.PI / 2); ctx.fillText('output token i \u2192', 0, 0); ctx.restore();
  geo = {left: left, top: top, cell: cell, n: n, labels: drawn};
  canvas.onmousemove = e => {
    const r = canvas.getBoundingClientRect(), x = e.clientX - r.left - left, y = e.clientY - r.top - top;
    const j = Math.floor(x / cell), i = Math.floor(y / cell), tip = $('tip');
    if (x < 0 || y < 0 || i >= n || j >= n){ tip.style.display = 'none'; return; }
    tip.style.display = 'block'; tip.style.left = (e.clientX + 12) + 'px'; tip.style.top = (e.clientY + 12) + 'px';
    tip.textContent = 'output ' + i + ' \u201c' + labels[i] + '\u201d \u2190 input ' + j + ' \u201c' + labels[j] + '\u201d: ' + fmt(m[i][j]);
  };
  canvas.onmouseleave = () => { $('tip').style.display = 'none'; };
}
window.ffbExplain = {geometry: () => geo};
slider.addEventListener('input', drawMap);
const tabs = {c: 'contrib', m: 'whole', k: 'components'};
function show(which){
  Object.keys(tabs).filter(t => $('tab-' + t)).forEach(t => {
    $(tabs[t]).style.display = t === which ? '' : 'none';
    $('tab-' + t).className = t === which ? 'on' : '';
  });
  if (which === 'm') drawMap();
}
Object.keys(tabs).filter(t => $('tab-' + t)).forEach(t => $('tab-' + t).addEventListener('click', () => show(t)));
drawRows(); drawMap();
if (location.hash === '#whole') show('m');
if (location.hash === '#components' && $('tab-k')) show('k');
})();
"""
