"""An attribution graph's contract (``to_dict``), its pruning, its query–key pairs, its exports
(circuit-tracer's schema, validated by circuit-tracer's own pydantic classes) and
activation patching."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch

from captum_ffb import NormDecomposition
from captum_ffb.attr.patching import activation_patching
from captum_ffb.cli import main
from captum_ffb.viz.graph import graph_html, neuronpedia_graph
from tests.models import tiny_task_model, token_ids

KINDS = {"token", "attention", "head", "ff", "neuron", "bias", "output"}


@pytest.fixture(scope="module")
def llama():
    nd = NormDecomposition(tiny_task_model("llama", "causal_lm"))
    return nd, token_ids()[:1, :7]


def test_to_dict_holds_every_node_and_every_non_zero_edge(llama):
    nd, ids = llama
    graph = nd.attribute_graph(ids, 5, prune=False)
    found = graph.to_dict()
    assert {n["kind"] for n in found["nodes"]} <= KINDS
    assert {"token", "head", "ff", "bias", "output"} <= {n["kind"] for n in found["nodes"]}
    assert len(found["nodes"]) == len(graph.data)
    assert len(found["links"]) == len(graph.data.weights) and all(link["weight"] != 0 for link in found["links"])
    for node in found["nodes"]:
        assert {"id", "kind", "layer", "head", "position", "value"} <= set(node)
    ids_ = {n["id"] for n in found["nodes"]}
    assert all(link["source"] in ids_ and link["target"] in ids_ for link in found["links"])
    into_output = sum(link["weight"] for link in found["links"] if link["target"] == "output")
    assert math.isclose(into_output, found["value"], rel_tol=1e-5, abs_tol=1e-6)
    assert json.loads(json.dumps(found)) == found  # JSON as it stands


def test_pruning_keeps_the_ends_and_says_what_it_keeps(llama):
    nd, ids = llama
    full = nd.attribute_graph(ids, 5, prune=False)
    pruned = full.prune(0.5, 0.9)
    kinds = [full.data.kinds[k] for k in pruned.node_mask.nonzero()[:, 0].tolist()]
    assert kinds.count("token") == ids.shape[1] and "output" in kinds and "bias" in kinds
    assert int(pruned.node_mask.sum()) < len(full.data) and int(pruned.edge_mask.sum()) < len(full.data.weights)
    assert pruned.kept_share != 1.0 and full.kept_share == pytest.approx(1.0)
    # the kept edges only join kept nodes, and every kept writer keeps an edge in and out
    d = pruned.data
    kept = pruned.edge_mask & pruned.node_mask[d.sources] & pruned.node_mask[d.targets]
    for k in pruned.node_mask.nonzero()[:, 0].tolist():
        if d.kinds[k] in ("head", "ff"):
            assert bool(kept[d.targets == k].any()) and bool(kept[d.sources == k].any())
    assert full.prune(1.0, 1.0).node_mask.sum() >= pruned.node_mask.sum()
    with pytest.raises(ValueError, match="node_threshold"):
        full.prune(1.5, 0.9)


def test_max_nodes_reports_what_it_leaves_out(llama):
    nd, ids = llama
    full = nd.attribute_graph(ids, 5, prune=False)
    few = nd.attribute_graph(ids, 5, prune=False, max_nodes=4)
    writers = [k for k, kind in enumerate(full.data.kinds) if kind in ("head", "ff")]
    shown = [k for k in writers if bool(few.node_mask[k])]
    assert 0 < len(shown) <= 4
    torch.testing.assert_close(few.data.values, full.data.values)
    assert float(few.data.left_out.abs().sum()) > 0


def test_query_key_pairs_and_qk_links(llama):
    nd, ids = llama
    graph = nd.attribute_graph(ids, 5, prune=False)
    pairs = graph.query_key_pairs(heads=3, keys=2, top=4)
    assert 0 < len(pairs) <= 3
    for head, entries in pairs.items():
        assert head.startswith("block.") and ".head." in head
        for entry in entries:
            assert 0 <= entry["probability"] <= 1 and len(entry["pairs"]) <= 4
        probabilities = [e["probability"] for e in entries]
        assert probabilities == sorted(probabilities, reverse=True)
    layer, head, position = 1, 0, ids.shape[1] - 1
    assert float(graph.attention(layer, head, position).sum()) == pytest.approx(1.0, abs=1e-5)
    links = graph.attach_score_pairs(layer, head, position, 2, top=3)
    assert len(links) == 3 and all(link["kind"] == "qk" for link in links)
    assert graph.to_dict()["links"][-3:] == links
    with pytest.raises(ValueError, match="head 99"):
        graph.score_split(layer, 99, position, 2)
    with pytest.raises(ValueError, match="key_position"):
        graph.score_split(layer, head, position, 50)


def _graph_models():
    """circuit-tracer's own pydantic classes, read from its installed files without importing
    the package (its ``__init__`` needs torch extras we do not install)."""
    spec = importlib.util.find_spec("circuit_tracer")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("circuit-tracer is not installed (the README installs it with --no-deps)")
    path = Path(next(iter(spec.submodule_search_locations))) / "frontend" / "graph_models.py"
    module_spec = importlib.util.spec_from_file_location("_circuit_tracer_graph_models", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


# What circuit-tracer 0.5.0 reads, from its wheel (circuit_tracer/frontend/graph_models.py and
# utils/create_graph_files.py): pydantic classes Model(metadata: Metadata, qParams: QParams,
# nodes: list[Node], links: list[dict]); Metadata(slug, scan, transcoder_list, prompt_tokens,
# prompt, node_threshold=None, schema_version=1); QParams(pinnedIds, supernodes, linkType,
# clickedId, sg_pos); Node(node_id, feature: int, layer: str, ctx_idx: int, feature_type: str,
# token_prob=0.0, is_target_logit=False, run_idx=0, reverse_ctx_idx=0, jsNodeId, clerp="",
# influence=None, activation=None); Link(source, target, weight). Its four node constructors
# write the only feature types it emits and its viewer draws: "embedding" (token_node:
# node_id E_<vocab>_<pos>, feature = pos, layer "E"), "logit" (logit_node: node_id
# <n_layers+1>_<vocab>_<pos>, feature = the token id, or vocab_size + k for a custom target,
# jsNodeId L_<vocab>-<pos>, clerp 'Output "<token>" (p=<p>)' with the decoded token),
# "cross layer transcoder" (feature_node: feature = Cantor pairing of layer and index) and
# "mlp reconstruction error" (error_node, feature -1). Its viewer (util-cg.js) reads the
# logit's probability back from the clerp's "(p=" and marks any type containing "error".
CIRCUIT_TRACER_TYPES = {"embedding", "logit", "cross layer transcoder", "mlp reconstruction error"}
NODE_FIELDS = {"node_id": str, "feature": int, "layer": str, "ctx_idx": int, "feature_type": str, "jsNodeId": str}
METADATA_FIELDS = {"slug": str, "scan": str, "transcoder_list": list, "prompt_tokens": list, "prompt": str}
Q_PARAMS_FIELDS = {"pinnedIds": list, "supernodes": list, "linkType": str, "clickedId": str, "sg_pos": str}


def _check_schema(found):
    """The schema above, checked without circuit-tracer (and by its classes where installed)."""
    assert {"metadata", "qParams", "nodes", "links"} <= set(found) <= {"metadata", "qParams", "nodes", "links",
                                                                       "qk_only_nodes"}
    for part, wanted in (("metadata", METADATA_FIELDS), ("qParams", Q_PARAMS_FIELDS)):
        assert all(isinstance(found[part][name], kind) for name, kind in wanted.items()), part
    for node in found["nodes"]:
        assert all(isinstance(node[name], kind) and not isinstance(node[name], bool)
                   for name, kind in NODE_FIELDS.items()), node
        assert node["feature_type"] in CIRCUIT_TRACER_TYPES, node["feature_type"]
        assert isinstance(node.get("clerp", ""), str) and isinstance(node.get("token_prob", 0.0), float)
    ids_ = [n["node_id"] for n in found["nodes"]]
    assert len(set(ids_)) == len(ids_)
    for link in found["links"]:
        assert set(link) == {"source", "target", "weight"} and isinstance(link["weight"], float)
        assert link["source"] in ids_ and link["target"] in ids_
    if importlib.util.find_spec("circuit_tracer") is not None:
        _graph_models().Model(**found)
    return {n["node_id"]: n for n in found["nodes"]}


def test_neuronpedia_json_is_what_circuit_tracer_reads(llama):
    nd, ids = llama
    graph = nd.attribute_graph(ids, 5)
    found = neuronpedia_graph(graph, "a prompt", token_ids=ids[0].tolist())
    nodes = _check_schema(found)
    assert len(nodes) == int(graph.node_mask.sum())
    types = {n["feature_type"] for n in nodes.values()}
    assert types == CIRCUIT_TRACER_TYPES  # heads and FF blocks as features, the bias as the one error node
    logits = [n for n in nodes.values() if n["feature_type"] == "logit"]
    assert len(logits) == 1 and logits[0]["is_target_logit"]
    assert found["metadata"]["prompt_tokens"] == graph.tokens
    model = _graph_models().Model(**found)  # circuit-tracer's own classes (skipped where not installed)
    assert len(model.nodes) == len(nodes)


def test_the_logit_node_names_the_explained_token_and_position():
    """The logit node's ``feature`` is the explained token's id and its ``ctx_idx`` the position
    read (it was always 0 and the last position); its label is the decoded token, quoted once
    as circuit-tracer quotes it."""
    from captum_ffb.explained.readouts import Contrast, NextToken
    from tests.models import causal_tokenizer, tiny_lm

    tokenizer = causal_tokenizer()
    nd = NormDecomposition(tiny_lm("llama"), tokenizer=tokenizer)
    ids = tokenizer("the cat sat on the mat because", return_tensors="pt").input_ids
    cat = tokenizer.convert_tokens_to_ids("cat")
    graph = nd.attribute_graph(ids, NextToken(cat, position=3))
    assert graph.target.units == (cat,) and graph.target.position == 3 and graph.target.texts == ("cat",)
    found = neuronpedia_graph(graph, "the cat sat on the mat because")
    (logit,) = [n for n in _check_schema(found).values() if n["feature_type"] == "logit"]
    assert logit["feature"] == cat and logit["ctx_idx"] == 3
    assert logit["node_id"] == f"{len(nd.engine.blocks) + 1}_{cat}_3" and logit["jsNodeId"] == f"L_{cat}-3"
    assert logit["clerp"] == f'Output "cat" (p={graph.probability:.3f})'
    output = next(n for n in graph.to_dict()["nodes"] if n["kind"] == "output")
    assert output["token_id"] == cat and output["position"] == 3
    # a contrast: circuit-tracer's virtual index for a custom target, both tokens in the label
    mat = tokenizer.convert_tokens_to_ids("mat")
    contrast = nd.attribute_graph(ids, Contrast(cat, mat))
    (logit,) = [n for n in _check_schema(neuronpedia_graph(contrast, "x")).values() if n["feature_type"] == "logit"]
    assert logit["feature"] == contrast.target.n_units == nd.engine.head.output.weight.shape[0]
    assert logit["ctx_idx"] == ids.shape[1] - 1 and logit["clerp"].startswith('Output "cat − mat" (p=')
    output = next(n for n in contrast.to_dict()["nodes"] if n["kind"] == "output")
    assert (output["token_id"], output["negative_token_id"]) == (cat, mat)


def test_the_page_is_self_contained(llama):
    nd, ids = llama
    page = graph_html(nd.attribute_graph(ids, 5))
    assert "of its edges' |weight|" in page and "set aside" not in page
    assert "set aside: the writers at position 0" in graph_html(nd.attribute_graph(ids, 5, exclude_positions=[0]))
    for pattern in ("src=", "href=", "@import", "url(", "fetch(", "XMLHttpRequest"):
        assert pattern not in page
    assert "://" not in page  # not even the SVG namespace's name: the script reads it from the element
    assert '"query_key"' in page and "ffb-graph-data" in page


def test_flow_residual_with_and_without_max_nodes(llama):
    """Every node's edges: in- and out-flow equal the values; with ``max_nodes``, the in-flow of
    the nodes whose edges were computed (what the others send counted as left out) still does,
    while a node left without edges would not: the residual looks only where edges exist."""
    nd, ids = llama
    full = nd.attribute_graph(ids, 5, prune=False)
    assert full.data.computed is None and full.flow_residual() < 1e-5
    limited = nd.attribute_graph(ids, 5, prune=False, max_nodes=5)
    d = limited.data
    assert int(d.computed.sum()) == 5 and limited.flow_residual() < 1e-5
    inflow, _ = limited.flow()
    skipped = [k for k in range(len(d)) if d.kinds[k] in ("head", "ff") and not d.computed[k] and abs(float(d.values[k])) > 1e-3]
    assert skipped and all(abs(float(inflow[k] - d.values[k])) > 1e-4 for k in skipped[:3])


def test_activation_patching_against_the_estimates(llama):
    nd, ids = llama
    baseline = ids.clone()
    baseline[0, 1], baseline[0, 3] = 11, 13
    real = activation_patching(nd, ids, baseline, 5, "head", show_progress=False)
    heads = nd.engine.config.num_attention_heads * len(nd.engine.blocks)
    assert len(real.of("head")) == heads and len(real.of("ff")) == len(nd.engine.blocks)
    graph = nd.attribute_graph(ids, 5, prune=False, corrupted_inputs=baseline)
    assert real.clean == pytest.approx(graph.value, abs=1e-5)
    for name in ("frozen", "atp", "default"):
        estimates = graph.component_estimates(name)
        assert set(estimates) == set(real.effects)
    # a patch that changes nothing has no effect
    one_by_one = activation_patching(nd, ids, baseline, 5, "head", batch_size=1, show_progress=False)
    assert one_by_one.effects == pytest.approx(real.effects, abs=1e-5)
    with pytest.raises(ValueError, match="batch_size"):
        activation_patching(nd, ids, baseline, 5, batch_size=0)
    same = activation_patching(nd, ids, ids, 5, "sublayer", show_progress=False)
    assert max(abs(v) for v in same.effects.values()) < 1e-6
    with pytest.raises(ValueError, match="shape"):
        activation_patching(nd, ids, baseline[:, :5], 5)
    with pytest.raises(ValueError, match="granularity"):
        activation_patching(nd, ids, baseline, 5, "neuron")
    with pytest.raises(ValueError, match="estimator"):
        graph.component_estimates("nope")


@pytest.mark.parametrize("name, granularity", [("llama", "head"), ("gpt2", "sublayer"), ("llama", "neuron")])
def test_atp_plus_exact_patches_the_nodes_above_its_kappa_for_real(name, granularity):
    """``"atp+exact"`` is ``"atp"`` where κ ≤ exact_above and one real patched pass where κ is
    larger; κ is the patch's size over the stream's just after the node writes."""
    from captum_ffb.engine.head import target_value
    from captum_ffb.patching.patches import real_writers

    nd = NormDecomposition(tiny_task_model(name, "causal_lm"))
    ids = token_ids()[:1, :7]
    baseline = ids.clone()
    baseline[0, 1], baseline[0, 3] = 11, 13
    never = nd.attribute_graph(ids, 5, granularity=granularity, prune=False, corrupted_inputs=baseline,
                               exact_above=math.inf)
    assert torch.equal(never.patch_estimates["atp+exact"], never.patch_estimates["atp"])
    kappa = never.patch_kappa
    d = never.data
    components = [k for k, kind in enumerate(d.kinds) if kind not in ("token", "bias", "output")]
    assert all(float(kappa[k]) > 0 for k in components if d.positions[k] in (1, 3))
    threshold = float(kappa[components].median())
    graph = nd.attribute_graph(ids, 5, granularity=granularity, prune=False, corrupted_inputs=baseline,
                               exact_above=threshold)
    above = [k for k in components if float(kappa[k]) > threshold]
    below = [k for k in components if float(kappa[k]) <= threshold]
    assert above and below
    mixed, atp = graph.patch_estimates["atp+exact"], graph.patch_estimates["atp"]
    assert torch.equal(mixed[below], atp[below])
    assert torch.equal(graph.patch_estimates["default"], graph.patch_estimates["atp+exact"])
    # the real single-node patch, by hand, for the node of largest κ
    node = max(above, key=lambda k: float(kappa[k]))
    request = nd.engine.request((ids,), {})
    target = nd._target(5, None, request.read_mask)
    base = real_writers(nd.engine, nd.engine.request((baseline,), {}), target, granularity)
    layer, kind, part, p = d.layers[node], d.kinds[node], d.heads[node], d.positions[node]
    key = f"block.{layer}.{'ff' if kind in ('ff', 'neuron') else 'attention'}"
    writer = nd.engine.points.writer(layer, "ff" if kind in ("ff", "neuron") else "attention")
    module = writer.parts if kind in ("head", "neuron") else writer.module
    seen = {}

    def hook(mod, args, output=None):
        if output is None:  # a part of the module's input
            x = args[0].clone(memory_format=torch.contiguous_format)
            parts = base.parts[key]
            x.reshape(1, ids.shape[1], parts.shape[2], -1)[0, p, part] = parts[0, p, part]
            return (x,)
        out = output.clone(memory_format=torch.contiguous_format)
        out.reshape(1, ids.shape[1], -1)[0, p] = base.outputs[key][0, p]
        return out

    handle = (module.register_forward_pre_hook(hook) if kind in ("head", "neuron")
              else module.register_forward_hook(hook))
    with torch.no_grad():
        try:
            seen["patched"] = float(target_value(nd.engine.head, nd.model(ids), target)[0])
        finally:
            handle.remove()
    assert float(mixed[node]) == pytest.approx(graph.value - seen["patched"], abs=1e-5)
    # a component with a node above the threshold: its total is its own patched pass (all positions)
    if granularity != "neuron":
        real = activation_patching(nd, ids, baseline, 5, granularity, show_progress=False).effects
        whole = graph.patch_components["atp+exact"]
        assert whole and set(whole) <= set(real)
        estimates = graph.component_estimates("atp+exact")
        for name, effect in whole.items():
            assert effect == pytest.approx(real[name], abs=1e-5) and estimates[name] == effect
    saved = graph.to_dict()["nodes"]
    assert all(n["patch_estimate"] == n["patch_estimates"]["default"] and "patch_kappa" in n
               for n in saved if n["kind"] not in ("token", "bias", "output"))
    with pytest.raises(ValueError, match="exact_above"):
        nd.attribute_graph(ids, 5, corrupted_inputs=baseline, exact_above=0)


def test_kappa_is_the_patch_over_the_stream_after_the_write():
    """κ of an FF node, by hand: ‖ff(clean) − ff(corrupt)‖ / ‖(the stream the FF reads) + ff(clean)‖."""
    nd = NormDecomposition(tiny_task_model("llama", "causal_lm"))
    ids = token_ids()[:1, :7]
    baseline = ids.clone()
    baseline[0, 2] = 17
    graph = nd.attribute_graph(ids, 5, granularity="sublayer", prune=False, corrupted_inputs=baseline,
                               exact_above=math.inf)
    block = nd.engine.blocks[1]
    seen = {}
    hooks = [block.post_attention_layernorm.register_forward_pre_hook(lambda m, a: seen.setdefault("read", a[0])),
             block.mlp.register_forward_hook(lambda m, a, o: seen.setdefault("ff", o))]
    with torch.no_grad():
        nd.model(ids)
        clean = dict(seen)
        seen.clear()
        nd.model(baseline)
    for h in hooks:
        h.remove()
    expected = (clean["ff"] - seen["ff"])[0].norm(dim=-1) / (clean["read"] + clean["ff"])[0].norm(dim=-1)
    d = graph.data
    for p in range(ids.shape[1]):
        (node,) = [k for k in range(len(d)) if d.kinds[k] == "ff" and d.layers[k] == 1 and d.positions[k] == p]
        assert float(graph.patch_kappa[node]) == pytest.approx(float(expected[p]), rel=1e-4, abs=1e-7)


def test_cli_writes_its_files_and_prints_the_rankings(tmp_path, capsys, monkeypatch):
    import csv

    from captum_ffb.attr import AttributionGraph
    from tests.models import save_tiny_lm

    model = save_tiny_lm(tmp_path / "model")
    out = tmp_path / "out"
    assert main(["graph", "the cat sat on the mat because", "--model", str(model), "--out", str(out),
                 "--baseline", "the dog sat on the mat because"]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["components.csv", "graph.html", "graph.json", "graph.npz",
                                                     "graph_neuronpedia.json"]
    saved = json.loads((out / "graph.json").read_text())
    assert any("patch_estimate" in n for n in saved["nodes"])
    from tests.models import load_saved

    loaded = load_saved(model)
    ids = loaded.tokenizer("the cat sat on the mat because", return_tensors="pt").input_ids
    with torch.no_grad():
        predicted = int(loaded.model(ids).logits[0, -1].argmax())
    assert saved["output"] == repr(loaded.tokenizer.decode([predicted]))  # the token as text, not its id
    output = next(n for n in saved["nodes"] if n["kind"] == "output")
    assert output["token_id"] == predicted and output["position"] == ids.shape[1] - 1
    _check_schema(json.loads((out / "graph_neuronpedia.json").read_text()))
    # the rankings: by value and by patch estimate, components and nodes, every computed one
    graph = AttributionGraph.load(out / "graph.npz")
    assert graph.to_dict() == saved
    for by in ("value", "patch"):
        assert f"top components by {by}" in printed and f"top nodes by {by}" in printed
        (name, score), *_ = graph.ranking(by, "component")
        assert f"{name}: {score:+.4f}" in printed
    rows = list(csv.DictReader((out / "components.csv").open()))
    assert [row["component"] for row in rows] == [name for name, _ in graph.ranking("value", top=None)]
    assert {"value", "kept_nodes", "patch_default", "patch_atp", "patch_frozen", "patch_atp+exact"} <= set(rows[0])
    assert sum(int(row["kept_nodes"]) for row in rows) == sum(
        1 for n in saved["nodes"] if n["kind"] not in ("token", "bias", "output"))
    assert re.search(r"largest flow residual over every node: \d\.\de[+-]\d\d", printed)
    # --max-nodes: the residual over the nodes whose edges were computed, the others named as left out
    assert main(["graph", "the cat sat on the mat because", "--model", str(model), "--out", str(tmp_path / "m"),
                 "--max-nodes", "5", "--format", "json"]) == 0
    limited = json.loads((tmp_path / "m" / "graph.json").read_text())
    found = re.search(r"largest flow residual over the 5 writer nodes whose edges were computed \((\d+) left out, "
                      r"their flow counted as left out\): (\S+)", capsys.readouterr().out)
    writers = graph.data.kinds.count("head") + graph.data.kinds.count("ff")
    assert found and int(found.group(1)) == writers - 5 and float(found.group(2)) < 1e-4
    assert sum(1 for n in limited["nodes"] if n["kind"] in ("head", "ff")) <= 5
    # --exclude-first: the first position's writers set aside
    assert main(["graph", "the cat sat on the mat because", "--model", str(model), "--out", str(tmp_path / "x"),
                 "--exclude-first", "--format", "json"]) == 0
    assert "set aside: the writers at position(s) 0" in capsys.readouterr().out
    excluded = json.loads((tmp_path / "x" / "graph.json").read_text())
    assert excluded["excluded_positions"] == [0]
    assert not [n for n in excluded["nodes"] if n["kind"] not in ("token", "bias", "output") and n["position"] == 0]
    # too many links for dicts: a one-line error naming what to write instead (nothing written)
    monkeypatch.setattr("captum_ffb.graph.record.MAX_DICT_LINKS", 10)
    assert main(["graph", "the cat sat", "--model", str(model), "--out", str(tmp_path / "big"), "--no-prune",
                 "--quiet"]) == 2
    assert "--format npz" in capsys.readouterr().err and not (tmp_path / "big").exists()
    assert main(["graph", "the cat sat", "--model", str(model), "--out", str(tmp_path / "big"), "--no-prune",
                 "--format", "npz", "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "big").iterdir()) == ["components.csv", "graph.npz"]
    assert main(["graph", "the cat", "--model", str(model), "--out", str(tmp_path / "o2"),
                 "--baseline", "the cat sat", "--quiet"]) == 2
    assert main(["graph", "the cat", "--model", str(model), "--out", str(tmp_path / "o3"),
                 "--node-threshold", "2", "--quiet"]) == 2
    assert main(["graph", "the cat", "--model", str(model), "--out", str(tmp_path / "o4"),
                 "--format", "svg", "--quiet"]) == 2


def test_bad_requests_are_refused_before_any_pass(llama):
    nd, ids = llama
    for options, match in [({"max_nodes": 0}, "max_nodes"), ({"max_nodes": 2.5}, "max_nodes"),
                           ({"node_threshold": -0.1}, "node_threshold"), ({"edge_threshold": 2}, "edge_threshold"),
                           ({"granularity": "expert"}, "granularity")]:
        with pytest.raises(ValueError, match=match):
            nd.attribute_graph(ids, 5, **options)
    with pytest.raises(ValueError, match="one input at a time"):
        nd.attribute_graph(torch.cat([ids, ids]), 5)
    with pytest.raises(ValueError, match="corrupted_inputs"):
        nd.attribute_graph(ids, 5, corrupted_inputs=ids[:, :3])


def test_cli_graph_of_an_encoder_decoder(tmp_path):
    from tests.models import save_tiny_seq2seq

    model = save_tiny_seq2seq(tmp_path / "model")
    out = tmp_path / "out"
    assert main(["graph", "the cat sat on the mat ||| le chat", "--model", str(model), "--out", str(out),
                 "--no-prune", "--granularity", "sublayer", "--quiet"]) == 0
    saved = json.loads((out / "graph.json").read_text())
    assert saved["n_source"] and "cross_attention" in {n["kind"] for n in saved["nodes"]}
    _graph_models().Model(**json.loads((out / "graph_neuronpedia.json").read_text()))
    assert main(["graph", "the cat sat", "--model", str(model), "--out", str(tmp_path / "o2"), "--quiet"]) == 2
    assert main(["graph", "the cat ||| le", "--model", str(model), "--out", str(tmp_path / "o3"),
                 "--baseline", "the dog ||| le", "--quiet"]) == 2


def test_a_graph_refuses_to_split_scores_of_a_changed_model():
    """The splitter recorded its pass lazily: zeroing a query projection after building the graph
    made ``attention`` uniform and the splits sum to 0 — the graph described another model."""
    model = tiny_task_model("llama", "causal_lm")
    nd = NormDecomposition(model)
    ids = token_ids()[:1, :7]
    graph = nd.attribute_graph(ids, 5, prune=False)
    with torch.no_grad():
        model.model.layers[1].self_attn.q_proj.weight.data.zero_()
    with pytest.raises(ValueError, match="weights changed since this graph was built"):
        graph.score_split(1, 0, 6, 2)
    again = nd.attribute_graph(ids, 5, prune=False)
    assert abs(sum(again.score_split(1, 0, 6, 2).values())) < 1e-6  # the new model's: q = 0
    recorded = nd.attribute_graph(ids, 5, prune=False)
    recorded.score_split(1, 0, 6, 2)  # recorded now: later answers stay the build's
    first = recorded.attention(1, 0, 6)
    with torch.no_grad():
        model.model.layers[1].self_attn.k_proj.weight.data.mul_(3)
    torch.testing.assert_close(recorded.attention(1, 0, 6), first)


def test_the_dict_is_a_copy_and_score_links_join_kept_nodes_once():
    nd = NormDecomposition(tiny_task_model("llama", "causal_lm"))
    ids = token_ids()[:1, :7]
    graph = nd.attribute_graph(ids, 5)
    saved = graph.to_dict()
    saved["tokens"].append("x")
    saved["thresholds"]["node_threshold"] = 0
    assert graph.to_dict()["tokens"] == graph.tokens and graph.thresholds["node_threshold"] == 0.8
    head = next(k for k, kind in enumerate(graph.data.kinds) if kind == "head" and graph.node_mask[k])
    layer, part, position = graph.data.layers[head], graph.data.heads[head], graph.data.positions[head]
    first = graph.attach_score_pairs(layer, part, position, 0, top=5)
    kept = {i for i, shown in zip(graph.ids(), graph.node_mask.tolist()) if shown}
    assert all(link["source"] in kept and link["target"] in kept for link in first)
    graph.attach_score_pairs(layer, part, position, 0, top=5)
    links = [(link["source"], link["target"]) for link in graph.to_dict()["links"] if link.get("kind") == "qk"]
    assert len(links) == len(set(links)) == len(first)
    with pytest.raises(ValueError, match="key_position 6 is masked for query_position 3"):
        graph.score_split(layer, part, 3, 6)


def test_a_page_with_no_share_is_drawn():
    """``kept_share`` is not a number where the explained value is 0 (a contrast of equal
    logits): the page's data held a bare NaN and the page stayed blank."""
    from captum_ffb.viz.graph import graph_html

    nd = NormDecomposition(tiny_task_model("llama", "causal_lm"))
    graph = nd.attribute_graph(token_ids()[:1, :7], 5)
    graph.data.values[graph.data.output] = 0.0
    page = graph_html(graph)
    assert "NaN" not in page and '"kept_share": null' in page and "– of the output" in page


def test_activation_patching_reads_text_targets_and_inputs_with_a_tokenizer():
    from tests.models import causal_tokenizer, tiny_lm

    tokenizer = causal_tokenizer()
    model = tiny_lm("llama")
    clean, corrupt = "the cat sat on the mat because", "the dog sat on the mat because"
    ids = tokenizer(clean, return_tensors="pt").input_ids
    corrupted = tokenizer(corrupt, return_tensors="pt").input_ids
    cat, mat = tokenizer.convert_tokens_to_ids(["cat", "mat"])
    by_id = activation_patching(model, ids, corrupted, cat, show_progress=False).effects
    assert activation_patching(model, ids, corrupted, "cat", tokenizer=tokenizer,
                               show_progress=False).effects == pytest.approx(by_id, abs=1e-6)
    assert activation_patching(model, clean, corrupt, "cat", tokenizer=tokenizer,
                               show_progress=False).effects == pytest.approx(by_id, abs=1e-6)
    from captum_ffb.explained.readouts import Contrast

    both = activation_patching(model, ids, corrupted, Contrast("cat", "mat"), tokenizer=tokenizer, show_progress=False)
    assert both.effects == pytest.approx(activation_patching(model, ids, corrupted, Contrast(cat, mat),
                                                             show_progress=False).effects, abs=1e-6)
    nd = NormDecomposition(model)
    activation_patching(nd, ids, corrupted, "cat", tokenizer=tokenizer, show_progress=False)
    assert nd.tokenizer is None  # the caller's attribution is left as it was
    with pytest.raises(TypeError, match=r"target 'cat' is text: give activation_patching\(\.\.\., tokenizer=\.\.\.\)"):
        activation_patching(model, ids, corrupted, "cat", show_progress=False)
    with pytest.raises(TypeError, match="inputs is text"):
        activation_patching(model, clean, corrupted, cat, show_progress=False)
    with pytest.raises(ValueError, match="is 2 tokens"):
        activation_patching(model, ids, corrupted, "cat sat", tokenizer=tokenizer, show_progress=False)
