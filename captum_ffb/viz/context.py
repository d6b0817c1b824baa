r"""Views of a :class:`~captum_ffb.long_context.attribution.ContextAttribution`: a bar figure of the groups by
contribution and an offline page with the groups ranked, then the context with every group
numbered and shaded by its contribution (its text in black or white, whichever reads)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from captum_ffb.io.files import write_text
from captum_ffb.io.pages import css, diverging, escape, page
from captum_ffb.long_context.attribution import ContextAttribution
from captum_ffb.viz._common import cpu_view
from captum_ffb.viz.figures import figure_class, require_matplotlib

__all__ = ["context_html", "plot_context", "save_context_html"]


def _check(found: Any) -> ContextAttribution:
    if not isinstance(found, ContextAttribution):
        raise TypeError(f"expected a ContextAttribution (from captum_ffb.context_attribution), got "
                        f"{type(found).__name__}")
    return found


def _label(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


#: The bar chart's axis by ``ContextAttribution.method``.
_AXIS = {"decomposition": "contribution to the explained value",
         "presence": "presence attribution (the value's change when the group is removed, summed to the value)",
         "fitted": "fitted weight (the value's change when the group is removed, by a fit on ablations)"}


@cpu_view
def plot_context(found: ContextAttribution, top: int = 20, cmap: str = "RdBu_r") -> Any:
    """The ``top`` groups of largest ``|contribution|``, largest first, as horizontal bars
    (red raises the output, blue lowers it), with the question, the rest and the bias
    below a rule.

    Returns:
        matplotlib.figure.Figure
    """
    found = _check(found)
    require_matplotlib()
    from matplotlib import colormaps

    chosen = found.top(top)
    rows = [(f"#{g} {_label(text, 48)}", value) for g, text, value in chosen]
    rows += found.terms()
    figure = figure_class()(figsize=(9, 0.32 * len(rows) + 1.4))
    ax = figure.add_subplot()
    scale = max((abs(v) for _, v in rows), default=1.0) or 1.0
    colours = colormaps[cmap]
    positions = list(range(len(rows)))[::-1]
    ax.barh(positions, [v for _, v in rows], color=[colours(0.5 + 0.5 * v / scale) for _, v in rows],
            edgecolor="#555", linewidth=0.5)
    ax.set_yticks(positions, [label for label, _ in rows], fontsize=8)
    ax.axhline(len(rows) - len(chosen) - 0.5, color="#999", lw=0.8)
    ax.axvline(0, color="#333", lw=0.8)
    ax.set_xlabel(_AXIS.get(found.method, _AXIS["decomposition"]))
    ax.set_title(f"{found.target}: " + found.equation(3).replace(" = ", "\n= ", 1), fontsize=9)
    figure.tight_layout()
    return figure


def _relative_luminance(colour: tuple[int, int, int]) -> float:
    """WCAG 2's relative luminance of an sRGB colour."""
    def linear(c: int) -> float:
        c = c / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in colour)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _contrast_ratio(first: tuple[int, int, int], second: tuple[int, int, int]) -> float:
    """WCAG 2's contrast ratio of two sRGB colours (1 to 21; 4.5 is AA for body text)."""
    low, high = sorted((_relative_luminance(first), _relative_luminance(second)))
    return (high + 0.05) / (low + 0.05)


#: The text colours a shaded group is written in (black or white, whichever contrasts more:
#: at least 4.5 on every colour of the diverging scale).
BLACK, WHITE = (0, 0, 0), (255, 255, 255)


def _text_colour(background: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black or white, whichever has the larger contrast ratio with ``background``."""
    return BLACK if _contrast_ratio(background, BLACK) >= _contrast_ratio(background, WHITE) else WHITE


@cpu_view
def context_html(found: ContextAttribution, title: str | None = None) -> str:
    """An offline page: the groups ranked by ``|contribution|`` at the top (each numbered as in
    ``context.csv``, with its contribution, its share of the value and its text, linked to its
    place), then the context with each group shaded by its contribution on the package's
    diverging scale (red raises the output, blue lowers it, the largest group full), its number
    in front and its value on hover; each group's text in black or white, whichever reads
    better on its shade (WCAG contrast at least 4.5)."""
    found = _check(found)
    scale = float(found.contributions.abs().max()) or 1.0
    shares = found.shares().tolist()
    spans, done = [], 0
    for g, ((start, end), value) in enumerate(zip(found.spans, found.contributions.tolist())):
        shade = diverging(value, scale)
        spans.append(escape(found.context[done:start]))
        spans.append(f'<span class="group" id="group-{g}" style="background:{css(shade)};color:{css(_text_colour(shade))}"'
                     f' title="#{g}: {escape(f"{value:+.4f}")}"><span class="number">#{g}</span> '
                     f"{escape(found.context[start:end])}</span>")
        done = end
    spans.append(escape(found.context[done:]))
    rows = []
    for rank, (g, text, value) in enumerate(found.top(len(found.groups)), start=1):
        shade = diverging(value, scale)
        share = f"{shares[g]:.1%}" if shares[g] == shares[g] else "–"
        rows.append(f'<tr><td>{rank}</td><td><a href="#group-{g}">#{g}</a></td>'
                    f'<td style="background:{css(shade)};color:{css(_text_colour(shade))}">{escape(f"{value:+.4f}")}</td>'
                    f"<td>{escape(share)}</td><td>{escape(_label(text, 120))}</td></tr>")
    facts = f"{found.target}: {found.equation()}"
    header = f'<p class="meta">{escape(facts)}</p>\n'
    body = ("<h2>Groups ranked by |contribution|</h2>\n"
            '<table class="ranked"><tr><th>rank</th><th>group</th><th>contribution</th><th>share</th>'
            f'<th>text</th></tr>{"".join(rows)}</table>\n'
            '<h2>The context, each group shaded by its contribution</h2>\n'
            '<div class="legend">lowers the output <span class="bar diverging"></span> raises it</div>\n'
            f'<section class="context">{"".join(spans)}</section>')
    style = (".context { white-space: pre-wrap; line-height: 1.9; max-width: 60em; }\n"
             ".group { border-radius: 3px; padding: 1px 2px; }\n"
             ".group .number { font-size: 10px; font-weight: 600; opacity: .8; }\n"
             ".ranked td:last-child { text-align: left; max-width: 50em; }\n")
    return page(title or "Which parts of the context drove the answer", body, header=header, style=style)


def save_context_html(found: ContextAttribution, path: str | os.PathLike, title: str | None = None) -> Path:
    """Write :func:`context_html` to ``path``; returns the path."""
    return write_text(path, context_html(found, title))
