r"""The one page skeleton and the one colour scale of every HTML page the package writes.

Every page (the maps view, the explanation page and the encoder–decoder table of
:mod:`captum_ffb.viz`, the faithfulness report of :mod:`captum_ffb.evaluation`, the analysis
report of :mod:`captum_ffb.analysis`) is :func:`page`: the doctype, a head with the shared
:data:`STYLESHEET` (the page's own rules after it), the title, a header, the body, the page's
data as JSON blocks and its script, everything inline: a page opens offline and requests
nothing. The title is escaped here; the header and the body are HTML whose user text the
caller escaped (:func:`escape`).

The colour of a value is one scale: :func:`diverging` for signed values (blue below zero, white
at zero, red above: matplotlib's ``RdBu_r``, the figures' own map) and :func:`sequential` for
non-negative ones (white to dark red: matplotlib's ``Reds``), with :func:`ink` the text colour
that reads on it. :data:`COLOUR_JS` is the same scale for a page's script (``ffbColour``), and
:func:`gradient` for a CSS colour bar; all are built from the same stops.

Why this module sits on the bottom floor, beside :mod:`captum_ffb.io.files`, and not in ``viz/``:
the evaluation and analysis reports use the skeleton too, and their floor is below ``viz``'s
(imports only point down); a service two upper rooms need moves down a floor.
:mod:`captum_ffb.viz` re-exports it for its views (``captum_ffb.viz._common``). It needs the
standard library only.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "COLOUR_JS",
    "DIVERGING",
    "MUTED",
    "SEQUENTIAL",
    "STYLESHEET",
    "css",
    "diverging",
    "escape",
    "gradient",
    "ink",
    "json_block",
    "page",
    "ramp",
    "sequential",
]

RGB = tuple[int, int, int]

#: Signed values, −bound to +bound: matplotlib's ``RdBu_r`` (blue, white, red) in 11 stops.
DIVERGING: tuple[RGB, ...] = (
    (5, 48, 97), (33, 102, 172), (67, 147, 195), (146, 197, 222), (209, 229, 240), (247, 247, 247),
    (253, 219, 199), (244, 165, 130), (214, 96, 77), (178, 24, 43), (103, 0, 31))
#: Non-negative values, 0 to the largest: matplotlib's ``Reds`` (white to dark red) in 9 stops.
SEQUENTIAL: tuple[RGB, ...] = (
    (255, 245, 240), (254, 224, 210), (252, 187, 161), (252, 146, 114), (251, 106, 74),
    (239, 59, 44), (203, 24, 29), (165, 15, 21), (103, 0, 13))
#: Non-negative values drawn under something else (the maps view's FF-amp overlay): greys.
MUTED: tuple[RGB, ...] = ((255, 255, 255), (217, 217, 217), (150, 150, 150), (82, 82, 82), (20, 20, 20))

#: The text colours :func:`ink` chooses between (the stylesheet's ink, and white).
_DARK_INK, _LIGHT_INK = "#1f2328", "#fff"


def ramp(stops: Sequence[RGB], t: float) -> RGB:
    """The colour at ``t`` along ``stops`` (0: the first, 1: the last; linear between two
    stops; clipped to [0, 1], NaN at 0)."""
    t = 0.0 if t != t else min(max(float(t), 0.0), 1.0)
    t *= len(stops) - 1
    k = min(len(stops) - 2, int(t))
    f = t - k
    # rounded half up, as the script's Math.round
    return tuple(int(a + (b - a) * f + 0.5) for a, b in zip(stops[k], stops[k + 1]))  # type: ignore[return-value]


def diverging(value: float, bound: float) -> RGB:
    """The colour of a signed ``value`` on the scale ``[−bound, bound]``: white at zero, full
    blue at ``−bound``, full red at ``+bound`` (clipped beyond; white when ``bound`` is not
    positive or ``value`` is NaN)."""
    if not bound > 0 or value != value:
        return ramp(DIVERGING, 0.5)
    return ramp(DIVERGING, 0.5 + 0.5 * float(value) / float(bound))


def sequential(value: float, top: float) -> RGB:
    """The colour of a non-negative ``value`` on the scale ``[0, top]``: white at 0, dark red
    at ``top`` (clipped; white when ``top`` is not positive or ``value`` is NaN)."""
    if not top > 0 or value != value:
        return ramp(SEQUENTIAL, 0.0)
    return ramp(SEQUENTIAL, float(value) / float(top))


def css(colour: Sequence[float]) -> str:
    """``rgb(r,g,b)`` of a colour (components rounded)."""
    return "rgb({},{},{})".format(*(int(c + 0.5) for c in colour[:3]))


def ink(colour: Sequence[float]) -> str:
    """The text colour that reads on a background ``colour``: white on dark ones, else the
    page's ink."""
    r, g, b = colour[:3]
    return _LIGHT_INK if 0.299 * r + 0.587 * g + 0.114 * b < 140 else _DARK_INK


def gradient(stops: Sequence[RGB]) -> str:
    """A CSS ``linear-gradient`` through ``stops``, left to right (a colour bar)."""
    return "linear-gradient(to right," + ",".join(css(s) for s in stops) + ")"


def _js_stops(stops: Sequence[RGB]) -> str:
    return "[" + ",".join(f"[{r},{g},{b}]" for r, g, b in stops) + "]"


#: The colour scale for a page's script: a global ``ffbColour`` with the same stops and
#: functions (``ramp``, ``diverging``, ``sequential`` give ``[r, g, b]``; ``css`` and ``ink``
#: as here). Defining it twice (a fragment in a page) is harmless.
COLOUR_JS = """var ffbColour = (function () {
  "use strict";
  var DIVERGING = __DIVERGING__, SEQUENTIAL = __SEQUENTIAL__, MUTED = __MUTED__;
  function ramp(stops, t) {
    t = t === t ? Math.max(0, Math.min(1, t)) * (stops.length - 1) : 0;
    var k = Math.min(stops.length - 2, Math.floor(t)), f = t - k, a = stops[k], b = stops[k + 1];
    return [a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f];
  }
  function diverging(v, bound) { return ramp(DIVERGING, bound > 0 && v === v ? 0.5 + 0.5 * v / bound : 0.5); }
  function sequential(v, top) { return ramp(SEQUENTIAL, top > 0 && v === v ? v / top : 0); }
  function css(c) { return "rgb(" + Math.round(c[0]) + "," + Math.round(c[1]) + "," + Math.round(c[2]) + ")"; }
  function ink(c) { return 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] < 140 ? "__LIGHT__" : "__DARK__"; }
  return { DIVERGING: DIVERGING, SEQUENTIAL: SEQUENTIAL, MUTED: MUTED, ramp: ramp,
           diverging: diverging, sequential: sequential, css: css, ink: ink };
})();
""".replace("__DIVERGING__", _js_stops(DIVERGING)).replace("__SEQUENTIAL__", _js_stops(SEQUENTIAL)).replace(
    "__MUTED__", _js_stops(MUTED)).replace("__LIGHT__", _LIGHT_INK).replace("__DARK__", _DARK_INK)

#: The rules every page shares: type, colours, header, tables, figures, colour bars
#: (``<span class="bar diverging">``), tooltips (``class="tip"``), the footer.
STYLESHEET = """
:root { --ink:__DARK__; --muted:#656d76; --line:#d0d7de; --accent:#b8322e; --bg:#ffffff; --chip:#f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0; padding: 18px 22px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); background: var(--bg); }
header h1 { font-size: 18px; margin: 0 0 2px; }
h2 { font-size: 15px; margin: 1.3em 0 .4em; }
.meta, .note { color: var(--muted); font-size: 12.5px; margin: .35em 0; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .95em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 12px; }
th, td { border: 1px solid var(--line); padding: 2px 6px; text-align: right; }
th { background: var(--chip); }
td:first-child { text-align: left; }
img { max-width: 100%; }
figure { display: inline-block; margin: .3em; }
figcaption { font-size: 12px; color: var(--muted); }
.legend { display: flex; align-items: center; gap: .5em; font-size: 12px; color: var(--muted); margin: .2em 0 .5em; }
.bar { display: inline-block; width: 180px; height: 12px; border: 1px solid var(--line); }
.bar.diverging { background: __DIVERGING__; }
.bar.sequential { background: __SEQUENTIAL__; }
.scroll { overflow: auto; max-width: 100%; max-height: 85vh; }
.tip { position: fixed; display: none; pointer-events: none; z-index: 2; background: #fff; border: 1px solid #888; padding: 2px 6px; font-size: 12px; }
footer { margin-top: 14px; color: var(--muted); font-size: 12px; max-width: 900px; }
""".replace("__DARK__", _DARK_INK).replace("__DIVERGING__", gradient(DIVERGING)).replace(
    "__SEQUENTIAL__", gradient(SEQUENTIAL))


def escape(text: Any) -> str:
    """``str(text)`` made safe for HTML text and attribute values (``& < > " '``)."""
    return html.escape(str(text), quote=True)


def json_block(element_id: str, value: Any) -> str:
    """``value`` as a ``<script id=… type="application/json">`` block that a page's script
    reads with ``JSON.parse``; every ``<`` is escaped, so no text in it closes the element."""
    blob = json.dumps(value, ensure_ascii=False).replace("<", "\\u003c")
    return f'<script id="{escape(element_id)}" type="application/json">{blob}</script>'


def page(title: str, body: str, *, header: str = "", style: str = "",
         data: Mapping[str, Any] | None = None, script: str | Sequence[str] = "") -> str:
    r"""A whole, self-contained HTML document.

    Args:
        title (str): plain text: the ``<h1>`` and the tab's title (``title — captum_ffb``).
        body (str): HTML, after the header.
        header (str): HTML under the ``<h1>`` (a line of facts, the text explained).
        style (str): the page's own CSS rules, after :data:`STYLESHEET`.
        data (dict, optional): element id → a JSON-able value, each a :func:`json_block`.
        script (str or list[str]): JavaScript, in one ``<script>`` element at the end.

    Returns:
        str: the document.
    """
    scripts = [script] if isinstance(script, str) else list(script)
    code = "\n".join(s for s in scripts if s)
    blocks = "".join(json_block(k, v) + "\n" for k, v in (data or {}).items())
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)} — captum_ffb</title>\n<style>{STYLESHEET}{style}</style>\n</head>\n"
        f"<body>\n<header>\n<h1>{escape(title)}</h1>\n{header}</header>\n{body}\n{blocks}"
        + (f"<script>\n{code}</script>\n" if code else "")
        + "</body>\n</html>\n"
    )
