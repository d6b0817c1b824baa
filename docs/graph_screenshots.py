"""The graph viewer's screenshots in docs/: SmolLM2-135M-Instruct's attribution graph of
" Paris" after "The Eiffel Tower is located in the city of" (head granularity, default
pruning), opened in headless Chromium at 1600×1000 (as it loads) and 1280×800 (the kept head
of largest influence chosen and hovered, its weighted paths lit and its details in the panel;
it and its largest neighbours pinned and open in the subgraph panel beside the graph).

    python docs/graph_screenshots.py [--out docs]

It prints what it measured at each size: the share of the node elements and of the token
labels inside the window on load, and whether the details panel is inside it once the output
is chosen and names the output's largest in-edge. Needs SmolLM2 (``captum_ffb.explained.models``),
Chromium, chromedriver and selenium; about a minute on a laptop's CPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "The Eiffel Tower is located in the city of"
SIZES = ((1600, 1000), (1280, 800))

MEASURE = """
var W = innerWidth, H = innerHeight;
function inside(e) { var b = e.getBoundingClientRect();
  return b.width > 0 && b.left >= 0 && b.top >= 0 && b.right <= W && b.bottom <= H; }
var nodes = Array.from(document.querySelectorAll('[data-node]')), tokens = Array.from(document.querySelectorAll('[data-token]'));
var found = {window: [W, H], nodes: nodes.length, nodes_inside: nodes.filter(inside).length,
             tokens: tokens.length, tokens_inside: tokens.filter(inside).length,
             scrolls: document.documentElement.scrollWidth > W || document.documentElement.scrollHeight > H};
window.ffbGraph.choose(arguments[0]);
var panel = document.querySelector('[data-role=details]');
found.panel_inside = inside(panel);
found.panel_names = panel.textContent.indexOf(arguments[1]) >= 0;
window.ffbGraph.clear();
return found;
"""


def build_page() -> tuple[str, dict]:
    """The page of SmolLM2's graph and the graph's dict."""
    from captum_ffb import NormDecomposition
    from captum_ffb.explained.models import load_model, smollm2_dir
    from captum_ffb.viz.graph import graph_html

    loaded = load_model(smollm2_dir(required=True))
    nd = NormDecomposition(loaded.model, tokenizer=loaded.tokenizer)
    ids = loaded.tokenizer(PROMPT, return_tensors="pt").input_ids
    graph = nd.attribute_graph(ids)
    return graph_html(graph), graph.to_dict()


def _trace(driver, data: dict, head: str) -> None:
    """Pin ``head``, its two largest in-edges' sources and its two largest out-edges' targets,
    open the subgraph panel, choose ``head`` and hover it (its paths lit), as a person would."""
    from selenium.webdriver.common.action_chains import ActionChains

    links = [link for link in data["links"] if "kind" not in link]
    into = sorted((x for x in links if x["target"] == head), key=lambda x: -abs(x["weight"]))[:2]
    out = sorted((x for x in links if x["source"] == head), key=lambda x: -abs(x["weight"]))[:2]
    pinned = [head] + [x["source"] for x in into] + [x["target"] for x in out]
    driver.execute_script("var g = window.ffbGraph; arguments[0].forEach(function (id) { g.pin(id); });"
                          "g.subgraph(true); g.choose(arguments[1]);", pinned, head)
    node = driver.find_element("css selector", f'#ffb-graph [data-node="{head}"]')
    ActionChains(driver).move_to_element(node).perform()
    lit = driver.execute_script("return document.querySelectorAll('#ffb-graph .edge.hot').length")
    print(json.dumps({"pinned": pinned, "hovered": head, "edges_lit": lit}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent), help="folder of the PNGs (docs/)")
    args = parser.parse_args(argv)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    html, data = build_page()
    output = next(n["id"] for n in data["nodes"] if n["kind"] == "output")
    into = [link for link in data["links"] if link["target"] == output and "kind" not in link]
    largest = max(into, key=lambda link: abs(link["weight"]))["source"]
    heads = [n for n in data["nodes"] if n["kind"] == "head"]
    head = max(heads, key=lambda n: abs(n.get("influence", n["value"])))["id"] if heads else output
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--hide-scrollbars"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "graph.html"
        page.write_text(html, encoding="utf-8")
        try:
            for width, height in SIZES:
                driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                       {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
                driver.get(page.as_uri())
                while driver.execute_script("return document.body.dataset.state") != "drawn":
                    time.sleep(0.05)
                found = driver.execute_script(MEASURE, output, largest)
                print(json.dumps(found))
                if (width, height) != SIZES[0]:
                    _trace(driver, data, head)
                path = out / f"graph_viewer_{width}x{height}.png"
                driver.save_screenshot(str(path))
                print(f"wrote {path}", file=sys.stderr)
        finally:
            driver.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
