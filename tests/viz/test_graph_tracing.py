"""The graph viewer traces paths (``viz.graph_html``), opened in headless Chromium at 1600×1000
and 1280×800 on the tiny Llama's graphs of ``test_graph_page``: hovering a node lights its
paths two hops and more deep, weighted; the pinned nodes open in a subgraph panel beside the
graph where they can be dragged; every filter fits the view again; the sliders keep a share
of what remains and never cut a shown node off the output; the state (pins, supernodes,
thresholds, the chosen node, labels, the panel) round-trips through the address's fragment,
and a fragment from a stranger is read safely; labels say what a node writes and can be
renamed; the search finds the nodes at a token's position; edge lists expand; the card stays
off the details panel; the estimator behind the sizes is named."""

from __future__ import annotations

import json

import pytest

from tests.viz.test_graph_page import SIZES, WRITERS, _open

pytestmark = pytest.mark.browser

BOX = """
function box(e) { var b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; }
"""


def _lit(driver) -> list[tuple[str, str, int]]:
    return [tuple(x) for x in driver.execute_script(
        "return Array.from(document.querySelectorAll('#ffb-graph .edge.hot')).map(function (p) {"
        " return [p.dataset.source, p.dataset.target, +p.dataset.hops]; })")]


def _rank(node: dict) -> float:
    if node["kind"] in ("token", "bias"):
        return -1
    if node["kind"] == "output":
        return float("inf")
    return node["layer"] * 3 + (2 if node["kind"] in ("ff", "neuron") else 1 if node["kind"] == "cross_attention" else 0)


def path_flows(saved: dict, start: str) -> dict[tuple[str, str], float]:
    """Per edge, the share of ``start``'s paths along it, computed here from the graph's links:
    downstream each node passes on what reached it in proportion to its out-edges' |weight|,
    upstream in proportion to its in-edges'."""
    nodes = {n["id"]: n for n in saved["nodes"]}
    links = [x for x in saved["links"] if "kind" not in x]
    flows: dict[tuple[str, str], float] = {}
    for forward in (True, False):
        near, far = ("source", "target") if forward else ("target", "source")
        total: dict[str, float] = {}
        for x in links:
            total[x[near]] = total.get(x[near], 0.0) + abs(x["weight"])
        got = {start: 1.0}
        order = sorted(links, key=lambda x: _rank(nodes[x[near]]), reverse=not forward)
        for x in order:
            if got.get(x[near]):
                part = got[x[near]] * abs(x["weight"]) / total[x[near]]
                flows[(x["source"], x["target"])] = flows.get((x["source"], x["target"]), 0.0) + part
                got[x[far]] = got.get(x[far], 0.0) + part
    return flows


def _middle(saved: dict) -> dict:
    """A writer of block 1 (edges in from writers of block 0, out to the output)."""
    return max((n for n in saved["nodes"] if n["kind"] in WRITERS and n["layer"] == 1), key=lambda n: abs(n["value"]))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_hover_lights_the_paths_two_hops_deep_and_the_card_stays_off_the_panel(pages, browser, size):
    from selenium.webdriver.common.action_chains import ActionChains

    path, saved = pages["heads"]
    driver = _open(browser, path, size)
    writers = [n for n in saved["nodes"] if n["kind"] in WRITERS]
    flows = {n["id"]: path_flows(saved, n["id"]) for n in writers}

    def reach(node: dict) -> float:  # its largest share along an edge not its own
        return max((f for (s, t), f in flows[node["id"]].items() if node["id"] not in (s, t)), default=0.0)

    node = max((n for n in writers if n["layer"] == 1), key=reach)
    assert reach(node) >= 0.02
    circle = driver.find_element("css selector", f'#ffb-graph [data-node="{node["id"]}"]')
    ActionChains(driver).move_to_element(circle).perform()
    lit = _lit(driver)
    expected = {edge for edge, f in flows[node["id"]].items() if f >= 0.02}
    assert {(s, t) for s, t, _ in lit} == expected  # the paths this test computes, lit and no other edge
    assert any(h >= 2 for *_, h in lit) and all((h >= 2) == (node["id"] not in (s, t)) for s, t, h in lit)
    assert any(t == node["id"] for _, t, _ in lit) and any(s == node["id"] for s, _, _ in lit)
    # weighted: what flows down from the node all reaches the output, what flows up all comes
    # from the tokens and the bias (every edge of the unpruned graph is drawn)
    shares = driver.execute_script(f"return window.ffbGraph.paths({json.dumps(node['id'])}).share")
    assert shares["output"] == pytest.approx(1.0, abs=1e-9)
    sources = [n["id"] for n in saved["nodes"] if n["kind"] in ("token", "bias")]
    assert sum(shares.get(k, 0.0) for k in sources) == pytest.approx(1.0, abs=1e-9)
    dimmed = driver.execute_script("return Array.from(document.querySelectorAll('#ffb-graph .node.dim'))"
                                   ".map(function (c) { return c.dataset.node; })")
    assert node["id"] not in dimmed and all(s not in dimmed for s, _, _ in lit)
    card, panel = driver.execute_script(BOX + "return [box(document.getElementById('ffb-card')),"
                                        " box(document.querySelector('[data-role=details]'))]")
    assert card[2] <= panel[0] + 0.5, (card, panel)
    stage = driver.find_element("id", "ffb-stage")  # off the node: the stage's empty top-left corner
    ActionChains(driver).move_to_element_with_offset(stage, -stage.size["width"] // 2 + 6, -stage.size["height"] // 2 + 40).perform()
    assert driver.execute_script("return document.querySelectorAll('#ffb-graph .edge.hot').length") == 0


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_subgraph_panel_sits_beside_the_graph_and_its_nodes_drag(pages, browser, size):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    path, saved = pages["heads"]
    driver = _open(browser, path, size)
    ranked = sorted((n for n in saved["nodes"] if n["kind"] in WRITERS), key=lambda n: -abs(n["value"]))
    chosen = [ranked[0]["id"], ranked[1]["id"], _middle(saved)["id"]]
    for node in dict.fromkeys(chosen):
        element = driver.find_element("css selector", f'#ffb-graph [data-node="{node}"]')
        ActionChains(driver).key_down(Keys.SHIFT).click(element).key_up(Keys.SHIFT).perform()
    stage_before = driver.execute_script(BOX + "return box(document.getElementById('ffb-stage'))")
    driver.find_element("id", "ffb-sub-view").click()
    sub, stage, panel = driver.execute_script(BOX + "return [box(document.getElementById('ffb-subgraph')),"
                                              " box(document.getElementById('ffb-stage')),"
                                              " box(document.querySelector('[data-role=details]'))]")
    assert stage[2] <= sub[0] + 0.5 and sub[2] <= panel[0] + 0.5 and sub[2] - sub[0] >= 240
    assert sub[3] <= size[1] and stage[2] < stage_before[2]  # beside: the stage gave it room
    pinned = set(dict.fromkeys(chosen))
    circles = driver.execute_script("var o = {}; document.querySelectorAll('#ffb-subgraph [data-sub-node]')"
                                    ".forEach(function (c) { var b = c.getBoundingClientRect();"
                                    " o[c.dataset.subNode] = [b.left + b.width / 2, b.top + b.height / 2]; }); return o;")
    assert set(circles) == pinned
    assert all(sub[0] <= x <= sub[2] and sub[1] <= y <= sub[3] for x, y in circles.values())
    between = {(link["source"], link["target"]) for link in saved["links"]
               if "kind" not in link and link["source"] in pinned and link["target"] in pinned}
    drawn = driver.execute_script("return Array.from(document.querySelectorAll('#ffb-subgraph .edge'))"
                                  ".map(function (p) { return [p.dataset.source, p.dataset.target]; })")
    assert {tuple(e) for e in drawn} == between
    # drag one node 60 px right and 40 px down: it follows the pointer, and its place is kept
    moved = chosen[0]
    element = driver.find_element("css selector", f'#ffb-subgraph [data-sub-node="{moved}"]')
    ActionChains(driver).click_and_hold(element).move_by_offset(30, 20).move_by_offset(30, 20).release().perform()
    x, y = driver.execute_script(
        f"var b = document.querySelector('#ffb-subgraph [data-sub-node=\"{moved}\"]').getBoundingClientRect();"
        " return [b.left + b.width / 2, b.top + b.height / 2];")
    assert x == pytest.approx(circles[moved][0] + 60, abs=2) and y == pytest.approx(circles[moved][1] + 40, abs=2)
    assert moved in driver.execute_script("return window.ffbGraph.state().places")
    assert driver.execute_script("return document.body.dataset.chosen") != moved  # a drag is not a click
    driver.find_element("id", "ffb-sub-reset").click()
    assert "places" not in driver.execute_script("return window.ffbGraph.state()")
    driver.find_element("id", "ffb-sub-view").click()
    assert not driver.find_element("id", "ffb-sub").is_displayed()


REACHES = """
var edges = window.ffbGraph.edgeList(), shown = Array.from(document.querySelectorAll('#ffb-graph [data-node]'))
  .map(function (c) { return c.dataset.node; });
function closure(start, forward) {
  var seen = {}, stack = start.slice();
  start.forEach(function (s) { seen[s] = 1; });
  while (stack.length) { var at = stack.pop(); edges.forEach(function (e) {
    var a = forward ? e.source : e.target, b = forward ? e.target : e.source;
    if (a === at && !seen[b]) { seen[b] = 1; stack.push(b); } }); }
  return seen;
}
var toOutput = closure(['output'], false), fromTokens = closure(shown.filter(function (id) {
  return id.indexOf('token@') === 0 || id === 'bias'; }), true);
return {shown: shown, cut_off: shown.filter(function (id) { return !toOutput[id]; }),
        unfed: shown.filter(function (id) { return !fromTokens[id]; }), edges: edges.length};
"""


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_sliders_keep_a_share_of_what_remains_and_never_cut_a_node_off_the_output(pages, browser, size):
    from selenium.webdriver.common.keys import Keys

    path, saved = pages["heads"]
    driver = _open(browser, path, size)
    tokens = {n["id"] for n in saved["nodes"] if n["kind"] in ("token", "bias")}
    for slider, steps in (("ffb-node-share", 90), ("ffb-edge-share", 90)):
        element = driver.find_element("id", slider)
        for _ in range(steps):  # as a person would: one step of 1% each
            element.send_keys(Keys.ARROW_LEFT)
    assert driver.find_element("id", "ffb-node-share-text").text == "10%"
    assert driver.find_element("id", "ffb-edge-share-text").text == "10%"
    found = driver.execute_script(REACHES)
    writers = [k for k in found["shown"] if k not in tokens and k != "output"]
    assert writers, "10% of the influence keeps at least its largest writer"
    top = max((n for n in saved["nodes"] if n["kind"] in WRITERS), key=lambda n: abs(n["influence"]))
    assert top["id"] in writers
    assert [k for k in found["cut_off"] if k not in tokens] == []  # every writer reaches the output
    assert [k for k in found["unfed"] if k != "output" and k not in tokens] == []  # and is fed
    # the edges slider keeps, into every node, its largest in-edge at least
    driver.execute_script("window.ffbGraph.threshold(1, 0.6)")
    found = driver.execute_script(REACHES)
    kept = driver.execute_script("return window.ffbGraph.edgeList()")
    fed = {e["target"] for e in kept}
    receiving = {link["target"] for link in saved["links"] if "kind" not in link}
    assert receiving <= fed and found["cut_off"] == [k for k in found["cut_off"] if k in tokens]
    # 60% of what flows into each node, not of all |weight|: far more than a handful of edges
    assert found["edges"] >= len(receiving) and found["edges"] < sum(1 for x in saved["links"] if "kind" not in x)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_view_is_fitted_again_after_every_filter(pages, browser, size):
    path, saved = pages["heads"]
    driver = _open(browser, path, size)
    drawn = BOX + """
    var parts = Array.from(document.querySelectorAll('#ffb-graph [data-node], #ffb-graph [data-label], #ffb-graph [data-token], #ffb-graph .rowlabel'));
    var b = parts.map(box), s = box(document.getElementById('ffb-stage'));
    return {stage: s, box: [Math.min.apply(null, b.map(function (x) { return x[0]; })), Math.min.apply(null, b.map(function (x) { return x[1]; })),
            Math.max.apply(null, b.map(function (x) { return x[2]; })), Math.max.apply(null, b.map(function (x) { return x[3]; }))]};
    """
    pinned = sorted((n for n in saved["nodes"] if n["kind"] in WRITERS), key=lambda n: -abs(n["value"]))[:2]
    for step in ("window.ffbGraph.threshold(0.1, 0.1)",
                 "window.ffbGraph.threshold(1, 1); " + "".join(f"window.ffbGraph.pin({json.dumps(n['id'])});" for n in pinned)
                 + "window.ffbGraph.showPinned(true)"):
        driver.execute_script(step)
        found = driver.execute_script(drawn)
        stage, box = found["stage"], found["box"]
        assert box[0] >= stage[0] - 1 and box[2] <= stage[2] + 1 and box[1] >= stage[1] - 1 and box[3] <= stage[3] + 1
        filled = max((box[2] - box[0]) / (stage[2] - stage[0]), (box[3] - box[1]) / (stage[3] - stage[1]))
        scale = (stage[2] - stage[0]) / driver.execute_script("return window.ffbGraph.viewBox()")[2]
        assert filled >= 0.9 or scale >= 1.99, (step, found, scale)  # it fills the stage, or is shown at twice its size


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_state_round_trips_through_the_address(pages, browser, size):
    path, saved = pages["heads"]
    driver = _open(browser, path, size)
    ranked = sorted((n["id"] for n in saved["nodes"] if n["kind"] in WRITERS), key=lambda k: k)
    name = '<b id="x">movers</b>'
    state = driver.execute_script(f"""
        var g = window.ffbGraph, ids = {json.dumps(ranked)};
        g.pin(ids[0]); g.pin(ids[1]);
        g.group([ids[2], ids[3]], {json.dumps(name)});
        g.threshold(0.7, 0.8); g.size("patch"); g.rename(ids[4], "name mover"); g.subgraph(true);
        g.choose(ids[5]);
        return g.state();""")
    assert state["pinned"] == [ranked[0], ranked[1]] and state["supernodes"] == [[name, [ranked[2], ranked[3]]]]
    assert (state["nodes"], state["edges"], state["size"], state["chosen"]) == (0.7, 0.8, "patch", ranked[5])
    assert state["labels"] == {ranked[4]: "name mover"} and state["subgraph"] is True
    url = driver.execute_script("return window.ffbGraph.address()")
    assert url.startswith(path.as_uri() + "#state=")
    driver.get("about:blank")
    _open(driver, path, size)  # a fresh page has no state
    assert driver.execute_script("return window.ffbGraph.state()") == {}
    driver.get(url)
    driver.refresh()
    assert driver.execute_script("return window.ffbGraph.state()") == state
    assert driver.execute_script("return document.body.dataset.chosen") == ranked[5]
    assert driver.find_element("id", "ffb-node-share-text").text == "70%"
    assert driver.execute_script("return document.querySelectorAll('#x').length") == 0  # the name is text
    labels = driver.execute_script("return Array.from(document.querySelectorAll('#ffb-graph [data-label]'))"
                                   ".map(function (t) { return t.textContent; })")
    assert "name mover" in labels and name in labels


@pytest.mark.parametrize("fragment", [
    "#state=not-json", "#state=%5B1%2C2%5D", "#state=" + json.dumps({"pinned": ["nope", 3, None], "nodes": "x", "edges": 1e300,
                                                                    "size": "<script>", "chosen": {"a": 1}, "labels": [],
                                                                    "supernodes": [["g", ["nope"]], 5], "places": {"x": [1]}}),
    "#state=" + json.dumps({"labels": {"output": "no"}, "nodes": -5, "edges": 7, "pinned": ["bias"]}),
], ids=["not-json", "a-list", "wrong-types", "out-of-range"])
def test_a_strangers_fragment_is_read_safely(pages, browser, fragment):
    path, _ = pages["heads"]
    driver = _open(browser, path)
    every = driver.execute_script("return window.ffbGraph.nodes()")
    driver.get(path.as_uri() + fragment)
    driver.refresh()
    assert driver.execute_script("return document.body.dataset.state") == "drawn"
    state = driver.execute_script("return window.ffbGraph.state()")
    assert set(state) <= {"pinned", "nodes", "edges"}
    assert state.get("pinned", []) in ([], ["bias"])
    assert 0 <= state.get("nodes", 1) <= 1 and 0 <= state.get("edges", 1) <= 1
    if "nodes" not in state:
        assert driver.execute_script("return window.ffbGraph.nodes()") == every
    assert driver.get_log("browser") == []


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_labels_say_what_a_node_writes_and_can_be_renamed(pages, browser, size):
    from selenium.webdriver.common.keys import Keys

    path, saved = pages["heads"]
    driver = _open(browser, path, size)
    writers = [n for n in saved["nodes"] if n["kind"] in WRITERS]
    assert writers and all(len(n["promotes"]) == 5 and len(n["suppresses"]) == 5 for n in writers)
    labels = driver.execute_script(
        "var W = innerWidth, H = innerHeight, o = {}; document.querySelectorAll('#ffb-graph [data-label]')"
        ".forEach(function (t) { var b = t.getBoundingClientRect();"
        " o[t.dataset.label] = [t.textContent, b.left >= 0 && b.top >= 0 && b.right <= W && b.bottom <= H]; }); return o;")
    for node in writers:
        text, inside = labels[node["id"]]
        assert "↑" + node["promotes"][0] in text and inside, (node["id"], text)
    node = _middle(saved)
    driver.execute_script(f"window.ffbGraph.choose({json.dumps(node['id'])})")
    panel = driver.find_element("css selector", "[data-role=details]")
    assert "writes" in panel.text and all(t in panel.text for t in node["promotes"] + node["suppresses"])
    box = panel.find_element("css selector", "input[data-act=name]")
    box.send_keys("previous-token head", Keys.ENTER)
    label = driver.execute_script(f"return document.querySelector('#ffb-graph [data-label=\"{node['id']}\"]').textContent")
    assert label == "previous-token head"
    assert driver.execute_script("return window.ffbGraph.state().labels") == {node["id"]: "previous-token head"}
    place = driver.execute_script(f"return window.ffbGraph.label({json.dumps(node['id'])})")
    assert driver.execute_script(f"return window.ffbGraph.rename({json.dumps(node['id'])}, '')") == \
        f"{place} ↑{node['promotes'][0]}"  # an empty name gives the lens's label back


def test_search_finds_every_node_at_a_tokens_position(pages, browser):
    from selenium.webdriver.common.keys import Keys

    path, saved = pages["heads"]
    driver = _open(browser, path)
    at = {}
    for n in saved["nodes"]:
        if n["kind"] in WRITERS:
            at.setdefault(n["position"], []).append(n)
    position = max(at, key=lambda p: len(at[p]))
    expected = {n["id"] for n in at[position]} | {f"token@{position}"}
    for query in (f"@{position}", f"pos {position}"):
        assert set(driver.execute_script(f"return window.ffbGraph.search({json.dumps(query)})")) == expected, query
    # a bare number is a position and a token's text (the tiny vocabulary's words are numbers)
    words = {p for p, t in enumerate(saved["tokens"]) if str(position) in t}
    found = set(driver.execute_script(f"return window.ffbGraph.search({json.dumps(str(position))})"))
    assert found == expected | {n["id"] for n in saved["nodes"] if n["position"] in words and n["kind"] != "output"}
    driver.execute_script(f"window.ffbGraph.search({json.dumps('@' + str(position))})")
    rung = driver.execute_script("return Array.from(document.querySelectorAll('#ffb-graph .node.match'))"
                                 ".map(function (c) { return c.dataset.node; })")
    assert set(rung) == expected
    assert driver.execute_script("return Array.from(document.querySelectorAll('#ffb-graph [data-token].match'))"
                                 ".map(function (t) { return +t.dataset.token; })") == [position]
    box = driver.find_element("id", "ffb-search")
    box.clear()
    box.send_keys(f"@{position}", Keys.ENTER)  # Enter chooses the strongest writer there
    strongest = max(at[position], key=lambda n: abs(n["influence"]))
    assert driver.execute_script("return document.body.dataset.chosen") == strongest["id"]


def test_edge_lists_expand_and_the_estimator_is_named(pages, browser):
    path, saved = pages["heads"]
    driver = _open(browser, path)
    node = max((n for n in saved["nodes"] if n["kind"] in WRITERS),
               key=lambda n: sum(1 for x in saved["links"] if x["target"] == n["id"] and "kind" not in x))
    count = sum(1 for x in saved["links"] if x["target"] == node["id"] and "kind" not in x)
    assert count > 15
    driver.execute_script(f"window.ffbGraph.choose({json.dumps(node['id'])})")
    listed = "return document.querySelectorAll('[data-role=details] ol[data-list=in] li').length"
    assert driver.execute_script(listed) == 15
    driver.find_element("css selector", "[data-role=details] button[data-list=in]").click()
    assert driver.execute_script(listed) == count
    driver.find_element("css selector", "[data-role=details] button[data-list=in]").click()
    assert driver.execute_script(listed) == 15
    named = saved["patch_estimators"]
    assert "exact edge weights" in driver.find_element("id", "ffb-counts").text
    driver.execute_script("window.ffbGraph.size('patch')")
    counts = driver.find_element("id", "ffb-counts").text
    assert f"by {named['nodes']}" in counts
    panel = driver.find_element("css selector", "[data-role=details]").text
    assert f"patch estimate ({named['nodes']})" in panel


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_several_outputs_are_drawn_as_logit_nodes_under_the_output(pages, browser, size):
    from selenium.webdriver.common.action_chains import ActionChains

    path, saved = pages["several"]
    driver = _open(browser, path, size)
    logits = [n for n in saved["nodes"] if n["kind"] == "logit"]
    assert len(logits) == 4
    found = driver.execute_script(BOX + """
        var W = innerWidth, H = innerHeight, o = {};
        document.querySelectorAll('#ffb-graph [data-node]').forEach(function (c) {
          var b = box(c), t = document.querySelector('#ffb-graph [data-label="' + c.dataset.node + '"]');
          o[c.dataset.node] = {box: b, label: t ? t.textContent : null, labelBox: t ? box(t) : null}; });
        return o;""")
    width, height = size

    def inside(b: list[float]) -> bool:
        return b[0] >= 0 and b[1] >= 0 and b[2] <= width and b[3] <= height

    output = found["output"]["box"]
    for node in logits:
        drawn = found[node["id"]]
        assert inside(drawn["box"]) and inside(drawn["labelBox"])
        word = json.dumps(node["token"]) if "token" in node else f"#{node['token_id']}"  # no tokenizer here
        assert drawn["label"] == f'{word} p={node["probability"]:.2f}'
        assert output[3] < drawn["box"][1]  # below the output, above the writers
        writers = [found[n["id"]]["box"] for n in saved["nodes"] if n["kind"] in WRITERS and n["id"] in found]
        assert all(drawn["box"][3] < b[1] for b in writers)
    labels = [found[n["id"]]["labelBox"] for n in logits]
    for i, a in enumerate(labels):  # side by side, their labels apart
        for b in labels[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
    edges = driver.execute_script("return window.ffbGraph.edgeList()")
    ids = {n["id"] for n in logits}
    assert {e["source"] for e in edges if e["target"] == "output"} <= ids | {"bias"}
    assert all(any(e["target"] == k for e in edges) for k in ids)
    top = max(logits, key=lambda n: n["value"])
    ActionChains(driver).move_to_element(driver.find_element("css selector", f'#ffb-graph [data-node="{top["id"]}"]')).perform()
    lit = {(s, t) for s, t, _ in _lit(driver)}
    assert lit == {edge for edge, f in path_flows(saved, top["id"]).items() if f >= 0.02}
    assert (top["id"], "output") in lit and any(t == top["id"] for _, t in lit)
    assert all(t != "output" or s == top["id"] for s, t in lit)  # the other logits' edges stay dark


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_large_graph_opens_with_its_labels_legible(pages, browser, tmp_path, size):
    """A graph of 181 nodes (the tiny Llama's neurons, unpruned by influence) drawn whole would
    shrink its labels below 9 px: it opens with the largest node share that keeps them legible,
    says so, applies the rule again when the subgraph panel narrows the stage (a pinned node stays
    drawn), and the nodes slider at 100% shows it all, a choice the panel then keeps."""
    from captum_ffb import NormDecomposition
    from captum_ffb.viz.graph import graph_html
    from tests.models import tiny_task_model, token_ids

    graph = NormDecomposition(tiny_task_model("llama", "causal_lm")).attribute_graph(
        token_ids(1, 20, seed=3), 5, granularity="neuron", node_threshold=1.0)
    saved = graph.to_dict()
    path = tmp_path / "many.html"
    path.write_text(graph_html(graph, query_key={}), encoding="utf-8")
    driver = _open(browser, path, size)

    def label_px() -> float:  # the labels' 11 px at the view's scale
        width = driver.execute_script("return document.getElementById('ffb-stage').clientWidth")
        return 11 * width / driver.execute_script("return window.ffbGraph.viewBox()")[2]

    assert label_px() >= 9 - 1e-6
    shown = driver.execute_script("return window.ffbGraph.nodes()")
    assert shown < len(saved["nodes"]) and "labels kept legible" in driver.find_element("id", "ffb-counts").text
    assert float(driver.find_element("id", "ffb-node-share").get_attribute("value")) < 1
    top = max((n for n in saved["nodes"] if n["kind"] in WRITERS), key=lambda n: abs(n["influence"]))
    assert driver.execute_script(f"return !!document.querySelector('#ffb-graph [data-node=\"{top['id']}\"]')")

    def share() -> float:
        return float(driver.find_element("id", "ffb-node-share").get_attribute("value"))

    def drawn(node: str) -> bool:
        return driver.execute_script(f"return !!document.querySelector('#ffb-graph [data-node=\"{node}\"]')")

    # the subgraph panel narrows the stage: the rule applies again, and a pinned node stays drawn
    weakest = min((n for n in saved["nodes"] if n["kind"] in WRITERS), key=lambda n: abs(n["influence"]))
    assert not drawn(weakest["id"])
    before = share()
    driver.execute_script(f"window.ffbGraph.pin({json.dumps(weakest['id'])}); window.ffbGraph.subgraph(true)")
    assert share() < before and label_px() >= 9 - 1e-6
    assert "labels kept legible" in driver.find_element("id", "ffb-counts").text and drawn(weakest["id"])
    driver.execute_script("window.ffbGraph.subgraph(false)")
    assert share() <= before and label_px() >= 9 - 1e-6  # at its width again (the pinned node drawn too)
    driver.execute_script("window.ffbGraph.threshold(1, 1)")
    assert driver.execute_script("return window.ffbGraph.nodes()") == len(saved["nodes"])
    assert label_px() < 9  # drawn whole, they would not have been legible
    assert "labels kept legible" not in driver.find_element("id", "ffb-counts").text
    driver.execute_script("window.ffbGraph.subgraph(true)")  # the user's share stays the user's
    assert share() == 1 and driver.execute_script("return window.ffbGraph.nodes()") == len(saved["nodes"])
