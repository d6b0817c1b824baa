r"""Views of an :class:`~captum_ffb.graph.record.AttributionGraph`: an offline HTML page and the
JSON that circuit-tracer's frontend and Neuronpedia's graph viewer read.

The page (:func:`graph_html`) draws the kept graph as SVG, fitted to the window beside a fixed
details panel: the tokens along the bottom (every label visible), a row per block and writer
above them (attention, cross-attention, then FF; only rows with a kept node), a column per
position holding a kept writer (the others collapsed to thin columns, widened on a click),
the heads or neurons of one block at one position side by side, each labelled (``L23.H4``,
``L23.A``, ``FF29``, ``L23.N7``, ``L3.X``), the output on top at the explained position and
the bias at the left. A node's area grows with ``|value|`` (or ``|patch estimate|``, a
toggle); nodes and edges are red where positive and blue where negative (the package's one
colour scale), edges thicker where larger. Hovering shows a node's card, clicking lists its
in- and out-edges and, for a head, the writer pairs that made its score at the positions it
attends most (:meth:`~captum_ffb.graph.record.AttributionGraph.query_key_pairs`); shift-click pins,
and the pinned nodes can be shown alone or grouped into a named supernode whose edges are
its members' summed. Sliders re-prune the nodes (by influence) and edges (by ``|weight|``) in
the page; a search box finds nodes by id or token; wheel, drag and buttons zoom, pan and fit.
Everything is inline: the page requests nothing.

:func:`neuronpedia_graph` and :func:`save_neuronpedia_graph` (the graph as Neuronpedia's
viewer reads it) live in :mod:`captum_ffb.viz.neuronpedia`; they are imported here too.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from captum_ffb.io.files import write_text
from captum_ffb.viz._common import COLOUR_JS, cpu_view, display_token, display_tokens, escape, page
from captum_ffb.viz._graph_page import BODY, SCRIPT, STYLE
from captum_ffb.viz.neuronpedia import (  # noqa: F401  (their names before 0.5)
    FEATURE_TYPES,
    neuronpedia_graph,
    query_key_of,
    save_neuronpedia_graph,
)

__all__ = ["graph_html", "neuronpedia_graph", "save_graph_html", "save_neuronpedia_graph"]

@cpu_view
def graph_html(graph: Any, title: str | None = None, query_key: dict[str, Any] | None = None) -> str:
    r"""The kept graph as one self-contained HTML page.

    Args:
        graph (AttributionGraph): the graph (pruned or not).
        title (str, optional): the page's title (default: what is explained).
        query_key (dict, optional): head node id → its query–key pairs
                    (:meth:`~captum_ffb.graph.record.AttributionGraph.query_key_pairs`; computed
                    here for the largest heads when ``None`` and the graph can split scores).

    Returns:
        str: the document.
    """
    data = graph.to_dict()
    if query_key is None:
        query_key = query_key_of(graph)
    data["query_key"] = query_key
    data["labels"] = display_tokens(graph.tokens)  # the tokens as people read them
    data["output_text"] = shown = display_token(graph.output_label)
    explained = f"“{shown}”"
    if graph.probability is not None:
        p = graph.probability  # three decimals, or three digits where that would read 0.000
        explained += f" (p = {p:.3f})" if p >= 0.0005 or p == 0 else f" (p = {p:.2e})"
    aside = ""
    if graph.excluded_positions:  # ints in a well-formed graph; a file may carry anything
        aside = f" · set aside: the writers at position {escape(', '.join(map(str, graph.excluded_positions)))}"
    header = (f'<p class="meta">explains {escape(explained)} · value {escape(f"{graph.value:.4g}")} · '
              f'{escape(graph.granularity)} granularity · {int(graph.node_mask.sum())} of {len(graph.data)} nodes, '
              f'{int(graph.edge_mask.sum())} of {len(graph.data.weights)} edges kept, holding '
              f'{escape(_share(graph.kept_share))} of the output ({escape(_share(graph.kept_abs_share))} of its edges\' |weight|)'
              f'{aside}</p>')
    return page(title or f"Attribution graph of “{shown}”", BODY, header=header, style=STYLE,
                data={"ffb-graph-data": data}, script=[COLOUR_JS, SCRIPT])


def _share(share: float) -> str:
    """A kept share as a percentage ("–" where it is not a number: the explained value is 0)."""
    return f"{share:.1%}" if math.isfinite(share) else "–"


def save_graph_html(graph: Any, path: str | os.PathLike, **kwargs: Any) -> Path:
    """Write :func:`graph_html` to ``path`` and return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_text(target, graph_html(graph, **kwargs))
