"""The Gradio app's views without a browser: its tables hold explain_text's numbers, every
task gets its tabs, no analytics, and a clear message without gradio."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from captum_ffb.explain import explain_text
from captum_ffb.explained.models import LoadedModel
from tests.models import (
    causal_tokenizer,
    tiny_lm,
    tiny_loaded,
    tiny_task_model,
    wordpiece_tokenizer,
)

gradio = pytest.importorskip("gradio", reason="the Gradio app needs gradio: pip install 'captum_ffb[app]'")

from captum_ffb.integrations import gradio_app  # noqa: E402

TEXT = "the cat sat on the mat because"


@pytest.fixture(scope="module")
def lm() -> LoadedModel:
    return LoadedModel(tiny_lm(), causal_tokenizer(), "tiny-lm", causal_lm=True, task="causal_lm")


@pytest.fixture(scope="module")
def classifier() -> LoadedModel:
    model = tiny_task_model("bert", "sequence_classification", num_labels=3)
    return LoadedModel(model, wordpiece_tokenizer(), "tiny-classifier", task="sequence_classification")


def _session_explain(loaded, **inputs):
    session = gradio_app.AppEvents(loaded)
    request = {"target": "", "class_index": -1, "generate": 0, **inputs}
    scopes = list(gradio_app.scopes_of(loaded))
    return session.explain(TEXT, request["target"], request["class_index"], request["generate"],
                           len(loaded.blocks) - 1, scopes, True, "raw norms")


def test_the_table_holds_explain_texts_contributions_and_generation_steps(lm):
    explanation = explain_text(TEXT, lm, generate=3)
    table = gradio_app.contributions_table(explanation)
    assert list(table["token"]) == explanation.labels and list(table["position"]) == list(range(len(explanation.labels)))
    headers = list(table.columns[2:])
    assert headers == [f'step {t + 1}: "{label}"' for t, label in enumerate(explanation.target_labels)]
    n = explanation.prompt_length
    for t, header in enumerate(headers):
        column = table[header].tolist()
        seen = n + t  # step t reads position n - 1 + t and sees the tokens up to it
        assert all(v is None or v != v for v in column[seen:])  # blank (None or NaN) after
        torch.testing.assert_close(torch.tensor(column[:seen], dtype=torch.float64),
                                   explanation.contributions[t, :seen].double(), atol=1e-6, rtol=0)


def test_a_causal_lm_explains_the_token_asked_for(lm):
    summary, figure, table, page, maps, image, view = _session_explain(lm, target="mat")
    expected = explain_text(TEXT, lm, target="mat")
    assert list(table.columns) == ["position", "token", '"mat"']
    torch.testing.assert_close(torch.tensor(table['"mat"'].tolist(), dtype=torch.float64),
                               expected.contributions[0].double(), atol=1e-6, rtol=0)
    assert "the next token 'mat'" in summary and f"{float(expected.values[0]):.4f}" in summary
    share = float(expected.contributions[0].sum() / expected.values[0])
    assert "| token share |" in summary and f"| {share:.0%} |" in summary
    assert figure.size[0] > 200 and image.size[0] > 200
    assert maps.layers == list(range(len(lm.blocks))) and maps.text == TEXT
    for frame in (page, view):  # whole pages in isolated frames
        assert frame.startswith("<div><iframe srcdoc=") and 'sandbox="allow-scripts"' in frame
    assert "FF-amp overlay" in view


def test_a_classifier_explains_the_class_chosen(classifier):
    session = gradio_app.AppEvents(classifier)
    assert session.class_choices == [("predicted", -1), ("0: LABEL_0", 0), ("1: LABEL_1", 1), ("2: LABEL_2", 2)]
    summary, _, table, *_ = _session_explain(classifier, class_index=2)
    expected = explain_text(TEXT, classifier, class_index=2)
    assert "class 2" in summary and list(table.columns)[2] == '"LABEL_2"'
    torch.testing.assert_close(torch.tensor(table['"LABEL_2"'].tolist(), dtype=torch.float64),
                               expected.contributions[0].double(), atol=1e-6, rtol=0)


def test_a_base_model_without_a_read_out_shows_its_maps_only():
    loaded = tiny_loaded("bert")
    summary, figure, table, _, maps, image, _ = _session_explain(loaded)
    assert "no output to explain" in summary and figure is None
    assert list(table.columns) == ["position", "token"]
    assert image.size[0] > 200 and len(maps.layers) == len(loaded.blocks)
    assert not gradio_app.AppEvents(loaded).has_output


def test_the_components_table_is_explain_texts(lm):
    session = gradio_app.AppEvents(lm)
    image, frame = session.components(TEXT, "", -1, "sublayer")
    expected = explain_text(TEXT, lm, components="sublayer").components
    assert list(frame.columns) == ["token", *expected.components]
    assert list(frame["token"]) == expected.tokens[0]
    torch.testing.assert_close(torch.tensor(frame.iloc[:, 1:].to_numpy(), dtype=torch.float64),
                               expected.contributions[0].double(), atol=1e-6, rtol=0)
    assert image.size[0] > 200


def test_the_graph_tab_is_graph_texts(lm):
    from captum_ffb.explain import graph_text

    session = gradio_app.AppEvents(lm)
    summary, page = session.graph(TEXT, "", -1, "", "head", 0.8)
    expected = graph_text(TEXT, lm)
    assert f"kept {int(expected.node_mask.sum())} nodes" in summary and "iframe" in page
    with pytest.raises(gradio.Error, match="corrupted"):
        session.graph(TEXT, "", -1, "the cat", "head", 0.8)
    none_summary, _ = session.graph(TEXT, "", -1, None, "head", 0.8)  # AttributeError before
    assert none_summary == summary


def test_the_context_tab_is_context_attribution(lm, classifier):
    from captum_ffb import NormDecomposition
    from captum_ffb.long_context.attribution import context_attribution

    context = "the cat sat on the mat .\n\nthe dog ran fast .\n\nshe loves math ."
    session = gradio_app.AppEvents(lm)
    image, table = session.context(context, "the cat was", "paragraph", "")
    expected = context_attribution(NormDecomposition(lm.model), lm.tokenizer, context, "the cat was")
    assert sorted(table["group"]) == [0, 1, 2] and image is not None
    by_group = dict(zip(table["group"], table["contribution"]))
    assert all(abs(by_group[g] - float(expected.contributions[g])) < 1e-4 for g in range(3))
    assert list(table["contribution"].abs()) == sorted(table["contribution"].abs(), reverse=True)
    with pytest.raises(gradio.Error, match="empty|visible"):
        session.context("  ", "the cat was", "paragraph", "")
    token = lm.tokenizer.decode(lm.tokenizer.encode(" mat", add_special_tokens=False)[:1])
    _, by_text = session.context(context, "the cat was", "paragraph", token)  # a traceback before
    assert sorted(by_text["group"]) == [0, 1, 2]
    with pytest.raises(gradio.Error, match="causal LM"):
        gradio_app.AppEvents(classifier).context(context, "the cat was", "paragraph", "")
    _, removed = session.context(context, "the cat was", "paragraph", "", "presence")
    expected = context_attribution(NormDecomposition(lm.model), lm.tokenizer, context, "the cat was",
                                   method="presence")
    by_group = dict(zip(removed["group"], removed["contribution"]))
    assert all(abs(by_group[g] - float(expected.contributions[g])) < 1e-4 for g in range(3))
    _, fitted = session.context(context, "the cat was", "paragraph", "", "fitted")
    expected = context_attribution(NormDecomposition(lm.model), lm.tokenizer, context, "the cat was",
                                   method="fitted")
    by_group = dict(zip(fitted["group"], fitted["contribution"]))
    assert all(abs(by_group[g] - float(expected.contributions[g])) < 1e-4 for g in range(3))


def test_mistakes_show_as_gradio_errors(lm):
    session = gradio_app.AppEvents(lm)
    with pytest.raises(gradio.Error, match="not in the tokenizer's vocabulary"):
        _session_explain(lm, target="the zzqx")
    with pytest.raises(gradio.Error, match="empty"):
        session.components("", "", -1, "sublayer")
    with pytest.raises(gradio.Error, match="no scope"):
        session.redraw(_session_explain(lm)[4], 0, [], True, "raw norms")
    assert session.redraw(None, 0, [], True, "raw norms") is None  # nothing explained yet


def test_no_analytics(lm):
    app = gradio_app.build_app(lm)
    assert app.analytics_enabled is False
    assert os.environ["GRADIO_ANALYTICS_ENABLED"] == "False"


def test_without_gradio_one_line_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gradio", None)  # import gradio raises ImportError
    with pytest.raises(ImportError, match=r"^the Gradio app needs gradio: pip install 'captum_ffb\[app\]'$"):
        gradio_app.import_gradio()


@pytest.mark.parametrize("text, generate", [("the cat sat on the mat ||| the dog run", 0), ("the cat sat on the mat", 3)])
def test_an_encoder_decoder_gets_its_source_and_target_tabs(tmp_path, text, generate):
    """A Marian: its table holds explain_pair's numbers (a forced target or a generation), its
    decoder layer maps are drawn, and the app builds."""
    from captum_ffb.explain import explain_pair
    from tests.models import load_saved, save_tiny_seq2seq

    loaded = load_saved(save_tiny_seq2seq(tmp_path / "marian", "marian"))
    scopes = gradio_app.scopes_of(loaded)
    assert "Cross" in scopes
    summary, figure, table, maps, maps_figure, view = gradio_app.PairEvents(loaded).explain(
        text, generate, 1, scopes, True, "raw norms")
    expected = explain_pair(text, loaded, generate=generate)
    assert "source share" in summary and figure is not None
    assert list(table["token"]) == expected.target_tokens
    torch.testing.assert_close(torch.tensor(table["source share"].tolist(), dtype=torch.float64),
                               expected.result.source_share.double(), atol=1e-6, rtol=0,
                               equal_nan=True)  # a logit of exactly 0 (the pad token) has no share
    first = f"source 0: {expected.source_tokens[0]}"
    torch.testing.assert_close(torch.tensor(table[first].tolist(), dtype=torch.float64),
                               expected.result.source[:, 0].double(), atol=1e-6, rtol=0)
    if maps is not None:
        assert maps.n_target is not None and maps_figure is not None and "ffbView" in view
    assert gradio_app.build_app(loaded) is not None


def test_inputs_the_model_cannot_use_are_refused(classifier):
    """A next token or a generation asked of a classifier is an error, not left out unsaid."""
    session = gradio_app.AppEvents(classifier)
    with pytest.raises(gradio.Error, match="a next token is explained by causal LMs; BertForSequenceClassification"):
        session.explain("the cat", " dog", -1, 0, 0, [], True, "raw norms")
    with pytest.raises(gradio.Error, match="generating needs a causal LM"):
        session.explain("the cat", "", -1, 3, 0, [], True, "raw norms")


def test_the_app_answers_this_machine_only(lm):
    """The DNS-rebinding guard: served on 127.0.0.1, a request naming another host is refused."""
    import socket
    import urllib.error
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = gradio_app.launch(lm, port=port, block=False, quiet=True)
    try:
        url = f"http://127.0.0.1:{port}/config"
        with urllib.request.urlopen(urllib.request.Request(url), timeout=30) as answer:
            assert answer.status == 200
        for host in ("attacker.example", f"attacker.example:{port}"):
            request = urllib.request.Request(url, headers={"Host": host})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 400
        request = urllib.request.Request(url, headers={"Host": f"localhost:{port}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
    finally:
        app.close()
    assert gradio_app.host_guard("0.0.0.0") == {}  # listening elsewhere is the user's choice
