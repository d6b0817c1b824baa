import os

import pytest

from captum_ffb import NormDecomposition, TopLogits
from captum_ffb.texts.text import TextMaps, text_maps
from captum_ffb.viz.graph import graph_html
from tests.models import tiny_loaded, tiny_task_model, token_ids
from tests.viz.chromium import CHROMEDRIVER, CHROMIUM, missing


def tiny_text_maps(name: str, text: str = "the cat sat on the mat .") -> TextMaps:
    """All layers and scopes of ``text`` on the tiny model ``name``."""
    return text_maps(text, tiny_loaded(name))


@pytest.fixture(scope="session")
def bert_maps():
    """All layers and scopes of a short text on the tiny random BERT (Post-LN)."""
    return tiny_text_maps("bert")


@pytest.fixture(scope="session")
def gpt2_maps():
    """All layers and scopes of a short text on the tiny random GPT-2 (Pre-LN, causal)."""
    return tiny_text_maps("gpt2")


# --- the graph viewer's pages and a browser (tests/viz/test_graph_page.py, test_graph_tracing.py)
@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Three pages of graphs of 20 tokens: heads with patching estimates (``baseline_inputs``),
    neurons (up to 23 of one block at one position), and several outputs (the four most
    probable next tokens, :class:`~captum_ffb.TopLogits`)."""
    reason = missing()
    if reason is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the browser test: {reason}")
        pytest.skip(reason)
    nd = NormDecomposition(tiny_task_model("llama", "causal_lm"))
    ids = token_ids(1, 20, seed=3)
    baseline = ids.clone()
    baseline[0, 4], baseline[0, 11] = 7, 9
    heads = nd.attribute_graph(ids, 5, baseline_inputs=baseline, node_threshold=1.0)
    neurons = nd.attribute_graph(ids, 5, granularity="neuron", node_threshold=0.95)
    several = nd.attribute_graph(ids, TopLogits(4, 0.99), node_threshold=0.9)
    root = tmp_path_factory.mktemp("graph_page")
    found = {}
    for name, graph in (("heads", heads), ("neurons", neurons), ("several", several)):
        path = root / f"{name}.html"
        path.write_text(graph_html(graph), encoding="utf-8")
        found[name] = (path, graph.to_dict())
    return found


@pytest.fixture(scope="module")
def browser(pages):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--hide-scrollbars", "--window-size=1600,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
