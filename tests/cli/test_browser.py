"""The HTML view written by ``captum-ffb maps``, opened in headless Chromium."""

import html
import json
import os
import re
import shutil
import subprocess

import pytest
import torch

from captum_ffb.cli import main
from captum_ffb.texts.text import ff_amplification
from tests.models import save_tiny

pytestmark = pytest.mark.browser

CHROMIUM = next(
    (shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)),
    None,
)
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--hide-scrollbars",
]

# Drives the page as a person would: click scope, overlay and layer controls, hover a cell.
DRIVER = """
<pre id="ffb-result"></pre>
<script>
window.addEventListener("load", function () {
  var v = window.ffbView, r = {}, c = document.getElementById("ffb-map");
  function click(selector) { document.querySelector(selector).click(); return v.signature(); }
  r.canvas = [c.width, c.height];
  r.tokens = Array.from(document.querySelectorAll("#ffb-tokens .token")).map(function (s) { return s.textContent; });
  r.scopes = Array.from(document.querySelectorAll("#ffb-scopes button")).map(function (b) { return b.dataset.scope; });
  r.thumbs = document.querySelectorAll("#ffb-thumbs canvas").length;
  r.start = [document.body.dataset.state, v.signature()];
  r.atb = click('#ffb-scopes button[data-scope="Atb"]');
  r.atbState = document.body.dataset.state;
  r.amp = click('#ffb-scopes button[data-scope="FF-amp"]');
  r.atbAgain = click('#ffb-scopes button[data-scope="Atb"]');
  r.overlay = click("#ffb-overlay");
  r.layer1 = click('#ffb-layers button[data-layer="1"]');
  r.final = document.body.dataset.state;
  var g = v.geometry(), box = c.getBoundingClientRect();
  c.dispatchEvent(new MouseEvent("mousemove", {
    clientX: box.left + g.left + g.cell * (1 + 0.5), clientY: box.top + g.top + g.cell * (2 + 0.5), bubbles: true
  }));
  r.tooltip = document.getElementById("ffb-tooltip").textContent;
  r.out = Array.from(document.querySelectorAll("#ffb-tokens .token.out")).map(function (s) { return s.dataset.index; });
  r.in = Array.from(document.querySelectorAll("#ffb-tokens .token.in")).map(function (s) { return s.dataset.index; });
  r.values = {};
  ["Atb", "AtbFf", "FF-amp"].forEach(function (s) {
    r.values[s] = [];
    for (var i = 0; i < g.n; i++) for (var j = 0; j < g.n; j++) r.values[s].push(v.value(1, s, i, j));
  });
  document.getElementById("ffb-result").textContent = JSON.stringify(r);
});
</script>
"""


def _js_format(v: float) -> str:
    """The page's number format: 3 significant digits, exponent outside [0.001, 1000)."""
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.001:
        mantissa, exponent = f"{v:.2e}".split("e")
        return f"{mantissa}e{int(exponent):+d}"
    return f"{v:#.3g}".rstrip(".") if "e" not in f"{v:#.3g}" else f"{v:.3g}"


def _chromium(*args, tmp_path):
    profile = tmp_path / "profile"
    command = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if CHROMIUM is None:
        message = "Chromium is not installed (apt-get install chromium); .ci/run installs it"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the browser test: {message}")
        pytest.skip(message)
    root = tmp_path_factory.mktemp("browser")
    model = save_tiny("bert", root / "model")
    code = main(["maps", "the cat sat on the mat .", "--model", str(model), "--out", str(root / "out"),
                 "--format", "html,json", "--quiet"])
    assert code == 0
    return root


def test_screenshot_shows_the_map(page, tmp_path):
    from PIL import Image

    shot = tmp_path / "view.png"
    _chromium("--window-size=1200,900", f"--screenshot={shot}", (page / "out" / "maps.html").as_uri(),
              tmp_path=tmp_path)
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 900)
    pixels = list(image.getdata())
    reds = sum(1 for r, g, b in pixels if r > 150 and g < 90 and b < 90)  # the map's dark cells
    assert reds > 500
    assert len(set(pixels)) > 50  # a rendered page, not a blank one


def test_dom_tokens_controls_hover_and_redraws(page, tmp_path):
    driven = page / "driven.html"
    driven.write_text(
        (page / "out" / "maps.html").read_text(encoding="utf-8").replace("</body>", DRIVER + "</body>"),
        encoding="utf-8",
    )
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", driven.as_uri(), tmp_path=tmp_path).stdout
    assert "<canvas" in dom
    found = re.search(r'<pre id="ffb-result">(.*?)</pre>', dom, re.S)
    assert found and found.group(1), "the page's script did not run"
    r = json.loads(html.unescape(found.group(1)))
    saved = json.loads((page / "out" / "maps.json").read_text())
    tokens = saved["tokens"]
    n = len(tokens)

    assert r["tokens"] == tokens and r["canvas"][0] > 100 and r["canvas"][1] > 100
    assert r["scopes"] == saved["scopes"] + ["FF-amp"] and r["thumbs"] == len(r["scopes"])
    assert r["start"][0] == "0|AtbFfResLn|0|0|none"
    # every control redraws the picture
    signatures = [r["start"][1], r["atb"], r["amp"], r["overlay"], r["layer1"]]
    assert len(set(signatures)) == len(signatures)
    assert r["atbAgain"] == r["atb"]  # the same state draws the same picture
    assert r["atbState"] == "0|Atb|0|0|none" and r["final"] == "1|Atb|1|0|none"
    # hover over output token 2, input token 1
    assert tokens[2] in r["tooltip"] and tokens[1] in r["tooltip"] and "FF-amp" in r["tooltip"]
    value = saved["layers"]["1"]["maps"]["Atb"][2][1]
    assert _js_format(value) in r["tooltip"]
    assert r["out"] == ["2"] and r["in"] == ["1"]
    # the page's maps and its own FF-amp match Python's
    for scope in ("Atb", "AtbFf"):
        expected = torch.tensor(saved["layers"]["1"]["maps"][scope])
        torch.testing.assert_close(torch.tensor(r["values"][scope]).reshape(n, n), expected)
    expected = ff_amplification(
        torch.tensor(saved["layers"]["1"]["maps"]["Atb"]), torch.tensor(saved["layers"]["1"]["maps"]["AtbFf"])
    )
    torch.testing.assert_close(torch.tensor(r["values"]["FF-amp"]).reshape(n, n), expected,
                               atol=1e-6, rtol=1e-5)


# Drives the explanation page: read the first token's colour, tick the first-token toggle,
# move the block slider of the whole-model tab.
EXPLAIN_DRIVER = """
<pre id="ffb-result"></pre>
<script>
window.addEventListener("load", function () {
  var r = {};
  function tokens() { return Array.from(document.querySelectorAll("#rows .tok")); }
  r.labels = tokens().map(function (s) { return s.textContent; });
  r.before = tokens().map(function (s) { return s.style.background; });
  r.legend = document.querySelector("#rows .legend").textContent;
  var box = document.getElementById("nofirst"); box.checked = true; box.dispatchEvent(new Event("change"));
  r.after = tokens().map(function (s) { return s.style.background; });
  document.getElementById("tab-m").click();
  var c = document.getElementById("map");
  r.block0 = [c.dataset.block, c.toDataURL()];
  var g = window.ffbExplain.geometry(), box = c.getBoundingClientRect();
  r.geometry = g; r.canvas = [c.width, c.height]; r.mapHi = document.getElementById("map-hi").textContent;
  c.dispatchEvent(new MouseEvent("mousemove", {
    clientX: box.left + g.left + g.cell * 1.5, clientY: box.top + g.top + g.cell * 2.5, bubbles: true
  }));
  r.tip = document.getElementById("tip").textContent;
  var slider = document.getElementById("block"); slider.value = 1; slider.dispatchEvent(new Event("input"));
  r.block1 = [c.dataset.block, c.toDataURL()];
  r.blockname = document.getElementById("blockname").textContent;
  document.getElementById("ffb-result").textContent = JSON.stringify(r);
});
</script>
"""


def _drive_explain_page(tmp_path, driver: str, *options: str) -> tuple[dict, object]:
    """``captum-ffb explain`` on a tiny LM into ``tmp_path/out`` (with ``options``), its page
    opened in Chromium with the ``driver`` script: what the script found, and the out folder."""
    if CHROMIUM is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI must run the browser test: Chromium is not installed")
        pytest.skip("Chromium is not installed")
    from tests.models import save_tiny_lm

    model = save_tiny_lm(tmp_path / "model")
    out = tmp_path / "out"
    assert main(["explain", "the cat sat on the mat because", "--model", str(model), "--out", str(out),
                 "--format", "html,json", *options, "--quiet"]) == 0
    driven = tmp_path / "driven.html"
    driven.write_text((out / "explanation.html").read_text(encoding="utf-8").replace(
        "</body>", driver + "</body>"), encoding="utf-8")
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", driven.as_uri(), tmp_path=tmp_path).stdout
    found = re.search(r'<pre id="ffb-result">(.*?)</pre>', dom, re.S)
    assert found and found.group(1), "the page's script did not run"
    return json.loads(html.unescape(found.group(1))), out


def test_explanation_page_toggle_and_block_slider(tmp_path):
    r, out = _drive_explain_page(tmp_path, EXPLAIN_DRIVER)
    saved = json.loads((out / "explanation.json").read_text())
    assert r["labels"] == saved["labels"]
    # the colour legend under the output: its scale is the largest |contribution|
    c = saved["outputs"][0]["contributions"]
    assert _js_format(max(abs(v) for v in c)) + " (raises)" in r["legend"] and "(lowers)" in r["legend"]
    # the toggle greys the first token and rescales the others on the tokens after it
    assert r["after"][0] != r["before"][0] and "221" in r["after"][0]
    if max(abs(v) for v in c[1:]) < abs(c[0]):
        assert r["after"][1:] != r["before"][1:]
    # the slider draws another block's map
    assert r["block0"][0] == "0" and r["block1"][0] == "1" and r["block0"][1] != r["block1"][1]
    assert r["blockname"] == "after block 2 of 2"
    # the whole-model map: every row and column labelled, cells of at least 14 px, room for the
    # labels, its scale's top value, and a readout of the cell under the mouse
    g, n, first = r["geometry"], len(saved["labels"]), saved["maps"][0]
    assert g["labels"] == saved["labels"] and g["n"] == n and g["cell"] >= 14
    assert r["canvas"][0] >= g["left"] + n * g["cell"] > n * g["cell"] + 20
    assert r["mapHi"] == _js_format(max(max(row) for row in first))
    assert f'output 2 \u201c{saved["labels"][2]}\u201d' in r["tip"] and _js_format(first[2][1]) in r["tip"]


# Drives the explanation page's components tab: open it, hover a cell.
COMPONENTS_DRIVER = """
<pre id="ffb-result"></pre>
<script>
window.addEventListener("load", function () {
  var r = {};
  r.hiddenAtFirst = document.getElementById("components").style.display;
  document.getElementById("tab-k").click();
  r.shown = [document.getElementById("components").style.display, document.getElementById("contrib").style.display];
  var c = document.getElementById("cmp-map"), g = window.ffbComponents.geometry(), box = c.getBoundingClientRect();
  r.geometry = g; r.canvas = [c.width, c.height];
  c.dispatchEvent(new MouseEvent("mousemove", {
    clientX: box.left + g.left + g.cell[0] * 1.5, clientY: box.top + g.top + g.cell[1] * 2.5, bubbles: true
  }));
  r.tip = document.getElementById("cmp-tip").textContent;
  r.top = Array.from(document.querySelectorAll("#cmp-top li")).map(function (li) { return li.textContent; });
  document.getElementById("ffb-result").textContent = JSON.stringify(r);
});
</script>
"""


def test_explanation_page_components_tab(tmp_path):
    r, out = _drive_explain_page(tmp_path, COMPONENTS_DRIVER, "--components")
    table = json.loads((out / "explanation.json").read_text())["components"]
    n, m = len(table["tokens"]), len(table["components"])
    assert r["hiddenAtFirst"] == "none" and r["shown"] == ["", "none"]
    g = r["geometry"]
    assert g["n"] == n and g["m"] == m and min(g["cell"]) >= 10
    assert r["canvas"][0] >= g["left"] + m * g["cell"][0] and r["canvas"][1] >= g["top"] + n * g["cell"][1]
    # hover token 2, component 1
    value = table["contributions"][2][1]
    assert r["tip"] == (f'token 2 \u201c{table["tokens"][2]}\u201d \u00d7 {table["components"][1]}: '
                        f"{_js_format(value)}")
    assert len(r["top"]) == 10


GRAPH_DRIVER = """
<pre id="ffb-result"></pre>
<script>
window.addEventListener("load", function () {
  var v = window.ffbGraph, r = {}, G = v.data;
  r.state = document.body.dataset.state;
  r.nodes = v.nodes(); r.edges = v.edges();
  r.circles = Array.from(document.querySelectorAll("#ffb-graph [data-node]")).map(function (c) {
    return [c.dataset.node, +c.getAttribute("cx"), +c.getAttribute("cy"), +c.getAttribute("r")]; });
  var head = Object.keys(G.query_key)[0];
  document.querySelector('#ffb-graph [data-node="' + head + '"]').dispatchEvent(new MouseEvent("click", {bubbles: true}));
  r.head = head; r.chosen = document.body.dataset.chosen;
  r.sources = Array.from(document.querySelectorAll("#ffb-panel ol.source code")).map(function (c) { return c.textContent; });
  r.targets = Array.from(document.querySelectorAll("#ffb-panel ol.target code")).map(function (c) { return c.textContent; });
  r.qk = document.querySelectorAll("#ffb-panel ol.qk li").length;
  r.faded = document.querySelectorAll("#ffb-graph .edge.faded").length;
  r.lit = Array.from(document.querySelectorAll("#ffb-graph .edge.hot")).map(function (p) { return [p.dataset.source, p.dataset.target]; });
  document.getElementById("ffb-result").textContent = JSON.stringify(r);
});
</script>
"""


def test_graph_page_draws_every_kept_node_and_lists_a_heads_edges(tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI must run the browser test: Chromium is not installed")
        pytest.skip("Chromium is not installed")
    from tests.models import save_tiny_lm

    model = save_tiny_lm(tmp_path / "model")
    out = tmp_path / "out"
    assert main(["graph", "the cat sat on the mat because", "--model", str(model), "--out", str(out),
                 "--node-threshold", "0.95", "--quiet"]) == 0
    saved = json.loads((out / "graph.json").read_text())
    driven = tmp_path / "driven.html"
    driven.write_text((out / "graph.html").read_text(encoding="utf-8").replace("</body>", GRAPH_DRIVER + "</body>"),
                      encoding="utf-8")
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", driven.as_uri(), tmp_path=tmp_path).stdout
    found = re.search(r'<pre id="ffb-result">(.*?)</pre>', dom, re.S)
    assert found and found.group(1), "the page's script did not run"
    r = json.loads(html.unescape(found.group(1)))
    assert r["state"] == "drawn" and r["nodes"] == len(saved["nodes"])
    assert r["edges"] == sum(1 for link in saved["links"] if "kind" not in link)
    position = {c[0]: c[1:] for c in r["circles"]}
    tokens = [n for n in saved["nodes"] if n["kind"] == "token"]
    # tokens along the bottom, left to right; the output above everything
    assert len({position[n["id"]][1] for n in tokens}) == 1
    xs = [position[n["id"]][0] for n in sorted(tokens, key=lambda n: n["position"])]
    assert xs == sorted(xs)
    assert position["output"][1] < min(y for node, (_, y, _) in position.items() if node != "output")
    # blocks go upwards
    writers = [n for n in saved["nodes"] if n["kind"] in ("head", "ff")]
    for a in writers:
        for b in writers:
            if a["layer"] < b["layer"]:
                assert position[a["id"]][1] > position[b["id"]][1]
    # node size grows with |value| (among writers)
    ordered = sorted(writers, key=lambda n: abs(n["value"]))
    radii = [position[n["id"]][2] for n in ordered]
    assert radii == sorted(radii)
    # clicking a head lists its kept in- and out-edges, largest first, and its query–key pairs
    head = r["head"]
    assert r["chosen"] == head
    into = sorted((link for link in saved["links"] if link["target"] == head and "kind" not in link),
                  key=lambda link: -abs(link["weight"]))
    out_ = sorted((link for link in saved["links"] if link["source"] == head and "kind" not in link),
                  key=lambda link: -abs(link["weight"]))
    assert r["sources"] == [link["source"] for link in into][:15]
    assert r["targets"] == [link["target"] for link in out_][:15]
    # its paths lit (its largest in- and out-edge among them), every other edge faded
    assert r["qk"] > 0 and r["faded"] == r["edges"] - len(r["lit"])
    assert [into[0]["source"], head] in r["lit"] and [head, out_[0]["target"]] in r["lit"]
