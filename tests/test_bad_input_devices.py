"""The bad-input table of devices and input values (issue 54): a model on the meta device and
NaN or inf in the input embeddings are refused in one line, never read as a traceback, a
server holding no weights, a graph "with a cycle" or an answer of NaN.

Two tables, as in ``tests/test_bad_input.py``: the command line (exit code 2, exactly one
line on stderr, nothing on stdout; refused before any model loads or any server starts) and
the Python API (the exception type and a regular expression its message matches).
"""

from __future__ import annotations

import re

import pytest
import torch

import captum_ffb.explained.models
from captum_ffb import Direction, LayerNormDecomposition, NormDecomposition
from tests.models import TINY_SEQ2SEQ, save_tiny, save_tiny_lm, tiny_lm, tiny_models

TINY = {model.name: model for model in tiny_models()}
META = "--device meta holds no weights (it is for building a model without loading it): give cpu, cuda or another device"


# --------------------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The saved tiny models and the corpus the command lines read."""
    root = tmp_path_factory.mktemp("bad-devices")
    (root / "corpus.txt").write_text("the cat sat\na dog ran\n")
    return {"r": root, "llama": save_tiny_lm(root / "llama"), "bert": save_tiny("bert", root / "bert")}


@pytest.fixture()
def nothing_loads(monkeypatch):
    """Reading a model, loading one or starting a server fails the test: the refusal comes first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was read or a server started before the device was checked")

    from captum_ffb.integrations import gradio_app
    from captum_ffb.integrations import lit as ffb_lit

    monkeypatch.setattr(captum_ffb.explained.models, "model_config", refuse)
    monkeypatch.setattr(captum_ffb.explained.models, "load_model", refuse)
    monkeypatch.setattr(gradio_app, "launch", refuse)
    monkeypatch.setattr(ffb_lit, "serve", refuse, raising=False)


#: (case, command line; every sub-command that takes --device)
CLI_CASES = [
    ("maps", ["maps", "the cat", "--model", "{bert}", "--out", "{out}"]),
    ("compare", ["compare", "the cat", "--model", "{bert}", "--out", "{out}"]),
    ("analyze", ["analyze", "--model", "{bert}", "--data", "{r}/corpus.txt", "--out", "{out}"]),
    ("explain (one text)", ["explain", "the cat", "--model", "{llama}", "--out", "{out}"]),
    ("explain (corpus)", ["explain", "--data", "{r}/corpus.txt", "--model", "{llama}", "--out", "{out}"]),
    ("explain (context)", ["explain", "--context", "{r}/corpus.txt", "--question", "Why?", "--model", "{llama}",
                           "--out", "{out}"]),
    ("graph", ["graph", "the cat", "--model", "{llama}", "--out", "{out}"]),
    ("evaluate", ["evaluate", "--task", "sentiment", "--model", "{bert}", "--data", "{r}/corpus.txt",
                  "--out", "{out}"]),
    ("app (no server starts)", ["app", "--model", "{llama}", "--port", "0"]),
    ("lit (no server starts)", ["lit", "--model", "{llama}", "--port", "0"]),
]


@pytest.mark.parametrize("case, template", CLI_CASES, ids=[case for case, _ in CLI_CASES])
def test_device_meta_is_one_line(case, template, files, tmp_path, one_line, nothing_loads):
    if case.startswith("app"):
        pytest.importorskip("gradio")
    if case.startswith("lit"):
        pytest.importorskip("lit_nlp")
    names = {key: str(value) for key, value in files.items()} | {"out": str(tmp_path / "out")}
    argv = [part.format(**names) for part in template] + ["--device", "meta"]
    assert one_line(argv) == META


# --------------------------------------------------------------------------- the API
def _with_rows(value: float, tokens: list[int]) -> torch.nn.Module:
    """The tiny Llama whose token-embedding rows ``tokens`` hold ``value``."""
    model = tiny_lm("llama")
    with torch.no_grad():
        model.model.embed_tokens.weight[tokens] = value
    return model


@pytest.fixture(scope="module")
def api():
    nan, inf = _with_rows(float("nan"), [6, 8]), _with_rows(float("inf"), [7])
    base = TINY["bert"].build()
    with torch.no_grad():
        base.embeddings.position_embeddings.weight[2] = float("nan")
    marian = TINY_SEQ2SEQ["marian"].build()
    with torch.no_grad():
        marian.get_input_embeddings().weight[6] = float("nan")
    return {"nan": nan, "nd_nan": NormDecomposition(nan), "nd_inf": NormDecomposition(inf),
            "nd_base": NormDecomposition(base), "nd_marian": NormDecomposition(marian),
            "lnd_first": LayerNormDecomposition(nan, nan.model.layers[0]),
            "lnd_second": LayerNormDecomposition(nan, nan.model.layers[1])}


IDS = torch.tensor([[5, 6, 7, 8, 9]])
PAIR = torch.tensor([[5, 9, 5, 9, 5], [5, 9, 7, 9, 5]])
NAN_ROWS = r"the input embeddings hold NaN or inf \(at positions 1, 3\): " \
           r"the model's embedding rows for these tokens \(ids 6, 8\) are not finite"
INF_ROW = r"the input embeddings hold NaN or inf \(at position 2\): " \
          r"the model's embedding rows for this token \(id 7\) are not finite"


def _meta_layer() -> LayerNormDecomposition:
    """Layer maps of the first block of a tiny Llama moved to the meta device."""
    meta = tiny_lm("llama").to("meta")
    return LayerNormDecomposition(meta, meta.model.layers[0])


def _embeddings_with_nan() -> torch.Tensor:
    x = torch.randn(1, 5, 32)
    x[0, 2, 4] = float("nan")
    return x


#: (case, call, the exception type, a regular expression the message matches in full)
API_CASES = [
    ("a layer of a model on the meta device", lambda a: _meta_layer(),
     ValueError, r"LlamaForCausalLM's weights are on the meta device \(not loaded\): load them "
                 r"\(from_pretrained without device_map='meta'\), then explain"),
    ("NaN rows (attribute)", lambda a: a["nd_nan"].attribute(IDS, target=3), ValueError, NAN_ROWS),
    ("NaN rows (attribute, forward route)", lambda a: a["nd_nan"].attribute(IDS, target=3, route="forward"),
     ValueError, NAN_ROWS),
    ("NaN rows (attribute of the prediction)", lambda a: a["nd_nan"].attribute(IDS), ValueError, NAN_ROWS),
    ("NaN rows (attribute_components)", lambda a: a["nd_nan"].attribute_components(IDS, target=3),
     ValueError, NAN_ROWS),
    ("NaN rows (attribute_components, backward route)",
     lambda a: a["nd_nan"].attribute_components(IDS, target=3, route="backward"), ValueError, NAN_ROWS),
    ("NaN rows (attribute_components, forward route)",
     lambda a: a["nd_nan"].attribute_components(IDS, target=3, route="forward"), ValueError, NAN_ROWS),
    ("NaN rows (attribute_graph: no cycle claimed)", lambda a: a["nd_nan"].attribute_graph(IDS, target=3),
     ValueError, NAN_ROWS),
    ("an inf row (attribute)", lambda a: a["nd_inf"].attribute(IDS, target=3), ValueError, INF_ROW),
    ("an inf row (attribute_components)", lambda a: a["nd_inf"].attribute_components(IDS, target=3),
     ValueError, INF_ROW),
    ("an inf row (attribute_graph)", lambda a: a["nd_inf"].attribute_graph(IDS, target=3), ValueError, INF_ROW),
    ("an inf row in the second row of a batch", lambda a: a["nd_inf"].attribute(PAIR, target=3),
     ValueError, r"the input embeddings hold NaN or inf \(at row 1, position 2\): "
                 r"the model's embedding rows for this token \(id 7\) are not finite"),
    ("NaN position embeddings (finite token rows)",
     lambda a: a["nd_base"].attribute(IDS, target=Direction(torch.ones(32))),
     ValueError, r"the input embeddings hold NaN or inf \(at position 2\): the model's embedding rows for "
                 r"these tokens are finite: what it adds to them \(position or type embeddings, a norm\) is not"),
    ("NaN rows in an encoder–decoder's source",
     lambda a: a["nd_marian"].attribute(IDS[:, :4], target=3,
                                        forward_kwargs={"decoder_input_ids": torch.tensor([[0, 5, 7]])}),
     ValueError, r"the source's input embeddings hold NaN or inf \(at position 1\): "
                 r"the model's embedding rows for this token \(id 6\) are not finite"),
    ("NaN rows (layer maps of the first block)", lambda a: a["lnd_first"].attribute(IDS), ValueError, NAN_ROWS),
    ("NaN rows (layer maps of a later block)", lambda a: a["lnd_second"].attribute(IDS),
     ValueError, r"the input of layer 1 holds NaN or inf \(at positions 0, 1, 2, 3, 4\): "
                 r"the model's embedding rows for the tokens 6, 8 are not finite"),
    ("NaN in embeddings given to the layer maps", lambda a: a["lnd_first"].attribute(_embeddings_with_nan()),
     ValueError, r"the input embeddings hold NaN or inf \(at position 2\): the embeddings given are not finite there"),
]


@pytest.mark.parametrize("case, call, error, message", API_CASES, ids=[case for case, *_ in API_CASES])
def test_api_refuses_in_one_line(case, call, error, message, api):
    with pytest.raises(error) as raised:
        call(api)
    text = str(raised.value)
    assert "\n" not in text and re.fullmatch(message, text), text


def test_finite_inputs_are_answered(api):
    """The check refuses nothing else: a text whose tokens have finite rows is explained."""
    contributions = api["nd_nan"].attribute(torch.tensor([[5, 7, 9]]), target=3)
    assert torch.isfinite(contributions).all()
