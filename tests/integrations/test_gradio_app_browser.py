"""The Gradio app as a user meets it: a server on a free local port, a headless Chromium
driven by Selenium types a text and asks for the explanation, and the numbers the page shows
are NormDecomposition's (``explain_text``'s); the page fetches nothing from outside."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import time

import pytest
import torch

from captum_ffb.explain import explain_text
from tests.models import save_tiny_lm

pytestmark = pytest.mark.browser

CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)),
                None)
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 60


def _missing() -> str | None:
    """Why the test cannot run here, or ``None``."""
    if importlib.util.find_spec("gradio") is None:
        return "the Gradio app needs gradio: pip install 'captum_ffb[app]'"
    if importlib.util.find_spec("selenium") is None:
        return "driving Chromium needs selenium (it comes with [dev])"
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "Chromium and its driver are not installed (apt-get install chromium chromium-driver)"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app on a tiny causal LM, served on a free port of 127.0.0.1, and the same model
    loaded again."""
    reason = _missing()
    if reason is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the browser test: {reason}")
        pytest.skip(reason)
    from captum_ffb.explained.models import load_model
    from captum_ffb.integrations.gradio_app import launch

    folder = save_tiny_lm(tmp_path_factory.mktemp("app") / "model")
    app = launch(load_model(folder, show_progress=False, task="auto"), port=_free_port(), block=False,
                 quiet=True)
    # the expected numbers come from a model of its own: the server's may be busy meanwhile
    yield app, load_model(folder, show_progress=False, task="auto")
    app.close()


@pytest.fixture(scope="module")
def page(server):
    """Chromium on the app's page, recording every request it makes."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    app, _ = server
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
                 "--disable-background-networking", "--disable-component-update", "--no-first-run"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(app.local_url)
        _wait(driver, lambda d: d.find_elements("css selector", "#ffb-text textarea"))
        yield driver
    finally:
        driver.quit()


def _wait(driver, condition):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition)


def _explain(driver, text: str, generate: int = 0) -> str:
    """Type ``text`` (and the number of tokens to generate), press Explain, wait for the
    summary of that text; returns the summary."""
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element("css selector", "#ffb-text textarea")
    box.clear()
    box.send_keys(text)
    number = driver.find_element("css selector", "#ffb-generate input[type=number]")
    number.send_keys(Keys.CONTROL, "a")
    number.send_keys(str(generate), Keys.TAB)
    driver.find_element("css selector", "#ffb-explain").click()
    return _wait(driver, lambda d: next((s.text for s in d.find_elements("id", "ffb-summary")
                                         if f"“{text}”" in s.text), None))


def _table(driver, elem_id: str, columns: int) -> tuple[list[str], list[list[str]]]:
    """The headers and cells (text) of a Gradio Dataframe once it has ``columns`` columns."""
    def read(d):
        headers = [h.text for h in d.find_elements("css selector", f"#{elem_id} th")]
        return headers if len(headers) == columns else None

    headers = _wait(driver, read)
    grid = driver.find_element("css selector", f"#{elem_id} [role=grid]")
    rows = int(grid.get_attribute("aria-rowcount")) - 1
    cells = [[driver.find_element("css selector", f'#{elem_id} [data-testid="cell-{r}-{c}"]').text
              for c in range(columns)] for r in range(rows)]
    return headers, cells


def _tab(driver, name: str) -> None:
    next(b for b in driver.find_elements("css selector", "button[role=tab]") if b.text.strip() == name).click()


def _numbers(cells: list[list[str]], column: int) -> list[float | None]:
    return [float(row[column]) if row[column].strip() else None for row in cells]


def test_the_page_shows_the_contributions_of_explain_text(server, page):
    _, loaded = server
    text = "the cat sat on the mat because"
    summary = _explain(page, text)
    expected = explain_text(text, loaded)
    headers, cells = _table(page, "ffb-table", 3)
    assert headers == ["position", "token", f'"{expected.target_labels[0]}"']
    assert [row[1] for row in cells] == expected.labels
    torch.testing.assert_close(torch.tensor(_numbers(cells, 2), dtype=torch.float64),
                               expected.contributions[0].double(), atol=1e-4, rtol=0)
    assert "the logit of the predicted next token" in summary
    assert f"{float(expected.values[0]):.4f}" in summary and f"{float(expected.bias[0]):.4f}" in summary
    image = page.find_element("css selector", "#ffb-figure img")
    assert image.get_attribute("naturalWidth") not in (None, "0")


def test_the_page_shows_every_generation_step(server, page):
    _, loaded = server
    text = "a dog ran under the table"
    _explain(page, text, generate=2)
    expected = explain_text(text, loaded, generate=2)
    headers, cells = _table(page, "ffb-table", 4)
    assert headers[2:] == [f'step {t + 1}: "{label}"' for t, label in enumerate(expected.target_labels)]
    assert [row[1] for row in cells] == expected.labels
    n = expected.prompt_length
    for t in range(2):
        shown = _numbers(cells, 2 + t)
        assert all(v is None for v in shown[n + t:])  # tokens the step could not see
        torch.testing.assert_close(torch.tensor(shown[: n + t], dtype=torch.float64),
                                   expected.contributions[t, : n + t].double(), atol=1e-4, rtol=0)


def test_the_layer_maps_redraw_and_the_interactive_view_runs(server, page):
    _, loaded = server
    text = "she loves math rather than"
    _explain(page, text)
    _tab(page, "Layer maps")
    source = _wait(page, lambda d: d.find_element("css selector", "#ffb-maps img").get_attribute("src"))
    atb = next(label for label in page.find_elements("css selector", "#ffb-scopes label")
               if label.text.strip() == "Atb")
    atb.click()  # one scope fewer: the figure is drawn again
    _wait(page, lambda d: d.find_element("css selector", "#ffb-maps img").get_attribute("src") != source)
    page.switch_to.frame(page.find_element("css selector", "#ffb-maps-view iframe"))
    try:
        from captum_ffb.integrations.gradio_app import scopes_of
        from captum_ffb.texts.text import text_maps

        buttons = _wait(page, lambda d: [b.get_attribute("data-scope")
                                         for b in d.find_elements("css selector", "#ffb-scopes button")])
        assert buttons == [*scopes_of(loaded), "FF-amp"]
        page.find_element("id", "ffb-overlay").click()
        shown = page.execute_script("var v = window.ffbView; return [v.signature(), v.value(1, 'Atb', 2, 1)];")
        maps = text_maps(text, loaded)
        assert shown[0] and abs(shown[1] - float(maps.maps[1]["Atb"][2, 1])) < 1e-5
        tokens = [s.text for s in page.find_elements("css selector", "#ffb-tokens .token")]
        assert tokens == maps.tokens
    finally:
        page.switch_to.default_content()
        atb.click()
        _tab(page, "Contributions")


def test_the_components_tab_shows_the_table_of_explain_text(server, page):
    _, loaded = server
    text = "the big red dog"
    _explain(page, text)
    _tab(page, "Components")
    page.find_element("id", "ffb-split").click()
    expected = explain_text(text, loaded, components="sublayer").components
    columns = 1 + len(expected.components)
    headers, cells = _wait(page, lambda d: (lambda t: t if [r[0] for r in t[1]] == expected.tokens[0] else None)(
        _table(d, "ffb-components-table", columns)))
    assert headers == ["token", *expected.components]
    shown = torch.tensor([[float(v) for v in row[1:]] for row in cells], dtype=torch.float64)
    torch.testing.assert_close(shown, expected.contributions[0].double(), atol=1e-4, rtol=0)
    _tab(page, "Contributions")


def test_the_graph_tab_draws_the_graph_of_graph_text(server, page):
    _, loaded = server
    text = "the big red dog"
    _explain(page, text)
    _tab(page, "Graph")
    page.find_element("id", "ffb-graph-build").click()
    from captum_ffb.explain import graph_text

    expected = graph_text(text, loaded)
    summary = _wait(page, lambda d: next((s.text for s in d.find_elements("id", "ffb-graph-summary")
                                          if "Explained" in s.text), None))
    assert f"kept {int(expected.node_mask.sum())} nodes" in summary
    page.switch_to.frame(_wait(page, lambda d: d.find_element("css selector", "#ffb-graph-view iframe")))
    try:
        drawn = _wait(page, lambda d: d.execute_script("return window.ffbGraph && window.ffbGraph.nodes();"))
        assert drawn == int(expected.node_mask.sum())
        assert page.execute_script("return window.ffbGraph.choose('output');")
        listed = [c.text for c in page.find_elements("css selector", "#ffb-panel ol.source code")]
        into = expected.edges_of("output")["in"]
        assert listed == [source for source, _ in into][:15]
    finally:
        page.switch_to.default_content()
        _tab(page, "Contributions")


def test_the_page_fetches_nothing_from_outside(server, page):
    app, _ = server
    time.sleep(0.5)
    requested = set()
    for entry in page.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requested.add(message["params"]["request"]["url"])
    assert any(url.startswith(app.local_url) for url in requested)
    outside = sorted(url for url in requested if not url.startswith((app.local_url, "data:", "blob:", "about:")))
    assert outside == []
