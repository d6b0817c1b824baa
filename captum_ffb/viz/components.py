"""Views of a :class:`~captum_ffb.components.table.ComponentAttribution`: a tokens × components
heat map (matplotlib) and an offline HTML fragment of the same table.

Both colour a cell by its signed direct effect on a diverging scale centred on zero and
symmetric (``±`` the largest ``|value|`` shown), as Captum's heat maps do. Up to
:data:`NAMED_COLUMNS_UP_TO` columns every component is named; beyond (head granularity on a
deep model), the columns are thin and only the blocks, the embeddings and the head are named,
with a line between blocks.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from captum_ffb.components.table import ComponentAttribution
from captum_ffb.viz._common import COLOUR_JS, DIVERGING, cpu_view, escape, gradient, json_block
from captum_ffb.viz.figures import figure_class, require_matplotlib

#: Up to this many columns every component is named; beyond, only block boundaries are.
NAMED_COLUMNS_UP_TO = 80
#: Up to this many tokens every row is named; beyond, every k-th one.
NAMED_ROWS_UP_TO = 80

_BLOCK = re.compile(r"^block\.(\d+)(?:\.|$)")


def _check(result: Any) -> ComponentAttribution:
    if not isinstance(result, ComponentAttribution):
        raise TypeError("expected a ComponentAttribution from NormDecomposition.attribute_components, "
                        f"got {type(result).__name__}")
    return result


def _columns(result: ComponentAttribution, components: str | None) -> list[int]:
    """The columns kept by the regular expression ``components`` (all of them for ``None``)."""
    if components is None:
        return list(range(len(result.components)))
    kept = result.select(components)
    if not kept:
        raise ValueError(f"no component matches {components!r}; components: "
                         f"{', '.join(result.components[:6])}{', ...' if len(result.components) > 6 else ''}")
    return kept


def _token_labels(result: ComponentAttribution, row: int, n: int) -> list[str]:
    if result.tokens is None:
        return [str(j) for j in range(n)]
    labels = list(result.tokens[row])
    if len(labels) != n:
        raise ValueError(f"row {row} has {len(labels)} token labels for {n} positions")
    return labels


#: How the components outside the blocks are labelled in figures (``output_head``: the output
#: head's own terms, not an attention head).
OUTSIDE_LABELS = {"output_head": "output head", "embeddings": "embeddings"}


def column_groups(names: list[str]) -> list[tuple[int, int, str]]:
    """``(first column, column after the last, label)`` of each run of columns: one per block
    (``"block <l>"``), and one per component outside the blocks (``"embeddings"``, ``"output_head"``)."""
    groups: list[tuple[int, int, str]] = []
    for k, name in enumerate(names):
        found = _BLOCK.match(name)
        label = f"block {found.group(1)}" if found else name
        if groups and groups[-1][2] == label:
            groups[-1] = (groups[-1][0], k + 1, label)
        else:
            groups.append((k, k + 1, label))
    return groups


def _summary(result: ComponentAttribution, row: int) -> str:
    value = float(result.value[row])
    bias = float(result.bias[row].sum())
    total = float(result.contributions[row].sum())
    return (f"value {value:.4g} = Σ contributions {total:.4g} + Σ bias {bias:.4g} "
            f"(delta {float(result.delta[row]):.1e})")


@cpu_view
def plot_components(
    result: ComponentAttribution,
    row: int = 0,
    components: str | None = None,
    cmap: str = "RdBu_r",
    title: str | None = None,
    figsize: tuple[float, float] | None = None,
) -> Any:
    r"""A heat map of one row of direct effects: tokens down, components across.

    Args:
        result (ComponentAttribution): from ``NormDecomposition.attribute_components()``.
        row (int): the batch row to show.
        components (str, optional): a regular expression; only the components whose name it
                    matches (``re.search``) are shown, e.g. ``r"\.ff$"`` or ``r"^block\.3\."``.
        cmap (str): a diverging matplotlib colormap; its centre is zero and the scale is
                    symmetric, ``±`` the largest ``|value|`` shown.
        title (str, optional): a first title line (what is explained); the second gives the
                    value, ``Σ`` bias and the delta of the whole row.
        figsize (tuple, optional): inches; by default from the numbers of tokens and columns.

    Returns:
        matplotlib Figure (one heat map and its colour bar).
    """
    require_matplotlib()
    from matplotlib.colors import Normalize

    result = _check(result)
    kept = _columns(result, components)
    values = result.contributions[row].detach().float().cpu()[:, kept]
    n, width = values.shape
    names = [result.components[k] for k in kept]
    labels = _token_labels(result, row, n)
    named = width <= NAMED_COLUMNS_UP_TO
    if figsize is None:
        per_column = 0.16 if named else 0.04
        figsize = (min(24.0, max(6.0, 2.5 + per_column * width)),
                   min(30.0, max(3.0, 2.2 + 0.2 * min(n, NAMED_ROWS_UP_TO) + (1.2 if named else 0.4))))
    figure = figure_class()(figsize=figsize, layout="constrained")
    ax = figure.subplots()
    scale = float(values.abs().max()) or 1.0
    image = ax.imshow(values.numpy(), cmap=cmap, norm=Normalize(-scale, scale), aspect="auto",
                      interpolation="nearest")
    if named:
        ax.set_xticks(range(width), [OUTSIDE_LABELS.get(name, name) for name in names], rotation=90,
                      fontsize=6 if width > 30 else 8)
        ax.set_xlabel(f"component ({result.granularity})")
    else:  # one tick per block, its number; the components outside the blocks named
        groups = column_groups(names)
        ax.set_xticks([(start + stop - 1) / 2 for start, stop, _ in groups],
                      [label.removeprefix("block ") if label.startswith("block ") else OUTSIDE_LABELS.get(label, label)
                       for _, _, label in groups], rotation=90, fontsize=6)
        for start, _, label in groups[1:]:
            outside = not label.startswith("block ")
            ax.axvline(start - 0.5, color="black", linewidth=1.4 if outside else 0.5, alpha=0.8 if outside else 0.5)
        inside = {"head": "its attention heads, then its FF", "sublayer": "its attention, then its FF",
                  "block": "one column"}.get(result.granularity, result.granularity)
        ax.set_xlabel(f"block (each block: {inside}); the named columns lie outside the blocks")
    step = 1 if n <= NAMED_ROWS_UP_TO else -(-n // NAMED_ROWS_UP_TO)
    ax.set_yticks(range(0, n, step), labels[::step], fontsize=7)
    ax.set_ylabel("input token")
    figure.colorbar(image, ax=ax, fraction=0.03, label="direct effect on the read-out")
    heading = _summary(result, row)
    if len(kept) < len(result.components):
        heading += f"; {len(kept)} of {len(result.components)} components shown ({components!r})"
    if title is not None:
        heading = f"{textwrap.fill(title, 100)}\n{heading}"
    figure.suptitle(heading, fontsize=9)
    return figure


@cpu_view
def components_html(result: ComponentAttribution, row: int = 0, top: int = 10) -> str:
    r"""An offline HTML fragment of one row: the tokens × components heat map (a canvas; hover
    a cell for its token, component and value) and the ``top`` largest entries below it.

    The fragment carries its own data, style and script (no network): put it anywhere in a
    page's ``<body>``, once per page.

    Args:
        result (ComponentAttribution): from ``NormDecomposition.attribute_components()``.
        row (int): the batch row to show.
        top (int): how many of the largest ``|value|`` entries to list.

    Returns:
        str: the HTML fragment.
    """
    result = _check(result)
    values = result.contributions[row].detach().float().cpu()
    labels = _token_labels(result, row, values.shape[0])
    data = {"labels": labels, "components": list(result.components), "values": values.tolist(),
            "groups": column_groups(result.components), "named": len(result.components) <= NAMED_COLUMNS_UP_TO,
            "scale": float(values.abs().max())}
    entries = "".join(
        f"<li><code>{escape(labels[j])}</code> × <code>{escape(name)}</code>: "
        f"{escape(f'{value:+.4g}')}</li>" for j, name, value in result.top(top, row))
    parts = {"SUMMARY": escape(f"{result.granularity} granularity; {_summary(result, row)}"),
             "TOP": escape(min(top, values.numel())), "ENTRIES": entries, "DATA": json_block("cmp-data", data)}
    return re.sub(r"__(SUMMARY|TOP|ENTRIES|DATA)__", lambda found: parts[found.group(1)], _FRAGMENT)


_FRAGMENT = """<div class="ffb-components">
<style>
.ffb-components .meta{color:#555;font-size:13px;margin:.4em 0}
.ffb-components .legend{display:flex;align-items:center;gap:.5em;font-size:12px;color:#555;margin:.2em 0 .5em}
.ffb-components .bar{display:inline-block;width:180px;height:12px;border:1px solid #aaa;
 background:__GRADIENT__}
.ffb-components .scroll{overflow:auto;max-width:100%;max-height:80vh}
.ffb-components canvas{display:block}
.ffb-components ol{font-size:13px}
#cmp-tip{position:fixed;background:#fff;border:1px solid #888;padding:2px 6px;font-size:12px;display:none;pointer-events:none}
</style>
<p class="meta">Direct effect of each input token (down) through each component (across) on the
read-out: red raises it, blue lowers it; the colour is full at the largest |value| of the table.
Hover a cell for its value.</p>
<p class="meta" id="cmp-summary">__SUMMARY__</p>
<div class="legend"><span id="cmp-lo"></span><span class="bar"></span><span id="cmp-hi"></span></div>
<div class="scroll"><canvas id="cmp-map" aria-label="tokens by components heat map"></canvas></div>
<p class="meta">The __TOP__ largest entries (token × component: value):</p>
<ol id="cmp-top">__ENTRIES__</ol>
<div id="cmp-tip"></div>
__DATA__
<script>
__COLOUR_JS__(function(){
const D = JSON.parse(document.getElementById('cmp-data').textContent);
const canvas = document.getElementById('cmp-map'), tip = document.getElementById('cmp-tip');
function fmt(v){
  if (v === 0) return '0';
  const a = Math.abs(v);
  return (a >= 1000 || a < 0.001) ? v.toExponential(2) : v.toPrecision(3);
}
document.getElementById('cmp-lo').textContent = '\\u2212' + fmt(D.scale) + ' (lowers)';
document.getElementById('cmp-hi').textContent = '+' + fmt(D.scale) + ' (raises)';
const n = D.labels.length, m = D.components.length;
const cw = D.named ? Math.max(10, Math.min(28, Math.floor(1000 / m))) : Math.max(3, Math.floor(1200 / m));
const ch = Math.max(12, Math.min(22, Math.floor(640 / n))), font = Math.min(12, ch - 2);
const ctx = canvas.getContext('2d');
ctx.font = font + 'px ui-monospace,monospace';
function clip(t){ return t.length <= 24 ? t : t.slice(0, 22) + '\\u2026'; }
const ticks = D.named ? D.components.map((c, k) => [k, k + 1, c]) : D.groups;
let wideRow = 0, wideCol = 0;
D.labels.forEach(t => { wideRow = Math.max(wideRow, ctx.measureText(clip(t)).width); });
ticks.forEach(g => { wideCol = Math.max(wideCol, ctx.measureText(clip(g[2])).width); });
const left = Math.ceil(wideRow) + 10, top = Math.ceil(wideCol) + 10;
canvas.width = left + m * cw + 2; canvas.height = top + n * ch + 2;
ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, canvas.width, canvas.height);
for (let j = 0; j < n; j++) for (let c = 0; c < m; c++){
  ctx.fillStyle = ffbColour.css(ffbColour.diverging(D.values[j][c], D.scale));
  ctx.fillRect(left + c * cw, top + j * ch, cw, ch);
}
ctx.strokeStyle = '#bbb'; ctx.strokeRect(left - 0.5, top - 0.5, m * cw + 1, n * ch + 1);
if (!D.named){
  ctx.strokeStyle = '#555';
  D.groups.slice(1).forEach(g => { ctx.beginPath(); ctx.moveTo(left + g[0] * cw + 0.5, top);
    ctx.lineTo(left + g[0] * cw + 0.5, top + n * ch); ctx.stroke(); });
}
ctx.font = font + 'px ui-monospace,monospace'; ctx.fillStyle = '#222'; ctx.textBaseline = 'middle';
D.labels.forEach((t, j) => { ctx.textAlign = 'right'; ctx.fillText(clip(t), left - 4, top + ch * (j + 0.5)); });
ticks.forEach(g => {
  ctx.save(); ctx.translate(left + cw * (g[0] + g[1]) / 2, top - 4);
  ctx.rotate(-Math.PI / 2); ctx.textAlign = 'left'; ctx.fillText(clip(g[2]), 0, 0); ctx.restore();
});
const geo = {left: left, top: top, cell: [cw, ch], n: n, m: m};
window.ffbComponents = {geometry: () => geo};
canvas.onmousemove = e => {
  const r = canvas.getBoundingClientRect(), x = e.clientX - r.left - left, y = e.clientY - r.top - top;
  const c = Math.floor(x / cw), j = Math.floor(y / ch);
  if (x < 0 || y < 0 || j >= n || c >= m){ tip.style.display = 'none'; return; }
  tip.style.display = 'block'; tip.style.left = (e.clientX + 12) + 'px'; tip.style.top = (e.clientY + 12) + 'px';
  tip.textContent = 'token ' + j + ' \\u201c' + D.labels[j] + '\\u201d \\u00d7 ' + D.components[c] + ': ' + fmt(D.values[j][c]);
};
canvas.onmouseleave = () => { tip.style.display = 'none'; };
})();
</script>
</div>""".replace("__GRADIENT__", gradient(DIVERGING)).replace("__COLOUR_JS__", COLOUR_JS)
