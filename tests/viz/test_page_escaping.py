"""Every page the package writes, given markup in every string field of its input, writes it as
text: no tag of it reaches the document (the JSON data blocks escape ``<`` too), and in headless
Chromium no injected element appears and no handler runs, also after the graph viewer's
hover card and details panel, the maps view's tooltip and the explanation's tabs have drawn."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.components.table import ComponentAttribution
from captum_ffb.explain import Explanation
from captum_ffb.explained.results import ExplainedOutput
from captum_ffb.io.pages import page
from captum_ffb.long_context.attribution import ContextAttribution
from captum_ffb.texts.text import TextMaps
from tests.models import tiny_task_model, token_ids
from tests.viz.chromium import CHROMEDRIVER, CHROMIUM, missing

#: Markup that runs if a page pastes it as HTML: a custom element and an image whose failed
#: load renames the tab.
MARK = "<ffb-x onerror=alert(1)><img src=x onerror=\"document.title='PWNED'\">"
#: What an unescaped ``MARK`` leaves in a document.
RAW = ("<ffb-x", "<img src=x")
N = 4

PAGES = ["page", "graph", "maps", "explanation", "components", "context", "seq2seq", "records",
         "framed", "evaluation_report", "analysis_report"]


def _graph():
    """A tiny Llama's head graph (with patching estimates), markup in every string field."""
    nd = NormDecomposition(tiny_task_model("llama", "causal_lm"))
    ids = token_ids(1, N + 2, seed=3)
    baseline = ids.clone()
    baseline[0, 1] = 7
    graph = nd.attribute_graph(ids, 5, baseline_inputs=baseline)
    n = len(graph.tokens)
    target = dataclasses.replace(graph.target, texts=(MARK,)) if graph.target is not None else None
    head = next(node["id"] for node in graph.to_dict()["nodes"] if node["kind"] == "head")
    query_key = {head: [{"key_position": MARK, "probability": MARK, "score": 0.5,
                         "pairs": [{"query": MARK, "key": MARK, "value": MARK}]}]}
    hostile = dataclasses.replace(
        graph, granularity=MARK, tokens=[MARK] * n, output_label=MARK, excluded_positions=(0, MARK),
        patch_estimates={**graph.patch_estimates, MARK: graph.patch_estimates["default"]}, target=target)
    return hostile, query_key


def _components() -> ComponentAttribution:
    generator = torch.Generator().manual_seed(0)
    return ComponentAttribution(
        contributions=torch.randn(1, N, 3, generator=generator), bias=torch.zeros(1, 3),
        components=[f"{MARK}.a", f"{MARK}.b", "block.0.ff"], value=torch.tensor([1.0]), delta=torch.zeros(1),
        granularity=MARK, tokens=[[MARK] * N])


def _explanation() -> Explanation:
    generator = torch.Generator().manual_seed(1)
    return Explanation(
        text=MARK, model_name=MARK, model_type=MARK, task=MARK, tokens=[MARK] * N, prompt_length=N,
        explained=MARK, targets=[MARK], contributions=torch.randn(1, N, generator=generator),
        values=torch.tensor([1.0]), bias=torch.tensor([0.1]), delta=torch.zeros(1),
        maps=torch.rand(2, N, N, generator=generator), route=MARK, check=None, labels=[MARK] * N,
        target_labels=[MARK], components=_components(), result=None)


def _maps() -> TextMaps:
    generator = torch.Generator().manual_seed(2)
    scopes = ("Atb", MARK)
    return TextMaps(
        text=MARK, tokens=[MARK] * N, model_name=MARK, model_type=MARK, chain=MARK, scopes=scopes,
        ff_pair=scopes, layers=[0], n_layers=1, input_ids=list(range(N)),
        maps={0: {s: torch.rand(N, N, generator=generator) for s in scopes}}, delta={0: {s: 0.0 for s in scopes}},
        causal=False, n_target=None)


def _context() -> ContextAttribution:
    parts = [f"First {MARK} part. ", f"Second {MARK} part."]
    context, spans, at = "".join(parts), [], 0
    for part in parts:
        spans.append((at, at + len(part)))
        at += len(part)
    return ContextAttribution(
        groups=parts, contributions=torch.tensor([0.5, -0.25]), question=0.1, rest=0.2, bias=0.3, value=0.85,
        delta=0.0, target=MARK, token_groups=[], tokens=[], token_contributions=None, context=context, spans=spans)


def _seq2seq() -> str:
    from captum_ffb.viz.seq2seq import seq2seq_html

    generator = torch.Generator().manual_seed(3)
    result = ExplainedOutput(
        contributions=torch.randn(2, 4, generator=generator), bias=torch.zeros(2), value=torch.ones(2),
        delta=torch.zeros(2), n_source=2, readouts=[], tokens=None, source_ids=None, target_ids=None,
        outputs=None, maps=None, forward_contributions=None, forward_delta=None)
    return seq2seq_html(result, [MARK] * 2, [MARK] * 2, [MARK] * 2, title=MARK)


def _records() -> str:
    pytest.importorskip("IPython")
    from captum.attr import visualization

    from captum_ffb.viz import to_visualization_records

    records = to_visualization_records(torch.tensor([0.5, -1.0, 0.25]), [MARK] * 3, pred_class=MARK,
                                       true_class=MARK, attr_class=MARK)
    return visualization.visualize_text(records).data


def _evaluation_report(folder) -> str:
    from captum_ffb.evaluation.report import write_report

    summary = {"rows": [{"method": MARK, "decompx_aopc": 0.5, "abpc": MARK, "peak_mb": MARK},
                        {"method": "random", "decompx_aopc": 0.1, "abpc": 0.2, "peak_mb": 1.0}],
               "model": MARK, "model_type": MARK, "task": MARK, "data": MARK, "n": MARK, "players_mean": 3.0,
               "accuracy": 0.5, "keep_first": False, "scheme_tau": {f"{MARK} delete~zero": MARK}, "curves": {}}
    write_report(summary, folder)
    return (folder / "report.html").read_text(encoding="utf-8")


def _analysis_report() -> str:
    from captum_ffb.analysis.report import _html

    layer = {"layer": MARK, "norms": {"ff_output": 1.0, "bypassed": 2.0, "bypassed_over_ff": 2.0},
             "ff_amp_top": [{"receiver": MARK, "giver": MARK, "ff_amp": 0.5, "count": MARK}],
             "outliers": {"norm": MARK, "gamma_vs_ff_out": {"pearson": 0.1, "spearman": 0.2}, "ignored_dims": [MARK]},
             "changes": [{"kind": "consecutive", "label": "+FF", "mean": 0.2}, {"kind": "ablation", "label": MARK,
                                                                                 "mean": MARK}],
             "completeness_residual_max": 1e-6, "pmi": {"spearman": MARK, "pairs": MARK, "documents": MARK}}
    summary = {"layers": [layer], "model": MARK, "model_type": MARK, "chain": MARK, "causal": False, "source": MARK,
               "sequences": MARK, "tokens": MARK, "masked_tokens": MARK, "skipped": [{"reason": MARK}],
               "measures": [{"kind": "relative", "label": MARK}], "averages": [{"mean_over_layers": MARK}],
               "settings": {"mask_rate_applied": 0.15, "seed": MARK, "min_count": MARK, "include_special": False,
                            "ablation_fraction": 0.1}}
    checks = [{"finding": MARK, "criterion": MARK, "layers_holding": MARK, "layers": MARK, "holds": True,
               "detail": MARK, "paper": MARK}]
    return _html(summary, {}, checks)


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """``documents(name)``: the page ``name`` built from hostile input (each built once)."""
    from captum_ffb.viz import components_html, explanation_html, html_view
    from captum_ffb.viz.context import context_html
    from captum_ffb.viz.graph import graph_html
    from captum_ffb.viz.html import framed_page

    folder = tmp_path_factory.mktemp("escaping")
    builders = {
        "page": lambda: page(MARK, "<p>body</p>", header="", data={"ffb-data": {MARK: [MARK]}}),
        "graph": lambda: graph_html(*_graph_input()),
        "maps": lambda: html_view(_maps(), title=MARK, scope=MARK),
        "explanation": lambda: explanation_html(_explanation(), title=MARK),
        "components": lambda: components_html(_components()),
        "context": lambda: context_html(_context(), title=MARK),
        "seq2seq": _seq2seq,
        "records": _records,
        "framed": lambda: framed_page(html_view(_maps(), title=MARK)),
        "evaluation_report": lambda: _evaluation_report(folder / "evaluation"),
        "analysis_report": _analysis_report,
    }
    built: dict[str, str] = {}

    def _graph_input():
        hostile, query_key = _graph()
        return hostile, None, query_key

    def get(name: str) -> str:
        if name not in built:
            built[name] = builders[name]()
        return built[name]

    return get


@pytest.mark.parametrize("name", PAGES)
def test_markup_in_every_field_is_written_as_text(documents, name):
    document = documents(name)
    assert "ffb-x" in document  # the marker is there ...
    for raw in RAW:
        assert raw not in document, f"{name}: unescaped {raw!r} at {document.find(raw)}"  # ... as text


def test_the_graph_header_escapes_granularity_and_positions(documents):
    header = documents("graph").split("<header>", 1)[1].split("</header>", 1)[0]
    assert "&lt;ffb-x onerror=alert(1)&gt;" in header and " granularity · " in header
    assert "set aside: the writers at position 0, &lt;ffb-x" in header


# --------------------------------------------------------------------------- in Chromium
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--window-size=1400,900")

#: What the marker would have done: an element of it in the DOM, a handler run.
INJECTED = """return {title: document.title, found: document.querySelectorAll('img[onerror], ffb-x').length,
                      alerted: window.__ffbAlerts || 0};"""
#: Counts alert / confirm / prompt instead of opening a dialog (set after load: a dialog during
#: load still blocks, and the driver reports it).
NO_DIALOGS = """window.__ffbAlerts = 0;
['alert', 'confirm', 'prompt'].forEach(function (f) { window[f] = function () { window.__ffbAlerts++; }; });"""
#: The graph viewer's parts that write HTML: every node's card and details, every token's card,
#: a pinned supernode named with the marker, the head's query-key pairs.
GRAPH_ACTIONS = """
var g = window.ffbGraph, shown = 0;
function fire(el, type, extra) {
  var b = el.getBoundingClientRect(), o = {bubbles: true, clientX: b.left + b.width / 2, clientY: b.top + b.height / 2};
  for (var k in extra || {}) o[k] = extra[k];
  el.dispatchEvent(new MouseEvent(type, o));
}
document.querySelectorAll('#ffb-graph [data-node]').forEach(function (c) {
  fire(c, 'mouseover'); fire(c, 'click'); shown += document.getElementById('ffb-detail').children.length > 0;
});
document.querySelectorAll('#ffb-graph [data-token]').forEach(function (t) { fire(t, 'mouseover'); });
var ids = g.data.nodes.filter(function (d) { return d.kind === 'head' || d.kind === 'ff'; }).map(function (d) { return d.id; });
ids.slice(0, 2).forEach(function (id) { g.pin(id); });
var group = g.group(ids.slice(0, 2), arguments[0]);
var head = Object.keys(g.data.query_key)[0];
g.ungroup(group);
g.choose(head);
g.search('ffb');
return {shown: shown, head: head, qk: document.querySelectorAll('#ffb-detail ol.qk li').length,
        card: document.getElementById('ffb-card').textContent, side: document.getElementById('ffb-side').textContent};
"""
#: The maps view's tooltip over a cell, under the marker's scope.
MAPS_ACTIONS = """
var v = window.ffbView, c = document.getElementById('ffb-map'), g = v.geometry(), b = c.getBoundingClientRect();
v.set({overlay: true});
c.dispatchEvent(new MouseEvent('mousemove', {clientX: b.left + g.left + g.cell * 1.5, clientY: b.top + g.top + g.cell * 0.5,
                                             bubbles: true}));
return {tooltip: document.getElementById('ffb-tooltip').textContent, info: document.getElementById('ffb-info').textContent};
"""
#: The explanation's tabs, each shown, and a hover over the whole-model map.
EXPLANATION_ACTIONS = """
['tab-m', 'tab-k', 'tab-c'].forEach(function (id) { document.getElementById(id).click(); });
document.getElementById('nofirst').click();
document.getElementById('tab-m').click();
var c = document.getElementById('map'), b = c.getBoundingClientRect(), g = window.ffbExplain.geometry();
c.dispatchEvent(new MouseEvent('mousemove', {clientX: b.left + g.left + 2, clientY: b.top + g.top + 2, bubbles: true}));
return document.getElementById('tip').textContent;
"""


@pytest.mark.browser
def test_no_markup_runs_in_chromium(documents, tmp_path):
    reason = missing()
    if reason is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the browser test: {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        for name in PAGES:
            if name == "components":  # a fragment: the explanation page holds it
                continue
            path = tmp_path / f"{name}.html"
            path.write_text(documents(name), encoding="utf-8")
            driver.get(path.as_uri())
            for _ in range(100):  # the page's script has run
                if driver.execute_script("return document.readyState") == "complete" and (
                        name not in ("graph", "maps") or driver.execute_script("return document.body.dataset.state")):
                    break
                time.sleep(0.05)
            driver.execute_script(NO_DIALOGS)
            if name == "graph":
                done = driver.execute_script(GRAPH_ACTIONS, MARK)
                assert done["shown"] > 0 and done["qk"] == 1 and "ffb-x" in done["side"] + done["card"]
            elif name == "maps":
                done = driver.execute_script(MAPS_ACTIONS)
                assert MARK in done["tooltip"] and MARK in done["info"]  # the scope, as text
            elif name == "explanation":
                assert MARK in driver.execute_script(EXPLANATION_ACTIONS)
            time.sleep(0.2)  # an injected image's failed load would have fired its handler by now
            found = driver.execute_script(INJECTED)
            # the tab's title may hold the marker as text; its handler would make it exactly "PWNED"
            assert found["title"] != "PWNED" and found["found"] == 0 and found["alerted"] == 0, (name, found)
            with pytest.raises(NoAlertPresentException):
                driver.switch_to.alert.text  # noqa: B018 (no dialog is open)
    finally:
        driver.quit()
