"""Figures, an offline interactive HTML view and exports of the maps.

- :func:`plot_maps`: paper-style matplotlib heatmaps, one panel per scope plus FF-amp.
- :func:`html_view`, :func:`save_html`, :func:`show_html`: a self-contained HTML page.
- :func:`to_bertviz`, :func:`bertviz_view`, :func:`to_inseq`, :func:`to_captum`: the maps in
  other XAI tools.
- :func:`to_visualization_records`: contributions as Captum ``visualize_text`` records.
- :func:`plot_contributions`, :func:`explanation_html`, :func:`save_explanation_html`: the views
  of an explanation (``captum-ffb explain``).
- :func:`plot_components`, :func:`components_html`: the tokens × components table of
  :meth:`~captum_ffb.attr.NormDecomposition.attribute_components`.
- :func:`graph_html`, :func:`save_graph_html`: an attribution graph as an offline page.
- :func:`neuronpedia_graph`, :func:`save_neuronpedia_graph`, :func:`read_neuronpedia_state`,
  :func:`cumulative_influence`: the graph as Neuronpedia's graph file, and the pins and
  supernodes such a file carries back.
- :func:`plot_context`, :func:`context_html`, :func:`save_context_html`: a long context's
  groups by contribution (:func:`~captum_ffb.long_context.attribution.context_attribution`).
"""

from captum_ffb.viz._common import ff_pair_of  # noqa: F401 (for the CLI; not in __all__)
from captum_ffb.viz.components import components_html, plot_components
from captum_ffb.viz.context import context_html, plot_context, save_context_html
from captum_ffb.viz.explanation import explanation_html, plot_contributions, save_explanation_html
from captum_ffb.viz.export import bertviz_view, to_bertviz, to_captum, to_inseq
from captum_ffb.viz.figures import plot_maps
from captum_ffb.viz.graph import graph_html, save_graph_html
from captum_ffb.viz.html import html_view, save_html, show_html
from captum_ffb.viz.neuronpedia import (
    NeuronpediaState,
    cumulative_influence,
    neuronpedia_graph,
    read_neuronpedia_state,
    save_neuronpedia_graph,
)
from captum_ffb.viz.records import to_visualization_records

__all__ = [
    "NeuronpediaState",
    "bertviz_view",
    "components_html",
    "context_html",
    "cumulative_influence",
    "explanation_html",
    "graph_html",
    "html_view",
    "neuronpedia_graph",
    "plot_components",
    "plot_context",
    "plot_contributions",
    "plot_maps",
    "read_neuronpedia_state",
    "save_context_html",
    "save_explanation_html",
    "save_graph_html",
    "save_html",
    "save_neuronpedia_graph",
    "show_html",
    "to_bertviz",
    "to_captum",
    "to_inseq",
    "to_visualization_records",
]
