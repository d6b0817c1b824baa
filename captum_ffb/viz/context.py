r"""Views of a :class:`~captum_ffb.context.ContextAttribution`: a bar figure of the groups by
contribution and an offline page of the context with every group shaded by its contribution."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from captum_ffb.context import ContextAttribution
from captum_ffb.outputs import write_text
from captum_ffb.pages import escape, page
from captum_ffb.viz._common import cpu_view
from captum_ffb.viz.figures import _figure_class, _require_matplotlib

__all__ = ["context_html", "plot_context", "save_context_html"]


def _check(found: Any) -> ContextAttribution:
    if not isinstance(found, ContextAttribution):
        raise TypeError(f"expected a ContextAttribution (from captum_ffb.context_attribution), got "
                        f"{type(found).__name__}")
    return found


def _label(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


@cpu_view
def plot_context(found: ContextAttribution, top: int = 20, cmap: str = "RdBu_r") -> Any:
    """The ``top`` groups of largest ``|contribution|``, largest first, as horizontal bars
    (red raises the output, blue lowers it), with the question, the rest and the bias
    below a rule.

    Returns:
        matplotlib.figure.Figure
    """
    found = _check(found)
    _require_matplotlib()
    from matplotlib import colormaps

    chosen = found.top(top)
    rows = [(f"#{g} {_label(text, 48)}", value) for g, text, value in chosen]
    rows += [("question", found.question), ("rest of the prompt", found.rest), ("bias", found.bias)]
    figure = _figure_class()(figsize=(9, 0.32 * len(rows) + 1.4))
    ax = figure.add_subplot()
    scale = max((abs(v) for _, v in rows), default=1.0) or 1.0
    colours = colormaps[cmap]
    positions = list(range(len(rows)))[::-1]
    ax.barh(positions, [v for _, v in rows], color=[colours(0.5 + 0.5 * v / scale) for _, v in rows],
            edgecolor="#555", linewidth=0.5)
    ax.set_yticks(positions, [label for label, _ in rows], fontsize=8)
    ax.axhline(2.5, color="#999", lw=0.8)
    ax.axvline(0, color="#333", lw=0.8)
    ax.set_xlabel("contribution to the explained logit")
    ax.set_title(f"{found.target}: value {found.value:.3f}\n= Σ {len(found.groups)} groups "
                 f"{float(found.contributions.sum()):.3f} + question {found.question:.3f} + rest "
                 f"{found.rest:.3f} + bias {found.bias:.3f}", fontsize=9)
    figure.tight_layout()
    return figure


@cpu_view
def context_html(found: ContextAttribution, title: str | None = None) -> str:
    """An offline page: the context with each group shaded by its contribution (red raises
    the output, blue lowers it, on the scale of the largest group), its value on hover, and
    the table of groups by contribution."""
    found = _check(found)
    scale = float(found.contributions.abs().max()) or 1.0
    spans, done = [], 0
    for g, ((start, end), value) in enumerate(zip(found.spans, found.contributions.tolist())):
        strength = min(1.0, abs(value) / scale)
        colour = f"rgba(214, 39, 40, {strength:.3f})" if value > 0 else f"rgba(31, 119, 180, {strength:.3f})"
        spans.append(escape(found.context[done:start]))
        spans.append(f'<span class="group" style="background:{colour}" title="#{g}: {value:+.4f}">'
                     f"{escape(found.context[start:end])}</span>")
        done = end
    spans.append(escape(found.context[done:]))
    rows = "".join(f"<tr><td>{g}</td><td>{value:+.4f}</td><td>{escape(_label(text, 120))}</td></tr>"
                   for g, text, value in found.top(len(found.groups)))
    header = (f'<p class="meta">{escape(found.target)}: value {found.value:.4f} = Σ groups '
              f"{float(found.contributions.sum()):.4f} + question {found.question:.4f} + rest {found.rest:.4f} "
              f"+ bias {found.bias:.4f} (delta {found.delta:.1e}); {len(found.groups)} groups</p>\n")
    body = (f'<section class="context">{"".join(spans)}</section>\n'
            "<h2>Groups by contribution</h2>\n<table><tr><th>#</th><th>contribution</th><th>text</th></tr>"
            f"{rows}</table>")
    style = (".context { white-space: pre-wrap; line-height: 1.7; max-width: 60em; }\n"
             ".group { border-radius: 3px; padding: 1px 2px; }\n"
             "table { border-collapse: collapse; } td, th { padding: 2px 8px; border-bottom: 1px solid #ddd; "
             "text-align: left; }\n")
    return page(title or "Which parts of the context drove the answer", body, header=header, style=style)


def save_context_html(found: ContextAttribution, path: str | os.PathLike, title: str | None = None) -> Path:
    """Write :func:`context_html` to ``path``; returns the path."""
    return write_text(path, context_html(found, title))
