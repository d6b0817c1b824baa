import base64
import dataclasses
import json
import re

import numpy as np
import pytest
import torch

from captum_ffb.viz import html_view, save_html, show_html


def _payload(page: str) -> dict:
    blob = re.search(r'<script id="ffb-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(blob.group(1))


def test_page_is_self_contained(bert_maps):
    page = html_view(bert_maps)
    assert page.startswith("<!DOCTYPE html>")
    assert "<canvas" in page and "ffbView" in page
    # offline: nothing is fetched from anywhere
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "import(" not in page


def test_payload_holds_the_exact_maps_and_residuals(bert_maps):
    data = _payload(html_view(bert_maps))
    assert data["tokens"] == bert_maps.tokens
    assert data["scopes"] == list(bert_maps.scopes)
    assert data["ff_pair"] == ["Atb", "AtbFf"]
    assert data["layers"] == bert_maps.layers
    n = len(bert_maps.tokens)
    for layer in bert_maps.layers:
        for scope in bert_maps.scopes:
            raw = np.frombuffer(base64.b64decode(data["maps"][str(layer)][scope]), dtype="<f4")
            assert torch.equal(torch.from_numpy(raw.copy()).reshape(n, n), bert_maps.maps[layer][scope])
            assert data["delta"][str(layer)][scope] == bert_maps.delta[layer][scope]
    assert "FF(Atb)" in data["help"]["AtbFf"]


def test_tokens_cannot_break_out_of_the_script(bert_maps):
    evil = dataclasses.replace(bert_maps, tokens=["</script><script>alert(1)</script>"] + bert_maps.tokens[1:])
    page = html_view(evil)
    assert page.count("</script>") == 2  # the JSON block and the code block, nothing else
    assert _payload(page)["tokens"][0] == evil.tokens[0]


def test_pre_ln_page_and_initial_state(gpt2_maps):
    data = _payload(html_view(gpt2_maps, layer=1, scope="FF-amp", title="GPT-2"))
    assert data["ff_pair"] == ["AtbLn", "AtbLnFf"]
    assert data["initial_layer"] == 1 and data["initial_scope"] == "FF-amp"
    assert data["chain"] == "pre_ln"


def test_without_the_ff_pair_there_is_no_ff_amp(bert_maps):
    partial = dataclasses.replace(bert_maps, scopes=("AtbFfRes", "AtbFfResLn"))
    data = _payload(html_view(partial))
    assert data["ff_pair"] is None and "FF-amp" not in data["help"]
    with pytest.raises(ValueError, match="unknown scope 'FF-amp'"):
        html_view(partial, scope="FF-amp")


def test_bad_arguments(bert_maps):
    with pytest.raises(ValueError, match="layer 4 was not computed"):
        html_view(bert_maps, layer=4)
    with pytest.raises(TypeError, match="expected TextMaps"):
        html_view({"Atb": bert_maps.maps[0]["Atb"]})


def test_save_and_notebook_display(bert_maps, tmp_path):
    path = save_html(bert_maps, tmp_path / "deep" / "view.html", title="Demo")
    page = path.read_text(encoding="utf-8")
    assert "<h1>Demo</h1>" in page
    shown = show_html(bert_maps, height=500)
    assert shown.data.startswith("<div><iframe srcdoc=") and "height:500px" in shown.data
    assert "&lt;canvas" in shown.data  # the page is escaped into the attribute


@pytest.mark.parametrize("probability, shown", [(0.7021, "p = 0.702"), (4.1e-8, "p = 4.10e-08"), (0.0, "p = 0.000")])
def test_the_graph_header_shows_a_small_probability_in_digits(probability, shown):
    """An answer's probability of 4e-8 read "p = 0.000" in the header: three decimals, or three
    digits where those would read 0."""
    import dataclasses

    from captum_ffb import NormDecomposition
    from captum_ffb.viz.graph import graph_html
    from tests.models import tiny_task_model, token_ids

    graph = NormDecomposition(tiny_task_model("llama", "causal_lm")).attribute_graph(token_ids(1, 5), 3)
    page = graph_html(dataclasses.replace(graph, probability=probability), query_key={})
    assert f"({shown})" in page
