"""The decomposition in LIT, the Learning Interpretability Tool (``lit-nlp``).

:func:`build_app` makes a LIT application for one of our models, in which our methods sit
next to LIT's own (LIME, gradient norm, gradient ⋅ input, integrated gradients):

- **NormDecomposition** (a salience interpreter, "Salience Maps" module): the exact
  contribution of every token to the logit of the class chosen in LIT's "Class to explain"
  picker (the predicted class first); the contributions and the bias add up to the logit.
- **Layer maps** (a salience interpreter, same module, run on request): the token-to-token
  map ``‖F_i(x_j)‖`` of one layer at one scope (both picked in its settings), one row per
  output token ``i``, each row shown as token salience over the input tokens ``j``. LIT 1.3
  has no attention module any more, so the map is shown row by row; ``captum-ffb maps``
  writes the same map as a matrix (an offline HTML view).
- For causal LMs, a **NormDecomposition** method in LIT's "Sequence Salience" module: the
  contributions of the preceding tokens to the logits of the target tokens clicked there
  (the model's own continuation gives the predicted next token; a typed target, a chosen
  one), next to LIT's gradient methods.

:func:`lit_models` wraps a sequence classifier, a causal LM, or the bundled all-MiniLM-L6-v2
with its sentiment head (two classes, the head's logit ``z`` read as ``(−z, z)``);
:func:`lit_dataset` wraps texts (a file or the held-out Rotten Tomatoes snippets);
:func:`serve` runs the application on ``127.0.0.1``. ``captum-ffb lit`` does all three.

lit-nlp is an optional dependency (``pip install "captum_ffb[lit]"`` for what it imports, then
``pip install --no-deps lit-nlp==1.3.1``, whose ``numpy<2`` would break Ray): nothing of it is
loaded until one of these functions, or one of the LIT classes named in :data:`LIT_CLASSES`
(``from captum_ffb.integrations.lit import NormDecompositionSalience``), is used.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from captum_ffb.explained.models import LoadedModel

#: How to install what the integration needs.
INSTALL = "pip install 'captum_ffb[lit]' && pip install --no-deps lit-nlp==1.3.1"
#: The LIT classes of ``captum_ffb.integrations._lit_components``, importable from here.
LIT_CLASSES = (
    "ClassifierModel",
    "GenerationModel",
    "LayerMapsSalience",
    "NormDecompositionSalience",
    "SequenceSalienceModel",
    "TextDataset",
)
#: How many examples of a data source LIT shows by default.
DEFAULT_EXAMPLES = 200
#: The examples shown when no data is given.
DEFAULT_TEXTS = (
    "a charming and often affecting journey.",
    "the plot is a dull, lifeless mess and the acting is worse.",
    "it is not a bad film, just a forgettable one.",
    "an ambitious, sprawling and ultimately exhausting epic.",
    "The capital of France is",
)


def require_lit() -> None:
    """Raise a one-line ImportError naming :data:`INSTALL` when lit-nlp (or a package it
    imports) is missing."""
    try:
        importlib.import_module("lit_nlp.app")
    except ImportError as error:
        missing = getattr(error, "name", None) or "lit-nlp"
        raise ImportError(f"the LIT integration needs lit-nlp and what it imports ({missing} is "
                          f"missing): {INSTALL}") from error


def __getattr__(name: str) -> Any:
    if name in LIT_CLASSES:
        require_lit()
        return getattr(importlib.import_module("captum_ffb.integrations._lit_components"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def lit_models(loaded: LoadedModel, name: str | None = None) -> dict[str, Any]:
    r"""LIT models for ``loaded``: one for a sequence classifier or the bundled
    all-MiniLM-L6-v2 (with its sentiment head); for a causal LM, LIT's group of three
    (``name``, ``_name_salience``, ``_name_tokenizer``) that its "Sequence Salience" module
    reads.

    Args:
        loaded (LoadedModel): from :func:`captum_ffb.explained.models.load_model` (``task="auto"``).
        name (str, optional): the name LIT shows; the model's folder name by default.
    """
    require_lit()
    from captum_ffb.integrations import _lit_components as components

    return components.model_group(loaded, name or model_label(loaded))


def model_label(loaded: LoadedModel) -> str:
    """A short name for LIT's model picker: the last part of the model's name or folder."""
    return os.path.basename(os.path.normpath(str(loaded.name))) or "model"


def lit_dataset(loaded: LoadedModel, data: str | os.PathLike | None = None,
                limit: int | None = DEFAULT_EXAMPLES) -> Any:
    r"""The texts of ``data`` as a LIT dataset whose fields match :func:`lit_models`' inputs.

    Args:
        loaded (LoadedModel): the model the dataset is for (its labels, or prompts).
        data (str or PathLike, optional): ``"rotten_tomatoes"`` (the held-out snippets, with
                    their labels), or a ``.txt``, ``.jsonl``, ``.csv`` or ``.tsv`` file (see
                    ``captum_ffb.texts.text.read_texts()``); :data:`DEFAULT_TEXTS` by default.
        limit (int, optional): keep the first ``limit`` texts.
    """
    require_lit()
    from captum_ffb.integrations import _lit_components as components
    from captum_ffb.texts.corpus import read_texts

    if data is None:
        texts: list[str] = list(DEFAULT_TEXTS)
        labels: list[int | None] = [None] * len(texts)
    else:
        texts, labels = read_texts(data, n=limit)
    return components.TextDataset(loaded, texts, labels, description=str(data or "examples"))


def build_app(loaded: LoadedModel, data: str | os.PathLike | None = None,
              limit: int | None = DEFAULT_EXAMPLES, name: str | None = None) -> Any:
    r"""A LIT application (a WSGI app) with ``loaded``, the texts of ``data``, our
    interpreters and LIT's default ones, and a layout that opens on the salience views.

    Args:
        loaded (LoadedModel): from :func:`captum_ffb.explained.models.load_model` (``task="auto"``).
        data, limit: as for :func:`lit_dataset`.
        name (str, optional): the model's name in LIT.
    """
    require_lit()
    from captum_ffb.integrations import _lit_components as components

    return components.build_app(loaded, lit_models(loaded, name),
                                {"data": lit_dataset(loaded, data, limit)})


def serve(app: Any, host: str = "127.0.0.1", port: int = 5432, quiet: bool = False) -> None:
    r"""Serve ``app`` until Ctrl+C (a threaded werkzeug server, on ``host`` only).

    Args:
        app: from :func:`build_app`.
        host (str): the address to bind; this machine only by default.
        port (int): the port.
        quiet (bool): print nothing (by default the address, to stderr).
    """
    from werkzeug.serving import make_server

    server = make_server(host, port, app, threaded=True)
    # Ctrl+C stops at once: requests still being answered do not hold the process open
    # (socketserver's default joins every request thread on close)
    server.daemon_threads, server.block_on_close = True, False
    try:
        if not quiet:
            print(f"LIT is ready at http://{host}:{server.port} (Ctrl+C stops it)",
                  file=sys.stderr, flush=True)
        server.serve_forever()  # werkzeug's: it returns on Ctrl+C
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    if not quiet:
        print("LIT stopped", file=sys.stderr)

__all__ = [
    "DEFAULT_EXAMPLES",
    "DEFAULT_TEXTS",
    "INSTALL",
    "LIT_CLASSES",
    "build_app",
    "lit_dataset",
    "lit_models",
    "model_label",
    "require_lit",
    "serve",
]
