"""The pages' own files, kept as files in ``assets/`` (package data) and inlined into each page
when it is written (no CDN, no network), and the maps view's CSS and JavaScript among them,
after the shared stylesheet and colour scale of :mod:`captum_ffb.io.pages`.

``assets/`` holds the maps view's ``maps.js`` and ``maps.css`` and the attribution graph
viewer's ``graph.js``, ``graph.css`` and ``graph_body.html`` (:mod:`captum_ffb.viz._graph_page`).
They are plain text as an editor keeps them (UTF-8, ending in a line break) and are inlined as
they stand: a script or a style sheet after a line break of its own (:func:`inline`), a body
without its final line break (:func:`fragment`). ``tests/viz/test_assets_js.py`` parses every
script as JavaScript and lints it.
"""

from __future__ import annotations

import functools
from importlib import resources

#: The folder of the files, beside this module.
FOLDER = "assets"


@functools.cache
def asset(name: str) -> str:
    """The text of ``assets/<name>``, read once (UTF-8; any line end read as ``\\n``)."""
    return (resources.files(__package__) / FOLDER / name).read_text(encoding="utf-8")


def inline(name: str) -> str:
    """A script or a style sheet as a page inlines it: on a line of its own."""
    return "\n" + asset(name)


def fragment(name: str) -> str:
    """An HTML fragment as a page inlines it: without the file's final line break."""
    return asset(name).removesuffix("\n")


#: The maps view's own CSS.
CSS = inline("maps.css")

#: The maps view's script: ``window.ffbView`` is its interface (``state``, ``set``, ...).
JS = inline("maps.js")
