"""The attribution graph viewer (``viz.graph_html``) as a researcher meets it: the page opened in
headless Chromium (driven by Selenium) at 1600×1000 and 1280×800, on graphs of a tiny random
Llama over 20 tokens. The whole kept graph and every token fit the window on load; the details
panel beside it shows a chosen node; nodes never overlap and are labelled from their fields;
hover, click, shift-click pins, the pinned subgraph, supernodes, the threshold sliders, the
search, the size toggle, zoom, pan and fit work; the page requests nothing."""

from __future__ import annotations

import json
import math
import time

import pytest

from captum_ffb.texts.text import display_token

pytestmark = pytest.mark.browser

SIZES = [(1600, 1000), (1280, 800)]
WRITERS = ("head", "attention", "cross_attention", "ff", "neuron")


def expected_label(node: dict, tokens: list[str]) -> str:
    """A node's label from its fields alone (never from its id): its place, and the token its
    write promotes most where the graph carries its logit lens."""
    kind, layer, part = node["kind"], node["layer"], node["head"]
    place = {"head": f"L{layer}.H{part}", "attention": f"L{layer}.A", "cross_attention": f"L{layer}.X",
             "ff": f"FF{layer}", "neuron": f"L{layer}.N{part}"}.get(kind)
    if place is None:
        return display_token(tokens[node["position"]])
    return f"{place} ↑{node['promotes'][0]}" if node.get("promotes") else place


def _open(driver, path, size=(1600, 1000)):
    """The page at a viewport of exactly ``size`` CSS pixels, drawn."""
    width, height = size
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    driver.get(path.as_uri())
    for _ in range(100):
        if driver.execute_script("return document.body.dataset.state") == "drawn":
            break
        time.sleep(0.05)
    assert driver.execute_script("return [innerWidth, innerHeight]") == [width, height]
    return driver


VISIBLE = """
var W = innerWidth, H = innerHeight;
function inside(e) { var b = e.getBoundingClientRect();
  return b.width > 0 && b.height > 0 && b.left >= 0 && b.top >= 0 && b.right <= W && b.bottom <= H; }
function ids(sel) { return Array.from(document.querySelectorAll(sel)); }
"""


def _circles(driver) -> dict[str, tuple[float, float, float]]:
    return {k: tuple(v) for k, v in driver.execute_script(
        "var o = {}; document.querySelectorAll('#ffb-graph [data-node]').forEach(function (c) {"
        " o[c.dataset.node] = [+c.getAttribute('cx'), +c.getAttribute('cy'), +c.getAttribute('r')]; }); return o;").items()}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", ["heads", "neurons"])
def test_the_whole_graph_and_every_token_fit_the_window_and_the_panel_shows_the_choice(pages, browser, name, size):
    path, saved = pages[name]
    driver = _open(browser, path, size)
    found = driver.execute_script(VISIBLE + """
      var nodes = ids('[data-node]'), tokens = ids('[data-token]');
      return {nodes: nodes.length, nodesIn: nodes.filter(inside).length, tokens: tokens.map(function (t) {
                return [+t.dataset.token, inside(t)]; }),
              scroll: [document.documentElement.scrollWidth, document.documentElement.scrollHeight,
                       scrollX, scrollY]};""")
    assert found["nodes"] == len(saved["nodes"])  # every kept node drawn
    assert found["nodesIn"] >= 0.9 * found["nodes"]
    assert found["nodesIn"] == found["nodes"]  # in fact every one of them
    assert sorted(p for p, _ in found["tokens"]) == list(range(len(saved["tokens"])))
    assert all(inside for _, inside in found["tokens"])
    assert found["scroll"] == [size[0], size[1], 0, 0]  # nothing to scroll
    # choosing the output: the panel beside the graph names its largest in-edge's source
    output = next(n["id"] for n in saved["nodes"] if n["kind"] == "output")
    into = [link for link in saved["links"] if link["target"] == output and "kind" not in link]
    largest = max(into, key=lambda link: abs(link["weight"]))["source"]
    assert driver.execute_script(f"return window.ffbGraph.choose({json.dumps(output)})") is True
    shown = driver.execute_script(VISIBLE + """
      var panel = document.querySelector('[data-role=details]'), first = panel.querySelector('ol.source li code');
      return {panel: inside(panel), text: panel.textContent, first: first.textContent, firstIn: inside(first),
              chosen: document.body.dataset.chosen};""")
    assert shown["panel"] and shown["firstIn"] and shown["chosen"] == output
    assert largest in shown["text"] and shown["first"] == largest
    token_id = next(n["token_id"] for n in saved["nodes"] if n["kind"] == "output")
    assert f"token id{token_id}" in shown["text"]  # what the output reads, by its id
    assert driver.execute_script("return window.ffbGraph.choose('no such node')") is False


@pytest.mark.parametrize("name", ["heads", "neurons"])
def test_nodes_never_overlap_and_are_labelled_from_their_fields(pages, browser, name):
    path, saved = pages[name]
    driver = _open(browser, path, (1280, 800))
    circles = _circles(driver)
    items = list(circles.items())
    for i, (a, (xa, ya, ra)) in enumerate(items):
        for b, (xb, yb, rb) in items[i + 1:]:
            assert math.hypot(xa - xb, ya - yb) >= ra + rb, (a, b)
    labels = driver.execute_script(
        "var o = {}; document.querySelectorAll('#ffb-graph [data-label]').forEach(function (t) {"
        " var b = t.getBBox(); o[t.dataset.label] = [t.textContent, b.x, b.y, b.width, b.height]; }); return o;")
    tokens = driver.execute_script(
        "return Array.from(document.querySelectorAll('#ffb-graph [data-token]')).map(function (t) {"
        " return [+t.dataset.token, t.textContent]; });")
    writers = [n for n in saved["nodes"] if n["kind"] in WRITERS]
    assert writers
    for node in writers:
        assert labels[node["id"]][0] == expected_label(node, saved["tokens"])
    assert {p: text for p, text in tokens} == {p: display_token(t) for p, t in enumerate(saved["tokens"])}
    output = next(n for n in saved["nodes"] if n["kind"] == "output")
    assert display_token(saved["output"]) in labels[output["id"]][0]
    # the writers' labels overlap neither one another nor another node's circle
    boxes = [(k, labels[k][1:]) for k in (n["id"] for n in writers)]
    for i, (a, (x, y, w, h)) in enumerate(boxes):
        for b, (x2, y2, w2, h2) in boxes[i + 1:]:
            assert x + w <= x2 or x2 + w2 <= x or y + h <= y2 or y2 + h2 <= y, (a, b)
        for other, (cx, cy, r) in circles.items():
            if other != a:
                nearest = (min(max(cx, x), x + w), min(max(cy, y), y + h))
                assert math.hypot(cx - nearest[0], cy - nearest[1]) >= r * 0.999, (a, other)
    # writers of one block sit in one row, blocks upwards, the tokens along the bottom, the output on top
    for a in writers:
        for b in writers:
            if a["layer"] < b["layer"]:
                assert circles[a["id"]][1] > circles[b["id"]][1]
    token_y = {circles[n["id"]][1] for n in saved["nodes"] if n["kind"] == "token"}
    assert len(token_y) == 1 and min(token_y) > max(y for _, y, _ in circles.values() if y not in token_y) - 1e-9
    assert circles[output["id"]][1] == min(y for _, y, _ in circles.values())


def test_hover_card_click_selects_and_shift_click_pins_into_the_pinned_subgraph(pages, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    path, saved = pages["heads"]
    driver = _open(browser, path)
    heads = sorted((n for n in saved["nodes"] if n["kind"] == "head"), key=lambda n: -abs(n["value"]))
    first, second = heads[0], heads[1]

    def element(node_id):
        return driver.find_element("css selector", f'#ffb-graph [data-node="{node_id}"]')

    ActionChains(driver).move_to_element(element(first["id"])).perform()
    card = driver.find_element("id", "ffb-card")
    assert card.is_displayed()
    text = card.text
    assert first["id"] in text and expected_label(first, saved["tokens"]) in text and "value" in text
    assert "influence" in text and "patch estimate" in text and "top in-edges" in text
    element(first["id"]).click()
    assert driver.execute_script("return document.body.dataset.chosen") == first["id"]
    panel = driver.find_element("css selector", "[data-role=details]").text
    assert first["id"] in panel and "patch estimate" in panel and "κ" in panel
    # its paths are lit (test_graph_tracing checks them edge by edge), its largest in- and out-edge among them
    lit = driver.execute_script("return Array.from(document.querySelectorAll('#ffb-graph .edge.hot'))"
                                ".map(function (p) { return [p.dataset.source, p.dataset.target, +p.dataset.hops]; })")
    assert 0 < len(lit) < driver.execute_script("return window.ffbGraph.edges()")
    for end in ("target", "source"):
        largest = max((link for link in saved["links"] if link[end] == first["id"] and "kind" not in link),
                      key=lambda link: abs(link["weight"]))
        assert [largest["source"], largest["target"]] in [[s, t] for s, t, _ in lit]
    for node in (first, second):
        ActionChains(driver).key_down(Keys.SHIFT).click(element(node["id"])).key_up(Keys.SHIFT).perform()
    assert sorted(driver.execute_script("return window.ffbGraph.pinned()")) == sorted([first["id"], second["id"]])
    assert driver.execute_script("return document.querySelectorAll('#ffb-graph .node.pinned').length") == 2
    driver.find_element("id", "ffb-pinned-view").click()
    assert driver.execute_script("return window.ffbGraph.nodes()") == 2
    edges = driver.execute_script("return window.ffbGraph.edgeList()")
    between = [link for link in saved["links"] if "kind" not in link
               and {link["source"], link["target"]} == {first["id"], second["id"]}]
    assert len(edges) == len(between)
    assert all({e["source"], e["target"]} == {first["id"], second["id"]} for e in edges)
    driver.find_element("id", "ffb-pinned-view").click()
    assert driver.execute_script("return window.ffbGraph.nodes()") == len(saved["nodes"])
    # an edge listed in the panel leads to its other end
    driver.find_element("css selector", "[data-role=details] ol.source li").click()
    into = max((link for link in saved["links"] if link["target"] == first["id"] and "kind" not in link),
               key=lambda link: abs(link["weight"]))
    assert driver.execute_script("return document.body.dataset.chosen") == into["source"]


def test_collapsed_columns_hold_their_token_upright_and_widen_on_a_click(pages, browser):
    path, saved = pages["heads"]
    driver = _open(browser, path)
    busy = {n["position"] for n in saved["nodes"] if n["kind"] in WRITERS}
    output = next(n for n in saved["nodes"] if n["kind"] == "output")
    busy.add(output["position"] if output["position"] >= 0 else len(saved["tokens"]) - 1)
    idle = [p for p in range(len(saved["tokens"])) if p not in busy]
    assert idle and busy  # the graph has both kinds of column

    def columns():
        return driver.execute_script(
            "var L = window.ffbGraph.layout(); return [L.cols, Array.from(document.querySelectorAll("
            "'#ffb-graph [data-token]')).map(function (t) { return t.classList.contains('collapsed'); })];")

    widths, collapsed = columns()
    assert [p for p, c in enumerate(collapsed) if c] == idle
    assert max(widths[p] for p in idle) < min(widths[p] for p in busy)
    driver.find_element("css selector", f'#ffb-graph [data-token="{idle[0]}"]').click()
    wider, collapsed = columns()
    assert not collapsed[idle[0]] and wider[idle[0]] > widths[idle[0]]
    driver.find_element("css selector", f'#ffb-graph [data-token="{idle[0]}"]').click()  # and back
    assert columns()[1][idle[0]]


def test_a_supernodes_edges_are_the_sums_of_its_members(pages, browser):
    path, saved = pages["heads"]
    driver = _open(browser, path)
    output = next(n["id"] for n in saved["nodes"] if n["kind"] == "output")
    links = [link for link in saved["links"] if "kind" not in link]
    # two writers that both send to the output and share a source
    writers = [n["id"] for n in saved["nodes"] if n["kind"] in WRITERS]
    into = {w: {link["source"]: link["weight"] for link in links if link["target"] == w} for w in writers}
    pair = next((a, b) for a in writers for b in writers if a < b and set(into[a]) & set(into[b])
                and any(link["source"] == a and link["target"] == output for link in links)
                and any(link["source"] == b and link["target"] == output for link in links))
    # through the page: pin both, name the supernode, press group
    for member in pair:
        driver.execute_script(f"window.ffbGraph.pin({json.dumps(member)})")
    driver.find_element("id", "ffb-group-name").send_keys("my circuit")
    driver.find_element("id", "ffb-group").click()
    group = driver.execute_script("return document.body.dataset.chosen")
    assert group not in writers
    drawn = _circles(driver)
    assert group in drawn and not set(pair) & set(drawn)
    assert driver.execute_script(f"return window.ffbGraph.label({json.dumps(group)})") == "my circuit"
    label = driver.find_element("css selector", f'#ffb-graph [data-label="{group}"]').text
    assert label == "my circuit"
    edges = {(e["source"], e["target"]): e["weight"] for e in driver.execute_script("return window.ffbGraph.edgeList()")}
    summed = sum(link["weight"] for link in links if link["source"] in pair and link["target"] == output)
    assert edges[(group, output)] == pytest.approx(summed, rel=1e-9, abs=1e-12)
    for source in set(into[pair[0]]) | set(into[pair[1]]):
        if source in pair:
            continue
        expected = into[pair[0]].get(source, 0.0) + into[pair[1]].get(source, 0.0)
        assert edges[(source, group)] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert not any(pair[0] in key or pair[1] in key for key in edges)
    assert "my circuit" in driver.find_element("css selector", "[data-role=details]").text
    # the API does the same; ungrouping restores the members
    other = driver.execute_script(f"return window.ffbGraph.group({json.dumps(list(pair))}, 'again')")
    assert other and other != group and "my circuit" not in driver.execute_script(
        "return Array.from(document.querySelectorAll('#ffb-graph [data-label]')).map(function (t) { return t.textContent; })")
    assert driver.execute_script(f"return window.ffbGraph.ungroup({json.dumps(other)})") is True
    assert set(pair) <= set(_circles(driver))


def test_the_threshold_sliders_re_prune_in_the_page(pages, browser):
    from selenium.webdriver.common.keys import Keys

    path, saved = pages["heads"]
    driver = _open(browser, path)
    every = driver.execute_script("return window.ffbGraph.nodes()")
    assert every == len(saved["nodes"])
    slider = driver.find_element("id", "ffb-node-share")
    for _ in range(60):  # as a person would: the arrow keys, one step of 1% each
        slider.send_keys(Keys.ARROW_LEFT)
    fewer = driver.execute_script("return window.ffbGraph.nodes()")
    assert driver.find_element("id", "ffb-node-share-text").text == "40%"
    assert fewer < every
    tokens = sum(1 for n in saved["nodes"] if n["kind"] in ("token", "bias", "output"))
    shown = set(_circles(driver))
    assert {n["id"] for n in saved["nodes"] if n["kind"] in ("token", "bias", "output")} <= shown
    assert fewer > tokens
    # the writers kept are those of largest influence
    writers = sorted((n for n in saved["nodes"] if n["kind"] in WRITERS), key=lambda n: -abs(n["influence"]))
    kept = [n["id"] for n in writers if n["id"] in shown]
    assert kept and kept[0] == writers[0]["id"]
    assert str(fewer) in driver.find_element("id", "ffb-counts").text
    # edges: the slider keeps the largest ones
    everything = driver.execute_script("return window.ffbGraph.threshold(1, 1)")
    assert everything["nodes"] == every
    few = driver.execute_script("return window.ffbGraph.threshold(1, 0.5)")
    assert few["edges"] < everything["edges"]
    weights = sorted((abs(e["weight"]) for e in driver.execute_script("return window.ffbGraph.edgeList()")), reverse=True)
    largest = max(abs(link["weight"]) for link in saved["links"] if "kind" not in link)
    assert weights[0] == pytest.approx(largest)
    assert driver.execute_script("return window.ffbGraph.threshold(1, 1)") == everything


def test_search_finds_a_token_and_enter_selects_it(pages, browser):
    from selenium.webdriver.common.keys import Keys

    path, saved = pages["heads"]
    driver = _open(browser, path)
    words = [display_token(t) for t in saved["tokens"]]
    others = [n for n in saved["nodes"] if n["kind"] != "token"]
    position = next(p for p, w in enumerate(words) if sum(w in x for x in words) == 1 and not any(
        w in n["id"] or w in expected_label(n, saved["tokens"]) for n in others if n["kind"] in WRITERS)
        and not any(w in n["id"] for n in saved["nodes"]))
    token = next(n["id"] for n in saved["nodes"] if n["kind"] == "token" and n["position"] == position)
    box = driver.find_element("id", "ffb-search")
    box.send_keys(words[position])
    assert driver.execute_script("return Array.from(document.querySelectorAll('#ffb-graph [data-token].match'))"
                                 ".map(function (t) { return +t.dataset.token; })") == [position]
    assert driver.execute_script("return Array.from(document.querySelectorAll('#ffb-graph .node.match'))"
                                 ".map(function (c) { return c.dataset.node; })") == [token]
    box.send_keys(Keys.ENTER)
    assert driver.execute_script("return document.body.dataset.chosen") == token
    head = next(n for n in saved["nodes"] if n["kind"] == "head")
    assert head["id"] in driver.execute_script(f"return window.ffbGraph.search({json.dumps(head['id'])})")


def test_the_size_toggle_sizes_nodes_by_patch_estimate(pages, browser):
    from selenium.webdriver.support.select import Select

    path, saved = pages["heads"]
    driver = _open(browser, path)
    before = _circles(driver)
    Select(driver.find_element("id", "ffb-size")).select_by_value("patch")
    after = _circles(driver)
    writers = [n for n in saved["nodes"] if n["kind"] in WRITERS]
    assert any(before[n["id"]][2] != after[n["id"]][2] for n in writers)
    assert {k: v[:2] for k, v in before.items()} == {k: v[:2] for k, v in after.items()}  # nothing moves
    ordered = sorted(writers, key=lambda n: abs(n["patch_estimate"]))
    radii = [after[n["id"]][2] for n in ordered]
    assert radii == sorted(radii)
    ordered = sorted(writers, key=lambda n: abs(n["value"]))
    assert [before[n["id"]][2] for n in ordered] == sorted(before[n["id"]][2] for n in ordered)
    assert driver.execute_script("return window.ffbGraph.size('value')") == "value"
    assert _circles(driver) == before
    # a graph without patching estimates does not offer the toggle
    _open(driver, pages["neurons"][0])
    assert not driver.find_element("id", "ffb-size").is_displayed()


def test_the_size_toggle_sizes_edges_by_their_patch_estimate(pages, browser):
    """With patching estimates, the graph's links carry the edges' (``patch_estimate``); the
    size toggle then draws each edge as wide as its |patch estimate| (the bias's edges, which
    have none, keep their weight)."""
    from selenium.webdriver.support.select import Select

    from captum_ffb.patching.patches import DEFAULT_EDGE_ESTIMATOR, DEFAULT_ESTIMATOR

    path, saved = pages["heads"]
    driver = _open(browser, path)
    assert any("patch_estimate" in link for link in saved["links"])
    # the page names the estimators behind the estimates
    assert saved["patch_estimators"] == {"nodes": DEFAULT_ESTIMATOR, "edges": DEFAULT_EDGE_ESTIMATOR}
    option = driver.find_element("css selector", "#ffb-size option[value=patch]").get_attribute("textContent")
    assert option == f"|patch estimate| (nodes: {DEFAULT_ESTIMATOR}, edges: {DEFAULT_EDGE_ESTIMATOR})"

    def widths():
        return {(s, t): w for s, t, w in driver.execute_script(
            "var o = []; document.querySelectorAll('#ffb-graph path.edge').forEach(function (p) {"
            " o.push([p.dataset.source, p.dataset.target, +p.getAttribute('stroke-width')]); }); return o;")}

    def ordered(by):
        drawn = widths()
        pairs = sorted((abs(e[by]), drawn[(e["source"], e["target"])]) for e in
                       driver.execute_script("return window.ffbGraph.edgeList()") if e.get(by) is not None)
        return [w for _, w in pairs]

    before = ordered("weight")
    assert before == sorted(before)
    Select(driver.find_element("id", "ffb-size")).select_by_value("patch")
    after = ordered("patch")
    assert after and after == sorted(after) and widths() != {}
    assert driver.execute_script("return window.ffbGraph.size('value')") == "value"
    assert ordered("weight") == before


def test_zoom_and_pan_change_the_view_box_and_fit_restores_it(pages, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.wheel_input import ScrollOrigin

    path, _ = pages["heads"]
    driver = _open(browser, path)

    def view_box():
        return driver.execute_script("return window.ffbGraph.viewBox()")

    start = view_box()
    driver.find_element("id", "ffb-zoom-in").click()
    zoomed = view_box()
    assert zoomed[2] < start[2] and zoomed[3] < start[3]
    stage = driver.find_element("id", "ffb-stage")
    ActionChains(driver).scroll_from_origin(ScrollOrigin.from_element(stage), 0, -200).perform()
    wheeled = view_box()
    assert wheeled[2] < zoomed[2]
    # drag the background (the top-left corner of the stage holds no node)
    ActionChains(driver).move_to_element_with_offset(stage, -stage.size["width"] // 2 + 30, stage.size["height"] // 2 - 8) \
        .click_and_hold().move_by_offset(120, -60).release().perform()
    panned = view_box()
    assert panned[0] < wheeled[0] and panned[1] > wheeled[1] and panned[2] == pytest.approx(wheeled[2])
    driver.find_element("id", "ffb-fit").click()
    assert view_box() == pytest.approx(start)


def test_the_page_requests_nothing(pages, browser):
    path, _ = pages["heads"]
    text = path.read_text(encoding="utf-8")
    for pattern in ("://", "src=", "href=", "url(", "@import", "fetch(", "XMLHttpRequest", "http", "@font-face"):
        assert pattern not in text, pattern
    driver = _open(browser, path)
    browser.get_log("performance")  # what loading the page left there is read below with the rest
    driver.get(path.as_uri())
    driver.execute_script("window.ffbGraph.choose(window.ffbGraph.data.nodes[0].id); window.ffbGraph.zoom(2);"
                          "window.ffbGraph.threshold(0.5); window.ffbGraph.search('L0');")
    time.sleep(0.3)
    requested = set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requested.add(message["params"]["request"]["url"])
    assert requested <= {path.as_uri()}, requested
