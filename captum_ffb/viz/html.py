"""A self-contained, offline, interactive HTML view of the maps of one text."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import numpy as np

from captum_ffb.io.files import write_text
from captum_ffb.texts.text import TextMaps
from captum_ffb.viz._assets import CSS, JS
from captum_ffb.viz._common import (
    COLOUR_JS,
    check_text_maps,
    cpu_view,
    display_tokens,
    escape,
    ff_pair_of,
    page,
)

_CHAIN_NAMES = {"post_ln": "Post-LN", "pre_ln": "Pre-LN"}

#: What each scope decomposes, shown next to the map.
SCOPE_HELP = {
    "post_ln": {
        "Atb": "LN1(x + ATTN(x))",
        "AtbFf": "FF(Atb)",
        "AtbFfRes": "FF(Atb) + Atb",
        "AtbFfResLn": "LN2(FF(Atb) + Atb): the whole layer",
    },
    "pre_ln": {
        "Atb": "h = x + ATTN(LN1(x))",
        "AtbLn": "LN2(h)",
        "AtbLnFf": "FF(LN2(h))",
        "AtbLnFfRes": "h + FF(LN2(h)): the whole layer",
    },
}


def _payload(
    maps: TextMaps, title: str | None, layer: int | None, scope: str | None
) -> dict[str, Any]:
    pair = ff_pair_of(maps.scopes, maps.ff_pair)
    help_text = dict(SCOPE_HELP.get(maps.chain, {}))
    if pair:
        help_text["FF-amp"] = (
            f"{pair[1]} − {pair[0]}, each column-normalised to sum 1: what the FF block "
            "amplifies (red) or dampens (blue)"
        )
    if layer is not None and layer not in maps.maps:
        raise ValueError(f"layer {layer} was not computed; computed: {maps.layers}")
    allowed = list(maps.scopes) + (["FF-amp"] if pair else [])
    if scope is not None and scope not in allowed:
        raise ValueError(f"unknown scope {scope!r}; available: {', '.join(allowed)}")
    encoded = {
        str(i): {
            s: base64.b64encode(
                np.ascontiguousarray(maps.maps[i][s].detach().float().cpu().numpy(), dtype="<f4")
            ).decode("ascii")
            for s in maps.scopes
        }
        for i in maps.layers
    }
    return {
        "title": title,
        "text": maps.text,
        "model": maps.model_name,
        "model_type": maps.model_type,
        "chain": maps.chain,
        "tokens": list(maps.tokens),
        "labels": display_tokens(maps.tokens),
        "scopes": list(maps.scopes),
        "ff_pair": list(pair) if pair else None,
        "layers": list(maps.layers),
        "maps": encoded,
        "delta": {str(i): maps.delta[i] for i in maps.layers},
        "help": help_text,
        "initial_layer": layer,
        "initial_scope": scope,
    }


@cpu_view
def html_view(
    maps: TextMaps,
    title: str | None = None,
    layer: int | None = None,
    scope: str | None = None,
) -> str:
    r"""A self-contained HTML page to explore the maps of one text, offline.

    The page holds the maps (float32, base64) and its own JavaScript and CSS: no network,
    no CDN. Choose the layer and the scope with the buttons (or the arrow keys), hover a
    cell to see the two tokens and the value, and switch on the FF-amp overlay to see,
    over any scope, which token pairs the FF block amplifies (red) or dampens (blue). The
    state is kept in the URL fragment, e.g. ``view.html#layer=3&scope=AtbFf&overlay=1``.

    Args:
        maps (TextMaps): from :func:`captum_ffb.texts.text.text_maps`.
        title (str, optional): the page title; the model name by default.
        layer (int, optional): the layer shown first; the first computed layer by default.
        scope (str, optional): the scope shown first (or ``"FF-amp"``); the last one (the
                    whole layer) by default.

    Returns:
        str: the HTML document.
    """
    maps = check_text_maps(maps)
    data = _payload(maps, title, layer, scope)
    n = len(maps.tokens)
    meta = (
        f"{maps.model_name} · {maps.model_type} · {_CHAIN_NAMES.get(maps.chain, maps.chain)} · "
        f"{n} tokens · layers {', '.join(map(str, maps.layers))}"
    )
    header = f'<div class="meta">{escape(meta)}</div>\n<p class="text">“{escape(maps.text)}”</p>\n'
    return page(title or "Token-to-token maps", _BODY, header=header, style=CSS,
                data={"ffb-data": data}, script=[COLOUR_JS, JS])


_BODY = """<div class="controls">
  <div class="row"><span class="label">Layer</span><div id="ffb-layers" class="buttons" role="group" aria-label="layer"></div></div>
  <div class="row"><span class="label">Scope</span><div id="ffb-scopes" class="buttons" role="group" aria-label="scope"></div></div>
  <div class="row"><span class="label"></span>
    <label class="opt"><input type="checkbox" id="ffb-overlay"> FF-amp overlay</label>
    <label class="opt"><input type="checkbox" id="ffb-hidediag"> hide the diagonal</label>
    <label class="opt">colour scale <select id="ffb-norm"><option value="none">raw norms</option><option value="row">rows sum to 1</option><option value="column">columns sum to 1</option></select></label>
  </div>
</div>
<main>
  <div class="plot"><canvas id="ffb-map" aria-label="token-to-token map"></canvas><div id="ffb-cursor"></div><div id="ffb-tooltip" role="tooltip"></div></div>
  <aside>
    <div id="ffb-info"></div>
    <div id="ffb-legend"><span id="ffb-lo"></span><canvas id="ffb-colorbar" width="160" height="12"></canvas><span id="ffb-hi"></span></div>
    <div id="ffb-legend-note" class="note"></div>
    <div id="ffb-thumbs"></div>
  </aside>
</main>
<div id="ffb-tokens" aria-label="tokens"></div>
<footer>Cell (i, j) is ‖F<sub>i</sub>(x<sub>j</sub>)‖, the norm of the part of output vector i
that comes from input token j, so that every output is exactly Σ<sub>j</sub> F<sub>i</sub>(x<sub>j</sub>) + b<sub>i</sub>
(Kobayashi et al., ICLR 2024). Hover a cell for its tokens and value; ← → change the layer,
↑ ↓ the scope. Made with captum_ffb; works offline.</footer>"""


def save_html(maps: TextMaps, path: str | os.PathLike, **kwargs: Any) -> Path:
    r"""Write :func:`html_view` to ``path`` (folders are created) and return the path.

    Args:
        maps (TextMaps): from :func:`captum_ffb.texts.text.text_maps`.
        path (str or PathLike): the file to write.
        **kwargs: passed to :func:`html_view` (``title``, ``layer``, ``scope``).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_text(target, html_view(maps, **kwargs))


def show_html(maps: TextMaps, height: int = 760, **kwargs: Any) -> Any:
    r"""Show :func:`html_view` inside a notebook (in an isolated ``<iframe>``).

    Args:
        maps (TextMaps): from :func:`captum_ffb.texts.text.text_maps`.
        height (int): the frame height in pixels.
        **kwargs: passed to :func:`html_view`.

    Returns:
        IPython.display.HTML
    """
    from IPython.display import HTML

    return HTML(framed_page(html_view(maps, **kwargs), height))


def framed_page(page: str, height: int = 760) -> str:
    r"""A whole HTML page inside an isolated ``<iframe>`` (its scripts run, nothing else of the
    host page reaches it): how notebooks and the Gradio app show :func:`html_view` and
    :func:`~captum_ffb.viz.explanation_html`.

    Args:
        page (str): an HTML document.
        height (int): the frame height in pixels.

    Returns:
        str: an HTML fragment.
    """
    escaped = escape(page)
    return (f'<div><iframe srcdoc="{escaped}" style="width:100%;height:{int(height)}px;border:0" '
            'sandbox="allow-scripts"></iframe></div>')
