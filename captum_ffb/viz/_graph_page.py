r"""The attribution graph viewer's page: its layout (HTML), its style and its script, kept apart
from :mod:`captum_ffb.viz.graph` because the script is long, as files of the package
(``assets/graph_body.html``, ``assets/graph.css``, ``assets/graph.js``; see
:mod:`captum_ffb.viz._assets`) inlined into the one offline page. Plain ES2015, no build step, no
request of any kind: the SVG namespace is read from the ``<svg>`` element itself, the fonts are
the system's.

How the page lays the graph out (``layout`` in the script): a row per (block, writer) that holds
a shown node (attention or its heads, cross-attention, FF or its neurons), blocks upwards; a
column per position that holds a shown writer, the other positions collapsed into thin columns
(their token written upright; a click widens them); the nodes of one row in one column side by
side, each with its label on its right, wrapping into lines when the column is narrow; the
tokens along the bottom, the output on top at the explained position, the bias at the far left.
Column widths and row heights are computed from the space the page has, so the whole graph
fits on load; zoom and pan change the ``viewBox`` only.

Node ids are opaque here: labels and places come from ``kind``, ``layer``, ``head``,
``position`` and ``token``.
"""

from __future__ import annotations

from captum_ffb.viz._assets import fragment, inline

#: The page's own CSS, after the shared stylesheet: the header, a tool bar, the graph's stage
#: filling what is left of the window beside a fixed details panel.
STYLE = inline("graph.css")

#: The page's body: the tool bar, the stage with its SVG, the details panel, the hover card.
BODY = fragment("graph_body.html")

#: The script: ``window.ffbGraph`` is its interface (``choose``, ``pin``, ``group``, ...).
SCRIPT = inline("graph.js")
