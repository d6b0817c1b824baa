"""``captum-ffb lit`` as a user meets it: the server started on a free local port, its page
driven in headless Chromium (selenium), and the values LIT shows checked against
NormDecomposition's and the layer maps (LIT shows 3 significant digits)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from captum_ffb import LayerNormDecomposition, NormDecomposition
from captum_ffb.explained.models import load_model
from captum_ffb.texts.text import display_tokens
from tests.integrations import lit_page

pytestmark = pytest.mark.browser

TEXT = "the cat sat on the mat because it was tired ."
#: Largest relative difference between a value and LIT's 3 significant digits of it.
SHOWN = 5.1e-3


def _skip_reason() -> str | None:
    if importlib.util.find_spec("lit_nlp") is None:
        return "needs lit-nlp: pip install 'captum_ffb[lit]' (the README's install line brings it)"
    return lit_page.missing_browser()


@pytest.fixture(scope="module", autouse=True)
def browser_ready():
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)


def assert_shown(shown: list[tuple[str, str]], tokens: list[str], values: torch.Tensor) -> None:
    """LIT's chips: the tokens, and each value to LIT's display precision."""
    assert [token for token, _ in shown] == tokens
    for (token, text), value in zip(shown, values.tolist()):
        assert float(text) == pytest.approx(value, rel=SHOWN, abs=1e-12), (token, text, value)


@pytest.fixture(scope="module")
def page(classifier_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("data") / "texts.txt"
    data.write_text("the cat sat on the mat .\na dog ran fast\n", encoding="utf-8")
    server, url = lit_page.start_lit(["--model", str(classifier_dir), "--data", str(data)], timeout=120)
    driver = lit_page.chromium(log_requests=True)
    try:
        lit_page.open_lit(driver, url)
        driver.lit_url = url
        yield driver
    finally:
        driver.quit()
        lit_page.stop(server)


def choose_class(driver, index: int) -> None:
    """Pick class ``index`` in the Salience Maps module's "Class to explain"."""
    lit_page.run_js(driver, """
      var module = deepAll('salience-map-module')[0];
      var select = deepAll('select.salience-target-dropdown', module.shadowRoot).pop();
      select.selectedIndex = arguments[0];
      select.dispatchEvent(new Event('change', {bubbles: true, composed: true}));""", index)


def test_a_typed_text_shows_our_contributions_for_the_predicted_then_a_chosen_class(
        page, classifier_dir):
    names = lit_page.method_names(page)
    assert names[0] == "NormDecomposition"
    assert {"LIME", "Grad L2 Norm", "Grad ⋅ Input", "Integrated Gradients",
            "Layer maps (NormDecomposition)"} <= set(names)
    loaded = load_model(classifier_dir, task="auto", show_progress=False)
    ids = loaded.tokenizer(TEXT, return_tensors="pt")["input_ids"]
    tokens = display_tokens(loaded.tokenizer.convert_ids_to_tokens(ids[0]), loaded.tokenizer)
    nd = NormDecomposition(loaded.model)
    with torch.no_grad():
        logits = loaded.model(ids).logits[0]
    predicted = int(logits.argmax())

    def ours():
        groups = lit_page.salience(page, "NormDecomposition")
        return next((chips for _, chips in groups if [t for t, _ in chips] == tokens), None)

    lit_page.enter_text(page, TEXT)
    # the first text typed waits for every method LIT lists (LIME, integrated gradients, ...)
    shown = lit_page.wait_for(ours, 180, "NormDecomposition's contributions for the typed text",
                              seen=lambda: lit_page.salience(page, "NormDecomposition"))
    contributions, bias = nd.attribute(ids, target=predicted, return_bias=True)
    assert_shown(shown, tokens, contributions[0])
    # the line under the tokens: value = Σ tokens + bias, and the token share
    line = dict(lit_page.salience(page, "NormDecomposition"))["value = Σ tokens + bias"]
    value, total = float(logits[predicted]), float(contributions[0].sum())
    assert [word.split(" ")[0] for word, _ in line] == ["value", "=", "+", "(token"]
    for (_, shown_value), expected_value in zip(line, (value, total, float(bias[0]))):
        assert float(shown_value) == pytest.approx(expected_value, rel=SHOWN, abs=1e-6)
    assert line[3][0] == f"(token share {total / value:.0%})"
    other = (predicted + 1) % logits.shape[0]
    expected = nd.attribute(ids, target=other)[0]
    choose_class(page, other)

    def updated():
        now = ours()
        return now if now and now != shown else None

    assert_shown(lit_page.wait_for(updated, 60, f"the contributions to class {other}"), tokens,
                 expected)


def test_the_layer_maps_show_each_row_at_the_picked_layer_and_scope(page, classifier_dir):
    loaded = load_model(classifier_dir, task="auto", show_progress=False)
    lit_page.select_example(page, 0)
    text = "the cat sat on the mat ."
    ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"]
    tokens = display_tokens(loaded.tokenizer.convert_ids_to_tokens(ids[0]), loaded.tokenizer)
    name = "Layer maps (NormDecomposition)"

    def rows(previous=None):
        groups = lit_page.salience(page, name)
        ready = len(groups) == len(tokens) and groups[0][1][0][0] == tokens[0]
        return groups if ready and groups != previous else None

    def expected(layer, scope):
        (maps,) = LayerNormDecomposition(loaded.model, [loaded.blocks[layer]]).attribute(ids, scope=[scope])
        matrix = maps[scope][0]
        return matrix / matrix.sum(-1, keepdim=True)

    lit_page.expand_method(page, name)
    default = lit_page.wait_for(rows, 60, "the layer maps' rows")  # the last layer, whole
    assert [title for title, _ in default] == [f"{i}: {t}" for i, t in enumerate(tokens)]
    for (_, shown), row in zip(default, expected(-1, "AtbFfResLn")):
        assert_shown(shown, tokens, row)
    lit_page.apply_settings(page, name, {"Layer": "0", "Scope": "AtbFf"})
    picked = lit_page.wait_for(lambda: rows(default), 60, "the rows of layer 0 at AtbFf")
    for (_, shown), row in zip(picked, expected(0, "AtbFf")):
        assert_shown(shown, tokens, row)


@pytest.mark.real_weights
def test_the_bundled_minilm_shows_the_sentiment_heads_contributions():
    from captum_ffb.evaluation.minilm_head import minilm_sentiment_readout
    from captum_ffb.integrations.lit import DEFAULT_TEXTS

    server, url = lit_page.start_lit([], timeout=180)
    driver = lit_page.chromium()
    try:
        lit_page.open_lit(driver, url)
        lit_page.select_example(driver, 0)
        shown = lit_page.wait_for(lambda: lit_page.salience(driver, "NormDecomposition"), 60,
                                  "NormDecomposition's contributions")[0][1]
    finally:
        driver.quit()
        lit_page.stop(server)
    loaded = load_model(show_progress=False)
    ids = loaded.tokenizer(DEFAULT_TEXTS[0], return_tensors="pt")["input_ids"]
    readout = minilm_sentiment_readout()
    mask = torch.ones_like(ids)
    with torch.no_grad():
        z = float(readout.value(loaded.model(ids, attention_mask=mask), mask)[0])
    expected = NormDecomposition(loaded.model).attribute(ids, target=readout,
                                                         forward_kwargs={"attention_mask": mask})[0]
    tokens = display_tokens(loaded.tokenizer.convert_ids_to_tokens(ids[0]), loaded.tokenizer)
    assert_shown(shown, tokens, expected if z > 0 else -expected)  # the predicted class


def test_a_causal_lm_explains_the_clicked_next_token_in_sequence_salience(tmp_path):
    from tests.models import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "tiny-gpt2", "gpt2", byte_level=True)
    data = tmp_path / "prompts.txt"
    prompt = "the cat sat on the"
    data.write_text(prompt + "\n", encoding="utf-8")
    server, url = lit_page.start_lit(["--model", str(folder), "--data", str(data)], timeout=120)
    driver = lit_page.chromium()
    try:
        lit_page.open_lit(driver, url)
        lit_page.select_example(driver, 0)
        lit_page.choose_response(driver)
        lit_page.press(driver, "Tokens")
        lit_page.press(driver, "norm_decomposition")
        n = len(prompt.split())
        lit_page.wait_for(lambda: len(lit_page.sequence_chips(driver)) > n, 30, "the tokens")
        lit_page.click_chip(driver, n)  # the continuation's first token: the predicted one

        def explained():
            chips = lit_page.sequence_chips(driver)
            return chips if any(float(value) != 0 for _, value in chips[:n]) else None

        chips = lit_page.wait_for(explained, 60, "NormDecomposition in Sequence Salience")
    finally:
        driver.quit()
        lit_page.stop(server)
    loaded = load_model(folder, task="auto", show_progress=False)
    ids = loaded.tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        predicted = int(loaded.model(ids).logits[0, -1].argmax())
    expected = NormDecomposition(loaded.model).attribute(ids, target=predicted)[0]
    assert [token.strip() for token, _ in chips[:n]] == prompt.split()
    for (token, text), value in zip(chips[:n], expected.tolist()):
        assert float(text) == pytest.approx(value, rel=SHOWN, abs=1e-12), (token, text, value)


def test_the_page_asks_nothing_outside_and_draws_its_icons(page):
    """Offline the icons come from the package's own fonts: every request stays on the
    server's address, and each icon is one glyph (about its font size wide), not its name."""
    page.refresh()
    lit_page.open_lit(page, page.lit_url)
    lit_page.wait_for(lambda: page.execute_script(
        "return document.fonts.status === 'loaded' && document.fonts.check('24px \"Material Icons\"')"),
        30, "the icon font")
    requested = lit_page.requested_urls(page)
    assert any(url.startswith(page.lit_url) for url in requested)
    assert any(url.endswith("/captum_ffb_static/material-icons.woff2") for url in requested)
    outside = sorted(url for url in requested
                     if not url.startswith((page.lit_url, "data:", "blob:", "about:")))
    assert outside == []
    icons = lit_page.run_js(page, lit_page.ICONS)
    assert len(icons) >= 3
    as_words = [(name, width, size) for name, width, size in icons if width > 1.6 * size]
    assert not as_words, as_words
